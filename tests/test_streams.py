"""Durable streams (``store/streams/``) on the library, with processes paused (or killed) at the
points of the fork-registration protocol (``store/protocol/forks.py``): a fork registers with its
source, creates its header, then checks that the source is not deleted; a delete appends its
tombstone, then lists the registrations. Whatever pauses where, a source is never removed
while a fork reads it, and nothing is left behind.

Two ``Streams`` on two stores are two processes: they share only S3 and Redis."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from harness.pausing import InThread, Pause

from store import SessionStore
from store.errors import SessionNotFoundError
from store.streams.reads import READ_WINDOW
from store.streams import (
    Producer,
    START,
    StreamExistsError,
    StreamGoneError,
    StreamNotFoundError,
    Streams,
)

pytestmark = pytest.mark.timeout(300)
TEXT = "text/plain"


def _registrations(store: SessionStore) -> list[str]:
    """Every fork registration, under both names the registry reads (``store/protocol/forks.py``)."""
    return [i.key for root in ("forks/", "streams/refs/") for i in store.objects.list(store.layout.prefix + root)]


def _leftovers(store: SessionStore, *names: str) -> list[str]:
    """Objects still stored for these streams, and any fork registration at all."""
    keys = _registrations(store)
    for name in names:
        keys += [i.key for i in store.objects.list(store.layout.session_prefix(store.layout.stream_id(name)))]
    return keys


@pytest.mark.parametrize("point", ["stream.fork.registered", "stream.fork.created"])
def test_a_fork_paused_before_its_check_while_its_source_is_deleted_backs_out_and_the_source_goes(
    make_store: Callable[..., SessionStore], point: str
) -> None:
    """The forker pauses before checking its source: registered only (``registered``), or
    with its header created too (``created``). The delete tombstones the source and lists the
    registrations: one without a header is dead (its forker checks after its header, so it
    will back out) and the source goes at once; one whose header exists is live (the fork may
    be about to read) and the source is kept. The forker then sees the tombstone (or no
    source), withdraws, and removes the source its registration kept."""
    pause = Pause(point)
    forker = Streams(make_store(fault_hook=pause))
    deleter = Streams(make_store())
    deleter.create("src", content_type=TEXT, msgs=[b"data"])
    fork = InThread(lambda: forker.create("fork", fork_from="src"))
    pause.wait_paused()
    deleter.delete("src")
    if point == "stream.fork.created":
        with pytest.raises(StreamGoneError):
            deleter.read("src", START)  # kept for the fork that might read it
    else:
        with pytest.raises(StreamNotFoundError):
            deleter.read("src", START)  # no fork header names it: removed
        assert _registrations(deleter.store) == []
    pause.release()
    with pytest.raises(StreamExistsError):
        fork.result()
    for s in (forker, deleter):
        for name in ("src", "fork"):
            with pytest.raises(StreamNotFoundError):
                s.read(name, START)
    assert _leftovers(deleter.store, "src", "fork") == []


def test_a_forker_killed_after_registering_leaves_nothing_once_the_source_is_deleted(
    make_store: Callable[..., SessionStore],
) -> None:
    """A forker dies between its registration and its header: the registration names no
    fork, so the source's delete drops it and removes the source; nothing is left."""

    class Died(BaseException):
        pass

    def die(point: str, ctx: dict[str, object]) -> None:
        if point == "stream.fork.registered":
            raise Died()

    s = Streams(make_store())
    s.create("src", content_type=TEXT, msgs=[b"data"])
    with pytest.raises(Died):
        Streams(make_store(fault_hook=die)).create("fork", fork_from="src")
    assert len(_registrations(s.store)) == 1
    with pytest.raises(StreamNotFoundError):
        s.read("fork", START)
    s.delete("src")
    with pytest.raises(StreamNotFoundError):
        s.read("src", START)
    assert _leftovers(s.store, "src", "fork") == []


