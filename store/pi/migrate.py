"""pi's ``migrateToCurrentVersion``: v1 and v2 files become v3 (``tests/fixtures/pi/SPEC.md`` §3).

Exactly as pi migrates, with one deliberate change: ids that the v1 migration has to mint are
deterministic (see :func:`mint_id`), so that importing the same file twice gives the same ids.
Pass 1 of a read decides a :class:`Plan`; :func:`final_entries` applies it to the parsed values
on every later walk.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from store.model.js import MISSING, js_to_number

__all__ = [
    "CURRENT_VERSION",
    "NO_TARGET",
    "PiMigration",
    "Plan",
    "final_entries",
    "migrate_header",
    "mint_id",
    "mint_ids",
    "v2_to_v3_entry",
    "wanted_forward",
]

CURRENT_VERSION: Final = 3


@dataclass(frozen=True, slots=True)
class PiMigration:
    """What pi's ``migrateToCurrentVersion`` did (or would do) while opening the file."""

    #: The header's ``version`` as found in the file (``None`` when absent).
    header_version: Any
    #: Steps run, in order: ``"v1->v2"``, ``"v2->v3"``.
    steps: tuple[str, ...] = ()
    #: pi rewrites the whole file when it migrates (we never write; this is information).
    rewritten: bool = False
    #: v1 files: every entry got a minted id (and the tree was linearised in file order).
    ids_minted: bool = False

    @property
    def label(self) -> str | None:
        """``"v1->v2->v3"`` / ``"v2->v3"`` as in the fixtures' ``migration`` field."""
        if not self.steps:
            return None
        return "->".join([self.steps[0].split("->")[0], *(s.split("->")[1] for s in self.steps)])


def mint_id(content_hash: bytes, position: int, attempt: int = 0) -> str:
    """A deterministic entry id: 16 lowercase hex characters (64 bits).

    pi mints ``randomUUID().slice(0, 8)`` for v1 entries; we derive the id from the hash of
    the file's parsed lines and the entry's position among parsed values instead, so that
    re-importing a file yields the same ids. ``attempt`` > 0 resolves (astronomically rare)
    collisions deterministically.
    """
    data = content_hash + position.to_bytes(8, "big") + attempt.to_bytes(4, "big")
    return hashlib.blake2b(data, digest_size=8, person=b"pi-v1-mint").hexdigest()


# --- migration (SPEC §3) -------------------------------------------------------------------------

# A firstKeptEntryIndex whose target pi finds nowhere, or finds to be a session line: pi then
# leaves firstKeptEntryId alone.
NO_TARGET: Final = object()


@dataclass(slots=True)
class Plan:
    """How the parsed values become entries: decided by pass 1, applied by every later walk."""

    v1: bool = False
    v2_to_v3: bool = False
    #: Line numbers of repeated entries that are kept once (the first copy stays).
    collapsed: frozenset[int] = frozenset()
    #: v1: the minted id of every entry, in file order.
    minted: list[str] = field(default_factory=list)
    #: v1: positions (among parsed values, the header is 0) of the ``type:"session"`` values.
    session_positions: list[int] = field(default_factory=lambda: [0])
    #: v1: for positions that a compaction's firstKeptEntryIndex names before they are reached,
    #: the value's id as read (``MISSING`` if it had none, ``NO_TARGET`` for a session line).
    forward_ids: dict[int, Any] = field(default_factory=dict)


def migrate_header(header: dict[str, Any]) -> PiMigration:
    """pi's migrateToCurrentVersion for the header, in place; the steps decide the entries'."""
    raw_version = header.get("version", MISSING)
    header_version = None if raw_version is MISSING else raw_version
    # `header.version ?? 1`, then JS relational comparisons (a string "2" compares as 2,
    # something non-numeric as NaN, for which every comparison is false).
    version = 1.0 if raw_version is MISSING or raw_version is None else js_to_number(raw_version)
    if version >= CURRENT_VERSION:
        return PiMigration(header_version)
    steps: list[str] = []
    if version < 2:
        header["version"] = 2
        steps.append("v1->v2")
    if version < 3:
        header["version"] = 3
        steps.append("v2->v3")
    # A NaN version migrates nothing, but pi still reports a migration and rewrites the file.
    return PiMigration(header_version, tuple(steps), rewritten=True, ids_minted="v1->v2" in steps)


