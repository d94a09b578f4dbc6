"""A short nemesis soak (``python -m tests.soak``, see docs/reliability.md): real servers,
writer, reader and compactor processes, every kind of fault, and the history checker over
every operation and every read. It must break no guarantee, and it must have done enough
to mean something: a fair number of acknowledged appends, every fault kind injected, writers
stopped at protocol points, compactions and GC deletions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DURATION_S = 40


def _seaweedfs_available() -> str | None:
    if not (REPO / "tests" / "harness" / "seaweedfs.py").exists():
        return "tests/harness/seaweedfs.py is not there yet"
    if not (shutil.which("weed") or (Path(sys.executable).parent / "weed").exists()):
        return "no weed binary"
    return None


@pytest.mark.timeout(DURATION_S + 300)
@pytest.mark.parametrize("backend", [
    "moto",
    pytest.param("seaweedfs", marks=pytest.mark.skipif(bool(_seaweedfs_available()),
                                                       reason=str(_seaweedfs_available()))),
])
@pytest.mark.long
def test_short_soak_breaks_no_guarantee(backend: str, tmp_path: Path) -> None:
    if os.environ.get("SESSIONSTORE_TEST_S3_URL") or os.environ.get("SESSIONSTORE_TEST_REDIS_URL"):
        pytest.skip("the soak starts, kills and pauses servers of its own")
    workdir = tmp_path / "soak"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.soak", "--duration", str(DURATION_S), "--writers", "4",
         "--sessions", "2", "--seed", "7", "--backend", backend, "--json", "--quiet",
         "--workdir", str(workdir)],
        cwd=REPO, capture_output=True, timeout=DURATION_S + 280,
    )
    assert proc.returncode in (0, 1), proc.stderr.decode(errors="replace")[-3000:]
    summary = json.loads(proc.stdout)
    broken = {k: v for k, v in summary["violations"].items() if v}
    assert broken == {}, json.dumps({"violations": broken, "examples": summary["examples"]}, indent=1)
    assert proc.returncode == 0

    ops = summary["operations"]
    # Liveness through the faults, not a throughput figure: on 2 shared cores under load the
    # same run acknowledges 44-53 appends (the commit before this change did too), alone 60+.
    assert ops["acknowledged"] >= 25, ops
    assert ops["conflicts"] > 0, ops  # half the appends expect a tail while others write
    assert summary["reads"]["total"] >= 30, summary["reads"]
    missing = [k for k in summary["fault_kinds_enabled"] if not summary["faults"].get(k)]
    assert missing == [], summary["faults"]
    assert sum(summary["aimed_pauses"].values()) >= 1, summary["aimed_pauses"]
    # Compaction and deletion happened all along.
    assert any((s["generation"] or 0) > 0 for s in summary["final"]["sessions"].values()), summary["final"]
    assert summary["compactors"].get("gc_deleted", 0) > 0, summary["compactors"]
    # Redis came back empty and the writers went on.
    recovery = summary["redis_loss_to_first_ack_s"]
    assert recovery["events"] >= 2 and recovery["never"] == 0, recovery


# --- the checker itself, on made-up histories ------------------------------------------------


def _op(op: str, session: str, ids: list[str], outcome: str, *, expected: str | None = None,
        seq: int = 0, t: float = 1.0, error: str | None = None) -> "TimedOp":
    from history import TimedOp

    return TimedOp(op, "w0.0", session, ids, expected, t_invoke=t - 0.1, attempts=1, outcome=outcome,
                   error=error, seq=seq, t_done=t if outcome != "indeterminate" else None,
                   errors=[error] if error else [])


def _read(ids: list[str] | None, t0: float, t1: float, error: str | None = None) -> "TimedRead":
    from history import TimedRead

    return TimedRead("r0.0", "s", t0, t1, ids, error)


def test_checker_accepts_a_clean_history() -> None:
    from history import check_timed_history

    ops = [
        _op("a", "s", ["a0", "a1"], "ok", expected="", seq=1, t=1.0),
        _op("b", "s", ["b0"], "fail", expected="", t=1.5, error="ConflictError"),
        _op("c", "s", ["c0"], "ok", seq=2, t=2.0),
        _op("d", "s", ["d0"], "indeterminate", t=3.0),  # never resolved, committed after all
        _op("e", "s", ["e0"], "indeterminate", t=3.0),  # never resolved, not committed
    ]
    reads = [_read([], 0.5, 0.9), _read(["a0", "a1"], 1.1, 1.2), _read(["a0", "a1", "c0", "d0"], 2.5, 2.6),
             _read(None, 2.7, 2.8, "BackendUnavailableError: down")]
    final = {"s": {"ids": ["a0", "a1", "c0", "d0"], "seqs": [1, 1, 2, 3], "after_gc_ids": ["a0", "a1", "c0", "d0"]}}
    v = check_timed_history(ops, reads, final)
    assert v.broken == 0, v.examples
    assert (v.acknowledged, v.conflicts, v.indeterminate, v.indeterminate_committed) == (2, 1, 2, 1)
    assert v.read_errors == {"BackendUnavailableError": 1}


def test_checker_names_every_broken_promise() -> None:
    from history import check_timed_history

    ops = [
        _op("a", "s", ["a0"], "ok", expected="", seq=1, t=1.0),
        _op("lost", "s", ["l0"], "ok", seq=2, t=2.0),
        _op("stale", "s", ["s0"], "ok", expected="a0", seq=3, t=3.0),  # but c0 came between
        _op("c", "s", ["c0"], "ok", seq=2, t=2.5),  # acknowledged as 2, stored as 3 below
        _op("refused", "s", ["r0"], "fail", expected="x", t=3.5, error="ConflictError"),
        _op("torn", "s", ["t0", "t1"], "indeterminate", t=4.0),
    ]
    final = {"s": {"ids": ["a0", "c0", "s0", "r0", "t0", "zz", "a0"], "seqs": [1, 3, 3, 4, 5, 6, 7],
                   "after_gc_ids": ["a0"]}}
    reads = [
        _read(["a0", "c0"], 2.6, 2.7),          # lacks 'lost', acknowledged at 2.0
        _read(["c0"], 2.8, 2.9),                # not a prefix; lacks a0 seen by the read above
        _read(["a0", "c0", "s0", "r0", "t0"], 5.0, 5.1),  # refused and torn batches visible
    ]
    v = check_timed_history(ops, reads, final)
    broken = {k for k, n in v.violations.items() if n}
    assert broken == {
        "lost", "stale-tail-accepted", "misplaced", "refused-visible", "torn", "phantom", "duplicated",
        "gc-changed-read", "read-missing-acked", "read-not-prefix", "read-vanished",
        "read-refused-visible", "read-torn",
    }, v.examples
