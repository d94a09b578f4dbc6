"""The worker loop of ``python -m compactor``.

Each pass: heartbeat (when due), take over jobs other workers left pending too long
(XAUTOCLAIM), else read new ones (XREADGROUP, blocking briefly), and run them. A job: park it
if it has been delivered too often; clear the session's queued marker; compact (repeatedly if
more segments wait than one compaction merges; each compaction schedules the GC of what it
retired); acknowledge. GC runs outside the job loop, in two threads of the worker
(``compactor/schedule.py``): one collects the sessions the schedule says are due, the other
runs the slow sweep when it is due and no other worker runs it. A failing job stays pending and comes back through XAUTOCLAIM after
``claim_idle_ms``; on its ``max_deliveries``-th failure it is parked with its error.

Stopping (as rq does it): the first SIGTERM or SIGINT is a warm stop (finish the current job,
then leave); the second is a cold stop (leave now; the job stays pending and another worker
takes it over). ``burst=True`` drains the queue and returns (tests, cron). Cleanup (heartbeat
removed, consumer removed when it holds no job, counters logged) runs in ``finally``.

In a thread of another program (the embedded default's maintenance, ``compactor/maintenance.py``)
the worker is stopped by an event instead of a signal, and waits for jobs without blocking in
Redis (``WorkerOptions.idle_max_ms``): a stop then ends the wait at once, where a blocked
XREADGROUP would hold it up to ``block_ms``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from dataclasses import asdict, dataclass, replace
from types import FrameType
from typing import Any

from compactor.compact import Compactor
from compactor.config import WorkerOptions, wall_clock_ms
from compactor.records import CompactionResult
from compactor.retention import RetentionOptions, RetentionRunner
from compactor.schedule import GcScheduler
from coordination.jobs import Job, JobQueue
from store.errors import BackendError, SessionNotFoundError, SessionStoreError
from store.lifecycle.retention import RetentionPolicy

log = logging.getLogger("sessionstore.compactor.worker")

# Compactions one job may run back to back when a backlog exceeds ``max_segments``.
_MAX_ROUNDS_PER_JOB = 10


class ColdStop(BaseException):
    """Raised from the signal handler on the second SIGTERM: abandon the current job."""


@dataclass(slots=True)
class WorkerStats:
    """Counters of one worker process (mutable state, reported in heartbeats and at exit)."""

    #: Passes of the job loop (each takes jobs or waits for them; no GC in them).
    passes: int = 0
    jobs_done: int = 0
    jobs_failed: int = 0
    jobs_parked: int = 0
    jobs_lost: int = 0
    jobs_empty: int = 0
    segments_merged: int = 0
    entries_written: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    redactions_purged: int = 0
    gc_deleted: int = 0
    #: Retention runs of this worker: sessions moved to the trash, purged, held by forks.
    retention_trashed: int = 0
    retention_purged: int = 0
    retention_held: int = 0
    #: Enqueue-to-start delay of the last job and the largest seen (ms).
    lag_ms_last: int = 0
    lag_ms_max: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Worker:
    def __init__(
        self,
        compactor: Compactor,
        options: WorkerOptions | None = None,
        *,
        stop: threading.Event | None = None,
    ) -> None:
        """``stop``: an event that, once set, is a warm stop (as :meth:`request_stop`); a
        wait for jobs ends at once when it is set."""
        self.compactor = compactor
        self.options = options or WorkerOptions()
        self.name = compactor.worker
        self.queue = JobQueue(compactor.ctx.coord, group=self.options.group, consumer=self.name)
        self.stats = WorkerStats()
        self._stop = stop if stop is not None else threading.Event()
        self._signalled = False
        self._started_ms = wall_clock_ms()
        self._last_heartbeat = float("-inf")
        self.gc = GcScheduler(compactor, self.options)
        o = self.options
        self.retention = RetentionRunner(
            compactor.store,
            RetentionPolicy(idle_ms=o.retention_idle_ms, grace_ms=o.retention_grace_ms),
            RetentionOptions(poll_ms=o.retention_poll_ms, sweep_ms=o.retention_sweep_ms),
            now=compactor.now, worker=self.name, fault_hook=compactor.fault_hook,
        )
        self._gc_stop = threading.Event()
        self._stats_lock = threading.Lock()
        # XREADGROUP must return before the client's socket timeout reads it as a dead server.
        timeout_ms = int(compactor.store.options.redis_socket_timeout * 1000)
        self._block_ms = max(1, min(self.options.block_ms, timeout_ms // 2))

    def stats_now(self) -> WorkerStats:
        """A copy of the counters, consistent with each other (metrics read it)."""
        with self._stats_lock:
            return replace(self.stats)

    # --- stopping ----------------------------------------------------------------------------

    @property
    def _stopping(self) -> bool:
        return self._signalled or self._stop.is_set()

    def request_stop(self) -> None:
        """Warm stop: finish the current job, then return from :meth:`run`."""
        self._stop.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stopping:
            log.warning("cold stop", extra={"signal": signum})
            raise ColdStop()
        log.info("warm stop requested", extra={"signal": signum})
        # A flag, not the event: Event.set takes a lock the interrupted code may hold.
        self._signalled = True

    # --- the loop ----------------------------------------------------------------------------

    def run(self, *, burst: bool = False) -> int:
        """Serve jobs until stopped (or, with ``burst``, until the queue is drained).

        Returns a process exit code: 0 after a warm stop or a drained burst, 1 after a cold
        stop or when Redis stayed unreachable in burst mode.
        """
        handlers: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                handlers[sig] = signal.signal(sig, self._on_signal)
        code = 0
        failures = 0
        log.info("worker started", extra={"worker": self.name, "burst": burst, "pid": os.getpid()})
        grouped = False
        idle_ms = self.options.block_ms
        threads = [] if burst else self._start_gc()
        try:
            while not self._stopping:
                try:
                    if not grouped:
                        self.queue.ensure_group()
                        grouped = True
                    self.stats.passes += 1
                    self._heartbeat()
                    jobs = self.queue.claim_stale(self.options.claim_idle_ms, self.options.batch)
                    if not jobs:
                        block = None if burst or self.options.idle_max_ms else self._block_ms
                        jobs = self.queue.read_new(self.options.batch, block)
                    failures = 0
                except BackendError as exc:
                    # A Redis that lost its data (restart without persistence, FLUSHALL) has
                    # lost the group too (NOGROUP): create it again on the next pass.
                    grouped = False
                    failures += 1
                    log.warning("queue unavailable", extra={"error": str(exc), "attempt": failures})
                    if burst and failures >= 5:
                        code = 1
                        break
                    self._stop.wait(min(5.0, 0.1 * 2**failures))
                    continue
                if not jobs:
                    if burst:
                        break
                    if self.options.idle_max_ms:
                        # Not a blocked read: a wait that a stop ends, growing while idle.
                        self._stop.wait(idle_ms / 1000)
                        idle_ms = min(idle_ms * 2, self.options.idle_max_ms)
                    continue
                idle_ms = self.options.block_ms
                for job in jobs:
                    if self._stopping:
                        break  # left pending: another worker claims it after claim_idle_ms
                    try:
                        self.process(job)
                    except BackendError as exc:
                        # Redis failed around the job (take, ack, park): it stays pending
                        # and comes back through XAUTOCLAIM.
                        log.warning("job bookkeeping failed", extra={"job_id": job.id, "error": str(exc)})
        except ColdStop:
            code = 1
        finally:
            self._gc_stop.set()
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            for thread in threads:
                thread.join(self.options.gc_lease_ms / 1000)
            self.queue.leave()
            log.info("worker stopped", extra={"worker": self.name, "code": code, **self.stats.as_dict()})
        return code

    def process(self, job: Job) -> None:
        """Run one job to an outcome: acknowledged, parked, or left pending to retry."""
        c = self.compactor
        opts = self.options
        ctx = {"session_id": job.session_id, "job_id": job.id, "deliveries": job.deliveries}
        lag = max(0, wall_clock_ms() - job.enqueued_at_ms)
        self.stats.lag_ms_last = lag
        self.stats.lag_ms_max = max(self.stats.lag_ms_max, lag)
        if job.deliveries > opts.max_deliveries:
            # Delivered again and again without ever finishing or failing: a worker dies on
            # it (out of memory, killed). Park it before it takes another one down.
            self._park(job, "TooManyDeliveries", f"delivered {job.deliveries} times without completing")
            return
        self.queue.take(job)
        c.fault("job.after_take", **ctx)
        try:
            rounds = 0
            while True:
                result = c.compact_session(job.session_id)
                rounds += 1
                self._count(result)
                if result.outcome != "compacted" or not result.more_pending or rounds >= _MAX_ROUNDS_PER_JOB:
                    break
                if self._stopping:
                    # A warm stop waits for one compaction, not for a whole backlog: the job
                    # stays pending, and a worker takes it over after claim_idle_ms.
                    log.info("job left pending at stop", extra={**ctx, "rounds": rounds})
                    return
        except SessionNotFoundError:
            log.info("session gone, job dropped", extra=ctx)
            self.queue.ack(job)
            return
        except Exception as exc:
            self.stats.jobs_failed += 1
            level = logging.WARNING if isinstance(exc, SessionStoreError) else logging.ERROR
            log.log(level, "job failed", exc_info=not isinstance(exc, SessionStoreError),
                    extra={**ctx, "error_type": type(exc).__name__, "error": str(exc)})
            if job.deliveries >= opts.max_deliveries:
                self._park(job, type(exc).__name__, str(exc))
            return
        c.fault("job.before_ack", **ctx)
        self.queue.ack(job)
        self.stats.jobs_done += 1

    def _count(self, result: CompactionResult) -> None:
        s = self.stats
        if result.outcome == "lost":
            s.jobs_lost += 1
        elif result.outcome == "nothing":
            s.jobs_empty += 1
        else:
            s.segments_merged += result.segment_count
            s.entries_written += result.entries
            s.bytes_in += result.bytes_in
            s.bytes_out += result.bytes_out
            s.redactions_purged += result.redactions_purged

    def _park(self, job: Job, error_type: str, error: str) -> None:
        self.queue.park(job, error_type, error, worker=self.name, now_ms=wall_clock_ms())
        self.stats.jobs_parked += 1
        log.error(
            "job parked",
            extra={"session_id": job.session_id, "job_id": job.id, "deliveries": job.deliveries,
                   "error_type": error_type, "error": error},
        )

    def _heartbeat(self) -> None:
        now = time.monotonic()
        if now - self._last_heartbeat < self.options.heartbeat_interval_ms / 1000:
            return
        self._last_heartbeat = now
        self.queue.heartbeat(
            {
                "last_seen_ms": wall_clock_ms(),
                "started_at_ms": self._started_ms,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                **self.stats.as_dict(),
            }
        )

    # --- GC, outside the job loop ------------------------------------------------------------

    def _start_gc(self) -> list[threading.Thread]:
        loops: list[tuple[str, Any, int]] = []
        if self.options.gc_poll_ms > 0:
            loops.append(("gc-due", self.gc.collect_due, self.options.gc_poll_ms))
        if self.options.gc_interval_ms > 0:
            # Whether a sweep is due is asked at most once a minute (and once at start).
            poll = min(self.options.gc_interval_ms, 60_000)
            loops.append(("gc-sweep", lambda: self.gc.sweep(self._gc_stop), poll))
        if self.options.retention_poll_ms > 0:
            loops.append(("retention", self.run_retention, self.options.retention_poll_ms))
        threads = []
        for name, step, every_ms in loops:
            thread = threading.Thread(target=self._gc_loop, args=(step, every_ms),
                                      name=f"{self.name}-{name}", daemon=True)
            thread.start()
            threads.append(thread)
        return threads

    def run_retention(self) -> None:
        """One retention run, if it is this worker's turn (a lease in Redis)."""
        report = self.retention.run(stop=self._gc_stop)
        with self._stats_lock:
            self.stats.retention_trashed += len(report.trashed)
            self.stats.retention_purged += len(report.purged)
            self.stats.retention_held += len(report.held)

    def _gc_loop(self, step: Any, every_ms: int) -> None:
        while not self._gc_stop.is_set():
            try:
                result = step()
            except Exception as exc:  # GC is housekeeping: it never takes the worker down
                log.warning("gc failed", exc_info=not isinstance(exc, SessionStoreError),
                            extra={"error": str(exc)})
                result = None
            if result is not None and result.deleted:
                with self._stats_lock:
                    self.stats.gc_deleted += len(result.deleted)
            if result is None or not result.sessions:  # a backlog: go on at once
                self._gc_stop.wait(every_ms / 1000)
