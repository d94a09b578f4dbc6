"""The segment and base formats: object metadata, decoding with the schema upgrade, and the
one decoder that the store, the compactor, GC, ``verify`` and ``follow`` all use (the read of
one segment is ``ObjectReads.segment``).

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
the manifest that names them (``store/protocol/manifest.py``).

An encrypted session's segments and bases are *sealed* (``store/formats/crypto.py``): the body is
the sealed bytes, and ``sha256`` is of those stored bytes, as for any object (so ``verify``
and the recent-segments cache check what is stored). A sealed object is opened with the
data keys (``store/protocol/keys.py``, the ``opener`` below) and its plaintext, authenticated by
AES-GCM, is parsed as a writer encoded it; without keys it is ``KeyUnavailableError``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from store.formats.crypto import is_sealed, no_keys_open
from store.formats.entries import EntryIds, decode_authenticated, decode_segment
from store.formats.migrations import CURRENT_SCHEMA, upgrade

NONCE = "nonce"
SHA256 = "sha256"
SCHEMA = "schema"
COUNT = "count"

Entries = list[dict[str, Any]]
#: Opens a sealed object: ``(key, stored bytes) -> plaintext`` (``DataKeys.open``).
Opener = Callable[[str, bytes], bytes]


class Stored(Protocol):
    """What the decoders read of an object as a backend returns it (``StoredObject``): the
    formats know no backend."""

    @property
    def key(self) -> str: ...

    @property
    def data(self) -> bytes: ...

    @property
    def metadata(self) -> Mapping[str, str]: ...


def segment_metadata(nonce: str, checksum: str, count: int) -> dict[str, str]:
    """The metadata a writer PUTs with a segment it encoded at the current schema."""
    return {NONCE: nonce, SHA256: checksum, SCHEMA: str(CURRENT_SCHEMA), COUNT: str(count)}


def is_ours(obj: Stored, nonce: str) -> bool:
    """True if ``obj`` was created by the attempt that used ``nonce``."""
    return obj.metadata.get(NONCE) == nonce


def decode_object(
    key: str, data: bytes, checksum: str | None, schema: int = CURRENT_SCHEMA,
    opener: Opener | None = None, ids: EntryIds | None = None,
) -> Entries:
    """Entries of a segment or base, verified and lifted from ``schema`` to the current one.
    A sealed object is opened with ``opener`` (none: ``KeyUnavailableError``); AES-GCM
    verifies it, so ``checksum`` (of the stored bytes) is not needed for it. ``ids``: where
    to add their ids (migrations keep ids)."""
    if is_sealed(data):
        entries = decode_authenticated(key, (opener or no_keys_open)(key, data), ids)
    else:
        if opener is not None:
            opener(key, data)  # refuses a plaintext object where everything is sealed
        entries = decode_segment(key, data, checksum, ids)
    return entries if schema == CURRENT_SCHEMA else upgrade(entries, schema)


def decode_segment_object(
    obj: Stored, default_schema: int = CURRENT_SCHEMA, opener: Opener | None = None,
    ids: EntryIds | None = None,
) -> Entries:
    """A segment object's entries (``default_schema``: the header's, for segments whose
    metadata does not name one)."""
    written = int(obj.metadata.get(SCHEMA, default_schema))
    return decode_object(obj.key, obj.data, obj.metadata.get(SHA256), written, opener, ids)


def decode_base_object(
    obj: Stored, base: Mapping[str, Any], opener: Opener | None = None, ids: EntryIds | None = None
) -> Entries:
    """A base's entries, by what the manifest that names it says (``base``: its entry)."""
    written = int(base.get("schema", CURRENT_SCHEMA))
    checksum = base.get(SHA256) or obj.metadata.get(SHA256)
    return decode_object(obj.key, obj.data, checksum, written, opener, ids)


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
    "Opener",
    "SCHEMA",
    "SHA256",
    "contiguous",
    "decode_base_object",
    "decode_object",
    "decode_segment_object",
    "Stored",
    "is_ours",
    "segment_metadata",
]
