"""CHECK and COMMIT on the coordinator's own connections (coordination/direct.py), against a
real redis-server, and the append that writes its segment while CHECK runs in Redis.

The direct path must answer exactly what redis-py's client answers (same encoding of every
argument, same replies, same exceptions), survive what a connection goes through (a script
cache flushed, a connection killed, a fork), and run the caller's ``meanwhile`` while the
script runs. The append that uses it may pause in that window, after its CHECK was sent and
before it reads the answer, and carry on with an answer that is stale by then.
"""

from __future__ import annotations

import multiprocessing as mp
import select
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from harness.pausing import FakeClock, InThread, Pause
from test_pauses import GRACE_MS, compactor_for, entry

from coordination.direct import DirectScripts
from coordination.redis import Coordinator
from store import SessionStore
from store.errors import ConflictError
from store.objects import FileObjectStore
from store.records import StoreOptions

ECHO = "return {KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], #ARGV}"


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def test_replies_and_arguments_are_those_of_the_client(client: redis.Redis) -> None:
    direct = DirectScripts.for_client(client)
    assert direct is not None
    script = client.register_script(ECHO)
    args = ["héllo ✓", b"\x00\r\n\xff binary", -12345678901234567890, 3.25, ""]
    for keys in (["k:é"], [b"k\r\n"]):
        assert direct.run(script, keys, args) == script(keys=keys, args=args)
    nested = client.register_script("return {1, {'a', {2, false}}, 'x', -7}")
    assert direct.run(nested, [], []) == nested(keys=[], args=[]) == [1, [b"a", [2, None]], b"x", -7]
    with pytest.raises(redis.exceptions.DataError):
        direct.run(script, ["k"], [True])  # what the client refuses, refused alike
    direct.close()


def test_an_error_reply_is_raised_and_the_connection_reused(client: redis.Redis) -> None:
    direct = DirectScripts.for_client(client)
    assert direct is not None
    failing = client.register_script("return redis.error_reply('NOPE refused')")
    ok = client.register_script("return 'ok'")
    for _ in range(3):
        with pytest.raises(redis.exceptions.ResponseError, match="NOPE"):
            direct.run(failing, [], [])
        assert direct.run(ok, [], []) == b"ok"
    assert len(direct._free) == 1  # one connection all along
    direct.close()


def test_a_flushed_script_cache_loads_the_script_again(client: redis.Redis) -> None:
    direct = DirectScripts.for_client(client)
    assert direct is not None
    script = client.register_script("return 41 + 1")
    assert direct.run(script, [], []) == 42
    client.script_flush()
    assert direct.run(script, [], []) == 42
    assert direct.run(script, [], []) == 42
    direct.close()


def test_a_killed_connection_fails_one_call_and_the_next_reconnects(client: redis.Redis) -> None:
    direct = DirectScripts.for_client(client)
    assert direct is not None
    script = client.register_script("return redis.call('INCR', KEYS[1])")
    assert direct.run(script, ["n"], []) == 1
    client.client_kill_filter(_type="normal", skipme=True)
    try:
        assert direct.run(script, ["n"], []) == 2  # the send may land before the reset shows
    except redis.exceptions.ConnectionError:
        pass  # refused: the script did not run (the reset came first)
    assert direct.run(script, ["n"], []) in (2, 3)
    assert int(client.get("n")) == direct.run(script, ["n"], []) - 1
    direct.close()


def test_meanwhile_runs_once_while_the_script_runs(client: redis.Redis, redis_url: str) -> None:
    """The script has run (seen from another connection) before its reply is read, while the
    caller's ``meanwhile`` still runs: the two overlap."""
    direct = DirectScripts.for_client(client)
    assert direct is not None
    script = client.register_script("return redis.call('INCR', KEYS[1])")
    watcher = redis.Redis.from_url(redis_url)
    seen: list[bytes | None] = []

    def meanwhile() -> None:
        deadline = time.monotonic() + 10
        while watcher.get("m") is None and time.monotonic() < deadline:
            time.sleep(0.001)
        seen.append(watcher.get("m"))

    assert direct.run(script, ["m"], [], meanwhile) == 1
    assert seen == [b"1"]
    watcher.close()
    direct.close()


