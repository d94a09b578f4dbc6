"""When maintenance runs, kept in Redis: GC's first-seen marks, GC's schedule and sweep
(``compactor/schedule.py``), retention's schedule and sweep (``compactor/retention.py``) and
the compaction job queue (``coordination/jobs.py`` consumes it). Redis says *when*, never
*whether*: every decision is taken again from the object store, so a lost or duplicated entry
delays work and deletes nothing early.
"""

from __future__ import annotations

from collections.abc import Sequence

from coordination.client import RedisClient
from coordination.formats import _s


class ScheduleCalls(RedisClient):
    """The maintenance schedules' calls of the coordinator."""

    # --- GC marks and jobs (other slots: never inside a per-session script) ------------------

    def gc_first_seen(self, sid: str, inc: str, now_ms: int) -> int | None:
        """When GC first saw objects of incarnation ``inc`` of a session without a header
        (marked now if never). Losing the mark only delays a deletion."""
        key, field = self.keys.gc_seen, f"{sid}/{inc}"

        def mark() -> object:
            self.client.hsetnx(key, field, now_ms)
            return self.client.hget(key, field)

        seen = self._call(mark, retry=False)
        return int(seen) if isinstance(seen, (bytes, str, int)) else None

    def gc_forget_seen(self, sid: str, incs: Sequence[str]) -> None:
        fields = [f"{sid}/{inc}" for inc in incs]
        if fields:
            self._call(lambda: self.client.hdel(self.keys.gc_seen, *fields), retry=False)

    # --- the GC schedule and sweep (compactor/schedule.py) ----------------------------------

    def gc_schedule(self, sid: str, due_ms: int) -> None:
        """GC of ``sid`` is due at ``due_ms`` (an earlier entry of the session stays)."""
        key = self.keys.gc_due(self.keys.gc_bucket(sid))
        self._call(lambda: self.client.zadd(key, {sid: due_ms}, lt=True))

    def gc_claim(self, bucket: int, now_ms: int, lease_ms: int, limit: int) -> tuple[int, list[str]]:
        """Sessions of ``bucket`` whose GC is due, leased to the caller until the deadline
        returned (scripts.GC_CLAIM)."""
        keys = [self.keys.gc_due(bucket), self.keys.gc_leased(bucket)]
        got = self._call(lambda: self._gc_claim(keys=keys, args=[now_ms, lease_ms, limit]), retry=False)
        return int(_s(got[0])), [_s(m) for m in got[1:]]

    def gc_done(self, sid: str, deadline_ms: int, again_ms: int | None = None) -> bool:
        """Give back the lease on ``sid`` (due again at ``again_ms`` if given)."""
        bucket = self.keys.gc_bucket(sid)
        keys = [self.keys.gc_due(bucket), self.keys.gc_leased(bucket)]
        args = [sid, deadline_ms, "" if again_ms is None else again_ms]
        return bool(self._call(lambda: self._gc_done(keys=keys, args=args)))

    def gc_scheduled(self, sid: str) -> tuple[int | None, int | None]:
        """(due ms, lease deadline ms) of ``sid`` in the schedule (operators, tests)."""
        bucket = self.keys.gc_bucket(sid)
        due = self._call(lambda: self.client.zscore(self.keys.gc_due(bucket), sid))
        leased = self._call(lambda: self.client.zscore(self.keys.gc_leased(bucket), sid))
        return (None if due is None else int(due)), (None if leased is None else int(leased))

    def sweep_lease(
        self, worker: str, now_ms: int, lease_ms: int, period_ms: int, *, key: str | None = None
    ) -> tuple[str, int | None] | None:
        """Take or extend the sweep's lease: (cursor, ms the last sweep finished), or None
        when another worker holds it or no sweep is due (scripts.SWEEP_LEASE). ``key``:
        another sweep's hash (the retention runner's) instead of GC's."""
        args = [worker, now_ms, lease_ms, period_ms]
        keys = [key or self.keys.gc_sweep]
        got = self._call(lambda: self._sweep_lease(keys=keys, args=args), retry=False)
        if not got or int(got[0]) != 1:
            return None
        done = _s(got[2])
        return _s(got[1]), (int(done) if done else None)

    def sweep_progress(
        self, worker: str, cursor: str, now_ms: int, lease_ms: int, *, done: bool = False,
        key: str | None = None,
    ) -> bool:
        """Record the sweep's cursor and extend the lease (or record its end and give the
        lease up); False when the lease is another worker's (scripts.SWEEP_PROGRESS)."""
        args = [worker, cursor, now_ms if done else "", now_ms, lease_ms]
        keys = [key or self.keys.gc_sweep]
        return bool(self._call(lambda: self._sweep_progress(keys=keys, args=args)))

    # --- retention (compactor/retention.py): when, never whether -------------------------------

    def retention_schedule(self, sid: str, due_ms: int, *, earlier_only: bool = False) -> None:
        """Look at ``sid``'s retention at ``due_ms`` (``earlier_only``: keep an earlier entry)."""
        key = self.keys.retention_due
        self._call(lambda: self.client.zadd(key, {sid: due_ms}, lt=earlier_only))

    def retention_unschedule(self, sid: str) -> None:
        key = self.keys.retention_due
        self._call(lambda: self.client.zrem(key, sid))

    def retention_due(self, now_ms: int, limit: int) -> list[str]:
        """Up to ``limit`` sessions whose entry is due at ``now_ms``, earliest first."""
        key = self.keys.retention_due
        got = self._call(lambda: self.client.zrangebyscore(key, "-inf", now_ms, start=0, num=limit))
        return [_s(m) for m in got]

    def retention_scheduled(self, sid: str) -> int | None:
        key = self.keys.retention_due
        got = self._call(lambda: self.client.zscore(key, sid))
        return None if got is None else int(got)

    def retention_swept(self) -> int | None:
        """When the retention runner's last sweep began (None: never, or Redis forgot)."""
        key = self.keys.retention_run
        got = self._call(lambda: self.client.hget(key, "swept"))
        return None if got is None else int(got)

    def retention_mark_swept(self, now_ms: int) -> None:
        key = self.keys.retention_run
        self._call(lambda: self.client.hset(key, "swept", now_ms))

    def retention_count(self, event: str, n: int = 1) -> None:
        key = self.keys.retention_stats
        self._call(lambda: self.client.hincrby(key, event, n))

    def retention_stats(self) -> dict[str, int]:
        key = self.keys.retention_stats
        got = self._call(lambda: self.client.hgetall(key))
        return {_s(k): int(v) for k, v in (got or {}).items()}

    def enqueue_compaction(self, sid: str, *, reason: str, ttl_s: int = 3600) -> bool:
        """Queue one job for the session unless one is already pending."""

        def go() -> bool:
            if not self.client.set(self.keys.job_pending(sid), reason, nx=True, ex=ttl_s):
                return False
            self.client.xadd(self.keys.jobs, {"session": sid, "reason": reason})
            return True

        return self._call(go, retry=False)


__all__ = ["ScheduleCalls"]
