"""Compacted ids live with the data: Redis holds the ids of a session's uncompacted tail only.

When a manifest retires segments 1..T, COMPACTED drops their ids from Redis's index and
records ``iseq`` = T. Writers look their batches up in their own copy of the compacted ids,
read from the manifest's bases (store/protocol/id_index.py), and tell CHECK how far it reaches; CHECK
answers REINDEX when Redis's ``iseq`` is further. So an *active* session's Redis state stays
bounded whatever its length, and still: a re-send of any batch returns its original result,
an old id is never reused, an old parent is known, from any process, across pauses.
Real Redis and a real S3 server over HTTP; compaction and GC run as the worker runs them.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
from harness.pausing import FakeClock, InThread, Pause
from history import Op, attempt, check_history
from test_idle_state import entry, fill

from compactor import Compactor, CompactorOptions
from store import SessionStore
from store.errors import IdCollisionError
from store.formats.records import ForkPoint

GRACE_MS = 60_000


def compactor(store: SessionStore, clock: FakeClock | None = None) -> Compactor:
    return Compactor(store, CompactorOptions(grace_ms=GRACE_MS, worker="t"), now=clock or FakeClock())


def index(store: SessionStore, sid: str) -> tuple[int, dict[str, int]]:
    """(HLEN of the id index, the tail's counters) as Redis holds them."""
    client, keys = store.coord.client, store.coord.keys
    raw = client.hgetall(keys.tail(sid))
    tail = {k.decode(): int(v) for k, v in raw.items() if k in (b"seq", b"nids", b"cseq", b"iseq", b"tids", b"count")}
    return client.hlen(keys.ids(sid)), tail


def reindexes(pause_or_log: list[tuple[str, dict[str, Any]]]) -> int:
    return sum(1 for point, _ in pause_or_log if point == "append.reindex")


class Log:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, point: str, ctx: dict[str, Any]) -> None:
        self.seen.append((point, dict(ctx)))


def test_an_active_sessions_index_holds_only_its_uncompacted_tail(
    make_store: Callable[..., SessionStore],
) -> None:
    store = make_store(compact_after_segments=0)
    c = compactor(store)
    store.create_session("short")
    store.create_session("long")
    fill(store, "short", 10)
    fill(store, "long", 3_000, batch=30)
    hlen, tail = index(store, "long")
    assert hlen == 3_000 and tail["nids"] == 3_000 and tail.get("iseq", -1) == -1
    assert c.compact_session("long").outcome == "compacted"
    hlen, tail = index(store, "long")
    # Every id is compacted: none left in Redis, all accounted for.
    assert hlen == 0 and tail["tids"] == 3_000 and tail["nids"] == 3_000 and tail["iseq"] == 100
    # The session goes on: Redis indexes only what came after the manifest.
    fill(store, "long", 40, batch=4, tag="b")
    hlen, tail = index(store, "long")
    assert hlen == 40 and tail["nids"] == 3_040 and tail["count"] == 3_040
    c.compact_session("long")
    assert index(store, "long")[0] == 0
    # Its Redis state is now the size of a 10-entry session's, not 300 times it.
    client, keys = store.coord.client, store.coord.keys
    def bytes_of(sid: str) -> int:
        return sum(int(client.memory_usage(k) or 0) for k in (keys.tail(sid), keys.ids(sid)))
    assert bytes_of("long") < 2 * bytes_of("short"), (bytes_of("long"), bytes_of("short"))
    # And it reads and appends exactly as before.
    ids = [e["id"] for e in store.load_session_entries("long")]
    assert len(ids) == 3_040 and len(set(ids)) == 3_040


@pytest.mark.parametrize("who", ["the same process", "another process"])
def test_a_compacted_batch_resent_returns_its_original_result(
    make_store: Callable[..., SessionStore], who: str
) -> None:
    store = make_store(compact_after_segments=0)
    store.create_session("s")
    first = [entry("a0", None), entry("a1", "a0")]
    original = store.append_session_entries("s", first)
    fill(store, "s", 30, batch=3)
    clock = FakeClock()
    c = compactor(store, clock)
    assert c.compact_session("s").outcome == "compacted"
    clock.advance(2 * GRACE_MS)
    c.gc_session("s")  # the first batch's segment is deleted: only the base holds it
    inc = store.get_header("s").incarnation
    assert store.objects.head(store.layout.segment("s", inc, original.seq)) is None
    assert index(store, "s")[0] == 0
    tail = store.get_tail("s")
    log = Log()
    writer = store if who == "the same process" else make_store(fault_hook=log)
    assert writer.append_session_entries("s", first) == original
    assert writer.get_tail("s").seq == tail.seq  # nothing was written
    with pytest.raises(IdCollisionError, match="different content"):
        writer.append_session_entries("s", [entry("a0", None, text="other content")])
    with pytest.raises(IdCollisionError, match="already stored"):
        writer.append_session_entries("s", [entry("a1", "a0"), entry("new", "a1")])
    assert writer.get_tail("s").seq == tail.seq
    # A parent at the start of the session is known: a branch from it lands.
    branch = writer.append_session_entries("s", [entry("b0", "a1")])
    assert branch.seq == tail.seq + 1
    assert index(writer, "s")[0] == 1  # only the new entry's id is in Redis
    if who == "another process":
        assert reindexes(log.seen) == 1  # its copy was read once, then reused
    assert writer.tail.compacted.through("s", inc) == 11


