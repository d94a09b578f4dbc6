"""Durable streams: append-only logs of opaque messages (bytes or JSON) on the session log.

A stream is a session of kind ``"stream"`` (``Header.kind``): the same header, segments,
manifests, compaction, Redis tail and compare-and-set, so every invariant of the store holds
for it unchanged (nothing acknowledged is lost, a batch is all or nothing, zombies are
fenced; ``docs/design.md``). What this module adds is the stream's own rules on top:

- **One record a batch.** An append is one segment holding one record::

      {"type": "stream.batch", "id": <batch id>, "parentId": null, "at": <ms>,
       "msgs": [...], "producer": {"id", "epoch", "seq"}?, "streamSeq": "..."?, "close": true?}

  ``msgs`` are JSON values for a JSON stream and base64 strings for any other content type
  (one message per append). A record, not one entry per message, keeps the Redis id index at
  one id per append whatever the batch size.
- **Offsets** are ``<vseq:016d>_<index:016d>``: "before message ``index`` of segment
  ``vseq``, and everything after". Opaque to clients, sortable as strings, derived from the
  store's own segment numbers, and stable across compaction (a base keeps each record's
  segment number). A fork numbers its own segments after its fork point (``vseq = base +
  seq``), so offsets keep increasing across the boundary.
- **Producer state, Stream-Seq and closing are folded from the records.** Every append is a
  compare-and-set on the tail record the writer's checks were made against
  (``expected_tail_entry_id``), so a check and its append are one atomic step: a producer
  paused past any grace period, or a writer racing a close, finds the tail moved and checks
  again against the new state. Exactly-once therefore holds across server crashes and
  pauses, not only within an epoch: a re-sent producer batch has the same record id and the
  store's duplicate check returns the original result.

Not here (the HTTP service's business, ``store/http/``): headers, status codes, waiting.
"""

from __future__ import annotations

import base64
import hashlib
import re
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from store.errors import (
    ConflictError,
    ContentionError,
    IdCollisionError,
    InvalidInputError,
    ObjectExistsError,
    ObjectNotFoundError,
    SessionExistsError,
    SessionNotFoundError,
    SessionStoreError,
)
from store.layout import SESSION_ID_RE, new_ref_token, parse_ref_name
from store.model.rules import REDACTION_TYPE
from store.segments import read_segment
from coordination.redis import TailState
from store.records import EMPTY_TAIL, Header

if TYPE_CHECKING:
    from store.core import SessionStore

STREAM_KIND = "stream"
#: A pi session read and written as a stream of entries (``store/model/``'s rules hold).
PI_KIND = "pi"
SESSION_CONTENT_TYPE = "application/json"
BATCH_TYPE = "stream.batch"
DEFAULT_CONTENT_TYPE = "application/octet-stream"
OFFSET_WIDTH = 16
_OFFSET_RE = re.compile(r"^(\d{16})_(\d{16})$")
#: The id prefix of a record that only appends messages (no producer, Stream-Seq, close or
#: tombstone): nothing can follow a close or a tombstone but a tombstone, so a stream whose
#: last record is such is neither closed nor deleted (``Streams._plain_append``).
PLAIN_PREFIX = "a."
#: Attempts of one append against a moving tail before ``ContentionError``.
MAX_CAS_ATTEMPTS = 64


# --- errors ------------------------------------------------------------------------------------


class StreamError(SessionStoreError):
    """A stream operation refused; ``status`` is the HTTP status the service answers with."""

    status = 400
    code = "bad-request"


class InvalidOffsetError(StreamError, InvalidInputError):
    code = "invalid-offset"


class StreamNotFoundError(StreamError, LookupError):
    status = 404
    code = "stream-not-found"


class StreamGoneError(StreamError):
    """The stream was deleted (or expired) while forks still read it."""

    status = 410
    code = "stream-gone"


class StreamExistsError(StreamError):
    status = 409
    code = "stream-exists"


class ContentTypeMismatchError(StreamError):
    status = 409
    code = "content-type-mismatch"


class StreamClosedError(StreamError):
    status = 409
    code = "stream-closed"

    def __init__(self, message: str, next_offset: str) -> None:
        super().__init__(message)
        self.next_offset = next_offset


class TailMismatchError(StreamError):
    """``If-Match`` named another tail: nothing was written."""

    status = 412
    code = "tail-mismatch"

    def __init__(self, message: str, actual: str, *, entry_id: str | None = None) -> None:
        super().__init__(message)
        self.actual = actual
        #: A session's actual tail entry id ("" for none).
        self.entry_id = entry_id


class StreamSeqConflictError(StreamError):
    status = 409
    code = "stream-seq-conflict"


class StaleEpochError(StreamError):
    status = 403
    code = "stale-producer-epoch"

    def __init__(self, message: str, current_epoch: int) -> None:
        super().__init__(message)
        self.current_epoch = current_epoch


class ProducerSeqGapError(StreamError):
    status = 409
    code = "producer-sequence-gap"

    def __init__(self, message: str, expected: int, received: int) -> None:
        super().__init__(message)
        self.expected = expected
        self.received = received


class ProducerEpochSeqError(StreamError):
    status = 400
    code = "producer-epoch-seq"


