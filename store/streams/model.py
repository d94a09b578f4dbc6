"""A stream's values: offsets, settings, the state folded from its records, and what reads and
appends return. Pure: nothing here does I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from store.errors import InvalidInputError, InvalidOffsetError, StreamNotFoundError
from store.formats.records import EMPTY_TAIL, Header

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


def message_size(value: Any) -> int:
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    return 64


def config_of(header: Header, path: str) -> StreamConfig:
    """The stream settings of ``header`` (a pi session's: its name and JSON);
    ``StreamNotFoundError`` when they are not a stream's."""
    if header.kind == PI_KIND:
        return StreamConfig(path=header.config.get("path", header.session_id), content_type=SESSION_CONTENT_TYPE)
    try:
        return StreamConfig.from_json(header.config)
    except (KeyError, TypeError, ValueError, InvalidInputError):
        raise StreamNotFoundError(f"no stream {path!r}") from None


def copy_state(st: StreamState) -> StreamState:
    """A copy a caller may fold into without touching the one a cache holds."""
    return replace(st, producers=dict(st.producers))


def same_config(a: StreamConfig, b: StreamConfig, compare_offset: bool) -> bool:
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
    "DEFAULT_CONTENT_TYPE",
    "MAX_CAS_ATTEMPTS",
    "PI_KIND",
    "PLAIN_PREFIX",
    "SESSION_CONTENT_TYPE",
    "START",
    "STREAM_KIND",
    "AppendOutcome",
    "Batch",
    "Offset",
    "Producer",
    "ReadResult",
    "StreamConfig",
    "StreamInfo",
    "StreamState",
    "config_of",
    "copy_state",
    "is_json_type",
    "media_type",
    "message_size",
    "same_config",
]