def test_each_compaction_costs_a_writer_only_the_new_bases(
    make_store: Callable[..., SessionStore],
) -> None:
    """A long-lived writer reads each base once: after a compaction it reads the bases past
    what its copy covers, never the whole session again."""
    store = make_store(compact_after_segments=0)
    c = compactor(store)
    store.create_session("g")
    inc = store.get_header("g").incarnation
    fill(store, "g", 20, batch=2)
    c.compact_session("g")
    log = Log()
    writer = make_store(fault_hook=log, compact_after_segments=0)
    for round_no in range(4):
        fill(writer, "g", 6, batch=2, tag=f"r{round_no}")
        c.compact_session("g")
        writer.objects.requests.clear()
        writer.append_session_entries("g", [entry(f"after{round_no}", None)])
        gets = writer.objects.requests["get"]
        # The newest manifest and the one new base (a merge may rewrite an older run: then
        # that base too); never one GET per base of the session.
        assert gets <= 3, (round_no, writer.objects.requests)
        assert writer.tail.compacted.through("g", inc) == index(store, "g")[1]["iseq"]
    assert reindexes(log.seen) == 5
    ids = [e["id"] for e in writer.load_session_entries("g")]
    assert len(ids) == 20 + 4 * 7 and len(set(ids)) == len(ids)


@pytest.mark.parametrize("batch_kind", ["re-send", "new child"])
def test_a_writer_paused_before_check_while_a_compaction_trims_what_it_looked_up(
    make_store: Callable[..., SessionStore], batch_kind: str
) -> None:
    """The writer looks its batch up in its copy (which reaches segment T1), pauses, and a
    compaction retires segments up to T2 > T1 and drops their ids from Redis. What the writer
    needs is then in neither its copy nor Redis: without CHECK's fence a re-send would be
    appended twice and a child of a fresh entry refused. CHECK answers REINDEX instead."""
    store = make_store(compact_after_segments=0)
    c = compactor(store)
    store.create_session("p")
    fill(store, "p", 10, batch=2)
    c.compact_session("p")
    armed: list[bool] = []
    pause = Pause("append.before_check", when=lambda ctx: bool(armed) and ctx.get("session_id") == "p")
    paused = make_store(fault_hook=pause, compact_after_segments=0)
    paused.append_session_entries("p", [entry("warm", None)])  # its copy now reaches T1
    inc = store.get_header("p").incarnation
    t1 = paused.tail.compacted.through("p", inc)
    assert t1 == 5
    recent = [entry("r0", "warm"), entry("r1", "r0")]
    done = store.append_session_entries("p", recent)
    batch = recent if batch_kind == "re-send" else [entry("child", "r1")]
    armed.append(True)
    job = InThread(lambda: attempt(paused, "p", batch, None))
    pause.wait_paused()
    assert c.compact_session("p").outcome == "compacted"
    hlen, tail = index(store, "p")
    assert hlen == 0 and tail["iseq"] > t1
    pause.release()
    op = job.result()
    assert op.outcome == "ok"
    ids = [e["id"] for e in store.load_session_entries("p")]
    if batch_kind == "re-send":
        assert op.seq == done.seq
        assert ids.count("r0") == 1 and ids.count("r1") == 1
    else:
        assert ids[-1] == "child" and op.seq == done.seq + 1
    assert paused.tail.compacted.through("p", inc) == tail["iseq"]


def test_a_writer_paused_after_its_put_whose_slot_is_compacted_and_collected(
    make_store: Callable[..., SessionStore],
) -> None:
    """The writer PUTs its segment and pauses before COMMIT. Another writer rolls it forward
    and appends after it; compaction retires the slot, drops its ids from Redis, and GC
    deletes the object. The paused writer's COMMIT cannot find its ids (ZOMBIE: it deletes
    its copy of a retired slot, which is safe), and its next CHECK finds its batch among the
    compacted ids: it is acknowledged once, at the slot it got, and the history checks."""
    store = make_store(compact_after_segments=0, claim_ms=0)
    clock = FakeClock()
    c = compactor(store, clock)
    store.create_session("z")
    ops: list[Op] = [attempt(store, "z", [entry(f"z{i}", f"z{i - 1}" if i else None)], None) for i in range(4)]
    pause = Pause("append.after_put", when=lambda ctx: ctx.get("session_id") == "z")
    paused = make_store(fault_hook=pause, compact_after_segments=0, claim_ms=0)
    job = InThread(lambda: attempt(paused, "z", [entry("mine", "z3"), entry("mine2", "mine")], None))
    pause.wait_paused()
    ops.append(attempt(store, "z", [entry("other", None)], None))
    assert c.compact_session("z").outcome == "compacted"
    clock.advance(2 * GRACE_MS)
    c.gc_session("z")
    inc = store.get_header("z").incarnation
    assert store.objects.head(store.layout.segment("z", inc, 5)) is None
    assert index(store, "z")[0] == 0
    pause.release()
    mine = job.result()
    ops.append(mine)
    assert mine.outcome == "ok" and mine.seq == 5
    ids = [e["id"] for e in store.load_session_entries("z")]
    assert ids == ["z0", "z1", "z2", "z3", "mine", "mine2", "other"]
    report = check_history(store, ops)
    assert report.problems == [] and report.errors == []


