"""The entry rules of the session model, defined once: what an entry must be to be held.

:func:`validate_entry` is applied by the store to every appended entry and every entry it
decodes, by :class:`~store.model.session.Session`, and by the pi file reader, so that an
acknowledged append can never make a session unreadable. :func:`check_acyclic` is the rule
across entries (no parentId cycle). A ``redaction`` entry (a sessionstore extension, unknown
to pi) hides its target's content: :func:`redaction_tombstone` is what is left of the target,
:func:`is_tombstone` recognises one stored as such.

Pure: no I/O; of the store, only its errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from store.errors import InvalidEntryError
from store.model.js import MISSING

__all__ = [
    "REDACTION_TYPE",
    "Entry",
    "check_acyclic",
    "is_tombstone",
    "redaction_tombstone",
    "validate_entry",
]

Entry = dict[str, Any]

#: The entry type that hides another entry's content (a sessionstore extension; pi ignores it).
REDACTION_TYPE: Final = "redaction"

# pi's key order for the fields a tombstone keeps.
_TOMBSTONE_KEYS: Final = ("type", "id", "parentId", "timestamp")


# --- validation --------------------------------------------------------------------------------


def validate_entry(entry: Any, index: int | None = None) -> None:
    """Refuse an entry that the session model (and so the store) cannot hold.

    Context-free checks only; cross-entry rules (unique ids, no parent cycles) are enforced by
    :class:`Session` and by the pi file parser. Raises :class:`InvalidEntryError`.

    Every rule here stands for an input on which pi either hangs, crashes, or gives the entry
    no identity (so that it could never be addressed, branched to or deduplicated).
    """
    if not isinstance(entry, dict):
        what = "null" if entry is None else type(entry).__name__
        raise InvalidEntryError(f"an entry must be a JSON object, not {what}", index=index)
    entry_id = entry.get("id", MISSING)
    if not isinstance(entry_id, str):
        what = "missing" if entry_id is MISSING else f"not a string ({entry_id!r})"
        raise InvalidEntryError(f"entry id is {what}", index=index)
    if entry_id == "":
        # pi treats "" as "no leaf" in some places and as a real key in others.
        raise InvalidEntryError("entry id is the empty string", index=index, entry_id=entry_id)
    parent_id = entry.get("parentId", None)
    if parent_id is not None and not isinstance(parent_id, str):
        raise InvalidEntryError(
            f"parentId must be a string or null, not {parent_id!r}", index=index, entry_id=entry_id
        )
    entry_type = entry.get("type", MISSING)
    if entry_type == "session":
        raise InvalidEntryError(
            "a session header cannot be stored as an entry", index=index, entry_id=entry_id
        )
    if is_tombstone(entry):
        # A redacted entry whose content is gone (a compacted base): it keeps its type but none
        # of the fields that type needs, and the model gives it no effect at all.
        return
    if entry_type == "message" and not isinstance(entry.get("message"), dict):
        # pi's buildSessionContext reads entry.message.role and throws on null/undefined.
        raise InvalidEntryError(
            "a message entry needs a `message` object", index=index, entry_id=entry_id
        )
    if entry_type == "session_info":
        name = entry.get("name")
        if name is not None and not isinstance(name, str):
            # pi calls name.trim() and throws on anything but a string or nullish.
            raise InvalidEntryError(
                "session_info name must be a string", index=index, entry_id=entry_id
            )
    if entry_type == REDACTION_TYPE:
        target = entry.get("targetId")
        if not isinstance(target, str) or target == "":
            raise InvalidEntryError(
                "a redaction entry needs a non-empty string targetId",
                index=index,
                entry_id=entry_id,
            )
        if not isinstance(entry.get("reason"), str):
            raise InvalidEntryError(
                "a redaction entry needs a string reason", index=index, entry_id=entry_id
            )


def check_acyclic(
    by_id: Mapping[str, Mapping[str, Any]], order: Sequence[Mapping[str, Any]]
) -> None:
    """Refuse parentId cycles (pi loops forever walking one; a self-parent is a cycle of one)."""
    # Each entry has at most one parent, so following parents from every entry once, and
    # remembering which entries are known to reach a root, is linear overall.
    done: set[str] = set()
    for position, start in enumerate(order):
        trail: list[str] = []
        on_trail: set[str] = set()
        current: Mapping[str, Any] | None = start
        while current is not None:
            cid = current["id"]
            if cid in done:
                break
            if cid in on_trail:
                raise InvalidEntryError(
                    f"parentId cycle through {cid!r} (pi would loop forever walking it)",
                    index=position,
                    entry_id=start["id"],
                )
            trail.append(cid)
            on_trail.add(cid)
            parent_id = current.get("parentId")
            current = by_id.get(parent_id) if parent_id else None
        done.update(trail)


# --- redaction ---------------------------------------------------------------------------------


def redaction_tombstone(entry: Mapping[str, Any], redaction: Mapping[str, Any]) -> Entry:
    """What is left of ``entry`` once ``redaction`` hides it."""
    tombstone: Entry = {key: entry[key] for key in _TOMBSTONE_KEYS if key in entry}
    tombstone["redacted"] = {"reason": redaction["reason"], "redactionId": redaction["id"]}
    return tombstone


def is_tombstone(entry: Mapping[str, Any]) -> bool:
    """Whether ``entry`` is a stored tombstone (the compactor writes them into bases).

    Only the exact shape :func:`redaction_tombstone` produces counts, so that an ordinary entry
    that happens to carry a ``redacted`` field is not mistaken for one.
    """
    marker = entry.get("redacted")
    return (
        isinstance(marker, dict)
        and isinstance(marker.get("reason"), str)
        and isinstance(marker.get("redactionId"), str)
        and len(marker) == 2
        and all(key in _TOMBSTONE_KEYS or key == "redacted" for key in entry)
    )
