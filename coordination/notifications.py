"""Change notifications: a session's channel, every session's (a pattern), or chosen
sessions' sharded channels. They only say *when* to look: what to read is always read from
the object store, so a lost notification delays a reader, never loses an entry.
"""

from __future__ import annotations

import logging
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from coordination.client import RedisClient, redis_call
from coordination.formats import _s, parse_version
from coordination.keys import Keys
from store.errors import BackendRefusedError, BackendUnavailableError

log = logging.getLogger("sessionstore.coordination")


class NotificationCalls(RedisClient):
    """The notification calls of the coordinator."""

    def sharded_pubsub(self) -> bool:
        """Whether change notifications use sharded pub/sub (SPUBLISH / SSUBSCRIBE).

        True when every server runs Redis >= 7.0 (on a cluster, every node: the lowest
        version decides). On Redis 6.2 notifications use PUBLISH and SUBSCRIBE / PSUBSCRIBE.
        Asked once per Coordinator (INFO server). A server that refuses INFO (an ACL) gets
        PUBLISH, which every version has; an unreachable one is asked again next time."""
        if self._sharded is None:
            try:
                versions = self._call(self._server_versions)
            except BackendRefusedError as exc:
                log.warning("cannot read the Redis version (%s): notifications use PUBLISH", exc)
                versions = []
            self._sharded = bool(versions) and min(versions) >= (7, 0)
        return self._sharded

    def _server_versions(self) -> list[tuple[int, ...]]:
        if self.cluster:
            cluster: Any = self.client
            infos = [cluster.get_redis_connection(node).info("server") for node in cluster.get_nodes()]
        else:
            infos = [self.client.info("server")]
        return [parse_version(str(info.get("redis_version", "0"))) for info in infos]

    def subscribe(self, sid: str) -> Subscription:
        """The session's change notifications (one per committed segment). Errors of the
        channel arrive as ``store.errors`` like every other Redis error. SSUBSCRIBE when
        :meth:`sharded_pubsub` (on a cluster, to the node that owns the session's slot),
        else SUBSCRIBE."""
        sharded = self.sharded_pubsub()
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        channel = self.keys.changes(sid)
        self._call(lambda: pubsub.ssubscribe(channel) if sharded else pubsub.subscribe(channel))
        return Subscription(pubsub, sharded=sharded)

    def subscribe_all(self) -> AllChanges:
        """Change notifications of every session, on one connection (a server's waiters
        share it): a pattern subscription, for Redis 6.2 (PUBLISH). There are no sharded
        pattern subscriptions: with :meth:`sharded_pubsub`, use :meth:`subscribe_shards`."""
        pubsub = self.client.pubsub()  # type: ignore[no-untyped-call]
        self._call(lambda: pubsub.psubscribe(self.keys.changes_pattern()))
        return AllChanges(pubsub, self.keys)

    def subscribe_shards(self, *, refresh: bool = False) -> ShardChanges:
        """Sharded subscriptions to chosen sessions (see :class:`ShardChanges`). ``refresh``:
        on a cluster, reload which node owns which slot first (after a lost connection)."""
        if refresh and self.cluster:
            cluster: Any = self.client
            self._call(cluster.nodes_manager.initialize, retry=False)
        return ShardChanges(self.client, self.keys, self.cluster)


def _drain(pubsub: Any, timeout: float, kinds: tuple[str, ...], *, sharded: bool = False) -> list[dict[str, Any]]:
    """The messages of the types ``kinds`` waiting on ``pubsub``, blocking up to ``timeout``
    s for the first; redis-py's errors as the store's. ``sharded``: read with
    ``get_sharded_message`` (a cluster's pub/sub keeps one connection per node for SSUBSCRIBE;
    on a standalone client it is ``get_message``)."""
    out: list[dict[str, Any]] = []
    get = pubsub.get_sharded_message if sharded else pubsub.get_message

    def drain() -> None:
        msg = get(timeout=max(0.0, timeout))
        while msg is not None:
            if msg.get("type") in kinds:
                out.append(msg)
            msg = get(timeout=0)

    try:
        redis_call(drain)
    except OSError as exc:
        raise BackendUnavailableError(f"notification channel lost: {exc}") from exc
    return out


class Subscription:
    """Change notifications of one session, with redis-py's errors translated.

    Notifications only say *when* to look (a lost one delays a follower by its poll
    interval, never loses an entry): what to read is always read from the object store.
    """

    def __init__(self, pubsub: Any, *, sharded: bool = False) -> None:
        self._pubsub = pubsub
        self._sharded = sharded

    def wait(self, timeout: float) -> int | None:
        """Block up to ``timeout`` s for notifications. Returns the highest segment number
        announced (0 for a notification without one), or None if none came."""
        best: int | None = None
        kinds = ("smessage",) if self._sharded else ("message",)
        for msg in _drain(self._pubsub, timeout, kinds, sharded=self._sharded):
            try:
                seq = int(orjson.loads(msg["data"]).get("seq", 0))
            except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError):
                seq = 0
            best = seq if best is None else max(best, seq)
        return best

    def close(self) -> None:
        try:
            self._pubsub.close()
        except Exception:  # noqa: BLE001 - closing a broken connection may fail any way
            pass

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AllChanges:
    """Change notifications of every session on one pub/sub connection: :meth:`wait` returns
    the session ids announced. Like :class:`Subscription`, only says when to look.

    :attr:`live` turns True when the server confirms the pattern subscription: from then on
    every notification published reaches this connection (until it is lost)."""

    def __init__(self, pubsub: Any, keys: Keys) -> None:
        self._pubsub = pubsub
        self._keys = keys
        self.live = False

    def wait(self, timeout: float) -> list[str]:
        sids: list[str] = []
        for msg in _drain(self._pubsub, timeout, ("pmessage", "psubscribe")):
            if msg["type"] == "psubscribe":
                self.live = True
                continue
            sid = self._keys.session_of_channel(_s(msg.get("channel", "")))
            if sid is not None:
                sids.append(sid)
        return sids

    def close(self) -> None:
        try:
            self._pubsub.close()
        except Exception:  # noqa: BLE001 - closing a broken connection may fail any way
            pass


