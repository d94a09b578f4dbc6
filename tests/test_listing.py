"""Listing sessions page by page (store/protocol/listing.py): exact-once paging under concurrent creates
and deletes, the picker's fields from Redis's summaries (after appends, a FLUSHALL, compaction,
forks, streams, redactions), requests per page, and bad input."""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from compactor import Compactor, CompactorOptions
from store import SessionStore
from store.errors import InvalidInputError, SessionNotFoundError
from store.protocol.listing import PREVIEW_CHARS, InvalidCursorError, SessionFilter, preview
from store.formats.records import SessionInfo
from store.streams import Streams
from tests.harness.pausing import InThread, Pause


def user(eid: str, parent: str | None, text: Any) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent, "timestamp": "2026-01-01T00:00:00.000Z",
            "message": {"role": "user", "content": text}}


def assistant(eid: str, parent: str | None, text: str) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent, "timestamp": "2026-01-01T00:00:00.000Z",
            "message": {"role": "assistant", "content": [{"type": "text", "text": text}]}}


def named(eid: str, parent: str | None, name: str) -> dict[str, Any]:
    return {"type": "session_info", "id": eid, "parentId": parent,
            "timestamp": "2026-01-01T00:00:00.000Z", "name": name}


def every(store: SessionStore, page: int = 1000, **filters: Any) -> dict[str, SessionInfo]:
    out: dict[str, SessionInfo] = {}
    for info in store.iter_sessions(page_size=page, **filters):
        assert info.session_id not in out, f"{info.session_id} listed twice"
        out[info.session_id] = info
    return out


def stored_bytes(store: SessionStore, sid: str) -> int:
    """The sizes of the session's segments, as the object store lists them."""
    inc = store.get_header(sid).incarnation
    return sum(i.size for i in store.objects.list(store.layout.segment_prefix(sid, inc)))


def picker_fields(info: SessionInfo) -> tuple[Any, ...]:
    return (info.session_id, info.name, info.first_message, info.entry_count, info.bytes,
            info.cwd, info.kind, info.created_at_ms, info.fork_of, info.fork_entry_id, info.path)


# --- the fields ------------------------------------------------------------------------------


def test_fields_after_appends_come_from_redis_without_reading_sessions(store: SessionStore) -> None:
    long_text = "why   does\n" + "x" * 500
    store.create_session("s1", cwd="/work/a")
    store.append_session_entries("s1", [assistant("a0", None, "hello"), user("u1", "a0", long_text)])
    store.append_session_entries("s1", [named("n1", "u1", "  first name "), user("u2", "n1", "second")])
    store.append_session_entries("s1", [named("n2", "u2", "final name")])
    store.create_session("s2", cwd="/work/b")  # no entries yet
    store.append_session_entries("s2", [user("b1", None, [{"type": "image", "data": "..."},
                                                          {"type": "text", "text": "look"}])])
    store.append_session_entries("s2", [named("b2", "b1", "gone"), named("b3", "b2", "   ")])  # cleared
    before = int(time.time() * 1000)
    store.create_session("s3")

    store.objects.requests.clear()
    page = store.list_sessions()
    assert store.objects.requests["get"] == 0 and store.objects.requests["list"] == 1
    assert page.next_cursor is None
    infos = {i.session_id: i for i in page.items}
    s1 = infos["s1"]
    assert s1.name == "final name" and s1.cwd == "/work/a" and s1.kind == "pi" and s1.fork_of is None
    assert s1.first_message == ("why does " + "x" * 500)[: PREVIEW_CHARS - 1] + "…"
    assert len(s1.first_message) == PREVIEW_CHARS
    assert s1.entry_count == 5 and s1.bytes == stored_bytes(store, "s1")
    assert s1.updated_at_ms is not None and s1.updated_at_ms >= s1.created_at_ms
    s2 = infos["s2"]
    assert s2.name is None and s2.first_message == "look" and s2.entry_count == 3
    s3 = infos["s3"]
    assert (s3.name, s3.first_message, s3.entry_count, s3.bytes) == (None, None, 0, 0)
    assert s3.created_at_ms >= before and s3.updated_at_ms == s3.created_at_ms
    # The summary agrees with pi's reading of the session.
    assert s1.name == store.load_session("s1").name and s2.name == store.load_session("s2").name


