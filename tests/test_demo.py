"""``sessionstore demo`` as CI runs it: the small size, judged by its --json verification.

Once against the test's servers (the S3 server over HTTP and a redis-server, through the
flags), once on the embedded default (a directory of its own and the redis-server beside
it, which the demo must stop when it is done).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from test_cli import subprocess_env

from store.embedded import EmbeddedRedis


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


def test_demo_on_the_embedded_default(tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    embedded = EmbeddedRedis(directory / ".redis")
    try:
        code, report, stderr = run_demo(demo_args=("--dir", str(directory)), cwd=tmp_path)
        assert code == 0, stderr
        assert_verified(report, stderr)
        assert report["store"]["redis"] == "embedded"
        # Without --keep the demo stops the redis-server it started.
        assert not embedded.running() and embedded.pid() is None
    finally:
        embedded.stop()


def test_demo_refuses_a_directory_that_is_not_its_own(tmp_path: Path) -> None:
    (tmp_path / "something.txt").write_text("mine")
    proc = subprocess.run([sys.executable, "-m", "store.cli", "demo", "--dir", str(tmp_path)],
                          capture_output=True, env=subprocess_env(), timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.decode().strip().endswith("is not empty: the demo needs a directory of its own")
