"""The retention runner: TTLs and store-wide policies, run by the compactor worker.

What to do with a session is decided by ``store.lifecycle.retention`` from the session's own log and
records (``RetentionStore.view`` and ``decide``), and done with compare-and-set appends of
markers (``trash``, ``purge``): a wrong, early, duplicated or lost *schedule* entry can never
make anything be trashed or purged early. This module only decides *when* to look:

- **The schedule**: a Redis sorted set of (session, when to look) written by whoever sets a
  TTL, trashes, restores, or finds a session not due yet (its exact deadline then). Sessions
  with nothing due cost nothing. An entry that comes early finds the session not due and is
  moved to its real deadline (activity only ever pushes a sliding deadline later, so an
  entry is early or right, never late, except when lost).
- **The sweep**: every ``sweep_ms`` (and at once after Redis lost the schedule), one walk of
  the listing (a LIST and a Redis pipeline a page) and of the retention records finds what
  no entry names: sessions idle under the store-wide policy, settings whose entry was lost,
  trashed sessions whose purge entry was lost.

One runner at a time: each run takes a lease in Redis (``scripts.SWEEP_LEASE`` on its own
hash), extended after every session; a run happens at most once per ``poll_ms`` across the
fleet. A runner that pauses past its lease and resumes can only act through the same
compare-and-set appends (a stale decision is a ``ConflictError``), and stops at its next
progress report. ``dry_run`` takes no lease and writes nothing: it reports what a run would
trash and purge.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from compactor.config import Clock, wall_clock_ms
from store.errors import (
    BackendError,
    ConflictError,
    NotInTrashError,
    SessionHasForksError,
    SessionNotFoundError,
    SessionStoreError,
)
from store.faults import FaultHook
from store.protocol.listing import SessionFilter
from store.lifecycle.retention import Decision, Retention, RetentionPolicy

if TYPE_CHECKING:
    from store.core import SessionStore

log = logging.getLogger("sessionstore.compactor.retention")


@dataclass(frozen=True, slots=True)
class RetentionOptions:
    """How often the runner runs (``WorkerOptions`` carries them for the worker)."""

    #: A run (due entries) at most this often, fleet-wide.
    poll_ms: int = 60_000
    #: The sweep (every session) at most this often.
    sweep_ms: int = 6 * 60 * 60 * 1000
    #: The runner's lease, extended after every session.
    lease_ms: int = 60_000
    #: Due entries taken per run.
    batch: int = 500

    def __post_init__(self) -> None:
        if min(self.poll_ms, self.sweep_ms) < 0 or self.lease_ms <= 0 or self.batch <= 0:
            raise ValueError("poll_ms and sweep_ms must be >= 0, lease_ms and batch positive")


@dataclass(frozen=True, slots=True)
class RetentionReport:
    """What one run did (or, ``dry_run``, would do)."""

    ran: bool = True
    dry_run: bool = False
    swept: bool = False
    trashed: tuple[str, ...] = ()
    purged: tuple[str, ...] = ()
    #: In the trash past their grace period, kept for their live forks.
    held: tuple[str, ...] = ()
    #: Decided on, then changed before the marker (an append won): left alone.
    changed: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    decisions: tuple[Decision, ...] = field(default=(), compare=False)


class RetentionRunner:
    def __init__(
        self,
        store: SessionStore,
        policy: RetentionPolicy | None = None,
        options: RetentionOptions | None = None,
        *,
        now: Clock = wall_clock_ms,
        worker: str = "retention",
        fault_hook: FaultHook | None = None,
    ) -> None:
        self.store = store
        self.policy = policy or RetentionPolicy()
        self.options = options or RetentionOptions()
        self.now = now
        self.worker = worker
        self.fault_hook = fault_hook
        self.ctx = store.ctx
        self.rs = store.retention

    def fault(self, point: str, **ctx: object) -> None:
        if self.fault_hook is not None:
            self.fault_hook(point, dict(ctx))

    # --- a run -----------------------------------------------------------------------------

    def run(self, *, dry_run: bool = False, sweep: bool | None = None,
            stop: threading.Event | None = None) -> RetentionReport:
        """One run: the due entries, and the sweep when it is due (``sweep``: force it on or
        off). ``dry_run``: every session is judged (a sweep), nothing is written."""
        coord = self.ctx.coord
        opts = self.options
        now = self.now()
        key = coord.keys.retention_run
        if not dry_run:
            got = coord.sweep_lease(self.worker, now, opts.lease_ms, opts.poll_ms, key=key)
            if got is None:
                return RetentionReport(ran=False)
        do_sweep = True if dry_run else sweep
        if do_sweep is None:
            do_sweep = self._sweep_due(now)
        candidates: dict[str, None] = {}
        if not dry_run:
            for sid in coord.retention_due(now, opts.batch):
                candidates[sid] = None
        if do_sweep:
            for sid in self._sweep(now, dry_run):
                candidates[sid] = None
        acts: dict[str, list[str]] = {k: [] for k in ("trashed", "purged", "held", "changed", "errors")}
        decisions = []
        for sid in candidates:
            if stop is not None and stop.is_set():
                break
            decision = self._judge(sid, now, acts)
            if decision is None:
                continue
            decisions.append(decision)
            if dry_run:
                if decision.action == "trash":
                    acts["trashed"].append(sid)
                elif decision.action == "purge" and decision.view is not None:
                    held = self.rs.live_forks(sid, decision.view.incarnation)
                    acts["held" if held else "purged"].append(sid)
                continue
            self._act(decision, now, acts)
            if not coord.sweep_progress(self.worker, sid, self.now(), opts.lease_ms, key=key):
                log.info("retention lease lost: another worker carries on", extra={"at": sid})
                return self._report(acts, decisions, dry_run, do_sweep)
        if not dry_run:
            if do_sweep:
                coord.retention_mark_swept(now)
            coord.sweep_progress(self.worker, "", self.now(), opts.lease_ms, done=True, key=key)
        report = self._report(acts, decisions, dry_run, do_sweep)
        if report.trashed or report.purged or report.held:
            log.info("retention run", extra={"dry_run": dry_run, "trashed": len(report.trashed),
                                             "purged": len(report.purged), "held": len(report.held)})
        return report

    @staticmethod
    def _report(acts: dict[str, list[str]], decisions: list[Decision], dry_run: bool, swept: bool) -> RetentionReport:
        return RetentionReport(True, dry_run, swept, tuple(acts["trashed"]), tuple(acts["purged"]),
                               tuple(acts["held"]), tuple(acts["changed"]), tuple(acts["errors"]),
                               tuple(decisions))

    def _sweep_due(self, now: int) -> bool:
        last = self.ctx.coord.retention_swept()
        return last is None or now >= last + self.options.sweep_ms

    def _judge(self, sid: str, now: int, acts: dict[str, list[str]]) -> Decision | None:
        try:
            view, _ = self.rs.view(sid)
        except SessionNotFoundError:
            self._unschedule(sid)
            return None
        except SessionStoreError as exc:
            acts["errors"].append(f"{sid}: {exc!r}")
            return None
        decision = self.rs.decide(view, self.policy, now)
        self.fault("retention.decided", session_id=sid, action=decision.action)
        return decision

    def _act(self, d: Decision, now: int, acts: dict[str, list[str]]) -> None:
        sid, view = d.session_id, d.view
        assert view is not None
        try:
            if d.action == "trash":
                self.rs.trash(view, reason=d.reason, grace_ms=self.policy.grace_ms, now=now)
                acts["trashed"].append(sid)
            elif d.action == "purge":
                try:
                    self.rs.purge(view, now=now)
                    acts["purged"].append(sid)
                except SessionHasForksError:
                    acts["held"].append(sid)
                    self.rs._count("held")
                    self._schedule(sid, now + self.policy.fork_recheck_ms)
            elif d.action == "wait" and d.next_ms is not None:
                self._schedule(sid, d.next_ms)
            else:
                self._unschedule(sid)
        except (ConflictError, NotInTrashError):
            # The session moved since the decision (an append, a restore): judged again on
            # the next run, from what it is then.
            acts["changed"].append(sid)
            self._schedule(sid, now)
        except SessionNotFoundError:
            self._unschedule(sid)  # deleted meanwhile
        except SessionStoreError as exc:
            acts["errors"].append(f"{sid}: {exc!r}")
            log.warning("retention of a session failed", extra={"session_id": sid, "error": repr(exc)})

    def _schedule(self, sid: str, due: int) -> None:
        try:
            self.ctx.coord.retention_schedule(sid, due)
        except BackendError as exc:
            log.warning("retention not scheduled: the sweep finds it", extra={"session_id": sid, "error": repr(exc)})

    def _unschedule(self, sid: str) -> None:
        try:
            self.ctx.coord.retention_unschedule(sid)
        except BackendError:
            pass

    # --- the sweep -------------------------------------------------------------------------

    def _sweep(self, now: int, dry_run: bool) -> list[str]:
        """Sessions to judge now: idle past the policy by the listing's ``updated``, in the
        trash past their grace, or with a setting that may have expired. Entries for the
        others' next look are (re)written, unless ``dry_run``."""
        store = self.store
        policy = self.policy
        # Settings: one LIST of every record (sessions with one); the newest of each is read
        # below. A session with a setting of its own is not under the store-wide policy.
        layout = store.layout
        prefix = layout.retention_prefix
        # By incarnation: records of another life of the id (an earlier one, or a create
        # that was withdrawn and made again) say nothing of the session that lives now.
        by_life: dict[tuple[str, str], str] = {}
        for item in store.options.retry.call(lambda: list(store.objects.list(prefix))):
            parsed = layout.parse_beside(item.key, prefix)
            if parsed is not None:
                by_life[parsed[0], parsed[1]] = item.key  # listed in order: the last is the newest
        newest: dict[str, str] = {}
        updated: dict[str, int] = {}
        out: list[str] = []
        for info in store.iter_sessions(page_size=1000, filters=SessionFilter(trashed=None)):
            sid = info.session_id
            activity = info.updated_at_ms or info.created_at_ms
            updated[sid] = activity
            record = by_life.get((sid, info.incarnation or ""))
            if record is not None:
                newest[sid] = record
            if info.trash_purge_after_ms is not None:
                if info.trash_purge_after_ms <= now:
                    out.append(sid)
                elif not dry_run:
                    self._schedule_earlier(sid, info.trash_purge_after_ms)
            elif info.kind == "pi" and policy.idle_ms is not None and sid not in newest:
                if activity + policy.idle_ms <= now:
                    out.append(sid)
                elif not dry_run:
                    self._schedule_earlier(sid, activity + policy.idle_ms)
        for sid, key in newest.items():  # sessions listed, by the record of their own life
            try:
                r = Retention.from_json(store.objects.get(key).data)
            except SessionStoreError:
                out.append(sid)  # replaced meanwhile, unreadable: judge it whole
                continue
            if r.ttl_ms is not None:
                due: int | None = max(updated[sid], r.set_at_ms) + r.ttl_ms
            else:
                due = r.expires_at_ms
            if due is None:
                continue
            if due <= now:
                out.append(sid)
            elif not dry_run:
                self._schedule_earlier(sid, due)
        return list(dict.fromkeys(out))

    def _schedule_earlier(self, sid: str, due: int) -> None:
        try:
            self.ctx.coord.retention_schedule(sid, due, earlier_only=True)
        except BackendError:
            pass


__all__ = ["RetentionOptions", "RetentionReport", "RetentionRunner"]
