"""Compacted ids: what idempotency needs for old entries, read from the data, not Redis.

Redis's id index (``ids``, coordination/scripts.py) holds the ids of a session's uncompacted
tail only. When a manifest retires segments 1..T, COMPACTED drops their ids from it and
records ``iseq`` = T: from then on those ids live only in the manifest's bases (and a fork's
inherited path in its source), where every entry keeps its id and segment number. Redis's
memory for a session is then bounded by its uncompacted tail, whatever its length.

A writer still has to know them: a re-send of an old batch must answer with its original
result (DUPLICATE), a new batch must not reuse an old id (COLLISION), and a parent may be an
old entry. So each process keeps ``CompactedIds``: per (session, incarnation), the ids of
segments 1..``through`` (and the inherited path) with their "<seq>:<hash>", read from the
bases once and then grown from each new manifest's bases (a base is immutable, and entries
keep their positions across compactions: only the bases past what the copy covers are
read). The writer looks its batch up in its copy and sends CHECK what it found and how far
the copy reaches; CHECK answers REINDEX when Redis's ``iseq`` is further, in the same atomic
script that reads the rest of the index, so a compaction between the lookup and CHECK is
always caught (docs/design.md, "Redis state").

Everything in a copy is a fact of its incarnation that never stops being true (a committed
entry stays committed, at the same segment; a redaction rewrites content in a base, and a
copy keeps the hash the entry was committed with, which is what a re-send carries), so a
process that paused for any length of time may go on using its copy: it only ever reaches
less far than Redis, and CHECK then says so.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from store.protocol.context import StoreContext
from store.formats.entries import entry_hash
from store.errors import BackendError, BackendUnavailableError
from store.protocol.manifest import Manifest
from store.protocol.read import Reader, SegmentRetired
from store.formats.records import Header

#: Ids kept over all sessions before the least recently used sessions' copies are dropped
#: (about 150 bytes an id in memory). A dropped copy is read again when next needed.
DEFAULT_MAX_IDS = 400_000
_MAX_LOADS = 4


@dataclass(slots=True)
class _Copy:
    #: Every id of segments 1..through (and of the inherited path) is in ``ids``.
    through: int = -1
    #: Entries of the bases read so far (a manifest's bases hold entries in commit order).
    base_entries: int = 0
    inherited: bool = False
    ids: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Lookup:
    """What a writer sends CHECK about its batch (scripts.CHECK)."""

    #: The segment through which the copy reaches (-1: no copy).
    through: int
    #: Per id of the batch: "<seq>:<hash>" if the copy holds it, else "".
    found: tuple[str, ...] = ()
    #: Per external parent: "1" if the copy holds it, else "".
    parents: tuple[str, ...] = ()

    def args(self) -> list[str | int]:
        if self.through < 0:
            return []
        return [self.through, *self.found, *self.parents]


NO_COPY = Lookup(-1)


class CompactedIds:
    """This process's copies of sessions' compacted ids (see the module docstring)."""

    def __init__(self, ctx: StoreContext, reader: Reader, max_ids: int = DEFAULT_MAX_IDS) -> None:
        self.ctx = ctx
        self.reader = reader
        self.max_ids = max_ids
        self._lock = threading.Lock()
        self._copies: OrderedDict[tuple[str, str], _Copy] = OrderedDict()
        self._size = 0

    def lookup(
        self, sid: str, inc: str, ids: Sequence[str], parents: Iterable[tuple[str, str]]
    ) -> Lookup:
        with self._lock:
            copy = self._copies.get((sid, inc))
            if copy is None or copy.through < 0:
                return NO_COPY
            self._copies.move_to_end((sid, inc))
            got = copy.ids
            return Lookup(
                copy.through,
                tuple(got.get(i, "") for i in ids),
                tuple("1" if p in got else "" for _, p in parents),
            )

    def through(self, sid: str, inc: str) -> int:
        with self._lock:
            copy = self._copies.get((sid, inc))
            return copy.through if copy is not None else -1

    def load(self, sid: str, header: Header, at_least: int) -> None:
        for attempt in range(_MAX_LOADS):
            try:
                return self._load(sid, header, at_least, hinted=attempt == 0)
            except SegmentRetired:
                continue  # a base merged and deleted meanwhile: a newer manifest names it
        raise BackendUnavailableError(
            f"session {sid!r}: its bases kept being replaced while reading its compacted ids"
        )

    def _load(self, sid: str, header: Header, at_least: int, *, hinted: bool) -> None:
        """Make the copy reach segment ``at_least`` (Redis's ``iseq``): the bases of the
        newest manifest not read yet, and the inherited path once. If the newest manifest
        does not reach that far (a compactor's manifest below the newest, see
        docs/design.md), a whole read of the session does."""
        ctx = self.ctx
        inc = header.incarnation
        with self._lock:
            copy = self._copies.get((sid, inc))
            start = _Copy() if copy is None else _Copy(
                copy.through, copy.base_entries, copy.inherited, copy.ids
            )
        if start.through >= at_least:
            return
        added: dict[str, str] = {}
        if not start.inherited and header.fork is not None:
            for e in self.reader.fork_path(header.fork):
                added[str(e["id"])] = f"0:{entry_hash(e)}"
        manifest = self._manifest(sid, inc, at_least) if hinted else ctx.manifests.latest(sid, inc)
        base_entries = start.base_entries
        if manifest is not None and manifest.through_seq >= at_least:
            seqs = _seq_of_position(manifest.seq_counts)
            pos = 0
            for base in manifest.bases:
                count = int(base.get("entries") or 0)
                if pos + count > start.base_entries:
                    entries = self.reader.base_entries(base)
                    for k, e in enumerate(entries):
                        if pos + k >= start.base_entries:
                            added[str(e["id"])] = f"{seqs[pos + k]}:{entry_hash(e)}"
                pos += count
            through, base_entries = manifest.through_seq, pos
        else:
            data = self.reader.read(sid, header, use_hint=False)
            if data.seq < at_least:
                raise BackendUnavailableError(
                    f"session {sid!r}: Redis says segments 1..{at_least} are compacted, but "
                    f"the object store shows {data.seq}; try again"
                )
            for e, s in zip(data.entries, data.seqs):
                added[str(e["id"])] = f"{s}:{entry_hash(e)}"
            through = data.seq
            base_entries = sum(data.manifest.seq_counts) if data.manifest else 0
        self._store(sid, inc, through, base_entries, added)

    def _manifest(self, sid: str, inc: str, at_least: int) -> Manifest | None:
        """The manifest Redis names (``mgen``: one Redis round trip and at most one GET,
        none when this process parsed it already), if it reaches ``at_least``; else the
        newest listed. Either is verified by its own content: any manifest of ours that
        reaches ``at_least`` holds every entry of segments 1..at_least."""
        ctx = self.ctx
        try:
            state = ctx.coord.tail(sid)
        except BackendError:
            state = None
        if state is not None and state.inc == inc and state.mgen > 0:
            named = ctx.manifests.cached(sid, inc, state.mgen) or ctx.manifests.get(sid, inc, state.mgen)
            if named is not None and named.through_seq >= at_least:
                return named
        return ctx.manifests.latest(sid, inc)

    def seed(
        self, sid: str, inc: str, through: int, base_entries: int, ids: Iterable[tuple[str, int, str]]
    ) -> None:
        """A rebuild read the whole session: keep the ids of segments 1..``through`` (and the
        inherited path, seq 0) it found, so this process's next append needs no REINDEX."""
        self._store(
            sid, inc, through, base_entries, {i: f"{s}:{h}" for i, s, h in ids if s <= through}
        )

    def forget(self, sid: str) -> None:
        with self._lock:
            for key in [k for k in self._copies if k[0] == sid]:
                self._size -= len(self._copies.pop(key).ids)

    def _store(
        self, sid: str, inc: str, through: int, base_entries: int, added: dict[str, str]
    ) -> None:
        with self._lock:
            copy = self._copies.get((sid, inc))
            if copy is None:
                copy = self._copies[(sid, inc)] = _Copy()
            before = len(copy.ids)
            copy.ids.update(added)
            self._size += len(copy.ids) - before
            copy.inherited = True  # the inherited path is read with the first load or seed
            if through > copy.through:
                copy.through = through
                copy.base_entries = max(copy.base_entries, base_entries)
            self._copies.move_to_end((sid, inc))
            while self._size > self.max_ids and len(self._copies) > 1:
                _, old = self._copies.popitem(last=False)
                self._size -= len(old.ids)


def _seq_of_position(seq_counts: Sequence[int]) -> list[int]:
    out: list[int] = []
    for s, c in enumerate(seq_counts, start=1):
        out.extend([s] * c)
    return out


__all__ = ["CompactedIds", "Lookup", "NO_COPY"]
