"""A session's objects as the read paths fetch them: one segment, the segments from one slot
on until a 404, a base, the segments Redis's recent-segments cache holds, and whether a 404
was the true end of the session. ``store/protocol/read.py`` builds the whole read and the read after
a seq from these parts.

Every object is verified as it is decoded (``store/formats/segments.py``); a base that answers 404
is ``SegmentRetired`` (compaction merged it into a newer manifest's bases and GC deleted
it), and the read that met it starts over.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Iterator

from coordination.redis import TailState, parse_recent
from store.protocol.context import StoreContext
from store.formats.entries import EntryIds
from store.errors import BackendError, CorruptObjectError, ObjectNotFoundError
from store.protocol.manifest import Manifest
from store.formats.migrations import CURRENT_SCHEMA
from store.formats.segments import decode_base_object, decode_object, decode_segment_object

Entries = list[dict[str, Any]]
#: A segment as fetched: its entries and its size in bytes; None for a 404.
Fetched = tuple[Entries, int] | None


class SegmentRetired(Exception):
    """A segment or base vanished mid-read: compaction retired it. Start over."""


class ObjectReads:
    """One store's segments and bases, fetched and decoded (``ctx``: its backends)."""

    def __init__(self, ctx: StoreContext) -> None:
        self.ctx = ctx

    def tail(self, sid: str) -> TailState | None:
        """Redis's tail state of the session (with its recent segments when the store keeps
        them), or None when Redis cannot be asked: a read then goes without the hint."""
        try:
            return self.ctx.coord.tail(sid, recent=self.ctx.options.recent_cache_bytes > 0)
        except BackendError:
            return None

    def segment(
        self, sid: str, inc: str, seq: int, schema: int = CURRENT_SCHEMA, ids: EntryIds | None = None
    ) -> Fetched:
        """Segment ``seq``, decoded and verified: (entries, bytes), or None if it does not
        exist. ``ids``: where the decoder gathers the entries' ids (``check_unique_ids``)."""
        ctx = self.ctx
        ctx.fault("read.segment", session_id=sid, seq=seq)
        key = ctx.layout.segment(sid, inc, seq)
        try:
            obj = ctx.options.retry.call(lambda: ctx.objects.get(key))
        except ObjectNotFoundError:
            return None
        return decode_segment_object(obj, schema, ctx.keys.open, ids), len(obj.data)

    def segments_from(
        self, sid: str, inc: str, schema: int, seq: int, first: Fetched = None,
        ids: EntryIds | None = None,
    ) -> Iterator[tuple[int, tuple[Entries, int]]]:
        """Segments ``seq``, ``seq + 1``, ... one GET at a time, until the first 404 (the
        caller decides whether to trust it: ``end_is_true``). ``first``: the segment ``seq``
        already fetched."""
        got = first if first is not None else self.segment(sid, inc, seq, schema, ids)
        while got is not None:
            yield seq, got
            seq += 1
            got = self.segment(sid, inc, seq, schema, ids)

    def recent(
        self, sid: str, inc: str, known: Iterable[int], hint: TailState | None, ids: EntryIds
    ) -> dict[int, Future[Fetched]]:
        """The known segments Redis's recent-segments cache holds, decoded, as completed
        futures. A cached value is used only if it names our incarnation and its bytes match
        the sha256 it was cached with; anything else is read from the object store."""
        out: dict[int, Future[Fetched]] = {}
        recent = hint.recent if hint is not None else None
        if not recent:
            return out
        for s in known:
            value = recent.get(s)
            parsed = parse_recent(value, inc) if value is not None else None
            if parsed is None:
                continue
            checksum, schema, body = parsed
            if not body or hashlib.sha256(body).hexdigest() != checksum:
                continue
            key = self.ctx.layout.segment(sid, inc, s)
            done: Future[Fetched] = Future()
            done.set_result((decode_object(key, body, checksum, schema, self.ctx.keys.open, ids), len(body)))
            out[s] = done
        return out

    def submit_bases(
        self, manifest: Manifest, fetched: Callable[[], object], ids: EntryIds
    ) -> list[Future[Entries]]:
        """Every base of ``manifest``, fetched in parallel; ``fetched`` is called as each
        one's bytes arrive."""
        return [self.ctx.pool.submit(self.base, b, fetched, ids) for b in manifest.bases]

    def base(
        self, base: dict[str, Any], fetched: Callable[[], object] | None = None, ids: EntryIds | None = None
    ) -> Entries:
        """A base's entries (``base``: its record in a manifest); ``fetched`` is called once
        its bytes are here, before the parse. ``SegmentRetired`` if it is gone."""
        ctx = self.ctx
        key = str(base["key"])
        try:
            obj = ctx.options.retry.call(lambda: ctx.objects.get(key))
        except ObjectNotFoundError:
            raise SegmentRetired() from None
        finally:
            if fetched is not None:
                fetched()
        return decode_base_object(obj, base, ctx.keys.open, ids)

    def end_is_true(
        self, sid: str, inc: str, manifest: Manifest | None, end: int, *, redis_ok: bool
    ) -> bool:
        """Was the 404 at slot ``end`` (the probe's, or a short listing's) the true end of
        the session, and not a segment that a newer manifest retired and GC deleted while we
        paused? Asked *after* that 404, never overlapped with it (docs/design.md, "Pauses").

        GC deletes a slot only after Redis's ``cseq`` was raised past it (RETIRED), so when
        Redis holds the incarnation's state, ``cseq < end`` read now proves the slot was never
        deleted: one Redis round trip. Otherwise one LIST: no manifest newer than ours that
        covers ``end`` (slots after the newest manifest are never deleted;
        ``ManifestStore.retired_since``)."""
        ctx = self.ctx
        if redis_ok:
            try:
                retired = ctx.coord.retired_through(sid, inc)
            except BackendError:
                retired = None
            if retired is not None:
                return retired < end
        return not ctx.manifests.retired_since(sid, inc, manifest, end)


def check_unique_ids(
    sid: str, inherited: Entries, entries: Entries, decoded: EntryIds | None = None
) -> None:
    """No id twice among ``inherited`` + ``entries``. ``decoded``: the ids of ``entries`` as
    their decoders gathered them (while each chunk was in the caches); when it holds exactly
    as many distinct ids as there are entries, the entries are not touched again."""
    if decoded is not None and decoded.distinct(len(entries)):
        own = [e["id"] for e in inherited]
        if len(set(own)) == len(own) and decoded.isdisjoint(own):
            return
    ids = [e["id"] for e in inherited]
    ids += [e["id"] for e in entries]
    if len(set(ids)) == len(ids):
        return
    seen: set[str] = set()
    for eid in ids:
        if eid in seen:
            raise CorruptObjectError(f"sessions/{sid}", 0, f"entry id {eid!r} appears twice")
        seen.add(eid)


class Once:
    """``fn()`` on the first call, from whichever thread; its result on every call."""

    def __init__(self, fn: Callable[[], Future[Any]]) -> None:
        self._fn = fn
        self._lock = threading.Lock()
        self._result: Future[Any] | None = None

    def __call__(self) -> Future[Any]:
        with self._lock:
            if self._result is None:
                self._result = self._fn()
            return self._result


def drain(futures: Iterable[Future[Any]], *more: Future[Any]) -> None:
    """Wait for requests whose answers are no longer needed (errors included), so that a
    restart does not race them."""
    for fut in (*futures, *more):
        if not fut.cancel():
            with contextlib.suppress(Exception):
                fut.result()


__all__ = ["Entries", "Fetched", "ObjectReads", "Once", "SegmentRetired", "check_unique_ids", "drain"]