def test_a_delete_paused_after_its_tombstone_refuses_new_forks_then_removes_the_source(
    make_store: Callable[..., SessionStore],
) -> None:
    pause = Pause("stream.delete.tombstoned")
    deleter = Streams(make_store(fault_hook=pause))
    forker = Streams(make_store())
    forker.create("src", content_type=TEXT, msgs=[b"data"])
    gone = InThread(lambda: deleter.delete("src"))
    pause.wait_paused()
    with pytest.raises(StreamExistsError):
        forker.create("fork", fork_from="src")
    pause.release()
    gone.result()
    with pytest.raises(StreamNotFoundError):
        forker.read("src", START)
    assert _leftovers(forker.store, "src", "fork") == []


def test_a_forker_paused_after_its_check_for_any_length_of_time_keeps_its_source(
    make_store: Callable[..., SessionStore],
) -> None:
    """Registered, header created and source checked, then paused (for longer than any grace
    period: none is assumed) while the source is deleted: the fork's header names the source,
    so the delete only tombstones it. The forker, resuming, has a fork that reads the source's
    data; deleting the fork takes the source along, and nothing is left."""
    pause = Pause("stream.fork.checked")
    forker = Streams(make_store(fault_hook=pause))
    deleter = Streams(make_store())
    deleter.create("src", content_type=TEXT, msgs=[b"data"])
    fork = InThread(lambda: forker.create("fork", fork_from="src", msgs=[b";mine"]))
    pause.wait_paused()
    deleter.delete("src")
    with pytest.raises(StreamGoneError):
        deleter.read("src", START)  # kept for the fork
    pause.release()
    created, _ = fork.result()
    assert created
    assert b"".join(deleter.read("fork", START).messages) == b"data;mine"
    deleter.delete("fork")
    with pytest.raises(StreamNotFoundError):
        deleter.read("src", START)
    assert _leftovers(deleter.store, "src", "fork") == []


def test_a_fork_keeps_reading_its_deleted_source_and_takes_it_along_when_deleted(
    make_store: Callable[..., SessionStore],
) -> None:
    a, b = Streams(make_store()), Streams(make_store())
    a.create("src", content_type=TEXT, msgs=[b"one;"])
    a.append("src", [b"two;"], content_type=TEXT)
    b.create("fork", fork_from="src")
    b.append("fork", [b"mine;"], content_type=TEXT)
    a.append("src", [b"not in the fork;"], content_type=TEXT)
    a.delete("src")
    with pytest.raises(StreamGoneError):
        b.read("src", START)
    with pytest.raises(StreamExistsError):
        a.create("src", content_type=TEXT)  # the name stays taken while the fork reads it
    assert b"".join(a.read("fork", START).messages) == b"one;two;mine;"
    b.delete("fork")
    assert _leftovers(a.store, "src", "fork") == []
    a.create("src", content_type=TEXT)  # free again


def test_an_append_checked_against_an_ended_life_never_lands_in_the_next(
    make_store: Callable[..., SessionStore],
) -> None:
    """A writer read an empty stream, paused, and carries on after the stream was deleted and
    created again (also empty, so an expected tail of "" would match): its append names the
    incarnation it checked against and is refused, writing nothing into the new life."""
    writer_store = make_store()
    Streams(writer_store).create("s", content_type=TEXT)
    checked = writer_store.get_header("s").incarnation
    other = Streams(make_store())
    other.delete("s")
    other.create("s", content_type="application/json")
    record = {"type": "stream.batch", "id": "a.stale", "parentId": None, "at": 0, "msgs": ["eA=="]}
    with pytest.raises(SessionNotFoundError):
        writer_store.append_session_entries("s", [record], "", incarnation=checked)
    assert other.read("s", START).messages == []
    assert other.read("s", START).next_offset == START


