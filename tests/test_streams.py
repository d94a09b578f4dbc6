"""Durable streams (``store/streams.py``) on the library, with processes paused at the points
of the fork-registration protocol: a fork registers with its source, then checks that the
source is not deleted; a delete appends its tombstone, then lists the registrations. Whatever
pauses where, a source is never removed while a fork reads it, and nothing is left behind.

Two ``Streams`` on two stores are two processes: they share only S3 and Redis."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from harness.pausing import InThread, Pause

import store.streams as streams_module
from store import SessionStore
from store.errors import SessionNotFoundError
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


def _leftovers(store: SessionStore, *names: str) -> list[str]:
    """Objects still stored for these streams, and any fork registration at all."""
    keys = [i.key for i in store.objects.list(store.layout.prefix + "streams/refs/")]
    for name in names:
        keys += [i.key for i in store.objects.list(store.layout.session_prefix(store.layout.stream_id(name)))]
    return keys


def test_a_fork_registered_while_its_source_is_deleted_backs_out_and_the_source_goes(
    make_store: Callable[..., SessionStore],
) -> None:
    """The forker pauses between registering and checking; the delete sees the registration
    (the fork may be about to read), so it only tombstones. The forker then sees the tombstone,
    withdraws, and removes the source its registration kept."""
    pause = Pause("stream.fork.registered")
    forker = Streams(make_store(fault_hook=pause))
    deleter = Streams(make_store())
    deleter.create("src", content_type=TEXT, msgs=[b"data"])
    fork = InThread(lambda: forker.create("fork", fork_from="src"))
    pause.wait_paused()
    deleter.delete("src")
    with pytest.raises(StreamGoneError):
        deleter.read("src", START)  # kept for the fork that might read it
    pause.release()
    with pytest.raises(StreamExistsError):
        fork.result()
    for s in (forker, deleter):
        for name in ("src", "fork"):
            with pytest.raises(StreamNotFoundError):
                s.read(name, START)
    assert _leftovers(deleter.store, "src", "fork") == []


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


def test_a_forker_paused_past_the_registration_grace_undoes_its_fork(
    make_store: Callable[..., SessionStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Registered and checked, then paused longer than the grace after which a registration
    without a fork is taken for a crashed forker's: the delete clears it and removes the
    source. The forker, resuming, creates its fork, sees how long it took, and deletes it
    rather than read a source that is gone; nothing is left."""
    monkeypatch.setattr(streams_module, "REF_GRACE_MS", 2000)
    pause = Pause("stream.fork.checked")
    forker = Streams(make_store(fault_hook=pause))
    deleter = Streams(make_store())
    deleter.create("src", content_type=TEXT, msgs=[b"data"])
    fork = InThread(lambda: forker.create("fork", fork_from="src"))
    pause.wait_paused()
    time.sleep(3.5)  # past the grace by the object store's clock (whole seconds on some)
    deleter.delete("src")
    with pytest.raises(StreamNotFoundError):
        deleter.read("src", START)  # the abandoned-looking registration did not keep it
    pause.release()
    with pytest.raises(Exception) as caught:
        fork.result()
    assert "took too long" in str(caught.value)
    with pytest.raises(StreamNotFoundError):
        forker.read("fork", START)
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
    refs = [i.key for i in s.store.objects.list(s.store.layout.prefix + "streams/refs/")]
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
