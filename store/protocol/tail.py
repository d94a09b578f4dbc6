"""The tail: Redis's view of a session rolled forward over the object store, and its
rebuild.

Redis's tail is a cache: always at most the true tail, never read as "empty" when missing.
Three ways it catches up with the object store:

- roll-forward: a segment exists past Redis's tail (a writer died after its PUT, or Redis
  failed at its COMMIT). Whoever meets it (a writer's PUT that answers 412, ``get_tail``, a
  writer whose parent is not in Redis yet) COMMITs it in the writer's place.
- rebuild (``hydrate``): the state is missing, of another incarnation, or its id index lost
  keys. The session is read from the object store and INSTALLed, unless Redis finds the
  rebuild too old (its process paused) or of an incarnation a delete ended (see
  coordination/scripts.INSTALL and docs/design.md, "Pauses").
- repair: the append path's name for "rebuild, adopting a newer header if Redis has one".
"""

from __future__ import annotations

import functools
import logging

from coordination.redis import TailState
from store.clock import now_ms
from store.protocol.context import StoreContext
from store.formats.entries import entry_hash
from store.errors import BackendError, BackendUnavailableError, ObjectNotFoundError
from store.protocol.id_index import CompactedIds
from store.protocol.listing import info_from_fields, summary_delta, last_update_ms, summary_fields
from store.backends.objects import StoredObject
from store.protocol.read import Reader, SessionData
from store.formats.records import Header, SessionInfo, TailInfo
from store.formats.segments import decode_segment_object

log = logging.getLogger("sessionstore")


