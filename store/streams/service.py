"""``Streams``: durable streams on one ``SessionStore``: create (and fork), append, read, delete.

The stream's rules (``store/streams/__init__.py``) on the store's log: each method reads the
stream's state (``StreamStates``: folded from its records, brought to the true tail through
the core read path), checks the request against it, and writes with a compare-and-set on the
tail record its checks read.
"""

from __future__ import annotations

import base64
import hashlib
import time
import uuid
from typing import TYPE_CHECKING, Any

from store.errors import (
    ConflictError,
    ContentionError,
    ContentTypeMismatchError,
    IdCollisionError,
    InvalidOffsetError,
    ProducerEpochSeqError,
    ProducerSeqGapError,
    SessionExistsError,
    SessionNotFoundError,
    StaleEpochError,
    StreamClosedError,
    StreamError,
    StreamExistsError,
    StreamGoneError,
    StreamNotFoundError,
    StreamSeqConflictError,
    TailMismatchError,
)
from store.protocol.forks import ForkRegistry
from store.protocol.read import Reader
from store.formats.layout import new_ref_token
from store.formats.records import Header
from store.protocol.segment_cache import estimated_size
from store.streams.collect import StreamCollector
from store.streams.model import (
    BATCH_TYPE,
    DEFAULT_CONTENT_TYPE,
    MAX_CAS_ATTEMPTS,
    PI_KIND,
    PLAIN_PREFIX,
    SESSION_CONTENT_TYPE,
    START,
    STREAM_KIND,
    AppendOutcome,
    Offset,
    Producer,
    ReadResult,
    StreamConfig,
    StreamInfo,
    StreamState,
    config_of,
    media_type,
    same_config,
)
from store.streams.reads import DEFAULT_MAX_BYTES, StreamReads
from store.streams.state import StreamStates

if TYPE_CHECKING:
    from store.core import SessionStore

#: Bytes of segments a process keeps for readers (``SegmentCache``).
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024


