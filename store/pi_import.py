"""Importing a pi session file into a store that may already hold its session.

A pi file names its session in its header. What an import does with that id
(docs/pi-format.md, "Importing into a store"):

- **No such session**: it is created with the file's header, and the file's entries are
  appended in deterministic batches.
- **The session exists with the same header** (and is not a fork), and
  - its entries are the file's first entries, in order, with the same content: the rest of
    the file is appended (pi kept writing the file since the last import). A file holding
    no more than the session (the same file again, or the session grew in the store since)
    changes nothing. Entries are compared as the file holds them, with JavaScript's numbers
    (a stored ``1.0`` is the ``1`` its export wrote); a redacted entry counts as the same
    entry, whether the file holds it as it was or as a tombstone. A fork is compared with its
    export: the path it inherits, then its own entries. So exporting a session and importing
    the file again changes nothing.
  - anything else (an entry of another content or in another place): refused with
    :class:`ImportConflictError`, **nothing written**. Two different files that share a
    header id never merge into one session with several roots.
- **The session exists with another header**: refused the same way.

``on_conflict="new-id"`` imports a refused file under the first free id of
``<id>-2``, ``<id>-3``, ... instead (one that holds a prefix of the file counts as its own,
so importing the same files again, in the same order, lands in the same sessions).

Everything is decided before the first write: the file is scanned in full
(``store.pi.scan.scan_pi_file``), and its entries are compared with the stored ones before
any new one is sent. Appends are strict on the tail (each batch expects the previous one's
last entry), so a session that changes during the import is compared again, never merged
blindly; the batches are the same on every import, so a concurrent import of the same file
meets its own batches as duplicates.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterator, Literal

import orjson

from store.formats.entries import encode_json

from store.errors import (
    BatchTooLargeError,
    ConflictError,
    ContentionError,
    InvalidEntryError,
    SessionExistsError,
    SessionStoreError,
)
from store.formats.layout import SESSION_ID_RE, check_session_id

if TYPE_CHECKING:
    from store.protocol.api import Sessions
    from store.protocol.handles import SessionHandle
    from store.pi.scan import PiScan

OnConflict = Literal["refuse", "new-id"]

#: Rounds of "compare, then append" when other writers change the session meanwhile.
_ROUNDS = 5
#: Ids tried by ``on_conflict="new-id"``: ``<id>-2`` .. ``<id>-<this>``.
_MAX_SUFFIX = 1000


class ImportConflictError(SessionExistsError):
    """A pi file's session id is taken by a session with other content. Nothing was written.

    ``detail`` says where they differ (the header, or the first entry that differs).
    """

    def __init__(self, session_id: str, detail: str) -> None:
        self.session_id = session_id
        self.detail = detail
        SessionStoreError.__init__(
            self,
            f"session {session_id!r} already exists with other content ({detail}); "
            "nothing imported: import it under another id",
        )


@dataclass(frozen=True, slots=True)
class ImportResult:
    """What one import did."""

    handle: "SessionHandle"
    session_id: str
    #: ``created``: a new session; ``extended``: entries appended to the session the file
    #: continues; ``unchanged``: the session already held every entry of the file.
    status: str
    #: Entries in the file (after pi's migration).
    entries: int
    #: Entries this import appended.
    appended: int
    #: The file's own session id (its header's), when the import went elsewhere.
    header_id: str | None = None
    #: 1-based numbers of the non-blank lines that are not JSON: skipped, as pi skips them
    #: (nothing of them is stored; the caller should say so).
    skipped_lines: tuple[int, ...] = ()


def import_pi_file(
    store: Sessions,
    source: Any,
    session_id: str | None = None,
    *,
    on_conflict: OnConflict = "refuse",
) -> ImportResult:
    """Import a pi file (path, bytes, text or stream; v1, v2 or v3) by the rules above."""
    from store.pi.scan import scan_pi_file

    if on_conflict not in ("refuse", "new-id"):
        raise ValueError(f"on_conflict must be 'refuse' or 'new-id', not {on_conflict!r}")
    if session_id is not None:
        check_session_id(session_id)  # refuse a bad id before reading the whole file
    with scan_pi_file(source, entry_check=storable_check(store)) as scan:
        header = scan.require_header()
        if scan.forward_parent is not None:
            line, entry_id, parent_id = scan.forward_parent
            raise InvalidEntryError(
                f"line {line}: parentId {parent_id!r} names an entry further down the "
                "file (pi accepts that; the store needs parents first)",
                entry_id=entry_id,
            )
        sid = check_session_id(session_id if session_id is not None else header.get("id"))
        try:
            return replace(_import_into(store, scan, header, sid), skipped_lines=scan.skipped_lines)
        except ImportConflictError:
            if on_conflict == "refuse":
                raise
        for n in range(2, _MAX_SUFFIX + 1):
            candidate = _suffixed(sid, n)
            try:
                result = _import_into(store, scan, header, candidate)
            except ImportConflictError:
                continue
            return replace(result, header_id=str(header.get("id")), skipped_lines=scan.skipped_lines)
        raise ImportConflictError(sid, f"and so are {sid}-2 .. {sid}-{_MAX_SUFFIX}")


def _suffixed(sid: str, n: int) -> str:
    suffix = f"-{n}"
    candidate = sid[: 128 - len(suffix)] + suffix
    if not SESSION_ID_RE.match(candidate):  # pragma: no cover - a valid id stays valid
        raise ImportConflictError(sid, "no valid id to import it under")
    return candidate


def _import_into(
    store: Sessions, scan: "PiScan", header: dict[str, Any], sid: str
) -> ImportResult:
    from store.protocol.handles import SessionHandle

    pi_header = dict(header)
    status = "extended"
    try:
        handle = store.create_session(sid, pi_header=pi_header)
        status = "created"
    except SessionExistsError:
        existing = store.get_header(sid)
        if _as_js(existing.pi_header) != pi_header:
            raise ImportConflictError(sid, _header_difference(existing.pi_header, pi_header)) from None
        handle = SessionHandle(store, existing)
    fresh = status == "created"  # known empty: nothing stored to compare with
    for _ in range(_ROUNDS):
        try:
            appended = _append_rest(store, scan, sid, fresh=fresh)
        except ConflictError:
            fresh = False
            continue  # another writer moved the tail: compare again
        if status != "created" and appended == 0:
            status = "unchanged"
        return ImportResult(handle, sid, status, scan.entry_count, appended)
    raise ContentionError(f"session {sid!r} kept changing during the import; try again")


@dataclass(frozen=True, slots=True)
class _Stored:
    """What the file's entries are compared with: the stored session, as an export writes it."""

    #: (id, hash of the entry as a pi file holds it, (type, parentId, timestamp)) per entry,
    #: in the order an export writes them.
    entries: list[tuple[str, str, tuple[Any, Any, Any]]]
    #: Ids of the entries that are redacted: an export writes them as tombstones.
    redacted: frozenset[str]
    #: The entry the first new one is appended after ("" for none).
    tail: str