class TailKeeper:
    def __init__(self, ctx: StoreContext, reader: Reader) -> None:
        self.ctx = ctx
        self.reader = reader
        #: This process's copies of sessions' compacted ids (store/protocol/id_index.py).
        self.compacted = CompactedIds(ctx, reader)

    # --- roll-forward ------------------------------------------------------------------------

    def roll_forward(self, sid: str, header: Header, n: int, obj: StoredObject) -> None:
        """COMMIT another writer's segment n+1 in its place, once it is durable: its writer
        may have died or paused before making it so (docs/design.md, "Durable before Redis
        hears of it"), and what Redis holds, a re-send's DUPLICATE acknowledges."""
        entries = decode_segment_object(obj, header.schema, self.ctx.keys.open)
        ids = [str(e["id"]) for e in entries]
        hashes = [entry_hash(e) for e in entries]
        self.ctx.options.retry.call(lambda: self.ctx.objects.flush(obj.key))
        res = self.ctx.coord.commit(
            sid, header.incarnation, n, ids, hashes, size=len(obj.data),
            summary=summary_delta(header, entries),
            state_ttl_ms=self.ctx.options.idle_state_ttl_ms,
        )
        if res.code in ("HYDRATE", "BEHIND", "INCARNATION", "ZOMBIE"):
            self.repair(sid, header, "INCARNATION" if res.code == "INCARNATION" else "HYDRATE")

    def roll_forward_probe(self, sid: str, header: Header, seq: int) -> bool:
        """Commit segments that exist past Redis's tail ``seq``. True if there were any."""
        ctx = self.ctx
        moved = False
        n = seq
        while True:
            key = ctx.layout.segment(sid, header.incarnation, n + 1)
            try:
                obj = ctx.options.retry.call(lambda: ctx.objects.get(key))
            except ObjectNotFoundError:
                return moved
            self.roll_forward(sid, header, n, obj)
            moved = True
            n += 1

    # --- rebuild -----------------------------------------------------------------------------

    def repair(self, sid: str, header: Header, code: str) -> Header:
        """Rebuild a session's Redis state from the object store (never read missing as empty).

        INCARNATION: Redis holds state for another life of the session. The header decides
        who is stale: if our cached header is, we adopt the new one; if Redis is (the session
        was deleted and created again while Redis was away), the state is replaced.
        """
        if code == "INCARNATION":
            header = self.ctx.headers.read(sid)
        self.hydrate(sid, header)
        return header

    def hydrate(self, sid: str, header: Header | None = None) -> TailState | None:
        """Rebuild the session's Redis state from the object store.

        The rebuild is a snapshot taken when its first read started; Redis refuses one that
        arrives later than ``rebuild_max_age_ms`` after that (this process paused), and one
        of an incarnation that a delete ended meanwhile (see coordination/scripts.INSTALL).
        A refused rebuild is done again from fresh reads. The listing's summary is rebuilt
        from the same read (``store/protocol/listing.py``).
        """
        self._rebuild(sid, header)
        return self.ctx.coord.tail(sid)

    def summarize(self, sid: str, header: Header) -> SessionInfo:
        """The listing's row of a session, from the object store; its Redis state and
        summary are rebuilt on the way (when Redis answers: else from the read alone)."""
        try:
            header, data, fields = self._rebuild(sid, header)
        except BackendError as exc:
            log.warning("listing %s without Redis (%s)", sid, exc)
            data = self.reader.read(sid, header, use_hint=False)
            fields = summary_fields(header, data, last_update_ms(self.ctx, header, data))
        return info_from_fields(sid, fields, len(data.inherited) + len(data.entries), header.incarnation)

    def _rebuild(
        self, sid: str, header: Header | None
    ) -> tuple[Header, SessionData, dict[str, str | int]]:
        ctx = self.ctx
        max_age = ctx.options.rebuild_max_age_ms
        for _ in range(3):
            read_at = now_ms()  # before the first read: a pause only makes it look older
            header = header or ctx.headers.read(sid)
            code, data = self._install(sid, header, read_at, max_age)
            if code == "DELETED":
                ctx.headers.forget(sid)
                header = None  # the next round re-reads it: SessionNotFoundError, or a new life
                continue
            if code != "STALE":
                return header, data, self._install_summary(sid, header, data)
            log.warning("rebuild of %s took longer than %d ms: done again", sid, max_age)
            header = None
        raise BackendUnavailableError(
            f"session {sid!r}: every rebuild of its Redis state took longer than "
            f"{max_age} ms (or met a delete); try again"
        )

    def _install(self, sid: str, header: Header, read_at: int, max_age: int) -> tuple[str, SessionData]:
        data = self.reader.read(sid, header, use_hint=False)
        self._flush_read(sid, header, data)
        ids: list[tuple[str, int, str]] = [(str(e["id"]), 0, entry_hash(e)) for e in data.inherited]
        ids.extend((str(e["id"]), s, entry_hash(e)) for e, s in zip(data.entries, data.seqs))
        through = data.manifest.through_seq if data.manifest else 0
        # The ids of what the manifest compacted (and a fork's inherited path) stay out of
        # Redis: this process keeps them from the read it just made (store/protocol/id_index.py).
        iseq = through if through > 0 or data.inherited else -1
        if iseq >= 0:
            based = sum(data.manifest.seq_counts) if data.manifest else 0
            self.compacted.seed(sid, header.incarnation, iseq, based, ids)
        kept = [i for i in ids if i[1] > iseq] if iseq >= 0 else ids
        code = self.ctx.coord.install(
            sid,
            header.incarnation,
            seq=data.seq,
            last=data.last_entry_id,
            count=len(data.inherited) + len(data.entries),
            ids=kept,
            compacted=(len(ids) - len(kept), iseq),
            pending_segments=data.seq - through,
            pending_bytes=data.tail_bytes,
            cseq=through,
            mgen=data.manifest.generation if data.manifest else 0,
            read_at_ms=read_at,
            max_age_ms=max_age,
            state_ttl_ms=self.ctx.options.idle_state_ttl_ms,
        )
        return code, data

    def _flush_read(self, sid: str, header: Header, data: SessionData) -> None:
        """What a rebuild read is durable before Redis hears of it: the segments' log (or
        directory) and the manifest's. A writer or a compactor that died or paused between
        its write and its flush left them visible and not durable."""
        ctx = self.ctx
        through = data.manifest.through_seq if data.manifest else 0
        keys: list[str] = []
        if data.seq > through:
            keys.append(ctx.layout.segment(sid, header.incarnation, data.seq))
        if data.manifest is not None:
            keys.append(ctx.layout.manifest(sid, header.incarnation, data.manifest.generation))
        for key in keys:
            ctx.options.retry.call(functools.partial(ctx.objects.flush, key))

    def _install_summary(self, sid: str, header: Header, data: SessionData) -> dict[str, str | int]:
        """The listing's summary from the rebuild's read, installed if Redis's tail is at the
        segment the read ended at (scripts.SUMMARY); best effort: a listing rebuilds it."""
        fields = summary_fields(header, data, last_update_ms(self.ctx, header, data))
        self.ctx.fault("summary.before_install", session_id=sid, seq=data.seq)
        try:
            self.ctx.coord.install_summary(sid, header.incarnation, data.seq, fields)
        except BackendError as exc:
            log.warning("listing summary of %s not installed (%s)", sid, exc)
        return fields

    # --- where an entry is -------------------------------------------------------------------

    def position(self, sid: str, header: Header, entry_id: str) -> int | None:
        """The segment of incarnation ``header``'s committed entry ``entry_id`` (0: in its
        inherited path), from Redis's tail and index (one round trip) or, for an entry they
        compacted, from this process's copy of the compacted ids (the bases, read once);
        None when neither can tell, and the caller reads the session. Never a guess: an
        entry Redis or a base names is committed at that segment for the incarnation's life
        (segments are immutable, compaction keeps every entry's segment number), whatever
        happens after the answer."""
        try:
            code, seq = self.ctx.coord.position(sid, header.incarnation, entry_id)
        except BackendError as exc:
            log.warning("position of %s in %s not asked of Redis (%s): read instead", entry_id, sid, exc)
            return None
        if code == "AT":
            return seq
        if code != "COMPACTED":
            return None
        self.compacted.load(sid, header, seq)
        found = self.compacted.lookup(sid, header.incarnation, [entry_id], ()).found
        return int(found[0].split(":", 1)[0]) if found and found[0] else None

    # --- the true tail -----------------------------------------------------------------------

    def get_tail(self, sid: str) -> TailInfo:
        """The true tail: Redis's view, rolled forward over segments it has not heard of;
        from the object store alone while Redis is down."""
        ctx = self.ctx
        header = ctx.headers.get(sid)
        state = self._state(sid, header)
        if state is not None and state.inc != header.incarnation:
            header = ctx.headers.read(sid)
            state = self._state(sid, header)
        if state is None:
            return self._from_objects(sid, header)
        key = ctx.layout.segment(sid, header.incarnation, state.seq + 1)
        if ctx.options.retry.call(lambda: ctx.objects.head(key)) is not None:
            self.roll_forward_probe(sid, header, state.seq)
            state = self._state(sid, header)
            if state is None:
                return self._from_objects(sid, header)
        return TailInfo(sid, state.seq, state.last, state.count)

    def _state(self, sid: str, header: Header) -> TailState | None:
        ctx = self.ctx
        try:
            state = ctx.coord.tail(sid)
        except BackendError:
            return None
        if state is not None and state.inc != header.incarnation:
            fresh = ctx.headers.read(sid)
            if fresh.incarnation == state.inc:
                return state  # our cached header was the stale one
            header = fresh
        if state is None or state.inc != header.incarnation:
            try:
                return self.hydrate(sid, header)
            except BackendError:
                return None
        return state

    def _from_objects(self, sid: str, header: Header) -> TailInfo:
        data = self.reader.read(sid, header, use_hint=False)
        return TailInfo(sid, data.seq, data.last_entry_id, len(data.all_entries))


__all__ = ["TailKeeper"]
