"""The manifest format and the one manifest store that the reader, the writer's liveness
check, the compactor, GC and ``verify`` all use.

A manifest (``manifest/<gen:016d>.json``, written once with If-None-Match) is the only thing
that makes a base reachable, and the only thing that retires segments. The reader depends on
``generation``, ``through_seq``, ``seq_counts`` and ``bases``; everything else is for GC,
operators and ``compaction history``. Field by field:

``schema``                 ``MANIFEST_SCHEMA``
``session_id``, ``incarnation``
``generation``             previous generation + 1 (the first manifest is 1)
``previous_generation``    0 for the first
``through_seq``            the last segment merged; readers read segments after it
``seq_counts``             entries of each segment 1..through_seq, so ids keep their segment
                           number (an idempotent re-send answers with the original seq)
``bases``                  ``[{"key", "sha256", "entries", "bytes"[, "schema"]}]`` in commit
                           order; a base may be named by several consecutive manifests
                           (``compactor/tiers.py`` keeps older runs of bases as they are)
``entry_count``            sum of ``seq_counts`` = entries in the bases
``last_entry_id``          id of the last entry in the bases ("" if none)
``compaction``             this compaction: ``segments_merged`` [first, last], ``segment_count``,
                           ``entries`` (written to the bases), ``entries_merged`` (from the
                           segments), ``bytes_in`` (previous bases + segments read),
                           ``segment_bytes``, ``bytes_out``, ``redactions_purged``, ``worker``,
                           ``started_at``/``finished_at`` (ISO-8601 UTC) and their ``_ms``;
                           ``kind: "fence"`` for a fence manifest (see ``fence_manifest``)
``redactions``             ``[[targetId, redaction id, reason], ...]``: every redaction the
                           bases hold, earliest per target, in commit order, so that the next
                           compaction applies them without reading the bases it keeps
                           (absent from manifests written before bases were kept: the next
                           compaction rewrites every base)
``retired``                keys this manifest makes unreachable: the previous manifest, the
                           previous bases it does not keep, the merged segments
``grace_ms``               the grace period of the compactor that wrote it
``delete_after_ms``        ``finished_at_ms + grace_ms``: nothing retired goes before this
``history``                the ``compaction`` records of earlier generations (newest first,
                           bounded), each with its ``generation``: GC deletes old manifests,
                           so the history travels forward in the newest one

Rules every user relies on (docs/design.md, "Pauses"): the newest manifest is never deleted;
a manifest retires only segments it merged; generations only grow, so a create that a paused
compactor makes after GC deleted its generation lands *below* the newest, where no reader
looks.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from store.clock import iso_ms
from store.errors import (
    BackendError,
    BackendUnavailableError,
    CorruptObjectError,
    IndeterminateError,
    ObjectExistsError,
    ObjectNotFoundError,
)
from store.formats.layout import Layout
from store.backends.objects import ObjectStore
from store.retry import RetryPolicy
from store.formats.segments import NONCE

MANIFEST_SCHEMA = 1


@dataclass(frozen=True, slots=True)
class Manifest:
    generation: int
    through_seq: int
    #: Entries per segment 1..through_seq, so ids keep their original segment number.
    seq_counts: tuple[int, ...]
    bases: tuple[dict[str, Any], ...]
    raw: dict[str, Any]
    #: When the object store created the manifest (its clock), if it says.
    created_ms: int | None = None

    @classmethod
    def from_json(cls, key: str, data: bytes, created_ms: int | None = None) -> "Manifest":
        try:
            raw = orjson.loads(data)
            return cls(
                generation=int(raw["generation"]),
                through_seq=int(raw["through_seq"]),
                seq_counts=tuple(int(c) for c in raw["seq_counts"]),
                bases=tuple(raw["bases"]),
                raw=raw,
                created_ms=created_ms,
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise CorruptObjectError(key, 0, f"invalid manifest: {exc}") from None

    @property
    def base_keys(self) -> frozenset[str]:
        return frozenset(str(b["key"]) for b in self.bases)

    @property
    def finished_at_ms(self) -> int | None:
        comp = self.raw.get("compaction")
        value = comp.get("finished_at_ms") if isinstance(comp, dict) else None
        return value if isinstance(value, int) else None

    @property
    def delete_after_ms(self) -> int | None:
        value = self.raw.get("delete_after_ms")
        return value if isinstance(value, int) else None

    def history(self, limit: int) -> list[dict[str, Any]]:
        """This manifest's compaction record and its history, newest first, for the next."""
        out: list[dict[str, Any]] = []
        record = self.raw.get("compaction")
        if isinstance(record, dict):
            out.append({**record, "generation": self.generation})
        out.extend(h for h in self.raw.get("history") or [] if isinstance(h, dict))
        return out[:limit]


