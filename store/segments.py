"""The segment and base formats: object metadata, decoding with the schema upgrade, and the
one reader that the store, the compactor, GC, ``verify`` and ``follow`` all use.

A segment ``seg/<seq>`` is one committed append batch: JSONL, one canonical JSON object a
line, written once with If-None-Match. A base is the same encoding, written by the compactor
and named by a manifest. Object metadata of a segment:

==========  ====================================================================
``nonce``   the writer's random token: "was this object mine?" (a resent PUT that
            meets its own earlier attempt, see ``is_ours``)
``sha256``  of the body: a body with this digest is exactly what a writer encoded
            and is parsed fast; anything else goes through the strict decoder
``schema``  the entry schema the writer used (absent: the header's schema)
``count``   entries in the batch
==========  ====================================================================

Bases carry ``sha256`` in their metadata too; their schema and digest are also recorded in
the manifest that names them (``store/manifest.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from store.entries import EntryIds, decode_segment
from store.errors import ObjectNotFoundError
from store.migrations import CURRENT_SCHEMA, upgrade
from store.objects import ObjectStore, StoredObject
from store.retry import RetryPolicy

NONCE = "nonce"
SHA256 = "sha256"
SCHEMA = "schema"
COUNT = "count"

Entries = list[dict[str, Any]]


def segment_metadata(nonce: str, checksum: str, count: int) -> dict[str, str]:
    """The metadata a writer PUTs with a segment it encoded at the current schema."""
    return {NONCE: nonce, SHA256: checksum, SCHEMA: str(CURRENT_SCHEMA), COUNT: str(count)}


def is_ours(obj: StoredObject, nonce: str) -> bool:
    """True if ``obj`` was created by the attempt that used ``nonce``."""
    return obj.metadata.get(NONCE) == nonce


def decode_object(
    key: str, data: bytes, checksum: str | None, schema: int = CURRENT_SCHEMA,
    ids: EntryIds | None = None,
) -> Entries:
    """Entries of a segment or base, verified and lifted from ``schema`` to the current one
    (``ids``: where to add their ids; migrations keep ids)."""
    entries = decode_segment(key, data, checksum, ids)
    return entries if schema == CURRENT_SCHEMA else upgrade(entries, schema)


def decode_segment_object(
    obj: StoredObject, default_schema: int = CURRENT_SCHEMA, ids: EntryIds | None = None
) -> Entries:
    """A segment object's entries (``default_schema``: the header's, for segments whose
    metadata does not name one)."""
    written = int(obj.metadata.get(SCHEMA, default_schema))
    return decode_object(obj.key, obj.data, obj.metadata.get(SHA256), written, ids)


def decode_base_object(obj: StoredObject, base: Mapping[str, Any], ids: EntryIds | None = None) -> Entries:
    """A base's entries, by what the manifest that names it says (``base``: its entry)."""
    written = int(base.get("schema", CURRENT_SCHEMA))
    checksum = base.get(SHA256) or obj.metadata.get(SHA256)
    return decode_object(obj.key, obj.data, checksum, written, ids)


def read_segment(
    objects: ObjectStore, retry: RetryPolicy, key: str, default_schema: int = CURRENT_SCHEMA,
    ids: EntryIds | None = None,
) -> tuple[Entries, int] | None:
    """GET and decode one segment: (entries, size in bytes), or None if it does not exist."""
    try:
        obj = retry.call(lambda: objects.get(key))
    except ObjectNotFoundError:
        return None
    return decode_segment_object(obj, default_schema, ids), len(obj.data)


def contiguous(numbers: Iterable[int], first: int) -> list[int]:
    """``first, first+1, ...`` as far as ``numbers`` (sorted here) has them without a gap."""
    out: list[int] = []
    for n in sorted(numbers):
        if n < first + len(out):
            continue
        if n != first + len(out):
            break
        out.append(n)
    return out


__all__ = [
    "COUNT",
    "NONCE",
    "SCHEMA",
    "SHA256",
    "contiguous",
    "decode_base_object",
    "decode_object",
    "decode_segment_object",
    "is_ours",
    "read_segment",
    "segment_metadata",
]
