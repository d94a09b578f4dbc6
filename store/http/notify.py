"""Wake-ups for live reads: one Redis pub/sub connection a process, shared by every waiter.

A long-poll or an SSE reader at the tail of a stream waits on an :class:`asyncio.Event`
registered here; a background thread holds one pattern subscription to every session's
``changes`` channel (one message per committed segment, published by the append's COMMIT)
and sets the events of the session announced. Appends made by any process on any machine
therefore wake readers everywhere, and S3 is never polled.

A notification only says *when* to look. What a woken reader returns is read from the object
store with the read path's checks; a lost notification (Redis restarted, the connection
dropped) costs a waiter at most its own timeout, and when the connection is lost every
waiter is woken to look once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import defaultdict

from coordination.redis import AllChanges, Coordinator
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
        #: Set once the subscription is up (tests and start-up wait for it).
        self.ready = threading.Event()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sessionstore-notify", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._wake_all()

    def watch(self, sid: str) -> asyncio.Event:
        """An event set at the next notification for ``sid``. Register before checking the
        stream, so that nothing committed after the check is missed; :meth:`unwatch` after."""
        ev = asyncio.Event()
        with self._lock:
            self._waiters[sid].add((asyncio.get_running_loop(), ev))
        return ev

    def unwatch(self, sid: str, ev: asyncio.Event) -> None:
        with self._lock:
            waiters = self._waiters.get(sid)
            if waiters is None:
                return
            for item in [w for w in waiters if w[1] is ev]:
                waiters.discard(item)
            if not waiters:
                del self._waiters[sid]

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

    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                if self._sub is None:
                    self._sub = self._coord.subscribe_all()
                    self.ready.set()
                    backoff = 0.1
                for sid in self._sub.wait(0.5):
                    self.notify(sid)
            except SessionStoreError as exc:
                log.warning("change notifications lost (%s): reconnecting", exc)
                if self._sub is not None:
                    self._sub.close()
                    self._sub = None
                self._wake_all()
                self._stop.wait(backoff)
                backoff = min(5.0, backoff * 2)
        if self._sub is not None:
            self._sub.close()
            self._sub = None


__all__ = ["Notifier"]
