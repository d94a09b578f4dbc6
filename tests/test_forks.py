"""Forks (``branch_from_entry``): what one costs and what it holds.

A fork reads nothing of its source: the fork point's segment comes from Redis's tail and
index (docs/design.md, "Forks"), so forking a session of 300 uncompacted segments costs
exactly the requests of forking one of 10, counted by the store's own request counting on
each S3 backend. What the fork holds is the path root..fork point, committed entries only:
never a batch a paused or killed writer PUT past the tail it forked at, never what the
source gets afterwards; and a forker that pauses after placing its fork point while the
source is compacted, collected, deleted or re-created either forks what it placed or backs
out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from harness.pausing import FakeClock, InThread, Pause
from pi_samples import append_chain as chain
from pi_samples import message as entry

from compactor import Compactor, CompactorOptions
from store import SessionStore
from store.errors import EntryNotFoundError, IdCollisionError, SessionNotFoundError

GRACE_MS = 60_000
#: The source sizes forked, in segments (one entry each), uncompacted.
LONG, SHORT = 300, 10


class Died(Exception):
    """Raised by a fault hook: the writer's process ends there."""




def ids_of(store: SessionStore, sid: str) -> list[str]:
    return [str(e["id"]) for e in store.load_session_entries(sid)]


def fork_requests(make_store: Callable[..., SessionStore], sid: str, at: str, new: str) -> dict[str, int]:
    """The object requests of one fork by a process that has read nothing of ``sid`` (its
    first create done before counting: the backend's probe is not the fork's)."""
    forker = make_store()
    forker.create_session(f"warm-{new}")
    forker.objects.requests.clear()
    forker.branch_from_entry(sid, at, new)
    return {op: n for op, n in forker.objects.requests.items() if n}


def compact(store: SessionStore, sid: str) -> None:
    clock = FakeClock()
    c = Compactor(store, CompactorOptions(grace_ms=GRACE_MS, worker="t"), now=clock)
    assert c.compact_session(sid).outcome == "compacted"
    clock.advance(GRACE_MS + 1)
    c.gc_session(sid)


