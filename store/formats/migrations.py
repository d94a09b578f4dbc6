"""Schema migrations of stored entries: an append-only list whose index is the version.

Every segment records the schema its writer used (object metadata ``schema``; a segment
without it is of its session header's schema), every base its schema in the manifest. A
reader lifts each object's entries to ``CURRENT_SCHEMA`` by running ``MIGRATIONS[v]`` for
v = object schema .. CURRENT_SCHEMA - 1, so sessions written by older versions of the store
read exactly like new ones. ``compactor.migrate_session`` rewrites a session forward
(a compaction whose base is written at the current schema); no object is overwritten.

Rules for adding a migration: append, never edit or reorder; a migration must be pure and
idempotent (a segment may be read many times), and must keep ids, parentIds and order.
"""

from __future__ import annotations

from typing import Any, Callable

from store.pi.migrate import v2_to_v3_entry

Entries = list[dict[str, Any]]


def _v0_to_v1(entries: Entries) -> Entries:
    """Schema 0 stored pi v2 entries; schema 1 stores pi v3 (pi's own v2 -> v3 step:
    message role ``hookMessage`` became ``custom``)."""
    return [v2_to_v3_entry(entry) for entry in entries]


MIGRATIONS: list[Callable[[Entries], Entries]] = [_v0_to_v1]
#: Schema v is lifted to v + 1 by MIGRATIONS[v], so the current schema is the list's length.
CURRENT_SCHEMA = len(MIGRATIONS)


def upgrade(entries: Entries, schema: int) -> Entries:
    if schema > CURRENT_SCHEMA:
        from store.errors import CorruptObjectError

        raise CorruptObjectError("", 0, f"schema {schema} is newer than this store ({CURRENT_SCHEMA}): upgrade sessionstore")
    for version in range(schema, CURRENT_SCHEMA):
        entries = MIGRATIONS[version](entries)
    return entries