@dataclass(frozen=True, slots=True)
class ShardEvent:
    """What :meth:`ShardChanges.wait` saw: ``kind`` "message" (a session's notification) or
    "live" (the server confirmed the subscription to the session's channel)."""

    kind: str
    sid: str


class ShardChanges:
    """Sharded subscriptions (SSUBSCRIBE) to the channels of chosen sessions, on one
    connection per node that owns one of them (a standalone server: one connection).

    Not thread-safe: one thread subscribes, unsubscribes and waits. A subscription is live
    once the server confirms it (a "live" event); every notification published after that
    reaches this connection until the connection is lost. A lost connection, a refused
    command (MOVED after a slot migrated) or a subscription the server dropped on its own (the
    slot moved away) raises ``BackendUnavailableError``/``BackendRefusedError``: close this
    and make a new one (``Coordinator.subscribe_shards(refresh=True)``)."""

    def __init__(self, client: Any, keys: Keys, cluster: bool) -> None:
        self._client = client
        self._keys = keys
        self._cluster = cluster
        #: node name ("" standalone) -> its pub/sub connection
        self._pubsubs: dict[str, Any] = {}
        #: session -> the node it is subscribed on
        self._where: dict[str, str] = {}
        #: SUNSUBSCRIBEs sent and not yet confirmed, by session
        self._leaving: dict[str, int] = {}

    def _node(self, channel: str) -> str:
        if not self._cluster:
            return ""
        return str(self._client.get_node_from_key(channel).name)

    def _pubsub(self, name: str) -> Any:
        pubsub = self._pubsubs.get(name)
        if pubsub is None:
            if self._cluster:
                node = self._client.get_node(node_name=name)
                pubsub = self._client.get_redis_connection(node).pubsub()
            else:
                pubsub = self._client.pubsub()
            self._pubsubs[name] = pubsub
        return pubsub

    def subscribe(self, sid: str) -> None:
        """Send SSUBSCRIBE for ``sid``'s channel; live when :meth:`wait` says so."""

        def go() -> None:
            channel = self._keys.changes(sid)
            name = self._node(channel)
            self._pubsub(name).ssubscribe(channel)
            self._where[sid] = name

        self._io(go)

    def unsubscribe(self, sid: str) -> None:
        name = self._where.pop(sid, None)
        if name is None or name not in self._pubsubs:
            return
        self._leaving[sid] = self._leaving.get(sid, 0) + 1
        self._io(lambda: self._pubsubs[name].sunsubscribe(self._keys.changes(sid)))

    def subscribed(self) -> set[str]:
        return set(self._where)

    def wait(self, timeout: float, wake: socket.socket | None = None) -> list[ShardEvent]:
        """Events waiting on any node's connection, blocking up to ``timeout`` s for the
        first, or until ``wake`` (a socket another thread writes to) is readable."""
        events = self._read()
        if events:
            return events
        socks: list[Any] = [wake] if wake is not None else []
        for pubsub in self._pubsubs.values():
            sock = getattr(pubsub.connection, "_sock", None) if pubsub.connection else None
            if sock is not None and pubsub.subscribed:
                socks.append(sock)
        try:
            select.select(socks, [], [], max(0.0, timeout)) if socks else _sleep(timeout)
        except (OSError, ValueError) as exc:  # a socket closed under us
            raise BackendUnavailableError(f"notification channel lost: {exc}") from exc
        return self._read()

    def _read(self) -> list[ShardEvent]:
        out: list[ShardEvent] = []

        def read() -> None:
            for name, pubsub in list(self._pubsubs.items()):
                if pubsub.connection is None:
                    continue
                msg = pubsub.get_message(timeout=0)
                while msg is not None:
                    self._handle(name, msg, out)
                    msg = pubsub.get_message(timeout=0)

        self._io(read)
        return out

    def _handle(self, name: str, msg: dict[str, Any], out: list[ShardEvent]) -> None:
        kind = msg.get("type")
        if kind not in ("smessage", "ssubscribe", "sunsubscribe"):
            return  # pong
        sid = self._keys.session_of_channel(_s(msg.get("channel", "")))
        if sid is None:
            return
        if kind == "smessage":
            out.append(ShardEvent("message", sid))
        elif kind == "ssubscribe":
            out.append(ShardEvent("live", sid))
        elif self._leaving.get(sid, 0) > 0:  # our SUNSUBSCRIBE, confirmed
            self._leaving[sid] -= 1
            if not self._leaving[sid]:
                del self._leaving[sid]
        else:  # the server dropped it: the slot moved to another node
            raise BackendUnavailableError(f"the subscription to {sid} was dropped by {name or 'Redis'}")

    def _io(self, fn: Callable[[], None]) -> None:
        try:
            redis_call(fn)
        except OSError as exc:
            raise BackendUnavailableError(f"notification channel lost: {exc}") from exc

    def close(self) -> None:
        for pubsub in self._pubsubs.values():
            try:
                pubsub.close()
            except Exception:  # noqa: BLE001 - closing a broken connection may fail any way
                pass
        self._pubsubs.clear()
        self._where.clear()
        self._leaving.clear()


def _sleep(timeout: float) -> None:
    time.sleep(max(0.0, timeout))


__all__ = ["AllChanges", "NotificationCalls", "ShardChanges", "ShardEvent", "Subscription"]
