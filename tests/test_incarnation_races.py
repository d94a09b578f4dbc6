"""Two lives of one session id, and the processes that end one of them while the next begins,
on the real servers (S3 over HTTP, a real redis-server).

A session id is reused when a session is deleted and created again: each life is an
incarnation with its own key space (docs/design.md, "Incarnations"). Whoever ends a life (a
delete, GC of a header-less incarnation) may pause for any length of time between deciding
what to remove and removing it, while the next life is created, written to and acknowledged.
Nothing of the next life may be removed by it:

- a delete paused after its header went (or between its LIST and its deletes) removes only
  objects of the incarnation it deleted;
- GC that decided an incarnation without a header was abandoned and paused before its
  deletes, while that very incarnation's creator wrote its header, never removes the data
  key of a session that was acknowledged: it fences the incarnation first
  (``withdrawn.json``), reads the header again, and the creator, which checks for the fence
  after its header, withdraws instead of acknowledging.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Callable

import pytest

from harness.pausing import FakeClock, InThread, Pause
from test_compactor import GRACE_MS, compactor_for
from store import SessionStore
from store.cli.verify import verify_session
from store.formats.crypto import LocalKeyFile, create_keyring



def msg(eid: str, parent: str | None, text: str = "x") -> dict[str, Any]:
    return {
        "type": "message", "id": eid, "parentId": parent, "timestamp": "2026-11-26T10:00:00.000Z",
        "message": {"role": "user", "content": text},
    }


def ids(store: SessionStore, sid: str) -> list[str]:
    return [str(e["id"]) for e in store.load_session_entries(sid)]


def from_objects(make_store: Callable[..., SessionStore], **options: Any) -> SessionStore:
    """A store on the same bucket with Redis state of its own: what it reads is rebuilt from
    the objects alone (Redis's caches, such as the recent segments, cannot hide a loss)."""
    return make_store(redis_prefix=f"fresh-{uuid.uuid4().hex[:8]}", **options)


@pytest.fixture
def keyring(tmp_path: Path) -> Path:
    path = tmp_path / "keyring.json"
    create_keyring(path)
    return path


@pytest.mark.parametrize("point", ["delete.after_header", "delete.before_objects"])
def test_a_paused_delete_never_removes_the_next_life_of_the_session(
    make_store: Callable[..., SessionStore], point: str
) -> None:
    """The deleter removes the header, then pauses (before it lists the session's objects, or
    after it listed them and before it deletes them). Meanwhile the session is created again
    and written to, and those appends are acknowledged. When the deleter carries on, the new
    life keeps every entry."""
    pause = Pause(point)
    deleter = make_store(fault_hook=pause)
    other = make_store()
    other.create_session("again")
    other.append_session_entries("again", [msg("old1", None), msg("old2", "old1")])
    old_inc = other.get_header("again").incarnation
    deleting = InThread(lambda: deleter.delete_session("again"))
    pause.wait_paused()
    new_inc = other.create_session("again").header.incarnation
    other.append_session_entries("again", [msg("new1", None)])
    other.append_session_entries("again", [msg("new2", "new1")])
    assert ids(other, "again") == ["new1", "new2"]
    pause.release()
    deleting.result()
    for seq in (1, 2):
        assert other.objects.head(other.layout.segment("again", new_inc, seq)) is not None
    assert ids(from_objects(make_store), "again") == ["new1", "new2"]
    other.append_session_entries("again", [msg("new3", "new2")])
    assert ids(from_objects(make_store), "again") == ["new1", "new2", "new3"]
    # The deleted life is gone (its objects, whatever GC would do with leftovers).
    assert not list(other.objects.list(other.layout.incarnation_prefix("again", old_inc)))


def _delete_paused_before_the_header(make: Callable[..., SessionStore], fresh: Callable[[], SessionStore]) -> None:
    """The deleter read life 1's header and paused before deleting it (or its delete landed
    and its answer was lost: the resend comes after the pause). Meanwhile another process
    deleted life 1 and created life 2, whose appends were acknowledged. When the deleter
    carries on, the header it deletes is only the one it read: life 2 keeps its header and
    every entry, read from the objects alone."""
    pause = Pause("delete.before_header")
    deleter = make(fault_hook=pause)
    other = make()
    other.create_session("twice")
    other.append_session_entries("twice", [msg("old1", None)])
    old_inc = other.get_header("twice").incarnation
    deleting = InThread(lambda: deleter.delete_session("twice"))
    pause.wait_paused()
    other.delete_session("twice")
    new_inc = other.create_session("twice").header.incarnation
    other.append_session_entries("twice", [msg("new1", None)])
    other.append_session_entries("twice", [msg("new2", "new1")])
    pause.release()
    deleting.result()  # no error: life 1 is deleted, as the caller asked
    assert other.objects.head(other.layout.header("twice")) is not None
    reader = fresh()
    assert reader.get_header("twice").incarnation == new_inc
    assert ids(reader, "twice") == ["new1", "new2"]
    other.append_session_entries("twice", [msg("new3", "new2")])
    assert ids(fresh(), "twice") == ["new1", "new2", "new3"]
    assert not list(other.objects.list(other.layout.incarnation_prefix("twice", old_inc)))
    # And the deleter deletes life 2 when asked (its cached header is not the one it deletes).
    deleter.delete_session("twice")
    assert other.objects.head(other.layout.header("twice")) is None


def test_a_delete_paused_before_the_header_never_deletes_the_next_lifes_header(
    make_store: Callable[..., SessionStore]
) -> None:
    _delete_paused_before_the_header(make_store, lambda: from_objects(make_store))


def test_a_delete_paused_before_the_header_on_the_file_backend(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    """The same on the embedded default's backend (its conditional delete is an exclusive
    lock of the directory against every create's link)."""
    from coordination.redis import Coordinator
    from store import StoreOptions
    from store.backends.objects import FileObjectStore

    made: list[SessionStore] = []

    def make(redis_prefix: str = redis_prefix, **options: Any) -> SessionStore:
        coord = Coordinator.from_url(redis_url, prefix=redis_prefix)
        store = SessionStore(
            FileObjectStore(tmp_path / "objects"), coord,
            options=StoreOptions(redis_prefix=redis_prefix, **options),
        )
        made.append(store)
        return store

    try:
        _delete_paused_before_the_header(make, lambda: make(redis_prefix=f"fresh-{uuid.uuid4().hex[:8]}"))
    finally:
        for store in made:
            store.close()


def _paused_create(make_store: Callable[..., SessionStore], keyring: Path, sid: str) -> tuple[Pause, InThread, SessionStore]:
    """An encrypted create stopped after its data key and before its header."""
    pause = Pause("create.before_header")
    creator = make_store(key_provider=LocalKeyFile(keyring), fault_hook=pause)
    creating = InThread(lambda: creator.create_session(sid))
    pause.wait_paused()
    return pause, creating, creator


def test_gc_paused_after_deciding_a_headerless_incarnation_is_abandoned_never_removes_a_live_key(
    make_store: Callable[..., SessionStore], keyring: Path
) -> None:
    """GC decides an incarnation with a data key and no header was abandoned (a grace period
    after it first saw it), fences it, reads the header (none), and pauses before its deletes.
    The creator then writes its header: it finds the fence and withdraws that incarnation,
    creating the session again. When GC carries on, it removes only the withdrawn one: the
    session the creator returned is whole, read from the objects alone."""
    create_pause, creating, creator = _paused_create(make_store, keyring, "born")
    (first_inc,) = {
        p.incarnation for i in creator.objects.list(creator.layout.session_prefix("born"))
        if (p := creator.layout.parse(i.key)) is not None and p.kind == "key"
    }
    clock = FakeClock()
    gc_pause = Pause("gc.before_delete", lambda ctx: ctx["kind"] == "stale_incarnation")
    gc = compactor_for(make_store(), clock, fault_hook=gc_pause)
    assert gc.gc_session("born").deleted == ()  # first seen: the grace starts
    clock.advance(GRACE_MS)
    collecting = InThread(lambda: gc.gc_session("born"))
    gc_pause.wait_paused()
    assert creator.objects.head(creator.layout.withdrawn("born", first_inc)) is not None
    create_pause.release()
    handle = creating.result()
    creator.append_session_entries("born", [msg("b1", None, "secret")])
    gc_pause.release()
    result = collecting.result()
    assert result.count("stale_incarnation") == 1  # the first life's key record
    reader = from_objects(make_store, key_provider=LocalKeyFile(keyring))
    assert ids(reader, "born") == ["b1"]
    creator.append_session_entries("born", [msg("b2", "b1")])
    assert ids(from_objects(make_store, key_provider=LocalKeyFile(keyring)), "born") == ["b1", "b2"]
    assert not list(creator.objects.list(creator.layout.incarnation_prefix("born", first_inc)))
    assert handle.header.incarnation != first_inc  # withdrawn, and created again


def test_gc_paused_before_its_fence_while_the_creator_acknowledges_removes_nothing(
    make_store: Callable[..., SessionStore], keyring: Path
) -> None:
    """The other order: GC read "no header" and pauses before its fence; the creator writes
    its header, finds no fence and its key, and acknowledges. GC's fence then comes after the
    header, and its second header read sees the incarnation: nothing is deleted, and the
    stray fence changes nothing for readers, writers, compaction or later GC."""
    create_pause, creating, creator = _paused_create(make_store, keyring, "twice")
    clock = FakeClock()
    gc_pause = Pause("gc.before_fence")
    gc = compactor_for(make_store(key_provider=LocalKeyFile(keyring)), clock, fault_hook=gc_pause)
    assert gc.gc_session("twice").deleted == ()
    clock.advance(GRACE_MS)
    collecting = InThread(lambda: gc.gc_session("twice"))
    gc_pause.wait_paused()
    create_pause.release()
    handle = creating.result()
    inc = handle.header.incarnation
    creator.append_session_entries("twice", [msg("t1", None, "secret")])
    gc_pause.release()
    assert collecting.result().deleted == ()
    assert creator.objects.head(creator.layout.withdrawn("twice", inc)) is not None  # the stray fence
    creator.append_session_entries("twice", [msg("t2", "t1")])
    gc.compact_session("twice")
    clock.advance(10 * GRACE_MS)
    gc.gc_session("twice")
    assert ids(from_objects(make_store, key_provider=LocalKeyFile(keyring)), "twice") == ["t1", "t2"]
    check = verify_session(make_store(key_provider=LocalKeyFile(keyring)), "twice")
    assert (check.faults, check.warnings) == ([], [])
    creator.delete_session("twice")
    assert not list(creator.objects.list(creator.layout.session_prefix("twice")))


def test_an_erasure_removes_every_earlier_life_and_never_a_life_being_created(
    make_store: Callable[..., SessionStore], keyring: Path
) -> None:
    """Erasing a session removes its life and what earlier lives left (an interrupted
    delete's segments); erasing an id with no header removes the leftovers too. A create of
    that id paused between its data key and its header while the erasure runs is fenced and
    its key removed: it withdraws and creates the session again, which is readable."""
    from compactor.erasure import erase_sessions

    store = make_store(key_provider=LocalKeyFile(keyring))
    store.create_session("gone")
    store.append_session_entries("gone", [msg("g1", None)])
    earlier = uuid.uuid4().hex
    leftovers = [store.layout.segment("gone", earlier, n) for n in (1, 2)]
    for key in leftovers:
        store.objects.put_if_absent(key, b'{"id":"x"}\n')
    (erased,) = erase_sessions(store, ["gone"])
    assert erased.action == "deleted"
    assert not list(store.objects.list(store.layout.session_prefix("gone")))

    create_pause, creating, creator = _paused_create(make_store, keyring, "erased")
    (result,) = erase_sessions(store, ["erased"])  # no header yet: the key is a leftover
    assert result.action == "deleted"
    create_pause.release()
    handle = creating.result()
    creator.append_session_entries("erased", [msg("e1", None)])
    assert ids(from_objects(make_store, key_provider=LocalKeyFile(keyring)), "erased") == ["e1"]
    listed = [i.key for i in creator.objects.list(creator.layout.session_prefix("erased"))]
    assert all(handle.header.incarnation in k or k.endswith("header.json") for k in listed)
