"""Create-if-absent with the retry policy, and the read-back of a taken key: the one place
that decides whether a key found taken holds our own earlier attempt (its ``nonce``).

A create whose response was lost is retried (by the policy); the resend then meets our own
object and answers "taken". So "taken" after one attempt means another writer's object,
and "taken" after a resend means *perhaps ours*: only reading the object back tells, and if
that read fails the outcome is unknown (``IndeterminateError``), never "not written".
"""

from __future__ import annotations

from collections.abc import Callable

from store.errors import BackendError, IndeterminateError, ObjectExistsError, ObjectNotFoundError
from store.backends.objects import ObjectStore, StoredObject
from store.retry import RetryPolicy


def create(
    objects: ObjectStore, retry: RetryPolicy, key: str, data: bytes, metadata: dict[str, str]
) -> int:
    """``put_if_absent`` under ``retry``. Returns 0 when the object was created, else the
    number of attempts made when the key was found taken. ``BackendUnavailableError`` when
    every attempt failed (the create may still have landed)."""
    return _attempts(retry, lambda: objects.put_if_absent(key, data, metadata))


def _attempts(retry: RetryPolicy, put: Callable[[], None]) -> int:
    attempts = 0

    def attempt() -> None:
        nonlocal attempts
        attempts += 1
        put()

    try:
        retry.call(attempt)
    except ObjectExistsError:
        return attempts
    return 0


def read_taken(objects: ObjectStore, retry: RetryPolicy, key: str, attempts: int) -> StoredObject:
    """The object in a key ``create`` found taken after ``attempts`` attempts (see the
    module docstring for what a failure to read it means). ``ObjectNotFoundError`` passes
    through: the object was deleted since."""
    if attempts <= 1:
        return retry.call(lambda: objects.get(key))
    try:
        return retry.call(lambda: objects.get(key))
    except ObjectNotFoundError:
        raise
    except BackendError as exc:
        raise IndeterminateError(
            f"{key!r}: a re-sent create met an object that could not be read ({exc}); "
            "re-sending is safe"
        ) from exc


__all__ = ["create", "read_taken"]
