"""Purging redacted content while compacting.

The read-time model (``store.model.session.Session``) hides the target of every ``redaction`` entry
behind a tombstone, wherever the redaction sits relative to its target; the earliest
redaction of an entry is the one its tombstone names, and a redaction of a redaction, or of an
unknown id, has no effect. Compaction writes exactly that tombstone into the base, so that a
reader sees the same session before and after (invariant 6) and the content is gone from the
bucket once the retired objects are deleted.

A redaction may be committed long after its target (the target already sits in a base), or,
since ``targetId`` is not checked at append time, before it. A compaction therefore learns
every redaction of the session first and only then writes (pass 2). It does not read the
bases it keeps (``compactor/tiers.py``): each manifest records the index of every redaction
its bases hold (``redactions``), and pass 1 adds those of what it reads. A redaction new in
this compaction whose target is not in what it rewrites may name an entry in a kept base:
the compactor then looks for the target in the kept bases and rewrites from the oldest
base that holds one (``Compactor._compact_once``).
"""

from __future__ import annotations

from typing import Any

from store.model.rules import REDACTION_TYPE, redaction_tombstone

__all__ = ["RedactionIndex", "REDACTION_TYPE"]


class RedactionIndex:
    """Redactions seen so far, in commit order: target id -> the earliest redaction."""

    __slots__ = ("_first",)

    def __init__(self) -> None:
        # Only id and reason are kept: the index must stay small for a session of any size.
        self._first: dict[str, dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self._first)

    def __contains__(self, target: object) -> bool:
        return target in self._first

    def to_json(self) -> list[list[str]]:
        """``[[targetId, redaction id, reason], ...]`` in commit order (a manifest field)."""
        return [[t, str(r["id"]), str(r["reason"])] for t, r in self._first.items()]

    @classmethod
    def from_json(cls, raw: object) -> "RedactionIndex":
        """ValueError if ``raw`` is not what :meth:`to_json` writes."""
        if not isinstance(raw, list):
            raise ValueError("redactions: not a list")
        index = cls()
        for item in raw:
            if not (isinstance(item, list) and len(item) == 3 and all(isinstance(x, str) for x in item)):
                raise ValueError(f"redactions: bad item {item!r:.80}")
            index._first.setdefault(item[0], {"id": item[1], "reason": item[2]})
        return index

    def copy(self) -> "RedactionIndex":
        index = RedactionIndex()
        index._first.update(self._first)
        return index

    def observe(self, entry: dict[str, Any]) -> None:
        if entry.get("type") != REDACTION_TYPE:
            return
        target = entry.get("targetId")
        reason = entry.get("reason")
        # A malformed redaction is refused by the read-time model as a whole session error;
        # it must not purge anything here either.
        if not isinstance(target, str) or not target or not isinstance(reason, str):
            return
        self._first.setdefault(target, {"id": entry["id"], "reason": reason})

    def targets(self, entry: dict[str, Any]) -> bool:
        return entry.get("id") in self._first and entry.get("type") != REDACTION_TYPE

    def apply(self, entry: dict[str, Any]) -> dict[str, Any]:
        """The entry as the base stores it: its tombstone if redacted, else itself."""
        if not self._first or not self.targets(entry):
            return entry
        return redaction_tombstone(entry, self._first[entry["id"]])
