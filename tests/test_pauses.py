"""Pauses: any process may stop for any length of time at any point and then carry on with
what it read before (laptop sleep, VM freeze, GC pause, SIGSTOP).

Each test pauses one actor at a named fault point of its protocol, for longer than the
compactor's grace period (on a fake clock), while others append, compact, collect garbage,
delete and re-create; then lets it go on, and checks the guarantees of docs/reliability.md:
nothing acknowledged lost, nothing refused visible, no stale expected tail accepted, no
duplicate, reads unchanged by compaction. A real SIGSTOP of a whole process is in
``test_sigstopped_writer_process_past_gc`` and in the nemesis soak (``python -m tests.soak``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness.pausing import FakeClock, InThread, Pause
from history import Op, attempt, check_history, load_ops

from compactor import Compactor, CompactorOptions
from store import SessionStore
from store.errors import (
    IndeterminateError,
    SessionNotFoundError,
)
from store.retry import RetryPolicy

GRACE_MS = 60_000

#: A blackholed request ends at the read timeout: 3 s instead of the default 10 s (the
#: store's retry policy, not the wait, is what these tests look at).
QUICK_READS = "&connect_timeout=3&read_timeout=3"


def entry(eid: str, parent: str | None) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent,
            "timestamp": "2026-11-22T10:00:00.000Z",
            "message": {"role": "user", "content": f"content of {eid}"}}


def chain(store: SessionStore, sid: str, ids: list[str], parent: str | None = None) -> str | None:
    """Append one entry per id, each the child of the one before; returns the last id."""
    for eid in ids:
        store.append_session_entries(sid, [entry(eid, parent)])
        parent = eid
    return parent


def compactor_for(store: SessionStore, clock: FakeClock, **options: Any) -> Compactor:
    options.setdefault("grace_ms", GRACE_MS)
    options.setdefault("worker", f"test-{uuid.uuid4().hex[:6]}")
    hook = options.pop("fault_hook", None)
    return Compactor(store, CompactorOptions(**options), now=clock, fault_hook=hook)


def compact_and_collect(store: SessionStore, clock: FakeClock, sid: str) -> None:
    """Merge everything, let the grace period pass, delete what was retired."""
    c = compactor_for(store, clock)
    assert c.compact_session(sid).outcome == "compacted"
    clock.advance(GRACE_MS + 1)
    c.gc_session(sid)


def segment_exists(store: SessionStore, sid: str, inc: str, seq: int) -> bool:
    return store.objects.head(store.layout.segment(sid, inc, seq)) is not None


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# --- writers --------------------------------------------------------------------------------


class Died(Exception):
    """Raised by :func:`dies_at`'s hook: the process ``dies`` there (nothing after it runs)."""


def dies_at(point: str) -> Callable[[str, dict[str, Any]], None]:
    """A fault hook that ends the call at ``point`` (a process killed there)."""

    def die(at: str, ctx: dict[str, Any]) -> None:
        if at == point:
            raise Died()

    return die


@pytest.mark.parametrize("expected_tail", [False, True], ids=["no-expected-tail", "expected-tail"])
@pytest.mark.parametrize("redis_during_pause", ["kept", "flushed"])
def test_writer_paused_between_check_and_put_past_gc(
    make_store: Callable[..., SessionStore],
    clock: FakeClock,
    redis_url: str,
    expected_tail: bool,
    redis_during_pause: str,
) -> None:
    """The reported loss: CHECK says tail 1, the writer pauses, others append 2..6, the
    compactor merges them and GC deletes them; the writer's PUT of slot 2 then succeeds
    (nothing is there any more). It must never be acknowledged as seq 2."""
    pause = Pause("append.before_put")
    paused = make_store(fault_hook=pause)
    other = make_store()
    other.create_session("z")
    other.append_session_entries("z", [entry("a", None)])
    inc = other.get_header("z").incarnation
    ops: list[Op] = [Op("z", ["a"], None, "ok", 1)]
    expected = "a" if expected_tail else None
    late = InThread(lambda: attempt(paused, "z", [entry("late", "a")], expected))
    pause.wait_paused()
    parent = "a"
    for i in range(5):
        ops.append(attempt(other, "z", [entry(f"o{i}", parent)], parent))
        parent = f"o{i}"
    compact_and_collect(other, clock, "z")
    assert not segment_exists(other, "z", inc, 2)  # retired and deleted: the slot is free
    if redis_during_pause == "flushed":
        import redis

        redis.Redis.from_url(redis_url).flushall()
    pause.release()
    op = late.result()
    ops.append(op)
    if expected_tail:
        assert op.outcome == "conflict" and op.actual_tail == "o4"
    else:
        assert op.outcome == "ok" and op.seq == 7  # retried at the true tail
    # Its object in the retired slot was found out (ZOMBIE, or RETIRED when the slot's ids
    # are compacted out of Redis: CHECK then told a committed batch from this one) ...
    assert sum(p in ("append.zombie", "append.retired_slot") for p, _ in pause.seen) == 1
    assert not segment_exists(other, "z", inc, 2)  # ... and removed again
    report = check_history(make_store(), ops)
    assert report.problems == []
    ids = [e["id"] for e in make_store().load_session_entries("z")]
    assert ids[:6] == ["a", "o0", "o1", "o2", "o3", "o4"]
    assert ("late" in ids) == (not expected_tail)