def test_a_coordinator_retrying_a_call_runs_meanwhile_once(redis_url: str, redis_prefix: str) -> None:
    """The connection is reset under the call: the command is sent, ``meanwhile`` runs, the
    reply never comes; the retry policy sends the command again on a new connection, and
    ``meanwhile`` does not run twice."""
    coord = Coordinator.from_url(redis_url, prefix=redis_prefix)
    assert coord._direct is not None
    assert coord.check("s1", "inc", ["a"], ["h"], [], None).code == "HYDRATE"  # connected
    calls: list[int] = []
    coord.client.client_kill_filter(_type="normal", skipme=False)  # every connection, ours too
    res = coord.check("s1", "inc", ["a"], ["h"], [], None, meanwhile=lambda: calls.append(1))
    assert res.code == "HYDRATE" and calls == [1]
    coord.close()


def _child(out: mp.Queue) -> None:  # type: ignore[type-arg]
    try:
        out.put(DIRECT.run(SCRIPT, ["pfork"], []))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put(repr(exc))


DIRECT: DirectScripts
SCRIPT: object


def test_a_forked_child_makes_its_own_connections(client: redis.Redis, redis_url: str) -> None:
    global DIRECT, SCRIPT
    direct = DirectScripts.for_client(client)
    assert direct is not None
    script = client.register_script("return redis.call('INCR', KEYS[1])")
    assert direct.run(script, ["pfork"], []) == 1
    DIRECT, SCRIPT = direct, script
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(out,)) for _ in range(3)]
    for p in procs:
        p.start()
    got = sorted(out.get(timeout=30) for _ in procs)
    for p in procs:
        p.join(30)
    assert got == [2, 3, 4]
    assert direct.run(script, ["pfork"], []) == 5  # the parent's connection is intact
    direct.close()


# --- the replies, read by the direct path's own reader (coordination/direct.py, _read_reply) --

#: Scripts whose replies cover what a script can answer: every RESP2 type, nested, large
#: (over one ``recv``), and with ``redis.setresp(3)`` the RESP3 types a script can make.
REPLIES = {
    "int": "return -42",
    "status": "return {ok='FINE'}",
    "bulk": "return 'héllo\\r\\n'",
    "empty": "return ''",
    "nil": "return false",
    "nested": "return {1, {'a', {2, false}}, '', {}, 'x', -7}",
    "large": "return string.rep('ab\\r\\n', 70000)",
    "many": "local t = {} for i = 1, 5000 do t[i] = tostring(i) end return t",
    "resp3": "redis.setresp(3) return {1, {double=3.5}, {map={a=1, b={2}}}, {set={x=true}}, true, false,"
             " {big_number='123456789012345678901234567890'}, {verbatim_string={format='txt', string='v\\r\\n'}}}",
}


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("name", sorted(REPLIES))
def test_every_reply_reads_as_the_client_reads_it(redis_url: str, name: str, protocol: int) -> None:
    client = redis.Redis.from_url(redis_url, protocol=protocol)
    direct = DirectScripts.for_client(client)
    assert direct is not None
    script = client.register_script(REPLIES[name])
    expected = script(keys=[], args=[])
    assert direct.run(script, [], []) == expected
    assert direct.run(script, [], []) == expected  # the connection reused, in step
    assert len(direct._free) == 1
    direct.close()
    client.close()


@pytest.mark.parametrize("protocol", [2, 3])
def test_an_error_nested_in_a_reply_is_returned_as_the_client_returns_it(
    redis_url: str, protocol: int
) -> None:
    client = redis.Redis.from_url(redis_url, protocol=protocol)
    direct = DirectScripts.for_client(client)
    assert direct is not None
    script = client.register_script("return {1, redis.error_reply('NOPE inner'), 'x'}")
    expected = script(keys=[], args=[])
    got = direct.run(script, [], [])
    assert [type(v) for v in got] == [type(v) for v in expected]
    assert [str(v) for v in got] == [str(v) for v in expected]
    assert isinstance(got[1], redis.exceptions.ResponseError)
    direct.close()
    client.close()


