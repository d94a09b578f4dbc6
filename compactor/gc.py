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
base named by m < L       the same as m
base named by no          the start time in its key + grace (an orphan: its manifest lost
manifest                  the race, or its worker died before creating it)
another incarnation's     the current header's ``created_at_ms`` + grace
object                    (leftovers of a deleted session, see store/layout.py)
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
reachable over time, except an orphan base adopted by a manifest created during the pass,
which is younger than half a grace period by the rule above. Deleting twice, or from two
machines at once, is harmless.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from compactor.jobs import redis_call
from compactor.records import GcResult
from store.core import Manifest
from store.errors import BackendError, ObjectNotFoundError, SessionNotFoundError, SessionStoreError
from store.layout import Layout

if TYPE_CHECKING:
    from compactor.compact import Compactor
    from store.records import Header

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
    def __init__(self, compactor: "Compactor") -> None:
        self._c = compactor

    def collect(self) -> GcResult:
        store = self._c.store
        total = GcResult()
        sids = store.options.retry.call(
            lambda: list(store.objects.list_dirs(store.layout.sessions_prefix))
        )
        for sid in sids:
            try:
                total = total + self.collect_session(sid)
            except SessionStoreError as exc:
                log.warning("gc of a session failed", extra={"session_id": sid, "error": repr(exc)})
                total = total + GcResult(errors=(f"{sid}: {exc!r}",))
        return total

    def collect_session(self, sid: str) -> GcResult:
        store = self._c.store
        now = self._c.now()
        grace = self._c.options.grace_ms
        session_prefix = store.layout.session_prefix(sid)
        listed = store.options.retry.call(lambda: [i.key for i in store.objects.list(session_prefix)])
        # After the listing: an incarnation created since has nothing in the listing.
        try:
            header: Header | None = store.get_header(sid)
        except SessionNotFoundError:
            header = None
        by_inc: dict[str, list[str]] = defaultdict(list)
        for key in listed:
            rest = key[len(session_prefix) :]
            inc, sep, sub = rest.partition("/")
            if sep and sub:
                by_inc[inc].append(key)
        due: list[tuple[str, str]] = []
        waiting = 0
        stale: list[str] = []
        for inc, keys in by_inc.items():
            if header is not None and inc == header.incarnation:
                continue
            if self._stale_due(sid, inc, header, now, grace):
                due.extend(("stale_incarnation", k) for k in keys)
                stale.append(inc)
            else:
                waiting += len(keys)
        if header is not None and header.incarnation in by_inc:
            cur_due, cur_waiting = self._current(sid, header.incarnation, by_inc[header.incarnation], now, grace)
            due.extend(cur_due)
            waiting += cur_waiting
        self._delete(sid, due)
        if stale and header is None:
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
        store = self._c.store
        inc_prefix = store.layout.incarnation_prefix(sid, inc)
        segments: dict[int, str] = {}
        manifests: dict[int, str] = {}
        bases: list[str] = []
        for key in keys:
            kind, _, name = key[len(inc_prefix) :].partition("/")
            try:
                if kind == "seg" and name.endswith(".jsonl"):
                    segments[Layout.seq_of(key)] = key
                elif kind == "manifest" and name.endswith(".json"):
                    manifests[Layout.seq_of(key)] = key
                elif kind == "base" and name.endswith(".jsonl"):
                    bases.append(key)
            except ValueError:
                pass  # not a name the store writes: never ours to delete
        latest = store.latest_manifest(sid, inc)
        if latest is None:
            # No manifest: every segment is live, and no base is named by anything.
            return self._orphans(bases, set(), now, grace), 0
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
        orphans = self._orphans([b for b in bases if b not in named], live_bases, now, grace)
        waiting += sum(1 for b in bases if b not in named) - len(orphans)
        return due + orphans, waiting

    def _manifest_infos(
        self, sid: str, inc: str, latest: Manifest, listed: dict[int, str], grace: int
    ) -> list[_ManifestInfo]:
        store = self._c.store
        # Every generation from the oldest listed up to the latest: one created after the
        # listing may name bases that the listing holds.
        low = min(listed) if listed else latest.generation
        out: list[_ManifestInfo] = []
        for gen in range(low, latest.generation + 1):
            if gen == latest.generation:
                manifest = latest
            else:
                key = store.layout.manifest(sid, inc, gen)
                try:
                    obj = store.options.retry.call(lambda: store.objects.get(key))
                except ObjectNotFoundError:
                    continue  # deleted by another pass: what it retired is past its grace too
                manifest = Manifest.from_json(key, obj.data)
            out.append(_info(manifest, grace))
        return out

    def _orphans(
        self, candidates: list[str], live: set[str], now: int, grace: int
    ) -> list[tuple[str, str]]:
        due: list[tuple[str, str]] = []
        for key in candidates:
            if key in live:
                continue
            started = _base_started_ms(key)
            if started is not None and now >= started + grace:
                due.append(("orphan_base", key))
        return due

    # --- other incarnations ------------------------------------------------------------------

    def _stale_due(self, sid: str, inc: str, header: "Header | None", now: int, grace: int) -> bool:
        if header is not None:
            # The old incarnation ended no later than the current header was created.
            return now >= header.created_at_ms + grace
        client = self._c.store.coord.client
        key = self._c.store.coord.keys.gc_seen
        field = f"{sid}/{inc}"

        def mark() -> object:
            client.hsetnx(key, field, now)
            return client.hget(key, field)

        try:
            seen = redis_call(mark)
        except BackendError as exc:
            # No mark, no deletion this time: the objects wait for a pass that has one.
            log.warning("gc mark unavailable", extra={"session_id": sid, "error": repr(exc)})
            return False
        return isinstance(seen, (bytes, str, int)) and now >= int(seen) + grace

    def _forget_marks(self, sid: str, incs: list[str]) -> None:
        client = self._c.store.coord.client
        key = self._c.store.coord.keys.gc_seen
        try:
            redis_call(lambda: client.hdel(key, *[f"{sid}/{inc}" for inc in incs]))
        except BackendError as exc:
            log.warning("gc marks not cleared", extra={"session_id": sid, "error": repr(exc)})

    # --- deleting ----------------------------------------------------------------------------

    def _delete(self, sid: str, due: list[tuple[str, str]]) -> None:
        store = self._c.store
        for kind in _KINDS:
            keys = [k for d, k in due if d == kind]
            if not keys:
                continue
            self._c.fault("gc.before_delete", session_id=sid, kind=kind, keys=keys)
            store.options.retry.call(lambda: store.objects.delete_many(keys))
            self._c.fault("gc.after_delete", session_id=sid, kind=kind, keys=keys)


def _info(manifest: Manifest, grace: int) -> _ManifestInfo:
    raw = manifest.raw
    comp = raw.get("compaction") if isinstance(raw.get("compaction"), dict) else {}
    finished = comp.get("finished_at_ms") if comp else None
    recorded = raw.get("delete_after_ms")
    if not isinstance(finished, int) and not isinstance(recorded, int):
        # A manifest without times: nothing it retired is ever deleted automatically.
        at = _NEVER
    else:
        at = max(
            recorded if isinstance(recorded, int) else 0,
            (finished + grace) if isinstance(finished, int) else 0,
        )
    return _ManifestInfo(
        manifest.generation,
        manifest.through_seq,
        frozenset(str(b["key"]) for b in manifest.bases),
        at,
    )


def _base_started_ms(key: str) -> int | None:
    """The start time in ``<gen:016d>-<started ms>-<token>-<part>.jsonl``, or None."""
    name = key.rsplit("/", 1)[-1].split(".", 1)[0]
    parts = name.split("-")
    if len(parts) != 4 or not parts[1].isdigit():
        return None
    return int(parts[1])


__all__ = ["GarbageCollector"]
