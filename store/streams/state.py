"""A stream's state, read up to its true tail through the core read path.

A stream's state (producers, Stream-Seq, closed, deleted, its tail offset) is folded from its
records (``StreamState.fold``). This process keeps the states it has folded and the segments
behind them (a ``SegmentCache``: a segment never changes within an incarnation), and brings a
state up to date with ``Reader.read_after``, the same read a follower makes: what Redis's tail
names in one parallel round, the probe of the slot after it, and Redis's retired slot asked
after that probe's 404 (``store/protocol/read.py``). A writer asks for no probe (``probe=False``): its
append is a compare-and-set on the last record it folded, so a segment Redis has not heard of
only costs it a retry (the append path rolls that segment forward).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from coordination.redis import TailState
from store.errors import (
    ConflictError,
    IdCollisionError,
    SessionNotFoundError,
    SessionStoreError,
    StreamNotFoundError,
)
from store.formats.records import Header
from store.protocol.segment_cache import SegmentCache, estimated_size
from store.streams.reads import DecodedMessages
from store.streams.model import PI_KIND, STREAM_KIND, StreamState, config_of, copy_state

if TYPE_CHECKING:
    from store.protocol.context import StoreContext
    from store.protocol.handles import SessionAppends
    from store.protocol.read import Reader

#: Segments a process meeting a stream for the first time fetches beside its header.
PREFETCH_SEGMENTS = 64


class StreamStates:
    """The stream states this process knows (at most ``cache_size``), and the segments behind
    them (at most ``cache_bytes``). Thread-safe. Built from the store's context, its read
    path and its public append (``store``)."""

    def __init__(
        self, ctx: StoreContext, reader: Reader, store: SessionAppends, *, cache_size: int, cache_bytes: int
    ) -> None:
        self.store = store
        self.ctx = ctx
        self.reader = reader
        self.segments = SegmentCache(cache_bytes)
        self.decoded = DecodedMessages()
        self._lock = threading.Lock()
        self._states: OrderedDict[str, StreamState] = OrderedDict()
        self._cache_size = cache_size
        self._sid_locks: dict[str, threading.Lock] = {}

    # --- header and Redis's tail -------------------------------------------------------------

    def header_and_tail(self, sid: str, path: str) -> tuple[Header, TailState | None]:
        """The header (cached while Redis names its incarnation) and Redis's tail, if any;
        ``StreamNotFoundError`` unless it is the stream (or session) named ``path``."""
        ctx = self.ctx
        header = ctx.headers.cached(sid)
        try:
            tail = ctx.coord.tail(sid)
        except SessionStoreError:
            tail = None
        if header is not None and (tail is None or tail.inc != header.incarnation):
            header = None
        if header is None:
            header = self._read_header(sid, path, tail)
        if header.kind == STREAM_KIND:
            if header.config.get("path") != path:
                raise StreamNotFoundError(f"no stream {path!r}")
        elif header.kind == PI_KIND:
            # A session is a stream too: under the name it was created with over HTTP, or
            # under its own id (an imported session has no recorded name).
            if header.config.get("path", path) != path:
                raise StreamNotFoundError(f"no stream {path!r}")
        else:
            raise StreamNotFoundError(f"no stream {path!r}")
        return header, tail

    def _read_header(self, sid: str, path: str, tail: TailState | None) -> Header:
        """GET the header; when Redis names the incarnation, the segments it lists come in
        the same parallel round (into the segment cache), so a process that meets a stream for
        the first time reads it in one round trip, not two."""
        prefetch: list[Future[Any]] = []
        if tail is not None and 0 < tail.seq <= PREFETCH_SEGMENTS:
            inc = tail.inc
            prefetch = [
                self.ctx.pool.submit(self.reader.get_segment, sid, inc, seq)
                for seq in range(1, tail.seq + 1)
            ]
        try:
            header = self.ctx.headers.read(sid)
        except SessionNotFoundError:
            raise StreamNotFoundError(f"no stream {path!r}") from None
        if prefetch and tail is not None and header.incarnation == tail.inc and header.kind == STREAM_KIND:
            for seq, fut in enumerate(prefetch, start=1):
                try:
                    got = fut.result()
                except SessionStoreError:
                    break
                if got is None or len(got[0]) != 1:
                    break
                self.segments.add(sid, header.incarnation, seq, got[0], got[1])
        return header

    # --- states -----------------------------------------------------------------------------

    def refreshed(
        self, header: Header, refresh: bool = True, *, tail: TailState | None = None, probe: bool = True
    ) -> StreamState:
        """The state of ``header``'s incarnation: as this process knew it, brought up to the
        true tail with ``refresh`` (``probe=False``: up to Redis's ``tail`` only)."""
        sid = header.session_id
        with self._lock:
            st = self._states.get(sid)
            if st is not None:
                self._states.move_to_end(sid)
        if st is None or st.header.incarnation != header.incarnation:
            st = StreamState(header=header, config=config_of(header, header.config.get("path", "")))
        else:
            st = copy_state(st)
        if not refresh:
            return st
        if st.pi and st.inherited < 0:
            # A session's first read: the entries it inherited count in its offsets.
            data = self.reader.read_session(sid)
            if data.header.incarnation != header.incarnation:
                raise StreamNotFoundError(f"no stream {st.config.path!r}")
            st.inherited = len(data.inherited)
            for seq, entry in zip(data.seqs, data.entries):
                st.fold(seq, entry)
            st.last_seq = max(st.last_seq, data.seq)
            self.remember(sid, st)
            return st
        hint = tail if tail is not None and tail.inc == header.incarnation else None
        through = hint.seq if hint is not None and not probe else None
        fresh, last = self.reader.read_after(
            sid, header, st.last_seq, through=through, tail=hint, cache=None if st.pi else self.segments
        )
        for seq, record in fresh:
            st.fold(seq, record)
        st.last_seq = max(st.last_seq, last)
        self.remember(sid, st)
        return st

    def cached(self, sid: str) -> StreamState | None:
        """A copy of the state this process holds (None: none)."""
        with self._lock:
            st = self._states.get(sid)
        return copy_state(st) if st is not None else None

    def remember(self, sid: str, st: StreamState) -> None:
        with self._lock:
            cur = self._states.get(sid)
            if cur is None or cur.header.incarnation != st.header.incarnation or cur.last_seq <= st.last_seq:
                self._states[sid] = copy_state(st)
                self._states.move_to_end(sid)
            while len(self._states) > self._cache_size:
                self._states.popitem(last=False)

    def forget(self, sid: str) -> None:
        with self._lock:
            self._states.pop(sid, None)
        self.segments.drop(sid)
        self.decoded.drop(sid)

    def sid_lock(self, sid: str) -> threading.Lock:
        """One lock a stream: this process's appends to it check and commit one at a time."""
        with self._lock:
            lock = self._sid_locks.get(sid)
            if lock is None:
                if len(self._sid_locks) > 4 * self._cache_size:
                    self._sid_locks.clear()
                lock = self._sid_locks[sid] = threading.Lock()
            return lock

    def commit(self, st: StreamState, record: dict[str, Any]) -> bool:
        """Append ``record`` if the tail is still ``st``'s; fold it in. False if it moved."""
        sid, inc = st.header.session_id, st.header.incarnation
        try:
            result = self.store.append_session_entries(sid, [record], st.last_id, incarnation=inc)
        except (ConflictError, IdCollisionError):
            # The tail moved (or the same producer batch was committed with other content
            # by a concurrent request): check again against the new state.
            return False
        if result.seq != st.last_seq + 1:
            # A re-send met its own earlier commit: the state has moved past it.
            return False
        st.fold(result.seq, record)
        self.remember(sid, st)
        self.segments.add(sid, inc, result.seq, [record], estimated_size([record]))
        return True

    # --- time to live ------------------------------------------------------------------------

    def expired(self, st: StreamState) -> bool:
        now = int(time.time() * 1000)
        cfg = st.config
        if cfg.expires_at_ms is not None and now >= cfg.expires_at_ms:
            return True
        if cfg.ttl_s is not None:
            try:
                last = self.ctx.coord.last_access(st.header.session_id, st.header.incarnation)
            except SessionStoreError:
                return False  # cannot tell: never expire a stream early
            if last is None:
                # Redis lost it (or never had it): count from now rather than expire early.
                self.touch(st)
                return False
            return now >= last + cfg.ttl_s * 1000
        return False

    def touch(self, st: StreamState) -> None:
        """This counts as an access for a sliding TTL."""
        if st.config.ttl_s is None:
            return
        try:
            self.ctx.coord.touch_access(st.header.session_id, st.header.incarnation, int(time.time() * 1000))
        except SessionStoreError:
            pass  # the TTL only slides later: never a reason to fail a read or a write


__all__ = ["PREFETCH_SEGMENTS", "StreamStates"]
