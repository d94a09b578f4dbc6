"""Tunables, the clock and the fault-hook type of the compactor.

Time matters to the compactor in one place only: the grace period before anything retired is
deleted. Every decision that compares times uses one injectable clock (``Clock``, epoch
milliseconds), so tests move time with a fake clock instead of sleeping. The clocks of all
compactor machines must agree to well within the grace period: a manifest records its
``finished_at_ms`` on one machine and the GC of another compares it with its own clock.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from typing import Callable

#: Epoch milliseconds.
from store.clock import now_ms

Clock = Callable[[], int]

DEFAULT_GRACE_MS = 10 * 60 * 1000


wall_clock_ms = now_ms


def new_worker_id() -> str:
    """Unique per process and run: it names the consumer in the job group."""
    host = socket.gethostname().split(".", 1)[0] or "host"
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in host)[:40]
    return f"{safe}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True, slots=True)
class CompactorOptions:
    """What one compaction and one GC pass may do."""

    #: Retired objects (merged segments, old bases, old manifests) and orphans are deleted only
    #: this long after they stopped being reachable. It must exceed the longest read, the
    #: longest pause of a compactor between writing its base and its manifest, the clock skew
    #: between machines, and any staleness Redis can suffer (docs/compaction.md).
    grace_ms: int = DEFAULT_GRACE_MS
    #: A base object is cut after this many bytes (a compaction holds at most one in memory).
    max_base_bytes: int = 64 * 1024 * 1024
    #: Runs of bases are merged geometrically (``compactor/tiers.py``): a compaction rewrites
    #: a run of older bases only while it is smaller than this many times what it rewrites
    #: anyway. Larger: fewer bases per session, more bytes rewritten per byte appended.
    merge_ratio: float = 2.0
    #: Segments merged by one compaction at most; a job runs several compactions if needed.
    max_segments: int = 10_000
    #: Objects fetched ahead while scanning (memory holds at most this many at once).
    read_ahead: int = 4
    #: Compaction records of earlier generations carried forward in each manifest.
    history_limit: int = 50
    #: How far apart the clocks of the machines may be (ms). A purge (``compactor/purge.py``)
    #: waits this much beyond a rebuild's age limit before it deletes segments.
    clock_skew_ms: int = 2_000
    #: Named in each manifest it writes and in the job group (consumer name).
    worker: str = ""

    def __post_init__(self) -> None:
        if self.grace_ms < 0:
            raise ValueError("grace_ms must be >= 0")
        if self.max_base_bytes <= 0 or self.max_segments <= 0 or self.read_ahead <= 0:
            raise ValueError("max_base_bytes, max_segments and read_ahead must be positive")
        if not self.merge_ratio > 1:
            raise ValueError("merge_ratio must be > 1")
        if not self.worker:
            object.__setattr__(self, "worker", new_worker_id())


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """The job loop of ``python -m compactor``."""

    #: Consumer group on the jobs stream; every worker of a fleet uses the same one.
    group: str = "compactors"
    #: A job pending this long with another (presumably dead) worker is taken over.
    claim_idle_ms: int = 60_000
    #: Deliveries after which a failing job is parked instead of retried.
    max_deliveries: int = 5
    #: XREADGROUP BLOCK; kept below the Redis socket timeout (the worker clamps it).
    block_ms: int = 1000
    #: 0: wait for jobs in a blocked XREADGROUP (``block_ms``), as a worker process does.
    #: > 0: ask without blocking and, while none come, wait between asks from ``block_ms``,
    #: doubling, up to this (ms): for a worker in a thread of another program, whose stop
    #: (an event) then ends the wait at once (``compactor/maintenance.py``).
    idle_max_ms: int = 0
    heartbeat_interval_ms: int = 5_000
    #: Scheduled GC (compactor/schedule.py): a thread of the worker looks for due sessions
    #: this often (0: this worker runs no scheduled GC).
    gc_poll_ms: int = 1000
    #: A claimed schedule entry is this worker's for this long; a worker that dies or
    #: pauses longer lets another take it. Must exceed one session's GC.
    gc_lease_ms: int = 60_000
    #: Entries claimed per bucket and call.
    gc_batch: int = 100
    #: The sweep (the full GC pass that finds orphans and entries Redis lost) runs once per
    #: this period, by one worker at a time (0: this worker never sweeps).
    gc_interval_ms: int = 24 * 60 * 60 * 1000
    #: Sessions the sweep collects per second at most (0: no limit).
    sweep_rate: float = 20.0
    #: The sweeper's lease, extended after every session; a sweeper that stops or pauses
    #: longer is replaced by another that carries on from the cursor it left in Redis.
    sweep_lease_ms: int = 60_000
    #: Jobs taken per XREADGROUP / XAUTOCLAIM call. More than one makes a warm stop strand
    #: the extra jobs with this consumer until another worker's ``claim_idle_ms`` passes.
    batch: int = 1
    #: Retention (compactor/retention.py): trash pi sessions without a TTL of their own that
    #: are idle this long (None: no store-wide policy; sessions' own TTLs still run).
    retention_idle_ms: int | None = None
    #: How long a trashed session stays restorable before it is purged.
    retention_grace_ms: int = 7 * 24 * 60 * 60 * 1000
    #: A retention run at most this often, fleet-wide (0: this worker runs no retention).
    retention_poll_ms: int = 60_000
    #: The retention sweep (every session: idle ones, lost schedule entries) this often.
    retention_sweep_ms: int = 6 * 60 * 60 * 1000

    def __post_init__(self) -> None:
        if self.block_ms <= 0 or self.idle_max_ms < 0:
            raise ValueError("block_ms must be positive and idle_max_ms >= 0")
        if min(self.gc_poll_ms, self.gc_interval_ms, self.sweep_rate) < 0:
            raise ValueError("gc_poll_ms, gc_interval_ms and sweep_rate must be >= 0")
        if self.gc_lease_ms <= 0 or self.sweep_lease_ms <= 0 or self.gc_batch <= 0:
            raise ValueError("gc_lease_ms, sweep_lease_ms and gc_batch must be positive")