def test_writer_paused_after_put_is_acknowledged_once_its_segment_was_merged(
    make_store: Callable[..., SessionStore], clock: FakeClock
) -> None:
    """The other side of the same coin: a writer whose PUT landed, then paused before its
    COMMIT while another writer rolled its segment forward and compaction merged and GC
    deleted it, is acknowledged (its batch is in the session at the seq it was given)."""
    pause = Pause("append.after_put")
    paused = make_store(fault_hook=pause)
    other = make_store()
    other.create_session("m")
    other.append_session_entries("m", [entry("a", None)])
    inc = other.get_header("m").incarnation
    late = InThread(lambda: paused.append_session_entries("m", [entry("mine", "a")]))
    pause.wait_paused()
    res = other.append_session_entries("m", [entry("b", "mine")])  # meets seg 2, rolls forward
    assert res.seq == 3
    compact_and_collect(other, clock, "m")
    assert not segment_exists(other, "m", inc, 2)
    pause.release()
    assert late.result().seq == 2
    assert "append.zombie" not in [p for p, _ in pause.seen]
    ops = [Op("m", ["a"], None, "ok", 1), Op("m", ["mine"], None, "ok", 2), Op("m", ["b"], None, "ok", 3)]
    assert check_history(make_store(), ops).problems == []


def test_writer_paused_after_a_lost_put_response_resends_into_a_deleted_slot(
    make_store: Callable[..., SessionStore], clock: FakeClock
) -> None:
    """The PUT landed but the writer never heard (it paused); others rolled it forward, it was
    merged and deleted; the writer's resend re-creates the slot. It is still acknowledged
    with the original seq: its batch is in the session exactly once."""
    landed = threading.Event()

    class Pausing:
        def __call__(self, point: str, ctx: dict[str, Any]) -> None:
            if point == "append.after_put" and not landed.is_set():
                landed.set()
                assert resume.wait(60)

    resume = threading.Event()
    paused = make_store(fault_hook=Pausing())
    other = make_store()
    other.create_session("r")
    other.append_session_entries("r", [entry("a", None)])
    late = InThread(lambda: paused.append_session_entries("r", [entry("mine", "a")], "a"))
    assert landed.wait(60)
    other.append_session_entries("r", [entry("b", "mine")])
    compact_and_collect(other, clock, "r")
    resume.set()
    assert late.result().seq == 2
    # A resend of the same batch after all that: the original result, nothing twice.
    assert paused.append_session_entries("r", [entry("mine", "a")], "a").seq == 2
    ids = [e["id"] for e in make_store().load_session_entries("r")]
    assert ids == ["a", "mine", "b"]


@pytest.mark.parametrize("then", ["deleted", "deleted-and-created-again"])
def test_writer_paused_before_put_while_the_session_is_deleted(
    make_store: Callable[..., SessionStore], then: str
) -> None:
    pause = Pause("append.before_put")
    paused = make_store(fault_hook=pause)
    other = make_store()
    other.create_session("d")
    other.append_session_entries("d", [entry("a", None)])
    old_inc = other.get_header("d").incarnation
    late = InThread(lambda: paused.append_session_entries("d", [entry("late", "a")]))
    pause.wait_paused()
    other.delete_session("d")
    if then == "deleted-and-created-again":
        other.create_session("d")
        other.append_session_entries("d", [entry("new", None)])
    pause.release()
    with pytest.raises(SessionNotFoundError):
        late.result()
    assert not segment_exists(other, "d", old_inc, 2)  # the zombie was removed
    if then == "deleted":
        with pytest.raises(SessionNotFoundError):
            make_store().load_session_entries("d")
    else:
        assert [e["id"] for e in make_store().load_session_entries("d")] == ["new"]