@pytest.mark.every_backend
def test_a_fork_costs_the_same_requests_whatever_the_sources_length(
    make_store: Callable[..., SessionStore],
) -> None:
    """At the tail, at an entry Redis indexes, and at the tail of a fork: the source's header
    (GET), the fork's registration and header (PUTs), and the check after them (the source's
    header again, and the HEAD past its tail): 6 requests, for 10 segments as for 300."""
    writer = make_store()
    writer.create_session("long")
    long_ids = chain(writer, "long", LONG)
    writer.create_session("short")
    short_ids = chain(writer, "short", SHORT)

    want = {"get": 3, "put": 2, "head": 1}
    assert fork_requests(make_store, "long", long_ids[-1], "f-long") == want
    assert fork_requests(make_store, "short", short_ids[-1], "f-short") == want
    # An entry inside the source, found in Redis's index.
    assert fork_requests(make_store, "long", long_ids[LONG // 2], "f-long-mid") == want
    assert fork_requests(make_store, "short", short_ids[SHORT // 2], "f-short-mid") == want
    # A fork of a fork (once Redis holds its state: its first append, read of its tail or
    # listing rebuilt it), at its inherited fork point (segment 0) and at its own tail.
    writer.append_session_entries("f-long", [entry("own", long_ids[-1])])
    assert fork_requests(make_store, "f-long", long_ids[-1], "ff-long") == want
    assert fork_requests(make_store, "f-long", "own", "ff-long-own") == want

    assert ids_of(writer, "f-long") == long_ids + ["own"]
    assert ids_of(writer, "f-long-mid") == long_ids[: LONG // 2 + 1]
    assert ids_of(writer, "f-short") == short_ids
    assert ids_of(writer, "ff-long") == long_ids
    assert ids_of(writer, "ff-long-own") == long_ids + ["own"]
    # The fork goes on by itself; parents and uniqueness cover its inherited path.
    writer.append_session_entries("f-short-mid", [entry("branch", short_ids[SHORT // 2])])
    assert ids_of(writer, "f-short-mid") == short_ids[: SHORT // 2 + 1] + ["branch"]
    assert writer.get_tail("f-short-mid").entry_count == SHORT // 2 + 2
    with pytest.raises(IdCollisionError):
        writer.append_session_entries("f-short-mid", [entry(short_ids[0], "branch")])

    # Compacted: the tail costs the same; an entry the manifest took out of Redis's index
    # is found in the bases (the manifest and its base, read once by a process), not in a
    # read of the session.
    compact(writer, "long")
    assert fork_requests(make_store, "long", long_ids[-1], "f-long-compacted") == want
    assert ids_of(writer, "f-long-compacted") == long_ids
    mid = fork_requests(make_store, "long", long_ids[LONG // 3], "f-long-compacted-mid")
    assert mid == {**want, "get": want["get"] + 2}  # the manifest Redis names, its one base
    assert ids_of(writer, "f-long-compacted-mid") == long_ids[: LONG // 3 + 1]


def test_a_fork_at_the_tail_holds_only_what_was_committed_and_nothing_later(
    make_store: Callable[..., SessionStore],
) -> None:
    """A writer paused after its PUT and before its COMMIT, and one killed there: the tail
    Redis names is before their segments, and a fork at it holds the path to it only. What
    the source gets after the fork (those segments rolled forward, new appends) never
    appears in the fork."""
    writer = make_store()
    writer.create_session("s")
    ids = chain(writer, "s", 5)

    def die(point: str, ctx: dict[str, Any]) -> None:
        if point == "append.after_put":
            raise Died()

    with pytest.raises(Died):
        make_store(fault_hook=die).append_session_entries("s", [entry("killed", ids[-1])])
    tail = make_store().coord.tail("s")
    assert tail is not None and tail.last == ids[-1]  # Redis never heard of segment 6
    before = make_store().branch_from_entry("s", tail.last, "fork-killed")
    assert before.header.fork is not None and before.header.fork.seq == 5

    pause = Pause("append.after_put")
    paused = make_store(fault_hook=pause)
    late = InThread(lambda: paused.append_session_entries("s", [entry("paused", None)]))
    pause.wait_paused()
    tail = make_store().coord.tail("s")
    assert tail is not None and tail.last == "killed"  # rolled forward by the paused writer's PUT
    during = make_store().branch_from_entry("s", tail.last, "fork-paused")
    pause.release()
    assert late.result().seq == 7
    writer.append_session_entries("s", [entry("after", "paused")])

    assert ids_of(writer, "s") == ids + ["killed", "paused", "after"]
    assert ids_of(writer, "fork-killed") == ids
    assert ids_of(writer, "fork-paused") == ids + ["killed"]
    assert during.header.fork is not None and during.header.fork.seq == 6
    # Each fork goes on from its fork point, its own entries after the inherited path.
    writer.append_session_entries("fork-killed", [entry("mine", ids[-1])])
    assert ids_of(writer, "fork-killed") == ids + ["mine"]
    assert "mine" not in ids_of(writer, "s")
    with pytest.raises(EntryNotFoundError):
        writer.branch_from_entry("s", "nowhere", "fork-nowhere")
    with pytest.raises(SessionNotFoundError):
        writer.branch_from_entry("absent", ids[0], "fork-absent")


@pytest.mark.parametrize("meanwhile", ["compacted", "recreated"])
def test_a_forker_paused_after_placing_its_fork_point(
    make_store: Callable[..., SessionStore], meanwhile: str
) -> None:
    """The fork point (source, incarnation, entry, segment) is a fact of that incarnation:
    compacted and collected meanwhile, the fork still reads its path; deleted and created
    again meanwhile, the fork backs out (``SessionNotFoundError``) and leaves no session."""
    writer = make_store()
    writer.create_session("src")
    ids = chain(writer, "src", 8)
    pause = Pause("fork.placed")
    forker = make_store(fault_hook=pause)
    job = InThread(lambda: forker.branch_from_entry("src", ids[3], "late-fork"))
    pause.wait_paused()
    if meanwhile == "compacted":
        chain(writer, "src", 3, tag="x", parent=ids[-1])
        compact(writer, "src")
        pause.release()
        handle = job.result()
        assert handle.header.fork is not None and handle.header.fork.seq == 4
        assert ids_of(writer, "late-fork") == ids[:4]
    else:
        writer.delete_session("src")
        writer.create_session("src")
        chain(writer, "src", 8)  # the same ids, another life
        pause.release()
        with pytest.raises(SessionNotFoundError):
            job.result()
        with pytest.raises(SessionNotFoundError):
            writer.get_header("late-fork")
