"""Every error the store raises, under one base class.

Foreign exceptions (botocore, redis-py, OSError) are translated into these at exactly one
boundary each (``store/backends/objects.py`` for object stores, ``coordination/redis.py`` for Redis),
with ``raise ... from exc`` so that the cause stays visible.

::

    SessionStoreError
    ├── InvalidInputError                   bad input; nothing was written
    │   ├── InvalidSessionIdError
    │   ├── InvalidEntryError               malformed entry, NaN, split surrogate pair, cycle, ...
    │   ├── InvalidKeyError                 an object key that is not a safe relative path
    │   ├── BatchTooLargeError
    │   └── InvalidRetentionError           a TTL or policy that makes no sense (negative, ...)
    ├── SessionNotFoundError
    │   └── SessionTrashedError             in the trash: says when it is purged, how to restore
    ├── SessionExistsError
    ├── EntryNotFoundError
    ├── WriteRefusedError                   the store refused a write that was well formed
    │   ├── ConflictError                   expected tail did not match (carries the real tail)
    │   ├── IdCollisionError                same id, different content
    │   ├── UnknownParentError              parentId is neither in the batch nor in the session
    │   ├── ContentionError                 too many rounds lost to other writers
    │   ├── NotInTrashError                 restore or purge of a session that is not in the trash
    │   └── SessionHasForksError            purge of a source that live forks still read
    ├── CorruptObjectError                  an object in the bucket is not what the store wrote
    │   └── DecryptionError                 (also EncryptionError) tampered ciphertext, or the
    │                                       wrong data key: never returned as garbage
    ├── EncryptionError                     encryption at rest (store/formats/crypto.py, store/protocol/keys.py)
    │   └── KeyUnavailableError             no key provider, a data key shredded or never made,
    │                                       a KEK the provider does not hold or cannot use
    ├── IndeterminateError                  outcome unknown; re-sending the same batch is safe
    ├── StreamError                         a durable-stream request refused (store/streams/)
    │   ├── InvalidOffsetError              (also InvalidInputError) not an offset of the stream
    │   ├── StreamNotFoundError             no such stream, or it expired
    │   ├── StreamGoneError                 deleted (or expired) while forks still read it
    │   ├── StreamExistsError               the name is taken by other settings or a gone stream
    │   ├── ContentTypeMismatchError
    │   ├── StreamClosedError               carries the tail (``next_offset``)
    │   ├── TailMismatchError               If-Match named another tail (carries the actual one)
    │   ├── StreamSeqConflictError          a Stream-Seq not after the last one
    │   ├── StaleEpochError                 a fenced producer (carries the current epoch)
    │   ├── ProducerSeqGapError             a producer seq out of order (expected, received)
    │   └── ProducerEpochSeqError           a new producer epoch that does not start at 0
    ├── BackendError
    │   ├── BackendUnavailableError         transient: timeouts, 5xx, connection refused
    │   ├── BackendRefusedError             permanent: access denied, no such bucket, ...
    │   │   └── UnsupportedFormatError      a local directory in a format this version does
    │   │                                   not read (the former log backend's)
    │   └── ConditionalWritesUnsupportedError
    └── ObjectStoreError                    the object-store seam's own outcomes
        ├── ObjectExistsError               put_if_absent found the key taken
        └── ObjectNotFoundError

A conflict, a collision and an unknown parent are never retried by the store: they are
answers, not failures. Only ``BackendUnavailableError`` is retried, with one policy
(``store/retry.py``).

No error carries a transport's status: the HTTP service maps classes to statuses and problem
codes in one table (``store/http/problems.py``).
"""

from __future__ import annotations

from typing import Any


class SessionStoreError(Exception):
    """Base class of every error raised by sessionstore."""


# --- bad input -------------------------------------------------------------------------------


class InvalidInputError(SessionStoreError, ValueError):
    """The request was malformed. Nothing was written."""


class InvalidSessionIdError(InvalidInputError):
    """A session id outside ``^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`` or containing ``..``."""

    def __init__(self, session_id: object, reason: str = "") -> None:
        self.session_id = session_id
        detail = f": {reason}" if reason else ""
        super().__init__(f"invalid session id {session_id!r}{detail}")


class InvalidKeyError(InvalidInputError):
    """An object key outside the keys' syntax (``store.backends.object_store.check_key``): empty,
    absolute, with an empty, ``.``-led or ``..`` component, a NUL, a newline, a backslash or
    any character outside ``[A-Za-z0-9._=-]``. Keys are made by the store, so this is a bug
    in the caller, refused before anything is read or written."""

    def __init__(self, key: object, reason: str = "") -> None:
        self.key = key
        detail = f": {reason}" if reason else ""
        super().__init__(f"unsafe object key {key!r}{detail}")


