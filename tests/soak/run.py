"""One soak run: start the servers and the fleet, let the nemesis loose, wind down, read
everything back in a fresh process, and judge the history (``tests/history.py``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from random import Random
from typing import Any, Callable

from tests.history import (
    OP_VIOLATIONS,
    READ_VIOLATIONS,
    check_timed_history,
    first_ack_after,
    load_timed_ops,
    load_timed_reads,
)
from tests.soak.config import SoakConfig
from tests.soak.nemesis import Fleet, Nemesis
from tests.soak.servers import REPO, Redis, S3Endpoint, child_env

#: Seconds the children get to start (imports, first connections) before the nemesis begins.
STARTUP_S = 3.0


def _say(progress: Callable[[str], None] | None, text: str) -> None:
    if progress is not None:
        progress(text)


def _create_sessions(cfg: SoakConfig) -> None:
    from store import SessionStore
    from store.errors import SessionExistsError

    store = SessionStore.from_url(cfg.objects_url, cfg.redis_url, redis_prefix=cfg.redis_prefix)
    try:
        for sid in cfg.session_ids:
            try:
                store.create_session(sid, cwd="/soak")
            except SessionExistsError:
                pass
    finally:
        store.close()


def _wait_role(fleet: Fleet, nemesis: Nemesis, role: str, timeout: float) -> list[str]:
    """Wait for every process of a role to exit; SIGKILL the ones still there after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nemesis.tick(faults=False)
        if all(c.popen is None or c.popen.poll() is not None for c in fleet.of(role, None)):
            return []
        time.sleep(0.05)
    late = []
    for c in fleet.of(role, None):
        if c.popen is not None and c.popen.poll() is None:
            late.append(c.name)
            c.signal(signal.SIGCONT)
            c.signal(signal.SIGKILL)
            c.popen.wait()
    return late


def _stop_compactors(fleet: Fleet, nemesis: Nemesis) -> list[str]:
    for c in fleet.of("compactor", None):
        c.signal(signal.SIGCONT)
        c.signal(signal.SIGTERM)  # a warm stop: finish the job at hand
    return _wait_role(fleet, nemesis, "compactor", 30)


def _compactor_stats(workdir: Path) -> dict[str, Any]:
    out: Counter[str] = Counter()
    for path in workdir.glob("compactor-*.log"):
        for line in path.read_bytes().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                out["non_json_lines"] += 1
                continue
            event = rec.get("event")
            if event == "gc":
                out["gc_deleted"] += int(rec.get("deleted", 0))
            elif event == "job failed":
                out["jobs_failed"] += 1
            elif event == "job parked":
                out["jobs_parked"] += 1
            elif event == "worker stopped":
                out["jobs_done_by_warm_stopped"] += int(rec.get("jobs_done", 0))
                out["segments_merged_by_warm_stopped"] += int(rec.get("segments_merged", 0))
            if rec.get("level") == "error":
                out["error_lines"] += 1
    return dict(out)