# --- values ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class Offset:
    """A position in a stream: before message ``index`` of (virtual) segment ``vseq``."""

    vseq: int
    index: int

    def __str__(self) -> str:
        return f"{self.vseq:0{OFFSET_WIDTH}d}_{self.index:0{OFFSET_WIDTH}d}"

    @classmethod
    def parse(cls, text: str) -> Offset:
        if text == "-1":
            return START
        m = _OFFSET_RE.match(text)
        if m is None:
            raise InvalidOffsetError(f"not an offset of this stream: {text[:64]!r}")
        return cls(int(m.group(1)), int(m.group(2)))


START = Offset(0, 0)


def is_json_type(content_type: str) -> bool:
    return media_type(content_type) == "application/json"


def media_type(content_type: str) -> str:
    """``type/subtype`` lowercased, parameters dropped."""
    return content_type.split(";", 1)[0].strip().lower()


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """A stream's settings, fixed at creation (kept in the header's ``config``)."""

    path: str
    content_type: str = DEFAULT_CONTENT_TYPE
    ttl_s: int | None = None
    expires_at_ms: int | None = None
    #: The Expires-At value as the creator gave it (echoed back).
    expires_at: str | None = None
    #: Fork point: (source session id, its incarnation, offset in the source, sub-offset).
    fork_sid: str | None = None
    fork_inc: str | None = None
    fork_offset: Offset | None = None
    fork_sub: int = 0
    #: The fork's registration with its source: ``Layout.stream_ref``'s token, random per
    #: fork create ("" in forks made before it was kept).
    fork_ref: str = ""
    #: Created closed (part of the settings a re-create must match).
    created_closed: bool = False

    @property
    def json(self) -> bool:
        return is_json_type(self.content_type)

    @property
    def base(self) -> int:
        """Virtual segment number of the fork point (0 for a stream that is no fork)."""
        return self.fork_offset.vseq if self.fork_offset is not None else 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "content_type": self.content_type}
        if self.ttl_s is not None:
            out["ttl_s"] = self.ttl_s
        if self.expires_at_ms is not None:
            out["expires_at_ms"] = self.expires_at_ms
            out["expires_at"] = self.expires_at
        if self.fork_sid is not None:
            out["fork"] = {
                "sid": self.fork_sid,
                "inc": self.fork_inc,
                "offset": str(self.fork_offset),
                "sub": self.fork_sub,
                **({"ref": self.fork_ref} if self.fork_ref else {}),
            }
        if self.created_closed:
            out["created_closed"] = True
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StreamConfig:
        fork = data.get("fork")
        return cls(
            path=str(data["path"]),
            content_type=str(data.get("content_type", DEFAULT_CONTENT_TYPE)),
            ttl_s=data.get("ttl_s"),
            expires_at_ms=data.get("expires_at_ms"),
            expires_at=data.get("expires_at"),
            fork_sid=fork["sid"] if fork else None,
            fork_inc=fork["inc"] if fork else None,
            fork_offset=Offset.parse(fork["offset"]) if fork else None,
            fork_sub=int(fork.get("sub", 0)) if fork else 0,
            fork_ref=str(fork.get("ref") or "") if fork else "",
            created_closed=bool(data.get("created_closed", False)),
        )


@dataclass(frozen=True, slots=True)
class Producer:
    id: str
    epoch: int
    seq: int


@dataclass
class StreamState:
    """What the records of one incarnation add up to, as far as ``last_seq``."""

    header: Header
    config: StreamConfig
    last_seq: int = 0
    last_id: str = EMPTY_TAIL
    #: Messages in the last own segment (for the tail offset).
    last_count: int = 0
    producers: dict[str, tuple[int, int]] = field(default_factory=dict)
    stream_seq: str | None = None
    closed: bool = False
    closed_by: tuple[str, int, int] | None = None
    #: Deleted while forks still read it: gone for everyone else (410).
    deleted: bool = False
    #: A pi session's entries inherited from the session it was forked from (offsets
    #: ``(0, i)``), or -1 until counted.
    inherited: int = -1

    @property
    def pi(self) -> bool:
        return self.header.kind == PI_KIND

    @property
    def tail(self) -> Offset:
        if self.last_seq == 0:
            if self.pi:
                return Offset(0, max(0, self.inherited))
            return self.config.fork_offset or START
        return Offset(self.config.base + self.last_seq, self.last_count)

    def fold(self, seq: int, record: dict[str, Any]) -> None:
        if self.pi:
            # One entry a record: count the entries of the last segment.
            self.last_count = self.last_count + 1 if seq == self.last_seq else 1
            self.last_seq = seq
            self.last_id = str(record["id"])
            return
        self.last_seq = seq
        self.last_id = str(record["id"])
        self.last_count = len(record.get("msgs") or ())
        p = record.get("producer")
        if p:
            self.producers[p["id"]] = (int(p["epoch"]), int(p["seq"]))
        if record.get("streamSeq") is not None:
            self.stream_seq = record["streamSeq"]
        if record.get("close"):
            self.closed = True
            self.closed_by = (p["id"], int(p["epoch"]), int(p["seq"])) if p else None
        if record.get("deleted"):
            self.deleted = True


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    next_offset: Offset
    closed: bool
    #: True when the append was a duplicate (nothing new was written).
    duplicate: bool = False
    #: The producer's highest accepted (epoch, seq) after this append.
    producer: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Batch:
    """The messages of one append (one record) within a read: ``end`` is the offset after it."""

    end: Offset
    #: JSON values, or bytes (one message) for other content types.
    messages: list[Any]


