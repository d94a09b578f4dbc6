"""The append path, top to bottom: validate -> CHECK -> PUT -> COMMIT -> enqueue.

Writer W appends batch B to session s, optionally with an expected tail x:

1. Validate B locally (``store.formats.entries.prepare_batch``, by the caller): nothing is sent for
   bad input.
2. CHECK in Redis (coordination/scripts.CHECK): DUPLICATE (B was committed: return its
   result), COLLISION, UNKNOWN_PARENT, CONFLICT (x is not the tail), BUSY (another writer
   holds the advisory claim on the next slot: we are in the session's queue, first come,
   first served, and the next CHECK first blocks in Redis until the claim is handed to us),
   HYDRATE/INCARNATION (rebuild the state from the object store first, ``store/protocol/tail.py``),
   or OK with n = Redis's tail.
3. PUT ``seg/<n+1>`` with If-None-Match: * and a nonce in the metadata (``_put_segment``).
   The object store is the arbiter.
   - taken: read the object. Our nonce: an earlier attempt of ours landed; go on to 4.
     Someone else's: roll it forward into Redis and go back to 2, which re-checks
     duplicates, parents and x against the new tail. Gone again: it was retired; rebuild.
   - unknown after the retry budget: ``IndeterminateError`` (re-sending B is safe).
4. COMMIT in Redis (``_commit``): moves the tail n -> n+1, indexes the ids, notifies
   followers; and decides whether our segment is *live* (its slot not retired by a manifest,
   its incarnation not ended). A writer that paused between 2 and 3 for longer than the GC
   grace period may have re-created a retired slot: ZOMBIE, the object is deleted and we go
   back to 2. Redis unreachable: the object store decides (``_live_by_objects``).
5. Past a threshold of pending segments or bytes, queue one compaction job; return
   ``AppendResult``.

Group commit (docs/design.md, "Group commit"): a writer queued at 2 offers its batch in Redis
while it waits; the CHECK that hands a writer the claim also takes the offers queued behind
it (``_combine`` checks the group as one batch again), the writer PUTs its batch and theirs
as its segment at 3, and COMMIT at 4 wakes them with "done" (their next CHECK: DUPLICATE).
A rider that gives up while its batch may be out says IndeterminateError, never
ContentionError.

Failures before the PUT are plain errors (nothing was written). An append that fails after
CHECK leaves the queue and passes on a claim it holds (``Coordinator.release``).
docs/design.md ("Pauses") argues why no interleaving of pauses lets an append be
acknowledged that no reader sees, and why the queue of waiting writers cannot either.
"""

from __future__ import annotations

import logging
import os
import random
import time
from typing import Any, Literal

from coordination.redis import CheckResult, CommitResult, Offering, recent_value
from store.backends import creates
from store.protocol.context import StoreContext
from store.formats.entries import PreparedBatch, entry_hash, prepare_batch
from store.errors import (
    BackendError,
    BackendUnavailableError,
    ConflictError,
    ContentionError,
    IdCollisionError,
    IndeterminateError,
    InvalidInputError,
    ObjectNotFoundError,
    SessionNotFoundError,
    SessionStoreError,
    UnknownParentError,
)
from store.protocol.listing import summary_delta
from store.formats.markers import is_marker_batch, refuse_if_trashed
from store.formats.migrations import CURRENT_SCHEMA
from store.model.js_json import decode_json
from store.backends.objects import StoredObject
from store.protocol.read import Reader
from store.formats.records import AppendResult, Header
from store.formats.segments import is_ours, segment_metadata
from store.protocol.tail import TailKeeper

log = logging.getLogger("sessionstore")


