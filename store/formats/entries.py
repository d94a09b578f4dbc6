"""Entry validation, batch encoding and strict segment decoding.

A batch is encoded once: every entry serialised by orjson (key order kept, so a pi file
round-trips byte for byte), one entry a line. The segment's sha256 travels in the object's
metadata; a reader whose bytes match it knows they are exactly what a writer encoded and
parses them in one call. Bytes without a matching checksum (an object put by hand, a damaged
one) go through the strict decoder, which refuses, with the key and line number, anything the
store could not have written: truncated lines, invalid UTF-8, a BOM, NUL, duplicate keys,
non-canonical JSON.

Strings may hold lone UTF-16 surrogates (JavaScript writes ``"\\ud83d"`` when a tool's output is
cut inside an emoji, and pi reads it back). orjson refuses them both ways, so
:func:`encode_json` writes them as ``JSON.stringify`` does (lowercase ``\\udXXX`` escapes) and
the decoders read such lines with the standard library's parser (both defined in
:mod:`store.model.js_json`, and importable from here): orjson stays on the path of every other
entry, and a line holding an escape is still refused if its bytes are not valid UTF-8 or not
exactly what :func:`encode_json` writes.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from store.errors import BatchTooLargeError, CorruptObjectError, InvalidEntryError
from store.model.js_json import decode_json, encode_json
from store.model.rules import validate_entry

MAX_ID_LENGTH = 256
DEFAULT_MAX_BATCH_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_BATCH_ENTRIES = 10_000


def entry_hash(entry: dict[str, Any]) -> str:
    """Content hash used for idempotency: independent of key order."""
    return hashlib.blake2b(encode_json(entry, sort_keys=True), digest_size=12).hexdigest()


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    entries: tuple[dict[str, Any], ...]
    ids: tuple[str, ...]
    hashes: tuple[str, ...]
    #: (entry id, parent id) for every parentId that is not inside the batch.
    external_parents: tuple[tuple[str, str], ...]
    body: bytes
    checksum: str

    @property
    def last_id(self) -> str:
        return self.ids[-1]


def _check_finite(value: Any, index: int, entry_id: Any) -> None:
    # orjson would write NaN and Infinity as null without a word; refuse them instead.
    stack = [value]
    while stack:
        item = stack.pop()
        t = type(item)
        if t is float:
            if not math.isfinite(item):
                raise InvalidEntryError(
                    "NaN and Infinity are not JSON", index=index, entry_id=entry_id
                )
        elif t is dict:
            stack.extend(item.values())
        elif t is list or t is tuple:
            stack.extend(item)


def prepare_batch(
    entries: Sequence[Any],
    *,
    max_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    max_entries: int = DEFAULT_MAX_BATCH_ENTRIES,
    strict: bool = True,
) -> PreparedBatch:
    """Validate and encode a batch. Raises a typed error, having written nothing.

    ``strict=False`` is for imports of pi files, whose entries pi reads however odd they are:
    ``type`` may be anything and ``parentId`` missing or of any type (pi then treats the entry
    as a root). Ids, JSON-ness and the no-cycle rule hold in both modes.
    """
    if isinstance(entries, (str, bytes, dict)) or not isinstance(entries, Sequence):
        raise InvalidEntryError("a batch is a non-empty list of entries")
    if not entries:
        raise InvalidEntryError("a batch is a non-empty list of entries")
    if len(entries) > max_entries:
        raise BatchTooLargeError(f"batch of {len(entries)} entries is over the limit of {max_entries}")
    ids: list[str] = []
    seen: set[str] = set()
    later_ids = {e.get("id") for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)}
    # One growing buffer, not a list of lines: orjson's results carry tens of KB of spare
    # capacity each, so keeping every line of a 16 MiB batch alive costs ~10x its size.
    body_buf = bytearray()
    hashes: list[str] = []
    external: list[tuple[str, str]] = []
    size = 0
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise InvalidEntryError(f"not a JSON object but {type(entry).__name__}", index=i)
        eid = entry.get("id")
        if not isinstance(eid, str) or not eid:
            raise InvalidEntryError("'id' must be a non-empty string", index=i, entry_id=eid)
        if len(eid) > MAX_ID_LENGTH:
            raise InvalidEntryError(f"'id' is longer than {MAX_ID_LENGTH}", index=i, entry_id=eid)
        etype = entry.get("type")
        if etype == "session":
            raise InvalidEntryError("'session' is the header's type, not an entry's", index=i, entry_id=eid)
        parent = entry.get("parentId")
        if strict:
            if not isinstance(etype, str) or not etype:
                raise InvalidEntryError("'type' must be a non-empty string", index=i, entry_id=eid)
            if "parentId" not in entry:
                raise InvalidEntryError("'parentId' is missing (null for a root)", index=i, entry_id=eid)
            if parent is not None and not isinstance(parent, str):
                raise InvalidEntryError("'parentId' must be null or a string", index=i, entry_id=eid)
        elif not isinstance(parent, str):
            parent = None
        if eid in seen:
            raise InvalidEntryError("duplicate id within the batch", index=i, entry_id=eid)
        if parent == eid:
            raise InvalidEntryError("an entry cannot be its own parent", index=i, entry_id=eid)
        # What the session model (pi's semantics) could not read back is refused here, so an
        # acknowledged append can never make a session unreadable.
        validate_entry(entry, i)
        _check_finite(entry, i, eid)
        try:
            line = encode_json(entry)
        except orjson.JSONEncodeError as exc:  # a TypeError
            raise InvalidEntryError(f"not serialisable as JSON: {exc}", index=i, entry_id=eid) from None
        size += len(line) + 1
        if size > max_bytes:
            raise BatchTooLargeError(f"batch is over the limit of {max_bytes} bytes")
        if parent is not None and parent not in seen:
            # A parent later in the batch would allow a cycle; one earlier is fine.
            if parent in later_ids:
                raise InvalidEntryError(
                    f"parentId {parent!r} refers to a later entry of the batch (parents come first)",
                    index=i,
                    entry_id=eid,
                )
            external.append((eid, parent))
        seen.add(eid)
        ids.append(eid)
        body_buf += line
        body_buf += b"\n"
        hashes.append(entry_hash(entry))
    body = bytes(body_buf)
    del body_buf
    return PreparedBatch(
        entries=tuple(entries),
        ids=tuple(ids),
        hashes=tuple(hashes),
        external_parents=tuple(external),
        body=body,
        checksum=hashlib.sha256(body).hexdigest(),
    )


#: Objects at least this large are hashed on another thread while their lines are parsed
#: (``hashlib`` releases the GIL on large buffers); smaller ones are not worth a thread.
_HASH_BESIDE_BYTES = 1 << 20


class EntryIds:
    """The ids of the entries a read decodes, gathered by the decoder as it parses each
    object (checking them afterwards touched every entry again: about 5 ms for 10k
    entries). Shared by the threads that decode one read's objects."""

    __slots__ = ("_ids", "_count", "_lock")

    def __init__(self) -> None:
        self._ids: set[Any] = set()
        self._count = 0
        self._lock = threading.Lock()

    def add(self, ids: set[Any], count: int) -> None:
        """The ids of one object's ``count`` entries (a set of fewer: it repeats one)."""
        with self._lock:
            self._ids |= ids  # by the hashes the set holds: the strings are not touched again
            self._count += count

    def distinct(self, entries: int) -> bool:
        """True if exactly ``entries`` entries were added and their ids are distinct strings
        (False says nothing: check the entries themselves)."""
        return self._count == entries and len(self._ids) == entries and None not in self._ids

    def isdisjoint(self, ids: Iterable[Any]) -> bool:
        return self._ids.isdisjoint(ids)