def compaction_record(*, worker: str, started_ms: int, finished_ms: int, **figures: Any) -> dict[str, Any]:
    """A manifest's ``compaction`` field: the figures given (counts not given are 0), who made
    it, and when (ISO-8601 and epoch ms)."""
    record: dict[str, Any] = {
        "segments_merged": [0, 0],
        "segment_count": 0,
        "entries": 0,
        "bytes_in": 0,
        "bytes_out": 0,
        "redactions_purged": 0,
    }
    record.update(figures)
    record.update(
        worker=worker,
        started_at=iso_ms(started_ms),
        finished_at=iso_ms(finished_ms),
        started_at_ms=started_ms,
        finished_at_ms=finished_ms,
    )
    return record


def build_manifest(
    *,
    session_id: str,
    incarnation: str,
    generation: int,
    previous: Manifest | None,
    through_seq: int,
    seq_counts: list[int] | tuple[int, ...],
    bases: list[dict[str, Any]],
    entry_count: int,
    last_entry_id: str,
    compaction: dict[str, Any],
    retired: list[str],
    grace_ms: int,
    finished_ms: int,
    history_limit: int,
    redactions: list[list[str]] | None = None,
) -> dict[str, Any]:
    """The body of manifest ``generation`` (see the module docstring)."""
    body: dict[str, Any] = {
        "schema": MANIFEST_SCHEMA,
        "session_id": session_id,
        "incarnation": incarnation,
        "generation": generation,
        "previous_generation": previous.generation if previous else 0,
        "through_seq": through_seq,
        "seq_counts": list(seq_counts),
        "bases": bases,
        "entry_count": entry_count,
        "last_entry_id": last_entry_id,
        "compaction": compaction,
        "retired": retired,
        "grace_ms": grace_ms,
        "delete_after_ms": finished_ms + grace_ms,
        "history": previous.history(history_limit) if previous else [],
    }
    if redactions is not None:
        body["redactions"] = redactions
    return body


def fence_manifest(
    *,
    session_id: str,
    incarnation: str,
    generation: int,
    newest: Manifest | None,
    worker: str,
    now_ms: int,
    grace_ms: int,
    history_limit: int,
) -> dict[str, Any]:
    """Manifest ``generation`` with the content of ``newest`` (or an empty session's).

    Readers see the same session through it (same bases, same ``through_seq``) and it
    retires nothing; creating it only takes ``generation`` away from a compactor that wrote
    bases for it and may never come back (see compactor/gc.py).
    """
    record = compaction_record(worker=worker, started_ms=now_ms, finished_ms=now_ms, kind="fence")
    return build_manifest(
        session_id=session_id,
        incarnation=incarnation,
        generation=generation,
        previous=newest,
        through_seq=newest.through_seq if newest else 0,
        seq_counts=newest.seq_counts if newest else (),
        bases=[dict(b) for b in newest.bases] if newest else [],
        entry_count=sum(newest.seq_counts) if newest else 0,
        last_entry_id=str(newest.raw.get("last_entry_id", "")) if newest else "",
        compaction=record,
        retired=[],
        grace_ms=grace_ms,
        finished_ms=now_ms,
        history_limit=history_limit,
        redactions=(newest.raw.get("redactions") if newest else []),
    )


