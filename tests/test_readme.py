"""The README's Python, and the docs' (docs/*.md), runs as written and prints what the page
says it prints: each ```python block, as a script of its own, in a fresh directory, with
nothing configured (the embedded default), in a child process; the ```text block after it
("It prints:") is its standard output, line for line, ``...`` standing for what changes from
run to run. Every ```python block of these pages must be such an example: a block that is not
run cannot be shown to be right. Whatever a block leaves behind (its store, an embedded
redis-server, a temporary directory) is checked and removed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_cli import subprocess_env

from store.backends.embedded import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: The pages whose ```python blocks run: the README first, then every doc.
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```\n", re.S | re.M)
EXAMPLE = re.compile(r"^```python\n(.*?)^```\n\nIt prints[^\n]*:\n\n```text\n(.*?)^```\n", re.S | re.M)


def _page_name(page: Path) -> str:
    return str(page.relative_to(ROOT))


TEXTS = {_page_name(page): page.read_text() for page in PAGES}
TEXT = TEXTS["README.md"]
BLOCKS = BLOCK.findall(TEXT)
#: (page, code, expected output) of every block followed by its output, README's first.
PAGE_EXAMPLES = [(name, code, out) for name, text in TEXTS.items() for code, out in EXAMPLE.findall(text)]
#: (code, expected output) of every example of every page.
EXAMPLES = [(code, out) for _, code, out in PAGE_EXAMPLES]


def test_the_readme_has_python_to_run_and_says_what_each_block_prints() -> None:
    assert BLOCKS, "no ```python block in README.md"
    without = [code.splitlines()[0] for code in BLOCKS if code not in {c for c, _ in EXAMPLE.findall(TEXT)}]
    assert without == [], f"README blocks without an 'It prints:' ```text block after them: {without}"


def test_every_python_block_of_the_docs_says_what_it_prints() -> None:
    """A ```python block in a doc is an example that runs, or it is not ```python."""
    without = [(name, code.splitlines()[0]) for name, text in TEXTS.items()
               for code in BLOCK.findall(text) if code not in {c for c, _ in EXAMPLE.findall(text)}]
    assert without == [], f"```python blocks without an 'It prints:' ```text block after them: {without}"


def test_the_examples_moved_out_of_the_readme_are_still_run() -> None:
    """The examples that once lived in the README run from the doc that holds them now."""
    pages = {name for name, _, _ in PAGE_EXAMPLES}
    assert {"README.md", "docs/library.md", "docs/adapters.md", "docs/http.md", "docs/lifecycle.md",
            "docs/encryption.md"} <= pages, sorted(pages)


def output_matches(expected: str, got: str) -> bool:
    """Line for line; ``...`` in an expected line matches any text within that line."""
    want, have = expected.splitlines(), got.splitlines()
    if len(want) != len(have):
        return False
    return all(re.fullmatch(".*?".join(map(re.escape, w.split("..."))), h) for w, h in zip(want, have))


def left_behind(temp: Path) -> list[str]:
    """What a block left in its temporary directory; the embedded servers' own bookkeeping
    (``sessionstore-*``: their records and sockets, kept by design) aside."""
    return sorted(p.name for p in temp.iterdir() if not p.name.startswith("sessionstore-"))


def test_output_matching_can_fail() -> None:
    assert output_matches("a '...' b\nc", "a 'x y' b\nc")
    assert not output_matches("a '...' b\nc", "a 'x'\nb\nc")
    assert not output_matches("a\nb", "a\nb\nextra")
    assert not output_matches("20", "21")


@pytest.mark.parametrize("index", range(len(EXAMPLES)),
                         ids=[f"{name}-{i}" for i, (name, _, _) in enumerate(PAGE_EXAMPLES)])
def test_a_readme_python_block_runs_as_written_and_prints_what_the_readme_says(index: int, tmp_path: Path) -> None:
    code, expected = EXAMPLES[index]
    work = tmp_path / "work"
    work.mkdir()
    # The block's tempfile directory (a short path: the embedded server may put its socket
    # there), which it must leave as it found it.
    temp = Path(tempfile.mkdtemp(prefix="ss-readme-"))
    script = tmp_path / f"readme_{index}.py"
    script.write_text(code)
    try:
        proc = subprocess.run([sys.executable, str(script)], cwd=work, capture_output=True, text=True,
                              env=subprocess_env(TMPDIR=str(temp)), timeout=180)
        assert proc.returncode == 0, f"{PAGE_EXAMPLES[index][0]} block {index} failed:\n{proc.stdout}\n{proc.stderr}"
        assert "Traceback" not in proc.stderr
        assert output_matches(expected, proc.stdout), (
            f"{PAGE_EXAMPLES[index][0]} block {index} printed\n{proc.stdout}\nwhere the page says\n{expected}")
        assert left_behind(temp) == [], f"{PAGE_EXAMPLES[index][0]} block {index} left {left_behind(temp)} behind"
    finally:
        # Whatever embedded server the block started (it says so on close): stop it, then
        # remove the block's store.
        for lock in [*tmp_path.rglob(".redis"), *temp.rglob(".redis")]:
            EmbeddedRedis(lock).stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(temp, ignore_errors=True)
    if "key_provider=" in code:
        # Encryption at rest: a store that started the embedded server says so when it closes.
        assert "keeps running" in proc.stderr and "embedded stop" in proc.stderr


def test_the_http_example_talks_only_to_the_server_it_started(tmp_path: Path) -> None:
    """Another server on the port an example might have chosen (4437, serve's default) answers
    everything with 200: the example must not take it for its own."""
    import http.server
    import threading

    [(code, expected)] = [(c, e) for c, e in EXAMPLES if '"serve"' in c]

    class Impostor(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        do_GET = do_PUT = do_POST = do_HEAD = _answer

        def log_message(self, *args: object) -> None:
            pass

    try:
        impostor: http.server.HTTPServer | None = http.server.HTTPServer(("127.0.0.1", 4437), Impostor)
    except OSError:
        impostor = None  # something already listens there: the case this test is about
    if impostor is not None:
        threading.Thread(target=impostor.serve_forever, daemon=True).start()
    temp = Path(tempfile.mkdtemp(prefix="ss-readme-"))
    try:
        script = tmp_path / "http_example.py"
        script.write_text(code)
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                              env=subprocess_env(TMPDIR=str(temp)), timeout=180)
        assert proc.returncode == 0, proc.stderr
        assert output_matches(expected, proc.stdout), proc.stdout
    finally:
        if impostor is not None:
            impostor.shutdown()
            impostor.server_close()
        for lock in [*tmp_path.rglob(".redis"), *temp.rglob(".redis")]:
            EmbeddedRedis(lock).stop()
        shutil.rmtree(temp, ignore_errors=True)