def decode_segment(
    key: str, data: bytes, checksum: str | None = None, ids: EntryIds | None = None
) -> list[dict[str, Any]]:
    """Parse a segment or base object into its entries, refusing anything corrupt. ``ids``:
    where to add their ids, for a reader's check that they are unique."""
    if not data:
        raise CorruptObjectError(key, 0, "empty object")
    if checksum and data.endswith(b"\n"):
        parsed: tuple[list[dict[str, Any]], set[Any]] | None = None
        if len(data) < _HASH_BESIDE_BYTES:
            if hashlib.sha256(data).hexdigest() == checksum:
                parsed = _parse_lines(data, ids is not None)
        else:
            # The digest decides whether the fast parse may be trusted; it runs beside the
            # parse, whose result is thrown away if the digest does not match.
            digest: list[str] = []
            hasher = threading.Thread(target=lambda: digest.append(hashlib.sha256(data).hexdigest()))
            hasher.start()
            try:
                parsed = _parse_lines(data, ids is not None)
            finally:
                hasher.join()
            if digest != [checksum]:
                parsed = None
        if parsed is not None:
            return _noted(parsed, ids)
    return _strict_noted(key, data, checksum, ids)


def _noted(parsed: tuple[list[dict[str, Any]], set[Any]], ids: EntryIds | None) -> list[dict[str, Any]]:
    """The fast parse's values, their ids added to ``ids`` (if any)."""
    values, seen = parsed
    if ids is not None:
        ids.add(seen, len(values))
    return values