def test_a_collector_paused_before_dropping_a_forks_registration_never_drops_the_next_ones(
    make_store: Callable[..., SessionStore],
) -> None:
    """Fork F of S is deleted: its collector removed F's session and paused before dropping
    F's registration with S. Meanwhile F is forked from S again (the same path, a new life)
    and written to. The collector then drops only the registration of the life it removed
    (each fork create registers under a token of its own), so when S is deleted the new F
    still holds it: S's data stays, and F reads its whole history."""
    fork_sid = "fork"  # a name that is a session id is its own stream id
    pause = Pause("stream.collect.deleted", lambda ctx: ctx["stream"] == fork_sid)
    collector = Streams(make_store(fault_hook=pause))
    other = Streams(make_store())
    other.create("src", content_type=TEXT, msgs=[b"one;"])
    other.create("fork", fork_from="src")
    gone = InThread(lambda: collector.delete("fork"))
    pause.wait_paused()
    other.create("fork", fork_from="src")
    other.append("fork", [b"mine;"], content_type=TEXT)
    pause.release()
    gone.result()
    other.delete("src")
    with pytest.raises(StreamGoneError):
        other.read("src", START)  # tombstoned, kept for the fork that reads it
    fresh = Streams(make_store(redis_prefix="fresh-" + fork_sid[:8]))
    assert b"".join(fresh.read("fork", START).messages) == b"one;mine;"
    other.delete("fork")  # takes the source along
    assert _leftovers(other.store, "src", "fork") == []


def test_a_repeated_fork_create_leaves_one_registration(make_store: Callable[..., SessionStore]) -> None:
    """A create of an existing fork with the same settings is the same create (idempotent):
    the registration it made under its own token is dropped, the fork's own stays."""
    s = Streams(make_store())
    s.create("src", content_type=TEXT, msgs=[b"one;"])
    s.create("fork", fork_from="src")
    created, _ = s.create("fork", fork_from="src")
    assert created is False
    refs = _registrations(s.store)
    assert len(refs) == 1 and refs[0].startswith(s.store.layout.prefix + "forks/")
    assert len(refs) == 1 and refs[0].rsplit("/", 1)[-1].startswith(s.store.layout.stream_id("fork") + "=")
    s.delete("src")
    assert b"".join(s.read("fork", START).messages) == b"one;"
    s.delete("fork")
    assert _leftovers(s.store, "src", "fork") == []


def test_a_producer_goes_on_after_a_process_died_between_put_and_commit(
    make_store: Callable[..., SessionStore],
) -> None:
    """A process dies after its segment's PUT, before COMMIT. Another process's reader meets
    the segment (reads probe) and caches the state past Redis's tail; its producers then
    condition every append on that state. Each CHECK conflicted with Redis's older tail and
    nothing rolled the segment forward: the stream answered "the tail kept moving" for good.
    The append's conflict now rolls it forward, and the producer's re-send is a duplicate."""

    class Died(BaseException):
        pass

    def die(point: str, ctx: dict[str, object]) -> None:
        if point == "append.after_put":
            raise Died()

    json_type = "application/json"
    first = Streams(make_store())
    first.create("crash/s1", content_type=json_type)
    first.append("crash/s1", [{"n": 0}], content_type=json_type, producer=Producer("p", 0, 0))
    with pytest.raises(Died):
        Streams(make_store(fault_hook=die)).append(
            "crash/s1", [{"n": 1}], content_type=json_type, producer=Producer("p", 0, 1)
        )
    other = Streams(make_store())
    assert other.read("crash/s1", START).messages == [{"n": 0}, {"n": 1}]
    again = other.append("crash/s1", [{"n": 1}], content_type=json_type, producer=Producer("p", 0, 1))
    assert again.duplicate
    nxt = other.append("crash/s1", [{"n": 2}], content_type=json_type, producer=Producer("p", 0, 2))
    assert not nxt.duplicate
    assert other.read("crash/s1", START).messages == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert other.store.coord.tail(other.store.layout.stream_id("crash/s1")).seq == 3  # type: ignore[union-attr]