def test_writer_paused_before_put_past_gc_with_redis_unreachable_at_commit(
    make_store: Callable[..., SessionStore],
    clock: FakeClock,
    private_redis: Any,
    s3_url: str,
    redis_prefix: str,
) -> None:
    """Redis cannot answer the COMMIT: the object store decides (the slot is covered by a
    manifest and our batch is not in the session there: a zombie)."""
    pause = Pause("append.before_put")
    stopped = threading.Event()

    def hook(point: str, ctx: dict[str, Any]) -> None:
        pause(point, ctx)
        if point == "append.after_put" and not stopped.is_set():
            stopped.set()
            private_redis.pause()

    url = private_redis.url
    paused = SessionStore.from_url(
        s3_url, url, redis_prefix=redis_prefix, fault_hook=hook,
        retry=RetryPolicy(attempts=2, max_elapsed=1.0), redis_socket_timeout=0.3,
    )
    other = SessionStore.from_url(s3_url, url, redis_prefix=redis_prefix)
    try:
        other.create_session("u")
        other.append_session_entries("u", [entry("a", None)])
        late = InThread(lambda: attempt(paused, "u", [entry("late", "a")], None))
        pause.wait_paused()
        for i in range(3):
            other.append_session_entries("u", [entry(f"o{i}", "a")])
        compact_and_collect(other, clock, "u")
        pause.release()
        op = late.result()
        private_redis.resume()
        # The zombie is refused; with Redis gone the retry cannot go on: a plain error
        # (nothing of ours is in the session), never "ok".
        assert op.outcome != "ok", op
        assert "append.zombie" in [p for p, _ in pause.seen]
        ids = [e["id"] for e in other.load_session_entries("u")]
        assert "late" not in ids and ids[:4] == ["a", "o0", "o1", "o2"]
    finally:
        private_redis.resume()
        paused.close()
        other.close()


def test_rebuild_paused_past_a_compaction_is_refused(
    make_store: Callable[..., SessionStore], redis_url: str
) -> None:
    """A rebuild of Redis's state read the object store, paused, and Redis lost everything
    meanwhile: installing that snapshot now could hand out slots a newer manifest retired.
    INSTALL refuses a rebuild older than its age limit by Redis's clock (STALE), the rebuild
    is done again (here: refused every time, its limit being 1 ms), and nothing stale is
    installed."""
    import redis

    from store.errors import BackendUnavailableError

    other = make_store()
    other.create_session("h")
    other.append_session_entries("h", [entry("a", None)])
    pause = Pause("read.before_manifest_check")
    rebuilder = make_store(fault_hook=pause, rebuild_max_age_ms=1)
    job = InThread(lambda: rebuilder.hydrate("h"))
    pause.wait_paused()
    redis.Redis.from_url(redis_url).flushall()
    time.sleep(0.05)  # longer than rebuild_max_age_ms: the snapshot is stale by Redis's clock
    pause.release()
    with pytest.raises(BackendUnavailableError, match="longer than 1 ms"):
        job.result()
    assert other.coord.tail("h") is None  # refused: the state was never installed
    assert other.append_session_entries("h", [entry("b", "a")], "a").seq == 2  # a fresh rebuild


# --- readers --------------------------------------------------------------------------------