def _strict_noted(key: str, data: bytes, checksum: str | None, ids: EntryIds | None) -> list[dict[str, Any]]:
    """The strict decoder's values, their ids added to ``ids`` (if any)."""
    values = _decode_strict(key, data, checksum)
    if ids is not None:
        ids.add({v["id"] for v in values}, len(values))
    return values


def decode_authenticated(key: str, data: bytes, ids: EntryIds | None = None) -> list[dict[str, Any]]:
    """Parse the plaintext of a sealed object (``store/formats/crypto.py``). It authenticated under
    the session's data key, so it is exactly what a writer encoded: the fast parse, with the
    strict decoder only for what the fast one cannot read (``ids``: as ``decode_segment``)."""
    if not data:
        raise CorruptObjectError(key, 0, "empty object")
    if data.endswith(b"\n"):
        parsed = _parse_lines(data, ids is not None)
        if parsed is not None:
            return _noted(parsed, ids)
    return _strict_noted(key, data, None, ids)


def _parse_lines(data: bytes, want_ids: bool = False) -> tuple[list[dict[str, Any]], set[Any]] | None:
    """Exactly the bytes a writer encoded: canonical, one object a line. Only parsing is left
    (per line: measured faster than one parse of the whole object as an array, which needs
    three copies of it). The values and, if ``want_ids``, the set of their ids (``None``
    standing for any id that is not a string), or None if a line is not a JSON object."""
    loads = orjson.loads
    lines = data.split(b"\n")
    lines.pop()  # after the final newline (no copy of the whole object to strip it)
    try:
        values: list[Any] = [loads(line) for line in lines]
    except orjson.JSONDecodeError:
        values = _loads_lines_escaped(lines)
    if not values or not all(type(v) is dict for v in values):
        return None
    seen: set[Any] = {_id_or_none(v) for v in values} if want_ids else set()
    return values, seen


def _id_or_none(entry: dict[str, Any]) -> str | None:
    eid = entry.get("id")
    return eid if type(eid) is str else None


def _loads_lines_escaped(lines: list[bytes]) -> list[Any]:
    """The verified lines again, one at a time (:func:`decode_json`: those with lone
    surrogate escapes too); ``[]`` if one is not JSON even so."""
    try:
        return [decode_json(line) for line in lines]
    except ValueError:
        return []


def _decode_strict(key: str, data: bytes, checksum: str | None) -> list[dict[str, Any]]:
    if not data.endswith(b"\n"):
        lineno = data.count(b"\n") + 1
        raise CorruptObjectError(key, lineno, "truncated: the last line has no newline")
    out: list[dict[str, Any]] = []
    for lineno, line in enumerate(data[:-1].split(b"\n"), start=1):
        if not line:
            raise CorruptObjectError(key, lineno, "empty line")
        if b"\x00" in line:
            raise CorruptObjectError(key, lineno, "NUL byte")
        try:
            value = decode_json(line)
        except ValueError as exc:
            raise CorruptObjectError(key, lineno, f"invalid JSON: {exc}") from None
        if type(value) is not dict:
            raise CorruptObjectError(key, lineno, "not a JSON object")
        # A line the store wrote re-encodes to the same bytes. Anything else (duplicate keys,
        # whitespace, escapes the store would not write) was not written by the store.
        try:
            canonical = encode_json(value) == line
        except orjson.JSONEncodeError:
            canonical = False
        if not canonical:
            reason = "duplicate keys" if _has_duplicate_keys(line) else "not in canonical form"
            raise CorruptObjectError(key, lineno, reason)
        eid = value.get("id")
        if not isinstance(eid, str) or not eid:
            raise CorruptObjectError(key, lineno, "entry without a string id")
        try:
            validate_entry(value)
        except InvalidEntryError as exc:
            raise CorruptObjectError(key, lineno, str(exc)) from None
        out.append(value)
    if checksum:
        raise CorruptObjectError(key, 0, "checksum mismatch: the object's bytes were altered")
    return out


def _has_duplicate_keys(line: bytes) -> bool:
    dup = False

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal dup
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            dup = True
        return dict(pairs)

    try:
        json.loads(line, object_pairs_hook=hook)
    except ValueError:
        return False
    return dup


def encode_entries(entries: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(encode_json(e) + b"\n" for e in entries)
