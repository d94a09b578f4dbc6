"""The header format's home: ``sessions/<sid>/header.json``, created once per incarnation.

A header is immutable for the life of an incarnation (``store.formats.records.Header``), so a
process may cache it; the cache is trusted only while Redis names the same incarnation, and
dropped whenever an object of the session turns out to be gone (docs/design.md). The object's
``nonce`` metadata is the incarnation, which is how a resent create recognises its own header.
"""

from __future__ import annotations

import random
import threading
import uuid
from typing import Any

from store.backends import creates
from store.clock import iso_now, now_ms
from store.formats.entries import decode_json, encode_json
from store.errors import (
    BackendUnavailableError,
    CorruptObjectError,
    IndeterminateError,
    InvalidInputError,
    ObjectNotFoundError,
    SessionExistsError,
    SessionNotFoundError,
)
from store.formats.layout import Layout
from store.backends.object_store import StoredObject
from store.backends.objects import ObjectStore
from store.formats.records import ForkPoint, Header
from store.retry import RetryPolicy
from store.formats.segments import NONCE, is_ours


def uuid7() -> str:
    """A UUIDv7 (time-ordered), as pi mints session ids."""
    ms = now_ms()
    rand = random.getrandbits(74)
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return str(uuid.UUID(int=value))


def new_header(
    sid: str,
    *,
    cwd: str | None,
    pi_header: dict[str, Any] | None,
    fork: ForkPoint | None,
    kind: str = "pi",
    config: dict[str, Any] | None = None,
) -> Header:
    """A header for a new incarnation of ``sid`` (a fresh random incarnation id)."""
    if pi_header is None:
        pi_header = {
            "type": "session",
            "version": 3,
            "id": sid,
            "timestamp": iso_now(),
            "cwd": cwd if cwd is not None else "",
        }
    elif not isinstance(pi_header, dict) or pi_header.get("type") != "session":
        raise InvalidInputError("pi_header must be an object with type 'session'")
    return Header(
        session_id=sid,
        incarnation=uuid.uuid4().hex,
        created_at_ms=now_ms(),
        pi_header=dict(pi_header),
        fork=fork,
        kind=kind,
        config=dict(config or {}),
    )


class HeaderStore:
    """Creates, reads and caches session headers."""

    def __init__(self, objects: ObjectStore, layout: Layout, retry: RetryPolicy) -> None:
        self.objects = objects
        self.layout = layout
        self.retry = retry
        self._cache: dict[str, Header] = {}
        self._lock = threading.Lock()
        #: This process has met an encrypted session (``encrypted``'s fast path).
        self.any_encrypted = False

    def cached(self, sid: str) -> Header | None:
        with self._lock:
            return self._cache.get(sid)

    def forget(self, sid: str) -> None:
        with self._lock:
            self._cache.pop(sid, None)

    def remember(self, header: Header) -> None:
        with self._lock:
            self._cache[header.session_id] = header
            if header.encryption:
                self.any_encrypted = True

    def encrypted(self, sid: str, inc: str) -> bool:
        """Is incarnation ``inc`` of ``sid`` encrypted, by the header this process read for
        it? (False when it read none, or another incarnation's: nothing to hold it to.)"""
        if not self.any_encrypted:
            return False
        header = self.cached(sid)
        return header is not None and header.incarnation == inc and bool(header.encryption)

    def get(self, sid: str, *, fresh: bool = False) -> Header:
        """The cached header, or a fresh read (``SessionNotFoundError`` if there is none)."""
        if not fresh:
            cached = self.cached(sid)
            if cached is not None:
                return cached
        return self.read(sid)

    def read(self, sid: str) -> Header:
        return self.read_object(sid)[0]

    def read_object(self, sid: str) -> tuple[Header, StoredObject]:
        """The header, and the object it was read from (what ``delete_if_unchanged`` of the
        header conditions on)."""
        key = self.layout.header(sid)
        try:
            obj = self.retry.call(lambda: self.objects.get(key))
        except ObjectNotFoundError:
            self.forget(sid)
            raise SessionNotFoundError(sid) from None
        try:
            header = Header.from_json(decode_json(obj.data))
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptObjectError(key, 0, f"invalid session header: {exc}") from None
        if header.session_id != sid:
            raise CorruptObjectError(key, 0, f"header names session {header.session_id!r}")
        self.remember(header)
        return header, obj

    def create(self, header: Header) -> None:
        """Write the header once: ``SessionExistsError`` if the session exists,
        ``IndeterminateError`` if the create may or may not have landed."""
        key = self.layout.header(header.session_id)
        data = encode_json(header.to_json())
        try:
            attempts = creates.create(self.objects, self.retry, key, data, {NONCE: header.incarnation})
        except BackendUnavailableError as exc:
            raise IndeterminateError(
                f"{key!r}: the create failed and may still have landed ({exc}); "
                "get_header() tells whether the session exists"
            ) from exc
        # Taken before our first attempt: someone else's. Taken at a resend: perhaps our own
        # earlier attempt, whose answer was lost.
        if attempts == 1 or (
            attempts > 1
            and not is_ours(creates.read_taken(self.objects, self.retry, key, attempts), header.incarnation)
        ):
            raise SessionExistsError(header.session_id)
        self.remember(header)


__all__ = ["HeaderStore", "new_header", "uuid7"]
