"""The one retry policy for transient backend failures.

Only ``BackendUnavailableError`` is retried. A conflict, a collision or an unknown parent is an
answer, never a failure, and is never retried here. The policy is composed once (attempts OR
elapsed time, jittered exponential waits) and shared by the object stores and the
coordinator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

import tenacity

from store.errors import BackendUnavailableError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempts OR elapsed time, with full-jitter exponential waits.

    The default budget is chosen to ride out what a healthy deployment does to its clients:
    a Redis restart with its append-only file (about a second), a failover (seconds), an S3
    503 SlowDown burst. Ten attempts wait about 4.6 s in all on average (0.05 s doubling,
    capped at 2 s, jittered), never more than 20 s; an outage longer than that reaches the
    caller as ``BackendUnavailableError`` (before a segment PUT: nothing was written) or
    ``IndeterminateError`` (after it: re-send the batch).
    """

    attempts: int = 10
    max_elapsed: float = 20.0
    initial_wait: float = 0.05
    max_wait: float = 2.0

    def retrying(self) -> tenacity.Retrying:
        return tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(BackendUnavailableError),
            stop=tenacity.stop_after_attempt(self.attempts)
            | tenacity.stop_after_delay(self.max_elapsed),
            wait=tenacity.wait_random_exponential(multiplier=self.initial_wait, max=self.max_wait),
            reraise=True,
        )

    def call(self, fn: Callable[[], T]) -> T:
        # The first attempt runs outside tenacity: building a Retrying costs more than a
        # Redis round trip on loopback, and almost every call succeeds at once.
        try:
            return fn()
        except BackendUnavailableError:
            if self.attempts <= 1:
                raise
        retrying = self.retrying()
        retrying.stop = tenacity.stop_after_attempt(self.attempts - 1) | tenacity.stop_after_delay(
            self.max_elapsed
        )
        return retrying(fn)


DEFAULT_RETRY = RetryPolicy()
