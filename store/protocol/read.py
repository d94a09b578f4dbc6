"""The read path, top to bottom: header -> newest manifest -> its bases and the segments
after it -> the probe -> the newer-manifest check.

1. Header: from the cache when Redis's tail names the same incarnation (a header never
   changes within an incarnation), else one GET. It tells the incarnation and the fork point.
2. Newest manifest: one LIST of ``manifest/``, then its GET (``ManifestStore.latest``).
3. In one parallel round: the manifest's bases, the segments after it up to Redis's tail
   hint, and the probe of the segment after the hint; the probe goes on until a 404. Without
   a hint (Redis down or not rebuilt yet) one paginated LIST of the segments replaces it.
4. A base or segment that answers 404 was retired by compaction meanwhile (or the session
   was deleted): start over, a bounded number of times; the first restart re-reads the
   header. After the probe's 404, one LIST must show no manifest newer than ours, or that
   404 may have been a retired segment: start over (docs/design.md, "Pauses").
5. Every object is verified as it is decoded (``store/formats/segments.py``); ids must be unique.

The read after a seq (``Reader.read_after``, ``Reader.read_since``: what a follower, a stream
and an adapter read of what is new) uses the same parts and falls back to the whole read.
Fetching and decoding each object, and the check that a 404 was the true end, are
``store/protocol/read_objects.py``.

A fork reads the source's path root..fork point first (``fork_path``).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from coordination.redis import TailState
from store.protocol.context import StoreContext
from store.formats.entries import EntryIds
from store.errors import CorruptObjectError, EntryNotFoundError, SessionNotFoundError
from store.formats.layout import Layout
from store.protocol.manifest import Manifest
from store.formats.migrations import CURRENT_SCHEMA
from store.protocol.read_objects import Entries, ObjectReads, Once, SegmentRetired, check_unique_ids, drain
from store.formats.records import ForkPoint, Header
from store.protocol.segment_cache import SegmentCache
from store.formats.segments import contiguous

_MAX_READ_RESTARTS = 8

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SessionData:
    """Everything a read returns: the entries of the session and where each came from."""

    header: Header
    #: A fork's inherited path (root..fork point), then the session's own entries.
    inherited: Entries
    entries: Entries
    #: Segment number of each own entry (parallel to ``entries``).
    seqs: list[int]
    seq: int
    manifest: Manifest | None
    #: Bytes of segments after the manifest (the compaction trigger's measure).
    tail_bytes: int

    @property
    def all_entries(self) -> Entries:
        return self.inherited + self.entries if self.inherited else self.entries

    @property
    def last_entry_id(self) -> str:
        if self.entries:
            return str(self.entries[-1]["id"])
        if self.header.fork is not None:
            return self.header.fork.entry_id
        return ""


@dataclass(frozen=True, slots=True)
class SessionChanges:
    """What a session holds beyond the segments a caller has read (``Reader.read_since``)."""

    header: Header
    #: True: ``entries`` is the whole session (a fork's inherited path first, at seq 0),
    #: because the caller's incarnation is not the session's (it read none yet, or the session
    #: was deleted and created again): the caller starts over from these.
    whole: bool
    #: The entries committed after the caller's segment (or all: ``whole``), in commit order.
    entries: Entries
    #: Segment number of each entry (parallel to ``entries``).
    seqs: list[int]
    #: The last segment of the session now (the caller's next ``after_seq``).
    seq: int


class Reader:
    def __init__(self, ctx: StoreContext) -> None:
        self.ctx = ctx
        self.objects = ObjectReads(ctx)

    def read_session(self, sid: str) -> SessionData:
        """The session now; the cached header is used while Redis names its incarnation."""
        ctx = self.ctx
        state: TailState | None = None
        header = ctx.headers.cached(sid)
        if header is not None:
            state = self.objects.tail(sid)
            if state is None or state.inc != header.incarnation:
                header, state = None, None
        if header is None:
            header = ctx.headers.read(sid)
        return self.read(sid, header, use_hint=True, state=state)

    def read(
        self, sid: str, header: Header, *, use_hint: bool, state: TailState | None = None
    ) -> SessionData:
        inherited: Entries = self.fork_path(header.fork) if header.fork is not None else []
        named = use_hint  # may the manifest Redis names be tried before a LIST?
        for attempt in range(_MAX_READ_RESTARTS):
            try:
                return self._read_once(
                    sid, header, inherited, use_hint=use_hint, state=state, named=named
                )
            except SegmentRetired:
                state, named = None, False
                if attempt == 0:
                    # Objects vanished: compaction retired them, or the session was deleted
                    # (SessionNotFoundError) or re-created under a new incarnation.
                    fresh = self.ctx.headers.read(sid)
                    if fresh.incarnation != header.incarnation:
                        header = fresh
                        inherited = self.fork_path(header.fork) if header.fork else []
        raise CorruptObjectError(
            self.ctx.layout.segment_prefix(sid, header.incarnation),
            0,
            "segments kept disappearing while reading: a gap in the session",
        )

    def _read_once(
        self,
        sid: str,
        header: Header,
        inherited: Entries,
        *,
        use_hint: bool,
        state: TailState | None,
        named: bool = False,
    ) -> SessionData:
        ctx = self.ctx
        inc = header.incarnation
        if use_hint and state is None:
            state = self.objects.tail(sid)
        hint = state if use_hint and state is not None and state.inc == inc else None
        pool = ctx.pool
        ids = EntryIds()  # every entry's id, as the decoders parse them (check_unique_ids)
        # The newest manifest: the one Redis names (parsed once per process, or fetched in
        # the round below), else one LIST and a GET. Redis names it only as a hint: every
        # object it leads to is verified, and the end of the read is checked after the fact.
        fetching: Future[Manifest | None] | None = None
        if named and hint is not None and hint.mgen > 0:
            manifest = ctx.manifests.cached(sid, inc, hint.mgen)
            if manifest is not None and manifest.through_seq >= hint.cseq:
                first = manifest.through_seq + 1
            else:
                manifest, first = None, hint.cseq + 1  # checked when it arrives
                fetching = pool.submit(ctx.manifests.get, sid, inc, hint.mgen)
        elif named and hint is not None and hint.cseq == 0:
            # Redis was told of no manifest. One may exist that it was not told of (a
            # compactor that stopped before telling it), but GC deletes no segment before
            # Redis has heard that it is retired, so segments 1.. are all still there.
            manifest, first = None, 1
        else:
            manifest = ctx.manifests.latest(sid, inc)
            first = manifest.through_seq + 1 if manifest else 1
        ctx.fault("read.after_manifest", session_id=sid)
        known = self._known_segments(sid, inc, first, hint=hint)
        last_known = known[-1] if known else first - 1
        # The probe past the known tail goes out in the same round, except beside large
        # bases: then it waits until their bytes have arrived, and its round trip hides
        # behind their parse instead of competing with their transfer.
        probing = Once(lambda: pool.submit(self.objects.segment, sid, inc, last_known + 1, header.schema, ids))
        bases: list[Future[Entries]] = []
        if manifest is not None:
            bases = self.objects.submit_bases(manifest, probing, ids)
        if manifest is None or sum(int(b.get("bytes") or 0) for b in manifest.bases) < _PROBE_AFTER_BYTES:
            probing()
        cached = self.objects.recent(sid, inc, known, hint, ids)
        segments = {
            s: cached[s] if s in cached else pool.submit(self.objects.segment, sid, inc, s, header.schema, ids)
            for s in known
        }
        if fetching is not None:
            manifest = fetching.result()
            if manifest is None or manifest.through_seq != first - 1:
                # Deleted behind a newer one (GC), or Redis's counters lag the manifest it
                # names: read it the long way.
                drain(segments.values(), probing())
                raise SegmentRetired()
            bases = self.objects.submit_bases(manifest, probing, ids)
        entries, seqs = self._base_entries(manifest, bases)
        seq, tail_bytes = self._take_segments(known, segments, entries, seqs, first - 1)
        seq, tail_bytes = self._probe(sid, inc, header.schema, probing(), entries, seqs, seq, tail_bytes, ids)
        ctx.fault("read.before_manifest_check", session_id=sid)
        if not self.objects.end_is_true(sid, inc, manifest, seq + 1, redis_ok=hint is not None):
            raise SegmentRetired()
        check_unique_ids(sid, inherited, entries, ids)
        return SessionData(header, inherited, entries, seqs, seq, manifest, tail_bytes)

    def _known_segments(
        self, sid: str, inc: str, first: int, *, hint: TailState | None
    ) -> list[int]:
        """Segments known to exist after the manifest: Redis's hint, else one LIST."""
        ctx = self.ctx
        if hint is not None and hint.seq >= first - 1:
            return list(range(first, hint.seq + 1))
        prefix = ctx.layout.segment_prefix(sid, inc)
        start_after = ctx.layout.segment(sid, inc, first - 1) if first > 1 else None
        listed = ctx.options.retry.call(
            lambda: [Layout.seq_of(i.key) for i in ctx.objects.list(prefix, start_after)]
        )
        return contiguous(listed, first)  # a gap: stop there and let the probe decide

    @staticmethod
    def _base_entries(
        manifest: Manifest | None, bases: list[Future[Entries]]
    ) -> tuple[Entries, list[int]]:
        if manifest is None:
            return [], []
        entries: Entries = []
        for fut in bases:
            entries.extend(fut.result())
        if len(entries) != sum(manifest.seq_counts):
            raise CorruptObjectError(
                str(manifest.raw.get("bases")), 0,
                "bases hold a different number of entries than the manifest says",
            )
        seqs: list[int] = []
        for s, c in enumerate(manifest.seq_counts, start=1):
            seqs.extend([s] * c)
        return entries, seqs

    @staticmethod
    def _take_segments(
        known: list[int],
        futures: dict[int, Future[tuple[Entries, int] | None]],
        entries: Entries,
        seqs: list[int],
        seq: int,
    ) -> tuple[int, int]:
        tail_bytes = 0
        for s in known:
            got = futures[s].result()
            if got is None:
                raise SegmentRetired()
            seg_entries, size = got
            entries.extend(seg_entries)
            seqs.extend([s] * len(seg_entries))
            tail_bytes += size
            seq = s
        return seq, tail_bytes

    def _probe(
        self,
        sid: str,
        inc: str,
        schema: int,
        first: Future[tuple[Entries, int] | None],
        entries: Entries,
        seqs: list[int],
        seq: int,
        tail_bytes: int,
        ids: EntryIds,
    ) -> tuple[int, int]:
        """Segments past the known tail: writers that died before telling Redis."""
        got = first.result()
        if got is None:
            return seq, tail_bytes
        for seq, (seg_entries, size) in self.objects.segments_from(sid, inc, schema, seq + 1, got, ids):
            entries.extend(seg_entries)
            seqs.extend([seq] * len(seg_entries))
            tail_bytes += size
        return seq, tail_bytes

    def get_segment(self, sid: str, inc: str, seq: int, schema: int = CURRENT_SCHEMA) -> tuple[Entries, int] | None:
        """One segment, decoded and verified: (entries, bytes), or None if it does not exist."""
        return self.objects.segment(sid, inc, seq, schema)

    def base_entries(self, base: dict[str, Any]) -> Entries:
        """A base's entries (``base``: its record in a manifest); ``SegmentRetired`` if it
        is gone (merged into a newer manifest's bases and deleted)."""
        return self.objects.base(base)

    def map_own_entries(
        self, sid: str, header: Header, fn: Callable[[dict[str, Any]], T]
    ) -> tuple[list[T], str]:
        """``fn`` of every own entry (a fork's inherited path left out), in commit order, and
        the id of the last one: the read protocol one object at a time, so memory holds one
        object and what ``fn`` returns, not the session (an import comparing a large file)."""
        inc = header.incarnation
        for _ in range(_MAX_READ_RESTARTS):
            try:
                manifest = self.ctx.manifests.latest(sid, inc)
                out: list[T] = []
                last = ""
                for base in manifest.bases if manifest else ():
                    entries = self.objects.base(base)
                    out.extend(fn(e) for e in entries)
                    last = str(entries[-1]["id"]) if entries else last
                    del entries
                seq = manifest.through_seq if manifest else 0
                for seq, (seg_entries, _size) in self.objects.segments_from(sid, inc, header.schema, seq + 1):
                    out.extend(fn(e) for e in seg_entries)
                    last = str(seg_entries[-1]["id"]) if seg_entries else last
                if self.ctx.manifests.retired_since(sid, inc, manifest, seq + 1):
                    raise SegmentRetired()
                return out, last
            except SegmentRetired:
                continue
        raise CorruptObjectError(
            self.ctx.layout.segment_prefix(sid, inc), 0,
            "segments kept disappearing while reading: a gap in the session",
        )

    def read_after(
        self,
        sid: str,
        header: Header,
        last: int,
        *,
        through: int | None = None,
        tail: TailState | None = None,
        tail_asked: bool = False,
        cache: SegmentCache | None = None,
    ) -> tuple[list[tuple[int, dict[str, Any]]], int]:
        """Entries committed after segment ``last`` as (seq, entry), and the new last seq:
        the read a follower, a stream and an adapter make of what is new.

        ``through``: only the segments up to that one, which the caller knows exist (Redis's
        tail or an earlier read named them): no probe past them, and the last seq returned is
        ``through``. ``tail``: Redis's tail state when the caller has just read it (else it
        is asked here); ``tail_asked``: the caller asked, and None was Redis's answer. ``cache``: decoded segments the caller keeps (``SegmentCache``),
        used before any GET and filled with what is read.

        1. With ``through``, or when Redis's tail names this incarnation and no manifest it
           knows of covers ``last + 1``: the segments after ``last`` (up to ``through``, or
           Redis's tail) in one parallel round, with the probe of the slot after them beside
           them unless ``through`` was given; the probe goes on until a 404, and that 404
           must be the true end (``ObjectReads.end_is_true``: Redis's retired slot, read after it).
        2. Without Redis: the newest manifest (one LIST), the segments after ``last`` one
           GET at a time until the 404, then ``ManifestStore.retired_since``.
        3. A segment that answers 404 (compacted and collected meanwhile), an end that may
           have been a retired slot, or a manifest past ``last``: a whole read, filtered.
        """
        ctx = self.ctx
        inc = header.incarnation
        if through is not None and through <= last:
            return [], last
        if cache is not None and through is not None:
            kept = cache.run(sid, inc, last + 1, through)
            if kept is not None:
                return [(s, e) for s, seg in enumerate(kept, start=last + 1) for e in seg], through
        hint = tail if tail is not None or tail_asked else self.objects.tail(sid)
        if hint is not None and hint.inc != inc:
            hint = None
        if hint is not None or through is not None:
            if hint is None or hint.cseq <= last:
                end = through if through is not None else max(last, hint.seq if hint else last)
                got = self._segments_after(sid, header, last, end, probe=through is None,
                                           redis_ok=hint is not None, cache=cache, hint=hint)
                if got is not None:
                    return got
        else:
            manifest = ctx.manifests.latest(sid, inc)
            if manifest is None or manifest.through_seq <= last:
                out: list[tuple[int, dict[str, Any]]] = []
                seq = last
                for seq, (seg_entries, _size) in self.objects.segments_from(sid, inc, header.schema, last + 1):
                    out.extend((seq, entry) for entry in seg_entries)
                if not ctx.manifests.retired_since(sid, inc, manifest, seq + 1):
                    return out, seq
        data = self.read(sid, header, use_hint=True)
        newest = data.seq if through is None else min(data.seq, through)
        fresh = [(s, e) for e, s in zip(data.entries, data.seqs) if last < s <= newest]
        if cache is not None and data.header.incarnation == inc:
            cache.add_read(sid, inc, data.entries, data.seqs, newest)
        return fresh, max(last, newest)

    def _segments_after(
        self, sid: str, header: Header, last: int, end: int, *, probe: bool, redis_ok: bool,
        cache: SegmentCache | None, hint: TailState | None = None,
    ) -> tuple[list[tuple[int, dict[str, Any]]], int] | None:
        """Segments ``last+1..end`` (the cache's, else those Redis's recent-segments cache in
        ``hint`` holds, else one parallel round of GETs) and, with ``probe``, every segment
        after them until a 404 that is the true end; None when one of them is gone or the end
        may have been retired (the caller reads whole)."""
        ctx, inc, schema = self.ctx, header.incarnation, header.schema
        seqs = range(last + 1, end + 1)
        kept = cache.run(sid, inc, last + 1, end) if cache is not None and seqs else None
        probing = ctx.pool.submit(self.objects.segment, sid, inc, end + 1, schema) if probe else None
        got: list[tuple[Entries, int] | None]
        if kept is not None:
            got = [(seg, 0) for seg in kept]
        else:
            recent = self.objects.recent(sid, inc, list(seqs), hint, EntryIds()) if hint is not None else {}
            missing = [s for s in seqs if s not in recent]
            if len(missing) == 1:
                fetched = {missing[0]: self.objects.segment(sid, inc, missing[0], schema)}
            else:
                fetched = dict(zip(missing, ctx.pool.map(lambda s: self.objects.segment(sid, inc, s, schema), missing)))
            got = [recent[s].result() if s in recent else fetched[s] for s in seqs]
        if any(g is None for g in got):
            if probing is not None:
                drain((), probing)
            return None
        out: list[tuple[int, dict[str, Any]]] = []
        for s, g in zip(seqs, got):
            assert g is not None
            out.extend((s, e) for e in g[0])
            if cache is not None and kept is None:
                cache.add(sid, inc, s, g[0], g[1])
        seq = end
        if probing is None:
            return out, seq
        probed = probing.result()  # None: the probe's 404, the end (checked below)
        for seq, (seg_entries, size) in self.objects.segments_from(sid, inc, schema, end + 1, probed) if probed else ():
            out.extend((seq, e) for e in seg_entries)
            if cache is not None:
                cache.add(sid, inc, seq, seg_entries, size)
        ctx.fault("read.before_manifest_check", session_id=sid)
        if not self.objects.end_is_true(sid, inc, None, seq + 1, redis_ok=redis_ok):
            return None
        return out, seq

    def read_since(
        self, sid: str, incarnation: str | None, after_seq: int, *, probe: bool = True
    ) -> SessionChanges:
        """The entries committed after segment ``after_seq`` of ``incarnation``, for a caller
        that holds segments 1..``after_seq`` of it (a whole read when it holds none of the
        session's current life). What the caller holds stays true: a segment never changes
        within an incarnation and its number is never used again, so the new entries are
        exactly the segments after ``after_seq``, however long the caller paused.

        One Redis round trip (the tail); the header from the process's cache while Redis
        names its incarnation, else one GET; then :meth:`read_after` with that tail: the
        segments after ``after_seq`` and the probe in one parallel round, or a whole read,
        filtered, when it must. ``probe=False`` (a writer whose next append is a
        compare-and-set on what it read): only the segments Redis's tail names, no probe
        past them; a segment Redis has not heard of is met by that append's PUT instead.
        """
        ctx = self.ctx
        state = self.objects.tail(sid)
        header = ctx.headers.cached(sid)
        if header is None or state is None or state.inc != header.incarnation:
            header = ctx.headers.read(sid)
        inc = header.incarnation
        hint = state if state is not None and state.inc == inc else None
        if incarnation != inc:
            data = self.read(sid, header, use_hint=True, state=hint)
            seqs = [0] * len(data.inherited) + data.seqs
            return SessionChanges(data.header, True, list(data.all_entries), seqs, data.seq)
        # Asked above: a session Redis knows nothing of costs no second round trip.
        through = None if probe or hint is None else max(after_seq, hint.seq)
        fresh, seq = self.read_after(sid, header, after_seq, through=through, tail=hint, tail_asked=True)
        return SessionChanges(header, False, [e for _, e in fresh], [s for s, _ in fresh], seq)

    def fork_path(self, fork: ForkPoint) -> Entries:
        """The source's path root..fork point (which is immutable once written)."""
        src = self.ctx.headers.read(fork.session_id)
        if src.incarnation != fork.incarnation:
            raise SessionNotFoundError(fork.session_id)
        data = self.read(fork.session_id, src, use_hint=True)
        by_id = {str(e["id"]): e for e in data.all_entries}
        path: Entries = []
        cur: str | None = fork.entry_id
        seen: set[str] = set()
        while cur:
            entry = by_id.get(cur)
            if entry is None or cur in seen:
                break
            seen.add(cur)
            path.append(entry)
            parent = entry.get("parentId")
            cur = parent if isinstance(parent, str) else None
        if not path:
            raise EntryNotFoundError(fork.session_id, fork.entry_id)
        path.reverse()
        return path


#: Bases at least this large (in all) have the probe wait for their bytes (``_read_once``):
#: their parse (about 20 ms for 4 MiB) then outlasts the probe's round trip even on S3, and
#: the probe no longer shares the server with their transfer (measured on moto: the base
#: arrived 11-15 ms later beside it).
_PROBE_AFTER_BYTES = 4 << 20


__all__ = ["Reader", "SegmentRetired", "SessionChanges", "SessionData", "check_unique_ids"]