def test_a_read_holds_whole_appends_within_its_budget_and_goes_window_by_window(
    make_store: Callable[..., SessionStore],
) -> None:
    """A read answers whole appends of at most ``max_bytes`` in all (the first alone when it
    is larger); the rest follows from the offset it ends at. A stream longer than a read
    window of segments is read across windows, in order, each append once."""
    s = Streams(make_store())
    s.create("big", content_type=TEXT)
    for i in range(3):
        s.append("big", [bytes([65 + i]) * 600], content_type=TEXT)
    first = s.read("big", START, max_bytes=1000)
    assert [m for b in first.batches for m in b.messages] == [b"A" * 600]  # 1,200 would overrun
    assert not first.up_to_date
    alone = s.read("big", START, max_bytes=100)  # a first append larger than the budget: alone
    assert [m for b in alone.batches for m in b.messages] == [b"A" * 600]
    rest = s.read("big", first.next_offset, max_bytes=1200)
    assert [m for b in rest.batches for m in b.messages] == [b"B" * 600, b"C" * 600] and rest.up_to_date

    s.create("long", content_type=TEXT)
    for i in range(READ_WINDOW * 2 + 5):
        s.append("long", [str(i).encode()], content_type=TEXT)
    got = s.read("long", START)
    assert [m for b in got.batches for m in b.messages] == [str(i).encode() for i in range(READ_WINDOW * 2 + 5)]
    assert got.up_to_date


def test_a_binary_streams_messages_are_decoded_once_a_segment_and_read_exact(
    make_store: Callable[..., SessionStore],
) -> None:
    """A binary stream's messages are stored as base64: a process decodes a segment's once
    and every later read of it (a catch-up from anywhere, a fork's read of its source) gets
    the same decoded messages, byte-exact, never a neighbour's."""
    s = Streams(make_store())
    s.create("bin", content_type="application/octet-stream")
    blobs = [bytes([i]) * (1000 + i) for i in range(5)]
    for blob in blobs:
        s.append("bin", [blob, blob[:7]], content_type="application/octet-stream")
    first = [m for b in s.read("bin", START).batches for m in b.messages]
    assert first == [m for blob in blobs for m in (blob, blob[:7])]
    again = [m for b in s.read("bin", START).batches for m in b.messages]
    assert again == first and all(a is b for a, b in zip(again, first))  # decoded once
    mid = s.read("bin", START, max_bytes=2100)  # two appends, then from where it ended
    rest = [m for b in s.read("bin", mid.next_offset).batches for m in b.messages]
    assert [m for b in mid.batches for m in b.messages] + rest == first
    assert s.states.decoded.kept_bytes == sum(len(m) for m in first)
    s.delete("bin")  # once deleted, this process keeps none of its messages
    assert s.states.decoded.kept_bytes == 0


def test_decoded_messages_are_bounded_by_bytes_least_recently_used_first() -> None:
    import base64

    from store.streams.reads import DecodedMessages

    cache = DecodedMessages(max_bytes=250)
    enc = lambda b: [base64.b64encode(b).decode()]  # noqa: E731
    one = cache.of("s", "i", 1, enc(b"a" * 100))
    two = cache.of("s", "i", 2, enc(b"b" * 100))
    assert cache.of("s", "i", 1, enc(b"a" * 100)) is one  # kept, now the most recent
    cache.of("s", "i", 3, enc(b"c" * 100))  # 300 bytes: the least recent (2) goes
    assert cache.of("s", "i", 1, enc(b"a" * 100)) is one
    assert cache.of("s", "i", 2, enc(b"b" * 100)) is not two and cache.of("s", "i", 2, []) == two
    assert cache.of("s", "other", 1, enc(b"z")) == [b"z"]  # another incarnation: its own
    big = cache.of("s", "i", 9, enc(b"x" * 400))  # larger than the bound: decoded, not kept
    assert big == [b"x" * 400] and cache.of("s", "i", 9, []) == []
    cache.drop("s")  # a deleted stream: nothing of it is kept
    assert cache.of("s", "i", 1, []) == [] and cache.of("s", "other", 1, []) == []
