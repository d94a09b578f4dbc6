"""Reading pi session files (JSONL, format v3; v1 and v2 are migrated): the readers.

Reading follows ``SessionManager.open()`` of ``@mariozechner/pi-coding-agent`` 0.73.1 (see
``tests/fixtures/pi/SPEC.md`` §1-§3): blank and unparseable lines are skipped, the first
parsed value must be a session header with a string id, later ``type:"session"`` lines are
dropped, and v1/v2 files are migrated to v3 exactly as pi migrates them
(:mod:`store.pi.migrate`). Values are held the way JavaScript holds them after ``JSON.parse``
(:mod:`store.model.js_json`).

Where pi would keep something the store cannot hold, crash, or hang, parsing raises
:class:`~store.errors.InvalidEntryError` instead (``docs/pi-format.md`` lists every case); the
only things skipped are those pi skips (blank and malformed lines, later headers), and each
skip is reported in :class:`PiFile`.

Reading streams: lines are parsed one at a time and only the parsed values are kept. For files
too large to hold even that, :func:`scan_pi_file` (pass 1: every check, a few dozen bytes per
entry) and :func:`iter_pi_entries` (pass 2: the entries again, one at a time) share the same
parser (:mod:`store.pi.parse`), migration and checks (:mod:`store.pi.checks`) with
:func:`read_pi_file`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from store.errors import InvalidEntryError, InvalidInputError
from store.model.js import MISSING
from store.model.session import Session
from store.pi.checks import Checker, EntryCheck
from store.pi.lines import Once, PiSource, Replay, iter_items, lines_once, replayable
from store.pi.migrate import (
    NO_TARGET,
    PiMigration,
    Plan,
    final_entries,
    migrate_header,
    mint_ids,
    v2_to_v3_entry,
    wanted_forward,
)
from store.pi.parse import Parser

__all__ = [
    "PiFile",
    "PiScan",
    "iter_pi_entries",
    "parse_pi_lines",
    "read_pi_file",
    "scan_pi_file",
]


def _require_header(header: dict[str, Any] | None, empty_reason: str | None) -> dict[str, Any]:
    if header is None:
        raise InvalidEntryError(f"not a pi session file: {empty_reason}", index=0)
    return header


@dataclass(frozen=True, slots=True)
class PiFile:
    """A parsed pi file: pi's header and its entries (file order, migrated to v3).

    ``header`` is ``None`` when pi would consider the file empty (no parseable line, or a
    first value that is not a session header with a string id): pi then overwrites the file
    with a fresh header, losing everything; we leave the decision to the caller
    (:meth:`require_header`) and never invent a header.
    """

    header: dict[str, Any] | None
    entries: list[dict[str, Any]]
    migration: PiMigration
    #: Why pi would treat the file as empty (``header is None``), else ``None``.
    empty_reason: str | None = None
    #: 1-based numbers of non-blank lines that did not parse (pi skips them silently).
    skipped_lines: tuple[int, ...] = ()
    #: 1-based numbers of later ``type:"session"`` lines (pi leaves them out of the entries).
    dropped_headers: tuple[int, ...] = ()
    #: 1-based numbers of lines that repeated an earlier entry byte for byte (pi's
    #: re-append quirk, SPEC §8) and were kept once.
    collapsed_duplicates: tuple[int, ...] = ()
    #: SHA-256 of the parsed lines, the seed of minted ids.
    content_hash: str = ""
    #: 1-based line number of every entry in :attr:`entries`.
    entry_lines: tuple[int, ...] = field(default=(), repr=False)

    def require_header(self) -> dict[str, Any]:
        """The header, or :class:`InvalidEntryError` if pi would treat the file as empty."""
        return _require_header(self.header, self.empty_reason)

    def to_session(self) -> Session:
        return Session(self.require_header(), self.entries)


# --- the readers ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class PiScan:
    """Pass 1 of a streaming read (:func:`scan_pi_file`): everything about a pi file but its
    entries, which :func:`iter_pi_entries` then reads again one at a time.

    The scan has applied every rule :func:`read_pi_file` applies, so a file it accepts gives
    exactly ``read_pi_file``'s entries. It holds about 130 bytes per entry (its id, index and
    line), never the entries. Close it (or use it as a context manager) to release a spooled
    copy of a stream.
    """

    header: dict[str, Any] | None
    migration: PiMigration
    #: Why pi would treat the file as empty (``header is None``), else ``None``.
    empty_reason: str | None = None
    skipped_lines: tuple[int, ...] = ()
    dropped_headers: tuple[int, ...] = ()
    collapsed_duplicates: tuple[int, ...] = ()
    content_hash: str = ""
    #: 1-based line number of every entry, in order.
    entry_lines: Sequence[int] = field(default=(), repr=False)
    #: ``(line, entry id, parent id)`` of the first entry whose parentId names an entry
    #: further down the file. pi and :class:`~store.model.session.Session` accept that; a store
    #: that needs parents first (sessionstore's) refuses it.
    forward_parent: tuple[int, str, str] | None = None
    _ids: dict[str, int] = field(default_factory=dict, repr=False)
    _plan: Plan | None = field(default=None, repr=False)
    _source: Replay | None = field(default=None, repr=False)

    @property
    def entry_count(self) -> int:
        return len(self.entry_lines)

    @property
    def entry_ids(self) -> Collection[str]:
        """The ids of all entries, in file order (a set-like view: ``x in scan.entry_ids``)."""
        return self._ids.keys()

    @property
    def leaf_id(self) -> str | None:
        """The id of the last entry (pi's leaf), ``None`` without entries."""
        return next(reversed(self._ids), None)

    def require_header(self) -> dict[str, Any]:
        """The header, or :class:`InvalidEntryError` if pi would treat the file as empty."""
        return _require_header(self.header, self.empty_reason)

    def close(self) -> None:
        if self._source is not None:
            self._source.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def scan_pi_file(source: PiSource, *, entry_check: EntryCheck | None = None) -> PiScan:
    """Pass 1 of a streaming read: parse and check the whole file, keep no entry.

    ``source`` is what :func:`read_pi_file` takes. Paths and seekable streams are read again
    by :func:`iter_pi_entries` (only as far as this scan read, and verified line by line);
    other streams are copied to a temporary file while they are scanned. Raises
    :class:`InvalidEntryError` exactly where :func:`read_pi_file` does. A v1 file is read
    twice by the scan itself: the ids it mints depend on the hash of the whole file, and the
    checks see the entries with their final ids.

    ``entry_check(entry, line)``, if given, sees every entry exactly as ``iter_pi_entries``
    will yield it, in order. It must not change or keep the entry. An
    :class:`~store.errors.InvalidInputError` it raises is raised by the scan once the file
    has passed all of the model's own checks (which are reported first).
    """
    replay = replayable(source)
    try:
        scan, _ = _scan(replay, keep=False, entry_check=entry_check)
    except BaseException:
        replay.close()
        raise
    return scan


def iter_pi_entries(scan: PiScan) -> Iterator[dict[str, Any]]:
    """Pass 2: the entries of the scanned file, one at a time, exactly as
    :func:`read_pi_file` puts them in :attr:`PiFile.entries`. Can be called more than once.

    Raises :class:`~store.errors.InvalidInputError` if the file no longer holds what the
    scan read (it was rewritten in between; appended lines are simply not read).
    """
    if scan.header is None or scan._plan is None or scan._source is None:
        return
    parser = Parser(hashing=False)
    count = 0
    for _, entry in final_entries(scan._plan, parser.values(scan._source.lines())):
        count += 1
        yield entry
    if count != scan.entry_count:  # cannot happen for content that passed the checks above
        raise InvalidInputError("the pi file changed while it was being read")


def parse_pi_lines(lines: Iterable[bytes | bytearray | memoryview | str]) -> PiFile:
    """Parse a pi session file given as lines (bytes or str; a trailing "\\n" is optional).

    Each item must be one or more complete lines (items are split on "\\n" only, never on
    U+2028, U+0085 or a lone "\\r"). Use :func:`read_pi_file` for paths, bytes and streams.
    Raises :class:`InvalidEntryError` for what the store cannot hold (see module docs).
    """
    return _read(Once(iter_items(lines)))


def read_pi_file(source: PiSource) -> PiFile:
    """Parse a pi session file from a path, its content, or a readable stream.

    ``source`` is: a :class:`os.PathLike` (a path); ``bytes``/``bytearray`` (the content); an
    object with ``read()`` (a stream, read in 1 MiB chunks); or a ``str``, which is taken as the
    content if it contains a newline or its first non-blank character is ``{``, and as a path
    otherwise (pass a :class:`pathlib.Path` to be explicit). Files are read once, in binary
    mode, line by line, so memory holds the parsed values, not the text. For files too large
    for that, use :func:`scan_pi_file` and :func:`iter_pi_entries`.
    """
    return _read(Once(lines_once(source)))


def _read(lines: Replay) -> PiFile:
    scan, entries = _scan(lines, keep=True, entry_check=None)
    return PiFile(
        header=scan.header,
        entries=entries,
        migration=scan.migration,
        empty_reason=scan.empty_reason,
        skipped_lines=scan.skipped_lines,
        dropped_headers=scan.dropped_headers,
        collapsed_duplicates=scan.collapsed_duplicates,
        content_hash=scan.content_hash,
        entry_lines=tuple(scan.entry_lines),
    )


def _scan(
    source: Replay, *, keep: bool, entry_check: EntryCheck | None
) -> tuple[PiScan, list[dict[str, Any]]]:
    """Pass 1, shared by every reader: parse, migrate as far as the file allows, check.

    ``keep``: also return the entries (one read, values kept: :func:`read_pi_file`);
    otherwise keep only bookkeeping and re-read ``source`` where needed.
    """
    parser = Parser()
    plan = Plan()
    migration = PiMigration(None)
    dropped: list[int] = []
    # v1 files: ids depend on the hash of the whole file, so this first read only notes what
    # the migration needs; the entries are checked in a second walk, once ids are minted.
    v1_values: list[tuple[int, Any]] = []
    values = parser.values(source.lines())
    first = next(values, None)  # the header, if the file has one
    header: dict[str, Any] | None = None if first is None else first[1]
    value_count = 1
    if header is not None:
        migration = migrate_header(header)
        plan.v1 = "v1->v2" in migration.steps
        plan.v2_to_v3 = "v2->v3" in migration.steps
    checker = Checker(entry_check, minted=plan.v1, keep=keep)
    if plan.v1:
        if keep and first is not None:
            v1_values.append(first)
        value_count = _plan_v1(values, plan, dropped, v1_values if keep else None)
    else:
        _check_values(values, plan, dropped, checker)

    content_hash = parser.hasher.digest() if parser.hasher is not None else b""
    if parser.header_state != "ok" or header is None:
        return _empty_scan(parser, content_hash, source), []

    if plan.v1:
        plan.minted = mint_ids(content_hash, value_count, plan.session_positions)
        walk = v1_values if keep else Parser(hashing=False).values(source.lines())
        for lineno, entry in final_entries(plan, walk):
            checker.add(lineno, entry)
    forward = checker.finish()
    plan.collapsed = frozenset(checker.collapsed)
    scan = PiScan(
        header=header,
        migration=migration,
        skipped_lines=tuple(parser.skipped),
        dropped_headers=tuple(dropped),
        collapsed_duplicates=tuple(checker.collapsed),
        content_hash=content_hash.hex(),
        entry_lines=checker.lines,
        forward_parent=forward,
        _ids=checker.index_by_id,
        _plan=plan,
        _source=source,
    )
    return scan, checker.entries if checker.entries is not None else []


def _plan_v1(
    values: Iterator[tuple[int, Any]],
    plan: Plan,
    dropped: list[int],
    kept: list[tuple[int, Any]] | None,
) -> int:
    """The first read of a v1 file's values after the header: note what the migration needs
    (later headers, the values a compaction's firstKeptEntryIndex names ahead of it) into
    ``plan``, keep the values in ``kept`` if given. Returns the number of parsed values, the
    header included."""
    position = 0
    wanted: set[int] = set()
    for position, (lineno, value) in enumerate(values, 1):
        if kept is not None:
            kept.append((lineno, value))
        is_session = value.get("type") == "session"
        if is_session:
            dropped.append(lineno)
            plan.session_positions.append(position)
        if position in wanted:
            plan.forward_ids[position] = NO_TARGET if is_session else value.get("id", MISSING)
        target = None if is_session else wanted_forward(value, position)
        if target is not None:
            wanted.add(target)
    return position + 1


def _check_values(
    values: Iterator[tuple[int, Any]], plan: Plan, dropped: list[int], checker: Checker
) -> None:
    """The values after the header of a v2 or v3 file, migrated and checked in one read."""
    add = checker.add
    for lineno, value in values:
        if value.get("type") == "session":
            dropped.append(lineno)
            continue
        add(lineno, v2_to_v3_entry(value) if plan.v2_to_v3 else value)


def _empty_scan(parser: Parser, content_hash: bytes, source: Replay) -> PiScan:
    """The scan of a file pi would treat as empty (no header): nothing but why."""
    return PiScan(
        header=None,
        migration=PiMigration(None),
        empty_reason=parser.header_state or "no parseable line",
        skipped_lines=tuple(parser.skipped),
        content_hash=content_hash.hex(),
        _source=source,
    )
