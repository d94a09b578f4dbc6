"""The compaction job queue: a Redis Stream read through one consumer group.

Producers (the append path, ``Coordinator.enqueue_compaction``) XADD ``{session, reason}`` to
``keys.jobs`` after setting the NX marker ``keys.job_pending(sid)``, so a session has at most
one job queued. Consumers (``compactor.worker``):

- take new jobs with XREADGROUP ``>``; a job then sits in the group's pending list (PEL),
  owned by the consumer, until acknowledged;
- take over jobs that a crashed or stuck consumer left pending longer than ``claim_idle_ms``
  with XAUTOCLAIM (at-least-once: a job may run twice, which compaction tolerates since the
  manifest create arbitrates);
- clear the session's marker when they start a job, so that appends during the compaction can
  queue the next one;
- acknowledge a finished job with XACK + XDEL in one MULTI on the stream's one key (the
  stream holds only live jobs;
  an entry is never deleted while pending, which Redis 6.2's XAUTOCLAIM would report as a
  nameless ``(None, None)``);
- park a job that failed ``max_deliveries`` times: its error goes to the ``keys.parked`` hash
  (session id -> JSON) and the job is acknowledged, so it is not retried forever.

The stream ID's millisecond part is the enqueue time on the Redis server: lag is measured
from it.

Every redis-py call goes through ``coordination.redis.redis_call``, the one mapping of
redis-py exceptions to ``store.errors``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from coordination.redis import Coordinator, redis_call
from store.errors import BackendError

log = logging.getLogger("sessionstore.compactor.jobs")


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    session_id: str
    reason: str
    #: How many times the group has handed this job out, this delivery included.
    deliveries: int

    @property
    def enqueued_at_ms(self) -> int:
        return int(self.id.split("-", 1)[0])


@dataclass(frozen=True, slots=True)
class ParkedJob:
    session_id: str
    job_id: str
    reason: str
    error_type: str
    error: str
    deliveries: int
    worker: str
    parked_at_ms: int


class JobQueue:
    def __init__(self, coord: Coordinator, *, group: str, consumer: str) -> None:
        self.coord = coord
        self.client = coord.client
        self.keys = coord.keys
        self.group = group
        self.consumer = consumer

    def ensure_group(self) -> None:
        def create() -> None:
            try:
                # From the start of the stream: jobs queued before any worker existed count.
                self.client.xgroup_create(self.keys.jobs, self.group, id="0", mkstream=True)
            except redis.exceptions.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

        redis_call(create)

    # --- taking jobs -------------------------------------------------------------------------

    def read_new(self, count: int, block_ms: int | None) -> list[Job]:
        """New jobs for this consumer; ``block_ms=None`` returns at once."""
        # redis-py types replies loosely (sync and async in one signature).
        res: Any = redis_call(
            lambda: self.client.xreadgroup(
                self.group, self.consumer, {self.keys.jobs: ">"}, count=count, block=block_ms
            )
        )
        jobs: list[Job] = []
        for _stream, messages in res or []:
            for msg_id, fields in messages:
                job = self._job(msg_id, fields, deliveries=1)
                if job is not None:
                    jobs.append(job)
        return jobs

    def claim_stale(self, min_idle_ms: int, count: int) -> list[Job]:
        """Jobs pending with any consumer for at least ``min_idle_ms``, now ours."""
        res = redis_call(
            lambda: self.client.xautoclaim(
                self.keys.jobs, self.group, self.consumer, min_idle_time=min_idle_ms,
                start_id="0-0", count=count,
            )
        )
        messages = res[1] if res and len(res) > 1 else []
        jobs: list[Job] = []
        vanished = False
        for msg_id, fields in messages:
            if msg_id is None or fields is None:
                vanished = True
                continue
            deliveries = self._deliveries(_s(msg_id))
            job = self._job(msg_id, fields, deliveries=deliveries)
            if job is not None:
                jobs.append(job)
        if vanished:
            self._ack_vanished()
        return jobs

    def _deliveries(self, msg_id: str) -> int:
        rows = redis_call(
            lambda: self.client.xpending_range(self.keys.jobs, self.group, min=msg_id, max=msg_id, count=1)
        )
        return int(rows[0]["times_delivered"]) if rows else 1

    def _job(self, msg_id: Any, fields: dict[Any, Any], *, deliveries: int) -> Job | None:
        data = {_s(k): _s(v) for k, v in fields.items()}
        sid = data.get("session", "")
        if not sid:
            # Not a job this code could have queued: drop it instead of failing on it forever.
            log.warning("malformed job dropped", extra={"job_id": _s(msg_id), "fields": data})
            self._ack(_s(msg_id))
            return None
        return Job(_s(msg_id), sid, data.get("reason", ""), deliveries)

    def _ack_vanished(self) -> None:
        """Acknowledge pending entries whose stream entry is gone (deleted while pending)."""
        rows = redis_call(
            lambda: self.client.xpending_range(
                self.keys.jobs, self.group, min="-", max="+", count=100, consumername=self.consumer
            )
        )
        for row in rows:
            msg_id = _s(row["message_id"])
            if not redis_call(lambda: self.client.xrange(self.keys.jobs, msg_id, msg_id)):
                redis_call(lambda: self.client.xack(self.keys.jobs, self.group, msg_id))

    # --- finishing jobs ----------------------------------------------------------------------

    def take(self, job: Job) -> None:
        """Clear the session's queued marker: appends from now on may queue a new job."""
        redis_call(lambda: self.client.delete(self.keys.job_pending(job.session_id)))

    def ack(self, job: Job) -> None:
        self._ack(job.id)

    def _ack(self, msg_id: str) -> None:
        def go() -> None:
            pipe = self.client.pipeline(transaction=True)
            pipe.xack(self.keys.jobs, self.group, msg_id)
            pipe.xdel(self.keys.jobs, msg_id)
            pipe.execute()

        redis_call(go)

    def park(self, job: Job, error_type: str, error: str, *, worker: str, now_ms: int) -> ParkedJob:
        parked = ParkedJob(
            session_id=job.session_id,
            job_id=job.id,
            reason=job.reason,
            error_type=error_type,
            error=error,
            deliveries=job.deliveries,
            worker=worker,
            parked_at_ms=now_ms,
        )
        payload = orjson.dumps({k: getattr(parked, k) for k in ParkedJob.__dataclass_fields__})
        # Two commands, not one MULTI: the parked hash and the stream live in different
        # Redis Cluster slots. A crash in between leaves the job pending; it is parked again
        # (the same field, overwritten) on its next delivery.
        redis_call(lambda: self.client.hset(self.keys.parked, job.session_id, payload))
        self._ack(job.id)
        return parked

    def parked(self) -> dict[str, ParkedJob]:
        raw = redis_call(lambda: self.client.hgetall(self.keys.parked))
        return {_s(k): ParkedJob(**orjson.loads(v)) for k, v in raw.items()}

    def requeue_parked(self, session_id: str) -> bool:
        """Operators: drop the parked record and queue the session again."""
        redis_call(lambda: self.client.hdel(self.keys.parked, session_id))
        redis_call(lambda: self.client.delete(self.keys.job_pending(session_id)))
        return self.coord.enqueue_compaction(session_id, reason="requeued")

    # --- fleet -------------------------------------------------------------------------------

    def heartbeat(self, info: dict[str, Any]) -> None:
        redis_call(lambda: self.client.hset(self.keys.workers, self.consumer, orjson.dumps(info)))

    def workers(self) -> dict[str, dict[str, Any]]:
        raw = redis_call(lambda: self.client.hgetall(self.keys.workers))
        return {_s(k): orjson.loads(v) for k, v in raw.items()}

    def backlog(self) -> tuple[int, int | None]:
        """Jobs in the queue (waiting or being worked on: a job leaves it when acknowledged)
        and when the oldest of them was queued (ms, from its stream id), in one round trip."""

        def go() -> tuple[int, int | None]:
            pipe = self.client.pipeline(transaction=False)
            pipe.xlen(self.keys.jobs)
            pipe.xrange(self.keys.jobs, "-", "+", count=1)
            length, first = pipe.execute()
            oldest = int(_s(first[0][0]).split("-")[0]) if first else None
            return int(length), oldest

        return redis_call(go)

    def pending(self) -> int:
        summary = redis_call(lambda: self.client.xpending(self.keys.jobs, self.group))
        return int(summary.get("pending", 0)) if isinstance(summary, dict) else 0

    def leave(self) -> None:
        """Remove this worker's heartbeat, and its consumer if it holds no job."""
        try:
            redis_call(lambda: self.client.hdel(self.keys.workers, self.consumer))
            mine = redis_call(
                lambda: self.client.xpending_range(
                    self.keys.jobs, self.group, min="-", max="+", count=1, consumername=self.consumer
                )
            )
            if not mine:
                # DELCONSUMER drops the consumer's pending entries: only when it has none.
                redis_call(lambda: self.client.xgroup_delconsumer(self.keys.jobs, self.group, self.consumer))
        except BackendError as exc:
            log.warning("could not leave the group cleanly", extra={"error": str(exc)})