@pytest.mark.parametrize("redis_after", ["kept", "flushed", "rebuilt"])
def test_reader_paused_before_its_probe_past_two_compactions_is_not_truncated(
    make_store: Callable[..., SessionStore], clock: FakeClock, redis_url: str, redis_after: str
) -> None:
    """Redis lags the object store (a writer died after its PUT: seg 4 exists, Redis says 3).
    A first reader sees seg 4. A second reader pauses on its probe of seg 4; meanwhile
    compaction merges it (gen 2), more is appended and compacted (gen 3) and GC deletes seg 4
    *and* manifest 2. The probe's 404 must not end the read. Asked after the 404, Redis's
    retired slot (``cseq``, raised before GC deleted anything) covers seg 4 and the reader
    starts over; with Redis's state lost meanwhile, a LIST shows manifest 3 newer than its own
    (a HEAD of generation 2 alone would miss it); with the state rebuilt meanwhile, the
    rebuild read manifest 3 and its ``cseq`` covers seg 4 too."""

    die = dies_at("append.after_put")

    w = make_store()
    w.create_session("p")
    chain(w, "p", [f"e{i}" for i in range(2)])
    compactor_for(w, clock).compact_session("p")  # gen 1 through 2
    w.append_session_entries("p", [entry("e2", "e1")])  # seg 3
    with pytest.raises(Died):
        make_store(fault_hook=die).append_session_entries("p", [entry("e3", "e2")])  # seg 4
    assert [e["id"] for e in make_store().load_session_entries("p")] == ["e0", "e1", "e2", "e3"]
    pause = Pause("read.segment", when=lambda ctx: ctx["seq"] == 4)
    reader = make_store(fault_hook=pause)
    job = InThread(lambda: [e["id"] for e in reader.load_session_entries("p")])
    pause.wait_paused()
    c = compactor_for(w, clock)
    assert c.compact_session("p").generation == 2  # through 4
    w.append_session_entries("p", [entry("e4", "e3")])
    assert c.compact_session("p").generation == 3
    clock.advance(GRACE_MS + 1)
    c.gc_session("p")
    inc = w.get_header("p").incarnation
    assert w.objects.head(w.layout.manifest("p", inc, 2)) is None
    assert not segment_exists(w, "p", inc, 4)
    if redis_after != "kept":
        w.coord.client.flushall()
    if redis_after == "rebuilt":
        assert w.hydrate("p") is not None
    pause.release()
    ids = job.result()
    assert ids == ["e0", "e1", "e2", "e3", "e4"]


@pytest.mark.parametrize("redis_after", ["kept", "flushed"])
def test_read_after_paused_before_its_probe_past_compactions_is_not_truncated(
    make_store: Callable[..., SessionStore], clock: FakeClock, redis_after: str
) -> None:
    """``Reader.read_after`` (what a follower and a stream read of what is new) with Redis
    lagging: a writer died after its PUT (seg 4 exists, Redis says 3). The reader fetches seg
    3 and pauses on its probe of seg 4; meanwhile seg 4 is compacted, more is appended and
    compacted, and GC deletes seg 4. The probe's 404 must not end the read: Redis's retired
    slot (or, with Redis's state lost, a LIST of the manifests), asked after it, covers seg 4,
    and the read falls back to a whole read."""

    die = dies_at("append.after_put")

    w = make_store()
    w.create_session("ra")
    chain(w, "ra", [f"e{i}" for i in range(3)])
    with pytest.raises(Died):
        make_store(fault_hook=die).append_session_entries("ra", [entry("e3", "e2")])  # seg 4
    pause = Pause("read.segment", when=lambda ctx: ctx["seq"] == 4)
    reader = make_store(fault_hook=pause)
    header = reader.get_header("ra")
    job = InThread(lambda: reader.reader.read_after("ra", header, 2))
    pause.wait_paused()
    c = compactor_for(w, clock)
    assert c.compact_session("ra").generation == 1  # through 4
    w.append_session_entries("ra", [entry("e4", "e3")])
    assert c.compact_session("ra").generation == 2
    clock.advance(GRACE_MS + 1)
    c.gc_session("ra")
    assert not segment_exists(w, "ra", header.incarnation, 4)
    if redis_after == "flushed":
        w.coord.client.flushall()
    pause.release()
    fresh, last = job.result()
    assert [(s, e["id"]) for s, e in fresh] == [(3, "e2"), (4, "e3"), (5, "e4")]
    assert last == 5