class InvalidEntryError(InvalidInputError):
    """An entry that the store will not accept (``index`` is its position in the batch)."""

    def __init__(self, message: str, *, index: int | None = None, entry_id: Any = None) -> None:
        self.index = index
        self.entry_id = entry_id
        where = ""
        if index is not None:
            where = f"entry {index}"
            if isinstance(entry_id, str):
                where += f" (id {entry_id!r})"
            where += ": "
        super().__init__(where + message)


class BatchTooLargeError(InvalidInputError):
    """A batch over the configured limit of entries or bytes."""


class InvalidRetentionError(InvalidInputError):
    """A retention setting or policy that makes no sense (a negative or zero TTL, an expiry
    that is not a time, both at once, ...). Nothing was written."""


# --- sessions and entries --------------------------------------------------------------------


class SessionNotFoundError(SessionStoreError, LookupError):
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id!r} not found")


class SessionTrashedError(SessionNotFoundError):
    """The session is in the trash (its TTL or a retention policy expired it): hidden from
    reads, listings and appends until it is restored, or purged after ``purge_after_ms``.
    ``purging``: the purge has begun; it can no longer be restored."""

    def __init__(self, session_id: str, purge_after_ms: int, *, purging: bool = False) -> None:
        from store.clock import iso_ms

        self.purge_after_ms = purge_after_ms
        self.purging = purging
        Exception.__init__(self, (
            f"session {session_id!r} is being purged from the trash" if purging else
            f"session {session_id!r} is in the trash: purged after {iso_ms(purge_after_ms)}; "
            f"restore it with `sessionstore trash restore {session_id}` (SessionStore.restore_session)"
        ))
        self.session_id = session_id


class SessionExistsError(SessionStoreError):
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id!r} already exists")


class EntryNotFoundError(SessionStoreError, LookupError):
    def __init__(self, session_id: str, entry_id: str) -> None:
        self.session_id = session_id
        self.entry_id = entry_id
        super().__init__(f"entry {entry_id!r} not found in session {session_id!r}")


# --- refused writes --------------------------------------------------------------------------


class WriteRefusedError(SessionStoreError):
    """A well-formed write that the store refused. Nothing was written."""


class ConflictError(WriteRefusedError):
    """The session's tail is not the entry the writer expected.

    ``actual_tail_entry_id`` and ``actual_seq`` describe the tail at the moment of the check.
    """

    def __init__(
        self,
        session_id: str,
        expected_tail_entry_id: str | None,
        actual_tail_entry_id: str | None,
        actual_seq: int,
    ) -> None:
        self.session_id = session_id
        self.expected_tail_entry_id = expected_tail_entry_id
        self.actual_tail_entry_id = actual_tail_entry_id
        self.actual_seq = actual_seq
        super().__init__(
            f"session {session_id!r}: expected tail {expected_tail_entry_id!r}, "
            f"but the tail is {actual_tail_entry_id!r} (seq {actual_seq})"
        )


class IdCollisionError(WriteRefusedError):
    """An entry id already exists in the session with different content."""

    def __init__(self, session_id: str, entry_id: str, detail: str = "") -> None:
        self.session_id = session_id
        self.entry_id = entry_id
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"session {session_id!r}: entry id {entry_id!r} already exists "
            f"with different content{extra}"
        )


class UnknownParentError(WriteRefusedError):
    def __init__(self, session_id: str, entry_id: str, parent_id: str) -> None:
        self.session_id = session_id
        self.entry_id = entry_id
        self.parent_id = parent_id
        super().__init__(
            f"session {session_id!r}: entry {entry_id!r} has parentId {parent_id!r}, "
            "which is neither in the batch nor in the session"
        )


class ContentionError(WriteRefusedError):
    """The append lost every round to other writers within its retry budget, or waited
    ``max_wait_s`` behind their claims. Nothing of the batch was written: a batch that may
    be out in another writer's segment (group commit) gives up with ``IndeterminateError``
    instead."""


class NotInTrashError(WriteRefusedError):
    """A restore or purge of a session that is not in the trash (never trashed, restored
    already, or appended to before the trash took it)."""

    def __init__(self, session_id: str, detail: str = "") -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id!r} is not in the trash" + (f" ({detail})" if detail else ""))


class SessionHasForksError(WriteRefusedError):
    """A purge of a session that live forks still read their history from."""

    def __init__(self, session_id: str, forks: list[str]) -> None:
        self.session_id = session_id
        self.forks = forks
        super().__init__(f"session {session_id!r} is the source of live forks {forks[:5]}: "
                         "kept until they are gone")


# --- storage faults --------------------------------------------------------------------------


