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
the decoders read such lines with the standard library's parser: orjson stays on the path
of every other entry, and a line holding an escape is still refused if its bytes are not
valid UTF-8 or not exactly what :func:`encode_json` writes.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import orjson

from store.errors import BatchTooLargeError, CorruptObjectError, InvalidEntryError
from store.session import validate_entry

MAX_ID_LENGTH = 256
DEFAULT_MAX_BATCH_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_BATCH_ENTRIES = 10_000


def entry_hash(entry: dict[str, Any]) -> str:
    """Content hash used for idempotency: independent of key order."""
    return hashlib.blake2b(encode_json(entry, sort_keys=True), digest_size=12).hexdigest()


# --- JSON with lone surrogates -------------------------------------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")
# A high surrogate followed by a low one: one character to JavaScript, two code points here.
_SPLIT_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def encode_json(value: Any, *, sort_keys: bool = False) -> bytes:
    """``orjson.dumps(value)``, also for strings (and keys) holding lone UTF-16 surrogates.

    Those are written as ``JSON.stringify`` writes them, ``\\ud83d`` (lowercase hex); all
    else is orjson's output, which matches ``JSON.stringify`` for strings. Only values orjson
    refuses are looked at again, so the cost falls on them alone. Raises
    ``orjson.JSONEncodeError`` (a ``TypeError``) where orjson does, and for a string holding a
    surrogate pair as two code points (``"\\ud83d\\ude00"`` in Python source): every JSON
    parser reads its escapes back as the one character, so it could not be read back as itself.
    """
    option = orjson.OPT_SORT_KEYS if sort_keys else None
    try:
        return orjson.dumps(value, option=option)
    except orjson.JSONEncodeError:
        if not _holds_surrogates(value):
            raise
    try:
        return orjson.dumps(_escape_surrogates(value, option), option=option)
    except RecursionError:
        raise orjson.JSONEncodeError("nested too deeply to encode") from None


def _holds_surrogates(root: Any) -> bool:
    stack = [root]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return True
        elif isinstance(value, dict):
            if any(isinstance(k, str) and _SURROGATE.search(k) for k in value):
                return True
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return False


def _escape_surrogates(value: Any, option: int | None) -> Any:
    """``value`` with every string holding a surrogate as a pre-encoded fragment (and every
    object with such a key as one). Recursive: only reached for values orjson refused, which
    nest no deeper than orjson writes (254 levels)."""
    if isinstance(value, str):
        return orjson.Fragment(_quote(value)) if _SURROGATE.search(value) else value
    if isinstance(value, dict):
        if not any(isinstance(k, str) and _SURROGATE.search(k) for k in value):
            return {k: _escape_surrogates(v, option) for k, v in value.items()}
        items = list(value.items())
        if any(not isinstance(k, str) for k, _ in items):
            raise orjson.JSONEncodeError("dict key must be str")
        if option is not None and option & orjson.OPT_SORT_KEYS:
            items.sort(key=lambda item: item[0].encode("utf-8", "surrogatepass"))
        members = [
            _quote(k) + b":" + orjson.dumps(_escape_surrogates(v, option), option=option)
            for k, v in items
        ]
        return orjson.Fragment(b"{" + b",".join(members) + b"}")
    if isinstance(value, (list, tuple)):
        return [_escape_surrogates(v, option) for v in value]
    return value


def _quote(text: str) -> bytes:
    """The JSON string ``JSON.stringify`` writes for ``text`` (lone surrogates escaped)."""
    if _SPLIT_PAIR.search(text):
        raise orjson.JSONEncodeError(
            "str holds a surrogate pair as two code points: pass the character itself"
        )
    out = [b'"']
    start = 0
    for match in _SURROGATE.finditer(text):
        if match.start() > start:
            out.append(orjson.dumps(text[start : match.start()])[1:-1])
        out.append(b"\\u%04x" % ord(match.group()))
        start = match.end()
    if start < len(text):
        out.append(orjson.dumps(text[start:])[1:-1])
    out.append(b'"')
    return b"".join(out)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_ESCAPE_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def decode_json(data: bytes) -> Any:
    """``orjson.loads(data)``, also for JSON text whose strings hold lone surrogate escapes
    (what :func:`encode_json` writes). Raises ``ValueError`` (``orjson.JSONDecodeError`` is
    one) for bytes that are not UTF-8 (raw surrogates included) or not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        try:
            return _loads_escaped(data)
        except ValueError:
            raise exc from None


def _loads_escaped(line: bytes) -> Any:
    """A line orjson refused, parsed by the standard library, which reads lone surrogate
    escapes. Raises ``ValueError`` for bytes that are not UTF-8 and for what is not JSON."""
    try:
        return _ESCAPE_DECODER.decode(line.decode("utf-8"))
    except RecursionError:
        raise ValueError("JSON nested too deeply to parse") from None


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


def decode_segment(key: str, data: bytes, checksum: str | None = None) -> list[dict[str, Any]]:
    """Parse a segment or base object into its entries, refusing anything corrupt."""
    if not data:
        raise CorruptObjectError(key, 0, "empty object")
    if checksum and data.endswith(b"\n") and hashlib.sha256(data).hexdigest() == checksum:
        # Exactly the bytes a writer encoded: canonical, one object a line. Only parsing is
        # left (per line: measured faster than one parse of the whole object as an array,
        # which needs three copies of it).
        loads = orjson.loads
        lines = data[:-1].split(b"\n")
        try:
            values = [loads(line) for line in lines]
        except orjson.JSONDecodeError:
            values = _loads_lines_escaped(lines)
        if values and all(type(v) is dict for v in values):
            return values
    return _decode_strict(key, data, checksum)


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
