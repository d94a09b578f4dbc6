"""Decoded segments a process keeps for its readers (``Reader.read_after``'s ``cache``).

A segment never changes within an incarnation (compaction moves its entries into bases with
their segment numbers, it never alters them; a new incarnation is another key), so a segment
once read and verified is good for as long as it is kept: caching it is caching an immutable
object, never a guess about the present. What is *new* is always asked of the object store
and Redis (``Reader.read_after``); the cache only spares GETs of what a reader had already.

Kept per session incarnation from segment 1 on without holes, so a reader knows when it has
every segment it asks for; whole incarnations are evicted, least recently used first, past
``max_bytes``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

Entries = list[dict[str, Any]]


class SegmentCache:
    """Thread-safe. ``size``: the bytes a segment counts for (its stored size, or an
    estimate of its decoded one)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._runs: OrderedDict[tuple[str, str], list[Entries]] = OrderedDict()
        self._sizes: dict[tuple[str, str], int] = {}
        self._bytes = 0

    def add(self, sid: str, inc: str, seq: int, entries: Entries, size: int) -> None:
        """Keep ``entries`` as segment ``seq`` if it extends the incarnation's run from 1."""
        key = (sid, inc)
        with self._lock:
            run = self._runs.get(key)
            if run is None:
                if seq != 1:
                    return
                run = self._runs[key] = []
                self._sizes[key] = 0
            if seq != len(run) + 1:
                return
            run.append(entries)
            self._sizes[key] += size
            self._bytes += size
            self._runs.move_to_end(key)
            while self._bytes > self.max_bytes and len(self._runs) > 1:
                old, _ = self._runs.popitem(last=False)
                self._bytes -= self._sizes.pop(old)

    def add_read(self, sid: str, inc: str, entries: Entries, seqs: list[int], newest: int) -> None:
        """Offer a whole read's segments 1..``newest`` (``seqs[i]`` is the segment of
        ``entries[i]``; a compacted segment's entries come from its base, the same ones)."""
        by_seq: dict[int, Entries] = {}
        for e, s in zip(entries, seqs):
            if s <= newest:
                by_seq.setdefault(s, []).append(e)
        for s in range(1, newest + 1):
            seg = by_seq.get(s)
            if seg is None:
                return
            self.add(sid, inc, s, seg, estimated_size(seg))

    def run(self, sid: str, inc: str, first: int, last: int) -> list[Entries] | None:
        """The entries of segments ``first..last``, one list a segment, if all are kept."""
        with self._lock:
            run = self._runs.get((sid, inc))
            if run is None or len(run) < last:
                return None
            self._runs.move_to_end((sid, inc))
            return run[first - 1 : last]

    def drop(self, sid: str) -> None:
        """Forget every incarnation of ``sid``."""
        with self._lock:
            for key in [k for k in self._runs if k[0] == sid]:
                del self._runs[key]
                self._bytes -= self._sizes.pop(key)


def estimated_size(entries: Entries) -> int:
    """What decoded entries count for when their stored size is not at hand: their strings,
    one level into lists, and a fixed overhead an entry."""
    size = 0
    for e in entries:
        size += 200
        for v in e.values():
            if isinstance(v, str):
                size += len(v)
            elif isinstance(v, list):
                size += sum(len(m) if isinstance(m, str) else 64 for m in v)
    return size


__all__ = ["SegmentCache", "estimated_size"]
