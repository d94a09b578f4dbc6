"""Issue #41, "A killed service process wedges a stream": two ``sessionstore serve`` processes
on one S3 and one Redis, SIGKILLed one at a time under load (tests/harness/serve_kills.py).

A process killed after its segment's PUT and before its COMMIT leaves a segment Redis has not
heard of; a reader in the other process meets it (reads probe) and that process's cached
state runs past Redis's tail. Before the fix (fa6deca) every append conditioned on that state
conflicted, for good: here the lone stream's producer is never acknowledged again (its
re-sends answered 503, then 409 once the state said its seq was past), and the test fails."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from harness.serve_kills import Nemesis, ServeSlot, Workload, judge, started, wait_for_progress

from store import SessionStore

#: How soon after the last fault every writer must be answered again. A wedged stream never
#: is; a process's first requests after a restart take a few seconds when the machine is
#: loaded (seen: 6 s at a load average of 20 on two cores), hence 10 s, not the issue's 5.
PROGRESS_WITHIN_S = 10.0

pytestmark = [pytest.mark.timeout(600), pytest.mark.long]


def test_processes_killed_at_random_and_at_each_append_point_lose_nothing_and_never_wedge(
    s3_url: str, redis_url: str, redis_prefix: str, make_store: Callable[..., SessionStore], tmp_path: Path
) -> None:
    """Three idempotent producers and a long-poll follower on one stream, one producer alone on
    another, and two writers on a pi session (one with ``If-Match``), over HTTP. The processes
    are SIGKILLed at random moments and, one life each, at every point of the lone stream's
    append (``before_check``, ``before_put``, ``after_put``, ``after_commit``) and after the
    session's PUT: the process stops there, a reader reads through the other one, then the
    SIGKILL. Nothing acknowledged is lost or stored twice, each producer's order is kept, the
    follower sees exactly what the stream holds, the session's history is clean, and after the
    last fault every writer is answered again within ``PROGRESS_WITHIN_S`` (acknowledged; the
    If-Match writer may be refused with 412 instead: the plain writer may outpace it)."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    store_args = {"objects": s3_url, "redis": redis_url, "redis_prefix": redis_prefix, "long_poll_timeout": "1"}
    slots = [ServeSlot(f"serve-{i}", store_args, tmp_path) for i in range(2)]
    events: list[str] = []
    with started(slots):
        work = Workload(slots, rng)
        work.setup()
        work.start()
        arms = work.arms()
        nemesis = Nemesis(slots, rng, arms, interval=(0.5, 1.5), down_s=0.5, meanwhile=work.read_through,
                          log=events.append)
        try:
            nemesis.run(until=time.monotonic() + 5)
            wait_for_progress(work, nemesis.last_end, PROGRESS_WITHIN_S + 1)  # judged below
        finally:
            work.stop()
        verdict = judge(work, nemesis, make_store(), progress_within_s=PROGRESS_WITHIN_S)
        logs = "\n".join(f"--- {s.name}:\n{s.log()}" for s in slots)
    figures = verdict.figures
    context = f"seed {seed}; {figures}\nfaults: {events}\n{logs}"
    assert verdict.problems == [], "\n".join(verdict.problems) + "\n" + context
    assert [f.kind for f in nemesis.faults if f.kind != "kill"] == [a.label for a in arms], context
    assert figures["faults.kill"] >= 1, context
    assert figures["stream_appends_acknowledged"] >= 30 and figures["session_appends_acknowledged"] >= 10, context
    assert figures["follower_messages"] >= 30, context
    print(context)
