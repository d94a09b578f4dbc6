"""The compactor worker's metrics, read when they are scraped (``--metrics-port``).

A ``prometheus_client`` collector over the worker's own counters (``WorkerStats``) and the
queue's backlog in Redis (one round trip a scrape), beside the store's metrics of the same
process (``store/metrics.py``: its object-store requests and Redis calls). docs/operations.md
says what each means and what to alert on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from store.errors import InvalidInputError, SessionStoreError

if TYPE_CHECKING:
    from compactor.worker import Worker

log = logging.getLogger(__name__)


class WorkerCollector:
    """Counters of one worker (since it started) and the queue it serves."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def describe(self) -> list[Any]:
        return []  # collected only when scraped: no families to check at registration

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.worker.stats_now()
        jobs = CounterMetricFamily("sessionstore_compactor_jobs", "Compaction jobs this worker ended, by "
                                   "outcome: done, failed (retried), parked (given up), lost, empty",
                                   labels=["outcome"])
        for outcome, n in (("done", s.jobs_done), ("failed", s.jobs_failed), ("parked", s.jobs_parked),
                           ("lost", s.jobs_lost), ("empty", s.jobs_empty)):
            jobs.add_metric([outcome], n)
        yield jobs
        yield CounterMetricFamily("sessionstore_compactor_segments_merged", "Segments merged into bases",
                                  value=s.segments_merged)
        flow = CounterMetricFamily("sessionstore_compactor_bytes", "Bytes read (in) and written (out) "
                                   "by compactions", labels=["direction"])
        flow.add_metric(["in"], s.bytes_in)
        flow.add_metric(["out"], s.bytes_out)
        yield flow
        yield CounterMetricFamily("sessionstore_gc_deleted_objects", "Objects deleted by GC",
                                  value=s.gc_deleted)
        retention = CounterMetricFamily("sessionstore_retention_sessions", "Sessions moved by retention "
                                        "runs of this worker, by action: trashed, purged, held (by forks)",
                                        labels=["action"])
        for action, n in (("trashed", s.retention_trashed), ("purged", s.retention_purged),
                          ("held", s.retention_held)):
            retention.add_metric([action], n)
        yield retention
        yield GaugeMetricFamily("sessionstore_compaction_lag_seconds", "Queued-to-started delay of the "
                                "last job this worker took", value=s.lag_ms_last / 1000)
        up = GaugeMetricFamily("sessionstore_compactor_redis_up", "1 when the last scrape read the queue "
                               "from Redis, 0 when it could not")
        try:
            length, oldest_ms = self.worker.queue.backlog()
        except SessionStoreError as exc:
            log.warning("metrics: queue not read", extra={"error": str(exc)})
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield GaugeMetricFamily("sessionstore_compaction_queue_jobs", "Compaction jobs queued or being "
                                "worked on, fleet-wide", value=length)
        age = 0.0 if oldest_ms is None else max(0.0, time.time() - oldest_ms / 1000)
        yield GaugeMetricFamily("sessionstore_compaction_oldest_job_age_seconds", "Age of the oldest job "
                                "in the queue (0: none)", value=age)


def serve_metrics(worker: Worker, host: str, port: int) -> Any:
    """Expose the process's registry (the store's metrics and this worker's) over HTTP on
    ``host:port``, in a daemon thread; returns the server (``shutdown()`` stops it)."""
    try:
        from prometheus_client import REGISTRY, start_http_server
    except ImportError:
        raise InvalidInputError("--metrics-port needs prometheus-client: pip install 'sessionstore[metrics]'") from None

    REGISTRY.register(WorkerCollector(worker))
    server, _thread = start_http_server(port, addr=host, registry=REGISTRY)
    return server
