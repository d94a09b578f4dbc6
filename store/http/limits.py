"""Per-tenant limits: request rate, byte rate, live followers.

| limit | counts | over it |
| --- | --- | --- |
| ``requests_per_s`` | every request of the tenant (a token bucket of one second's worth) | 429 ``rate-limited`` |
| ``bytes_per_s`` | bytes of request bodies, as they arrive (a token bucket that may go into debt) | 429 ``rate-limited`` for the next request with a body |
| ``followers`` | live reads open at once (SSE responses and long-polls) | 429 ``too-many-followers`` for the next one |

Every 429 says ``Retry-After``: the seconds until the bucket allows the request, rounded up
(1 for followers: a follower leaves when it leaves).

A byte bucket admits a body while it is not in debt and charges the body's bytes as they
arrive, so a body larger than a second's worth still goes through, and the requests after it
wait until the debt is paid: over any long stretch, a tenant's bodies average at most its
rate. A request bucket holds one second's worth of requests (at least one).

Defaults for every tenant come from ``serve``'s flags (all off by default); the tokens file
may set a tenant's own (``"limits": {"acme": {...}}``), key by key over the defaults, ``null``
turning one off. The operator tenant ``*`` is limited only by its own entry. Limits are
counted by each service process alone: N processes behind a balancer allow up to N times.

Every method runs on the event loop's thread (the ASGI middleware of ``store/http/gate.py``),
so none needs a lock; time comes from ``clock`` (a fake clock in tests).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from store.errors import InvalidInputError

LIMIT_KEYS = ("requests_per_s", "bytes_per_s", "followers")
#: Limit values given for a tenant (only the keys given; None: off for that tenant).
LimitOverrides = Mapping[str, "float | None"]


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """One tenant's limits (None: no limit)."""

    #: Requests a second.
    requests_per_s: float | None = None
    #: Bytes of request bodies a second.
    bytes_per_s: float | None = None
    #: Live reads (SSE, long-poll) open at once.
    followers: int | None = None

    def __post_init__(self) -> None:
        for key in LIMIT_KEYS:
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise InvalidInputError(f"{key} must be positive, not {value}")

    @property
    def any(self) -> bool:
        return any(getattr(self, key) is not None for key in LIMIT_KEYS)


def parse_overrides(value: Any, where: str) -> LimitOverrides:
    """A tenant's ``limits`` object of the tokens file, checked."""
    if not isinstance(value, dict):
        raise InvalidInputError(f"{where}: an object of {', '.join(LIMIT_KEYS)}")
    for key, v in value.items():
        if key not in LIMIT_KEYS:
            raise InvalidInputError(f"{where}: unknown limit {key!r} (known: {', '.join(LIMIT_KEYS)})")
        whole = key == "followers"
        if v is not None and (isinstance(v, bool) or not isinstance(v, int if whole else (int, float))
                              or not v > 0 or not math.isfinite(v)):
            raise InvalidInputError(f"{where}: {key} is a positive {'integer' if whole else 'number'} or null")
    return dict(value)


class Bucket:
    """A token bucket of ``rate`` a second holding at most ``burst``; it may go into debt."""

    __slots__ = ("rate", "burst", "level", "at")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.level, self.at = rate, burst, burst, now

    def _refill(self, now: float) -> None:
        self.level = min(self.burst, self.level + (now - self.at) * self.rate)
        self.at = now

    def wait(self, need: float, now: float) -> float:
        """Seconds until the bucket holds ``need`` (0: it does now)."""
        self._refill(now)
        return 0.0 if self.level >= need else (need - self.level) / self.rate

    def take(self, amount: float, now: float) -> None:
        self._refill(now)
        self.level -= amount


def retry_after(seconds: float) -> str:
    """A ``Retry-After`` value: whole seconds, rounded up, at least 1."""
    return str(max(1, math.ceil(seconds)))


class Limiter:
    """The limits of every tenant of one service process."""

    def __init__(self, defaults: TenantLimits | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.defaults = defaults or TenantLimits()
        self.clock = clock
        self._requests: dict[str, Bucket] = {}
        self._bytes: dict[str, Bucket] = {}
        self._followers: dict[str, int] = {}

    def limits_of(self, tenant: str, overrides: Mapping[str, LimitOverrides]) -> TenantLimits:
        own = overrides.get(tenant)
        base = TenantLimits() if tenant == "*" else self.defaults
        return base if own is None else replace(base, **own)  # type: ignore[arg-type]

    def _bucket(self, buckets: dict[str, Bucket], tenant: str, rate: float, burst: float) -> Bucket:
        bucket = buckets.get(tenant)
        if bucket is None or bucket.rate != rate:  # new, or its tenant's limit changed
            bucket = buckets[tenant] = Bucket(rate, burst, self.clock())
        return bucket

    def request(self, tenant: str, limits: TenantLimits, *, has_body: bool) -> tuple[str, float] | None:
        """Admit one request (taking its token), or ``(what, seconds to wait)``."""
        now = self.clock()
        if limits.bytes_per_s is not None and has_body:
            bytes_bucket = self._bucket(self._bytes, tenant, limits.bytes_per_s, limits.bytes_per_s)
            wait = bytes_bucket.wait(0, now)
            if wait > 0:
                return f"byte rate ({limits.bytes_per_s:g} bytes/s)", wait
        if limits.requests_per_s is not None:
            rate = limits.requests_per_s
            bucket = self._bucket(self._requests, tenant, rate, max(1.0, rate))
            wait = bucket.wait(1, now)
            if wait > 0:
                return f"request rate ({rate:g}/s)", wait
            bucket.take(1, now)
        return None

    def body_bytes(self, tenant: str, limits: TenantLimits, n: int) -> None:
        """Charge ``n`` bytes of a body that arrived."""
        if limits.bytes_per_s is not None and n:
            self._bucket(self._bytes, tenant, limits.bytes_per_s, limits.bytes_per_s).take(n, self.clock())

    def follow(self, tenant: str, limits: TenantLimits) -> bool:
        """Count one more live reader of ``tenant``; False (counting nothing) over its cap."""
        open_now = self._followers.get(tenant, 0)
        if limits.followers is not None and open_now >= limits.followers:
            return False
        self._followers[tenant] = open_now + 1
        return True

    def unfollow(self, tenant: str) -> None:
        left = self._followers.get(tenant, 0) - 1
        if left > 0:
            self._followers[tenant] = left
        else:
            self._followers.pop(tenant, None)

    def followers(self, tenant: str) -> int:
        return self._followers.get(tenant, 0)


__all__ = ["LIMIT_KEYS", "Bucket", "LimitOverrides", "Limiter", "TenantLimits", "parse_overrides",
           "retry_after"]