def test_a_forks_inherited_path_stays_out_of_redis(make_store: Callable[..., SessionStore]) -> None:
    store = make_store(compact_after_segments=0)
    store.create_session("src")
    fill(store, "src", 200, batch=20)
    inc = store.get_header("src").incarnation
    store.create_session("child", fork=ForkPoint("src", inc, "src-149", 8))
    store.append_session_entries("child", [entry("c0", "src-149")])
    hlen, tail = index(store, "child")
    # 150 inherited ids: known to the writer, not stored again in Redis for the fork.
    assert hlen == 1 and tail["tids"] == 150 and tail["nids"] == 151 and tail["iseq"] == 0
    other = make_store()
    with pytest.raises(IdCollisionError):
        other.append_session_entries("child", [entry("src-3", None, text="reused")])
    other.append_session_entries("child", [entry("c1", "src-10")])  # a parent it inherited
    assert [e["id"] for e in other.load_session_entries("child")][-3:] == ["src-149", "c0", "c1"]


def test_an_index_that_loses_keys_is_rebuilt_trimmed(make_store: Callable[..., SessionStore]) -> None:
    """Lost keys (eviction) or a whole index written by a process that does not trim (an
    older version: its INSTALL drops iseq and tids) are both handled: the first is rebuilt,
    the second is trimmed by the next compaction, and every answer stays the same."""
    store = make_store(compact_after_segments=0)
    c = compactor(store)
    store.create_session("l")
    first = fill(store, "l", 12, batch=3)
    c.compact_session("l")
    fill(store, "l", 6, batch=3, tag="b")
    client, keys = store.coord.client, store.coord.keys
    client.hdel(keys.ids("l"), "lb-0")  # a lost key
    other = make_store()
    assert other.append_session_entries("l", [entry("l-0", None)]).seq == 1  # DUPLICATE
    hlen, tail = index(store, "l")
    assert hlen == 6 and tail["tids"] == 12
    # A whole index, as a process that does not trim installs it.
    inc = store.get_header("l").incarnation
    data = store.reader.read("l", store.get_header("l"), use_hint=False)
    from store.formats.entries import entry_hash

    full = [(str(e["id"]), s, entry_hash(e)) for e, s in zip(data.entries, data.seqs)]
    client.delete(keys.tail("l"))
    assert store.coord.install(
        "l", inc, seq=data.seq, last=data.last_entry_id, count=len(full), ids=full,
        cseq=data.manifest.through_seq,
    ) == "INSTALLED"
    hlen, tail = index(store, "l")
    assert hlen == 18 and "iseq" in tail and tail["iseq"] == -1 and tail["tids"] == 0
    assert other.append_session_entries("l", [entry("l-3", "l-2")]).seq == 2  # from Redis
    fill(store, "l", 3, batch=3, tag="c")
    c.compact_session("l")
    assert index(store, "l")[0] == 0
    with pytest.raises(IdCollisionError):
        other.append_session_entries("l", [entry(first[5], None, text="reused")])


def test_an_encrypted_sessions_compacted_ids_are_read_from_its_sealed_bases(
    make_store: Callable[..., SessionStore], tmp_path: Any
) -> None:
    from store.formats.crypto import LocalKeyFile, create_keyring

    keyring = tmp_path / "keys.json"
    create_keyring(keyring)
    store = make_store(compact_after_segments=0, key_provider=LocalKeyFile(keyring))
    store.create_session("k")
    first = [entry("k0", None), entry("k1", "k0")]
    original = store.append_session_entries("k", first)
    fill(store, "k", 12, batch=3)
    assert compactor(store).compact_session("k").outcome == "compacted"
    assert index(store, "k")[0] == 0
    other = make_store(key_provider=LocalKeyFile(keyring))
    assert other.append_session_entries("k", first) == original
    with pytest.raises(IdCollisionError):
        other.append_session_entries("k", [entry("k1", "k0", text="other")])
    assert other.append_session_entries("k", [entry("kb", "k0")]).seq == 6
