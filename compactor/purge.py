"""Purge now: delete redacted bytes from storage at once, for an erasure request.

A redaction hides its target from every reader the moment it is committed. The bytes stay in
storage until two things have happened: a compaction has rewritten the session with the
target as a tombstone (``compactor/compact.py``), and GC has deleted the objects that still
hold the content (the merged segments and the previous bases) once the grace period recorded
in that compaction's manifest is over (``compactor/gc.py``; ``gc --grace`` can only lengthen
it). :func:`purge_now` does both at once:

1. Compact until the latest manifest covers every segment committed when it was called (or
   ``through_seq``): that manifest's bases hold tombstones for every redaction up to there.
   Another compactor winning a round is fine: its manifest counts the same way.
2. LIST the session's current incarnation, then read the latest manifest L (after the LIST,
   as GC does: nothing created during the purge is a candidate), and delete at once every
   object L does not reach: segments ``<= L.through_seq``, manifests older than L, and bases
   L does not name whose generation is ``<= L`` (a base of a compaction still running from
   L is named ``L+1`` and holds only what L's tombstoned bases and later segments hold).

What the guarantees become without the grace period (docs/compaction.md, "Purge now"):

- A reader that loaded an older manifest meets a 404 on a deleted segment or base (or finds
  manifest ``L`` when it checks for a newer one) and starts over from L: it gets a restart,
  never wrong data. The store's read protocol already handles objects retired under it.
- A writer paused between its check and its PUT of a slot L merged (and the purge deleted)
  re-creates that slot where no reader looks. Before deleting segments the purge waits until
  no rebuild of Redis's state that read the session before L can still be installed (the
  rebuild age limit, a minute by default, plus the clock skew), then fences slots
  ``1..L.through_seq`` in Redis, as GC does, so that writer's COMMIT answers that the
  slot is retired: its object is withdrawn and it checks again, never acknowledged for a dead
  slot. Without Redis no segment is deleted (``BackendUnavailableError``: try again).
- A compactor working from an older manifest loses the race for its manifest (and deletes
  its own bases) or restarts from L when a source it reads is gone.

The bytes are then in no object of the store. What a backend does with deleted objects is
the backend's: an S3 bucket with versioning keeps them as noncurrent versions until a
lifecycle rule expires them, and backups keep what they copied.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from compactor.records import CompactionResult
from store.errors import ContentionError
from store.formats.layout import check_session_id
from store.protocol.manifest import Manifest

if TYPE_CHECKING:
    from compactor.compact import Compactor

log = logging.getLogger("sessionstore.compactor.purge")

#: Compactions a purge runs at most before it gives up (another compactor keeps winning, or
#: writers keep appending faster than it can merge).
MAX_ROUNDS = 20

_KINDS = ("segment", "base", "manifest")


@dataclass(frozen=True, slots=True)
class PurgeResult:
    session_id: str
    #: The manifest whose bases now hold the session (tombstones for redacted entries).
    generation: int
    #: Segments up to here are merged into that manifest's bases.
    through_seq: int
    #: The compactions this purge ran (outcomes "compacted", "lost", "nothing").
    compactions: tuple[CompactionResult, ...] = ()
    #: ``(kind, key)`` of every object deleted: segment, base or manifest.
    deleted: tuple[tuple[str, str], ...] = field(default=())

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.deleted if k == kind)


def purge_now(
    compactor: "Compactor", session_id: str, *, through_seq: int | None = None, alone: bool = False
) -> PurgeResult:
    """Compact the session until its latest manifest covers ``through_seq`` (default: the
    tail when called), then delete every object of it that manifest does not reach, without
    waiting for the grace period. See the module docstring for what that keeps.

    ``alone``: the caller knows that every other process that used this store has exited
    (not paused: exited, as the demo's fleet has at its end), so no rebuild of Redis's state
    read before the latest manifest can be installed later and the wait for the rebuild age
    limit is skipped. The fence is set all the same. Never for a store other processes may
    still be using: one of them may be paused in the middle of such a rebuild."""
    sid = check_session_id(session_id)
    store = compactor.store
    header = store.get_header(sid)
    inc = header.incarnation
    target = store.get_tail(sid).seq if through_seq is None else through_seq
    runs: list[CompactionResult] = []
    latest = store.latest_manifest(sid, inc)
    while target > 0 and (latest is None or latest.through_seq < target):
        if len(runs) >= MAX_ROUNDS:
            raise ContentionError(
                f"session {sid!r}: {len(runs)} compactions did not reach segment {target}; "
                "nothing was deleted, try again"
            )
        result = compactor.compact_session(sid)
        runs.append(result)
        latest = store.latest_manifest(sid, inc)
        if result.outcome == "nothing" and (latest is None or latest.through_seq < target):
            # No segment after the latest manifest, yet it stops short of the target: the
            # target was beyond the tail. Everything there is, is merged.
            break
    if latest is None:
        # Nothing was ever written (or only beyond a gap): no object holds an entry yet.
        return PurgeResult(sid, 0, 0, tuple(runs))
    prefix = store.layout.incarnation_prefix(sid, inc)
    listed = store.options.retry.call(lambda: [i.key for i in store.objects.list(prefix)])
    # After the listing, as GC does: a manifest created since can only reach further.
    latest = store.latest_manifest(sid, inc) or latest
    live_bases = {str(b["key"]) for b in latest.bases}
    due: list[tuple[str, str]] = []
    for key in listed:
        parsed = store.layout.parse(key)
        if parsed is None or parsed.incarnation != inc or parsed.number is None:
            continue  # not a name the store writes (or a base named otherwise): never ours to delete
        if parsed.kind == "segment" and parsed.number <= latest.through_seq:
            due.append(("segment", key))
        elif parsed.kind == "manifest" and parsed.number < latest.generation:
            due.append(("manifest", key))
        elif parsed.kind == "base" and key not in live_bases and parsed.number <= latest.generation:
            due.append(("base", key))
    if any(kind == "segment" for kind, _ in due):
        if not alone:
            _wait_out_rebuilds(compactor, latest)
        _fence(compactor, sid, inc, latest.through_seq)
    for kind in _KINDS:
        keys = [k for d, k in due if d == kind]
        if keys:
            compactor.fault("purge.before_delete", session_id=sid, kind=kind, keys=keys)
            store.options.retry.call(lambda keys=keys: store.objects.delete_many(keys))
    log.info(
        "purged",
        extra={"session_id": sid, "generation": latest.generation, "through_seq": latest.through_seq,
               "deleted": len(due), "compactions": len(runs)},
    )
    return PurgeResult(sid, latest.generation, latest.through_seq, tuple(runs), tuple(due))


def _wait_out_rebuilds(compactor: "Compactor", latest: Manifest) -> None:
    """Wait until no rebuild of Redis's state that read the session before ``latest`` was
    created can still be installed (``StoreOptions.rebuild_max_age_ms``, plus the clock skew):
    after that, the fence below cannot be undone by a stale rebuild after a Redis flush, which
    is what GC gets from its grace period (docs/design.md, "Pauses"). At most about a minute
    with the defaults."""
    created = latest.created_ms or latest.finished_at_ms
    if created is None:
        created = compactor.now()
    ready = created + compactor.store.options.rebuild_max_age_ms + compactor.options.clock_skew_ms
    wait_ms = ready - compactor.now()
    if wait_ms > 0:
        log.info("waiting for rebuilds older than the manifest to expire",
                 extra={"wait_ms": wait_ms, "generation": latest.generation})
        time.sleep(wait_ms / 1000)


def _fence(compactor: "Compactor", sid: str, inc: str, through_seq: int) -> None:
    """Tell Redis that slots ``1..through_seq`` are retired before any of them is deleted
    (``Coordinator.retired``, the fence GC sets too). Raises ``BackendUnavailableError``
    when Redis cannot be told: then nothing is deleted."""
    compactor.ctx.coord.retired(sid, inc, through_seq)
    compactor.fault("purge.after_fence", session_id=sid, through_seq=through_seq)


__all__ = ["MAX_ROUNDS", "PurgeResult", "purge_now"]
