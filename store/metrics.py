"""What the store counts and times, as Prometheus metrics (docs/operations.md lists them all).

A ``Metrics`` holds the store's metric families in one ``prometheus_client`` registry: by
default the process's global one (``prometheus_client.REGISTRY``), so an application that
already exposes Prometheus metrics exposes the store's with them; ``sessionstore serve`` and
``python -m compactor work --metrics-port`` serve it. Without ``prometheus_client``
installed (the ``metrics`` extra) every method is a no-op and nothing is imported.

The library calls it from the places where an outcome is known: the facade (appends, reads),
each object-store backend (one observation a request), the Redis client (one a call), the
compactor's worker and the HTTP service. Label values are a small fixed set (an operation, an
outcome, a route class): never a session id, a tenant, a key or anything a client chooses.
"""

from __future__ import annotations

import threading
from typing import Any

from store.errors import (
    BackendRefusedError,
    BackendUnavailableError,
    ConflictError,
    IdCollisionError,
    IndeterminateError,
    ObjectExistsError,
    ObjectNotFoundError,
)

#: Latency buckets (seconds): from a Redis round trip on one machine to a slow S3 request.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Entries in one segment written.
ENTRY_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def append_outcome(exc: BaseException | None) -> str:
    """``ok``, ``conflict`` (refused: the tail moved, an id clash), ``indeterminate`` (may or
    may not have been stored) or ``error``."""
    if exc is None:
        return "ok"
    if isinstance(exc, IndeterminateError):
        return "indeterminate"
    if isinstance(exc, (ConflictError, IdCollisionError)):
        return "conflict"
    return "error"


def request_result(exc: BaseException | None) -> str:
    """An object-store or Redis request's result: ``ok``, ``not_found``, ``exists`` (a
    conditional create refused), ``unavailable`` (a transient failure: a timeout, a refused
    connection, a 5xx, throttling: 429 or S3's 503 SlowDown, once the client's own retries
    are spent), ``refused`` (access denied, a missing bucket) or ``error``."""
    if exc is None:
        return "ok"
    if isinstance(exc, ObjectNotFoundError):
        return "not_found"
    if isinstance(exc, ObjectExistsError):
        return "exists"
    if isinstance(exc, BackendUnavailableError):
        return "unavailable"
    if isinstance(exc, BackendRefusedError):
        return "refused"
    return "error"


class Metrics:
    """The store's metric families in one registry (``None``: the process's global one)."""

    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        self.registry = REGISTRY if registry is None else registry
        r = self.registry
        self.appends = Histogram(
            "sessionstore_append_seconds", "Appends, by outcome: ok, conflict, indeterminate, error",
            ["outcome"], buckets=LATENCY_BUCKETS, registry=r)
        self.segments = Histogram(
            "sessionstore_segment_entries", "Segments written by appends, by the entries each holds "
            "(its _count against the appends' is the appends a segment: group commit)",
            buckets=ENTRY_BUCKETS, registry=r)
        self.reads = Histogram(
            "sessionstore_read_seconds", "Reads of a whole session (load: a resume), by operation",
            ["op"], buckets=LATENCY_BUCKETS, registry=r)
        self.object_requests = Histogram(
            "sessionstore_object_request_seconds", "Object-store requests, by operation and result",
            ["op", "result"], buckets=LATENCY_BUCKETS, registry=r)
        self.redis_calls = Histogram(
            "sessionstore_redis_call_seconds", "Redis calls (a command, a script or a pipeline), by result",
            ["result"], buckets=LATENCY_BUCKETS, registry=r)
        # The HTTP service.
        self.http_requests = Histogram(
            "sessionstore_http_request_seconds", "HTTP requests, by route class, method and status",
            ["route", "method", "status"], buckets=LATENCY_BUCKETS, registry=r)
        self.http_open = Gauge(
            "sessionstore_http_open_requests", "HTTP requests being served now", registry=r)
        self.followers = Gauge(
            "sessionstore_http_live_followers", "Live readers waiting for new data, by kind: sse, long_poll",
            ["kind"], registry=r)
        for kind in ("sse", "long_poll"):  # both series exist from the start, at 0
            self.followers.labels(kind)

    # --- what the library calls ----------------------------------------------------------------

    def append(self, outcome: str, seconds: float) -> None:
        self.appends.labels(outcome).observe(seconds)

    def segment(self, entries: int) -> None:
        self.segments.observe(entries)

    def read(self, op: str, seconds: float) -> None:
        self.reads.labels(op).observe(seconds)

    def object_request(self, op: str, result: str, seconds: float) -> None:
        self.object_requests.labels(op, result).observe(seconds)

    def redis_call(self, result: str, seconds: float) -> None:
        self.redis_calls.labels(result).observe(seconds)

    def exposition(self) -> tuple[bytes, str]:
        """The registry in Prometheus's text format, and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class NoMetrics(Metrics):
    """What a process without ``prometheus_client`` gets: every observation is dropped."""

    def __init__(self) -> None:  # noqa: D107 - no families, no registry
        self.registry = None

    def append(self, outcome: str, seconds: float) -> None:
        pass

    def segment(self, entries: int) -> None:
        pass

    def read(self, op: str, seconds: float) -> None:
        pass

    def object_request(self, op: str, result: str, seconds: float) -> None:
        pass

    def redis_call(self, result: str, seconds: float) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return _NULL_FAMILY

    def exposition(self) -> tuple[bytes, str]:
        return b"# prometheus_client is not installed (pip install 'sessionstore[metrics]')\n", "text/plain"


class _NullFamily:
    def labels(self, *values: str) -> _NullFamily:
        return self

    def observe(self, value: float) -> None:
        pass

    def inc(self, value: float = 1) -> None:
        pass

    def dec(self, value: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass


_NULL_FAMILY = _NullFamily()
_default: Metrics | None = None
_default_lock = threading.Lock()


def default_metrics() -> Metrics:
    """The process's ``Metrics`` on the global registry (created once), or ``NoMetrics``."""
    global _default
    with _default_lock:
        if _default is None:
            try:
                _default = Metrics()
            except ImportError:
                _default = NoMetrics()
        return _default


__all__ = ["Metrics", "NoMetrics", "append_outcome", "default_metrics", "request_result"]