def test_fields_rebuilt_after_flushall_then_served_from_redis_again(store: SessionStore) -> None:
    for i in range(5):
        sid = f"f{i}"
        store.create_session(sid, cwd=f"/w/{i}")
        store.append_session_entries(sid, [user(f"{sid}-1", None, f"question {i}")])
        store.append_session_entries(sid, [named(f"{sid}-2", f"{sid}-1", f"name {i}")])
    first = every(store)
    store.coord.client.flushall()
    store.objects.requests.clear()
    rebuilt = every(store)
    assert store.objects.requests["get"] > 0  # read from the object store: nothing in Redis
    assert {s: picker_fields(i) for s, i in rebuilt.items()} == {s: picker_fields(i) for s, i in first.items()}
    for sid, info in rebuilt.items():
        # From the object store's clock now (S3's Last-Modified has whole seconds).
        assert info.updated_at_ms is not None
        assert first[sid].created_at_ms - 1000 <= info.updated_at_ms <= int(time.time() * 1000) + 1000
    store.objects.requests.clear()
    assert {s: picker_fields(i) for s, i in every(store).items()} == {s: picker_fields(i) for s, i in first.items()}
    assert store.objects.requests["get"] == 0  # the rebuild installed the summaries
    # Appends after the rebuild move the rebuilt summaries on.
    store.append_session_entries("f0", [named("f0-3", "f0-2", "renamed")])
    assert every(store)["f0"].name == "renamed" and every(store)["f0"].entry_count == 3


def test_fields_survive_compaction_and_a_rebuild_from_bases(store: SessionStore) -> None:
    store.create_session("c", cwd="/c")
    parent = None
    for i in range(6):
        store.append_session_entries("c", [user(f"c{i}", parent, f"message {i}")])
        parent = f"c{i}"
    store.append_session_entries("c", [named("cn", parent, "compacted")])
    before = every(store)["c"]
    compactor = Compactor(store, CompactorOptions(grace_ms=0))
    result = compactor.compact_session("c")
    assert result.outcome == "compacted" and result.segments_merged == (1, 7)
    assert picker_fields(every(store)["c"]) == picker_fields(before)
    store.coord.client.flushall()
    after = every(store)["c"]  # rebuilt: bases, not segments
    assert picker_fields(after) == picker_fields(before)
    assert after.bytes > 0 and after.name == "compacted" and after.first_message == "message 0"


def test_forks_count_their_inherited_path_and_inherit_name_and_first_message(store: SessionStore) -> None:
    store.create_session("src", cwd="/src")
    store.append_session_entries("src", [user("u1", None, "the question"), named("n1", "u1", "source")])
    store.append_session_entries("src", [assistant("a1", "n1", "answer"), user("u2", "a1", "more")])
    fork = store.branch_from_entry("src", "a1", "fk")
    assert fork.session_id == "fk"
    infos = every(store)
    fk = infos["fk"]
    assert fk.fork_of == "src" and fk.fork_entry_id == "a1" and fk.cwd == "/src"
    assert fk.entry_count == 3  # u1, n1, a1: the path it reads from the source
    assert fk.name == "source" and fk.first_message == "the question" and fk.bytes == 0
    assert infos["src"].entry_count == 4
    store.append_session_entries("fk", [named("fn", "a1", "the fork")])
    fk = every(store)["fk"]
    assert (fk.name, fk.entry_count, fk.bytes) == ("the fork", 4, stored_bytes(store, "fk"))
    assert every(store)["src"].name == "source"


