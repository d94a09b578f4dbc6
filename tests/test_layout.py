"""The object layout (store/formats/layout.py) and the store's layout record (store/protocol/layout_record.py),
against the real servers: a new store spreads its sessions over shards; a store written in the
flat layout before the record existed keeps it (read, write, list, compact, GC); the record,
never what a process listed, decides; listing and the sweep walk the shards exactly once, one
LIST a page."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from compactor.schedule import GcScheduler
from compactor import WorkerOptions
from harness.pausing import FakeClock
from store import SessionStore
from store.errors import CorruptObjectError, InvalidInputError, SessionNotFoundError
from store.protocol.headers import uuid7
from store.formats.layout import LAYOUT_FLAT, LAYOUT_SPREAD, SHARDS, Layout, shard_of
from store.protocol.layout_record import record_body
from test_compactor import GRACE_MS, compactor_for, fill, keys_of, reachable, view


def entry(eid: str, parent: str | None, text: str = "") -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent, "timestamp": "2026-01-01T00:00:00.000Z",
            "message": {"role": "user", "content": text or eid}}


def record_of(store: SessionStore) -> dict[str, Any] | None:
    try:
        return json.loads(store.objects.get(store.layout.record).data)
    except Exception:
        return None


# --- the hash and the names ------------------------------------------------------------------



def walk(store: SessionStore, limit: int) -> tuple[list[str], int]:
    """Every page of the listing: the session ids in order, and how many pages."""
    cursor, pages, seen = None, 0, []
    while True:
        page = store.list_sessions(cursor=cursor, limit=limit)
        pages += 1
        seen += [i.session_id for i in page.items]
        if page.next_cursor is None:
            return seen, pages
        cursor = page.next_cursor

def test_the_shard_is_fixed_by_the_format_not_by_the_process() -> None:
    # blake2b(digest_size=1) of the UTF-8 id, in hex: these values may never change, or a
    # store written by one version would be unreadable by the next.
    assert (shard_of("abc"), shard_of("session-1"), shard_of("0192f0c1-7a3e-7000-8000-000000000000")) == ("6b", "26", "e6")
    assert SHARDS == 256
    spread = Layout("p", LAYOUT_SPREAD)
    assert spread.header("abc") == "p/sessions/6b=abc/header.json"
    assert spread.stream_ref("abc", "i1", "f") == "p/streams/refs/6b=abc/i1/f"
    assert spread.parse("p/sessions/6b=abc/i1/seg/0000000000000003.jsonl").number == 3  # type: ignore[union-attr]
    assert spread.sid_of_dir("6b=abc") == "abc"
    # The other layout's directory, a wrong shard, no shard: not this layout's, never parsed
    # (so GC never deletes them).
    for name in ("abc", "00=abc", "6b=", "6B=abc", "6b=a/b"):
        assert spread.sid_of_dir(name) is None, name
    assert spread.parse("p/sessions/abc/header.json") is None
    flat = Layout("p", LAYOUT_FLAT)
    # The flat layout is exactly the keys written before layouts existed.
    assert flat.segment("abc", "i1", 2) == "p/sessions/abc/i1/seg/0000000000000002.jsonl"
    assert flat.sid_of_dir("6b=abc") is None and flat.parse("p/sessions/6b=abc/header.json") is None
    with pytest.raises(InvalidInputError):
        Layout("p", 3)


# --- a new store -----------------------------------------------------------------------------


def test_a_new_store_records_the_spread_layout_and_its_sessions_spread(store: SessionStore) -> None:
    assert store.layout.version == LAYOUT_SPREAD
    assert store.layout.stream_key is not None and len(store.layout.stream_key) == 32
    assert record_of(store) == json.loads(record_body(LAYOUT_SPREAD, store.layout.stream_key))
    sids = [store.create_session().session_id for _ in range(200)]  # UUIDv7: time-ordered
    assert sids == sorted(sids)
    names = list(store.objects.list_dirs(store.layout.sessions_prefix))
    assert sorted(store.layout.sid_of_dir(n) for n in names) == sorted(sids)  # type: ignore[type-var]
    shards = {n.split("=", 1)[0] for n in names}
    # 200 ids over 256 shards: about 139 distinct ones are expected; fewer than 100 has a
    # probability far below 1e-12 for a uniform hash.
    assert len(shards) >= 100, sorted(shards)
    sid = sids[0]
    store.append_session_entries(sid, [entry("a", None)])
    assert keys_of(store, sid) and all(
        k.startswith(f"{store.layout.sessions_prefix}{shard_of(sid)}={sid}/") for k in keys_of(store, sid)
    )


def test_processes_starting_together_on_a_new_store_agree(make_store: Callable[..., SessionStore]) -> None:
    stores: list[SessionStore] = []
    lock = threading.Lock()

    def start() -> None:
        s = make_store()
        with lock:
            stores.append(s)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(stores) == 6 and {s.layout.version for s in stores} == {LAYOUT_SPREAD}
    stores[0].create_session("shared")
    assert all(s.get_header("shared").session_id == "shared" for s in stores)


# --- a store written before the record existed -----------------------------------------------


def test_a_flat_store_stays_flat_for_reads_writes_listing_compaction_and_gc(
    make_store: Callable[..., SessionStore],
) -> None:
    old = make_store(layout=LAYOUT_FLAT)  # writes as versions before the record did
    for sid in ("o1", "o2", "o3"):
        old.create_session(sid)
        fill(old, sid, 3, tag=sid)
    assert record_of(old) is None  # a forced layout writes no record
    prefix = old.layout.prefix
    assert old.objects.head(f"{prefix}sessions/o1/header.json") is not None  # the old keys, verbatim
    before = view(old, "o1")

    new = make_store()  # default options: the store's own layout
    assert new.layout.version == LAYOUT_FLAT
    assert record_of(new) == json.loads(record_body(LAYOUT_FLAT))  # recorded: decided for good
    assert new.layout.stream_key is None  # it held sessions: its stream ids stay unkeyed
    assert view(new, "o1") == before
    fill(new, "o1", 2, tag="more")
    new.create_session("o4")
    new.append_session_entries("o4", [entry("x", None)])
    assert new.objects.head(f"{prefix}sessions/o4/header.json") is not None
    assert old.load_session_entries("o4") == [entry("x", None)]  # one layout for both
    seen, pages = walk(new, 2)
    assert seen == ["o1", "o2", "o3", "o4"] and pages in (2, 3)  # the last page may be empty
    # Compaction and GC of the flat layout (by schedule lost, then the sweep).
    clock = FakeClock()
    clock.ms = int(time.time() * 1000)
    assert compactor_for(new, clock).compact_session("o2").outcome == "compacted"
    new.coord.purge()
    clock.advance(GRACE_MS)
    swept = GcScheduler(compactor_for(new, clock), WorkerOptions(sweep_rate=0.0)).sweep()
    assert swept is not None and swept.sessions == 4 and swept.count("segment") == 3
    assert keys_of(new, "o2") == reachable(new, "o2")
    assert all(k.startswith(f"{prefix}sessions/o2/") for k in keys_of(new, "o2"))


def test_the_record_decides_not_what_a_process_listed(make_store: Callable[..., SessionStore]) -> None:
    """A process that listed a flat session (proposing the flat layout) and paused before
    its create of the record, while another recorded the spread layout (the store was empty
    for it: every session deleted meanwhile), uses the spread layout: its own create fails,
    and it reads the record back."""
    old = make_store(layout=LAYOUT_FLAT)
    old.create_session("left")
    # The other process's record, created first.
    old.objects.put_if_absent(old.layout.record, record_body(LAYOUT_SPREAD))
    late = make_store()
    assert late.layout.version == LAYOUT_SPREAD
    with pytest.raises(SessionNotFoundError):
        late.get_header("left")  # a flat directory is not this layout's: invisible, untouched
    assert [i.session_id for i in late.list_sessions().items] == []
    late.create_session("new")
    assert [i.session_id for i in late.list_sessions().items] == ["new"]
    assert old.get_header("left").session_id == "left"


def test_a_record_that_is_not_one_is_a_typed_error(make_store: Callable[..., SessionStore]) -> None:
    first = make_store(layout=LAYOUT_FLAT)
    first.objects.put_if_absent(first.layout.record, b'{"layout": 9}\n')
    with pytest.raises(CorruptObjectError):
        make_store()


def test_a_stream_key_that_is_not_one_is_a_typed_error(make_store: Callable[..., SessionStore]) -> None:
    first = make_store(layout=LAYOUT_FLAT)
    first.objects.put_if_absent(first.layout.record, b'{"layout": 2, "stream_key": "abc"}\n')
    with pytest.raises(CorruptObjectError, match="stream_key"):
        make_store()


# --- stream ids ------------------------------------------------------------------------------


def test_a_new_store_keys_its_stream_ids_and_every_process_uses_the_same_key(
    make_store: Callable[..., SessionStore],
) -> None:
    """A name that is not a session id (every tenant's: ``tenant/name``) is kept under a
    blake2b keyed with the store's record's key: the id a client may see says nothing to
    someone without the record, and a second process finds the stream under the same id."""
    from store.formats.layout import stream_session_id
    from store.streams import START, Streams

    first, second = make_store(), make_store()
    key = first.layout.stream_key
    assert key is not None and second.layout.stream_key == key
    Streams(first).create("acme/notes", content_type="application/json", msgs=[{"n": 1}])
    sid = first.layout.stream_id("acme/notes")
    assert sid == stream_session_id("acme/notes", key) and sid.startswith("ds.")
    assert sid != stream_session_id("acme/notes")  # not the hash anyone can compute
    assert sid != stream_session_id("acme/notes", bytes(32))
    first.get_header(sid)
    assert Streams(second).read("acme/notes", START).messages == [{"n": 1}]
    # A name that is a session id is its own id, keyed or not (every session is a stream).
    assert first.layout.stream_id("plain-name") == "plain-name"


def test_a_store_recorded_before_keys_keeps_its_unkeyed_stream_ids(
    make_store: Callable[..., SessionStore],
) -> None:
    """A record without ``stream_key`` (every store recorded before keys existed) means
    the unkeyed hash for ever: its streams stay where they were written. A store that held
    sessions when its record was created gets no key either."""
    from store.formats.layout import stream_session_id
    from store.streams import START, Streams

    old = make_store(layout=LAYOUT_SPREAD)  # a forced layout: unkeyed, no record
    assert old.layout.stream_key is None
    Streams(old).create("acme/old", content_type="application/json", msgs=["kept"])
    assert old.layout.stream_id("acme/old") == stream_session_id("acme/old")
    reopened = make_store()  # records the layout of the directory it finds, without a key
    assert reopened.layout.version == LAYOUT_SPREAD and reopened.layout.stream_key is None
    assert record_of(reopened) == json.loads(record_body(LAYOUT_SPREAD))
    assert Streams(reopened).read("acme/old", START).messages == ["kept"]


# --- listing and the sweep walk the shards ---------------------------------------------------


@pytest.mark.every_backend
def test_listing_walks_the_shards_in_order_exactly_once_one_list_a_page(store: SessionStore) -> None:
    sids = [uuid7() for _ in range(40)]
    for sid in sids:
        store.create_session(sid)
    order = sorted(sids, key=store.layout.dir_name)  # (shard, id)
    store.objects.requests.clear()
    cursor, pages, seen = None, 0, []
    created: list[str] = []
    doomed = set(order[5::7])
    while True:
        page = store.list_sessions(cursor=cursor, limit=6)
        pages += 1
        seen += [i.session_id for i in page.items]
        # Between pages: creates (in shards listed already and not yet) and deletes.
        for _ in range(2):
            created.append(store.create_session().session_id)
        for sid in sorted(doomed)[:pages]:
            try:
                store.delete_session(sid)
            except SessionNotFoundError:
                pass
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert len(seen) == len(set(seen)), "a session was listed twice"
    assert set(order) - doomed <= set(seen) <= set(sids) | set(created)
    # Each page continues across shards; in order (shard, id) throughout.
    keys = [store.layout.dir_name(s) for s in seen]
    assert keys == sorted(keys)
    # Quiet now: exactly one LIST a page and no GET (summaries from Redis).
    store.objects.requests.clear()
    total = len(list(store.objects.list_dirs(store.layout.sessions_prefix)))
    store.objects.requests.clear()
    seen, pages = walk(store, 7)
    assert len(seen) == total == len(set(seen))
    # No GET but for the deleted sessions' directories SeaweedFS still lists for a while
    # (emptied just now): the listing reads their header to learn they are gone.
    assert store.objects.requests["list"] == pages and store.objects.requests["get"] <= len(doomed)
    assert pages in (-(-total // 7), -(-total // 7) + 1)  # the last may be empty


def test_filters_and_a_tenants_names_on_the_spread_layout(store: SessionStore) -> None:
    for i in range(30):
        store.create_session(f"acme.s{i:02d}" if i % 3 else f"beta.s{i:02d}", cwd=f"/t/{i % 2}")
    acme = {i.session_id for i in store.iter_sessions(page_size=4) if i.session_id.startswith("acme.")}
    assert acme == {f"acme.s{i:02d}" for i in range(30) if i % 3}
    odd = {i.session_id for i in store.iter_sessions(page_size=4, cwd_prefix="/t/1")}
    assert odd == {s for s in (f"acme.s{i:02d}" if i % 3 else f"beta.s{i:02d}" for i in range(30))
                   if int(s[-2:]) % 2}


def test_the_sweep_finds_an_orphan_in_the_spread_layout(store: SessionStore) -> None:
    clock = FakeClock()
    clock.ms = int(time.time() * 1000)
    sids = [uuid7() for _ in range(12)]
    for sid in sids:
        store.create_session(sid)
    victim = sids[7]
    # A zombie: a segment a writer of an ended incarnation put after the session was created
    # again (store/formats/layout.py, incarnations). Nothing schedules its GC: only the sweep finds it.
    zombie = store.layout.segment(victim, "ended0inc", 1)
    store.objects.put_if_absent(zombie, b"{}\n")
    assert zombie.startswith(f"{store.layout.sessions_prefix}{shard_of(victim)}={victim}/")
    clock.ms = int(time.time() * 1000) + GRACE_MS  # a grace period after the header's create
    swept = GcScheduler(compactor_for(store, clock), WorkerOptions(sweep_rate=0.0)).sweep()
    assert swept is not None and swept.sessions == 12
    assert [k for _, k in swept.deleted] == [zombie]
    assert store.objects.head(zombie) is None
    assert all(store.get_header(s).session_id == s for s in sids)
