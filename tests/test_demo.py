"""``sessionstore demo`` as CI runs it: the small size, judged by its --json verification.

Once against the test's servers (the S3 server over HTTP and a redis-server, through the
flags), once on the embedded default (a directory of its own and the redis-server beside
it, which the demo must stop when it is done).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from harness.serve_process import serve
from test_cli import subprocess_env

from store.backends.embedded import EmbeddedRedis


def run_demo(*args: str, demo_args: tuple[str, ...] = (), cwd: Path | None = None) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run([sys.executable, "-m", "store.cli", *args, "demo", "--small", "--json", *demo_args],
                          capture_output=True, cwd=cwd, env=subprocess_env(), timeout=240, check=False)
    stderr = proc.stderr.decode()
    assert proc.stdout, stderr
    return proc.returncode, json.loads(proc.stdout), stderr


def assert_verified(report: dict[str, Any], stderr: str) -> None:
    verification = report["verification"]
    assert verification["problems"] == [], stderr
    assert report["ok"] is True and verification["ok"] is True
    assert set(verification["checks"]) == {"history", "verify", "forks", "roundtrip", "redaction", "workers"}
    assert all(verification["checks"].values())
    summary = report["summary"]
    # Everything the demo is there to show happened (counts, not timings).
    assert summary["sessions"] == 3 + summary["forks"] and summary["forks"] >= 1
    assert summary["appends"] == verification["acknowledged_appends"] > 0
    assert summary["handoffs"] > 0 and summary["double_turns"] >= 2
    assert summary["redactions"] == 1 and summary["compactions"] >= 1
    assert summary["branch_summaries"] >= 1 and summary["branches"] > summary["sessions"]


def test_demo_on_the_test_servers(s3_url: str, redis_url: str, redis_prefix: str) -> None:
    code, report, stderr = run_demo("--objects", s3_url, "--redis", redis_url, "--redis-prefix", redis_prefix)
    assert code == 0, stderr
    assert_verified(report, stderr)
    # The run used a namespace of its own under the given prefix, and removed it afterwards.
    assert report["store"]["objects"].startswith(s3_url.split("?")[0] + "/demo-")
    assert report["store"]["redis_prefix"].startswith(f"{redis_prefix}-demo-")
    # ... and said so.
    assert report["store"]["kept"] is False
    assert "(removed at the end; --keep keeps it)" in stderr.splitlines()[0]
    assert f"removed the demo's data (its objects under {report['store']['objects']} and its Redis keys under " in stderr


def test_demo_on_the_embedded_default(tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    embedded = EmbeddedRedis(directory / ".redis")
    try:
        code, report, stderr = run_demo(demo_args=("--dir", str(directory)), cwd=tmp_path)
        assert code == 0, stderr
        assert_verified(report, stderr)
        assert report["store"]["redis"] == "embedded"
        # Without --keep the demo stops the redis-server it started; the data of a --dir stays, and it says so.
        assert not embedded.running() and embedded.pid() is None
        assert report["store"]["kept"] is True
        assert f"the demo's data stays in {directory} (--dir)" in stderr
        assert any((directory / "sessions").iterdir())
    finally:
        embedded.stop()


def test_demo_refuses_a_directory_that_is_not_its_own(tmp_path: Path) -> None:
    (tmp_path / "something.txt").write_text("mine")
    proc = subprocess.run([sys.executable, "-m", "store.cli", "demo", "--dir", str(tmp_path)],
                          capture_output=True, env=subprocess_env(), timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.decode().strip().endswith("is not empty: the demo needs a directory of its own")


def test_demo_with_keep_says_where_its_data_is(tmp_path: Path) -> None:
    """On a new temporary directory, removed at the end by default; --keep keeps it and says
    where it is and how to look at it."""
    code, report, stderr = run_demo(demo_args=("--keep", "--sessions", "1", "--turns", "1", "--no-compactor"),
                                    cwd=tmp_path)
    directory = Path(report["store"]["objects"].removeprefix("file://"))
    embedded = EmbeddedRedis(directory / ".redis")
    try:
        assert code == 0, stderr
        assert report["store"]["kept"] is True and directory.is_dir()
        assert f"kept the demo's data: embedded store in {directory}; look at it with `sessionstore --objects {directory} ls`" in stderr
        assert f"`sessionstore --objects {directory} embedded stop` stops it" in stderr
        # ... and how to see it in a browser: the printed command serves the demo's sessions and
        # the viewer (run here on a free port; the line names the default one).
        assert (f"see it in a browser: `sessionstore --objects {directory} serve`, then open "
                "http://127.0.0.1:4437/ui/") in stderr
        line = next(line for line in stderr.splitlines() if line.startswith("see it in a browser: "))
        command = shlex.split(line.split("`")[1])
        assert command[0] == "sessionstore" and command[-1] == "serve"
        with serve(command[1:-1], tmp_path / "serve.log", cwd=tmp_path) as server:
            assert httpx.get(server.url + "/ui/").status_code == 200
            listed_over_http = httpx.get(server.url + "/v1/sessions").json()["sessions"]
            assert len(listed_over_http) >= 1
        assert "removed at the end" not in stderr
        listed = subprocess.run([sys.executable, "-m", "store.cli", "--objects", str(directory), "ls", "--json"],
                                capture_output=True, env=subprocess_env(), timeout=60)
        assert listed.returncode == 0 and len(json.loads(listed.stdout)) >= 1
    finally:
        embedded.stop()
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
