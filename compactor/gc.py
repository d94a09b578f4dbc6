"""Garbage collection: delete what nothing reaches any more, once its grace period is over.

Reachable, never deleted: the header; the latest manifest L; L's bases; every segment after
``L.through_seq`` (the live tail, including segments Redis has not heard of). Everything else
under the session becomes garbage at a known moment, and is deleted a grace period later:

========================  ================================================================
object                    deletable when ``now >=``
========================  ================================================================
segment s <= L.through    ``delete_after`` of the oldest existing manifest with
                          ``through_seq >= s`` (the one that merged it)
manifest m < L            ``delete_after`` of the next existing manifest after m
base named by m < L       the latest of that over every manifest naming it (consecutive
                          manifests share bases, compactor/tiers.py: a base that m kept
                          from m-1 is not retired with m-1); never while L names it
base named by no          the start time in its key + grace, and its generation (also in
manifest                  its key) at most the newest manifest's: an orphan whose manifest
                          lost the race, or whose worker died. A grace-old orphan of the
                          next generation gets that generation taken by a fence manifest
                          first (see ``_orphans``): a worker that paused may still create it
another incarnation's     the current header's ``created_at_ms`` + grace
object                    (leftovers of a deleted session, see store/formats/layout.py)
objects of a session      first seen by GC (a mark in Redis) + grace
without a header
========================  ================================================================

``delete_after`` of a manifest is ``max(its delete_after_ms, finished_at_ms + our grace)``.
When the manifest that retired an object has itself been deleted already, the next one is
used: it finished later, so the answer is later, never earlier.

Why a grace period at all: a reader that loaded manifest g a moment before g+1 was created
still fetches g's bases and the segments after g. It finishes within the grace period, or it
meets a 404 and starts over from the newest manifest. A compactor that wrote its base but not
yet its manifest is protected the same way: it gives up if it took half the grace period
(``compactor/compact.py``).

Decisions are made on one LIST taken before the header and the manifests are read, so an
object created during the pass is never a candidate; objects only ever become *less*
reachable over time (an orphan base can only be adopted by the create of its own
generation's manifest, which the rules above forbid once it is a candidate), so a GC that
pauses between deciding and deleting deletes nothing that became live meanwhile. Deleting
twice, or from two machines at once, is harmless. Before deleting segments, GC fences their
slots in Redis (``_fence_retired``), so that a writer that paused before its PUT and then
re-created one is never acknowledged (docs/design.md, "Pauses"). Times: a manifest's grace
runs from the later of the times written inside it and its creation by the object store's
clock, since a compactor may pause between taking its finish time and the create.
"""

from __future__ import annotations

import logging
from collections import defaultdict
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from compactor.config import Clock, CompactorOptions, wall_clock_ms
from compactor.records import GcResult
from compactor.schedule import schedule_gc
from store.protocol import incarnations
from store.errors import BackendError, IndeterminateError, SessionNotFoundError, SessionStoreError
from store.faults import FaultHook
from store.protocol.listing import all_session_ids
from store.protocol.manifest import Manifest, fence_manifest

if TYPE_CHECKING:
    from store.protocol.context import StoreContext
    from store.formats.records import Header

log = logging.getLogger("sessionstore.compactor.gc")

#: Deletion order: what a reader of an older manifest would fetch last goes first, so an
#: interrupted pass leaves consistent (if unreachable) older states behind.
_KINDS = ("segment", "base", "orphan_base", "manifest", "stale_incarnation")
_NEVER = 2**63


@dataclass(frozen=True, slots=True)
class _ManifestInfo:
    generation: int
    through_seq: int
    bases: frozenset[str]
    delete_after_ms: int




