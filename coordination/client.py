"""The Redis connection: the one boundary where redis-py's exceptions become ``store.errors``.

A timeout or a lost connection is ``BackendUnavailableError`` (the caller's retry policy
decides), a server refusal is ``BackendRefusedError``. :class:`RedisClient` holds what every
part of the coordinator shares (the client, the key names, the retry policy, the registered
scripts); each part (``appends``, ``summaries``, ``schedules``, ``notifications``) adds the
calls of one concern, and ``coordination.redis.Coordinator`` is all of them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Self, TypeVar

import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from coordination import scripts
from coordination.keys import Keys
from store.errors import BackendRefusedError, BackendUnavailableError
from store.retry import DEFAULT_RETRY, RetryPolicy

T = TypeVar("T")


def _cluster_flag(url: str) -> tuple[str, bool]:
    """``redis://host:port/0?cluster=true`` (or ``redis+cluster://``) selects Redis Cluster."""
    from urllib.parse import parse_qsl, urlencode, urlparse, urlunparse

    parsed = urlparse(url)
    if "cluster" not in parsed.query and not parsed.scheme.endswith("+cluster"):
        return url, False  # untouched: urlunparse would mangle unix:///path
    scheme = parsed.scheme
    cluster = False
    if scheme.endswith("+cluster"):
        scheme, cluster = scheme[: -len("+cluster")], True
    query = []
    for key, value in parse_qsl(parsed.query):
        if key == "cluster":
            cluster = cluster or value.lower() in ("1", "true", "yes")
        else:
            query.append((key, value))
    return urlunparse(parsed._replace(scheme=scheme, query=urlencode(query))), cluster


def translate_redis_error(exc: Exception) -> Exception:
    if isinstance(exc, (redis.exceptions.TimeoutError, redis.exceptions.ConnectionError)):
        return BackendUnavailableError(f"Redis unavailable: {exc}")
    if isinstance(exc, redis.exceptions.ResponseError):
        msg = str(exc)
        if msg.startswith(("BUSY", "LOADING", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN", "READONLY")):
            return BackendUnavailableError(f"Redis busy: {msg}")
        return BackendRefusedError(f"Redis refused: {msg}")
    if isinstance(exc, redis.exceptions.RedisError):
        return BackendUnavailableError(f"Redis error: {exc}")
    if isinstance(exc, redis.exceptions.RedisClusterException):
        return BackendRefusedError(f"Redis Cluster refused: {exc}")
    return exc


def redis_call(fn: Callable[[], T]) -> T:
    """Run one redis-py call; its exceptions become ``store.errors`` (the one boundary)."""
    try:
        return fn()
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        raise translate_redis_error(exc) from exc


class RedisClient:
    """The connection, the key names, the retry policy and the registered scripts that every
    part of the coordinator (``coordination/redis.py``) shares."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str = "ss",
        retry: RetryPolicy = DEFAULT_RETRY,
        socket_timeout: float | None = None,
        max_blocking: int | None = None,
    ) -> None:
        self.client = client
        self.cluster = isinstance(client, redis.cluster.RedisCluster)
        self.keys = Keys(prefix)
        self.retry = retry
        # A writer waiting for its turn blocks on a connection of the client's pool: at most
        # a quarter of the pool waits at once (the others poll), so waiters never starve the
        # commands that would hand them their turn. A wait ends before the socket timeout.
        pool = getattr(client, "connection_pool", None)
        if socket_timeout is None and pool is not None:
            socket_timeout = pool.connection_kwargs.get("socket_timeout")
        self._block_cap_s = 0.5 * socket_timeout if socket_timeout else 1.0
        if max_blocking is None:
            max_blocking = max(1, int(getattr(pool, "max_connections", 100)) // 4) if pool else 25
        self._blocking = threading.BoundedSemaphore(max_blocking)
        self._check = client.register_script(scripts.CHECK)
        self._commit = client.register_script(scripts.COMMIT)
        self._install = client.register_script(scripts.INSTALL)
        self._forget = client.register_script(scripts.FORGET)
        self._compacted = client.register_script(scripts.COMPACTED)
        self._retired = client.register_script(scripts.RETIRED)
        self._summary = client.register_script(scripts.SUMMARY)
        self._position = client.register_script(scripts.POSITION)
        self._deleting = client.register_script(scripts.DELETING)
        self._release = client.register_script(scripts.RELEASE)
        self._gc_claim = client.register_script(scripts.GC_CLAIM)
        self._gc_done = client.register_script(scripts.GC_DONE)
        self._sweep_lease = client.register_script(scripts.SWEEP_LEASE)
        self._sweep_progress = client.register_script(scripts.SWEEP_PROGRESS)
        self._sharded: bool | None = None
        #: Told of every attempt of a call made with ``_call``: (exception or None, seconds);
        #: the store's metrics set it (``store/metrics.py``).
        self.observer: Callable[[BaseException | None, float], None] | None = None

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "ss",
        socket_timeout: float = 2.0,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> Self:
        # redis-py's own retries are off: one policy (ours) decides, and it only retries
        # what is safe to resend. Every script is idempotent regardless.
        url, cluster = _cluster_flag(url)
        client: Any
        if cluster:
            # Every per-session key is hash-tagged {sid}: each script touches one slot.
            client = redis.cluster.RedisCluster.from_url(
                url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_timeout,
                retry=Retry(NoBackoff(), 0),
            )
        else:
            client = redis.Redis.from_url(
                url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_timeout,
                retry=Retry(NoBackoff(), 0),
                health_check_interval=30,
            )
        return cls(client, prefix=prefix, retry=retry, socket_timeout=socket_timeout)

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:  # pragma: no cover - closing a dead pool
            pass

    def _call(self, fn: Callable[[], T], *, retry: bool = True) -> T:
        """One Redis call (a command, a script, a pipeline), retried by the policy unless
        ``retry=False``; each attempt is told to ``observer`` when one is set. (A writer's
        blocking wait for its turn is not a call: ``coordination/appends.py`` makes it with
        ``redis_call`` directly.)"""
        call = self._observed(fn) if self.observer is not None else (lambda: redis_call(fn))
        return self.retry.call(call) if retry else call()

    def _observed(self, fn: Callable[[], T]) -> Callable[[], T]:
        observer = self.observer
        assert observer is not None

        def attempt() -> T:
            started = time.perf_counter()
            try:
                out = redis_call(fn)
            except BaseException as exc:
                observer(exc, time.perf_counter() - started)
                raise
            observer(None, time.perf_counter() - started)
            return out

        return attempt

    def purge(self) -> int:
        """Delete every key under this coordinator's prefix (tests, demos, benchmarks: never
        the store's own path). Returns how many were deleted."""

        def go() -> int:
            deleted = 0
            batch: list[Any] = []
            for key in self.client.scan_iter(match=f"{self.keys.prefix}:*", count=1000):
                batch.append(key)
                if len(batch) >= 500:
                    deleted += self._unlink(batch)
                    batch.clear()
            return deleted + (self._unlink(batch) if batch else 0)

        return self._call(go, retry=False)

    def _unlink(self, keys: list[Any]) -> int:
        if self.cluster:  # keys of several slots cannot go in one command there
            return sum(int(self.client.unlink(k)) for k in keys)
        return int(self.client.unlink(*keys))

    def ping(self) -> bool:
        return bool(self._call(self.client.ping))


__all__ = ["RedisClient", "redis_call", "translate_redis_error"]
