"""Killed service processes (``--only kills``; not in the default run: it runs for minutes):
issue #41's reproduction, long. Counted, not timed against a floor.

Two ``sessionstore serve`` processes (the service and options ``sessionstore serve`` runs, in
processes of their own: ``tests/harness/serve_kills.py``) on this run's S3 and Redis. Over
HTTP: three idempotent producers and a long-poll follower on one JSON stream (each append to
a process of its choice; a failed one, a connection error or a 5xx, sent again with the same
``(id, epoch, seq)`` to the other process), one producer alone on a second stream, two writers
on a pi session (``/v1/stream/<name>`` with ``Stream-Kind: session``; one with ``If-Match``),
and a Claude Agent SDK transcript writer (``/v1/claude/append``, re-sending the same uuids).

Faults, one process down at a time: first one life stopped and SIGKILLed at each point of the
lone stream's append (``before_check``, ``before_put``, ``after_put``, ``after_commit``) and
after a session's PUT, with a reader reading through the other process meanwhile; then a
SIGKILL every 1.5-2.5 s (uniform), each process restarted a second later, for
``--kills-duration`` seconds (default 600), then ``--kills-quiet`` seconds without faults
(default 60).

Figures (``kills.*``): appends acknowledged (stream, session, Claude), retries, kills by kind,
acknowledged appends lost and stored twice (stream, Claude), the session's history problems
(``tests/history.py``), the follower against the stream, and the recovery times: for each
fault and each writer, the time from the fault's end (the restarted process answering
``/healthz``) to the writer's next acknowledged append (max, p99, p50), each writer's longest
time without one, and, after the last fault, the time until every writer had one. Targets:
nothing lost or duplicated, no problem, every writer acknowledged within 5 s of the last
fault's end.
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.backends import _harness
from benchmarks.context import Context

PROGRESS_WITHIN_S = 5.0


def run(ctx: Context, duration_s: float, quiet_s: float) -> None:
    b, R = ctx.backend, ctx.results
    if not b.redis_url:
        raise RuntimeError("--only kills needs S3 and a Redis server shared by the processes: the moto "
                           "default or --objects URL --redis URL, not --embedded")
    _harness()
    from harness.serve_kills import Nemesis, ServeSlot, Workload, judge, started

    seed = random.randrange(2**32)
    rng = random.Random(seed)
    events: list[str] = []

    def log(line: str) -> None:
        events.append(line)
        ctx.log(f"kills: {line}")

    store_args = {"objects": b.objects_url, "redis": b.redis_url, "redis_prefix": b.redis_prefix,
                  "long_poll_timeout": "2"}
    with tempfile.TemporaryDirectory(prefix="sessionstore-kills-") as tmp:
        slots = [ServeSlot(f"serve-{i}", store_args, Path(tmp)) for i in range(2)]
        with started(slots):
            work = Workload(slots, rng, claude=_claude_available(), name=f"kills-{ctx.run_id}")
            work.setup()
            work.start()
            nemesis = Nemesis(slots, rng, work.arms(), interval=(1.5, 2.5), down_s=1.0,
                              meanwhile=work.read_through, log=log)
            ctx.log(f"kills: {duration_s:.0f} s of faults, then {quiet_s:.0f} s quiet (seed {seed})")
            try:
                nemesis.run(until=time.monotonic() + duration_s)
                ctx.log("kills: faults over")
                time.sleep(quiet_s)
            finally:
                work.stop()
            store = b.store()
            try:
                verdict = judge(work, nemesis, store, progress_within_s=PROGRESS_WITHIN_S)
            finally:
                store.close()
    figures = verdict.figures
    units = {"_s": "s"}
    for name, value in figures.items():
        R.fig(f"kills.{name}", value, next((u for k, u in units.items() if k in name), ""))
    R.fig("kills.duration_s", duration_s, "s")
    R.fig("kills.quiet_s", quiet_s, "s")
    R.details["kills"] = {"seed": seed, "faults": events, "problems": verdict.problems[:50],
                          "claude": work.claude is not None}
    for problem in verdict.problems[:20]:
        R.notes.append(f"kills: {problem}")
    if work.claude is None:
        R.notes.append("kills: no Claude Agent SDK appends (the claude-agent-sdk extra is not installed)")
    kinds = ", ".join(f"{k.split('.', 1)[1]} {v:g}" for k, v in figures.items() if k.startswith("faults."))
    _row(R, "appends acknowledged (stream, session, Claude)",
         f"{figures['stream_appends_acknowledged']:g}, {figures['session_appends_acknowledged']:g}, "
         f"{figures['claude_appends_acknowledged']:g}")
    _row(R, f"faults in {duration_s:.0f} s, then {quiet_s:.0f} s quiet", kinds)
    _row(R, "acknowledged appends lost / stored twice", f"{figures['lost']:g} / {figures['duplicated']:g}",
         R.target("kills: nothing lost", "kills.lost", "<=", 0))
    _row(R, "problems (history, follower, errors)", f"{figures['problems']:g}",
         R.target("kills: no problem", "kills.problems", "<=", 0))
    _row(R, "recovery after a fault, per writer: max / p99 / p50",
         f"{figures['recovery_max_s']:.2f} / {figures['recovery_p99_s']:.2f} / {figures['recovery_p50_s']:.2f} s")
    _row(R, "longest time without an acknowledged append (any writer)", f"{figures['longest_stall_s']:.2f} s")
    _row(R, "last fault's end to every writer acknowledged", f"{figures['last_fault_to_progress_s']:.2f} s",
         R.target("kills: progress after the last fault", "kills.last_fault_to_progress_s", "<=",
                  PROGRESS_WITHIN_S))


def _row(R: Any, case: str, value: str, target: Any = None) -> None:
    R.row("kills (counted)", case, value, "", "", target=target)


def _claude_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("claude_agent_sdk") is not None
