"""Which bases a compaction rewrites: runs merged geometrically, never the whole session.

A manifest's ``bases`` (commit order) fall into *runs*: the bases one compaction wrote, which
share the stem of their keys (``<gen>-<started ms>-<token>``, ``Layout.base_stem``) and
differ only in their part number. A compaction keeps a prefix of the runs as they are and
rewrites the rest, together with the new segments, into one new run at the end:

- ``merge_ratio`` (F > 1): going back from the newest run, a run is rewritten while it is
  smaller than F times everything rewritten so far (the new segments and the newer runs).
  After the compaction every run is at least F times the next newer one, so a session of B
  bytes has at most ``log_F(B / smallest run) + 1`` runs, and each byte is rewritten about
  ``log_F`` of the growth since it was appended (F = 2: ~4x at 10k entries compacted every
  64 segments, against ~80x when every compaction rewrote everything).
- A run written at an older schema (``store/formats/migrations.py``) is rewritten, so that
  ``migrate_session`` still lifts the whole session in one compaction.
- A manifest without ``redactions`` (written before runs were kept) says nothing about the
  redactions its bases hold: everything is rewritten once, and the next manifest records them.
- A redaction whose target sits in a kept run makes the compaction rewrite from that run on
  (``Compactor._compact_once`` finds it; see ``compactor/redaction.py``).
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from store.formats.migrations import CURRENT_SCHEMA

__all__ = ["Run", "runs_of", "plan_cut"]

Run = tuple[dict[str, Any], ...]


def _stem(base: dict[str, Any]) -> str:
    name = str(base["key"]).rsplit("/", 1)[-1]
    return name.rsplit("-", 1)[0]


def runs_of(bases: Iterable[dict[str, Any]]) -> list[Run]:
    """The manifest's bases grouped into runs (consecutive bases of one stem), oldest first."""
    runs: list[list[dict[str, Any]]] = []
    last = None
    for base in bases:
        stem = _stem(base)
        if runs and stem == last:
            runs[-1].append(base)
        else:
            runs.append([base])
        last = stem
    return [tuple(r) for r in runs]


def run_bytes(run: Run) -> int:
    return sum(int(b.get("bytes") or 0) for b in run)


def run_entries(run: Run) -> int:
    return sum(int(b.get("entries") or 0) for b in run)


def plan_cut(runs: Sequence[Run], incoming_bytes: int, merge_ratio: float, *, knows_redactions: bool) -> int:
    """How many runs (from the oldest) the compaction keeps; it rewrites ``runs[cut:]``."""
    if runs and not knows_redactions:
        return 0
    cut = len(runs)
    rewritten = incoming_bytes
    while cut > 0 and run_bytes(runs[cut - 1]) < merge_ratio * rewritten:
        cut -= 1
        rewritten += run_bytes(runs[cut])
    for i, run in enumerate(runs[:cut]):
        if any(int(b.get("schema", CURRENT_SCHEMA)) != CURRENT_SCHEMA for b in run):
            return i
    return cut
