"""The public API of the core store, against the S3 server over HTTP and a real Redis."""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest

from store import EMPTY_TAIL, SessionStore
from store.errors import (
    BatchTooLargeError,
    ConflictError,
    CorruptObjectError,
    IdCollisionError,
    InvalidEntryError,
    InvalidSessionIdError,
    SessionExistsError,
    SessionNotFoundError,
    UnknownParentError,
)


def entry(eid: str, parent: str | None, text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {
        "type": "message",
        "id": eid,
        "parentId": parent,
        "timestamp": "2026-11-22T10:00:00.000Z",
        "message": {"role": "user", "content": text, "timestamp": 1},
        **extra,
    }


def snapshot(store: SessionStore) -> tuple[dict[str, bytes], dict[bytes, Any]]:
    """Every object (key -> bytes) and every Redis key of this store (key -> value)."""
    objects = {i.key: store.objects.get(i.key).data for i in store.objects.list(store.layout.prefix)}
    client = store.coord.client
    values: dict[bytes, Any] = {}
    for key in client.scan_iter(match=f"{store.coord.keys.prefix}:*"):
        if key.endswith(b":claim"):
            continue  # the last writer's advisory claim lapses by itself after its lease
        kind = client.type(key)
        if kind == b"hash":
            values[key] = client.hgetall(key)
        elif kind == b"zset":
            values[key] = client.zrange(key, 0, -1, withscores=True)
        elif kind == b"string":
            values[key] = client.get(key)
        else:
            values[key] = kind
    return objects, values


def test_create_append_load_roundtrip(store: SessionStore) -> None:
    handle = store.create_session("s-1", cwd="/work")
    assert handle.session_id == "s-1"
    assert handle.header.pi_header["cwd"] == "/work"
    r1 = store.append_session_entries("s-1", [entry("a", None), entry("b", "a")])
    assert (r1.session_id, r1.seq, r1.last_appended_entry_id, r1.appended_count) == ("s-1", 1, "b", 2)
    r2 = store.append_session_entries("s-1", [entry("c", "b")])
    assert (r2.seq, r2.last_appended_entry_id, r2.appended_count) == (2, "c", 1)
    assert [e["id"] for e in store.load_session_entries("s-1")] == ["a", "b", "c"]
    assert store.load_session_entries("s-1")[0] == entry("a", None)
    tail = store.get_tail("s-1")
    assert (tail.seq, tail.last_entry_id, tail.entry_count) == (2, "c", 3)


def test_entries_keep_key_order_and_unicode(store: SessionStore) -> None:
    store.create_session("u")
    e = {"type": "custom", "customType": "x", "data": {"z": 1, "a": "é\u2028😀"}, "id": "1", "parentId": None}
    store.append_session_entries("u", [e])
    got = store.load_session_entries("u")[0]
    assert list(got) == list(e)
    assert got == e


def test_create_twice_refused_and_generated_ids(store: SessionStore) -> None:
    store.create_session("dup")
    with pytest.raises(SessionExistsError):
        store.create_session("dup")
    h = store.create_session()
    assert len(h.session_id) == 36 and h.session_id[14] == "7"  # a uuidv7


@pytest.mark.parametrize(
    "sid", ["", "..", "a/b", "-lead", ".hidden", "a..b", "x" * 129, "sp ace", "ü", None, 5]
)
def test_unsafe_session_ids_refused(store: SessionStore, sid: Any) -> None:
    before = snapshot(store)
    with pytest.raises(InvalidSessionIdError):
        store.create_session(sid) if sid is not None else store.append_session_entries(sid, [entry("a", None)])
    with pytest.raises(InvalidSessionIdError):
        store.append_session_entries(sid, [entry("a", None)])
    assert snapshot(store) == before


def test_expected_tail(store: SessionStore) -> None:
    store.create_session("t")
    store.append_session_entries("t", [entry("a", None)], EMPTY_TAIL)
    with pytest.raises(ConflictError) as err:
        store.append_session_entries("t", [entry("x", None)], EMPTY_TAIL)
    assert err.value.actual_tail_entry_id == "a" and err.value.actual_seq == 1
    store.append_session_entries("t", [entry("b", "a")], "a")
    with pytest.raises(ConflictError) as err:
        store.append_session_entries("t", [entry("c", "a")], "a")
    assert err.value.actual_tail_entry_id == "b"
    assert err.value.expected_tail_entry_id == "a"
    assert [e["id"] for e in store.load_session_entries("t")] == ["a", "b"]


def test_without_expected_tail_writers_branch_not_overwrite(store: SessionStore) -> None:
    store.create_session("br")
    store.append_session_entries("br", [entry("root", None)])
    store.append_session_entries("br", [entry("left", "root")])
    store.append_session_entries("br", [entry("right", "root")])
    entries = store.load_session_entries("br")
    assert [(e["id"], e["parentId"]) for e in entries] == [
        ("root", None),
        ("left", "root"),
        ("right", "root"),
    ]


def test_resend_returns_original_result(store: SessionStore) -> None:
    store.create_session("idem")
    first = store.append_session_entries("idem", [entry("a", None), entry("b", "a")])
    store.append_session_entries("idem", [entry("c", "b")])
    again = store.append_session_entries("idem", [entry("a", None), entry("b", "a")])
    assert again == first
    # Even with an expected tail that no longer holds: the batch is already there.
    assert store.append_session_entries("idem", [entry("a", None), entry("b", "a")], "zzz") == first
    # And after Redis forgot everything.
    store.coord.client.flushdb()
    assert store.append_session_entries("idem", [entry("a", None), entry("b", "a")]) == first
    assert [e["id"] for e in store.load_session_entries("idem")] == ["a", "b", "c"]


def test_id_collision(store: SessionStore) -> None:
    store.create_session("col")
    store.append_session_entries("col", [entry("a", None, "one")])
    before = snapshot(store)
    with pytest.raises(IdCollisionError) as err:
        store.append_session_entries("col", [entry("a", None, "two")])
    assert err.value.entry_id == "a"
    # Part of the batch already stored, part new: refused, not half-applied.
    with pytest.raises(IdCollisionError):
        store.append_session_entries("col", [entry("a", None, "one"), entry("n", "a")])
    assert snapshot(store) == before


def test_unknown_parent(store: SessionStore) -> None:
    store.create_session("up")
    store.append_session_entries("up", [entry("a", None)])
    before = snapshot(store)
    with pytest.raises(UnknownParentError) as err:
        store.append_session_entries("up", [entry("b", "a"), entry("c", "ghost")])
    assert (err.value.entry_id, err.value.parent_id) == ("c", "ghost")
    assert snapshot(store) == before


def test_append_to_missing_session(store: SessionStore) -> None:
    before = snapshot(store)
    with pytest.raises(SessionNotFoundError):
        store.append_session_entries("missing", [entry("a", None)])
    with pytest.raises(SessionNotFoundError):
        store.load_session_entries("missing")
    with pytest.raises(SessionNotFoundError):
        store.get_tail("missing")
    assert snapshot(store) == before


def _bad_batches() -> list[tuple[str, Callable[[], Any], type[Exception]]]:
    return [
        ("not a list", lambda: entry("a", None), InvalidEntryError),
        ("a string", lambda: "abc", InvalidEntryError),
        ("empty", lambda: [], InvalidEntryError),
        ("not an object", lambda: [["id", "a"]], InvalidEntryError),
        ("null entry", lambda: [None], InvalidEntryError),
        ("missing id", lambda: [{"type": "message", "parentId": None}], InvalidEntryError),
        ("int id", lambda: [{"type": "message", "id": 5, "parentId": None}], InvalidEntryError),
        ("empty id", lambda: [{"type": "message", "id": "", "parentId": None}], InvalidEntryError),
        ("missing type", lambda: [{"id": "a", "parentId": None}], InvalidEntryError),
        ("int type", lambda: [{"id": "a", "type": 3, "parentId": None}], InvalidEntryError),
        ("header type", lambda: [{"id": "a", "type": "session", "parentId": None}], InvalidEntryError),
        ("int parent", lambda: [{"id": "a", "type": "m", "parentId": 7}], InvalidEntryError),
        ("missing parentId", lambda: [{"id": "a", "type": "m"}], InvalidEntryError),
        ("duplicate ids", lambda: [entry("a", None), entry("a", None)], InvalidEntryError),
        ("self parent", lambda: [entry("a", "a")], InvalidEntryError),
        ("cycle in batch", lambda: [entry("a", "b"), entry("b", "a")], InvalidEntryError),
        ("NaN", lambda: [entry("a", None, x=math.nan)], InvalidEntryError),
        ("Infinity", lambda: [entry("a", None, x={"y": [math.inf]})], InvalidEntryError),
        # Lone surrogates are stored as pi writes them; a pair held as two code points is not
        # (every JSON parser would read it back as the one character).
        ("split surrogate pair", lambda: [entry("a", None, "\ud83d\ude00")], InvalidEntryError),
        ("split surrogate pair key", lambda: [{**entry("a", None), "\ud83d\ude00": 1}], InvalidEntryError),
        ("non-string key", lambda: [{**entry("a", None), 1: 1}], InvalidEntryError),
        ("not serialisable", lambda: [entry("a", None, x=object())], InvalidEntryError),
        ("too many entries", lambda: [entry(f"e{i}", None) for i in range(11)], BatchTooLargeError),
        ("too many bytes", lambda: [entry("a", None, "x" * 5000)], BatchTooLargeError),
        ("id too long", lambda: [entry("x" * 300, None)], InvalidEntryError),
    ]


@pytest.mark.parametrize("name,make,error", _bad_batches(), ids=[b[0] for b in _bad_batches()])
def test_bad_input_is_refused_and_changes_nothing(
    make_store: Callable[..., SessionStore], name: str, make: Callable[[], Any], error: type[Exception]
) -> None:
    store = make_store(max_batch_entries=10, max_batch_bytes=4096)
    store.create_session("bad")
    store.append_session_entries("bad", [entry("root", None)])
    before = snapshot(store)
    with pytest.raises(error):
        store.append_session_entries("bad", make())
    assert snapshot(store) == before


CORRUPT = [
    ("truncated", b'{"type":"m","id":"x","parentId":null}\n{"type":"m","id":"y"', 2),
    ("invalid utf-8", b'{"type":"m","id":"x","parentId":null,"t":"\xff"}\n', 1),
    ("bom", b'\xef\xbb\xbf{"type":"m","id":"x","parentId":null}\n', 1),
    ("nul", b'{"type":"m","id":"x","parentId":null}\n{"type":"m","id":"y","parentId":"x"}\x00\n', 2),
    ("duplicate keys", b'{"type":"m","id":"x","id":"z","parentId":null}\n', 1),
    ("not an object", b'{"type":"m","id":"x","parentId":null}\n[1,2]\n', 2),
    ("empty line", b'{"type":"m","id":"x","parentId":null}\n\n', 2),
    ("no id", b'{"type":"m","parentId":null}\n', 1),
    ("spaces", b'{"type": "m", "id": "x", "parentId": null}\n', 1),
]


@pytest.mark.parametrize("name,data,line", CORRUPT, ids=[c[0] for c in CORRUPT])
def test_corrupt_segment_is_reported_with_key_and_line(
    store: SessionStore, name: str, data: bytes, line: int
) -> None:
    h = store.create_session("cor")
    store.append_session_entries("cor", [entry("a", None)])
    key = store.layout.segment("cor", h.header.incarnation, 2)
    store.objects.put_if_absent(key, data)
    with pytest.raises(CorruptObjectError) as err:
        store.load_session_entries("cor")
    assert err.value.key == key
    assert err.value.line == line


def test_altered_segment_fails_its_checksum(store: SessionStore) -> None:
    h = store.create_session("sum")
    store.append_session_entries("sum", [entry("a", None)])
    good = store.objects.get(store.layout.segment("sum", h.header.incarnation, 1))
    key = store.layout.segment("sum", h.header.incarnation, 2)
    # Valid, canonical JSON, but not the bytes the writer's checksum covers.
    store.objects.put_if_absent(key, b'{"type":"m","id":"b","parentId":"a"}\n', dict(good.metadata))
    with pytest.raises(CorruptObjectError) as err:
        store.load_session_entries("sum")
    assert err.value.key == key and "checksum" in err.value.reason


class Crash(Exception):
    pass


def _a_then_b_left_uncommitted(make_store: Callable[..., SessionStore], sid: str) -> SessionStore:
    """Session ``sid`` holds a (committed) and b, whose writer died after its PUT and before
    its COMMIT: Redis says seq 1, the object store holds seq 2. A healthy store on it."""

    def crash_after_put(point: str, ctx: dict[str, Any]) -> None:
        if point == "append.after_put":
            raise Crash()

    crashing = make_store(fault_hook=crash_after_put)
    healthy = make_store()
    crashing.create_session(sid)
    healthy.append_session_entries(sid, [entry("a", None)])
    with pytest.raises(Crash):
        crashing.append_session_entries(sid, [entry("b", "a")])
    assert healthy.coord.tail(sid).seq == 1  # type: ignore[union-attr]
    return healthy


def test_segment_redis_never_heard_of_is_read_and_rolled_forward(make_store: Callable[..., SessionStore]) -> None:
    healthy = _a_then_b_left_uncommitted(make_store, "rf")
    assert [e["id"] for e in healthy.load_session_entries("rf")] == ["a", "b"]
    tail = healthy.get_tail("rf")
    assert (tail.seq, tail.last_entry_id) == (2, "b")
    # The next writer is not fooled either: it lands at 3, and b is its parent.
    r = healthy.append_session_entries("rf", [entry("c", "b")], "b")
    assert r.seq == 3


def test_an_expected_tail_redis_never_heard_of_is_rolled_forward_not_refused(
    make_store: Callable[..., SessionStore],
) -> None:
    """A writer died between PUT and COMMIT; a reader saw its segment (the read path probes)
    and appends after it. The conflict CHECK answers is Redis lagging, not another writer:
    the append rolls the segment forward and lands, here and at every later attempt (before,
    each attempt conflicted until something else probed the tail)."""
    healthy = _a_then_b_left_uncommitted(make_store, "lag")
    assert [e["id"] for e in healthy.load_session_entries("lag")] == ["a", "b"]
    assert healthy.coord.tail("lag").seq == 1  # type: ignore[union-attr]
    r = healthy.append_session_entries("lag", [entry("c", "b")], "b")
    assert r.seq == 3
    # A real conflict is still one: the tail is c, not b.
    with pytest.raises(ConflictError):
        healthy.append_session_entries("lag", [entry("d", "b")], "b")
    assert [e["id"] for e in healthy.load_session_entries("lag")] == ["a", "b", "c"]


def test_delete_then_recreate_starts_clean(store: SessionStore) -> None:
    store.create_session("del")
    store.append_session_entries("del", [entry("a", None)])
    store.append_session_entries("del", [entry("b", "a")])
    store.delete_session("del")
    assert store.objects.head(store.layout.header("del")) is None
    assert list(store.objects.list(store.layout.session_prefix("del"))) == []
    assert store.coord.tail("del") is None
    assert "del" not in [s.session_id for s in store.iter_sessions()]
    with pytest.raises(SessionNotFoundError):
        store.load_session_entries("del")
    store.create_session("del")
    assert store.get_tail("del").seq == 0
    r = store.append_session_entries("del", [entry("a", None, "new life")], EMPTY_TAIL)
    assert r.seq == 1
    assert store.load_session_entries("del") == [entry("a", None, "new life")]


def test_list_sessions(store: SessionStore) -> None:
    for sid in ["l1", "l2", "l3"]:
        store.create_session(sid, cwd=f"/{sid}")
    store.append_session_entries("l2", [entry("a", None)])
    infos = {s.session_id: s for s in store.list_sessions().items}
    assert set(infos) == {"l1", "l2", "l3"}
    assert infos["l2"].cwd == "/l2"
    assert infos["l2"].updated_at_ms is not None
    assert infos["l2"].entry_count == 1
    # The object store is the truth: the list survives Redis forgetting everything.
    store.coord.client.flushdb()
    assert {s.session_id for s in store.list_sessions().items} == {"l1", "l2", "l3"}


def test_large_batch_and_many_segments(store: SessionStore) -> None:
    store.create_session("big")
    batch = [entry("e0", None)] + [entry(f"e{i}", f"e{i-1}", "x" * 100) for i in range(1, 2000)]
    store.append_session_entries("big", batch)
    prev = "e1999"
    for i in range(30):
        store.append_session_entries("big", [entry(f"s{i}", prev)])
        prev = f"s{i}"
    got = store.load_session_entries("big")
    assert len(got) == 2030 and got[-1]["id"] == "s29"
    store.coord.client.flushdb()
    assert store.get_tail("big").entry_count == 2030


def test_store_refuses_a_backend_that_ignores_conditional_writes(redis_url: str, redis_prefix: str) -> None:
    from coordination.redis import Coordinator
    from store.errors import ConditionalWritesUnsupportedError
    from test_objects import LyingObjectStore

    coord = Coordinator.from_url(redis_url, prefix=redis_prefix)
    with pytest.raises(ConditionalWritesUnsupportedError):
        SessionStore(LyingObjectStore(), coord)
    # The user may accept the risk explicitly.
    from store import StoreOptions

    unsafe = SessionStore(LyingObjectStore(), coord, options=StoreOptions(redis_prefix=redis_prefix, allow_unsafe_backend=True))
    unsafe.create_session("risky")
    assert unsafe.append_session_entries("risky", [entry("a", None)]).seq == 1
    unsafe.close()


def test_store_refuses_a_backend_without_conditional_deletes(redis_url: str, redis_prefix: str) -> None:
    """A backend that ignores If-Match on a delete (or has no conditional delete) is refused
    like one that ignores If-None-Match; accepted explicitly, its deletes are unconditional."""
    from coordination.redis import Coordinator
    from store import StoreOptions
    from store.errors import ConditionalWritesUnsupportedError, SessionNotFoundError
    from test_objects import IgnoresDeleteConditions, NoConditionalDeletes

    coord = Coordinator.from_url(redis_url, prefix=redis_prefix)
    for backend in (IgnoresDeleteConditions, NoConditionalDeletes):
        with pytest.raises(ConditionalWritesUnsupportedError, match="conditional delete"):
            SessionStore(backend(), coord)
    unsafe = SessionStore(
        NoConditionalDeletes(), coord, options=StoreOptions(redis_prefix=redis_prefix, allow_unsafe_backend=True)
    )
    unsafe.create_session("risky")
    unsafe.append_session_entries("risky", [entry("a", None)])
    unsafe.delete_session("risky")
    with pytest.raises(SessionNotFoundError):
        unsafe.get_header("risky")
    assert list(unsafe.objects.list(unsafe.layout.session_prefix("risky"))) == []
    unsafe.close()


@pytest.mark.parametrize(
    "bad",
    [
        {"type": "message", "id": "m", "parentId": None, "message": None},
        {"type": "message", "id": "m", "parentId": None},
        {"type": "session_info", "id": "i", "parentId": None, "name": ["x"]},
        {"type": "redaction", "id": "r", "parentId": None, "targetId": "", "reason": "x"},
    ],
    ids=["null message", "no message", "name not string", "redaction target"],
)
def test_entries_the_session_model_cannot_read_are_refused(store: SessionStore, bad: dict[str, Any]) -> None:
    store.create_session("pi")
    store.append_session_entries("pi", [entry("a", None)])
    before = snapshot(store)
    with pytest.raises(InvalidEntryError):
        store.append_session_entries("pi", [bad])
    assert snapshot(store) == before
    store.load_session("pi").build_context()  # still readable


def test_purge_removes_only_its_own_prefix(make_store: Callable[..., SessionStore], redis_prefix: str) -> None:
    mine = make_store(redis_prefix=redis_prefix + "-a")
    other = make_store(redis_prefix=redis_prefix + "-b")
    for s, sid in ((mine, "p"), (other, "q")):
        s.create_session(sid)
        s.append_session_entries(sid, [entry("a", None)])
    assert mine.coord.purge() >= 3  # tail, ids, session index
    assert mine.coord.tail("p") is None
    assert other.coord.tail("q") is not None
    # Nothing durable lived there: the session reads back whole.
    assert mine.load_session_entries("p") == [entry("a", None)]


@pytest.mark.every_backend
@pytest.mark.empty_prefix
def test_the_conditional_write_probe_runs_once_per_store_and_backend(
    s3_url: str, redis_url: str, redis_prefix: str
) -> None:
    from coordination.redis import Coordinator
    from store.errors import ConditionalWritesUnsupportedError
    from test_objects import LyingObjectStore

    first = SessionStore.from_url(s3_url, redis_url, redis_prefix=redis_prefix)
    probe = first.layout.probe_prefix
    assert first.objects.requests["put"] >= 2  # the probe, then its verdict
    verdicts = [i.key for i in first.objects.list(probe)]
    assert len(verdicts) == 1 and verdicts[0].startswith(f"{probe}verdict-")
    second = SessionStore.from_url(s3_url, redis_url, redis_prefix=redis_prefix)
    # One HEAD finds the verdict: no probe object written or deleted by the second process
    # (and one GET reads the store's layout record, store/protocol/layout_record.py).
    assert dict(second.objects.requests) == {"head": 1, "get": 1}
    second.create_session("after")
    assert second.append_session_entries("after", [entry("a", None)]).seq == 1
    # The same bucket's objects on another backend (one that ignores If-None-Match): the
    # verdict names the backend it was found on, so this one is probed, and refused.
    lying = LyingObjectStore()
    stored = first.objects.get(verdicts[0])
    lying.put_if_absent(verdicts[0].removeprefix(first.layout.prefix), stored.data)
    coord = Coordinator.from_url(redis_url, prefix=redis_prefix)
    with pytest.raises(ConditionalWritesUnsupportedError):
        SessionStore(lying, coord)
    coord.close()
    first.close()
    second.close()
