"""GC by schedule and the sweep (compactor/schedule.py), against the real servers.

Time comes from a ``FakeClock`` (due times, leases and the sweep's period all use the
compactor's clock); requests are counted at ``store.objects.requests``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, Callable

import pytest

from compactor import Compactor, CompactorOptions, Worker, WorkerOptions
from compactor.schedule import GcScheduler
from harness.pausing import FakeClock, InThread, Pause
from store import SessionStore
from test_compactor import GRACE_MS, compactor_for, fill, keys_of, reachable, view

NO_SLEEP = dict(sweep_rate=0.0)


@pytest.fixture
def store(make_store: Callable[..., SessionStore]) -> SessionStore:
    return make_store()


def scheduler(store: SessionStore, clock: FakeClock, **options: Any) -> GcScheduler:
    hook = options.pop("fault_hook", None)
    c = compactor_for(store, clock, fault_hook=hook)
    return GcScheduler(c, WorkerOptions(**{**NO_SLEEP, **options}))


def compacted(store: SessionStore, clock: FakeClock, sid: str, segments: int = 3) -> None:
    # Never behind the object store's clock: GC would take the manifest for one whose
    # compactor paused before its create (and wait from the create instead).
    clock.ms = max(clock.ms, int(time.time() * 1000))
    store.create_session(sid)
    fill(store, sid, segments, tag=sid)
    assert compactor_for(store, clock).compact_session(sid).outcome == "compacted"


#: Idle sessions beside the due one: enough that a scan of them (2 requests each) could never
#: pass for the due session's GC (at most 10).
IDLE = 50


@pytest.mark.every_backend
def test_only_due_sessions_cost_object_requests(store: SessionStore) -> None:
    clock = FakeClock()
    gc = scheduler(store, clock)
    idle = [f"idle{i}" for i in range(IDLE)]
    for sid in idle:
        compacted(store, clock, sid, segments=1)
    clock.advance(GRACE_MS)
    assert gc.collect_due().sessions == IDLE  # their entries are collected and gone
    assert all(keys_of(store, sid) == reachable(store, sid) for sid in idle[:5])

    compacted(store, clock, "due")
    expected = view(store, "due")
    store.objects.requests.clear()
    assert gc.collect_due().sessions == 0  # not due yet: nothing at all in the object store
    assert sum(store.objects.requests.values()) == 0
    clock.advance(GRACE_MS)
    result = gc.collect_due()
    assert result.sessions == 1 and result.count("segment") == 3
    # One session's GC: a LIST of it and one of its manifests (2 requests on moto, a few
    # more where the backend lists directory by directory); a scan of the idle ones would
    # take at least two requests each (100).
    assert 2 <= store.objects.requests["list"] <= 10
    assert store.objects.requests["get"] + store.objects.requests["head"] <= 10
    assert keys_of(store, "due") == reachable(store, "due")
    assert view(store, "due") == expected
    assert store.coord.gc_scheduled("due") == (None, None)


def test_a_due_entry_is_collected_at_its_time_and_not_before(store: SessionStore) -> None:
    clock = FakeClock()
    gc = scheduler(store, clock)
    compacted(store, clock, "t")
    due, leased = store.coord.gc_scheduled("t")
    assert leased is None and due == clock() + GRACE_MS
    clock.advance(GRACE_MS - 1)
    assert gc.collect_due().deleted == ()
    assert store.coord.gc_scheduled("t") == (due, None)
    clock.advance(1)
    assert gc.collect_due().count("segment") == 3
    assert store.coord.gc_scheduled("t") == (None, None)
    assert gc.collect_due().sessions == 0


def test_an_entry_with_more_waiting_comes_back_until_all_is_collected(store: SessionStore) -> None:
    clock = FakeClock()
    gc = scheduler(store, clock)
    compacted(store, clock, "w")  # gen 1: due at t0 + grace
    clock.advance(GRACE_MS // 2)
    fill(store, "w", 2, tag="more")
    compactor_for(store, clock).compact_session("w")  # gen 2: due later; the earlier entry stays
    clock.advance(GRACE_MS // 2)
    first = gc.collect_due()
    assert (first.count("segment"), first.waiting) == (3, 4)  # gen 2's segments, manifest, base
    due, _ = store.coord.gc_scheduled("w")
    assert due == clock() + GRACE_MS
    clock.advance(GRACE_MS)
    second = gc.collect_due()
    assert (second.count("segment"), second.count("manifest"), second.waiting) == (2, 1, 0)
    assert store.coord.gc_scheduled("w") == (None, None)
    assert keys_of(store, "w") == reachable(store, "w")


def test_a_worker_that_pauses_after_its_claim_loses_the_entry_to_another(store: SessionStore) -> None:
    clock = FakeClock()
    pause = Pause("gc.claimed")
    a = scheduler(store, clock, fault_hook=pause, gc_lease_ms=5_000)
    b = scheduler(store, clock, gc_lease_ms=5_000)
    compacted(store, clock, "p")
    expected = view(store, "p")
    clock.advance(GRACE_MS)
    paused = InThread(a.collect_due)
    pause.wait_paused()
    assert b.collect_due().sessions == 0  # A's lease holds
    clock.advance(5_001)  # A is paused past its lease
    taken = b.collect_due()
    assert taken.sessions == 1 and taken.count("segment") == 3
    assert store.coord.gc_scheduled("p") == (None, None)
    pause.release()
    late = paused.result()
    assert late.sessions == 1 and late.deleted == ()  # its own LIST decides: nothing left
    assert store.coord.gc_scheduled("p") == (None, None)  # and the entry is not its to touch
    assert view(store, "p") == expected


def test_a_worker_that_dies_after_its_claim_leaves_the_entry_to_another(store: SessionStore) -> None:
    clock = FakeClock()
    b = scheduler(store, clock, gc_lease_ms=5_000)
    compacted(store, clock, "d")
    clock.advance(GRACE_MS)
    bucket = store.coord.keys.gc_bucket("d")
    _, claimed = store.coord.gc_claim(bucket, clock(), 5_000, 10)  # a worker that then dies
    assert claimed == ["d"]
    assert b.collect_due().sessions == 0
    clock.advance(5_000)
    assert b.collect_due().count("segment") == 3
    assert store.coord.gc_scheduled("d") == (None, None)


def test_a_flushed_schedule_waits_for_the_sweep_which_deletes_what_is_due(store: SessionStore) -> None:
    clock = FakeClock()
    gc = scheduler(store, clock)
    for sid in ("f1", "f2"):
        compacted(store, clock, sid)
    expected = view(store, "f1")
    store.coord.purge()  # Redis lost everything: the schedule and the last sweep's time
    clock.advance(GRACE_MS)
    assert gc.collect_due().sessions == 0
    assert keys_of(store, "f1") != reachable(store, "f1")
    swept = gc.sweep()
    assert swept is not None and swept.sessions == 2 and swept.count("segment") == 6
    assert all(keys_of(store, sid) == reachable(store, sid) for sid in ("f1", "f2"))
    assert view(store, "f1") == expected
    assert gc.sweep() is None  # done: the next one is a period away
    clock.advance(WorkerOptions().gc_interval_ms)
    again = gc.sweep()
    assert again is not None and again.sessions == 2 and again.deleted == ()


def test_one_sweeper_at_a_time_and_a_paused_one_is_replaced(store: SessionStore) -> None:
    clock = FakeClock()
    sids = [f"s{i}" for i in range(4)]
    for sid in sids:
        compacted(store, clock, sid, segments=1)
    store.coord.purge()
    clock.advance(GRACE_MS)
    # The sweep's order is the layout's (shard, then id: store/formats/layout.py): s0..s3 renamed by it.
    s0, s1, s2, s3 = sorted(sids, key=store.layout.dir_name)
    pause = Pause("gc.sweep.session", when=lambda ctx: ctx["session_id"] == s1)
    seen: Counter[str] = Counter()

    def count_and_pause(point: str, ctx: dict[str, Any]) -> None:
        if point == "gc.sweep.session":
            seen[ctx["session_id"]] += 1
        pause(point, ctx)

    a = scheduler(store, clock, fault_hook=count_and_pause, sweep_lease_ms=10_000)
    b = scheduler(store, clock, fault_hook=count_and_pause, sweep_lease_ms=10_000)
    first = InThread(a.sweep)
    pause.wait_paused()  # A swept s0 and stopped before s1
    assert b.sweep() is None  # A holds the lease
    clock.advance(10_001)
    taken = b.sweep()
    assert taken is not None and taken.sessions == 3  # from A's cursor: s1, s2, s3
    pause.release()
    late = first.result()
    assert late is not None and late.sessions == 2  # s0, then s1 (harmless), then it stops
    assert seen == Counter({s0: 1, s1: 2, s2: 1, s3: 1})
    assert all(keys_of(store, sid) == reachable(store, sid) for sid in sids)
    assert a.sweep() is None and b.sweep() is None  # finished: not due for a period


@pytest.mark.every_backend
def test_the_job_loop_runs_no_gc(store: SessionStore, make_store: Callable[..., SessionStore]) -> None:
    """A worker's job loop does the same work per job with GC on and off: GC runs in threads
    of its own (here: with 40 sessions due and a sweep due meanwhile)."""
    clock = FakeClock()
    for i in range(40):
        compacted(store, clock, f"old{i}", segments=1)
    clock.advance(GRACE_MS)

    def run(gc_on: bool, tag: str) -> tuple[Worker, Counter[str]]:
        job_store = make_store(compact_after_segments=3)
        sids = [f"{tag}{i}" for i in range(5)]
        for sid in sids:
            job_store.create_session(sid)
            fill(job_store, sid, 3, tag=sid)  # queues one job each
        keys_of(job_store, sids[0])  # the backend's listing style is learnt before counting
        options = WorkerOptions(claim_idle_ms=0, block_ms=50, sweep_rate=0.0) if gc_on else \
            WorkerOptions(claim_idle_ms=0, block_ms=50, gc_poll_ms=0, gc_interval_ms=0)
        done = [0]
        holder: list[Worker] = []

        def hook(point: str, ctx: dict[str, Any]) -> None:
            if point != "job.before_ack":
                return
            done[0] += 1
            if done[0] == len(sids):
                w = holder[0]
                if gc_on:  # let the GC threads show they ran
                    limit = time.monotonic() + 60
                    while w.stats.gc_deleted == 0 and time.monotonic() < limit:
                        time.sleep(0.01)
                w.request_stop()

        c = Compactor(job_store, CompactorOptions(grace_ms=GRACE_MS, worker=f"w-{tag}"),
                      now=clock, fault_hook=hook)
        worker = Worker(c, options)
        holder.append(worker)
        loop_requests: Counter[str] = Counter()
        count = job_store.objects._count

        def counting(op: str) -> None:
            count(op)
            if threading.current_thread().name == "job-loop":
                loop_requests[op] += 1

        job_store.objects._count = counting  # type: ignore[method-assign]
        thread = threading.Thread(target=worker.run, name="job-loop")
        thread.start()
        thread.join(120)
        assert not thread.is_alive()
        return worker, loop_requests

    on, on_requests = run(True, "on")
    off, off_requests = run(False, "off")
    assert on.stats.jobs_done == off.stats.jobs_done == 5
    assert on.stats.gc_deleted > 0 and off.stats.gc_deleted == 0
    assert on.stats.passes == off.stats.passes == 5  # one job per pass, GC or not
    assert on_requests == off_requests and on_requests["put"] > 0