def mint_ids(content_hash: bytes, value_count: int, session_positions: list[int]) -> list[str]:
    """The ids of pi's v1->v2 step, minted deterministically (:func:`mint_id`) in file order."""
    sessions = set(session_positions)
    minted: list[str] = []
    seen: set[str] = set()
    for position in range(value_count):
        if position in sessions:
            continue
        attempt = 0
        new_id = mint_id(content_hash, position)
        while new_id in seen:
            attempt += 1
            new_id = mint_id(content_hash, position, attempt)
        seen.add(new_id)
        minted.append(new_id)
    return minted


def wanted_forward(value: dict[str, Any], position: int) -> int | None:
    """The later position a v1 compaction's firstKeptEntryIndex names, if any."""
    if value.get("type") != "compaction":
        return None
    index = value.get("firstKeptEntryIndex", MISSING)
    numeric = isinstance(index, (int, float)) and not isinstance(index, bool)
    if numeric and float(index).is_integer() and index > position:
        return int(index)
    return None


def _migrate_v1_entry(
    value: dict[str, Any], position: int, number: int, plan: Plan, sessions: set[int]
) -> None:
    """pi's v1->v2 step for the entry at ``position`` (the ``number``-th entry), in place."""
    minted = plan.minted
    # Replaces any existing id: a tree without `version` is flattened into one chain.
    value["id"] = minted[number]
    value["parentId"] = minted[number - 1] if number else None
    if value.get("type") != "compaction":
        return
    index = value.get("firstKeptEntryIndex", MISSING)
    if not isinstance(index, (int, float)) or isinstance(index, bool):
        return  # a non-numeric index is left untouched
    # entries[index] counts every parsed value, header included; JS gives undefined for a
    # fractional, negative or out-of-range index.
    target: Any = NO_TARGET
    if float(index).is_integer() and index >= 0:
        where = int(index)
        if where > position:
            # A later value: its old id (or undefined, which JSON drops), as pass 1 read it.
            target = plan.forward_ids.get(where, NO_TARGET)
        elif where not in sessions:
            # An earlier value (or this one): its minted id.
            target = minted[where - bisect.bisect_right(plan.session_positions, where)]
    if target is MISSING:
        value.pop("firstKeptEntryId", None)
    elif target is not NO_TARGET:
        value["firstKeptEntryId"] = target
    del value["firstKeptEntryIndex"]


def v2_to_v3_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """pi's v2->v3 step for an entry: message role ``hookMessage`` became ``custom``.

    The one definition of the rule: the store's schema 0 -> 1 migration
    (:mod:`store.formats.migrations`) is this step too. Pure and idempotent: returns ``entry`` itself
    when the step changes nothing, else a copy (``entry`` and its message copied shallowly,
    key order kept); ``entry`` is never changed.
    """
    message = entry.get("message") if entry.get("type") == "message" else None
    if isinstance(message, dict) and message.get("role") == "hookMessage":
        return {**entry, "message": {**message, "role": "custom"}}
    return entry


def final_entries(
    plan: Plan, values: Iterable[tuple[int, Any]]
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, entry) for the parsed values (header first), migrated, without later headers
    and repeats: exactly the entries of :class:`PiFile`."""
    sessions = set(plan.session_positions)
    collapsed = plan.collapsed
    number = 0
    for position, (lineno, value) in enumerate(values):
        if position == 0 or value.get("type") == "session" or lineno in collapsed:
            continue  # pi: getEntries() filters every type:"session" value
        if plan.v1:
            _migrate_v1_entry(value, position, number, plan, sessions)
        if plan.v2_to_v3:
            value = v2_to_v3_entry(value)
        number += 1
        yield lineno, value
