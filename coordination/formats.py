"""What Redis holds and answers, as values: the tail's state, the recent-segments cache's
values, the scripts' replies (``coordination/scripts.py``) and the listing's summary delta.

Plain values with no connection: the append path, the read path and the listing use them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class TailState:
    inc: str
    seq: int
    last: str
    count: int
    nids: int
    #: Segments 1..cseq are retired by a manifest Redis was told of (GC may delete them).
    cseq: int = 0
    #: The generation of the newest manifest Redis was told of (0: none). A hint.
    mgen: int = 0
    #: The recent-segments cache (seq -> cached value), when asked for: ``recent_value``.
    recent: Mapping[int, bytes] | None = field(default=None, compare=False)


def recent_value(inc: str, checksum: str, schema: int, body: bytes) -> bytes:
    """How the recent-segments cache keeps a segment: its incarnation, sha256 and schema on
    a first line, then its bytes. A reader trusts a value only if both match."""
    return f"{inc} {checksum} {schema}\n".encode() + body


def parse_recent(value: bytes, inc: str) -> tuple[str, int, bytes] | None:
    """(sha256, schema, body) of a cached segment of incarnation ``inc``; None otherwise."""
    head, sep, body = value.partition(b"\n")
    parts = head.split(b" ")
    if not sep or len(parts) != 3 or parts[0].decode("ascii", "replace") != inc:
        return None
    try:
        return parts[1].decode("ascii"), int(parts[2]), body
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class CheckResult:
    code: str  # OK BUSY DUPLICATE COLLISION CONFLICT UNKNOWN_PARENT HYDRATE INCARNATION REINDEX
    seq: int = 0
    last: str = ""
    entry_id: str = ""
    parent_id: str = ""
    detail: str = ""
    inc: str = ""
    #: BUSY: how long the other writer's claim still runs.
    wait_ms: int = 0
    #: BUSY: the caller's ticket in the session's queue of waiting writers (first come,
    #: first served; 0 when there is no queue).
    ticket: int = 0
    #: OK with ``take``: (nonce, segment body) of each waiter whose batch CHECK took to ride
    #: in the caller's segment (group commit), in queue order.
    riders: tuple[tuple[str, bytes], ...] = ()


@dataclass(slots=True)
class Offering:
    """A waiting writer's offer of its batch to ride in another writer's segment (group
    commit), as far as it can tell: ``sent`` while one is set in Redis, ``out`` once it may
    have been taken (found gone: taken, or lapsed while the writer was paused, which it
    cannot tell apart). A writer whose batch may be out cannot say "nothing was written"."""

    sent: bool = False
    out: bool = False

    def refreshed(self, was_sent: bool, prev: Any) -> None:
        """The value a refresh of the offer replaced: none, after one was set, means it went."""
        if was_sent and (prev is None or isinstance(prev, Exception)):
            self.out = True


@dataclass(frozen=True, slots=True)
class CommitResult:
    code: str  # OK ALREADY ZOMBIE RETIRED BEHIND HYDRATE INCARNATION
    seq: int = 0
    inc: str = ""
    #: Segments and bytes committed since the latest manifest (OK only).
    pending_segments: int = 0
    pending_bytes: int = 0
    #: A compaction job for the session is queued already (OK only).
    job_queued: bool = False


@dataclass(frozen=True, slots=True)
class SummaryDelta:
    """What one committed batch changes in the listing's summary (scripts.COMMIT)."""

    #: The batch names the session (its last ``session_info``): the name, "" for none.
    name: str | None = None
    #: The batch's first user message, as the listing shows it ("" for none).
    first: str = ""
    #: The batch holds a redaction: drop the summary (a listing rebuilds it).
    reset: bool = False

    def args(self) -> list[str | bytes]:
        if self.reset:
            return ["!", "", ""]
        if self.name is None:
            return ["-", "", _text(self.first)]
        return ["=", _text(self.name), _text(self.first)]


def _text(value: str) -> bytes:
    """Text as Redis keeps it: UTF-8, a lone surrogate (JavaScript strings may hold one, and
    pi's entries are JavaScript's) passed through as ``_read_text`` reads it back."""
    return value.encode("utf-8", "surrogatepass")


def _read_text(value: Any) -> str:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else str(value)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _b(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")


def _commit_result(res: Any) -> CommitResult:
    code = _s(res[0])
    if code == "INCARNATION":
        return CommitResult(code, inc=_s(res[1]))
    if code == "HYDRATE":
        return CommitResult(code)
    if code == "OK":
        return CommitResult(
            code,
            seq=int(res[1]),
            pending_segments=int(res[2]),
            pending_bytes=int(res[3]),
            job_queued=bool(int(res[4])),
        )
    return CommitResult(code, seq=int(res[1]))


def parse_version(text: str) -> tuple[int, ...]:
    """``"7.0.15"`` -> (7, 0, 15); what is not a number counts as 0."""
    return tuple(int(p) if p.isdigit() else 0 for p in text.split(".")[:3])


__all__ = [
    "CheckResult",
    "CommitResult",
    "Offering",
    "SummaryDelta",
    "TailState",
    "parse_recent",
    "parse_version",
    "recent_value",
]
