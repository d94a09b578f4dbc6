"""Durable before Redis hears of it (docs/design.md): on the local backends an object is
visible before it is durable (the log backend's record at its ``write``, the file backend's
name at its link), so a writer that pauses or dies between the two has made it durable to
nobody. Whoever then tells Redis of it (a roll-forward, a rebuild) makes it durable first:
what Redis holds, a re-send's DUPLICATE acknowledges. And a flush that fails is never taken
back by a later one (the kernel reports a failed write-back once): the log's objects are
rewritten into a successor that is flushed on its own, or nothing is acknowledged.

Each test fails on the code before this: the roll-forward and the rebuild told Redis of a
segment nobody had flushed, and a create whose ``fdatasync`` failed was retried, met its own
record and was acknowledged.

The failed ``fdatasync`` is injected at the log backend's hook in front of the call: no
filesystem here can be made to fail a write-back on demand (no device mapper in the
sandbox), so the kernel's once-per-file reporting is what the design argues from, not what
these tests produce.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from harness.pausing import InThread, Pause

from coordination.redis import Coordinator
from store import SessionStore
from store.errors import ConflictError, IndeterminateError
from store.file_objects import FileObjectStore
from store.log_objects import LogObjectStore
from store.objects import open_local_store
from store.records import StoreOptions
from store.retry import RetryPolicy

Hook = Callable[[str, dict[str, Any]], None]
_NONE = type("_NoTail", (), {"seq": None})()

#: Where a writer has made its segment visible and not yet durable, and what a flush reports.
_VISIBLE = {"log": "log.put.decided", "files": "file.put.linked"}
_FLUSHED = {"log": "log.flushed", "files": "file.flushed"}
_QUICK = RetryPolicy(attempts=3, max_elapsed=5.0, initial_wait=0.01, max_wait=0.05)


def _entry(eid: str, parent: str | None) -> dict[str, Any]:
    return {
        "type": "message", "id": eid, "parentId": parent, "timestamp": "2026-11-27T00:00:00.000Z",
        "message": {"role": "user", "content": f"entry {eid}", "timestamp": 1},
    }


class _Local:
    """Stores of one local directory (each its own backend object: its own fds, as another
    process has), on the test's Redis."""

    def __init__(self, root: Path, fmt: str, redis_url: str, prefix: str) -> None:
        self.root, self.fmt, self.redis_url, self.prefix = root, fmt, redis_url, prefix
        open_local_store(str(root), format="log1" if fmt == "log" else "files").close()
        self.stores: list[SessionStore] = []

    def store(self, hook: Hook | None = None, **options: Any) -> SessionStore:
        cls = LogObjectStore if self.fmt == "log" else FileObjectStore
        objects = cls(self.root, fault_hook=hook)
        coord = Coordinator.from_url(self.redis_url, prefix=self.prefix)
        options.setdefault("redis_prefix", self.prefix)
        made = SessionStore(objects, coord, options=StoreOptions(**options))
        self.stores.append(made)
        return made

    def close(self) -> None:
        for made in self.stores:
            made.close()


@pytest.fixture(params=["log", "files"])
def local(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str, redis_prefix: str) -> Any:
    stores = _Local(tmp_path / "objects", request.param, redis_url, redis_prefix)
    yield stores
    stores.close()


def _paused_writer(local: _Local) -> tuple[SessionStore, str, list[dict[str, Any]], Pause, InThread]:
    """A writer that made its segment 1 visible and paused before making it durable."""
    pause = Pause(_VISIBLE[local.fmt], lambda ctx: "/seg/" in ctx["key"])
    writer = local.store(pause)
    sid = writer.create_session(cwd="/w").session_id
    batch = [_entry("e1", None)]
    put = InThread(lambda: writer.append_session_entries(sid, batch))
    pause.wait_paused()
    return writer, sid, batch, pause, put


def _watch(local: _Local, sid: str, seen: list[int | None]) -> tuple[Hook, list[SessionStore]]:
    """A hook that records, at each flush of the session's segments, Redis's tail then."""
    holder: list[SessionStore] = []

    def hook(point: str, ctx: dict[str, Any]) -> None:
        where = "/".join(ctx.get("dirs", ())) if local.fmt == "log" else ctx.get("key", "")
        if point == _FLUSHED[local.fmt] and "/seg" in where:
            state = holder[0].coord.tail(sid)
            seen.append(None if state is None else state.seq)

    return hook, holder


