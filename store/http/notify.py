"""Wake-ups for live reads: one Redis pub/sub subscriber a process, shared by every waiter.

A long-poll or an SSE reader at the tail of a stream waits on an :class:`asyncio.Event`
registered here. A background thread reads the sessions' ``changes`` channels (one message
per committed segment, published by the append's COMMIT) and sets the events of the session
announced. Appends made by any process on any machine therefore wake readers everywhere, and
S3 is never polled.

How the thread subscribes depends on the Redis version (``Coordinator.sharded_pubsub``):

- Redis 6.2 (PUBLISH): one pattern subscription to every session's channel, on one
  connection.
- Redis >= 7.0 (SPUBLISH): there are no sharded pattern subscriptions. The thread sends
  SSUBSCRIBE for exactly the sessions that have waiters in this process, on one connection
  per node that owns one of them (standalone: one connection), and SUNSUBSCRIBE, lazily, for
  sessions whose last waiter left. On a Redis Cluster a notification then stays on the node
  that owns the session's slot.

A notification only says *when* to look. What a woken reader returns is read from the object
store with the read path's checks. Readers register (:meth:`Notifier.watch`) before they
check the stream, clear their event before each check and wait after it.

Why no commit is missed. ``watch`` does not wait for the subscription; instead every waiter
is woken, to look again, each time the server confirms a subscription that covers it (the
pattern's, or its session's SSUBSCRIBE), and every waiter is woken when a connection is lost.
A notification can only be missed while the server holds no subscription for the session:
before the first confirmation, or between a lost connection (or a SUNSUBSCRIBE) and the next
confirmation. Every such window is closed by a confirmation that the server sends after it
has processed everything of the window, so a commit made in the window is in Redis before
the confirmation; the waiter woken by that confirmation checks the stream after it and finds
the commit. A waiter that registers while a subscription is live needs no wake: its own check
comes after its registration, and the subscription stays until no waiter is left (the thread
decides to unsubscribe under the same lock that ``watch`` takes, and a ``watch`` after that
decision asks for a new subscription, whose confirmation wakes it). Pauses change none of
this: a thread paused before waking only delays the wake, and an event set while its reader
reads makes the reader look once more.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections import defaultdict

from coordination.redis import AllChanges, Coordinator, ShardChanges
from store.errors import SessionStoreError

log = logging.getLogger("sessionstore.http")


class Notifier:
    """Per-process fan-out of change notifications to asyncio waiters."""

    def __init__(self, coord: Coordinator) -> None:
        self._coord = coord
        self._lock = threading.Lock()
        self._waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = defaultdict(set)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sub: AllChanges | None = None
        self._shards: ShardChanges | None = None
        #: Sharded mode: sessions with an SSUBSCRIBE sent on the current connections and no
        #: SUNSUBSCRIBE since (True once confirmed). Changed by the thread under the lock.
        self._subs: dict[str, bool] = {}
        # watch() wakes the thread from its wait through this pair, to subscribe at once.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        #: Set once notifications flow: the pattern subscription is confirmed (6.2), or the
        #: thread is ready to subscribe sessions (sharded).
        self.ready = threading.Event()
        #: Which way notifications come: None until the thread knows, then True (sharded).
        self.sharded: bool | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sessionstore-notify", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._poke()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._wake_all()
        for sock in (self._wake_r, self._wake_w):
            sock.close()

    def watch(self, sid: str) -> asyncio.Event:
        """An event set at the next notification for ``sid`` (and, to look again, when the
        subscription covering ``sid`` is confirmed). Register before checking the stream, so
        that nothing committed after the check is missed; :meth:`unwatch` after."""
        ev = asyncio.Event()
        with self._lock:
            self._waiters[sid].add((asyncio.get_running_loop(), ev))
            ask = self.sharded is not False and sid not in self._subs
        if ask:
            self._poke()
        return ev

    def unwatch(self, sid: str, ev: asyncio.Event) -> None:
        # The thread unsubscribes a session without waiters on its next round (lazily: a
        # reader that comes back at once finds the subscription still there).
        with self._lock:
            waiters = self._waiters.get(sid)
            if waiters is None:
                return
            for item in [w for w in waiters if w[1] is ev]:
                waiters.discard(item)
            if not waiters:
                del self._waiters[sid]

    def subscribed(self) -> dict[str, bool]:
        """Sharded mode: the sessions subscribed (True: confirmed by the server)."""
        with self._lock:
            return dict(self._subs)

    def notify(self, sid: str) -> None:
        """Wake the waiters of ``sid`` (also called by this process's own writes, so that a
        reader here wakes even before Redis's message arrives)."""
        with self._lock:
            waiters = list(self._waiters.get(sid, ()))
        for loop, ev in waiters:
            try:
                loop.call_soon_threadsafe(ev.set)
            except RuntimeError:  # the loop is closed
                pass

    def _wake_all(self) -> None:
        with self._lock:
            sids = list(self._waiters)
        for sid in sids:
            self.notify(sid)

    def _poke(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:  # full (the thread is awake anyway) or closed
            pass

    def _drain_pokes(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:  # nothing left
            pass

    def _run(self) -> None:
        backoff = 0.1
        lost = False
        while not self._stop.is_set():
            try:
                if self.sharded is None:
                    sharded = self._coord.sharded_pubsub()
                    with self._lock:
                        self.sharded = sharded
                if self.sharded:
                    self._run_sharded(refresh=lost)
                else:
                    self._run_pattern()
            except SessionStoreError as exc:
                log.warning("change notifications lost (%s): reconnecting", exc)
                lost = True
                self._close_subscriptions()
                self._wake_all()
                self._stop.wait(backoff)
                backoff = min(5.0, backoff * 2)
                continue
            backoff = 0.1
        self._close_subscriptions()

    def _close_subscriptions(self) -> None:
        with self._lock:
            self._subs.clear()
        for sub in (self._sub, self._shards):
            if sub is not None:
                sub.close()
        self._sub = None
        self._shards = None

    def _run_pattern(self) -> None:
        """Redis 6.2: one pattern subscription; a round of at most 0.5 s."""
        if self._sub is None:
            self._sub = self._coord.subscribe_all()
        was_live = self._sub.live
        sids = self._sub.wait(0.5)
        if self._sub.live and not was_live:
            self.ready.set()
            self._wake_all()  # confirmed: everyone looks once (see the module doc)
        for sid in sids:
            self.notify(sid)

    def _run_sharded(self, *, refresh: bool) -> None:
        """Redis >= 7.0: one round of subscribing, unsubscribing and reading (<= 0.5 s)."""
        if self._shards is None:
            self._shards = self._coord.subscribe_shards(refresh=refresh)
            self.ready.set()
        shards = self._shards
        self._drain_pokes()  # before reading what to do: a later poke is seen next round
        with self._lock:
            wanted = [sid for sid in self._waiters if sid not in self._subs]
            unwanted = [sid for sid in self._subs if sid not in self._waiters]
            for sid in wanted:
                self._subs[sid] = False
            for sid in unwanted:
                del self._subs[sid]
        for sid in unwanted:
            shards.unsubscribe(sid)
        for sid in wanted:
            shards.subscribe(sid)
        for event in shards.wait(0.5, self._wake_r):
            if event.kind == "live":
                with self._lock:
                    if event.sid in self._subs:
                        self._subs[event.sid] = True
                self.notify(event.sid)  # confirmed: its waiters look once (module doc)
            else:
                self.notify(event.sid)


__all__ = ["Notifier"]
