"""The compactor: merges segments into bases, writes manifests, purges redacted content and
deletes retired objects after a grace period. See docs/compaction.md.

Operators::

    from compactor import Compactor
    c = Compactor(store)                  # a store.SessionStore
    c.compact_session("my-session")      # -> CompactionResult
    c.gc()                               # -> GcResult
    c.history("my-session")              # -> [CompactionRecord], newest first

The worker process is ``python -m compactor`` (``compactor.worker.Worker``).
"""

from compactor.compact import Compactor, migrate_session
from compactor.config import CompactorOptions, WorkerOptions
from coordination.jobs import Job, JobQueue, ParkedJob
from compactor.records import BaseRef, CompactionRecord, CompactionResult, GcResult
from compactor.worker import Worker, WorkerStats

__all__ = [
    "BaseRef",
    "CompactionRecord",
    "CompactionResult",
    "Compactor",
    "CompactorOptions",
    "GcResult",
    "Job",
    "JobQueue",
    "ParkedJob",
    "Worker",
    "WorkerOptions",
    "WorkerStats",
    "migrate_session",
]