class ManifestStore:
    """Reads and creates the manifests of a session's incarnation."""

    #: Bytes of manifest JSON the process keeps parsed (``cached``).
    CACHE_BYTES = 32 << 20

    def __init__(self, objects: ObjectStore, layout: Layout, retry: RetryPolicy) -> None:
        self.objects = objects
        self.layout = layout
        self.retry = retry
        # (sid, inc, generation) -> (manifest, size). A manifest read once is kept: what it
        # names is verified by every read that uses it (a deleted base answers 404 and the
        # read starts over), and whatever it says stays a true state of the session.
        self._cache: OrderedDict[tuple[str, str, int], tuple[Manifest, int]] = OrderedDict()
        self._cache_bytes = 0
        self._lock = threading.Lock()

    def cached(self, sid: str, inc: str, generation: int) -> Manifest | None:
        with self._lock:
            got = self._cache.get((sid, inc, generation))
            if got is None:
                return None
            self._cache.move_to_end((sid, inc, generation))
            return got[0]

    def _remember(self, sid: str, inc: str, manifest: Manifest, size: int) -> None:
        if size > self.CACHE_BYTES // 8:
            return
        key = (sid, inc, manifest.generation)
        with self._lock:
            old = self._cache.pop(key, None)
            if old is not None:
                self._cache_bytes -= old[1]
            self._cache[key] = (manifest, size)
            self._cache_bytes += size
            while self._cache_bytes > self.CACHE_BYTES and self._cache:
                _, (_, dropped) = self._cache.popitem(last=False)
                self._cache_bytes -= dropped

    def generations(self, sid: str, inc: str) -> list[int]:
        """Every listed generation, ascending (one paginated LIST)."""
        prefix = self.layout.manifest_prefix(sid, inc)
        keys = self.retry.call(lambda: [i.key for i in self.objects.list(prefix)])
        return sorted(Layout.seq_of(k) for k in keys if k.endswith(".json"))

    def latest(self, sid: str, inc: str) -> Manifest | None:
        """The newest manifest, or None. Listings are strongly consistent (S3 since 2020,
        MinIO, R2, SeaweedFS): the newest listed is the newest; one created after the
        listing is caught by ``retired_since`` at the end of a read."""
        while True:
            gens = self.generations(sid, inc)
            if not gens:
                return None
            # The newest listed is never deleted nor written again, so a copy kept
            # parsed is what the object holds.
            found = self.cached(sid, inc, gens[-1]) or self.get(sid, inc, gens[-1])
            if found is not None:
                return found
            # Deleted between the LIST and the GET: a newer one exists. List again.

    def get(self, sid: str, inc: str, generation: int) -> Manifest | None:
        key = self.layout.manifest(sid, inc, generation)
        try:
            obj = self.retry.call(lambda: self.objects.get(key))
        except ObjectNotFoundError:
            return None
        manifest = Manifest.from_json(key, obj.data, obj.last_modified_ms)
        if manifest.generation != generation:
            raise CorruptObjectError(key, 0, f"manifest names generation {manifest.generation}")
        self._remember(sid, inc, manifest, len(obj.data))
        return manifest

    def retired_since(self, sid: str, inc: str, manifest: Manifest | None, slot: int) -> bool:
        """May slot ``slot`` have been retired (and so deleted by GC) by a manifest newer
        than ``manifest``? Asked *after* a read's 404 at ``slot``, to tell whether that 404
        was the session's true end (docs/design.md, "Pauses").

        One LIST from ``manifest``'s generation on; only when a newer manifest is listed, a
        GET of the newest. The newest manifest is never deleted, so any manifest newer than
        ours that ever existed is still listed or has a newer one listed (a HEAD of the next
        generation alone would miss one that GC removed behind a newer one). Each manifest covers at least the slots of the one before it, so
        the newest (never deleted) covers every slot any manifest ever retired: if its
        ``through_seq`` is below ``slot``, no manifest retired ``slot``, and the 404 was
        true. A read overlapping compactions that merged only what it had read already is
        not sent back to start over (which, with a compaction landing more often than a read
        takes, started it over and over: "segments kept disappearing")."""
        while True:
            gens = self._newer_generations(sid, inc, manifest)
            if not gens:
                return False
            newest = self.cached(sid, inc, gens[-1]) or self.get(sid, inc, gens[-1])
            if newest is not None:
                return newest.through_seq >= slot
            # Deleted between the LIST and the GET: a newer one exists. List again.

    def _newer_generations(self, sid: str, inc: str, manifest: Manifest | None) -> list[int]:
        prefix = self.layout.manifest_prefix(sid, inc)
        after = self.layout.manifest(sid, inc, manifest.generation) if manifest else None
        keys = self.retry.call(lambda: [i.key for i in self.objects.list(prefix, after)])
        return sorted(Layout.seq_of(k) for k in keys if k.endswith(".json"))

    def create(self, sid: str, inc: str, generation: int, body: dict[str, Any], nonce: str) -> bool:
        """Create manifest ``generation`` if absent. True if ours is the one that exists.

        ``IndeterminateError`` if the create failed in a way that may still land and no read
        could tell (the caller keeps whatever the manifest would name)."""
        key = self.layout.manifest(sid, inc, generation)
        data = orjson.dumps(body)
        try:
            self.retry.call(lambda: self.objects.put_if_absent(key, data, {NONCE: nonce}))
            return True
        except ObjectExistsError:
            pass  # another worker's, or our own earlier attempt whose answer was lost
        except BackendUnavailableError as exc:
            try:
                obj = self.objects.get(key)
            except (ObjectNotFoundError, BackendError):
                raise IndeterminateError(
                    f"manifest {key!r}: the create failed and may still land ({exc})"
                ) from exc
            return obj.metadata.get(NONCE) == nonce
        try:
            obj = self.retry.call(lambda: self.objects.get(key))
        except BackendError as exc:
            raise IndeterminateError(f"manifest {key!r}: taken, and unreadable ({exc})") from exc
        return obj.metadata.get(NONCE) == nonce


__all__ = [
    "MANIFEST_SCHEMA",
    "Manifest",
    "ManifestStore",
    "build_manifest",
    "compaction_record",
    "fence_manifest",
]