class Streams:
    """Durable streams on one :class:`~store.core.SessionStore`. Thread-safe."""

    def __init__(
        self, store: SessionStore, *, cache_size: int = 4096, cache_bytes: int = DEFAULT_CACHE_BYTES
    ) -> None:
        self.store = store
        self.ctx = ctx = store.ctx
        reader = Reader(ctx)  # the read path holds nothing but the context: built from it
        self.states = StreamStates(ctx, reader, store, cache_size=cache_size, cache_bytes=cache_bytes)
        self.forks = ForkRegistry(ctx.layout, ctx.objects, ctx.options.retry, ctx.headers)
        self.collector = StreamCollector(ctx, store, self.states, self.forks)
        self.reads = StreamReads(reader, ctx.headers, self.states.segments, self.states.decoded)

    # --- create ------------------------------------------------------------------------------

    def create(
        self,
        path: str,
        *,
        content_type: str | None = None,
        ttl_s: int | None = None,
        expires_at_ms: int | None = None,
        expires_at: str | None = None,
        fork_from: str | None = None,
        fork_offset: Offset | None = None,
        fork_sub: int = 0,
        msgs: list[Any] | None = None,
        close: bool = False,
        kind: str = STREAM_KIND,
        cwd: str | None = None,
    ) -> tuple[bool, StreamInfo]:
        """Create a stream, or find it created with the same settings: ``(created, info)``.

        ``kind=PI_KIND`` creates a pi session (``msgs``: its first entries; ``cwd`` in its
        header) readable and writable as a stream of entries.

        ``StreamExistsError`` when it exists with other settings (or was deleted while forks
        still read it). A fork (``fork_from``) reads its source up to ``fork_offset`` (default:
        the source's tail), then the first ``fork_sub`` bytes (JSON: values) of the source's
        next append, copied, then its own appends; nothing else is copied."""
        sid = self.store.layout.stream_id(path)
        if kind == PI_KIND:
            return self._create_session(sid, path, msgs, cwd, content_type, fork_from, ttl_s, expires_at_ms, close)
        if kind != STREAM_KIND:
            raise StreamError(f"unknown stream kind {kind!r}")
        if fork_from is None:
            config = StreamConfig(
                path=path,
                content_type=content_type or DEFAULT_CONTENT_TYPE,
                ttl_s=ttl_s,
                expires_at_ms=expires_at_ms,
                expires_at=expires_at,
                created_closed=close,
            )
            return self._create(sid, config, msgs, close, requested_offset=True)
        try:
            src = self.state(fork_from, touch=False)
        except StreamGoneError:
            raise StreamExistsError(f"stream {fork_from!r} was deleted: no new forks") from None
        if fork_offset is None:
            given_offset = False
            fork_offset = src.tail
        else:
            given_offset = True
            if fork_offset > src.tail:
                raise InvalidOffsetError("the fork offset is beyond the source stream's tail")
        if content_type is None:
            content_type = src.config.content_type
        elif media_type(content_type) != media_type(src.config.content_type):
            raise ContentTypeMismatchError("a fork keeps its source's content type")
        if ttl_s is None and expires_at_ms is None:
            ttl_s, expires_at_ms, expires_at = src.config.ttl_s, src.config.expires_at_ms, src.config.expires_at
        prefix: list[Any] = []
        if fork_sub:
            first = self.reads.first_batch_after(src, fork_offset)
            if first is None:
                raise InvalidOffsetError("no append after the fork offset to take a sub-offset of")
            size = len(first.messages) if src.config.json else len(first.messages[0])
            if fork_sub > size:
                raise InvalidOffsetError(f"sub-offset {fork_sub} is past the append's {size}")
            prefix = first.messages[:fork_sub] if src.config.json else [first.messages[0][:fork_sub]]
        config = StreamConfig(
            path=path,
            content_type=content_type,
            ttl_s=ttl_s,
            expires_at_ms=expires_at_ms,
            expires_at=expires_at,
            fork_sid=src.header.session_id,
            fork_inc=src.header.incarnation,
            fork_offset=fork_offset,
            fork_sub=fork_sub,
            fork_ref=new_ref_token(),
            created_closed=close,
        )
        return self._create_fork(sid, config, fork_from, given_offset, prefix, msgs, close)

    def _create_fork(
        self,
        sid: str,
        config: StreamConfig,
        fork_from: str,
        given_offset: bool,
        prefix: list[Any],
        msgs: list[Any] | None,
        close: bool,
    ) -> tuple[bool, StreamInfo]:
        """Register with the source, create the header, then check the source: the store's
        one fork protocol (``store/protocol/forks.py``). A source deleted before the check (its
        tombstone committed) undoes the fork; one deleted after it waits for the fork."""
        path, src_sid, src_inc = config.path, config.fork_sid or "", config.fork_inc or ""
        ref_key, made_ref = self.forks.register(src_sid, src_inc, sid, config.fork_ref)
        self.ctx.fault("stream.fork.registered", stream=path, source=fork_from)
        try:
            created, info = self._create(sid, config, None, False, requested_offset=given_offset)
        except BaseException:
            if made_ref:
                self._drop_ref_unless_forked(ref_key, sid, config)
            raise
        if not created:
            if made_ref:
                self.forks.drop([ref_key])  # the stream existed (the same create): its own ref holds
            return created, info
        self.ctx.fault("stream.fork.created", stream=path, source=fork_from)
        try:
            self.state(fork_from, touch=False)
        except (StreamGoneError, StreamNotFoundError):
            # Deleted before our check, so perhaps before our header: the delete may not have
            # seen us. Undo (which collects the source our registration kept).
            self.collector.delete_now(self.state(path, touch=False, allow_gone=True))
            raise StreamExistsError(f"stream {fork_from!r} was deleted: no new forks") from None
        self.ctx.fault("stream.fork.checked", stream=path, source=fork_from)
        if prefix:
            self.append(path, prefix, content_type=config.content_type)
        if msgs or close:
            self.append(path, msgs or [], content_type=config.content_type, close=close)
        if prefix or msgs or close:
            info = self.info(path)
        return True, info

    def _create_session(
        self,
        sid: str,
        path: str,
        entries: list[Any] | None,
        cwd: str | None,
        content_type: str | None,
        fork_from: str | None,
        ttl_s: int | None,
        expires_at_ms: int | None,
        close: bool,
    ) -> tuple[bool, StreamInfo]:
        if fork_from is not None or ttl_s is not None or expires_at_ms is not None or close:
            raise StreamError("a session is created without fork, TTL or close headers "
                              "(fork one with the :fork action)")
        if content_type is not None and media_type(content_type) != SESSION_CONTENT_TYPE:
            raise ContentTypeMismatchError("a session holds application/json entries")
        try:
            self.store.create_session(sid, cwd=cwd, kind=PI_KIND, config={"path": path})
        except SessionExistsError:
            existing = self.state(path, touch=False)
            if not existing.pi:
                raise StreamExistsError(f"{path!r} is a stream, not a session") from None
            return False, self._info(existing)
        if entries:
            self.append(path, entries, content_type=SESSION_CONTENT_TYPE)
        return True, self.info(path)

    def _create(
        self, sid: str, config: StreamConfig, msgs: list[Any] | None, close: bool, *, requested_offset: bool
    ) -> tuple[bool, StreamInfo]:
        path = config.path
        try:
            handle = self.store.create_session(sid, kind=STREAM_KIND, config=config.to_json())
        except SessionExistsError:
            try:
                existing = self.state(path, touch=False, allow_gone=True)
            except StreamNotFoundError:
                raise StreamExistsError(f"stream {path!r} is being replaced; retry") from None
            if existing.deleted:
                raise StreamExistsError(f"stream {path!r} was deleted while forks read it") from None
            if existing.pi:
                raise StreamExistsError(f"{path!r} is a session, not a stream") from None
            if not same_config(existing.config, config, requested_offset) or existing.closed != (
                existing.closed and config.created_closed
            ):
                raise StreamExistsError(f"stream {path!r} exists with other settings") from None
            return False, self._info(existing)
        state = StreamState(header=handle.header, config=config)
        self.states.remember(sid, state)
        self.states.touch(state)
        if not (msgs or close):
            return True, self._info(state)  # known to be empty: nothing to read
        self.append(path, msgs or [], content_type=config.content_type, close=close)
        return True, self.info(path, touch=False)

    def _drop_ref_unless_forked(self, key: str, sid: str, config: StreamConfig) -> None:
        """After a failed fork create: drop our registration unless the stream at that path is
        a fork of the same source (whose registration it is too)."""
        try:
            header = self.ctx.headers.read(sid)
            fork = header.config.get("fork") or {}
            if (fork.get("sid"), fork.get("inc"), fork.get("ref")) == (config.fork_sid, config.fork_inc, config.fork_ref):
                return  # our create landed after all
        except SessionNotFoundError:
            pass
        self.forks.drop([key])

    # --- state -------------------------------------------------------------------------------

    def state(
        self,
        path: str,
        *,
        refresh: bool = True,
        touch: bool = True,
        allow_gone: bool = False,
        probe: bool = True,
    ) -> StreamState:
        """The stream's state, read up to its true tail.

        ``StreamNotFoundError`` if there is none (or it expired), ``StreamGoneError`` if it
        was deleted while forks read it (unless ``allow_gone``). ``touch``: this counts as an
        access for a sliding TTL. ``probe=False`` (writers): up to Redis's tail, without
        looking for a segment Redis has not heard of; the append's compare-and-set finds such
        a segment anyway."""
        sid = self.store.layout.stream_id(path)
        header, tail = self.states.header_and_tail(sid, path)
        st = self.states.refreshed(header, refresh, tail=tail, probe=probe)
        if st.deleted:
            if allow_gone:
                return st
            self.collector.collect(sid, header.incarnation)
            raise StreamGoneError(f"stream {path!r} was deleted")
        if self.states.expired(st):
            self.collector.delete_now(st)
            if self.collector.has_forks(st):
                raise StreamGoneError(f"stream {path!r} expired")
            raise StreamNotFoundError(f"stream {path!r} expired")
        if touch:
            self.states.touch(st)
        return st

    def header_of(self, path: str) -> Header:
        """The header of the stream or session named ``path`` (``StreamNotFoundError``)."""
        return self.states.header_and_tail(self.store.layout.stream_id(path), path)[0]

    # --- append ------------------------------------------------------------------------------

    def append(
        self,
        path: str,
        msgs: list[Any],
        *,
        content_type: str | None,
        producer: Producer | None = None,
        stream_seq: str | None = None,
        close: bool = False,
        if_match: str | None = None,
    ) -> AppendOutcome:
        """Append ``msgs`` (JSON values, or one ``bytes`` for a non-JSON stream) as one batch;
        ``close`` closes the stream with it (``msgs`` may then be empty).

        Checks (closed, content type, producer epoch and sequence, Stream-Seq) are made
        against the tail the append is then conditioned on, so they hold at the commit.
        ``if_match``: append only if the tail is this offset (a session: this entry id, ``""``
        for none); ``TailMismatchError`` with the actual one otherwise."""
        sid = self.store.layout.stream_id(path)
        if producer is None and stream_seq is None and not close and if_match is None and msgs:
            fast = self._plain_append(path, sid, msgs, content_type)
            if fast is not None:
                return fast
        with self.states.sid_lock(sid):
            for _ in range(MAX_CAS_ATTEMPTS):
                st = self.state(path, probe=False)
                if st.pi:
                    return self._append_entries(st, msgs, content_type, producer, stream_seq, close, if_match)
                outcome = self._check(st, msgs, content_type, producer, stream_seq, close)
                if outcome is None and if_match is not None:
                    expected = START if if_match == "-1" else Offset.parse(if_match)
                    if st.tail != expected:
                        raise TailMismatchError(f"the tail is {st.tail}, not {expected}", str(st.tail))
                if outcome is not None:
                    return outcome
                record = self._record(st, msgs, producer, stream_seq, close)
                if self.states.commit(st, record):
                    return AppendOutcome(
                        next_offset=st.tail,
                        closed=st.closed,
                        producer=st.producers.get(producer.id) if producer else None,
                    )
        raise ContentionError(f"stream {path!r}: the tail kept moving; retry")

    def _plain_append(
        self, path: str, sid: str, msgs: list[Any], content_type: str | None
    ) -> AppendOutcome | None:
        """An append of messages only, without reading the records this process has not seen:
        when Redis's tail record is a plain append (or there is none), the stream is neither
        closed nor deleted, and the append is a compare-and-set on that record, so a tail that
        moved (a close committed meanwhile, or one Redis has not heard of: the PUT meets its
        segment) refuses it. None: take the general path (it reads the state and decides)."""
        header, tail = self.states.header_and_tail(sid, path)
        if header.kind != STREAM_KIND or tail is None or tail.inc != header.incarnation:
            return None
        if tail.last and not tail.last.startswith(PLAIN_PREFIX):
            return None
        st = StreamState(header=header, config=config_of(header, path))
        if content_type is not None and media_type(content_type) != media_type(st.config.content_type):
            raise ContentTypeMismatchError(
                f"stream {path!r} holds {st.config.content_type}, not {content_type}"
            )
        if self.states.expired(st):
            return None
        record = self._record(st, msgs, None, None, False)
        try:
            result = self.store.append_session_entries(
                sid, [record], tail.last, incarnation=header.incarnation
            )
        except (ConflictError, IdCollisionError):
            return None
        self.states.touch(st)
        cached = self.states.cached(sid)
        if cached is not None and cached.header.incarnation == header.incarnation \
                and cached.last_seq == result.seq - 1 and cached.last_id == tail.last:
            cached.fold(result.seq, record)
            self.states.remember(sid, cached)
        self.states.segments.add(sid, header.incarnation, result.seq, [record], estimated_size([record]))
        return AppendOutcome(next_offset=Offset(st.config.base + result.seq, len(msgs)), closed=False)

    def _append_entries(
        self,
        st: StreamState,
        entries: list[Any],
        content_type: str | None,
        producer: Producer | None,
        stream_seq: str | None,
        close: bool,
        if_match: str | None,
    ) -> AppendOutcome:
        """A session's append: the store's own, entry ids the idempotency key (a re-sent
        batch returns its first result), ``if_match`` the expected tail entry id."""
        if producer is not None or stream_seq is not None or close:
            raise StreamError(
                "a session takes entry ids as its idempotency key and is never closed: "
                "no Producer-*, Stream-Seq or Stream-Closed"
            )
        if content_type is not None and media_type(content_type) != SESSION_CONTENT_TYPE:
            raise ContentTypeMismatchError(f"session {st.config.path!r} holds application/json entries")
        if not entries:
            raise StreamError("an append needs at least one entry")
        sid = st.header.session_id
        try:
            # alone: the batch starts its segment, so (seq, count) is the offset after it.
            result = self.store.append_session_entries(
                sid, entries, if_match, incarnation=st.header.incarnation, alone=True
            )
        except ConflictError as exc:
            now = self.states.refreshed(st.header, True)
            raise TailMismatchError(
                f"the tail entry is {exc.actual_tail_entry_id!r}, not {if_match!r}",
                str(now.tail),
                entry_id=exc.actual_tail_entry_id or "",
            ) from None
        return AppendOutcome(next_offset=Offset(result.seq, result.appended_count), closed=False)

    def _check(
        self,
        st: StreamState,
        msgs: list[Any],
        content_type: str | None,
        producer: Producer | None,
        stream_seq: str | None,
        close: bool,
    ) -> AppendOutcome | None:
        """None when the append may go ahead; an outcome when it is a duplicate; raises when
        it is refused."""
        if st.closed:
            if producer is not None and st.closed_by == (producer.id, producer.epoch, producer.seq):
                cur = st.producers.get(producer.id)
                return AppendOutcome(st.tail, True, duplicate=True, producer=cur)
            if close and not msgs and producer is None:
                return AppendOutcome(st.tail, True, duplicate=True)
            if producer is not None:
                cur = st.producers.get(producer.id)
                if cur is not None and producer.epoch < cur[0]:
                    raise StaleEpochError(f"producer epoch {producer.epoch} is stale", cur[0])
            raise StreamClosedError(f"stream {st.config.path!r} is closed", str(st.tail))
        if msgs and content_type is not None and media_type(content_type) != media_type(st.config.content_type):
            raise ContentTypeMismatchError(
                f"stream {st.config.path!r} holds {st.config.content_type}, not {content_type}"
            )
        if producer is not None:
            cur = st.producers.get(producer.id)
            if cur is not None:
                epoch, seq = cur
                if producer.epoch < epoch:
                    raise StaleEpochError(f"producer epoch {producer.epoch} is stale", epoch)
                if producer.epoch == epoch:
                    if producer.seq <= seq:
                        return AppendOutcome(st.tail, st.closed, duplicate=True, producer=cur)
                    if producer.seq != seq + 1:
                        raise ProducerSeqGapError("producer sequence gap", seq + 1, producer.seq)
                elif producer.seq != 0:
                    raise ProducerEpochSeqError("a new producer epoch starts at seq 0")
            elif producer.seq != 0:
                raise ProducerSeqGapError("producer sequence gap", 0, producer.seq)
        if stream_seq is not None and st.stream_seq is not None and stream_seq.encode() <= st.stream_seq.encode():
            raise StreamSeqConflictError(f"Stream-Seq {stream_seq!r} is not after {st.stream_seq!r}")
        return None

    def _record(
        self,
        st: StreamState,
        msgs: list[Any],
        producer: Producer | None,
        stream_seq: str | None,
        close: bool,
    ) -> dict[str, Any]:
        if producer is not None:
            digest = hashlib.blake2b(
                f"{producer.id}\0{producer.epoch}\0{producer.seq}".encode("utf-8", "surrogatepass"),
                digest_size=16,
            ).hexdigest()
            rid = "p." + digest
        elif stream_seq is None and not close:
            rid = PLAIN_PREFIX + uuid.uuid4().hex
        else:
            rid = uuid.uuid4().hex
        payload = list(msgs) if st.config.json else [base64.b64encode(m).decode("ascii") for m in msgs]
        record: dict[str, Any] = {
            "type": BATCH_TYPE,
            "id": rid,
            "parentId": None,
            "at": int(time.time() * 1000),
            "msgs": payload,
        }
        if producer is not None:
            record["producer"] = {"id": producer.id, "epoch": producer.epoch, "seq": producer.seq}
        if stream_seq is not None:
            record["streamSeq"] = stream_seq
        if close:
            record["close"] = True
        return record

    # --- read --------------------------------------------------------------------------------

    def read(
        self, path: str, offset: Offset | None, *, max_bytes: int = DEFAULT_MAX_BYTES, touch: bool = True
    ) -> ReadResult:
        """The appends after ``offset`` (``None``: the tail): whole batches of at most
        ``max_bytes`` in all (the first batch alone when it is larger); ``up_to_date`` when
        the result reaches the tail."""
        return self.read_info(path, offset, max_bytes=max_bytes, touch=touch)[0]

    def read_info(
        self, path: str, offset: Offset | None, *, max_bytes: int = DEFAULT_MAX_BYTES, touch: bool = True
    ) -> tuple[ReadResult, StreamInfo]:
        """:meth:`read` and :meth:`info` of one look at the stream."""
        st = self.state(path, touch=touch)
        return self.reads.read_state(st, offset, max_bytes=max_bytes), self._info(st)

    def read_state(self, st: StreamState, offset: Offset | None, *, max_bytes: int = DEFAULT_MAX_BYTES) -> ReadResult:
        return self.reads.read_state(st, offset, max_bytes=max_bytes)

    def info(self, path: str, *, touch: bool = False) -> StreamInfo:
        return self._info(self.state(path, touch=touch))

    @staticmethod
    def _info(st: StreamState) -> StreamInfo:
        return StreamInfo(
            st.config.path, st.header.session_id, st.config, st.tail, st.closed, st.header.created_at_ms
        )

    # --- delete ------------------------------------------------------------------------------

    def delete(self, path: str) -> None:
        """Delete a stream. While forks still read it, it is only marked deleted (410 for
        everyone else); its data goes with its last fork (``store/streams/collect.py``)."""
        self.collector.delete_now(self.state(path, touch=False))


__all__ = ["DEFAULT_CACHE_BYTES", "Streams"]
