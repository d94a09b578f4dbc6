"""What a compaction or GC pass returns, and a compaction as ``compaction history`` shows it.
The manifest format itself (every field) is defined in ``store/protocol/manifest.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
    #: Bases of the previous manifest named again as they are (``compactor/tiers.py``).
    bases_kept: int = 0


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