@dataclass(frozen=True, slots=True)
class ReadResult:
    batches: list[Batch]
    next_offset: Offset
    up_to_date: bool
    #: The stream is closed and this read reached its end.
    closed: bool
    tail: Offset

    @property
    def messages(self) -> list[Any]:
        return [m for b in self.batches for m in b.messages]


@dataclass(frozen=True, slots=True)
class StreamInfo:
    path: str
    session_id: str
    config: StreamConfig
    tail: Offset
    closed: bool
    created_at_ms: int


# --- the streams --------------------------------------------------------------------------------

#: A fork registers with its source before its header exists; a registration older than this
#: without a header is abandoned (a forker that crashed) and may be cleared. A forker that
#: took longer than half of it (paused) undoes its fork instead of trusting the registration.
REF_GRACE_MS = 10 * 60 * 1000


class RecordCache:
    """The records of streams this process has read, by (session, incarnation, segment).

    A segment never changes within an incarnation (compaction moves records into bases with
    their segment numbers, never alters them), so a record once read is good for as long as
    it is kept; a new incarnation is another key. Kept per stream from segment 1 on without
    holes, so a reader knows when it has everything it asks for; whole streams are evicted,
    least recently used first, past ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._streams: OrderedDict[tuple[str, str], list[dict[str, Any]]] = OrderedDict()
        self._sizes: dict[tuple[str, str], int] = {}
        self._bytes = 0

    def add(self, sid: str, inc: str, seq: int, record: dict[str, Any]) -> None:
        """Keep ``record`` as segment ``seq`` if it extends the stream's run from 1."""
        key = (sid, inc)
        size = _record_size(record)
        with self._lock:
            run = self._streams.get(key)
            if run is None:
                if seq != 1:
                    return
                run = self._streams[key] = []
                self._sizes[key] = 0
            if seq != len(run) + 1:
                return
            run.append(record)
            self._sizes[key] += size
            self._bytes += size
            self._streams.move_to_end(key)
            while self._bytes > self.max_bytes and len(self._streams) > 1:
                old, _ = self._streams.popitem(last=False)
                self._bytes -= self._sizes.pop(old)

    def run(self, sid: str, inc: str, first: int, last: int) -> list[dict[str, Any]] | None:
        """Records of segments ``first..last`` if all are kept, else None."""
        with self._lock:
            run = self._streams.get((sid, inc))
            if run is None or len(run) < last:
                return None
            self._streams.move_to_end((sid, inc))
            return run[first - 1 : last]

    def drop(self, sid: str) -> None:
        with self._lock:
            for key in [k for k in self._streams if k[0] == sid]:
                del self._streams[key]
                self._bytes -= self._sizes.pop(key)


def _record_size(record: dict[str, Any]) -> int:
    return 200 + sum(len(m) if isinstance(m, str) else 64 for m in record.get("msgs") or ())


#: Bytes of records a process keeps for readers (``RecordCache``).
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024


