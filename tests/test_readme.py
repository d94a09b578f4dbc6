"""The README's Python runs as written and prints what the README says it prints: each
```python block of it, as a script of its own, in a fresh directory, with nothing configured
(the embedded default), in a child process; the ```text block after it ("It prints:") is its
standard output, line for line, ``...`` standing for what changes from run to run. Whatever a
block leaves behind (its store, an embedded redis-server, a temporary directory) is checked
and removed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_cli import subprocess_env

from store.embedded import EmbeddedRedis

README = Path(__file__).resolve().parents[1] / "README.md"
TEXT = README.read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```\n", TEXT, re.S | re.M)
#: (code, expected output) of every block followed by its output.
EXAMPLES = re.findall(r"^```python\n(.*?)^```\n\nIt prints[^\n]*:\n\n```text\n(.*?)^```\n", TEXT, re.S | re.M)


def test_the_readme_has_python_to_run_and_says_what_each_block_prints() -> None:
    assert BLOCKS, "no ```python block in README.md"
    without = [code.splitlines()[0] for code in BLOCKS if code not in {c for c, _ in EXAMPLES}]
    assert without == [], f"README blocks without an 'It prints:' ```text block after them: {without}"


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


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
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
        assert proc.returncode == 0, f"README block {index} failed:\n{proc.stdout}\n{proc.stderr}"
        assert "Traceback" not in proc.stderr
        assert output_matches(expected, proc.stdout), (
            f"README block {index} printed\n{proc.stdout}\nwhere the README says\n{expected}")
        assert left_behind(temp) == [], f"README block {index} left {left_behind(temp)} behind"
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
