"""The store's errors as HTTP answers: one table, the only place a status is decided.

Errors (``store/errors.py``) say what went wrong and carry what a caller needs to go on (a
tail, an epoch, an expected seq); which status and RFC 9457 problem ``code`` that is on the
wire, and which headers carry those values, is decided here and nowhere else. An error is
answered by the first of its classes (its ``__mro__``, most specific first) that the table
names; an error the table does not name is a 500 (``internal``), logged.
"""

from __future__ import annotations

from typing import Any, Callable

from store.errors import (
    BackendUnavailableError,
    BatchTooLargeError,
    ContentionError,
    ContentTypeMismatchError,
    EntryNotFoundError,
    IdCollisionError,
    IndeterminateError,
    InvalidInputError,
    InvalidOffsetError,
    ProducerEpochSeqError,
    ProducerSeqGapError,
    SessionExistsError,
    SessionNotFoundError,
    StaleEpochError,
    StreamClosedError,
    StreamError,
    StreamExistsError,
    StreamGoneError,
    StreamNotFoundError,
    StreamSeqConflictError,
    TailMismatchError,
    UnknownParentError,
)

#: Status and problem code of each error class.
STATUS: dict[type[Exception], tuple[int, str]] = {
    # durable streams
    InvalidOffsetError: (400, "invalid-offset"),
    ProducerEpochSeqError: (400, "producer-epoch-seq"),
    StaleEpochError: (403, "stale-producer-epoch"),
    StreamNotFoundError: (404, "stream-not-found"),
    StreamExistsError: (409, "stream-exists"),
    ContentTypeMismatchError: (409, "content-type-mismatch"),
    StreamClosedError: (409, "stream-closed"),
    StreamSeqConflictError: (409, "stream-seq-conflict"),
    ProducerSeqGapError: (409, "producer-sequence-gap"),
    StreamGoneError: (410, "stream-gone"),
    TailMismatchError: (412, "tail-mismatch"),
    StreamError: (400, "bad-request"),
    # sessions and entries
    BatchTooLargeError: (413, "too-large"),
    EntryNotFoundError: (404, "entry-not-found"),
    SessionExistsError: (409, "stream-exists"),
    IdCollisionError: (409, "id-collision"),
    UnknownParentError: (409, "unknown-parent"),
    SessionNotFoundError: (404, "stream-not-found"),
    InvalidInputError: (400, "bad-request"),
    # try again
    ContentionError: (503, "unavailable"),
    BackendUnavailableError: (503, "unavailable"),
    IndeterminateError: (503, "indeterminate"),
}

_RETRY = {"Retry-After": "1"}


def _tail_mismatch(exc: TailMismatchError) -> dict[str, str]:
    headers = {"Stream-Next-Offset": exc.actual}
    if exc.entry_id is not None:
        headers["Session-Tail-Entry-Id"] = exc.entry_id
    return headers


#: The headers that carry an error's values (every class below its entry's too).
_HEADERS: dict[type[Exception], Callable[[Any], dict[str, str]]] = {
    TailMismatchError: _tail_mismatch,
    StreamClosedError: lambda exc: {"Stream-Closed": "true", "Stream-Next-Offset": exc.next_offset},
    StaleEpochError: lambda exc: {"Producer-Epoch": str(exc.current_epoch)},
    ProducerSeqGapError: lambda exc: {
        "Producer-Expected-Seq": str(exc.expected), "Producer-Received-Seq": str(exc.received),
    },
    ContentionError: lambda exc: dict(_RETRY),
    BackendUnavailableError: lambda exc: dict(_RETRY),
    IndeterminateError: lambda exc: dict(_RETRY),
}


def problem_of(exc: BaseException) -> tuple[int, str, str, dict[str, str]] | None:
    """``(status, code, detail, headers)`` of ``exc``; None when the table does not name it
    (an internal error)."""
    for cls in type(exc).__mro__:
        answer = STATUS.get(cls)
        if answer is None:
            continue
        status, code = answer
        detail = str(exc)
        if isinstance(exc, IndeterminateError):
            detail = f"the outcome is unknown; re-send to find out ({exc})"
        header_of = next((_HEADERS[c] for c in type(exc).__mro__ if c in _HEADERS), None)
        return status, code, detail, header_of(exc) if header_of is not None else {}
    return None


__all__ = ["STATUS", "problem_of"]
