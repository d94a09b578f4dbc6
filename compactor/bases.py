"""The bases a compaction writes: pass 2's output cut into objects of about
``max_base_bytes`` each (``compactor/compact.py``), each under a key of its own (a random
token in its stem), sealed with the session's newest data key when the session is encrypted.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING

from compactor.records import BaseRef
from store.errors import BackendError, ObjectExistsError
from store.formats.segments import SHA256

if TYPE_CHECKING:
    from store.protocol.context import StoreContext

log = logging.getLogger("sessionstore.compactor")


class BaseWriter:
    """Cuts pass 2's output into base objects of about ``max_base_bytes`` each."""

    def __init__(
        self, ctx: StoreContext, limit: int, sid: str, inc: str, stem: str, *, sealed: bool = False
    ) -> None:
        self._ctx = ctx
        #: An encrypted session: each base is sealed with the newest data key (listed once).
        self._sealed = sealed
        self._newest_checked = False
        self._sid = sid
        self._inc = inc
        self._stem = stem
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self._entries = 0
        self.bases: list[BaseRef] = []

    def add(self, data: bytes, entries: int) -> None:
        self._parts.append(data)
        self._size += len(data)
        self._entries += entries
        if self._size >= self._limit:
            self.flush()

    def flush(self) -> None:
        if not self._parts:
            return
        data = b"".join(self._parts)
        self._parts.clear()
        ctx = self._ctx
        key = ctx.layout.base(self._sid, self._inc, f"{self._stem}-{len(self.bases):05d}")
        if self._sealed:
            data = ctx.keys.seal(self._sid, self._inc, data, fresh=not self._newest_checked)
            self._newest_checked = True
        sha = hashlib.sha256(data).hexdigest()
        try:
            ctx.options.retry.call(lambda: ctx.objects.put_if_absent(key, data, {SHA256: sha}))
        except ObjectExistsError:
            pass  # the key is ours alone (random token): an earlier attempt of this PUT landed
        self.bases.append(BaseRef(key, sha, self._entries, len(data)))
        self._size = 0
        self._entries = 0

    def delete_all(self) -> None:
        """Withdraw our bases (never named by a manifest). Best effort: GC is the backstop."""
        keys = [b.key for b in self.bases]
        if not keys:
            return
        ctx = self._ctx
        try:
            ctx.options.retry.call(lambda: ctx.objects.delete_many(keys))
        except BackendError as exc:
            log.warning("could not delete own bases; GC removes them", extra={"keys": keys, "error": str(exc)})


__all__ = ["BaseWriter"]
