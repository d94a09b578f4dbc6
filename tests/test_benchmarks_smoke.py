"""The benchmarks' smoke run: every scenario runs at tiny sizes and every figure is produced.

Never asserts a timing (CI machines are shared and noisy): only that ``python -m benchmarks
--smoke`` completes and that its JSON holds every figure, each a finite number.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Figures every complete run has, whatever its sizes ({n}: each resume size).
ALWAYS = [
    "append.b1.store.p50_ms",
    "append.b1.store.p99_ms",
    "append.b1.floor.p50_ms",
    "append.b1.floor.p99_ms",
    "append.b1.ratio_p50",
    "append.b10.store.p50_ms",
    "append.b10.floor.p50_ms",
    "append.b10.ratio_p50",
    "append.b1.object_requests_per_append",
    "append.b1.redis_commands_per_append",
    "throughput.store.appends_per_s",
    "throughput.floor.puts_per_s",
    "throughput.ratio",
    "contention.store.appends_per_s",
    "contention.floor.segments_per_s",
    "contention.ratio",
    "contention.retries_per_append",
    "contention.lost",
    "local.append.p50_ms",
    "local.append_fsync.p50_ms",
]
PER_RESUME_SIZE = [
    "resume.{n}.uncompacted.store_ms",
    "resume.{n}.uncompacted.store_load_ms",
    "resume.{n}.uncompacted.store_context_ms",
    "resume.{n}.uncompacted.floor_ms",
    "resume.{n}.uncompacted.ratio",
    "curve.{n}.store_append_ms",
    "curve.{n}.naive_append_ms",
    "curve.{n}.floor_ms",
    "curve.{n}.naive_resume_ms",
    "local.{n}.resume_ms",
]
WITH_COMPACTOR = [
    "resume.{n}.compacted.store_ms",
    "resume.{n}.compacted.floor_ms",
    "resume.{n}.compacted.ratio",
    "compaction.{n}.store_ms",
    "compaction.{n}.floor_ms",
    "compaction.{n}.ratio",
    "compaction.{n}.segments_per_s",
    "compaction.{n}.mb_per_s",
]


def _compactor_available() -> bool:
    try:
        from compactor import Compactor
    except ImportError:
        return False
    return callable(getattr(Compactor, "compact_session", None))


@pytest.mark.timeout(600)
def test_smoke_run_produces_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "benchmarks", "--smoke", "--profile", "--out", str(out)]
    s3, redis_url = os.environ.get("SESSIONSTORE_TEST_S3_URL"), os.environ.get("SESSIONSTORE_TEST_REDIS_URL")
    if s3 and redis_url:
        cmd += ["--objects", s3, "--redis", redis_url]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, f"benchmark smoke failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"

    data = json.loads((out / "latest.json").read_text())
    meta = data["meta"]
    assert meta["complete"] is True
    assert meta["params"]["profile"] == "smoke"
    for key in ("machine", "versions", "params", "backend", "command", "git"):
        assert meta[key], key
    figures = data["figures"]

    sizes = meta["params"]["resume_sizes"]
    expected = list(ALWAYS)
    per_size = PER_RESUME_SIZE + (WITH_COMPACTOR if _compactor_available() else [])
    for n in sizes:
        expected += [name.format(n=n) for name in per_size]
    expected += meta["expected_figures"]  # the run's own, fuller list
    missing = [name for name in expected if name not in figures]
    assert not missing, f"figures not produced: {missing}"
    bad = [name for name in expected if not isinstance(figures[name], (int, float)) or not math.isfinite(figures[name])]
    assert not bad, f"figures without a finite value: {bad}"

    # Every target was evaluated (met or not: timings are never asserted here).
    assert data["targets"], "no targets evaluated"
    assert all(t["value"] is not None for t in data["targets"]), data["targets"]
    assert data["table"], "no table rows"
    # The profile ran and wrote its reports.
    assert any(name.startswith("profile.") for name in figures)
    assert (out / "profile-append.txt").exists() and (out / "profile-micro.txt").exists()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert meta["plot"] is None
    else:
        assert meta["plot"] and Path(meta["plot"]).is_file()