def test_streams_are_listed_with_their_kind_path_size_and_count(store: SessionStore) -> None:
    streams = Streams(store)
    streams.create("acme/events", content_type="application/json")
    streams.append("acme/events", [{"n": 1}, {"n": 2}], content_type="application/json")
    streams.append("acme/events", [{"n": 3}], content_type="application/json")
    store.create_session("p1", cwd="/p")
    infos = every(store)
    [sid] = [s for s, i in infos.items() if i.kind == "stream"]
    info = infos[sid]
    assert info.path == "acme/events" and info.name is None and info.first_message is None
    assert info.entry_count == store.get_tail(sid).entry_count > 0
    assert info.bytes == stored_bytes(store, sid) > 0
    assert set(every(store, kind="stream")) == {sid} and set(every(store, kind="pi")) == {"p1"}
    store.coord.client.flushall()
    assert picker_fields(every(store)[sid]) == picker_fields(info)


def test_a_redacted_first_message_leaves_the_listing(store: SessionStore) -> None:
    store.create_session("r")
    store.append_session_entries("r", [user("u1", None, "my password is hunter2"),
                                       assistant("a1", "u1", "ok"), user("u2", "a1", "next question")])
    assert every(store)["r"].first_message == "my password is hunter2"
    store.redact("r", "u1", "secret")
    info = every(store)["r"]
    assert info.first_message == "next question"
    assert "hunter2" not in repr(info)
    assert info.entry_count == 4


def test_filters_apply_to_each_page_and_the_cursor_moves_on(store: SessionStore) -> None:
    for i in range(12):
        sid = f"q{i:02d}"
        store.create_session(sid, cwd="/proj/a" if i % 3 == 0 else f"/other/{i}")
        if i % 4 == 0:
            store.append_session_entries(sid, [named(f"{sid}-n", None, f"Fix bug {i}")])
    pages = []
    cursor = None
    while True:
        page = store.list_sessions(cursor=cursor, limit=5, cwd="/proj/a")
        pages.append([i.session_id for i in page.items])
        assert all(i.cwd == "/proj/a" for i in page.items)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    # Pages of 5 in the layout's order (shard, then id), each filtered: some short, maybe empty.
    order = sorted((f"q{i:02d}" for i in range(12)), key=store.layout.dir_name)
    kept = {f"q{i:02d}" for i in range(0, 12, 3)}
    assert pages == [[s for s in order[i : i + 5] if s in kept] for i in range(0, 12, 5)]
    assert set(every(store, page=3, cwd_prefix="/other/")) == {f"q{i:02d}" for i in range(12) if i % 3}
    assert set(every(store, name_contains="fix BUG")) == {"q00", "q04", "q08"}
    assert set(every(store, filters=SessionFilter(name_contains="bug 8", cwd_prefix="/other"))) == {"q08"}
    later = int(time.time() * 1000) + 60_000
    assert every(store, updated_since_ms=later) == {}
    assert len(every(store, updated_since_ms=0)) == 12


def test_bad_cursor_limit_and_filters_are_typed_errors(store: SessionStore) -> None:
    store.create_session("x1")
    for cursor in ("", "../x", "a/b", 7, "x" * 200):
        with pytest.raises(InvalidCursorError):
            store.list_sessions(cursor=cursor)  # type: ignore[arg-type]
    for limit in (0, -1, 1001, 2.5, "10", True):
        with pytest.raises(InvalidInputError):
            store.list_sessions(limit=limit)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        store.list_sessions(colour="red")
    with pytest.raises(InvalidInputError):
        store.list_sessions(updated_since_ms="yesterday")
    with pytest.raises(InvalidInputError):
        store.list_sessions(filters=SessionFilter(kind="pi"), cwd="/x")
    assert [i.session_id for i in store.list_sessions().items] == ["x1"]


# --- exact once --------------------------------------------------------------------------------