def _stored_view(store: Sessions, sid: str) -> _Stored:
    """The stored session as its export would write it, one hash per entry.

    A session of its own is read one stored object at a time (``map_own_entries``): ids and
    hashes only, never the entries (a re-import of a large file must not hold the session
    twice). A fork's export also writes the path it inherits, so a fork is read whole, and
    its entries are taken as the export gives them (tombstones included).
    """
    from store.formats.entries import entry_hash
    from store.model.rules import REDACTION_TYPE, is_tombstone
    from store.model.session import Session

    def key(e: dict[str, Any]) -> tuple[str, str, tuple[Any, Any, Any]]:
        return (str(e["id"]), entry_hash(_storable(_as_js(e))[0]),
                (e.get("type"), e.get("parentId"), e.get("timestamp")))

    header = store.get_header(sid)
    if header.fork is not None:
        data = store.read_session(sid)
        exported = Session(data.header.pi_header, data.all_entries, validated=True).to_pi_entries()
        return _Stored([key(e) for e in exported], frozenset(), data.last_entry_id)
    redacted: set[str] = set()

    def own(e: dict[str, Any]) -> tuple[str, str, tuple[Any, Any, Any]]:
        if e.get("type") == REDACTION_TYPE and isinstance(e.get("targetId"), str):
            redacted.add(e["targetId"])
        elif is_tombstone(e):
            redacted.add(str(e["id"]))
        return key(e)

    entries, tail = store.reader.map_own_entries(sid, header, own)
    return _Stored(entries, frozenset(redacted), tail)


