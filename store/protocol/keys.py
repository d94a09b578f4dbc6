"""Per-session data keys: their records in the object store, rotation, the process's cache,
sealing and opening objects, and shredding.

An encrypted incarnation (its header says ``encryption``) has one or more *key records*::

    <session>/<inc>/keys/<version:08d>.json
    {"version": 1, "session_id": ..., "incarnation": ..., "scheme": "aes-256-gcm/1",
     "provider": "local" | "kms", "kek_id": ..., "wrapped": <base64>, "created_at_ms": ...}

each created once with If-None-Match, never changed; the DEK inside is wrapped by the
operator's KEK (``store/formats/crypto.py``), bound to the session and incarnation. Version 1 is
created *before* the header (so a header that says "encrypted" always has a key); a rotation
adds version n+1. Every sealed object names the version it was sealed with, and versions are
never deleted while the session lives, so:

- *A writer that paused* holding version n across a rotation still seals with n; its segment
  is readable because record n is still there. A new version is only ever an addition.
- *A reader* fetches exactly the versions its objects name (one GET each, then cached); it
  never needs to know which version is the newest.
- *The newest version* is what writers seal with and what compaction re-encrypts bases with.
  The compactor LISTs the records every compaction; a writer refreshes its idea of the
  newest at most every ``refresh_s`` (a HEAD of the next version), so a rotation reaches
  every process's new segments within that time. Which version a segment uses is never a
  question of correctness, only of how soon the old one stops being used.
- *Shredding* (``shred``) deletes every record of every incarnation of the session: with
  them gone, no process can unwrap the session's DEKs, and its objects (and old versions of
  them, and backups of the bucket) are ciphertext without a key. Unwrapped DEKs live in a
  process's memory for at most ``ttl_s`` after they were last unwrapped, so a shred takes
  effect everywhere within that time. A rotation that lists the records before a shred and
  creates its new version after it leaves one record of a key that sealed nothing older;
  the erasure that shreds then deletes the session, which removes it too.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from store.backends import creates
from store.clock import now_ms
from store.formats.crypto import SCHEME, DataKey, KeyProvider, WrappedKey, is_sealed, sealed_version
from store.model.js_json import decode_json, encode_json
from store.errors import DecryptionError, KeyUnavailableError, ObjectNotFoundError
from store.formats.layout import Layout
from store.backends.objects import ObjectStore
from store.retry import RetryPolicy

if TYPE_CHECKING:
    from store.formats.entries import PreparedBatch
    from store.protocol.headers import HeaderStore
    from store.formats.records import Header

log = logging.getLogger("sessionstore")

_NONCE = "nonce"


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One wrapped data key, as stored (see the module docstring for the fields)."""

    session_id: str
    incarnation: str
    version: int
    wrapped: WrappedKey
    created_at_ms: int
    scheme: str = SCHEME

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "session_id": self.session_id,
            "incarnation": self.incarnation,
            "scheme": self.scheme,
            "provider": self.wrapped.provider,
            "kek_id": self.wrapped.kek_id,
            "wrapped": base64.b64encode(self.wrapped.blob).decode("ascii"),
            "created_at_ms": self.created_at_ms,
        }

    @classmethod
    def from_json(cls, key: str, data: dict[str, Any]) -> KeyRecord:
        try:
            return cls(
                session_id=str(data["session_id"]),
                incarnation=str(data["incarnation"]),
                version=int(data["version"]),
                wrapped=WrappedKey(str(data["provider"]), str(data["kek_id"]), base64.b64decode(data["wrapped"])),
                created_at_ms=int(data["created_at_ms"]),
                scheme=str(data.get("scheme", SCHEME)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DecryptionError(key, f"malformed data key record: {exc}") from None


def _context(sid: str, inc: str) -> dict[str, str]:
    """What a wrapped key is bound to (a KMS's encryption context)."""
    return {"sessionstore:session": sid, "sessionstore:incarnation": inc}


class DataKeys:
    """The store's data keys (one per ``SessionStore``; thread-safe).

    ``provider`` None: the store encrypts nothing new, and meeting an encrypted object is
    ``KeyUnavailableError``. ``cache_size`` bounds the unwrapped DEKs kept (least recently
    used dropped); ``ttl_s`` is how long one is kept after it was unwrapped.
    """

    def __init__(
        self,
        objects: ObjectStore,
        layout: Layout,
        retry: RetryPolicy,
        provider: KeyProvider | None,
        *,
        cache_size: int = 4096,
        ttl_s: float = 300.0,
        refresh_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.objects = objects
        self.layout = layout
        self.retry = retry
        self.provider = provider
        self.cache_size = cache_size
        self.ttl_s = ttl_s
        self.refresh_s = refresh_s
        self.clock = clock
        self._lock = threading.Lock()
        self._deks: OrderedDict[tuple[str, str, int], tuple[DataKey, float]] = OrderedDict()
        #: (sid, inc) -> (newest version known, when it was last checked)
        self._newest: dict[tuple[str, str], tuple[int, float]] = {}
        #: The store's headers (set by the store): a plaintext object of an incarnation
        #: they say is encrypted is refused by ``open``.
        self.headers: HeaderStore | None = None

    @property
    def enabled(self) -> bool:
        """New sessions are encrypted."""
        return self.provider is not None

    def _need_provider(self, sid: str) -> KeyProvider:
        if self.provider is None:
            raise KeyUnavailableError(
                f"session {sid!r} is encrypted and this store has no key provider "
                "(StoreOptions(key_provider=...), or SESSIONSTORE_KEYS for the command line)"
            )
        return self.provider

    # --- records -----------------------------------------------------------------------------

    def create(self, sid: str, inc: str, version: int = 1) -> DataKey:
        """Make data key ``version`` of an incarnation and create its record. If another
        process created that version first (a concurrent rotation), its key is returned."""
        provider = self._need_provider(sid)
        dek, wrapped = provider.generate(_context(sid, inc))
        record = KeyRecord(sid, inc, version, wrapped, now_ms())
        key = self.layout.key_record(sid, inc, version)
        nonce = hashlib.sha256(wrapped.blob).hexdigest()[:32]
        attempts = creates.create(self.objects, self.retry, key, encode_json(record.to_json()), {_NONCE: nonce})
        if attempts:
            obj = creates.read_taken(self.objects, self.retry, key, attempts)
            if obj.metadata.get(_NONCE) != nonce:
                return self.get(sid, inc, version)  # another rotator made this version
        data_key = DataKey.of(sid, inc, version, dek)
        self._remember(data_key)
        self._note_newest(sid, inc, version)
        return data_key

    def versions(self, sid: str, inc: str) -> list[int]:
        """The versions whose records exist (one LIST)."""
        out = []
        for info in self.retry.call(lambda: list(self.objects.list(self.layout.keys_prefix(sid, inc)))):
            parsed = self.layout.parse(info.key)
            if parsed is not None and parsed.kind == "key" and parsed.number is not None:
                out.append(parsed.number)
        return sorted(out)

    def get(self, sid: str, inc: str, version: int) -> DataKey:
        """Data key ``version`` of an incarnation: from the cache, or its record unwrapped."""
        slot = (sid, inc, version)
        now = self.clock()
        with self._lock:
            hit = self._deks.get(slot)
            if hit is not None and now - hit[1] < self.ttl_s:
                self._deks.move_to_end(slot)
                return hit[0]
        provider = self._need_provider(sid)
        key = self.layout.key_record(sid, inc, version)
        try:
            obj = self.retry.call(lambda: self.objects.get(key))
        except ObjectNotFoundError:
            raise KeyUnavailableError(
                f"data key v{version} of session {sid!r} (incarnation {inc}) does not exist: "
                "shredded, or the session was deleted"
            ) from None
        try:
            raw = decode_json(obj.data)
        except ValueError:
            raise DecryptionError(key, "data key record is not JSON") from None
        record = KeyRecord.from_json(key, raw if isinstance(raw, dict) else {})
        if (record.session_id, record.incarnation, record.version) != slot:
            raise DecryptionError(key, "data key record names another session, incarnation or version")
        data_key = DataKey.of(sid, inc, version, provider.unwrap(record.wrapped, _context(sid, inc)))
        self._remember(data_key)
        return data_key

    def _remember(self, data_key: DataKey) -> None:
        with self._lock:
            slot = (data_key.session_id, data_key.incarnation, data_key.version)
            self._deks[slot] = (data_key, self.clock())
            self._deks.move_to_end(slot)
            while len(self._deks) > self.cache_size:
                self._deks.popitem(last=False)

    def _note_newest(self, sid: str, inc: str, version: int) -> None:
        with self._lock:
            known = self._newest.get((sid, inc))
            if known is None or known[0] <= version:
                self._newest[(sid, inc)] = (version, self.clock())
            while len(self._newest) > self.cache_size:
                self._newest.pop(next(iter(self._newest)))

    def newest(self, sid: str, inc: str, *, fresh: bool = False) -> int:
        """The newest version: a LIST when unknown or ``fresh``, else what this process
        knows, checked (a HEAD of the next version) at most every ``refresh_s``."""
        with self._lock:
            known = self._newest.get((sid, inc))
        if known is None or fresh:
            versions = self.versions(sid, inc)
            if not versions:
                raise KeyUnavailableError(
                    f"session {sid!r} (incarnation {inc}) is encrypted and has no data key: shredded"
                )
            self._note_newest(sid, inc, versions[-1])
            return versions[-1]
        version, checked = known
        if self.clock() - checked < self.refresh_s:
            return version
        while self._exists(self.layout.key_record(sid, inc, version + 1)):
            version += 1
        self._note_newest(sid, inc, version)
        with self._lock:
            self._newest[(sid, inc)] = (version, self.clock())
        return version

    def has_record(self, sid: str, inc: str, version: int) -> bool:
        """Does the key record of this version exist (one HEAD)?"""
        return self._exists(self.layout.key_record(sid, inc, version))

    def _exists(self, key: str) -> bool:
        return self.retry.call(lambda: self.objects.head(key)) is not None

    def rotate(self, sid: str, inc: str) -> int:
        """Add a new data key version; new segments (and the next compaction's bases) use
        it. Returns it. Nothing already written changes."""
        current = self.newest(sid, inc, fresh=True)
        return self.create(sid, inc, current + 1).version

    def shred(self, sid: str) -> int:
        """Delete every data key record of every incarnation of ``sid`` and forget the keys
        this process holds. Returns the number of records deleted."""
        keys = []
        for info in self.retry.call(lambda: list(self.objects.list(self.layout.session_prefix(sid)))):
            parsed = self.layout.parse(info.key)
            if parsed is not None and parsed.kind == "key":
                keys.append(info.key)
        if keys:
            self.retry.call(lambda: self.objects.delete_many(keys))
        self.forget(sid)
        return len(keys)

    def forget(self, sid: str) -> None:
        """Drop this process's keys of ``sid``."""
        with self._lock:
            for dek_slot in [s for s in self._deks if s[0] == sid]:
                del self._deks[dek_slot]
            for slot in [s for s in self._newest if s[0] == sid]:
                del self._newest[slot]

    # --- sealing and opening -----------------------------------------------------------------

    def seal(self, sid: str, inc: str, plaintext: bytes, *, fresh: bool = False) -> bytes:
        """``plaintext`` sealed with the incarnation's newest data key."""
        self._need_provider(sid)
        return self.get(sid, inc, self.newest(sid, inc, fresh=fresh)).seal(plaintext)

    def seal_batch(self, header: Header, batch: PreparedBatch) -> PreparedBatch:
        """The batch as the append path writes it for this header: sealed, with the sha256
        of the sealed bytes, for an encrypted session; unchanged otherwise."""
        if not header.encryption:
            return batch
        body = self.seal(header.session_id, header.incarnation, batch.body)
        return replace(batch, body=body, checksum=hashlib.sha256(body).hexdigest())

    def open(self, key: str, data: bytes) -> bytes:
        """The plaintext of the object ``key`` holds: ``data`` itself when it is not sealed,
        else decrypted with the data key version it names, of the session and incarnation
        its key names (the associated data binds it to them).

        A plaintext object of an encrypted incarnation is refused (``DecryptionError``): the
        store seals every segment and base of one, so such an object was put there by
        something else (a writer to the bucket), and reading it would let that writer add to
        the session unseen."""
        if not is_sealed(data):
            if self.headers is not None and self.headers.any_encrypted:
                parsed = self.layout.parse(key)
                if parsed is not None and parsed.incarnation is not None and self.headers.encrypted(
                    parsed.session_id, parsed.incarnation
                ):
                    raise DecryptionError(key, "a plaintext object in an encrypted session: "
                                               "refused (the store seals every object of one)")
            return data
        parsed = self.layout.parse(key)
        if parsed is None or parsed.incarnation is None:
            raise DecryptionError(key, "a sealed object outside a session incarnation")
        version = sealed_version(key, data)
        return self.get(parsed.session_id, parsed.incarnation, version).open(key, data)


__all__ = ["DataKeys", "KeyRecord"]