def run(cfg: SoakConfig, *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the soak; returns the summary (``summary["ok"]``: no guarantee broken)."""
    workdir = Path(cfg.workdir) if cfg.workdir else Path(tempfile.mkdtemp(prefix="sessionstore-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    cfg.workdir = str(workdir)
    for key, value in child_env().items():
        if key.startswith("AWS_"):
            os.environ[key] = value
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(name, None)
    rng = Random(cfg.seed)
    redis = Redis()
    s3 = S3Endpoint(cfg.backend, workdir)
    fleet: Fleet | None = None
    nemesis: Nemesis | None = None
    notes: dict[str, Any] = {}
    t_begin = time.monotonic()
    try:
        redis.start()
        s3.start()
        cfg.redis_url = redis.url
        cfg.objects_url = s3.url
        cfg.session_ids = [f"soak-{i}" for i in range(cfg.sessions)]
        _create_sessions(cfg)
        cfg.deadline = time.monotonic() + STARTUP_S + cfg.duration_s
        config_path = workdir / "config.json"
        cfg.save(config_path)
        fleet = Fleet(cfg, config_path)
        nemesis = Nemesis(cfg, fleet, redis, s3, Random(f"{cfg.seed}/nemesis"))
        _say(progress, f"soak: {cfg.writers} writers, {cfg.readers} readers, {cfg.compactors} compactors on "
                       f"{cfg.backend}, {cfg.duration_s:.0f} s, seed {cfg.seed}, workdir {workdir}")
        fleet.start_all()
        nemesis.start(time.monotonic() + STARTUP_S)
        last_note = time.monotonic()
        while time.monotonic() < cfg.deadline:
            nemesis.tick()
            time.sleep(0.05)
            if progress is not None and time.monotonic() - last_note > 10:
                last_note = time.monotonic()
                _say(progress, f"soak: {cfg.deadline - last_note:.0f} s left, {len(nemesis.faults)} faults so far")
        _say(progress, "soak: over; healing, letting writers resolve their last batch")
        nemesis.heal_all()
        notes["writers_killed_late"] = _wait_role(fleet, nemesis, "writer", cfg.resolve_s + 30)
        cfg.stop_file.touch()
        notes["readers_killed_late"] = _wait_role(fleet, nemesis, "reader", 30)
        notes["compactors_killed_late"] = _stop_compactors(fleet, nemesis)
        _say(progress, "soak: final read in a fresh process")
        final = subprocess.run(
            [sys.executable, "-m", "tests.soak.roles", "final", "--config", str(config_path)],
            cwd=REPO, env=child_env(), capture_output=True, timeout=600,
        )
        if final.returncode != 0:
            notes["final_process"] = final.stderr.decode(errors="replace")[-2000:]
    finally:
        if fleet is not None:
            for c in fleet.children:
                c.signal(signal.SIGCONT)
                c.signal(signal.SIGKILL)
                if c.popen is not None:
                    c.popen.wait()
            fleet.close_logs()
        s3.stop()
        redis.stop()
    assert fleet is not None and nemesis is not None
    summary = _judge(cfg, workdir, fleet, nemesis, notes)
    summary["wall_s"] = round(time.monotonic() - t_begin, 1)
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    with open(workdir / "faults.jsonl", "w") as fh:
        for rec in nemesis.faults:
            fh.write(json.dumps(rec) + "\n")
    return summary


def _judge(cfg: SoakConfig, workdir: Path, fleet: Fleet, nemesis: Nemesis, notes: dict[str, Any]) -> dict[str, Any]:
    ops, events = load_timed_ops(sorted(workdir.glob("writer-*.jsonl")))
    reads = load_timed_reads(sorted(workdir.glob("reader-*.jsonl")))
    final_path = workdir / "final.json"
    final: dict[str, Any] = json.loads(final_path.read_text()) if final_path.exists() else {}
    verdict = check_timed_history(ops, reads, final)
    faults = Counter(f["kind"] for f in nemesis.faults)
    aimed = Counter(ev["point"] for ev in events if ev.get("ev") == "pause")
    # Redis coming back empty: a restart (when it answers again) or a FLUSHALL.
    losses = sorted(f["t1"] if f["kind"] == "redis-kill" else f["t0"]
                    for f in nemesis.faults if f["kind"] in ("redis-kill", "redis-flushall") and f.get("t1"))
    recovery = first_ack_after(ops, losses)
    known = [r for r in recovery if r is not None]
    unexpected = [e for e in fleet.exits if not e["expected"]]
    summary: dict[str, Any] = {
        "ok": verdict.broken == 0,
        "config": {k: getattr(cfg, k) for k in ("seed", "backend", "duration_s", "writers", "readers",
                                                 "compactors", "sessions", "grace_ms", "gc_interval_ms",
                                                 "compact_after", "fault_interval_s", "aimed_interval_s", "pace_s")},
        "workdir": str(workdir),
        "operations": {
            "total": verdict.operations,
            "acknowledged": verdict.acknowledged,
            "conflicts": verdict.conflicts,
            "refused": verdict.refused,
            "indeterminate": verdict.indeterminate,
            "indeterminate_committed": verdict.indeterminate_committed,
            "resent": verdict.resent,
            "resent_resolved": verdict.resent_resolved,
            "attempt_errors": verdict.attempt_errors,
        },
        "reads": {"total": verdict.reads, "errors": verdict.read_errors},
        "final": {
            "entries": verdict.entries_final,
            "sessions": {sid: {k: rec.get(k) for k in ("seq", "through_seq", "generation", "gc_deleted", "error")}
                         | {"below_manifest": len(rec.get("below_manifest") or {})}
                         for sid, rec in final.items()},
        },
        "faults": dict(sorted(faults.items())),
        "fault_kinds_enabled": nemesis.kinds,
        "aimed_pauses": dict(sorted(aimed.items())),
        "redis_loss_to_first_ack_s": {
            "events": len(losses),
            "median": round(statistics.median(known), 3) if known else None,
            "max": round(max(known), 3) if known else None,
            "never": len(recovery) - len(known),
            "each": [None if r is None else round(r, 3) for r in recovery],
        },
        "violations": verdict.violations,
        "violation_total": verdict.broken,
        "examples": verdict.examples,
        "compactors": _compactor_stats(workdir),
        "process_exits_unexpected": unexpected[:20],
        "nemesis_errors": nemesis.errors[:20],
        "notes": notes,
    }
    return summary


def render(summary: dict[str, Any]) -> str:
    """The summary for people."""
    c = summary["config"]
    o = summary["operations"]
    r = summary["reads"]
    rec = summary["redis_loss_to_first_ack_s"]
    lines = [
        f"sessionstore nemesis soak: seed {c['seed']}, {c['backend']}, {c['duration_s']:.0f} s, "
        f"{c['writers']} writers, {c['readers']} readers, {c['compactors']} compactors, "
        f"{c['sessions']} sessions, grace {c['grace_ms']} ms, GC every {c['gc_interval_ms']} ms",
        f"  operations  {o['total']}: {o['acknowledged']} acknowledged, {o['conflicts']} conflicts, "
        f"refused {o['refused'] or 'nothing else'}, {o['indeterminate']} never resolved "
        f"({o['indeterminate_committed']} of them committed), {o['resent']} re-sent after an unknown "
        f"outcome ({o['resent_resolved']} resolved)",
        f"  attempts    errors {o['attempt_errors'] or 'none'}",
        f"  reads       {r['total']}, errors {r['errors'] or 'none'}",
        f"  final       {summary['final']['entries']} entries; "
        + ", ".join(f"{sid}: seg {s.get('seq')}, manifest gen {s.get('generation')} through {s.get('through_seq')}"
                    + (f", ERROR {s['error']}" if s.get("error") else "")
                    for sid, s in summary["final"]["sessions"].items()),
        "  faults      " + ", ".join(f"{k} {v}" for k, v in summary["faults"].items()),
        "  aimed       " + (", ".join(f"{k} {v}" for k, v in summary["aimed_pauses"].items()) or "none"),
        f"  redis loss  {rec['events']} times (restart empty or FLUSHALL); first acknowledged append after "
        f"it: median {rec['median']} s, max {rec['max']} s, never {rec['never']}",
        f"  compactors  {summary['compactors']}",
    ]
    if summary["process_exits_unexpected"]:
        lines.append(f"  exits       {len(summary['process_exits_unexpected'])} unexpected: "
                     + ", ".join(f"{e['child']}={e['code']}" for e in summary["process_exits_unexpected"][:8]))
    if summary["nemesis_errors"]:
        lines.append(f"  nemesis     errors: {summary['nemesis_errors'][:3]}")
    broken = {k: v for k, v in summary["violations"].items() if v}
    if not broken:
        lines.append("  violations  none")
    else:
        lines.append("  violations  " + ", ".join(f"{k} {v}" for k, v in broken.items()))
        described = {**OP_VIOLATIONS, **READ_VIOLATIONS}
        for kind in broken:
            lines.append(f"    {kind}: {described[kind]}")
            for ex in summary["examples"].get(kind, [])[:3]:
                lines.append(f"      {ex}")
    lines.append(f"  verdict     {'OK' if summary['ok'] else 'BROKEN'} ({summary['violation_total']} violations); "
                 f"{summary.get('wall_s')} s wall; workdir {summary['workdir']}")
    return "\n".join(lines)


def cleanup(summary: dict[str, Any]) -> None:
    shutil.rmtree(summary["workdir"], ignore_errors=True)