def test_each_session_present_throughout_is_listed_exactly_once_across_creates_and_deletes(
    store: SessionStore,
) -> None:
    # Ids that sort differently by name and by "name/" (S3's order of directories).
    base = [f"s{i:03d}" for i in range(0, 60, 2)] + ["a", "a-b", "a.b", "a0", "a_b", "ab"]
    for sid in base:
        store.create_session(sid)
    doomed = set(base[1::4])
    survivors = set(base) - doomed
    created: set[str] = set()
    seen: list[str] = []
    cursor = None
    n = 0
    while True:
        page = store.list_sessions(cursor=cursor, limit=4)
        seen += [i.session_id for i in page.items]
        n += 1
        # Between pages: delete some (listed already or not), create some on both sides.
        for sid in sorted(doomed)[: n]:
            try:
                store.delete_session(sid)
            except SessionNotFoundError:
                pass
        for sid in (f"s{n * 4 + 1:03d}", f"a{n}", f"z{n}"):
            if sid not in created:
                store.create_session(sid)
                created.add(sid)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert len(seen) == len(set(seen)), "a session was listed twice"
    assert survivors <= set(seen)
    assert set(seen) <= set(base) | created


def test_exact_once_while_other_threads_create_and_delete(store: SessionStore, make_store: Callable[..., SessionStore]) -> None:
    stable = [f"m{i:03d}" for i in range(40)]
    for sid in stable:
        store.create_session(sid)
    other = make_store()
    stop = threading.Event()
    churned: set[str] = set()

    def churn(w: int) -> None:
        i = 0
        while not stop.is_set():
            sid = f"m{(i * 7 + w) % 40:03d}-{w}"
            try:
                other.create_session(sid)
                churned.add(sid)
                other.delete_session(sid)
            except SessionNotFoundError:
                pass
            except Exception as exc:  # noqa: BLE001 - SessionExistsError on a re-create race
                if type(exc).__name__ != "SessionExistsError":
                    raise
            i += 1

    threads = [InThread(lambda w=w: churn(w)) for w in range(2)]
    try:
        for _ in range(3):
            seen = [i.session_id for i in store.iter_sessions(page_size=3)]
            assert len(seen) == len(set(seen))
            assert set(stable) <= set(seen)
            assert set(seen) <= set(stable) | churned
    finally:
        stop.set()
        for t in threads:
            t.result()


# --- requests ----------------------------------------------------------------------------------


def test_requests_grow_with_pages_not_sessions(store: SessionStore, redis_url: str) -> None:
    import redis

    n, page_size = 600, 40  # 15 pages
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: store.create_session(f"n{i:05d}", cwd=f"/r/{i % 7}"), range(n)))
    server = redis.Redis.from_url(redis_url)
    round_trips = []
    summaries = store.coord.summaries

    def counted(sids: Any) -> Any:
        round_trips.append(len(sids))
        return summaries(sids)

    store.coord.summaries = counted  # type: ignore[method-assign]
    server.config_resetstat()
    store.objects.requests.clear()
    listed = every(store, page=page_size)
    assert len(listed) == n
    pages = n // page_size + (1 if n % page_size else 0)
    assert dict(store.objects.requests) == {"list": pages}  # no GET, no HEAD: no session read
    assert round_trips == [page_size] * pages  # one pipeline a page
    stats = server.info("commandstats")
    # The pipeline's commands at the server: two reads a session, nothing global, no script.
    assert stats["cmdstat_hmget"]["calls"] == n and stats["cmdstat_hgetall"]["calls"] == n
    assert not any(k in stats for k in ("cmdstat_zrange", "cmdstat_zadd", "cmdstat_evalsha", "cmdstat_eval"))
    server.close()


# --- pauses and crashes --------------------------------------------------------------------------


