"""Live follow: every entry committed to a session, from any writer anywhere, as it lands.

One :class:`Follower` holds the protocol; ``SessionStore.follow`` (a blocking iterator) and
``AsyncSessionStore.follow`` (an async iterator, ``store/aio.py``) are two drivers of the same
three steps: :meth:`Follower.open`, then :meth:`Follower.poll` (what is new) and
:meth:`Follower.wait` (until there may be news) in turn, then :meth:`Follower.close`.

Notifications (Redis pub/sub) only say when to look; what is yielded is read from the object
store with the read path's own checks (``Reader.read_after``), so a lost notification (Redis
restarted, a dropped message) delays an entry by at most the poll interval, and nothing is
skipped or yielded twice. A session deleted and created again is followed into its new life
from its first segment; while it does not exist, the follower waits, like ``tail -F``.

A follower paused for any length of time carries on from the last segment it yielded: the
next poll reads everything after it (compacted or not) with the read path's checks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from coordination.redis import Subscription
from store.errors import BackendError, SessionNotFoundError
from store.formats.layout import check_session_id
from store.formats.records import Header

if TYPE_CHECKING:
    from store.protocol.context import StoreContext
    from store.protocol.read import Reader

log = logging.getLogger("sessionstore")

#: Every this many quiet wakes (no notification), a follower reads in full instead of one
#: HEAD of the next segment: the next slot may have been compacted away while a
#: notification was lost.
FULL_READ_EVERY = 10


class Follower:
    """The state of one follow of one session. Not thread-safe: one driver calls it."""

    def __init__(
        self,
        ctx: StoreContext,
        reader: Reader,
        session_id: str,
        *,
        after_seq: int | None,
        last_seq: Callable[[str], int],
    ) -> None:
        """``last_seq(session_id)``: the segment a follow without ``after_seq`` starts after
        (the store's read of the session as a user sees it: ``SessionStore.follower``)."""
        self.ctx = ctx
        self.reader = reader
        self._last_seq = last_seq
        self.session_id = check_session_id(session_id)
        self._after_seq = after_seq
        self._sub: Subscription | None = None
        self._header: Header | None = None
        self.last = 0
        self._announced = True
        self._quiet = 0

    def open(self) -> None:
        """Subscribe, then fix the starting point (``SessionNotFoundError`` if the session does
        not exist). Subscribing first: anything committed after it is in the first poll's read
        or announced."""
        self._sub = self._subscribe()
        try:
            self._header = self.ctx.headers.read(self.session_id)
            self.last = self._after_seq if self._after_seq is not None else self._last_seq(self.session_id)
        except BaseException:
            self.close()
            raise

    def poll(self) -> list[tuple[int, dict[str, Any]]]:
        """``(seq, entry)`` of everything committed after the last segment returned.

        A quiet wake (no notification) costs one HEAD of the next segment; news, every
        ``FULL_READ_EVERY``-th quiet wake and polling without Redis pay for a whole read.
        """
        assert self._header is not None, "open() first"
        sid = self.session_id
        self._quiet = 0 if self._announced else self._quiet + 1
        full = self._announced or self._quiet % FULL_READ_EVERY == 0
        while True:
            fresh: list[tuple[int, dict[str, Any]]] = []
            if full or self._next_segment_exists():
                fresh, self.last = self.reader.read_after(sid, self._header, self.last)
            if fresh or self._same_incarnation():
                return fresh
            current = self._header_or_none()
            if current is None or current.incarnation == self._header.incarnation:
                return fresh
            # Deleted and created again: follow the new life from its first segment.
            self._header, self.last, full = current, 0, True

    def wait(self, timeout: float) -> None:
        """Block up to ``timeout`` s, or until a notification says there may be news."""
        if self._sub is None:
            self._announced = True  # polling without notifications: every wake reads
            time.sleep(max(0.0, timeout))
            self._sub = self._subscribe()
            return
        try:
            self._announced = self._sub.wait(timeout) is not None
        except BackendError:
            self._announced = True
            self._sub.close()
            self._sub = None

    def close(self) -> None:
        if self._sub is not None:
            self._sub.close()
            self._sub = None

    # --- helpers -----------------------------------------------------------------------------

    def _next_segment_exists(self) -> bool:
        assert self._header is not None
        ctx = self.ctx
        key = ctx.layout.segment(self.session_id, self._header.incarnation, self.last + 1)
        try:
            return ctx.options.retry.call(lambda: ctx.objects.head(key)) is not None
        except BackendError:
            return True  # cannot tell cheaply: let the read decide

    def _header_or_none(self) -> Header | None:
        try:
            return self.ctx.headers.read(self.session_id)
        except SessionNotFoundError:
            return None

    def _same_incarnation(self) -> bool:
        """Does Redis still name our incarnation? (False when it cannot say.)"""
        assert self._header is not None
        try:
            state = self.ctx.coord.tail(self.session_id)
        except BackendError:
            return False
        return state is not None and state.inc == self._header.incarnation

    def _subscribe(self) -> Subscription | None:
        try:
            return self.ctx.coord.subscribe(self.session_id)
        except BackendError as exc:
            log.info("notifications for %s unavailable (%s): polling", self.session_id, exc)
            return None


def follow(
    follower: Follower, *, poll_s: float = 1.0, timeout_s: float | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """The blocking driver (``SessionStore.follow``): ``(seq, entry)`` as ``follower``
    finds them, waiting up to ``poll_s`` between polls, until the caller stops iterating or
    ``timeout_s`` has passed; the follower is closed either way."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    follower.open()
    try:
        while True:
            yield from follower.poll()
            wait = poll_s
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return
            follower.wait(wait)
    finally:
        follower.close()


__all__ = ["FULL_READ_EVERY", "Follower", "follow"]