def _append_rest(store: Sessions, scan: "PiScan", sid: str, *, fresh: bool) -> int:
    """Compare the stored entries with the file's first ones, then append the rest of the
    file, each batch strict on the tail the previous one left. Returns how many were sent."""
    from store.formats.entries import prepare_batch
    from store.pi.scan import iter_pi_entries
    from store.formats.records import EMPTY_TAIL

    stored = _Stored([], frozenset(), "") if fresh else _stored_view(store, sid)
    options = store.options
    file_ids = scan.entry_ids
    position = 0

    def rest() -> Any:
        nonlocal position
        for entry in iter_pi_entries(scan):
            if position < len(stored.entries):
                _same_or_refuse(sid, position, stored, entry, scan)
                position += 1
                continue
            position += 1
            yield entry

    sent = 0
    expected = stored.tail or EMPTY_TAIL
    for chunk in _chunks(rest(), options.max_batch_entries, options.max_batch_bytes):
        batch = prepare_batch(
            chunk, max_bytes=options.max_batch_bytes, max_entries=options.max_batch_entries,
            strict=False,
        )
        del chunk
        # pi keeps entries whose parent is missing (orphans become roots); so does an import.
        # Parents in the file come first (the scan checked): in an earlier batch.
        batch = replace(
            batch, external_parents=tuple(p for p in batch.external_parents if p[1] in file_ids)
        )
        result = store.append_prepared(sid, batch, expected)
        expected = result.last_appended_entry_id
        sent += len(batch.ids)
        del batch
    return sent


def _same_or_refuse(
    sid: str, position: int, stored: _Stored, entry: dict[str, Any], scan: "PiScan"
) -> None:
    """The file's entry at ``position`` is the stored one, or the import is refused.

    The same entry is the same content with JavaScript's numbers (``_as_js``), or, for an
    entry redacted in the store, one with its id, type, parent and timestamp: as it was before
    the redaction, the store's own tombstone (``is_tombstone``), or the one an export writes
    (type ``redacted``, the original type in ``redacted.type``).
    """
    from store.formats.entries import entry_hash
    from store.model.rules import is_tombstone

    stored_id, stored_hash, (stored_type, parent, timestamp) = stored.entries[position]
    line = scan.entry_lines[position] if position < len(scan.entry_lines) else "?"
    if entry["id"] != stored_id:
        raise ImportConflictError(
            sid, f"entry {position + 1} is {stored_id!r} in the store but {entry['id']!r} in the file, "
            f"line {line}"
        )
    if entry_hash(_storable(entry)[0]) == stored_hash:
        return
    if stored_id in stored.redacted and entry.get("parentId") == parent and entry.get("timestamp") == timestamp:
        # Redacted in the store: the file may hold the entry as it was, the store's own
        # tombstone, or the one an export writes (typed "redacted", its type kept inside).
        marker = entry.get("redacted")
        exported = entry.get("type") == "redacted" and isinstance(marker, dict) and not is_tombstone(entry)
        if (marker.get("type") if exported else entry.get("type")) == stored_type:
            return
    raise ImportConflictError(
        sid, f"entry {stored_id!r}, line {line} of the file, has other content in the store"
    )


