"""When GC runs: a schedule of due sessions, and a slow sweep for what no schedule names.

GC of a session (``compactor/gc.py``, ``Compactor.gc_session``) decides *what* to delete from
its own LIST of the session; this module only decides *when* it runs, so a wrong, early,
duplicated or lost entry can never delete anything early (docs/design.md, "GC").

- **The schedule.** Whoever creates a manifest that retires objects (a compaction, a GC
  fence) records ``(session, due ms)`` right after the create (:func:`schedule_gc`): a sorted
  set scored by due time, spread over ``coordination.keys.GC_BUCKETS`` keys by a hash of the
  session id. An earlier entry of the session stays (``ZADD LT``). Workers drain it
  (:meth:`GcScheduler.collect_due`): a script moves due entries to a *leased* set with a
  deadline, GC runs for each, and the entry leaves only when GC succeeded, by the worker whose
  lease it still is (``GC_DONE``). A worker that dies or pauses past its deadline lets the
  next claim of any worker put the entry back as due. When something still waits after the
  run (a grace period not over yet, a fence not possible now), the entry comes back one grace
  period later: everything retired by then is due by then. A session with nothing due costs
  nothing.
- **The sweep.** A crashed writer's zombie segment, a deleted session's leftovers, bases of a
  compactor that died before its manifest, sessions without header, and entries lost with
  Redis are found by the full pass (``Compactor.gc``'s ``collect_session`` for every session
  directory), run by one worker at a time under a lease in Redis, at a bounded rate of
  sessions per second, once per ``gc_interval_ms`` (a day by default) (:meth:`sweep`). It
  keeps a cursor in Redis: a sweeper that stops or pauses past its lease is replaced by
  another that carries on from the cursor; the paused one finds the lease gone at its next
  session and stops. A flushed Redis forgets the last sweep too, so a sweep starts at once.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from compactor.config import CompactorOptions
from compactor.records import GcResult
from coordination.keys import GC_BUCKETS
from store.errors import BackendError, SessionStoreError
from store.protocol.listing import session_page

if TYPE_CHECKING:
    from compactor.config import WorkerOptions
    from coordination.redis import Coordinator
    from store.protocol.context import StoreContext

log = logging.getLogger("sessionstore.compactor.schedule")

#: Session directories one LIST of the sweep returns.
_SWEEP_PAGE = 1000


def schedule_gc(coord: Coordinator, sid: str, due_ms: int) -> None:
    """Record that GC of ``sid`` is due at ``due_ms``. Without Redis the entry is lost, and
    what it would have collected waits for the sweep: nothing is deleted early."""
    try:
        coord.gc_schedule(sid, due_ms)
    except BackendError as exc:
        log.warning("gc not scheduled: the sweep will find it",
                    extra={"session_id": sid, "due_ms": due_ms, "error": repr(exc)})


class Collector(Protocol):
    """What the schedule runs: GC of one session (``compactor.compact.Compactor``)."""

    ctx: StoreContext
    options: CompactorOptions

    @property
    def worker(self) -> str: ...

    def now(self) -> int: ...

    def fault(self, point: str, **ctx: Any) -> None: ...

    def gc_session(self, session_id: str) -> GcResult: ...


class GcScheduler:
    """Scheduled GC and the sweep, for one worker (``compactor.worker`` runs them in
    threads of their own; tests call them directly with a fake clock)."""

    def __init__(self, compactor: Collector, options: WorkerOptions) -> None:
        self.compactor = compactor
        self.options = options
        self.ctx = compactor.ctx
        self.now = compactor.now
        self.worker = compactor.worker
        self._next_bucket = hash(self.worker) % GC_BUCKETS  # workers start apart

    # --- the schedule ------------------------------------------------------------------------

    def collect_due(self) -> GcResult:
        """Claim the due entries of every bucket and GC their sessions."""
        total = GcResult()
        start = self._next_bucket
        self._next_bucket = (start + 1) % GC_BUCKETS
        for i in range(GC_BUCKETS):
            bucket = (start + i) % GC_BUCKETS
            deadline, sids = self.ctx.coord.gc_claim(
                bucket, self.now(), self.options.gc_lease_ms, self.options.gc_batch
            )
            for sid in sids:
                total = total + self._collect(sid, deadline)
        return total

    def _collect(self, sid: str, deadline: int) -> GcResult:
        self.compactor.fault("gc.claimed", session_id=sid, deadline=deadline)
        try:
            result = self.compactor.gc_session(sid)
        except SessionStoreError as exc:
            # The entry stays leased: when the lease runs out it is due again.
            log.warning("scheduled gc failed", extra={"session_id": sid, "error": repr(exc)})
            return GcResult(errors=(f"{sid}: {exc!r}",))
        again = self.now() + self.compactor.options.grace_ms if result.waiting else None
        try:
            if not self.ctx.coord.gc_done(sid, deadline, again):
                log.info("gc lease ran out meanwhile: another worker has the entry",
                         extra={"session_id": sid})
        except BackendError as exc:
            log.warning("gc entry not released", extra={"session_id": sid, "error": repr(exc)})
        return result

    # --- the sweep ---------------------------------------------------------------------------

    def sweep(self, stop: threading.Event | None = None) -> GcResult | None:
        """Run (or carry on) the full sweep if it is due and no other worker holds it; None
        when it is not this worker's to run. Returns when finished, when ``stop`` is set, or
        when the lease was lost (another worker carries on)."""
        opts = self.options
        coord = self.ctx.coord
        got = coord.sweep_lease(self.worker, self.now(), opts.sweep_lease_ms, opts.gc_interval_ms)
        if got is None:
            return None
        cursor, _ = got
        log.info("gc sweep", extra={"from": cursor or None, "rate": opts.sweep_rate})
        layout = self.ctx.layout
        objects = self.ctx.objects
        retry = self.ctx.options.retry
        total = GcResult()
        pace = 1.0 / opts.sweep_rate if opts.sweep_rate > 0 else 0.0
        next_at = time.monotonic()
        while True:
            # In the layout's order: shard after shard in the spread layout (one LIST a page
            # all the same, ``store.protocol.listing.session_page``); the cursor is a session id.
            page, more = retry.call(lambda: session_page(objects, layout, cursor or None, _SWEEP_PAGE))
            for sid in page:
                if stop is not None and stop.is_set():
                    return total
                delay = next_at - time.monotonic()
                if delay > 0 and (stop.wait(delay) if stop is not None else time.sleep(delay)):
                    return total
                next_at = max(next_at, time.monotonic()) + pace
                self.compactor.fault("gc.sweep.session", session_id=sid)
                try:
                    total = total + self.compactor.gc_session(sid)
                except SessionStoreError as exc:
                    log.warning("gc of a session failed", extra={"session_id": sid, "error": repr(exc)})
                    total = total + GcResult(errors=(f"{sid}: {exc!r}",))
                cursor = sid
                if not coord.sweep_progress(self.worker, cursor, self.now(), opts.sweep_lease_ms):
                    log.info("gc sweep lease lost: another worker carries on", extra={"at": sid})
                    return total
            if not more or not page:
                break
        coord.sweep_progress(self.worker, "", self.now(), opts.sweep_lease_ms, done=True)
        log.info("gc sweep finished", extra={"sessions": total.sessions, "deleted": len(total.deleted)})
        return total


__all__ = ["GcScheduler", "schedule_gc"]