class Streams:
    """Durable streams on one :class:`~store.core.SessionStore`. Thread-safe."""

    def __init__(
        self, store: SessionStore, *, cache_size: int = 4096, cache_bytes: int = DEFAULT_CACHE_BYTES
    ) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._states: OrderedDict[str, StreamState] = OrderedDict()
        self._cache_size = cache_size
        self._sid_locks: dict[str, threading.Lock] = {}
        self.records = RecordCache(cache_bytes)

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
            first = self._first_batch_after(src, fork_offset)
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
        ref_key = self.store.layout.stream_ref(config.fork_sid or "", config.fork_inc or "", sid, config.fork_ref)
        started = time.monotonic()
        made_ref = self._put_ref(ref_key)
        self.store.ctx.fault("stream.fork.registered", stream=path, source=fork_from)
        try:
            # Registered first, then checked: a delete of the source appends its tombstone
            # first, then lists the registrations, so one of the two sees the other.
            self.state(fork_from, touch=False)
        except (StreamGoneError, StreamNotFoundError):
            if made_ref:
                self._drop_ref(ref_key)
                self._collect(config.fork_sid or "", config.fork_inc or "")
            raise StreamExistsError(f"stream {fork_from!r} was deleted: no new forks") from None
        self.store.ctx.fault("stream.fork.checked", stream=path, source=fork_from)
        try:
            created, info = self._create(
                sid, config, None, False, requested_offset=given_offset, prefix=prefix
            )
        except BaseException:
            if made_ref:
                self._drop_ref_unless_forked(ref_key, sid, config)
            raise
        if not created and made_ref:
            self._drop_ref(ref_key)  # the stream existed (the same create): its own ref holds
        if created and (time.monotonic() - started) * 1000 > REF_GRACE_MS / 2:
            # Paused between registering and creating: the registration may have been
            # cleared as abandoned. Undo rather than read a source that may be going.
            self._delete_now(self.state(path, touch=False, allow_gone=True))
            raise ContentionError(f"creating fork {path!r} took too long; retry")
        if created and (msgs or close):
            self.append(path, msgs or [], content_type=config.content_type, close=close)
            info = self.info(path)
        return created, info

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
        self,
        sid: str,
        config: StreamConfig,
        msgs: list[Any] | None,
        close: bool,
        *,
        requested_offset: bool,
        prefix: list[Any] | None = None,
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
            if not _same_config(existing.config, config, requested_offset) or existing.closed != (
                existing.closed and config.created_closed
            ):
                raise StreamExistsError(f"stream {path!r} exists with other settings") from None
            return False, self._info(existing)
        state = StreamState(header=handle.header, config=config)
        self._remember(sid, state)
        self._touch(state)
        if prefix:
            self.append(path, prefix, content_type=config.content_type)
        if msgs or close:
            self.append(path, msgs or [], content_type=config.content_type, close=close)
        if not (prefix or msgs or close):
            return True, self._info(state)  # known to be empty: nothing to read
        return True, self.info(path, touch=False)

    def _put_ref(self, key: str) -> bool:
        """Create the registration object; False when it existed already."""
        try:
            self.store.options.retry.call(lambda: self.store.objects.put_if_absent(key, b""))
            return True
        except ObjectExistsError:
            return False

    def _drop_ref(self, key: str) -> None:
        self.store.options.retry.call(lambda: self.store.objects.delete(key))

    def _drop_ref_unless_forked(self, key: str, sid: str, config: StreamConfig) -> None:
        """After a failed fork create: drop our registration unless the stream at that path is
        a fork of the same source (whose registration it is too)."""
        try:
            header = self.store.headers.read(sid)
            fork = header.config.get("fork") or {}
            if (fork.get("sid"), fork.get("inc"), fork.get("ref")) == (config.fork_sid, config.fork_inc, config.fork_ref):
                return  # our create landed after all
        except SessionNotFoundError:
            pass
        self._drop_ref(key)

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
        access for a sliding TTL. ``probe=False`` (writers): trust a Redis tail that matches
        the cached state without looking for a segment Redis has not heard of; the append's
        compare-and-set finds such a segment anyway."""
        sid = self.store.layout.stream_id(path)
        header, tail = self._header_and_tail(sid, path)
        st = self._refreshed(header, refresh, tail=tail, probe=probe)
        if st.deleted:
            if allow_gone:
                return st
            self._collect(sid, header.incarnation)
            raise StreamGoneError(f"stream {path!r} was deleted")
        if self._expired(st):
            self._delete_now(st)
            if self._has_refs(st):
                raise StreamGoneError(f"stream {path!r} expired")
            raise StreamNotFoundError(f"stream {path!r} expired")
        if touch:
            self._touch(st)
        return st

    def _refreshed(
        self, header: Header, refresh: bool, *, tail: TailState | None = None, probe: bool = True
    ) -> StreamState:
        sid = header.session_id
        with self._lock:
            st = self._states.get(sid)
            if st is not None:
                self._states.move_to_end(sid)
        if st is None or st.header.incarnation != header.incarnation:
            st = StreamState(header=header, config=_config_of(header, header.config.get("path", "")))
        else:
            st = _copy(st)
        if refresh and st.pi and st.inherited < 0:
            data = self.store.reader.read_session(sid)
            if data.header.incarnation != header.incarnation:
                raise StreamNotFoundError(f"no stream {st.config.path!r}")
            st.inherited = len(data.inherited)
            for seq, entry in zip(data.seqs, data.entries):
                st.fold(seq, entry)
            st.last_seq = max(st.last_seq, data.seq)
            self._remember(sid, st)
            return st
        if refresh and self._still_current(st, tail, probe):
            return st
        if refresh:
            inc = header.incarnation
            caught = None if st.pi else self._catch_up(st, tail, probe)
            if caught is not None:
                fresh, last = caught
            elif st.last_seq == 0 and not st.pi:
                # Cold: the read path's parallel round (bases, segments, probe) at once.
                data = self.store.reader.read(sid, header, use_hint=True)
                fresh, last = list(zip(data.seqs, data.entries)), data.seq
            else:
                fresh, last = self.store.reader.read_after(sid, header, st.last_seq)
            for seq, record in fresh:
                st.fold(seq, record)
                if not st.pi:
                    self.records.add(sid, inc, seq, record)
            st.last_seq = max(st.last_seq, last)
            self._remember(sid, st)
        return st

    def _still_current(self, st: StreamState, tail: TailState | None, probe: bool) -> bool:
        """Is the cached state the stream's true tail? Yes when Redis's tail is exactly it (same
        incarnation, segment and last record), no segment after it exists that Redis has not
        heard of (``probe``: one HEAD) and none was retired by a compaction Redis counted
        without the commit. Else a read of what is new (``Reader.read_after``)."""
        if tail is None or st.inherited == -1 and st.pi:
            return False
        inc = st.header.incarnation
        if tail.inc != inc or tail.seq != st.last_seq or tail.last != st.last_id:
            return False
        if not probe:
            return True
        store, sid, nxt = self.store, st.header.session_id, st.last_seq + 1
        try:
            if store.options.retry.call(lambda: store.objects.head(store.layout.segment(sid, inc, nxt))):
                return False
            # Read after the HEAD, not with the tail before it: GC deletes a slot only after a
            # manifest raised cseq past it, so a slot deleted before our HEAD shows here even if
            # this process paused anywhere in between.
            retired = store.coord.retired_through(sid, inc)
            return retired is not None and retired < nxt
        except SessionStoreError:
            return False

    def _catch_up(
        self, st: StreamState, tail: TailState | None, probe: bool = True
    ) -> tuple[list[tuple[int, dict[str, Any]]], int] | None:
        """The records after ``st`` when Redis's tail says which: its segments in one parallel
        round of GETs, then the probe after them (one HEAD) and Redis's retired slot, as in
        :meth:`_still_current`. None when Redis cannot say or a segment is not where it should
        be (compacted meanwhile): the read path's own ``read_after`` decides then."""
        if tail is None or tail.inc != st.header.incarnation or not 0 < tail.seq - st.last_seq <= 256:
            return None
        store, sid, inc = self.store, st.header.session_id, st.header.incarnation
        seqs = range(st.last_seq + 1, tail.seq + 1)
        opts, objects, layout = store.options, store.objects, store.layout

        def get(seq: int) -> tuple[list[dict[str, Any]], int] | None:
            return read_segment(objects, opts.retry, layout.segment(sid, inc, seq), st.header.schema, store.keys.open)

        nxt = tail.seq + 1

        def head_next() -> bool:
            return opts.retry.call(lambda: objects.head(layout.segment(sid, inc, nxt))) is not None

        kept = self.records.run(sid, inc, seqs[0], seqs[-1])
        try:
            # The probe after them in the same round (a reader must see a segment whose
            # Redis commit was lost); a writer needs none: its append is a compare-and-set on
            # the last of these records, so such a segment only costs it a retry.
            probed = store.ctx.pool.submit(head_next) if probe else None
            if kept is not None:
                got = [([record], 0) for record in kept]
            else:
                got = list(store.ctx.pool.map(get, seqs)) if len(seqs) > 1 else [get(seqs[0])]
            if any(g is None or len(g[0]) != 1 for g in got):
                return None
            if probed is None:
                return [(seq, g[0][0]) for seq, g in zip(seqs, got) if g is not None], tail.seq
            if probed.result():
                return None
            retired = store.coord.retired_through(sid, inc)
        except SessionStoreError:
            return None
        if retired is None or retired >= nxt:
            return None
        return [(seq, g[0][0]) for seq, g in zip(seqs, got) if g is not None], tail.seq

    def header_of(self, path: str) -> Header:
        """The header of the stream or session named ``path`` (``StreamNotFoundError``)."""
        return self._header(self.store.layout.stream_id(path), path)

    def _header(self, sid: str, path: str) -> Header:
        return self._header_and_tail(sid, path)[0]

    def _header_and_tail(self, sid: str, path: str) -> tuple[Header, TailState | None]:
        """The header (cached while Redis names its incarnation) and Redis's tail, if any."""
        store = self.store
        header = store.headers.cached(sid)
        try:
            tail = store.coord.tail(sid)
        except SessionStoreError:
            tail = None
        if header is not None:
            if tail is None or tail.inc != header.incarnation:
                header = None
        if header is None:
            header = self._read_header(sid, path, tail)
        if header.kind == STREAM_KIND:
            if header.config.get("path") != path:
                raise StreamNotFoundError(f"no stream {path!r}")
        elif header.kind == PI_KIND:
            # A session is a stream too: under the name it was created with over HTTP, or
            # under its own id.
            # (An imported session has no recorded name: its id is the name's.)
            if header.config.get("path", path) != path:
                raise StreamNotFoundError(f"no stream {path!r}")
        else:
            raise StreamNotFoundError(f"no stream {path!r}")
        return header, tail

    def _read_header(self, sid: str, path: str, tail: TailState | None) -> Header:
        """GET the header; when Redis names the incarnation, the segments it lists come in
        the same parallel round (into the record cache), so a process that meets a stream for
        the first time reads it in one round trip, not two."""
        store = self.store
        prefetch: list[Any] = []
        if tail is not None and 0 < tail.seq <= 64:
            inc, opts, objects, layout = tail.inc, store.options, store.objects, store.layout
            prefetch = [
                store.ctx.pool.submit(
                    lambda seq=seq: read_segment(objects, opts.retry, layout.segment(sid, inc, seq), opener=store.keys.open)
                )
                for seq in range(1, tail.seq + 1)
            ]
        try:
            header = store.headers.read(sid)
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
                self.records.add(sid, header.incarnation, seq, got[0][0])
        return header

    def _expired(self, st: StreamState) -> bool:
        now = int(time.time() * 1000)
        cfg = st.config
        if cfg.expires_at_ms is not None and now >= cfg.expires_at_ms:
            return True
        if cfg.ttl_s is not None:
            try:
                last = self.store.coord.last_access(st.header.session_id, st.header.incarnation)
            except SessionStoreError:
                return False  # cannot tell: never expire a stream early
            if last is None:
                # Redis lost it (or never had it): count from now rather than expire early.
                self._touch(st)
                return False
            return now >= last + cfg.ttl_s * 1000
        return False

    def _touch(self, st: StreamState) -> None:
        if st.config.ttl_s is None:
            return
        try:
            self.store.coord.touch_access(
                st.header.session_id, st.header.incarnation, int(time.time() * 1000)
            )
        except SessionStoreError:
            pass  # the TTL only slides later: never a reason to fail a read or a write

    def _remember(self, sid: str, st: StreamState) -> None:
        with self._lock:
            cur = self._states.get(sid)
            if cur is None or cur.header.incarnation != st.header.incarnation or cur.last_seq <= st.last_seq:
                self._states[sid] = _copy(st)
                self._states.move_to_end(sid)
            while len(self._states) > self._cache_size:
                self._states.popitem(last=False)

    def _forget_state(self, sid: str) -> None:
        with self._lock:
            self._states.pop(sid, None)
        self.records.drop(sid)

    def _sid_lock(self, sid: str) -> threading.Lock:
        with self._lock:
            lock = self._sid_locks.get(sid)
            if lock is None:
                if len(self._sid_locks) > 4 * self._cache_size:
                    self._sid_locks.clear()
                lock = self._sid_locks[sid] = threading.Lock()
            return lock

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
        with self._sid_lock(sid):
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
                if self._commit(st, record):
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
        header, tail = self._header_and_tail(sid, path)
        if header.kind != STREAM_KIND or tail is None or tail.inc != header.incarnation:
            return None
        if tail.last and not tail.last.startswith(PLAIN_PREFIX):
            return None
        st = StreamState(header=header, config=_config_of(header, path))
        if content_type is not None and media_type(content_type) != media_type(st.config.content_type):
            raise ContentTypeMismatchError(
                f"stream {path!r} holds {st.config.content_type}, not {content_type}"
            )
        if self._expired(st):
            return None
        record = self._record(st, msgs, None, None, False)
        try:
            result = self.store.append_session_entries(
                sid, [record], tail.last, incarnation=header.incarnation
            )
        except (ConflictError, IdCollisionError):
            return None
        self._touch(st)
        with self._lock:
            cached = self._states.get(sid)
        if cached is not None and cached.header.incarnation == header.incarnation \
                and cached.last_seq == result.seq - 1 and cached.last_id == tail.last:
            cached = _copy(cached)
            cached.fold(result.seq, record)
            self._remember(sid, cached)
        self.records.add(sid, header.incarnation, result.seq, record)
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
            now = self._refreshed(st.header, True)
            raise TailMismatchError(
                f"the tail entry is {exc.actual_tail_entry_id!r}, not {if_match!r}",
                str(now.tail),
                entry_id=exc.actual_tail_entry_id or "",
            ) from None
        return AppendOutcome(next_offset=Offset(result.seq, result.appended_count), closed=False)

    def _commit(self, st: StreamState, record: dict[str, Any]) -> bool:
        """Append ``record`` if the tail is still ``st``'s; fold it in. False if it moved."""
        sid = st.header.session_id
        try:
            result = self.store.append_session_entries(
                sid, [record], st.last_id, incarnation=st.header.incarnation
            )
        except (ConflictError, IdCollisionError):
            # The tail moved (or the same producer batch was committed with other content
            # by a concurrent request): check again against the new state.
            return False
        if result.seq != st.last_seq + 1:
            # A re-send met its own earlier commit: the state has moved past it.
            return False
        st.fold(result.seq, record)
        self._remember(sid, st)
        return True

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
        self, path: str, offset: Offset | None, *, max_bytes: int = 4 << 20, touch: bool = True
    ) -> ReadResult:
        """The appends after ``offset`` (``None``: the tail), about ``max_bytes`` of them at
        most (always at least one); ``up_to_date`` when the result reaches the tail."""
        return self.read_info(path, offset, max_bytes=max_bytes, touch=touch)[0]

    def read_info(
        self, path: str, offset: Offset | None, *, max_bytes: int = 4 << 20, touch: bool = True
    ) -> tuple[ReadResult, StreamInfo]:
        """:meth:`read` and :meth:`info` of one look at the stream."""
        st = self.state(path, touch=touch)
        return self.read_state(st, offset, max_bytes=max_bytes), self._info(st)

    def read_state(self, st: StreamState, offset: Offset | None, *, max_bytes: int = 4 << 20) -> ReadResult:
        tail = st.tail
        if offset is not None and offset > tail:
            # Never handed out by this incarnation (the tail only grows): an offset of an
            # earlier life of the stream, whose positions name other data now.
            raise InvalidOffsetError(f"offset {offset} is beyond the stream's tail {tail}")
        if offset is None or offset == tail:
            return ReadResult([], tail, True, st.closed, tail)
        out: list[Batch] = []
        budget = [max_bytes]
        self._gather(st, offset, tail, out, budget)
        if budget[0] <= 0 and out and out[-1].end < tail:
            return ReadResult(out, out[-1].end, False, False, tail)
        return ReadResult(out, tail, True, st.closed, tail)

    def _gather(self, st: StreamState, start: Offset, end: Offset, out: list[Batch], budget: list[int]) -> None:
        """Append the batches in [start, end) of ``st``'s stream, its fork source's first."""
        if st.pi:
            self._gather_entries(st, start, end, out, budget)
            return
        cfg = st.config
        base = cfg.base
        if cfg.fork_offset is not None and start < cfg.fork_offset:
            src = self._source_state(cfg)
            self._gather(src, start, min(end, cfg.fork_offset), out, budget)
            if budget[0] <= 0:
                return
            start = cfg.fork_offset
        if start >= end:
            return
        own_from = max(1, start.vseq - base)
        header = st.header
        sid, inc = header.session_id, header.incarnation
        # The segments that can hold [start, end): a fork source's state is not read (its
        # last_seq is 0), its end is the fork point.
        last_needed = end.vseq - base
        if st.last_seq:
            last_needed = min(last_needed, st.last_seq)
        if last_needed < own_from:
            return
        kept = self.records.run(sid, inc, own_from, last_needed)
        if kept is not None:
            fresh = list(zip(range(own_from, own_from + len(kept)), kept))
        else:
            fresh, _ = self.store.reader.read_after(sid, header, own_from - 1)
            fresh = [(seq, r) for seq, r in fresh if seq <= last_needed]
            for seq, record in fresh:
                self.records.add(sid, inc, seq, record)
        for seq, record in fresh:
            vseq = base + seq
            msgs = record.get("msgs") or ()
            taken = [
                (m if cfg.json else base64.b64decode(m))
                for i, m in enumerate(msgs)
                if start <= Offset(vseq, i) < end
            ]
            if not taken:
                continue
            end_off = min(Offset(vseq, len(msgs)), end)
            out.append(Batch(end_off, taken))
            budget[0] -= sum(_size(m) for m in taken)
            if budget[0] <= 0:
                return

    def _gather_entries(
        self, st: StreamState, start: Offset, end: Offset, out: list[Batch], budget: list[int]
    ) -> None:
        """A session's entries in [start, end), one batch a segment; redacted entries as the
        tombstones every reader sees (``SessionStore.load_session_entries``)."""
        data = self.store.reader.read_session(st.header.session_id)
        if data.header.incarnation != st.header.incarnation:
            raise StreamNotFoundError(f"no stream {st.config.path!r}")
        entries = data.all_entries
        if any(e.get("type") == REDACTION_TYPE for e in entries):
            from store.model.session import Session

            entries = list(Session({}, entries, validated=True).entries)
        seqs = [0] * len(data.inherited) + list(data.seqs)
        counts: dict[int, int] = {}
        for seq in seqs:
            counts[seq] = counts.get(seq, 0) + 1
        index = 0
        current: list[Any] = []
        prev = -1
        for entry, seq in zip(entries, seqs):
            index = index + 1 if seq == prev else 0
            if prev != -1 and seq != prev and current:
                out.append(Batch(min(Offset(prev, counts[prev]), end), current))
                current = []
                if budget[0] <= 0:
                    return
            prev = seq
            off = Offset(seq, index)
            if start <= off < end:
                current.append(entry)
                budget[0] -= 256
        if current:
            out.append(Batch(min(Offset(prev, counts[prev]), end), current))

    def _first_batch_after(self, st: StreamState, offset: Offset) -> Batch | None:
        out: list[Batch] = []
        self._gather(st, offset, st.tail, out, [1])
        return out[0] if out else None

    def _source_state(self, cfg: StreamConfig) -> StreamState:
        """The fork source's state as far as the fork point (its tombstone does not matter:
        a fork reads what it inherited until it is deleted itself)."""
        assert cfg.fork_sid is not None
        header = self.store.headers.get(cfg.fork_sid)
        if header.incarnation != cfg.fork_inc:
            header = self.store.headers.read(cfg.fork_sid)
            if header.incarnation != cfg.fork_inc:
                raise StreamGoneError("the stream this fork was made from is gone")
        return StreamState(header=header, config=_config_of(header, header.config.get("path", "")))

    def info(self, path: str, *, touch: bool = False) -> StreamInfo:
        return self._info(self.state(path, touch=touch))

    def _info(self, st: StreamState) -> StreamInfo:
        return StreamInfo(
            st.config.path, st.header.session_id, st.config, st.tail, st.closed, st.header.created_at_ms
        )

    # --- delete and garbage ------------------------------------------------------------------

    def delete(self, path: str) -> None:
        """Delete a stream. While forks still read it, it is only marked deleted (410 for
        everyone else); its data goes with its last fork."""
        st = self.state(path, touch=False)
        self._delete_now(st)

    def _delete_now(self, st: StreamState) -> None:
        sid = st.header.session_id
        if st.pi:
            try:
                # The life this caller read: a delete that paused never ends a newer one.
                self.store.delete_session(sid, incarnation=st.header.incarnation)
            except SessionNotFoundError:
                raise StreamNotFoundError(f"no stream {st.config.path!r}") from None
            self._forget_state(sid)
            return
        with self._sid_lock(sid):
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
                # The tombstone first, the registrations after (see create): a fork
                # registered after this sees the tombstone and backs out.
                if self._commit(st, record):
                    break
                st = self._refreshed(st.header, True)
            else:
                raise ContentionError(f"stream {st.config.path!r}: the tail kept moving; retry")
        self.store.ctx.fault("stream.delete.tombstoned", stream=st.config.path)
        self._collect(sid, st.header.incarnation)

    def _has_refs(self, st: StreamState) -> bool:
        prefix = self.store.layout.stream_refs_prefix(st.header.session_id, st.header.incarnation)
        return any(True for _ in self.store.objects.list(prefix))

    def _collect(self, sid: str, inc: str) -> None:
        """Remove incarnation ``inc`` of ``sid`` if it is marked deleted and no live fork
        reads it; then the same for the stream it was forked from."""
        store = self.store
        prefix = store.layout.stream_refs_prefix(sid, inc)
        live = False
        for info in list(store.objects.list(prefix)):
            fork_sid, token = parse_ref_name(info.key)
            if self._ref_alive(info.key, fork_sid, token, sid, inc):
                live = True
        if live:
            return
        try:
            header = store.headers.read(sid)
        except SessionNotFoundError:
            return
        if header.incarnation != inc:
            return
        st = self._refreshed(header, True)
        if not st.deleted:
            return
        try:
            # Only the incarnation judged above: if this process paused since, the id may
            # have been removed by another collector and created again.
            store.delete_session(sid, incarnation=inc)
        except SessionNotFoundError:
            pass
        self._forget_state(sid)
        store.ctx.fault("stream.collect.deleted", stream=sid)
        cfg = st.config
        if cfg.fork_sid is not None and cfg.fork_inc is not None:
            # Its own registration only (its token): once its header is gone, the path may
            # have been forked again from the same source, with a registration of its own.
            self._drop_ref(store.layout.stream_ref(cfg.fork_sid, cfg.fork_inc, sid, cfg.fork_ref))
            self._collect(cfg.fork_sid, cfg.fork_inc)

    def _ref_alive(self, key: str, fork_sid: str, token: str, sid: str, inc: str) -> bool:
        """Does the fork this registration names still read (sid, inc)? Clears it if not.

        Its fork is the stream whose header names this source and this registration's token
        (a registration without one: any fork of the source at that id). Without such a
        header, the registration is a fork's being created right now (its header may only
        come once another life of the id is gone) while it is younger than ``REF_GRACE_MS``
        (a creator that took half of that undoes its fork), else abandoned."""
        store = self.store
        try:
            header: Header | None = store.headers.read(fork_sid)
        except SessionNotFoundError:
            header = None
        fork = (header.config.get("fork") or {}) if header is not None else {}
        if (
            header is not None and header.kind == STREAM_KIND
            and fork.get("sid") == sid and fork.get("inc") == inc
            and (not token or fork.get("ref") == token)
        ):
            st = self._refreshed(header, True)
            if st.deleted or self._expired(st):
                self._delete_now(st)  # expired or dead: its own delete drops this ref
                return store.objects.head(key) is not None
            return True
        try:
            obj = store.options.retry.call(lambda: store.objects.get(key))
        except ObjectNotFoundError:
            return False
        made = obj.last_modified_ms
        if made is None or int(time.time() * 1000) - made < REF_GRACE_MS:
            return True  # a fork being created right now
        self._drop_ref(key)
        return False