def test_a_resend_rolls_a_paused_writers_segment_forward_only_once_it_is_durable(local: _Local) -> None:
    """The writer of segment 1 paused after its segment became visible and before its flush
    (a process killed there is the same to everyone else). Another process re-sends the same
    batch: its PUT meets segment 1, it rolls it forward and is acknowledged with it
    (DUPLICATE). Before Redis hears of segment 1, it is flushed."""
    writer, sid, batch, pause, put = _paused_writer(local)
    seen: list[int | None] = []
    hook, holder = _watch(local, sid, seen)
    other = local.store(hook)
    holder.append(other)
    res = other.append_session_entries(sid, batch)
    assert (res.seq, res.last_appended_entry_id) == (1, "e1")
    assert seen, "segment 1 was committed to Redis and acknowledged without being flushed"
    assert seen[0] in (None, 0), f"Redis heard of segment 1 before its flush: {seen}"
    assert other.coord.tail(sid).seq == 1
    pause.release()
    assert put.result().seq == 1  # the paused writer is acknowledged at the same slot
    assert [e["id"] for e in local.store().load_session_entries(sid)] == ["e1"]


def test_a_rebuild_flushes_what_it_read_before_installing_it(local: _Local) -> None:
    """Redis lost the session's state while a writer was paused between making segment 1
    visible and flushing it. A writer whose append is refused (a conflict) rebuilds the state
    from the objects on the way, and writes nothing: the rebuild flushed segment 1 before it
    installed a tail that holds it."""
    writer, sid, _, pause, put = _paused_writer(local)
    seen: list[int | None] = []
    hook, holder = _watch(local, sid, seen)
    other = local.store(hook)
    holder.append(other)
    other.coord.forget(sid)  # the state lost (an eviction, a FLUSHALL, an expiry)
    with pytest.raises(ConflictError):
        other.append_session_entries(sid, [_entry("x", "e1")], expected_tail_entry_id="not-e1")
    assert seen and all(s is None for s in seen), f"installed before the flush: {seen}"
    assert other.coord.tail(sid).seq == 1
    pause.release()
    assert put.result().seq == 1


def test_a_fork_from_a_paused_writers_entry_flushes_it_before_its_header_names_it(local: _Local) -> None:
    """A fork's header, durable, names its fork point: a fork from an entry of a segment
    whose writer paused before its flush makes that segment durable before the header."""
    writer, sid, _, pause, put = _paused_writer(local)
    at_flush: list[bool] = []
    holder: list[SessionStore] = []
    fork_sid = "fork-of-a-paused-writer"

    def hook(point: str, ctx: dict[str, Any]) -> None:
        where = "/".join(ctx.get("dirs", ())) if local.fmt == "log" else ctx.get("key", "")
        if point == _FLUSHED[local.fmt] and "/seg" in where and sid in where:
            at_flush.append(holder[0].objects.head(holder[0].layout.header(fork_sid)) is not None)

    other = local.store(hook)
    holder.append(other)
    fork = other.branch_from_entry(sid, "e1", fork_sid)
    assert at_flush and not at_flush[0], f"the fork's header came first: {at_flush}"
    assert [e["id"] for e in other.load_session_entries(fork.session_id)] == ["e1"]
    pause.release()
    assert put.result().seq == 1


def _eio(point: str, times: int = 1, when: Callable[[dict[str, Any]], bool] = lambda ctx: True) -> Hook:
    left = [times]

    def hook(p: str, ctx: dict[str, Any]) -> None:
        if p == point and left[0] > 0 and when(ctx):
            left[0] -= 1
            raise OSError(errno.EIO, "Input/output error (injected)")

    return hook


def _seg_dir_logs(root: Path) -> list[str]:
    found = [sorted(n for n in names if n.startswith(".log."))
             for path, _, names in os.walk(root) if path.endswith(os.sep + "seg")]
    assert len(found) == 1, found
    return found[0]


