"""What a manifest says about a compaction, and what a compaction or GC pass returns.

A manifest (``manifest/<gen:016d>.json``, written once with If-None-Match) is the only thing
that makes a base reachable. The reader in ``store/core.py`` depends on ``generation``,
``through_seq``, ``seq_counts`` and ``bases``; everything else is for GC, operators and
``compaction history``. Field by field:

``schema``                 1
``session_id``, ``incarnation``
``generation``             previous generation + 1 (the first manifest is 1)
``previous_generation``    0 for the first
``through_seq``            the last segment merged; readers read segments after it
``seq_counts``             entries of each segment 1..through_seq, so ids keep their segment
                           number (an idempotent re-send answers with the original seq)
``bases``                  ``[{"key", "sha256", "entries", "bytes"}]`` in commit order
``entry_count``            sum of ``seq_counts`` = entries in the bases
``last_entry_id``          id of the last entry in the bases ("" if none)
``compaction``             this compaction: ``segments_merged`` [first, last], ``segment_count``,
                           ``entries`` (written to the bases), ``entries_merged`` (from the
                           segments), ``bytes_in`` (previous bases + segments read),
                           ``segment_bytes``, ``bytes_out``, ``redactions_purged`` (entries
                           whose content this compaction replaced by a tombstone), ``worker``,
                           ``started_at``/``finished_at`` (ISO-8601 UTC) and their ``_ms``
``retired``                keys this manifest makes unreachable: the previous manifest, the
                           previous bases, the merged segments
``grace_ms``               the grace period of the compactor that wrote it
``delete_after_ms``        ``finished_at_ms + grace_ms``: nothing retired goes before this
``history``                the ``compaction`` records of earlier generations (newest first,
                           bounded), each with its ``generation``: GC deletes old manifests,
                           so the history travels forward in the newest one
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

MANIFEST_SCHEMA = 1


def iso_ms(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


@dataclass(frozen=True, slots=True)
class BaseRef:
    key: str
    sha256: str
    entries: int
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "sha256": self.sha256, "entries": self.entries, "bytes": self.bytes}


@dataclass(frozen=True, slots=True)
class CompactionRecord:
    """One compaction as ``compaction history`` shows it."""

    generation: int
    segments_merged: tuple[int, int]
    entries: int
    bytes_in: int
    bytes_out: int
    redactions_purged: int
    worker: str
    started_at: str
    finished_at: str

    @classmethod
    def from_json(cls, generation: int, raw: dict[str, Any]) -> "CompactionRecord":
        first, last = raw.get("segments_merged") or (0, 0)
        return cls(
            generation=int(raw.get("generation", generation)),
            segments_merged=(int(first), int(last)),
            entries=int(raw.get("entries", 0)),
            bytes_in=int(raw.get("bytes_in", 0)),
            bytes_out=int(raw.get("bytes_out", 0)),
            redactions_purged=int(raw.get("redactions_purged", 0)),
            worker=str(raw.get("worker", "")),
            started_at=str(raw.get("started_at", "")),
            finished_at=str(raw.get("finished_at", "")),
        )


@dataclass(frozen=True, slots=True)
class CompactionResult:
    session_id: str
    #: ``compacted``: our manifest won. ``lost``: another worker created the same generation
    #: first (our bases were deleted). ``nothing``: no segment after the latest manifest.
    outcome: str
    generation: int = 0
    manifest_key: str = ""
    segments_merged: tuple[int, int] | None = None
    segment_count: int = 0
    entries: int = 0
    bytes_in: int = 0
    segment_bytes: int = 0
    bytes_out: int = 0
    redactions_purged: int = 0
    base_keys: tuple[str, ...] = ()
    #: More segments followed than one compaction may merge (``max_segments``).
    more_pending: bool = False


@dataclass(frozen=True, slots=True)
class GcResult:
    sessions: int = 0
    #: Keys deleted, by kind: segment, base, manifest, orphan_base, stale_incarnation.
    deleted: tuple[tuple[str, str], ...] = ()
    #: Unreachable objects whose grace period has not ended yet.
    waiting: int = 0
    errors: tuple[str, ...] = ()

    @property
    def deleted_keys(self) -> list[str]:
        return [k for _, k in self.deleted]

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.deleted if k == kind)

    def __add__(self, other: "GcResult") -> "GcResult":
        return GcResult(
            self.sessions + other.sessions,
            self.deleted + other.deleted,
            self.waiting + other.waiting,
            self.errors + other.errors,
        )