class CorruptObjectError(SessionStoreError):
    """An object in the bucket is not something the store wrote: the reader refuses it whole.

    ``line`` is 1-based; 0 means the object as a whole (checksum, missing newline, ...).
    """

    def __init__(self, key: str, line: int, reason: str) -> None:
        self.key = key
        self.line = line
        self.reason = reason
        where = f"line {line}" if line else "object"
        super().__init__(f"corrupt object {key!r}, {where}: {reason}")


class EncryptionError(SessionStoreError):
    """Encryption at rest could not do its part (docs/encryption.md)."""


class KeyUnavailableError(EncryptionError):
    """A key needed to encrypt or decrypt is not available: the store has no key provider
    and meets an encrypted session, the session's data key record is missing (shredded, see
    ``SessionStore.shred_keys``), or the provider cannot unwrap it (a KEK it does not hold,
    the wrong key file, KMS refusing). Nothing was written; nothing readable was returned."""


class DecryptionError(EncryptionError, CorruptObjectError):
    """Ciphertext that does not authenticate under the session's data key: its bytes were
    altered, moved from another session or incarnation, or the key is not the one it was
    sealed with. The object is refused whole (it is never returned as garbage)."""

    def __init__(self, key: str, reason: str) -> None:
        CorruptObjectError.__init__(self, key, 0, reason)


class IndeterminateError(SessionStoreError):
    """The outcome of a write is unknown (it may or may not have been committed).

    Re-sending the same batch (same ids, same content) is safe: it is idempotent and returns
    the original result if the first attempt did land.
    """


class BackendError(SessionStoreError):
    """A backend (object store or Redis) failed."""


class BackendUnavailableError(BackendError):
    """A transient backend failure: timeout, 5xx, throttling, connection refused."""


class BackendRefusedError(BackendError):
    """A permanent backend failure: access denied, missing bucket, bad credentials."""


class UnsupportedFormatError(BackendRefusedError):
    """A local store's directory records a format this version does not read (``.format``:
    ``store/backends/files.py``). Nothing in it was read or changed."""

    def __init__(self, path: str, held: str) -> None:
        self.path = path
        self.held = held
        super().__init__(
            f"the local store at {path} is in format {held!r}, which this version does not "
            "read (it reads the file backend's, 'files', only)"
        )


class ConditionalWritesUnsupportedError(BackendError):
    """The object store accepted a second create of the same key.

    Such a backend silently ignores ``If-None-Match: *`` and cannot arbitrate races; the store
    refuses to run on it unless ``allow_unsafe_backend=True`` is given.
    """


class ObjectStoreError(SessionStoreError):
    """Outcomes of the object-store seam."""


class ObjectExistsError(ObjectStoreError):
    """``put_if_absent`` found the key already taken (HTTP 412)."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"object {key!r} already exists")


class ObjectNotFoundError(ObjectStoreError, LookupError):
    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"object {key!r} not found")


# --- durable streams (store/streams/) -----------------------------------------------------------


class StreamError(SessionStoreError):
    """A durable-stream request refused; raised as itself, a request the stream rules do not
    allow (a session with a producer id, an unknown kind, ...). Nothing was written."""


class InvalidOffsetError(StreamError, InvalidInputError):
    """Not an offset of this stream (malformed, or beyond its tail)."""


class StreamNotFoundError(StreamError, LookupError):
    """No stream of that name (or it expired)."""


class StreamGoneError(StreamError):
    """The stream was deleted (or expired) while forks still read it."""


class StreamExistsError(StreamError):
    """The name is taken: by a stream of other settings, or one deleted while forks read it."""


class ContentTypeMismatchError(StreamError):
    """An append or a fork of another content type than the stream's."""


class StreamClosedError(StreamError):
    """An append to a closed stream; ``next_offset`` is its tail."""

    def __init__(self, message: str, next_offset: str) -> None:
        super().__init__(message)
        self.next_offset = next_offset


class TailMismatchError(StreamError):
    """``If-Match`` named another tail: nothing was written. ``actual`` is the tail offset;
    ``entry_id`` a session's actual tail entry id ("" for none, None for a stream)."""

    def __init__(self, message: str, actual: str, *, entry_id: str | None = None) -> None:
        super().__init__(message)
        self.actual = actual
        self.entry_id = entry_id


class StreamSeqConflictError(StreamError):
    """A ``Stream-Seq`` that is not after the stream's last one."""


class StaleEpochError(StreamError):
    """A producer epoch older than the stream's (``current_epoch``): the producer is fenced."""

    def __init__(self, message: str, current_epoch: int) -> None:
        super().__init__(message)
        self.current_epoch = current_epoch


class ProducerSeqGapError(StreamError):
    """A producer seq that is not the next one (``expected``; ``received``)."""

    def __init__(self, message: str, expected: int, received: int) -> None:
        super().__init__(message)
        self.expected = expected
        self.received = received


class ProducerEpochSeqError(StreamError):
    """A new producer epoch whose first seq is not 0."""