def test_a_client_that_decodes_or_another_parser_reads_with_its_own(redis_url: str) -> None:
    """The direct path's reader knows redis-py's pure-Python parsers and undecoded replies;
    anything else (hiredis's parser, a subclass, ``decode_responses``) reads as it always
    did, through the connection's own parser."""
    from redis._parsers import _RESP3Parser

    reads: list[int] = []

    class Counting(_RESP3Parser):
        def read_response(self, *args: object, **kwargs: object) -> object:
            reads.append(1)
            return super().read_response(*args, **kwargs)

    for client in (
        redis.Redis.from_url(redis_url, decode_responses=True),
        redis.Redis.from_url(redis_url, protocol=3, parser_class=Counting),
    ):
        direct = DirectScripts.for_client(client)
        assert direct is not None
        script = client.register_script("return {'a', 1, {'b'}}")
        expected = script(keys=[], args=[])
        assert direct.run(script, [], []) == expected  # connects (the handshake's replies)
        reads.clear()
        assert direct.run(script, [], []) == expected
        if client.connection_pool.connection_kwargs.get("parser_class") is Counting:
            assert reads == [1]
        else:
            assert expected == ["a", 1, ["b"]]
        direct.close()
        client.close()


def test_a_push_message_before_the_reply_is_skipped(client: redis.Redis, redis_url: str) -> None:
    """RESP3 lets the server send a push (here a client-side caching invalidation) on any
    connection at any time: it is not the script's reply."""
    c3 = redis.Redis.from_url(redis_url, protocol=3)
    direct = DirectScripts.for_client(c3)
    assert direct is not None
    script = c3.register_script("return redis.call('INCR', KEYS[1])")
    assert direct.run(script, ["pushed"], []) == 1
    conn = direct._take()  # the connection the next call takes: it tracks a key
    conn.send_command("CLIENT", "TRACKING", "ON")
    assert conn.read_response() == b"OK"
    conn.send_command("GET", "tracked")
    conn.read_response()
    direct._give(conn)
    client.set("tracked", "changed")  # the server pushes an invalidation to that connection
    readable, _, _ = select.select([conn._sock], [], [], 10)  # the push has arrived
    assert readable
    assert direct.run(script, ["pushed"], []) == 2
    assert direct._free == [conn]  # read in step: kept for the next call
    assert direct.run(script, ["pushed"], []) == 3
    direct.close()
    c3.close()


def test_a_reply_that_does_not_come_in_time_is_a_timeout_and_the_connection_dropped(
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=0.2)
    direct = DirectScripts.for_client(client)
    assert direct is not None
    slow = client.register_script(
        "local t0 = redis.call('TIME') local n = 0"
        " repeat n = n + 1 local t = redis.call('TIME')"
        " until (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > 600000 return n"
    )
    slow.sha = client.script_load(slow.script)
    with pytest.raises(redis.exceptions.TimeoutError):
        direct.run(slow, [], [])
    assert direct._free == []  # its reply may still come: never read by another call
    time.sleep(0.6)
    assert direct.run(client.register_script("return 5"), [], []) == 5
    direct.close()
    client.close()


def test_only_a_plain_client_goes_direct(redis_url: str) -> None:
    class Sub(redis.Redis):
        pass

    assert DirectScripts.for_client(redis.Redis.from_url(redis_url)) is not None
    assert DirectScripts.for_client(Sub.from_url(redis_url)) is None
    assert DirectScripts.for_client(redis.Redis.from_url(redis_url, protocol=3)) is not None
    assert DirectScripts.for_client(object()) is None


# --- the append that writes its segment while CHECK runs -----------------------------------


def _file_store(root: Path, redis_url: str, redis_prefix: str, hook: object = None) -> SessionStore:
    objects = FileObjectStore(root, fault_hook=hook)  # type: ignore[arg-type]
    coord = Coordinator.from_url(redis_url, prefix=redis_prefix)
    return SessionStore(objects, coord, options=StoreOptions(redis_prefix=redis_prefix))


def _ids(store: SessionStore, sid: str) -> list[str]:
    return [e["id"] for e in store.read_session(sid).entries]