def test_a_summary_rebuild_paused_past_a_commit_is_not_installed(
    make_store: Callable[..., SessionStore],
) -> None:
    pause = Pause("summary.before_install")
    lister = make_store(fault_hook=pause)
    writer = make_store()
    writer.create_session("p", cwd="/p")
    writer.append_session_entries("p", [user("u1", None, "hi"), named("n1", "u1", "old")])
    writer.coord.client.flushall()
    listing = InThread(lambda: every(lister))
    pause.wait_paused()  # the lister read the session (name "old") and rebuilt the tail
    writer.append_session_entries("p", [named("n2", "n1", "new")])  # commits past it
    pause.release()
    assert listing.result()["p"].name == "old"  # what it read: a snapshot, not wrong then
    again = every(lister)["p"]
    assert (again.name, again.entry_count) == ("new", 3)  # the stale summary was refused
    assert lister.coord.summaries(["p"])[0][1]["name"] == "new"


def test_a_delete_paused_before_its_header_goes_and_one_that_stops_after(
    make_store: Callable[..., SessionStore],
) -> None:
    pause = Pause("delete.after_header")
    deleter = make_store(fault_hook=pause)
    lister = make_store()
    for sid in ("d1", "d2", "keep"):
        lister.create_session(sid)
        lister.append_session_entries(sid, [user(f"{sid}-1", None, "x")])
    deleting = InThread(lambda: deleter.delete_session("d1"))
    pause.wait_paused()  # header gone, Redis state and segments still there
    assert set(every(lister)) == {"d2", "keep"}
    pause.release()
    deleting.result()
    assert set(every(lister)) == {"d2", "keep"}

    # A delete that stops for good after its header (a crash): the session's directory and
    # Redis state stay, and it is still not listed.
    def crash(point: str, ctx: dict[str, Any]) -> None:
        if point == "delete.after_header":
            raise RuntimeError("crash")

    crashing = make_store(fault_hook=crash)
    with pytest.raises(RuntimeError):
        crashing.delete_session("d2")
    assert list(lister.objects.list(lister.layout.session_prefix("d2")))
    assert set(every(lister)) == {"keep"}
    # A re-create under the same id is listed, with its new life's fields.
    lister.create_session("d2", cwd="/again")
    assert (every(lister)["d2"].cwd, every(lister)["d2"].entry_count) == ("/again", 0)


def test_names_and_messages_with_lone_surrogates_are_listed_as_pi_reads_them(store: SessionStore) -> None:
    # JavaScript strings may hold a lone surrogate; pi writes them, and the store keeps them.
    store.create_session("js")
    store.append_session_entries("js", [user("u1", None, "half \ud83d emoji"), named("n1", "u1", "Emoji hunt \ud83d")])
    info = every(store)["js"]
    assert info.name == "Emoji hunt \ud83d" == store.load_session("js").name
    assert info.first_message == "half \ud83d emoji"
    store.coord.client.flushall()
    assert picker_fields(every(store)["js"]) == picker_fields(info)


def test_the_preview_of_a_long_message_is_that_of_the_whole_text() -> None:
    """``preview`` collapses only a head of a long message (it runs on every append of a
    user message): for any text, the answer is the one collapsing the whole text gives,
    whitespace-heavy texts (where the head says too little) included."""

    def whole(text: str) -> str:
        flat = re.sub(r"\s+", " ", text).strip()
        return flat if len(flat) <= PREVIEW_CHARS else flat[: PREVIEW_CHARS - 1] + "…"

    rng = random.Random(14)
    pieces = ["a", "b", " ", "\n", "\t", "\u00a0", "\u2003", "é", "  ", "x" * 50, " " * 300, "\r\n"]
    for _ in range(20_000):
        size = rng.choice([0, 1, 5, PREVIEW_CHARS - 1, PREVIEW_CHARS, PREVIEW_CHARS + 1,
                           4 * PREVIEW_CHARS - 1, 4 * PREVIEW_CHARS, 4 * PREVIEW_CHARS + 1, 5000])
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, size)))[: 2 * size]
        assert preview(text) == whole(text), repr(text)
    tail = " " * (10 * PREVIEW_CHARS) + "the message starts late"
    assert preview(tail) == "the message starts late"
    assert preview("word " * 100_000) == ("word " * 100)[: PREVIEW_CHARS - 1] + "…"