@pytest.mark.parametrize("kept_parsed", [True, False])
def test_a_reader_led_by_a_stale_manifest_hint_reads_the_newest(
    make_store: Callable[..., SessionStore], clock: FakeClock, kept_parsed: bool
) -> None:
    """Redis names manifest 1, but a compactor that stopped right after creating manifest 2
    never told it, and GC has since deleted manifest 1, its base and the segments manifest 2
    retired. A reader led by the hint (with manifest 1 kept parsed from an earlier read, or
    not) must neither fail nor miss anything: what the hint names is gone (404), so it reads
    the long way."""

    class Stopped(Exception):
        pass

    def stop(point: str, ctx: dict[str, Any]) -> None:
        if point == "compact.after_manifest":
            raise Stopped()

    w = make_store()
    w.create_session("m")
    chain(w, "m", [f"e{i}" for i in range(4)])
    compact_and_collect(w, clock, "m")  # manifest 1 through 4, Redis told
    reader = make_store()
    if kept_parsed:
        assert len(reader.load_session_entries("m")) == 4
    chain(w, "m", ["e4", "e5"], "e3")
    with pytest.raises(Stopped):
        compactor_for(w, clock, fault_hook=stop).compact_session("m")  # manifest 2, untold
    clock.advance(GRACE_MS + 1)
    compactor_for(w, clock).gc_session("m")
    inc = w.get_header("m").incarnation
    assert w.objects.head(w.layout.manifest("m", inc, 1)) is None
    tail = w.coord.tail("m")
    assert tail is not None and tail.mgen == 1 and tail.cseq == 6  # the stale hint
    assert [e["id"] for e in reader.load_session_entries("m")] == [f"e{i}" for i in range(6)]


def test_a_reader_overlapping_compactions_of_what_it_read_does_not_start_over(
    make_store: Callable[..., SessionStore], clock: FakeClock
) -> None:
    """Redis holds no state of the session (lost), so a reader proves its probe's 404 with a
    LIST of the manifests. Every time it gets there, a compactor has just merged the segments
    it read and a writer has appended one more (the slot it probed): a newer manifest exists,
    but it does not cover the probed slot, so the 404 was the true end. The reader must
    return the session as of its probe, not start over (nine times, then "segments kept
    disappearing while reading", as the soak saw with compactions landing faster than a read
    took)."""
    w = make_store()
    w.create_session("lv")
    last = chain(w, "lv", ["e0", "e1", "e2"])
    c = compactor_for(w, clock)
    hits: list[int] = []

    def race(point: str, ctx: dict[str, Any]) -> None:
        nonlocal last
        if point != "read.before_manifest_check" or len(hits) >= 12:
            return
        hits.append(1)
        assert c.compact_session("lv").outcome == "compacted"  # merges what the reader read
        n = len(hits) + 2
        last = chain(w, "lv", [f"e{n}"], last)  # the slot the reader probed
        w.coord.client.flushall()  # and Redis's state is lost again

    reader = make_store(fault_hook=race)
    w.coord.client.flushall()
    assert [e["id"] for e in reader.load_session_entries("lv")] == ["e0", "e1", "e2"]
    assert len(hits) == 1  # one attempt: the newer manifest covers only what it had read
    assert [e["id"] for e in make_store().load_session_entries("lv")] == ["e0", "e1", "e2", "e3"]


def test_reader_paused_after_reading_the_manifest_sees_the_same_session(
    make_store: Callable[..., SessionStore], clock: FakeClock
) -> None:
    w = make_store()
    w.create_session("q")
    chain(w, "q", [f"e{i}" for i in range(6)])
    before = w.load_session_entries("q")
    pause = Pause("read.after_manifest")
    reader = make_store(fault_hook=pause)
    job = InThread(lambda: reader.load_session_entries("q"))
    pause.wait_paused()
    compact_and_collect(w, clock, "q")
    pause.release()
    assert job.result() == before


# --- compactors and GC ----------------------------------------------------------------------


def test_compactor_paused_before_its_manifest_past_the_orphan_grace(
    make_store: Callable[..., SessionStore], clock: FakeClock
) -> None:
    """A compactor passed its own half-grace check, wrote its bases and paused before
    creating manifest 1. GC, a grace period later, must not delete those bases while the
    compactor can still name them in the newest manifest: it takes generation 1 with a fence
    manifest first. The compactor's create then fails and the session reads the same."""
    w = make_store()
    w.create_session("c")
    chain(w, "c", [f"e{i}" for i in range(4)])
    before = w.load_session_entries("c")
    pause = Pause("compact.before_manifest")
    slow = compactor_for(w, clock, fault_hook=pause)
    job = InThread(lambda: slow.compact_session("c"))
    pause.wait_paused()
    clock.advance(GRACE_MS + 1)
    gc_result = compactor_for(w, clock).gc_session("c")
    assert [k for k, _ in gc_result.deleted] == ["orphan_base"]
    inc = w.get_header("c").incarnation
    fence = w.latest_manifest("c", inc)
    assert fence is not None and fence.generation == 1 and fence.raw["compaction"]["kind"] == "fence"
    pause.release()
    assert job.result().outcome == "lost"
    assert make_store().load_session_entries("c") == before
    # The session compacts normally afterwards.
    assert compactor_for(w, clock).compact_session("c").generation == 2
    assert make_store().load_session_entries("c") == before