class Appender:
    def __init__(self, ctx: StoreContext, reader: Reader, tail: TailKeeper) -> None:
        self.ctx = ctx
        self.reader = reader
        self.tail = tail

    def append(
        self, sid: str, batch: PreparedBatch, expected: str | None, *, incarnation: str | None = None,
        alone: bool = False,
    ) -> AppendResult:
        ctx = self.ctx
        header = ctx.headers.get(sid)
        if incarnation is not None and header.incarnation != incarnation:
            header = ctx.headers.read(sid)  # the cache may be the stale one
            if header.incarnation != incarnation:
                raise SessionNotFoundError(sid)
        nonce = os.urandom(16).hex()  # the writer's random token (store/formats/segments.py)
        rider = Offering()
        try:
            return self._append(sid, header, batch, expected, incarnation, nonce, rider, alone)
        except (ConflictError, IdCollisionError, UnknownParentError):
            raise  # CHECK's refusals: it took us out of the queue itself
        except SessionStoreError as exc:
            # Giving up (indeterminate, contention, a deleted session, Redis down): whoever
            # waits behind us need not wait out our claim, nor find us at the head of the
            # queue. A crash leaves both to expire.
            if ctx.options.claim_ms > 0:
                try:
                    # Also withdraws our offer to ride, telling whether it was still ours.
                    if not ctx.coord.release(sid, nonce) and rider.sent:
                        rider.out = True
                except BackendError as exc2:
                    log.info("claim on %s left to expire: %s", sid, exc2)
                    rider.out = rider.out or rider.sent
            if rider.out and isinstance(exc, (ContentionError, BackendError)):
                # Our batch may have been taken to ride in another writer's segment, which
                # that writer, paused, may still PUT: "nothing was written" would be a lie.
                raise IndeterminateError(
                    f"session {sid!r}: the batch was offered to ride in another writer's "
                    f"segment, which may still be written ({exc}); re-sending the same batch "
                    "is safe"
                ) from exc
            raise

    def _append(
        self, sid: str, header: Header, batch: PreparedBatch, expected: str | None,
        incarnation: str | None, nonce: str, rider: Offering, alone: bool = False,
    ) -> AppendResult:
        ctx = self.ctx
        # An encrypted session's segment is sealed once per incarnation (the ciphertext is
        # bound to it), before CHECK: a missing key fails here, having written nothing. A
        # writer that pauses after this and resumes after a key rotation writes with the
        # older key, which stays readable (store/protocol/keys.py).
        plain, sealed_for = batch, header.incarnation
        batch = ctx.keys.seal_batch(header, plain)
        # Group commit (docs/design.md, "Group commit"): while queued, offer our batch to ride
        # in the next claim holder's segment; holding the claim, take the batches offered.
        opts = ctx.options
        groups = (
            opts.group_commit_riders > 0 and opts.claim_ms > 0 and expected is None
            and not header.encryption and not is_marker_batch(batch.ids)
        )
        offer = batch.body if groups and not alone and len(batch.body) <= opts.group_commit_bytes else None
        take = (opts.group_commit_riders, opts.group_commit_bytes) if groups else None
        riders: tuple[str, ...] = ()  # of the segment being written, when it is a group's
        try:
            rebuilt_for: int | None = None
            rounds = 0
            wait_s = 0.0
            deadline = time.monotonic() + ctx.options.max_wait_s
            compacted = self.tail.compacted
            trash_batch = is_marker_batch(batch.ids)
            while rounds < ctx.options.max_rounds:
                seen = compacted.lookup(sid, header.incarnation, batch.ids, batch.external_parents)
                ctx.fault("append.before_check", session_id=sid, through=seen.through)
                res = ctx.coord.check(
                    sid, header.incarnation, batch.ids, batch.hashes, batch.external_parents,
                    expected, nonce=nonce, claim_ms=ctx.options.claim_ms, wait_s=wait_s,
                    compacted=seen.args(),
                    offer=offer if wait_s > 0 else None, offering=rider, take=take,
                )
                if res.code == "BUSY":
                    if time.monotonic() > deadline:
                        break
                    ctx.fault("append.queued", session_id=sid, nonce=nonce, ticket=res.ticket)
                    wait_s = _turn_wait_s(res, ctx.options.claim_ms)
                    continue
                wait_s = 0.0
                rounds += 1
                if res.code == "REINDEX":
                    # Redis keeps the ids of segments 1..res.seq in the data only: our copy of them
                    # must reach that far before CHECK can decide (store/protocol/id_index.py).
                    ctx.fault("append.reindex", session_id=sid, iseq=res.seq)
                    compacted.load(sid, header, res.seq)
                    continue
                if res.code in ("HYDRATE", "INCARNATION"):
                    header = self.tail.repair(sid, header, res.code)
                    if incarnation is not None and header.incarnation != incarnation:
                        raise SessionNotFoundError(sid)  # deleted (and created again) meanwhile
                    if header.encryption:
                        offer = take = None  # a new life may be encrypted: no group commit
                    if header.incarnation != sealed_for:
                        sealed_for = header.incarnation
                        batch = ctx.keys.seal_batch(header, plain)
                    continue
                if res.code == "DUPLICATE":
                    return AppendResult(sid, res.seq, batch.last_id, len(batch.ids))
                if res.code == "COLLISION":
                    raise IdCollisionError(sid, res.entry_id, res.detail)
                if res.code == "CONFLICT":
                    # The expected tail may be a segment Redis has not heard of (its writer died
                    # between PUT and COMMIT, and a reader showed it to our caller): roll the
                    # slot after Redis's tail forward once, then decide again. Without this
                    # every caller that read past Redis would conflict until something probed.
                    if rebuilt_for != res.seq and self.tail.roll_forward_probe(sid, header, res.seq):
                        rebuilt_for = res.seq
                        continue
                    raise ConflictError(sid, expected, res.last or None, res.seq)
                if res.code == "UNKNOWN_PARENT":
                    # Redis may lag behind the object store (a writer died before its commit):
                    # the parent may sit in a segment it has not heard of. Roll forward once.
                    if rebuilt_for != res.seq and self.tail.roll_forward_probe(sid, header, res.seq):
                        rebuilt_for = res.seq
                        continue
                    raise UnknownParentError(sid, res.entry_id, res.parent_id)
                if not trash_batch:
                    # Nothing is appended after a trash or purge marker (store/lifecycle/retention.py): an
                    # append acknowledged there could be lost to the purge. The marker took its
                    # slot with a compare-and-set, so a writer that checked before it meets it
                    # at its PUT, rolls it forward and is refused here.
                    refuse_if_trashed(sid, res.last)
                n = res.seq
                writing = batch
                if res.riders:
                    grouped = self._combine(sid, header, batch, res, nonce)
                    if grouped is None:
                        take = None  # they went back to their writers; we go on alone
                        continue
                    writing, riders = grouped
                key = ctx.layout.segment(sid, header.incarnation, n + 1)
                commit = self._commit_options(header, writing, riders)
                ctx.fault("append.before_put", session_id=sid, seq=n + 1)
                outcome = self._put_segment(key, writing, nonce)
                if outcome == "ours":
                    ctx.fault("append.after_put", session_id=sid, seq=n + 1)
                    if self._commit(sid, header, n, writing, key, riders, commit):
                        ctx.fault("append.after_commit", session_id=sid, seq=n + 1)
                        riders = ()
                        return AppendResult(sid, n + 1, batch.last_id, len(batch.ids), len(writing.ids))
                # A zombie (we re-created a slot that compaction had retired), deleted again,
                # or the slot is someone else's: a group's riders go back to their writers
                # (each CHECK decides whether its batch is in the session), and we go on alone.
                if riders:
                    ctx.coord.wake(sid, riders, "back", ctx.options.claim_ms)
                    riders, take = (), None
                if outcome == "ours":
                    # CHECK decides anew (a duplicate, a conflict, a new slot).
                    continue
                if outcome == "gone":
                    # Taken and then retired by compaction: Redis is far behind. Rebuild.
                    ctx.coord.forget(sid, header.incarnation)
                    continue
                # Someone else's segment n+1: record it, then re-check against the new tail.
                self.tail.roll_forward(sid, header, n, outcome)
                _contention_backoff(rounds)
            raise ContentionError(
                f"session {sid!r}: append lost {rounds} rounds to other writers "
                f"(or waited {ctx.options.max_wait_s:.0f} s behind their claims)"
            )
        finally:
            if riders:  # we give up with a group's segment not committed: they decide
                ctx.coord.wake(sid, riders, "back", ctx.options.claim_ms)

    def _combine(
        self, sid: str, header: Header, batch: PreparedBatch, res: CheckResult, nonce: str
    ) -> tuple[PreparedBatch, tuple[str, ...]] | None:
        """Our batch followed by the riders' (``res.riders``, taken by CHECK), as one batch
        CHECKed again as a whole (we keep the claim): ids unique across the group, none
        already stored, parents known. None when anything is off: the riders are woken to
        go on alone (each CHECK then finds its batch stored or not), and so do we."""
        ctx = self.ctx
        riders = tuple(r for r, _ in res.riders)
        combined: PreparedBatch | None = None
        try:
            entries = _lines(batch.body)
            for _, body in res.riders:
                entries.extend(_lines(body))
            # Each batch passed its own writer's checks (an import's with ``strict=False``, as
            # pi reads them): this one re-derives ids, hashes and parents from the bytes and
            # refuses an id twice in the group; the session model's rules run again.
            combined = prepare_batch(
                entries, max_bytes=ctx.options.max_batch_bytes,
                max_entries=ctx.options.max_batch_entries, strict=False,
            )
            k = len(batch.ids)
            if combined.ids[:k] != batch.ids or combined.hashes[:k] != batch.hashes:
                combined = None  # our batch must be in it exactly as CHECK knew it
        except (InvalidInputError, ValueError) as exc:
            log.info("session %s: %d riders not taken (%s)", sid, len(riders), exc)
            combined = None
        if combined is not None:
            seen = self.tail.compacted.lookup(
                sid, header.incarnation, combined.ids, combined.external_parents
            )
            ctx.fault("append.grouped", session_id=sid, seq=res.seq + 1, riders=riders)
            again = ctx.coord.check(
                sid, header.incarnation, combined.ids, combined.hashes, combined.external_parents,
                None, nonce=nonce, claim_ms=ctx.options.claim_ms, compacted=seen.args(),
                keep_claim=True,
            )
            if again.code == "OK" and again.seq == res.seq:
                return combined, riders
            log.info("session %s: %d riders sent back (%s)", sid, len(riders), again.code)
        ctx.coord.wake(sid, riders, "back", ctx.options.claim_ms)
        return None

    # --- 3. PUT ------------------------------------------------------------------------------

    def _put_segment(
        self, key: str, batch: PreparedBatch, nonce: str
    ) -> Literal["ours", "gone"] | StoredObject:
        """PUT ``batch`` as the segment at ``key``, with our nonce. Returns "ours", "gone",
        or the other writer's object."""
        ctx = self.ctx
        metadata = segment_metadata(nonce, batch.checksum, len(batch.ids))
        try:
            attempts = creates.create(ctx.objects, ctx.options.retry, key, batch.body, metadata)
        except BackendUnavailableError as exc:
            return self._put_outcome_unknown(key, nonce, exc)
        if attempts == 0:
            return "ours"
        ctx.fault("append.slot_taken", key=key, attempts=attempts)
        try:
            obj = creates.read_taken(ctx.objects, ctx.options.retry, key, attempts)
        except ObjectNotFoundError:
            return "gone"
        if is_ours(obj, nonce):
            if attempts > 1:
                log.info("segment %s: a resent PUT found our own earlier attempt", key)
            return self._flushed(key)
        return obj

    def _put_outcome_unknown(
        self, key: str, nonce: str, exc: Exception
    ) -> Literal["ours"] | StoredObject:
        """Every attempt failed in a way that leaves the outcome open. One look decides it
        if the backend answers; otherwise the caller gets the truth: we do not know."""
        try:
            obj = self.ctx.objects.get(key)
        except ObjectNotFoundError:
            raise IndeterminateError(
                f"segment {key!r}: the write failed and may still land ({exc}); "
                "re-sending the same batch is safe"
            ) from exc
        except BackendError:
            raise IndeterminateError(
                f"segment {key!r}: outcome unknown ({exc}); re-sending the same batch is safe"
            ) from exc
        return self._flushed(key) if is_ours(obj, nonce) else obj

    def _flushed(self, key: str) -> Literal["ours"]:
        """Our own segment, met again by a re-sent PUT or a look after a failure: the
        attempt that wrote it may have failed before it was durable (a failed or cut-short
        flush), so it is made durable before it is committed."""
        self._make_durable(key, "written")
        return "ours"

    def _make_durable(self, key: str, what: str) -> None:
        """``ObjectStore.flush`` of a segment about to be committed or acknowledged; when that
        fails, nobody can say the segment is durable: ``IndeterminateError``."""
        try:
            self.ctx.options.retry.call(lambda: self.ctx.objects.flush(key))
        except BackendError as exc:
            raise IndeterminateError(
                f"segment {key!r}: {what}, but could not be made durable ({exc}); "
                "re-sending the same batch is safe"
            ) from exc

    # --- 4. COMMIT, and is our segment live? --------------------------------------------------

    def _commit_options(self, header: Header, batch: PreparedBatch, riders: tuple[str, ...]) -> dict[str, Any]:
        """COMMIT's options for our segment (``Coordinator.commit``)."""
        ctx = self.ctx
        return dict(
            size=len(batch.body), own=True,
            summary=summary_delta(header, batch.entries),  # the listing's summary
            cache=self._recent(header, batch), cache_cap=ctx.options.recent_cache_bytes,
            state_ttl_ms=ctx.options.idle_state_ttl_ms,
            riders=riders, wake_ms=ctx.options.claim_ms,
        )

    def _commit(
        self, sid: str, header: Header, n: int, batch: PreparedBatch, key: str,
        riders: tuple[str, ...], options: dict[str, Any],
    ) -> bool:
        """COMMIT our segment n+1 and decide whether it is live.

        True: acknowledge (the segment is the one at slot n+1, or our batch was committed
        there by a roll-forward). False: our object sits in a retired slot (a zombie, or a
        slot whose ids are compacted: RETIRED), deleted again; the caller goes back to CHECK,
        which tells a committed batch (DUPLICATE) from one that is not. ``SessionNotFoundError``: the incarnation ended (a delete)
        before our PUT; the object has been deleted. ``IndeterminateError``: neither Redis
        nor the object store could say.
        """
        ctx = self.ctx
        for _ in range(3):
            try:
                res = ctx.coord.commit(sid, header.incarnation, n, batch.ids, batch.hashes, **options)
            except BackendError as exc:
                log.warning("segment %d of %s: Redis unavailable at commit (%s); asking the "
                            "object store", n + 1, sid, exc)
                return self._live_by_objects(sid, header, n + 1, batch, key)
            if res.code == "OK":
                self._enqueue_if_due(sid, res)
                return True
            if res.code == "ALREADY":
                # Committed by another writer's roll-forward: our riders learn it here.
                ctx.coord.wake(sid, riders, "done", ctx.options.claim_ms)
                return True
            if res.code == "ZOMBIE":
                self._discard_zombie(key, sid, n + 1, "its slot was retired by compaction")
                return False
            if res.code == "RETIRED":
                # The slot was retired and its ids compacted: our batch may be the one merged
                # there (rolled forward by another writer) or we re-created a deleted slot.
                # Either way nobody reads our object: remove it, and let CHECK decide against
                # the compacted ids (DUPLICATE with this slot, or a new slot).
                ctx.fault("append.retired_slot", session_id=sid, seq=n + 1, key=key)
                try:
                    ctx.options.retry.call(lambda: ctx.objects.delete(key))
                except BackendError as exc:
                    log.info("segment %s in a retired slot left for GC (%s)", key, exc)
                return False
            if res.code == "INCARNATION":
                self._check_incarnation(sid, header, n + 1, key)
            # HYDRATE, BEHIND, or a stale incarnation in Redis: rebuild from the object store
            # (which now holds our segment, unless it is a zombie) and ask again.
            try:
                self.tail.repair(sid, header, "HYDRATE")
            except SessionNotFoundError:
                self._discard_zombie(key, sid, n + 1, "the session was deleted")
                raise
            except BackendError as exc:
                log.warning("segment %d of %s: rebuild failed (%s); asking the object store",
                            n + 1, sid, exc)
                return self._live_by_objects(sid, header, n + 1, batch, key)
        return self._live_by_objects(sid, header, n + 1, batch, key)

    def _recent(self, header: Header, batch: PreparedBatch) -> bytes | None:
        """The segment as Redis's recent-segments cache keeps it, if it is small enough."""
        cap = self.ctx.options.recent_cache_bytes
        if cap <= 0 or len(batch.body) > cap // 4:
            return None
        return recent_value(header.incarnation, batch.checksum, CURRENT_SCHEMA, batch.body)

    def _check_incarnation(self, sid: str, header: Header, seq: int, key: str) -> None:
        """Redis names another incarnation: ours ended (raise) or Redis's is stale (return)."""
        try:
            fresh = self.ctx.headers.read(sid)
        except SessionNotFoundError:
            self._discard_zombie(key, sid, seq, "the session was deleted")
            raise
        if fresh.incarnation != header.incarnation:
            self._discard_zombie(key, sid, seq, "the session was deleted and created again")
            raise SessionNotFoundError(sid)

    def _live_by_objects(
        self, sid: str, header: Header, seq: int, batch: PreparedBatch, key: str
    ) -> bool:
        """Is our segment ``seq`` live? Answered by the object store alone (Redis is down).

        Live when the header still names our incarnation and no manifest covers ``seq``:
        slots above the newest manifest are never deleted, so the object there is ours and
        any later manifest merges it. If a manifest covers ``seq``, our batch must be in
        the session at ``seq`` (a roll-forward merged it) or our object is a zombie.
        """
        ctx = self.ctx
        try:
            self._check_incarnation(sid, header, seq, key)
            manifest = ctx.manifests.latest(sid, header.incarnation)
            if manifest is None or manifest.through_seq < seq:
                return True
            data = self.reader.read(sid, header, use_hint=False)
        except SessionNotFoundError:
            self._discard_zombie(key, sid, seq, "the session was deleted")
            raise
        except BackendError as exc:
            raise IndeterminateError(
                f"segment {key!r} was written but neither Redis nor the object store could "
                f"confirm it is live ({exc}); re-sending the same batch is safe"
            ) from exc
        mine = dict(zip(batch.ids, batch.hashes))
        found = sum(
            1
            for entry, s in zip(data.entries, data.seqs)
            if s == seq and mine.get(str(entry["id"])) == entry_hash(entry)
        )
        if found == len(mine):
            return True
        self._discard_zombie(key, sid, seq, "its slot was retired by compaction")
        return False

    def _discard_zombie(self, key: str, sid: str, seq: int, why: str) -> None:
        """Delete a segment we created in a slot nobody reads. Only a zombie ever reaches
        here: a retired slot (at most a manifest's through_seq) or an ended incarnation,
        where no reader, writer or compactor looks, so deleting by key is safe even if
        another zombie wrote it. Best effort: GC removes what stays."""
        ctx = self.ctx
        log.warning("segment %d of %s was not acknowledged: %s; deleting it", seq, sid, why)
        ctx.fault("append.zombie", session_id=sid, seq=seq, key=key)
        try:
            ctx.options.retry.call(lambda: ctx.objects.delete(key))
        except BackendError as exc:
            log.warning("zombie segment %s left for GC (%s)", key, exc)

    # --- 5. compaction trigger ----------------------------------------------------------------

    def _enqueue_if_due(self, sid: str, res: CommitResult) -> None:
        # A separate command: the job queue lives in another hash slot.
        opts = self.ctx.options
        try:
            if res.job_queued:
                return
            due = (opts.compact_after_segments > 0 and res.pending_segments >= opts.compact_after_segments) or (
                opts.compact_after_bytes > 0 and res.pending_bytes >= opts.compact_after_bytes
            )
            if due:
                # At most one job queued per session (a marker with NX); the compactor
                # clears the marker when it takes the job.
                self.ctx.coord.enqueue_compaction(
                    sid, reason=f"segments={res.pending_segments} bytes={res.pending_bytes}"
                )
        except BackendError as exc:
            log.warning("compaction queue not updated for %s: %s", sid, exc)


def _lines(body: bytes) -> list[dict[str, Any]]:
    """The entries of a segment body (one JSON object a line, as ``encode_json`` wrote them:
    a newline never occurs inside one), lone surrogate escapes included."""
    return [decode_json(line) for line in body.split(b"\n") if line]


def _turn_wait_s(res: CheckResult, claim_ms: int) -> float:
    """We wait in the session's queue (ticket ``res.ticket``): the next CHECK first waits in
    Redis until the claim is handed to us, or until the holder's lease runs out, whichever
    comes first. It also comes well within our own lease in the queue, so that CHECK renews
    it while we wait (a waiter that stops asking is dropped from the queue)."""
    return min(res.wait_ms + 1, claim_ms / 4) / 1000


def _contention_backoff(round_no: int) -> None:
    if round_no == 0:
        return
    time.sleep(random.uniform(0, min(0.05, 0.002 * (2 ** min(round_no, 5)))))


__all__ = ["Appender"]
