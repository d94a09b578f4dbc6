"""Durable before Redis hears of it (docs/design.md): on the file backend an object is
visible (its name, at its link) before it is durable (its directory's fsync), so a writer
that pauses or dies between the two has made it durable to nobody. Whoever then tells Redis
of it (a roll-forward, a rebuild, a fork, GC's deletions that a manifest allows) makes it
durable first.

Each test fails on the code before this: the roll-forward and the rebuild told Redis of a
segment nobody had flushed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
from harness.pausing import InThread, Pause

from coordination.redis import Coordinator
from store import SessionStore
from store.errors import ConflictError
from store.backends.files import FileObjectStore
from store.backends.objects import open_local_store
from store.formats.records import StoreOptions

Hook = Callable[[str, dict[str, Any]], None]

#: Where a writer has made its segment visible and not yet durable, and what a flush reports.
_VISIBLE = "file.put.linked"
_FLUSHED = "file.flushed"


def _entry(eid: str, parent: str | None) -> dict[str, Any]:
    return {
        "type": "message", "id": eid, "parentId": parent, "timestamp": "2026-11-27T00:00:00.000Z",
        "message": {"role": "user", "content": f"entry {eid}", "timestamp": 1},
    }


class _Local:
    """Stores of one local directory (each its own backend object: its own fds, as another
    process has), on the test's Redis."""

    def __init__(self, root: Path, redis_url: str, prefix: str) -> None:
        self.root, self.redis_url, self.prefix = root, redis_url, prefix
        open_local_store(str(root)).close()
        self.stores: list[SessionStore] = []

    def store(self, hook: Hook | None = None, **options: Any) -> SessionStore:
        objects = FileObjectStore(self.root, fault_hook=hook)
        coord = Coordinator.from_url(self.redis_url, prefix=self.prefix)
        options.setdefault("redis_prefix", self.prefix)
        made = SessionStore(objects, coord, options=StoreOptions(**options))
        self.stores.append(made)
        return made

    def close(self) -> None:
        for made in self.stores:
            made.close()


@pytest.fixture
def local(tmp_path: Path, redis_url: str, redis_prefix: str) -> Any:
    stores = _Local(tmp_path / "objects", redis_url, redis_prefix)
    yield stores
    stores.close()


def _paused_writer(local: _Local) -> tuple[SessionStore, str, list[dict[str, Any]], Pause, InThread]:
    """A writer that made its segment 1 visible and paused before making it durable."""
    pause = Pause(_VISIBLE, lambda ctx: "/seg/" in ctx["key"])
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
        if point == _FLUSHED and "/seg" in ctx.get("key", ""):
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
        where = ctx.get("key", "")
        if point == _FLUSHED and "/seg" in where and sid in where:
            at_flush.append(holder[0].objects.head(holder[0].layout.header(fork_sid)) is not None)

    other = local.store(hook)
    holder.append(other)
    fork = other.branch_from_entry(sid, "e1", fork_sid)
    assert at_flush and not at_flush[0], f"the fork's header came first: {at_flush}"
    assert [e["id"] for e in other.load_session_entries(fork.session_id)] == ["e1"]
    pause.release()
    assert put.result().seq == 1


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

    pause = Pause(_VISIBLE, lambda ctx: ctx["key"] == manifest)
    clock = FakeClock()
    compacting = InThread(lambda: Compactor(
        local.store(pause), CompactorOptions(grace_ms=0, worker="paused"), now=clock,
    ).compact_session(sid))
    pause.wait_paused()

    seen: list[bool] = []
    probe = local.store()

    def hook(point: str, ctx: dict[str, Any]) -> None:
        if point == _FLUSHED and ctx.get("key", "").rsplit("/", 1)[0] == manifest_dir:
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