def test_a_failed_flush_is_not_taken_back_by_a_later_one(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    """The append's ``fdatasync`` fails. A second one would succeed without the bytes being
    on the disk, so the log is sealed and its objects rewritten into a successor, flushed on
    its own: the append is acknowledged once its segment is durable there, and every reader
    reads it there."""
    local = _Local(tmp_path / "objects", "log", redis_url, redis_prefix)
    try:
        events: list[str] = []
        fail = _eio("log.flush.before", when=lambda ctx: ctx["dirs"][-1:] == ("seg",))

        def hook(point: str, ctx: dict[str, Any]) -> None:
            events.append(point)
            fail(point, ctx)

        writer = local.store(hook)
        sid = writer.create_session(cwd="/w").session_id
        res = writer.append_session_entries(sid, [_entry("e1", None)])
        assert res.seq == 1
        assert "log.recover.sealed" in events
        assert _seg_dir_logs(local.root) == [".log.00000001"]  # the failed log is gone
        assert [e["id"] for e in local.store().load_session_entries(sid)] == ["e1"]
        assert writer.append_session_entries(sid, [_entry("e2", "e1")]).seq == 2
    finally:
        local.close()


def test_while_the_disk_keeps_failing_nothing_is_acknowledged(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    """The flush fails and so does every rewrite: the append is not acknowledged
    (``IndeterminateError``: the segment is visible, nothing says it is durable), however
    often the create is retried and meets its own record. Once the disk answers again, a
    re-send is acknowledged at the same slot, durable in the successor."""
    local = _Local(tmp_path / "objects", "log", redis_url, redis_prefix)
    try:
        broken = threading.Event()  # every new log's write fails (set once the session is)
        fail = _eio("log.flush.before", when=lambda ctx: ctx["dirs"][-1:] == ("seg",))

        def hook(point: str, ctx: dict[str, Any]) -> None:
            fail(point, ctx)
            if point == "log.link.before" and broken.is_set():
                raise OSError(errno.EIO, "Input/output error (injected)")

        writer = local.store(hook, retry=_QUICK)
        sid = writer.create_session(cwd="/w").session_id
        batch = [_entry("e1", None)]
        broken.set()
        with pytest.raises(IndeterminateError):
            writer.append_session_entries(sid, batch)
        tail = writer.coord.tail(sid)
        assert tail is None or tail.seq == 0  # Redis never heard of it
        broken.clear()
        res = writer.append_session_entries(sid, batch)
        assert (res.seq, res.last_appended_entry_id) == (1, "e1")
        assert _seg_dir_logs(local.root) == [".log.00000001"]
        assert [e["id"] for e in local.store().load_session_entries(sid)] == ["e1"]
    finally:
        local.close()


def test_a_thread_never_trusts_a_flush_after_another_threads_failed(tmp_path: Path) -> None:
    """Two threads of one process create in one log (one fd). The first one's ``fdatasync``
    fails; the kernel would report that to one ``fdatasync`` only, so the second thread's,
    made after it, would succeed with the first one's bytes (and perhaps its own) not on the
    disk. The second thread must not make one: both objects are made durable in the
    successor."""
    events: list[tuple[str, str]] = []
    in_flush = threading.Event()
    go = threading.Event()
    first = [True]

    def hook(point: str, ctx: dict[str, Any]) -> None:
        events.append((threading.current_thread().name, point))
        if point == "log.flush.before" and first[0]:
            first[0] = False
            in_flush.set()
            assert go.wait(30)
            raise OSError(errno.EIO, "Input/output error (injected)")

    objects = LogObjectStore(tmp_path / "objects", fault_hook=hook)
    a = InThread(lambda: objects.put_if_absent("s/d/a", b"A"))
    assert in_flush.wait(30)
    b_done = threading.Event()

    def put_b() -> None:
        objects.put_if_absent("s/d/b", b"B")
        b_done.set()

    b = InThread(put_b)
    assert not b_done.wait(0.3)  # waits for the flush in progress
    go.set()
    a.result()
    b.result()
    flushed = [p for _, p in events if p == "log.flushed"]
    assert flushed == [], f"a flush of the failed log was believed: {events}"
    assert sorted(n for n in os.listdir(tmp_path / "objects" / "s" / "d") if n.startswith(".log.")) == [".log.00000001"]
    fresh = LogObjectStore(tmp_path / "objects")
    assert (fresh.get("s/d/a").data, fresh.get("s/d/b").data) == (b"A", b"B")


def test_a_writer_paused_with_its_commit_sent_before_its_flush(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    """Committing during the flush (docs/design.md): the writer's COMMIT has reached Redis,
    and the writer paused before its ``fdatasync``. Redis's word is an acknowledgement: a
    re-send of the batch is answered DUPLICATE, and is acknowledged only after it made the
    segment durable itself. The paused writer, resumed, is acknowledged at the same slot."""
    local = _Local(tmp_path / "objects", "log", redis_url, redis_prefix)
    try:
        sid = local.store().create_session(cwd="/w").session_id
        pause = Pause("log.flush.before", lambda ctx: ctx["dirs"][-1:] == ("seg",) and sid in "/".join(ctx["dirs"]))
        writer = local.store(pause, commit_during_flush=True)
        # Redis has COMMIT's script (a NOSCRIPT answer would have it run after the flush).
        warm = writer.create_session(cwd="/w").session_id
        writer.append_session_entries(warm, [_entry("w1", None)])
        batch = [_entry("e1", None)]
        put = InThread(lambda: writer.append_session_entries(sid, batch))
        pause.wait_paused()
        deadline = time.monotonic() + 10
        while (writer.coord.tail(sid) or _NONE).seq != 1:
            assert time.monotonic() < deadline, "COMMIT never reached Redis during the flush"
            time.sleep(0.01)
        seen: list[int | None] = []
        hook, holder = _watch(local, sid, seen)
        other = local.store(hook)
        holder.append(other)
        assert other.append_session_entries(sid, batch).seq == 1  # DUPLICATE
        assert seen, "acknowledged on Redis's word with the segment flushed by nobody"
        pause.release()
        res = put.result()
        assert (res.seq, res.segment_entries) == (1, 1)
        assert [e["id"] for e in local.store().load_session_entries(sid)] == ["e1"]
    finally:
        local.close()


def test_commit_during_flush_is_sent_once_the_key_is_won_and_answered_after_the_flush(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    """The order of one append with the option on: the segment's record written and its key
    won, COMMIT sent, the flush, then COMMIT's answer read. Off (any Redis but the embedded
    default's), COMMIT is sent after the flush."""
    for on in (True, False):
        local = _Local(tmp_path / f"objects-{on}", "log", redis_url, f"{redis_prefix}{on}")
        try:
            order: list[str] = []

            def hook(point: str, ctx: dict[str, Any]) -> None:
                seg = ctx.get("dirs", ())[-1:] == ("seg",) or "/seg/" in ctx.get("key", "")
                if point in ("log.put.decided", "log.flushed") and seg:
                    order.append(point)

            def store_hook(point: str, ctx: dict[str, Any]) -> None:
                if point in ("append.commit_sent", "append.after_put"):
                    order.append(point)

            writer = local.store(hook, commit_during_flush=on, fault_hook=store_hook)
            sid = writer.create_session(cwd="/w").session_id
            order.clear()
            assert writer.append_session_entries(sid, [_entry("e1", None)]).seq == 1
            want = ["log.put.decided", "append.commit_sent", "log.flushed", "append.after_put"]
            assert order == (want if on else [w for w in want if w != "append.commit_sent"])
            assert writer.coord.tail(sid).seq == 1
        finally:
            local.close()


def test_gc_deletes_what_a_manifest_retires_only_once_the_manifest_is_durable(local: _Local) -> None:
    """A compactor wrote its manifest and paused before flushing it. Past the grace period,
    GC (another process) deletes the segments that manifest retires, and flushes the
    manifest first: a power loss must not keep the deletions and lose the manifest, which
    names the bases that now hold those entries."""
    from compactor import Compactor, CompactorOptions
    from harness.pausing import FakeClock

    writer = local.store()
    sid = writer.create_session(cwd="/w").session_id
    parent = None
    for i in range(3):
        writer.append_session_entries(sid, [_entry(f"e{i}", parent)])
        parent = f"e{i}"
    inc = writer.get_header(sid).incarnation
    manifest = writer.layout.manifest(sid, inc, 1)
    manifest_dir = manifest.rsplit("/", 1)[0]
    segment = writer.layout.segment(sid, inc, 1)

    pause = Pause(_VISIBLE[local.fmt], lambda ctx: ctx["key"] == manifest)
    clock = FakeClock()
    compacting = InThread(lambda: Compactor(
        local.store(pause), CompactorOptions(grace_ms=0, worker="paused"), now=clock,
    ).compact_session(sid))
    pause.wait_paused()

    seen: list[bool] = []
    probe = local.store()

    def hook(point: str, ctx: dict[str, Any]) -> None:
        where = "/".join(ctx.get("dirs", ())) if local.fmt == "log" else ctx.get("key", "").rsplit("/", 1)[0]
        if point == _FLUSHED[local.fmt] and where == manifest_dir:
            seen.append(probe.objects.head(segment) is not None)

    later = FakeClock()
    later.advance(3_600_000)
    gc = Compactor(local.store(hook), CompactorOptions(grace_ms=0, worker="gc"), now=later)
    result = gc.gc_session(sid)
    deleted = [k for kind, k in result.deleted if kind == "segment"]
    assert segment in deleted, result
    assert seen and seen[0], f"segments deleted before the manifest retiring them was flushed: {seen}"
    pause.release()
    assert compacting.result().outcome == "compacted"
    assert [e["id"] for e in local.store().load_session_entries(sid)] == ["e0", "e1", "e2"]