def test_gc_paused_before_its_fence_deletes_no_base_a_newer_manifest_names(
    make_store: Callable[..., SessionStore], clock: FakeClock
) -> None:
    """GC decided to fence generation 1 for an old orphan base and paused before the create.
    Meanwhile the base's compactor came back and created manifest 1 naming it, a later fence
    (generation 2) copied manifest 1, and GC deleted manifest 1. The paused GC's create of
    generation 1 now succeeds *below* the newest manifest: the base it listed as an orphan is
    named by the newest manifest and must not be deleted."""

    die = dies_at("compact.before_manifest")

    w = make_store()
    w.create_session("o")
    w.append_session_entries("o", [entry("a", None)])
    w.append_session_entries("o", [entry("b", "a")])
    before = w.load_session_entries("o")
    inc = w.get_header("o").incarnation
    slow_pause = Pause("compact.before_manifest")
    slow = compactor_for(w, clock, fault_hook=slow_pause)
    slow_job = InThread(lambda: slow.compact_session("o"))
    slow_pause.wait_paused()  # bases of generation 1 written, manifest 1 not yet
    clock.advance(GRACE_MS + 1)
    gc_pause = Pause("gc.before_fence_manifest")
    paused_gc = compactor_for(w, clock, fault_hook=gc_pause)
    gc_job = InThread(lambda: paused_gc.gc_session("o"))
    gc_pause.wait_paused()
    slow_pause.release()
    assert slow_job.result().outcome == "compacted"  # manifest 1 names its bases
    # A compactor of generation 2 dies before its manifest; a grace later GC fences 2 (a
    # copy of manifest 1) and, a grace after that, deletes manifest 1.
    w.append_session_entries("o", [entry("c", "b")])
    with pytest.raises(Died):
        compactor_for(w, clock, fault_hook=die).compact_session("o")
    clock.advance(GRACE_MS + 1)
    compactor_for(w, clock).gc_session("o")
    clock.advance(GRACE_MS + 1)
    compactor_for(w, clock).gc_session("o")
    newest = w.latest_manifest("o", inc)
    assert newest is not None and newest.generation == 2 and newest.raw["compaction"]["kind"] == "fence"
    assert w.objects.head(w.layout.manifest("o", inc, 1)) is None
    gc_pause.release()
    deleted = gc_job.result().deleted
    assert not any(key in newest.base_keys for _, key in deleted)
    assert all(w.objects.head(key) is not None for key in newest.base_keys)
    assert make_store().load_session_entries("o") == before + [
        e for e in w.load_session_entries("o") if e["id"] == "c"
    ]


def test_manifest_created_late_by_a_paused_compactor_gets_its_full_grace(
    make_store: Callable[..., SessionStore], s3_url: str, redis_prefix: str, redis_url: str
) -> None:
    """The finish time inside a manifest is taken before its create. A compactor that paused
    in between (real time here) must not make GC delete what it retired at once."""
    w = make_store()
    w.create_session("g")
    w.append_session_entries("g", [entry("a", None)])
    w.append_session_entries("g", [entry("b", "a")])
    grace = 2_000
    pause = Pause("compact.before_manifest")
    slow = Compactor(w, CompactorOptions(grace_ms=grace, worker="slow"), fault_hook=pause)
    job = InThread(lambda: slow.compact_session("g"))
    pause.wait_paused()
    time.sleep(grace / 1000 * 1.25)  # past the grace period: by its finish time, all is due
    pause.release()
    assert job.result().outcome == "compacted"
    result = Compactor(w, CompactorOptions(grace_ms=grace, worker="gc")).gc_session("g")
    assert [k for k, _ in result.deleted if k == "segment"] == []  # its grace runs from the create
    time.sleep(grace / 1000 + 0.2)
    result = Compactor(w, CompactorOptions(grace_ms=grace, worker="gc")).gc_session("g")
    assert sorted(k for k, _ in result.deleted if k == "segment")


