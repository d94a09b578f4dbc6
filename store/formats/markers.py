"""The trash's marker entries (docs/lifecycle.md), defined once: their type, the ids that
say a session's state, and the checks that the append path, the read facade and the listing
make with them. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from store.errors import InvalidEntryError, SessionTrashedError

#: The type of the trash's marker entries.
MARKER_TYPE = "retention"
#: Entry ids that only the trash (store/lifecycle/retention.py) writes (user batches holding one are refused).
RESERVED_PREFIX = "sessionstore."
_TRASH = "sessionstore.trash."
_PURGE = "sessionstore.purge."
_RESTORE = "sessionstore.restore."


@dataclass(frozen=True, slots=True)
class TrashMark:
    """What the tail's last entry id says: in the trash (purged after ``purge_after_ms``), or
    being purged."""

    purge_after_ms: int
    purging: bool = False


def trash_mark(last_entry_id: str) -> TrashMark | None:
    """The trash state a session's last entry id says (None: not in the trash). Only the
    tail decides: a trash marker followed by anything (a restore) is history."""
    if last_entry_id.startswith(_TRASH):
        ms = last_entry_id[len(_TRASH):].split(".", 1)[0]
        return TrashMark(int(ms) if ms.isdigit() else 0)
    if last_entry_id.startswith(_PURGE):
        ms = last_entry_id[len(_PURGE):].split(".", 1)[0]
        return TrashMark(int(ms) if ms.isdigit() else 0, purging=True)
    return None


def is_marker_batch(ids: tuple[str, ...] | list[str]) -> bool:
    return bool(ids) and all(i.startswith(RESERVED_PREFIX) for i in ids)


def check_user_ids(ids: tuple[str, ...]) -> None:
    """Refuse a user's batch holding an id only the trash writes (``InvalidEntryError``)."""
    for i, eid in enumerate(ids):
        if eid.startswith((_TRASH, _PURGE, _RESTORE)):
            raise InvalidEntryError("entry ids starting sessionstore.trash., .purge. or .restore. "
                                    "are reserved for the trash", index=i, entry_id=eid)


def refuse_if_trashed(sid: str, last_entry_id: str) -> None:
    mark = trash_mark(last_entry_id)
    if mark is not None:
        raise SessionTrashedError(sid, mark.purge_after_ms, purging=mark.purging)


__all__ = ["MARKER_TYPE", "RESERVED_PREFIX", "TrashMark", "check_user_ids", "is_marker_batch",
           "refuse_if_trashed", "trash_mark"]
