"""Deleting a stream, and collecting the streams that forks no longer read.

A stream that forks still read is not removed when it is deleted: a *tombstone* record is
appended (the state folds it as ``deleted``: 410 for everyone, and no new forks), and its
data goes with its last fork. Forks register with their source in the store's one fork
registry (``store/protocol/forks.py``, whose docstring argues why no live fork is missed): a forker
registers, creates its header, then checks that its source is not deleted and undoes its
fork if it is; a delete commits its tombstone first and lists the registrations after.

*Collecting* an incarnation: once it is tombstoned, its registrations are listed and judged,
each by the header of the fork it names. A fork that is itself deleted or expired is deleted
first (which collects it, and drops its registration); a registration whose fork has no
header naming it is dead and dropped. With none live, the incarnation is removed, then its
own registration with its source, then the source is collected the same way, along the chain.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from store.errors import ContentionError, SessionNotFoundError, StreamNotFoundError
from store.protocol.forks import ForkRegistry, Registration
from store.streams.model import BATCH_TYPE, MAX_CAS_ATTEMPTS, StreamState
from store.streams.state import StreamStates

if TYPE_CHECKING:
    from store.protocol.api import Sessions
    from store.protocol.context import StoreContext


class StreamCollector:
    """Deletes streams and collects the ones no fork reads any more. Thread-safe. Built from
    the store's context and its public delete (``store``)."""

    def __init__(self, ctx: StoreContext, store: Sessions, states: StreamStates, forks: ForkRegistry) -> None:
        self.ctx = ctx
        self.store = store
        self.states = states
        self.forks = forks

    def delete_now(self, st: StreamState) -> None:
        """Delete the stream of ``st`` (a session: at once); collect it if no fork reads it."""
        sid = st.header.session_id
        if st.pi:
            try:
                # The life this caller read: a delete that paused never ends a newer one.
                self.store.delete_session(sid, incarnation=st.header.incarnation)
            except SessionNotFoundError:
                raise StreamNotFoundError(f"no stream {st.config.path!r}") from None
            self.states.forget(sid)
            return
        with self.states.sid_lock(sid):
            for _ in range(MAX_CAS_ATTEMPTS):
                if st.deleted:
                    break
                record = {
                    "type": BATCH_TYPE,
                    "id": uuid.uuid4().hex,
                    "parentId": None,
                    "at": int(time.time() * 1000),
                    "msgs": [],
                    "deleted": True,
                }
                # The tombstone first, the registrations after (store/protocol/forks.py): a fork whose
                # header comes later checks after this and backs out.
                if self.states.commit(st, record):
                    break
                st = self.states.refreshed(st.header)
            else:
                raise ContentionError(f"stream {st.config.path!r}: the tail kept moving; retry")
        self.ctx.fault("stream.delete.tombstoned", stream=st.config.path)
        self.collect(sid, st.header.incarnation)

    def has_forks(self, st: StreamState) -> bool:
        """Is any registration with ``st``'s incarnation left (after ``collect``: a live one)?"""
        return bool(self.forks.registrations(st.header.session_id, st.header.incarnation))

    def collect(self, sid: str, inc: str) -> None:
        """Remove incarnation ``inc`` of ``sid`` if it is tombstoned and no live fork reads it;
        then the same for the stream it was forked from."""
        store = self.store
        try:
            header = self.ctx.headers.read(sid)
        except SessionNotFoundError:
            return
        if header.incarnation != inc:
            return
        st = self.states.refreshed(header)
        if not st.deleted:
            return
        # Listed only now that the tombstone is known committed: a registration judged dead
        # below belongs to a forker that will check after its header and back out.
        live = False
        for reg in self.forks.registrations(sid, inc):
            if self._fork_reads(reg, sid, inc):
                live = True
        if live:
            return
        try:
            # Only the incarnation judged above: if this process paused since, the id may
            # have been removed by another collector and created again.
            store.delete_session(sid, incarnation=inc)
        except SessionNotFoundError:
            pass
        self.states.forget(sid)
        self.ctx.fault("stream.collect.deleted", stream=sid)
        cfg = st.config
        if cfg.fork_sid is not None and cfg.fork_inc is not None:
            # Its own registration only (its token): once its header is gone, the path may
            # have been forked again from the same source, with a registration of its own.
            self.forks.drop_own(cfg.fork_sid, cfg.fork_inc, sid, cfg.fork_ref)
            self.collect(cfg.fork_sid, cfg.fork_inc)

    def _fork_reads(self, reg: Registration, sid: str, inc: str) -> bool:
        """Does the fork ``reg`` names still read ``(sid, inc)``? Drops the registration if
        not; deletes a fork that is itself deleted or expired (its collection drops it)."""
        header = self.forks.fork_header(reg, sid, inc)
        if header is None:
            self.forks.drop([reg.key])
            return False
        try:
            st = self.states.refreshed(header)
        except StreamNotFoundError:
            return True  # not a state this process can fold: keep the source
        if not st.pi and (st.deleted or self.states.expired(st)):
            self.delete_now(st)  # its own collection drops its registration
            return bool(self.ctx.objects.head(reg.key))
        return True


__all__ = ["StreamCollector"]