def test_gc_paused_between_deciding_and_deleting(
    make_store: Callable[..., SessionStore], clock: FakeClock
) -> None:
    """GC listed and decided, then paused while the session grew and compacted again: what it
    deletes when it goes on was retired then and is still retired; nothing live goes."""
    w = make_store()
    w.create_session("k")
    parent = chain(w, "k", [f"e{i}" for i in range(4)])
    compactor_for(w, clock).compact_session("k")
    clock.advance(GRACE_MS + 1)
    pause = Pause("gc.before_delete", when=lambda ctx: ctx["kind"] == "segment")
    gc = compactor_for(w, clock, fault_hook=pause)
    job = InThread(lambda: gc.gc_session("k"))
    pause.wait_paused()
    parent = chain(w, "k", [f"e{i}" for i in range(4, 8)], parent)
    compactor_for(w, clock).compact_session("k")
    w.append_session_entries("k", [entry("e8", parent)])
    pause.release()
    job.result()
    assert [e["id"] for e in make_store().load_session_entries("k")] == [f"e{i}" for i in range(9)]


# --- a real process, SIGSTOPped -------------------------------------------------------------


def _stoppable_writer(objects_url: str, redis_url: str, prefix: str, log_path: str) -> None:
    def hook(point: str, ctx: dict[str, Any]) -> None:
        if point == "append.before_put" and ctx["seq"] == 2:
            os.kill(os.getpid(), signal.SIGSTOP)  # the parent sends SIGCONT much later

    store = SessionStore.from_url(objects_url, redis_url, redis_prefix=prefix, fault_hook=hook)
    op = attempt(store, "s", [entry("late", "a")], None)
    with open(log_path, "wb") as fh:
        fh.write(op.to_json() + b"\n")


def test_sigstopped_writer_process_past_gc(
    make_store: Callable[..., SessionStore],
    clock: FakeClock,
    s3_url: str,
    redis_url: str,
    redis_prefix: str,
    tmp_path: Path,
) -> None:
    w = make_store()
    w.create_session("s")
    w.append_session_entries("s", [entry("a", None)])
    log_path = tmp_path / "stopped.jsonl"
    proc = mp.get_context("spawn").Process(
        target=_stoppable_writer, args=(s3_url, redis_url, redis_prefix, str(log_path))
    )
    proc.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with open(f"/proc/{proc.pid}/stat") as fh:
                if fh.read().split(") ", 1)[1].startswith("T"):
                    break
            time.sleep(0.02)
        else:
            pytest.fail("the writer never stopped itself")
        ops = [Op("s", ["a"], None, "ok", 1)]
        parent = "a"
        for i in range(4):
            ops.append(attempt(w, "s", [entry(f"o{i}", parent)], parent))
            parent = f"o{i}"
        compact_and_collect(w, clock, "s")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.join(60)
    assert proc.exitcode == 0
    ops.extend(load_ops([log_path]))
    assert ops[-1].outcome == "ok" and ops[-1].seq == 6
    assert check_history(make_store(), ops).problems == []


def test_indeterminate_outcomes_are_reported_as_such(
    make_store: Callable[..., SessionStore], s3_proxy: Any, redis_url: str, redis_prefix: str
) -> None:
    """A PUT that landed with its response lost, a resend that meets our own object (412),
    and a GET that cannot read it back: the batch is durable, so the outcome is
    IndeterminateError (re-send safe), never "nothing was written"."""

    def cut(point: str, ctx: dict[str, Any]) -> None:
        if point == "append.slot_taken" and ctx["attempts"] > 1:
            s3_proxy.blackhole()

    store = SessionStore.from_url(
        s3_proxy.url + QUICK_READS, redis_url, redis_prefix=redis_prefix, fault_hook=cut,
        retry=RetryPolicy(attempts=2, max_elapsed=2.0, initial_wait=0.01, max_wait=0.02),
    )
    try:
        store.create_session("i")
        store.append_session_entries("i", [entry("a", None)])
        s3_proxy.drop_next_response()  # the PUT lands, its answer is lost
        with pytest.raises(IndeterminateError):
            store.append_session_entries("i", [entry("b", "a")], "a")
        s3_proxy.heal()
        res = store.append_session_entries("i", [entry("b", "a")], "a")  # the re-send
        assert res.seq == 2
        assert [e["id"] for e in make_store().load_session_entries("i")] == ["a", "b"]
    finally:
        s3_proxy.heal()
        store.close()