def _as_js(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` as a pi file holds it once exported and read back: with JavaScript's numbers.

    The store keeps what an append gave it (``1.0``, ``-0.0``, ``2**64 - 1``); an export
    writes ``JSON.stringify``'s ``1``, ``0``, ``18446744073709552000``, and the scan reads the
    file the way ``JSON.parse`` does. So the stored side is compared as JavaScript holds it:
    the same entry exported and imported again is the same entry, not other content. The copy
    is made by orjson (a stored value always encodes), then normalised in place.
    """
    from store.model.js_json import decode_json, normalize_in_place

    try:
        return normalize_in_place(decode_json(encode_json(value)))  # type: ignore[no-any-return]
    except (orjson.JSONEncodeError, ValueError):  # Unholdable is a ValueError
        return value  # nothing JS could hold: compared as it is (and so differs)


def _header_difference(stored: dict[str, Any], new: dict[str, Any]) -> str:
    stored = _as_js(stored)
    for key in sorted(set(stored) | set(new)):
        if stored.get(key) != new.get(key):
            return f"its header's {key!r} is {stored.get(key)!r} in the store and {new.get(key)!r} in the file"
    return "its header differs"  # pragma: no cover


def storable_check(store: Sessions) -> Any:
    """Pass 1's extra check: what a batch would refuse, found before anything is written."""
    from store.formats.entries import MAX_ID_LENGTH

    max_bytes = store.options.max_batch_bytes

    def storable(entry: dict[str, Any], line: int) -> None:
        entry_id = entry["id"]
        if len(entry_id) > MAX_ID_LENGTH:
            raise InvalidEntryError(f"line {line}: 'id' is longer than {MAX_ID_LENGTH}", entry_id=entry_id)
        size = _storable(entry)[1]
        if size is None:
            raise InvalidEntryError(f"line {line}: nested too deeply to be stored as JSON", entry_id=entry_id)
        if size > max_bytes:
            raise BatchTooLargeError(
                f"line {line}: entry {entry_id!r} takes {size} bytes, over the batch limit of "
                f"{max_bytes} bytes"
            )

    return storable


def peek_header_id(path: Any) -> str | None:
    """The session id a pi file's header names, from its first JSON value only (None when
    that is not a session header with a string id, or cannot be read). Cheap: for grouping
    files by session before importing them."""
    import orjson

    try:
        with open(path, "rb") as fh:
            for raw in fh:
                line = raw.strip()
                if not line:
                    continue
                try:
                    value = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue  # pi skips an unparseable line
                if isinstance(value, dict) and value.get("type") == "session" and isinstance(value.get("id"), str):
                    return str(value["id"])
                return None
    except OSError:
        return None
    return None


__all__ = ["ImportConflictError", "ImportResult", "OnConflict", "import_pi_file", "peek_header_id", "storable_check"]


def _wide_ints_as_floats(value: Any) -> Any:
    """A copy of ``value`` with JSON numbers past 64 bits as JavaScript holds them: doubles
    (orjson cannot encode such ints; pi has already rounded them, so the double is exact and
    exports the same digits). Iterative: entries may nest deeper than Python recurses."""

    def convert(item: Any) -> Any:
        t = type(item)
        if t is int and not (-(2**63) <= item < 2**64):
            return float(item)
        if t is dict:
            return {}
        if t is list:
            return []
        return item

    root = convert(value)
    stack = [(value, root)] if type(value) is dict or type(value) is list else []
    while stack:
        source, target = stack.pop()
        pairs = source.items() if type(source) is dict else enumerate(source)
        for key, item in pairs:
            copied = convert(item)
            if type(target) is dict:
                target[key] = copied
            else:
                target.append(copied)
            if type(item) is dict or type(item) is list:
                stack.append((item, copied))
    return root


def _storable(entry: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """``entry`` as the store encodes it, and the size of its line in a segment.

    Only entries orjson cannot encode as they are get copied (``_wide_ints_as_floats``: rare),
    and finding out costs no extra pass over the entry. The size is None for an entry orjson
    cannot encode at all (nesting beyond its 254 levels), which prepare_batch refuses.
    """
    try:
        return entry, len(encode_json(entry)) + 1
    except orjson.JSONEncodeError:
        wide = _wide_ints_as_floats(entry)
    try:
        return wide, len(encode_json(wide)) + 1
    except orjson.JSONEncodeError:
        return wide, None


def _chunks(
    entries: Iterator[dict[str, Any]], max_entries: int, max_bytes: int
) -> Iterator[list[dict[str, Any]]]:
    """Deterministic batches under both limits (so a re-import re-sends the same batches),
    of the entries as the store encodes them (``_storable``), one batch at a time."""
    chunk: list[dict[str, Any]] = []
    size = 0
    for entry in entries:
        entry, n = _storable(entry)
        if n is None:
            n = 1  # cannot be encoded: prepare_batch refuses the batch that holds it
        if chunk and (len(chunk) >= max_entries or size + n > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(entry)
        size += n
    if chunk:
        yield chunk