def _size(value: Any) -> int:
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    return 64


def _config_of(header: Header, path: str) -> StreamConfig:
    if header.kind == PI_KIND:
        return StreamConfig(path=header.config.get("path", header.session_id), content_type=SESSION_CONTENT_TYPE)
    try:
        return StreamConfig.from_json(header.config)
    except (KeyError, TypeError, ValueError, InvalidInputError):
        raise StreamNotFoundError(f"no stream {path!r}") from None


def _copy(st: StreamState) -> StreamState:
    return replace(st, producers=dict(st.producers))


def _same_config(a: StreamConfig, b: StreamConfig, compare_offset: bool) -> bool:
    """Would creating ``b`` where ``a`` is be the same create? (The fork offset only when
    the request gave one.)"""
    return (
        media_type(a.content_type) == media_type(b.content_type)
        and a.ttl_s == b.ttl_s
        and a.expires_at_ms == b.expires_at_ms
        and a.fork_sid == b.fork_sid
        and (not compare_offset or a.fork_offset == b.fork_offset)
        and a.fork_sub == b.fork_sub
        and a.created_closed == b.created_closed
    )


__all__ = [
    "BATCH_TYPE",
    "PI_KIND",
    "SESSION_CONTENT_TYPE",
    "STREAM_KIND",
    "AppendOutcome",
    "Batch",
    "ContentTypeMismatchError",
    "InvalidOffsetError",
    "Offset",
    "Producer",
    "ProducerEpochSeqError",
    "ProducerSeqGapError",
    "ReadResult",
    "StaleEpochError",
    "StreamClosedError",
    "StreamConfig",
    "StreamError",
    "StreamExistsError",
    "StreamGoneError",
    "StreamInfo",
    "StreamNotFoundError",
    "StreamSeqConflictError",
    "TailMismatchError",
    "Streams",
]
