"""The README's Python runs as written: each ```python block of it, as a script of its own, in
a fresh directory, with nothing configured (the embedded default), in a child process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import subprocess_env

from store.embedded import EmbeddedRedis

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)


def test_the_readme_has_python_to_run() -> None:
    assert BLOCKS, "no ```python block in README.md"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_readme_python_block_runs_as_written(index: int, tmp_path: Path) -> None:
    script = tmp_path / f"readme_{index}.py"
    script.write_text(BLOCKS[index])
    try:
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                              env=subprocess_env(), timeout=120)
        assert proc.returncode == 0, f"README block {index} failed:\n{proc.stdout}\n{proc.stderr}"
        assert "Traceback" not in proc.stderr
    finally:
        # Whatever embedded server the block started (it says so on close): stop it.
        for lock in tmp_path.rglob(".redis"):
            EmbeddedRedis(lock).stop()
    if "SessionStore.from_url(Path(" in BLOCKS[index]:
        # The library section: what it prints is what its comments say.
        assert "refused: the tail is u1" in proc.stdout
        assert "'content': 'and now?'" in proc.stdout
    if "key_provider=" in BLOCKS[index]:
        # Encryption at rest: no plaintext on disk, and a shredded session is unreadable.
        assert "my secret\nplaintext on disk: False\nunreadable: data key v1" in proc.stdout
        assert "keeps running" in proc.stderr and "embedded stop" in proc.stderr