def test_a_slot_taken_before_our_only_attempt_is_not_indeterminate(
    make_store: Callable[..., SessionStore], s3_proxy: Any, redis_url: str, redis_prefix: str
) -> None:
    """412 on the first and only PUT: the object is another writer's, nothing of ours was
    written; if it then cannot be read, that is a plain BackendUnavailableError."""
    from store.errors import BackendUnavailableError

    die = dies_at("append.after_put")

    def cut(point: str, ctx: dict[str, Any]) -> None:
        if point == "append.slot_taken":
            s3_proxy.blackhole()

    other = make_store()
    other.create_session("t")
    other.append_session_entries("t", [entry("a", None)])
    with pytest.raises(Died):
        make_store(fault_hook=die).append_session_entries("t", [entry("x", "a")])  # seg 2, Redis 1
    store = SessionStore.from_url(
        s3_proxy.url + QUICK_READS, redis_url, redis_prefix=redis_prefix, fault_hook=cut,
        retry=RetryPolicy(attempts=2, max_elapsed=2.0, initial_wait=0.01, max_wait=0.02),
    )
    try:
        with pytest.raises(BackendUnavailableError):
            store.append_session_entries("t", [entry("b", "a")])
        s3_proxy.heal()
        ids = [e["id"] for e in make_store().load_session_entries("t")]
        assert "b" not in ids
    finally:
        s3_proxy.heal()
        store.close()


# --- followers ------------------------------------------------------------------------------


def test_follower_yields_every_entry_once_across_compaction_gc_and_a_zombie(
    make_store: Callable[..., SessionStore], clock: FakeClock
) -> None:
    """A follower that paused while the session was appended to, compacted and collected,
    and while a paused writer re-created a retired slot (a zombie, never acknowledged),
    yields every acknowledged entry exactly once, in order, and never the zombie's."""
    w = make_store()
    w.create_session("f")
    w.append_session_entries("f", [entry("a", None)])
    follower = make_store()
    stream = follower.follow("f", after_seq=0, poll_s=0.05)
    assert next(stream) == (1, w.load_session_entries("f")[0])
    zombie_pause = Pause("append.before_put")
    zombie_writer = make_store(fault_hook=zombie_pause)
    late = InThread(lambda: attempt(zombie_writer, "f", [entry("late", "a")], "a"))
    zombie_pause.wait_paused()
    parent = chain(w, "f", [f"e{i}" for i in range(5)], "a")
    compact_and_collect(w, clock, "f")
    zombie_pause.release()
    assert late.result().outcome == "conflict"
    w.append_session_entries("f", [entry("e5", parent)])
    got = [next(stream) for _ in range(6)]
    stream.close()
    assert [e["id"] for _, e in got] == ["e0", "e1", "e2", "e3", "e4", "e5"]
    assert [s for s, _ in got] == [2, 3, 4, 5, 6, 7]


def test_follower_follows_a_session_deleted_and_created_again(
    make_store: Callable[..., SessionStore]
) -> None:
    w = make_store()
    w.create_session("fd")
    w.append_session_entries("fd", [entry("old", None)])
    stream = make_store().follow("fd", poll_s=0.05)
    result = InThread(lambda: [next(stream) for _ in range(2)])
    time.sleep(0.3)
    w.delete_session("fd")
    time.sleep(0.3)  # the follower meets a session that does not exist, and waits
    w.create_session("fd")
    w.append_session_entries("fd", [entry("n1", None)])
    w.append_session_entries("fd", [entry("n2", "n1")])
    got = result.result(60)
    stream.close()
    assert [(s, e["id"]) for s, e in got] == [(1, "n1"), (2, "n2")]


def test_an_idle_follower_pays_a_head_per_quiet_wake_not_a_read(
    make_store: Callable[..., SessionStore]
) -> None:
    """Quiet wakes (no notification) probe the next segment with one HEAD; the LISTs of a
    whole read come only with news, and every tenth quiet wake."""
    w = make_store()
    w.create_session("idle")
    w.append_session_entries("idle", [entry("a", None)])
    follower = make_store()
    follower.objects.requests.clear()
    assert list(follower.follow("idle", poll_s=0.02, timeout_s=2.0)) == []
    heads, lists = follower.objects.requests["head"], follower.objects.requests["list"]
    assert heads >= 5  # it woke and looked, several times
    assert lists <= 4 + 2 * (heads // 9 + 1), (heads, lists)