@pytest.mark.parametrize("strict", [False, True], ids=["no-expected-tail", "expected-tail"])
def test_an_append_paused_while_its_check_is_in_redis(
    tmp_path: Path, redis_url: str, redis_prefix: str, strict: bool
) -> None:
    """Writer A sent CHECK (slot 2 is free) and paused writing its segment's bytes, before it
    read the answer. Writer B appended to slot 2 meanwhile. A carries on with its stale
    answer: its create at slot 2 is refused (B's), it rolls B's segment forward and checks
    again: appended at slot 3 (no expected tail), or refused as a conflict (A expected the
    tail it read before B's append): nothing of A's is then visible, nothing of B's lost."""
    root = tmp_path / "objects"
    pause = Pause("file.put.staged")
    a = _file_store(root, redis_url, redis_prefix, pause)
    b = _file_store(root, redis_url, redis_prefix)
    sid = b.create_session(cwd="/w").session_id
    b.append_session_entries(sid, [entry("e1", None)])
    run = InThread(lambda: a.append_session_entries(sid, [entry("a2", "e1")], "e1" if strict else None))
    pause.wait_paused()
    assert b.append_session_entries(sid, [entry("b2", "e1")]).seq == 2
    pause.release()
    if strict:
        with pytest.raises(ConflictError):
            run.result()
        assert _ids(b, sid) == ["e1", "b2"]
        assert _ids(_file_store(root, redis_url, redis_prefix), sid) == ["e1", "b2"]
    else:
        assert run.result().seq == 3
        assert _ids(b, sid) == ["e1", "b2", "a2"]
    assert sorted(p.name for p in (root / ".tmp").iterdir()) == []
    a.close()
    b.close()


def test_an_append_paused_while_its_check_is_in_redis_past_compaction_and_gc(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    """As above, but while A is paused B's segment is merged by the compactor and its slot
    deleted by GC a grace period later: the slot A's stale answer names is free again. A's
    create there is a zombie: COMMIT refuses it, A deletes it and checks again, and lands
    after B's entry. Every reader sees e1, b2, a2, once each."""
    root = tmp_path / "objects"
    pause = Pause("file.put.staged")
    clock = FakeClock()
    a = _file_store(root, redis_url, redis_prefix, pause)
    b = _file_store(root, redis_url, redis_prefix)
    sid = b.create_session(cwd="/w").session_id
    b.append_session_entries(sid, [entry("e1", None)])
    run = InThread(lambda: a.append_session_entries(sid, [entry("a2", "e1")]))
    pause.wait_paused()
    b.append_session_entries(sid, [entry("b2", "e1")])
    compactor = compactor_for(b, clock)
    assert compactor.compact_session(sid).outcome == "compacted"
    clock.advance(GRACE_MS + 1)
    compactor.gc_session(sid)
    inc = b.get_header(sid).incarnation
    assert b.objects.head(b.layout.segment(sid, inc, 2)) is None  # the slot is free again
    pause.release()
    result = run.result()
    assert result.seq >= 3
    for reader in (b, _file_store(root, redis_url, redis_prefix)):
        assert _ids(reader, sid) == ["e1", "b2", "a2"]
    a.close()
    b.close()


def test_concurrent_appends_through_the_direct_path_lose_nothing(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    """Threads of two stores (each with its own connections) append to one session: every
    acknowledged entry is read back once, in the segment it was acknowledged with (queued
    writers may share a segment: group commit), segments in order."""
    root = tmp_path / "objects"
    stores = [_file_store(root, redis_url, redis_prefix) for _ in range(2)]
    sid = stores[0].create_session(cwd="/w").session_id
    acked: list[tuple[int, str]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(25):
                eid = f"t{t}-{i}"
                res = stores[t % 2].append_session_entries(sid, [entry(eid, None)])
                with lock:
                    acked.append((res.seq, eid))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors[:3]
    data = stores[0].read_session(sid)
    stored = [(seq, str(e["id"])) for e, seq in zip(data.entries, data.seqs)]
    assert sorted(stored) == sorted(acked)  # each acknowledged entry once, in its segment
    assert [seq for seq, _ in stored] == sorted(seq for seq, _ in stored)
    assert len(stored) == 100
    for s in stores:
        s.close()