class GarbageCollector:
    """GC of one store, built from what it needs (never from a compactor)."""

    def __init__(
        self,
        ctx: StoreContext,
        options: CompactorOptions,
        *,
        now: Clock = wall_clock_ms,
        fault_hook: FaultHook | None = None,
    ) -> None:
        self.ctx = ctx
        self.options = options
        self.now = now
        self.worker = options.worker
        self._fault_hook = fault_hook

    def fault(self, point: str, **ctx: object) -> None:
        if self._fault_hook is not None:
            self._fault_hook(point, ctx)

    def collect(self) -> GcResult:
        ctx = self.ctx
        total = GcResult()
        sids = ctx.options.retry.call(lambda: all_session_ids(ctx.objects, ctx.layout))
        for sid in sids:
            try:
                total = total + self.collect_session(sid)
            except SessionStoreError as exc:
                log.warning("gc of a session failed", extra={"session_id": sid, "error": repr(exc)})
                total = total + GcResult(errors=(f"{sid}: {exc!r}",))
        return total

    def collect_session(self, sid: str) -> GcResult:
        ctx = self.ctx
        now = self.now()
        grace = self.options.grace_ms
        session_prefix = ctx.layout.session_prefix(sid)
        listed = ctx.options.retry.call(lambda: [i.key for i in ctx.objects.list(session_prefix)])
        # After the listing: an incarnation created since has nothing in the listing.
        try:
            header: Header | None = ctx.headers.read(sid)
        except SessionNotFoundError:
            header = None
        by_inc: dict[str, list[str]] = defaultdict(list)
        for key in listed:
            parsed = ctx.layout.parse(key)
            if parsed is not None and parsed.incarnation is not None:
                by_inc[parsed.incarnation].append(key)
        due: list[tuple[str, str]] = []
        waiting = 0
        stale: list[str] = []
        for inc, keys in by_inc.items():
            if header is not None and inc == header.incarnation:
                continue
            if self._stale_due(sid, inc, header, now, grace):
                stale.append(inc)
            else:
                waiting += len(keys)
        if stale:
            # An incarnation without a header may still be getting one (an encrypted create
            # writes its data key first, then pauses): fenced, the header read again, and
            # one it now names left to its creator (store/protocol/incarnations.py).
            self.fault("gc.before_fence", session_id=sid, incarnations=stale)
            stale = incarnations.fence(ctx, sid, stale)
            fence_keys = {ctx.layout.withdrawn(sid, inc) for inc in stale}
            due.extend(("stale_incarnation", k) for inc in stale for k in by_inc[inc] if k not in fence_keys)
        if header is not None and header.incarnation in by_inc:
            cur_due, cur_waiting = self._current(sid, header.incarnation, by_inc[header.incarnation], now, grace)
            due.extend(cur_due)
            waiting += cur_waiting
        self._delete(sid, due)
        if stale:
            # Last: each stale incarnation's fence, once the rest of it is gone.
            incarnations.unfence(ctx, sid, stale)
            if header is None:
                self._forget_marks(sid, stale)
        if due:
            log.info(
                "gc",
                extra={"session_id": sid, "deleted": len(due), "waiting": waiting,
                       "kinds": {k: sum(1 for d, _ in due if d == k) for k in _KINDS}},
            )
        return GcResult(sessions=1, deleted=tuple(due), waiting=waiting)

    # --- the current incarnation -------------------------------------------------------------

    def _current(
        self, sid: str, inc: str, keys: list[str], now: int, grace: int
    ) -> tuple[list[tuple[str, str]], int]:
        ctx = self.ctx
        segments: dict[int, str] = {}
        manifests: dict[int, str] = {}
        bases: list[str] = []
        for key in keys:
            parsed = ctx.layout.parse(key)
            if parsed is None:
                continue
            if parsed.kind == "segment" and parsed.number is not None:
                segments[parsed.number] = key
            elif parsed.kind == "manifest" and parsed.number is not None:
                manifests[parsed.number] = key
            elif parsed.kind == "base":
                bases.append(key)
            # anything else is not a name the store writes: never ours to delete
        latest = ctx.manifests.latest(sid, inc)
        if latest is None:
            # No manifest: every segment is live, and no base is named by anything.
            return self._orphans(sid, inc, None, bases, set(), now, grace)
        infos = self._manifest_infos(sid, inc, latest, manifests, grace)
        due: list[tuple[str, str]] = []
        waiting = 0
        # Segments merged by some manifest.
        by_through = sorted(infos, key=lambda m: m.generation)
        for seq, key in segments.items():
            if seq > latest.through_seq:
                continue
            retirer = next((m for m in by_through if m.through_seq >= seq), None)
            at = retirer.delete_after_ms if retirer else _NEVER
            if now >= at:
                due.append(("segment", key))
            else:
                waiting += 1
        # Older manifests and their bases: retired by the next manifest that still exists.
        named: set[str] = set()
        retire_at: dict[str, int] = {}
        for i, info in enumerate(by_through):
            named |= info.bases
            if info.generation == latest.generation:
                continue
            at = by_through[i + 1].delete_after_ms
            for base in info.bases:
                retire_at[base] = max(retire_at.get(base, 0), at)
            if info.generation in manifests:
                key = manifests[info.generation]
                if now >= at:
                    due.append(("manifest", key))
                else:
                    waiting += 1
        live_bases = {str(b["key"]) for b in latest.bases}
        for base in bases:
            if base in live_bases or base not in retire_at:
                continue
            if now >= retire_at[base]:
                due.append(("base", base))
            else:
                waiting += 1
        orphans, orphans_waiting = self._orphans(
            sid, inc, latest, [b for b in bases if b not in named], live_bases, now, grace
        )
        waiting += orphans_waiting
        if due:
            # What the newest manifest retires goes only once the manifest is durable: its
            # compactor may have paused or died between its write and its flush, and a power
            # loss could then keep the deletions and lose the manifest (docs/design.md,
            # "Durable before Redis hears of it"). The bases it names were flushed before it
            # was written.
            newest = ctx.layout.manifest(sid, inc, latest.generation)
            ctx.options.retry.call(lambda: ctx.objects.flush(newest))
        segments_due = [k for kind, k in due if kind == "segment"]
        if segments_due and not self._fence_retired(sid, inc, latest.through_seq):
            due = [(kind, k) for kind, k in due if kind != "segment"]
            waiting += len(segments_due)
        return due + orphans, waiting

    def _fence_retired(self, sid: str, inc: str, through_seq: int) -> bool:
        """Tell Redis that slots 1..through_seq are retired before deleting any of them.

        A writer that passed CHECK long ago (it paused) and re-creates a deleted slot must be
        told ZOMBIE at its COMMIT, never OK. Redis learns the fence here (and from the
        compactor right after the manifest); a rebuild after a flush learns it from the
        manifest itself; a rebuild older than the grace period is refused by INSTALL. We are
        past the manifest's grace period now, so every rebuild Redis could still accept read
        the manifest. Without Redis no segment is deleted: they wait for the next pass.
        """
        try:
            self.ctx.coord.retired(sid, inc, through_seq)
        except BackendError as exc:
            log.warning("segments kept: Redis unavailable to fence them",
                        extra={"session_id": sid, "error": repr(exc)})
            return False
        self.fault("gc.after_fence", session_id=sid, through_seq=through_seq)
        return True

    def _manifest_infos(
        self, sid: str, inc: str, latest: Manifest, listed: dict[int, str], grace: int
    ) -> list[_ManifestInfo]:
        ctx = self.ctx
        # Every generation from the oldest listed up to the latest: one created after the
        # listing may name bases that the listing holds.
        low = min(listed) if listed else latest.generation
        out: list[_ManifestInfo] = []
        for gen in range(low, latest.generation + 1):
            found = latest if gen == latest.generation else ctx.manifests.get(sid, inc, gen)
            if found is None:
                continue  # deleted by another pass: what it retired is past its grace too
            out.append(_info(found, grace))
        return out

    def _orphans(
        self,
        sid: str,
        inc: str,
        latest: Manifest | None,
        candidates: list[str],
        live: set[str],
        now: int,
        grace: int,
    ) -> tuple[list[tuple[str, str]], int]:
        """Bases no manifest names: due, and how many wait.

        A base is written for one generation g (its key says which) and only the create of
        manifest g can ever name it. While g is above the newest manifest, its compactor may
        still be alive, however old the base is (the compactor may have paused after its
        last check and before that create). So age alone never makes such a base garbage:
        once it is a grace period old, GC takes generation g itself with a *fence*
        manifest (the newest one's content under generation g, see ``_fence_generation``).
        From then on the base can never be named by the newest manifest (a paused compactor's
        create of g fails, or re-creates g below the newest after g was deleted, where no
        reader looks), and it is deleted like any other orphan.
        """
        newest = latest.generation if latest is not None else 0
        due: list[tuple[str, str]] = []
        waiting = 0
        next_gen: list[str] = []
        for key in candidates:
            if key in live:
                continue
            parsed = self.ctx.layout.parse(key)
            started = parsed.started_ms if parsed else None
            gen = parsed.number if parsed else None
            if started is None or gen is None or now < started + grace:
                waiting += 1
            elif gen <= newest:
                due.append(("orphan_base", key))
            elif gen == newest + 1:
                next_gen.append(key)
            else:
                waiting += 1  # a generation beyond the next: it waits for the one before
        if next_gen:
            if self._fence_generation(sid, inc, latest, newest + 1, now, grace):
                due.extend(("orphan_base", key) for key in next_gen)
            else:
                waiting += len(next_gen)
        return due, waiting

    def _fence_generation(
        self, sid: str, inc: str, latest: Manifest | None, gen: int, now: int, grace: int
    ) -> bool:
        """Create manifest ``gen`` with the newest manifest's content (or an empty one).

        It changes nothing a reader sees (same bases, same ``through_seq``) and retires
        nothing; it only takes the generation away from a compactor that wrote bases for it
        and never came back. If that compactor's own create lands first, ours fails and its
        bases are named: both outcomes are fine. True when ours was created (the bases are
        then garbage at once; otherwise the next pass decides from what it lists).
        """
        ctx = self.ctx
        body = fence_manifest(
            session_id=sid,
            incarnation=inc,
            generation=gen,
            newest=latest,
            worker=self.worker,
            now_ms=now,
            grace_ms=grace,
            history_limit=self.options.history_limit,
        )
        self.fault("gc.before_fence_manifest", session_id=sid, generation=gen)
        try:
            created = ctx.manifests.create(sid, inc, gen, body, f"gc-fence-{uuid.uuid4().hex}")
        except (BackendError, IndeterminateError) as exc:
            log.warning("fence manifest not created", extra={"session_id": sid, "error": repr(exc)})
            return False
        if not created:
            return False  # its compactor came back (or another GC fenced it): either way, taken
        # Our fence may have landed *below* the newest manifest: this GC paused before the
        # create while the generation was created (by the bases' own compactor, naming them),
        # superseded by a fence that copied its bases, and deleted. Only a fence that is the
        # newest when created proves the bases unnamed for good: later manifests either copy
        # it (a fence) or write bases of their own (a compaction).
        newest = ctx.manifests.latest(sid, inc)
        if newest is None or newest.generation != gen:
            return False
        log.info("fenced an abandoned generation", extra={"session_id": sid, "generation": gen})
        try:
            # The readers' hint (mgen): the fence is the newest manifest now, and the older
            # one it copied may be deleted. Nothing merged, nothing retired beyond it.
            through = latest.through_seq if latest is not None else 0
            ctx.coord.compacted(sid, inc, 0, 0, through, gen)
        except BackendError:
            pass  # a hint only: readers that find no manifest there list them
        # The fence retired the manifest it copied: due one grace period from now.
        schedule_gc(ctx.coord, sid, self.now() + grace)
        return True

    # --- other incarnations ------------------------------------------------------------------

    def _stale_due(self, sid: str, inc: str, header: "Header | None", now: int, grace: int) -> bool:
        if header is not None:
            # The old incarnation ended no later than the current header was created.
            return now >= header.created_at_ms + grace
        try:
            seen = self.ctx.coord.gc_first_seen(sid, inc, now)
        except BackendError as exc:
            # No mark, no deletion this time: the objects wait for a pass that has one.
            log.warning("gc mark unavailable", extra={"session_id": sid, "error": repr(exc)})
            return False
        return seen is not None and now >= seen + grace

    def _forget_marks(self, sid: str, incs: list[str]) -> None:
        try:
            self.ctx.coord.gc_forget_seen(sid, incs)
        except BackendError as exc:
            log.warning("gc marks not cleared", extra={"session_id": sid, "error": repr(exc)})

    # --- deleting ----------------------------------------------------------------------------

    def _delete(self, sid: str, due: list[tuple[str, str]]) -> None:
        ctx = self.ctx
        for kind in _KINDS:
            keys = [k for d, k in due if d == kind]
            if not keys:
                continue
            self.fault("gc.before_delete", session_id=sid, kind=kind, keys=keys)
            ctx.options.retry.call(lambda: ctx.objects.delete_many(keys))
            self.fault("gc.after_delete", session_id=sid, kind=kind, keys=keys)


def _info(manifest: Manifest, grace: int) -> _ManifestInfo:
    finished = manifest.finished_at_ms
    recorded = manifest.delete_after_ms
    if finished is None and recorded is None:
        # A manifest without times: nothing it retired is ever deleted automatically.
        at = _NEVER
    else:
        at = max(
            recorded or 0,
            (finished + grace) if finished is not None else 0,
            _paused_create(manifest, finished, grace),
        )
    return _ManifestInfo(manifest.generation, manifest.through_seq, manifest.base_keys, at)


def _paused_create(manifest: Manifest, finished: object, grace: int) -> int:
    """The times inside a manifest were taken before its create: a compactor that paused in
    between makes it look older than it is, and GC would delete what it retired at once,
    not a grace period after it appeared. The object store's creation time cannot be early;
    when it is later than the finish time by more than half the grace period (far beyond any
    clock skew we allow), the grace period runs from it instead."""
    created = manifest.created_ms
    if created is None or not isinstance(finished, int) or created - finished <= grace // 2:
        return 0
    return created + grace


__all__ = ["GarbageCollector"]
