"""The settings of one soak run, written once as ``config.json`` in the run directory and read
by every child process (writers, readers, the final reader)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

#: Every kind of fault the nemesis schedules. ``s3-restart`` exists only where the S3 server
#: keeps its data across a restart (SeaweedFS); moto keeps everything in memory, so on moto an
#: S3 outage is ``s3-down`` (the endpoint refuses connections) and ``s3-blackhole`` (it
#: accepts them and never answers), with the data intact behind it.
FAULT_KINDS = (
    "kill-writer",
    "kill-compactor",
    "pause-writer",
    "pause-compactor",
    "pause-reader",
    "redis-kill",
    "redis-flushall",
    "redis-script-flush",
    "redis-pause",
    "s3-drop",
    "s3-down",
    "s3-blackhole",
    "s3-restart",
)

#: Faults the writers inject into themselves: a SIGSTOP at a named point of the append
#: protocol (``StoreOptions.fault_hook``), resumed by the nemesis after the same kind of
#: pause as ``pause-writer``.
AIMED_POINTS = ("append.before_put", "append.after_put", "append.after_commit")


@dataclass
class SoakConfig:
    duration_s: float = 60.0
    seed: int = 1
    writers: int = 4
    readers: int = 2
    compactors: int = 2
    sessions: int = 3
    grace_ms: int = 2000
    backend: str = "moto"
    #: Full GC pass of every compactor this often (default: a third of the grace period).
    gc_interval_ms: int = 0
    #: Writers queue a compaction job once this many segments follow the last manifest.
    compact_after: int = 4
    #: Segments one compaction merges at most (a job runs several): a compaction must finish
    #: within half the grace period, and a backlog merged in one go would not.
    max_segments: int = 8
    #: Mean seconds between two nemesis faults.
    fault_interval_s: float = 1.5
    #: Mean seconds between two aimed pauses of one writer (0: none).
    aimed_interval_s: float = 10.0
    #: Each writer waits between 0 and twice this long between two appends (0: back to back,
    #: for long runs that count appends by the hundred thousand).
    pace_s: float = 0.15
    #: Kinds the nemesis may inject (default: every kind the backend supports).
    faults: list[str] = field(default_factory=list)
    #: Process pauses (SIGSTOP) last between grace + pause_min_extra_s and
    #: grace * 3 + pause_max_extra_s.
    pause_min_extra_s: float = 1.0
    pause_max_extra_s: float = 4.0
    #: Once the run is over, a writer keeps re-sending an unresolved batch this long at most.
    resolve_s: float = 60.0
    # Filled in by the orchestrator.
    workdir: str = ""
    objects_url: str = ""
    redis_url: str = ""
    redis_prefix: str = "soak"
    #: time.monotonic() (system-wide on Linux) after which writers start no new operation.
    deadline: float = 0.0
    session_ids: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.gc_interval_ms:
            self.gc_interval_ms = max(100, self.grace_ms // 3)

    @property
    def grace_s(self) -> float:
        return self.grace_ms / 1000

    @property
    def stop_file(self) -> Path:
        return Path(self.workdir) / "STOP"

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> "SoakConfig":
        raw = json.loads(Path(path).read_text())
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})
