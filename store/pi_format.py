"""pi session files (JSONL, format v3) in and out.

Reading follows ``SessionManager.open()`` of ``@mariozechner/pi-coding-agent`` 0.73.1 (see
``tests/fixtures/pi/SPEC.md`` §1-§3): blank and unparseable lines are skipped, the first
parsed value must be a session header with a string id, later ``type:"session"`` lines are
dropped, and v1/v2 files are migrated to v3 exactly as pi migrates them, with one deliberate
change: ids that the v1 migration has to mint are deterministic (see :func:`mint_id`), so that
importing the same file twice gives the same ids.

Values are held the way JavaScript holds them after ``JSON.parse``: integers beyond 2**53 are
rounded like doubles (``18446744073709551616`` becomes ``18446744073709552000``), integral
floats are ints (``1.0`` -> ``1``, ``-0`` -> ``0``), and all-digit object keys come first, in
numeric order, as in a JS object. Writing (:func:`export_pi_lines`) is ``JSON.stringify``
byte for byte: no spaces, non-ASCII and U+2028 raw, JS number formatting.

Where pi would keep something the store cannot hold, crash, or hang, parsing raises
:class:`~store.errors.InvalidEntryError` instead (``docs/pi-format.md`` lists every case); the
only things skipped are those pi skips (blank and malformed lines, later headers), and each
skip is reported in :class:`PiFile`.

Reading streams: lines are parsed one at a time and only the parsed values are kept. For files
too large to hold even that, :func:`scan_pi_file` (pass 1: every check, a few dozen bytes per
entry) and :func:`iter_pi_entries` (pass 2: the entries again, one at a time) share the same
parser, migration and checks with :func:`read_pi_file`.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import marshal
import math
import os
import re
import tempfile
import zlib
from array import array
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import IO, Any, Final, Self, cast, overload

import orjson

from store.entries import encode_json
from store.errors import InvalidEntryError, InvalidInputError
from store.session import (
    JS_WHITESPACE,
    Session,
    check_acyclic,
    js_to_string,
    js_trim,
    validate_entry,
)

__all__ = [
    "EntryCheck",
    "PiFile",
    "PiMigration",
    "PiScan",
    "PiSource",
    "dumps_js",
    "export_pi_bytes",
    "export_pi_lines",
    "iter_pi_entries",
    "js_number_to_string",
    "js_to_number",
    "mint_id",
    "normalize_js_value",
    "parse_pi_lines",
    "read_pi_file",
    "scan_pi_file",
]

CURRENT_VERSION: Final = 3
_MAX_SAFE_INT: Final = 2**53
_I64_MIN: Final = -(2**63)
_U64_MAX: Final = 2**64 - 1
_MISSING: Final = object()
_READ_CHUNK: Final = 1 << 20

# JS JSON.stringify and orjson agree on every string escape (short escapes for \b \t \n \f \r,
# lowercase \u00XX for other C0 controls, DEL and U+2028/U+2029 raw, no "/" escape, raw
# non-ASCII); tests/test_pi_fixtures.py checks this. orjson refuses lone surrogates, which
# store.entries.encode_json writes as JSON.stringify does (\ud83d); otherwise the two differ
# only in number formatting.


# --- JavaScript numbers ------------------------------------------------------------------------


class _Unholdable(ValueError):
    """A value JSON.parse accepts but the store refuses: a number JavaScript holds as Infinity
    (``1e400``)."""


def js_number_to_string(value: float) -> str:
    """``Number.prototype.toString()`` (and so ``JSON.stringify``) of a finite double.

    Python's ``repr`` and JS both pick the shortest digit string that round-trips (ties to the
    nearest), so only the layout differs: JS writes plain digits for exponents -7 < e < 21.
    """
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return "null"  # what JSON.stringify writes for NaN and +-Infinity
    text = repr(value)
    sign = ""
    if text[0] == "-":
        sign, text = "-", text[1:]
    mantissa, _, exp_text = text.partition("e")
    exponent = int(exp_text) if exp_text else 0
    int_part, _, frac_part = mantissa.partition(".")
    if frac_part == "0":
        frac_part = ""
    digits = (int_part + frac_part).lstrip("0")
    # n: position of the decimal point relative to the first significant digit (ECMA-262 n).
    if int_part.strip("0"):
        n = len(int_part.lstrip("0")) + exponent
    else:
        n = exponent - (len(frac_part) - len(frac_part.lstrip("0")))
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        out = (
            digits[0]
            + ("." + digits[1:] if k > 1 else "")
            + "e"
            + ("+" if e >= 0 else "-")
            + str(abs(e))
        )
    return sign + out


def _canonical_float(value: float) -> int | float:
    if not math.isfinite(value):
        raise _Unholdable(f"number {value!r} is not finite")
    if value.is_integer():
        if abs(value) <= _MAX_SAFE_INT:
            return int(value)  # also turns -0.0 into 0, as JSON.stringify(-0) === "0"
        if abs(value) < 1e21:
            # JS prints the shortest round-trip digits padded with zeros, not the exact value:
            # 2**64 prints as 18446744073709552000.
            return int(Decimal(repr(value)))
    return value


def _canonical_int(value: int) -> int | float:
    try:
        as_double = float(value)
    except OverflowError as exc:
        raise _Unholdable("integer too large for a double") from exc
    return _canonical_float(as_double)


_DIGITS: Final = frozenset("0123456789")


def _is_array_index(key: str) -> bool:
    # A canonical uint32 below 2**32-1: JS objects list such keys first, in numeric order.
    return (
        key.isdigit() and key.isascii() and (key == "0" or key[0] != "0") and int(key) < 4294967295
    )


def _js_key_order(obj: dict[str, Any]) -> list[str] | None:
    """The JS property order of ``obj`` if it differs from the dict's, else None."""
    # Non-string keys cannot be written at all: orjson refuses them later, with a typed error.
    index_keys = [k for k in obj if type(k) is str and k[:1] in _DIGITS and _is_array_index(k)]
    if not index_keys:
        return None
    index_keys.sort(key=int)
    first = set(index_keys)
    order = index_keys + [k for k in obj if k not in first]
    return None if order == list(obj) else order


# A high surrogate followed by a low one: one character to JavaScript, two code points here.
_SPLIT_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def _join_pairs(text: str) -> str:
    """``text`` as JavaScript holds it: a surrogate pair given as two code points is the one
    character (lone surrogates stay, as JS strings keep them)."""
    if not _SPLIT_PAIR.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def _normalize_in_place(root: Any, *, strings: bool = False) -> Any:
    """Make a freshly parsed value hold what JSON.parse would hold. Mutates containers.

    Iterative, so that nesting depth is no problem. ``strings`` also joins surrogate pairs
    given as two code points (:func:`_join_pairs`): only Python values and the slow parser
    reading ``str`` input can hold them, never orjson's output.
    """
    if type(root) is not dict and type(root) is not list:
        return _normalize_scalar(root, strings)
    stack: list[Any] = [root]
    pop = stack.pop
    push = stack.append
    while stack:
        container = pop()
        if type(container) is dict:
            digit_key = False
            for key, value in container.items():
                # Cheap pre-test (two C string comparisons) for keys JS may move to the front.
                if "0" <= key < ":":
                    digit_key = True
                kind = type(value)
                if kind is str:
                    if strings:
                        container[key] = _join_pairs(value)
                elif kind is dict or kind is list:
                    push(value)
                elif kind is int:
                    if not -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT:
                        container[key] = _canonical_int(value)
                elif kind is float:
                    container[key] = _canonical_float(value)
            if strings and any(_SPLIT_PAIR.search(k) for k in container):
                # Keys are rewritten in place: one joined key could now equal another, and
                # then the later value wins, as JSON.parse keeps the later duplicate.
                items = [(_join_pairs(k), v) for k, v in container.items()]
                container.clear()
                container.update(items)
            order = _js_key_order(container) if digit_key else None
            if order is not None:
                items = [(k, container[k]) for k in order]
                container.clear()
                container.update(items)
        else:
            for position, value in enumerate(container):
                kind = type(value)
                if kind is str:
                    if strings:
                        container[position] = _join_pairs(value)
                elif kind is dict or kind is list:
                    push(value)
                elif kind is int:
                    if not -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT:
                        container[position] = _canonical_int(value)
                elif kind is float:
                    container[position] = _canonical_float(value)
    return root


def _normalize_scalar(value: Any, strings: bool) -> Any:
    kind = type(value)
    if kind is int and not -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT:
        return _canonical_int(value)
    if kind is float:
        return _canonical_float(value)
    if kind is str and strings:
        return _join_pairs(value)
    return value


def normalize_js_value(value: Any) -> Any:
    """A deep copy of a JSON-like value holding what ``JSON.parse(JSON.stringify(value))`` holds.

    Lone surrogates are kept (JS strings hold them); a surrogate pair given as two code points
    becomes the one character. Raises :class:`InvalidEntryError` for NaN, infinities and
    non-JSON types.
    """
    try:
        return _normalize_in_place(_deep_copy(value), strings=True)
    except _Unholdable as exc:
        raise InvalidEntryError(str(exc)) from exc


def _deep_copy(root: Any) -> Any:
    """Copy the JSON containers of ``root`` (tuples become lists), iteratively."""

    def fresh(value: Any) -> Any:
        if isinstance(value, dict):
            return {}
        if isinstance(value, (list, tuple)):
            return []
        if value is None or isinstance(value, (str, int, float)):
            return value  # bool is an int
        raise InvalidEntryError(f"not a JSON value: {type(value).__name__}")

    top = fresh(root)
    stack = [(root, top)]
    while stack:
        source, target = stack.pop()
        if isinstance(source, dict):
            for key, value in source.items():
                if not isinstance(key, str):
                    raise InvalidEntryError(f"object key {key!r} is not a string")
                copied = fresh(value)
                target[key] = copied
                if copied is not value:
                    stack.append((value, copied))
        elif isinstance(source, (list, tuple)):
            for value in source:
                copied = fresh(value)
                target.append(copied)
                if copied is not value:
                    stack.append((value, copied))
    return top


def _export_fragment(value: Any) -> Any:
    """The value orjson must write for a canonical scalar, or ``value`` itself if it is right."""
    kind = type(value)
    if kind is float:
        magnitude = abs(value)
        # orjson writes 1.5e-6 where JS writes 0.0000015; everywhere else (for non-integral and
        # >= 1e21 doubles) the two agree, which tests check on random doubles.
        if 1e-6 <= magnitude < 1e-5:
            return orjson.Fragment(js_number_to_string(value).encode())
        return value
    if kind is int and not _I64_MIN <= value <= _U64_MAX:
        return orjson.Fragment(str(value).encode())  # beyond orjson's 64-bit integers
    return value


def _needs_export_fix(root: Any) -> bool:
    """Whether ``root`` holds anything orjson would not write exactly like JSON.stringify."""
    stack = [root]
    while stack:
        value = stack.pop()
        kind = type(value)
        if kind is str or value is None or kind is bool:
            continue
        if kind is dict:
            if _js_key_order(value) is not None:
                return True
            stack.extend(value.values())
        elif kind is list:
            stack.extend(value)
        elif kind is int:
            if not -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT:
                return True
        elif kind is float:
            if value.is_integer() or not math.isfinite(value) or 1e-6 <= abs(value) < 1e-5:
                return True
        else:
            return True  # tuples, subclasses, foreign types: let the slow path decide
    return False


def _prepare_export(value: Any) -> Any:
    if not _needs_export_fix(value):
        return value
    try:
        fixed = _normalize_in_place(_deep_copy(value))
    except _Unholdable as exc:
        raise InvalidEntryError(str(exc)) from exc
    if type(fixed) is not dict and type(fixed) is not list:
        return _export_fragment(fixed)
    stack = [fixed]
    while stack:
        container = stack.pop()
        if type(container) is dict:
            for key, item in container.items():
                if type(item) is dict or type(item) is list:
                    stack.append(item)
                else:
                    container[key] = _export_fragment(item)
        else:
            for position, item in enumerate(container):
                if type(item) is dict or type(item) is list:
                    stack.append(item)
                else:
                    container[position] = _export_fragment(item)
    return fixed


def dumps_js(value: Any) -> bytes:
    """``JSON.stringify(value)`` as UTF-8 bytes, for JSON-like Python values.

    Lone surrogates are written as ``\\ud83d`` escapes, as ``JSON.stringify`` writes them.
    Raises :class:`InvalidEntryError` for what JSON cannot hold faithfully (NaN, infinities,
    non-string keys, non-JSON types, a surrogate pair given as two code points).
    """
    prepared = _prepare_export(value)
    try:
        return encode_json(prepared)
    except orjson.JSONEncodeError as exc:  # a TypeError
        raise InvalidEntryError(f"cannot be written as JSON: {exc}") from exc


def js_to_number(value: Any) -> float:
    """``ToNumber`` of a JSON value (``"2"`` -> 2, ``[3]`` -> 3, ``"abc"`` -> NaN, ``null`` -> 0)."""
    if value is None:
        return 0.0
    if value is True or value is False:
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, list):
        return _string_to_number(js_to_string(value))  # ToPrimitive joins the elements
    if isinstance(value, str):
        return _string_to_number(value)
    return math.nan  # "[object Object]"


# StrNumericLiteral (ASCII digits only: Python's float() would also take "١٢" or "1_0").
_DECIMAL_LITERAL = re.compile(
    r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)\Z", re.ASCII
)
_RADIX_LITERAL = re.compile(r"0(?:[xX][0-9a-fA-F]+|[oO][0-7]+|[bB][01]+)\Z")


def _string_to_number(text: str) -> float:
    text = js_trim(text)
    if text == "":
        return 0.0
    if text in ("Infinity", "+Infinity"):
        return math.inf
    if text == "-Infinity":
        return -math.inf
    if _RADIX_LITERAL.match(text):
        return float(int(text, 0))
    if _DECIMAL_LITERAL.match(text):
        return float(text)
    return math.nan


# --- reading -----------------------------------------------------------------------------------


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
        if self.header is None:
            raise InvalidEntryError(f"not a pi session file: {self.empty_reason}", index=0)
        return self.header

    def to_session(self) -> Session:
        return Session(self.require_header(), self.entries)


def mint_id(content_hash: bytes, position: int, attempt: int = 0) -> str:
    """A deterministic entry id: 16 lowercase hex characters (64 bits).

    pi mints ``randomUUID().slice(0, 8)`` for v1 entries; we derive the id from the hash of
    the file's parsed lines and the entry's position among parsed values instead, so that
    re-importing a file yields the same ids. ``attempt`` > 0 resolves (astronomically rare)
    collisions deterministically.
    """
    data = content_hash + position.to_bytes(8, "big") + attempt.to_bytes(4, "big")
    return hashlib.blake2b(data, digest_size=8, person=b"pi-v1-mint").hexdigest()


def _js_lstrip(text: str) -> str:
    return text.lstrip(JS_WHITESPACE)


def _js_rstrip(text: str) -> str:
    return text.rstrip(JS_WHITESPACE)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_int_js(text: str) -> int | float:
    # Python refuses to convert more than 4300 digits; JS reads them as a (possibly infinite)
    # double, which we then refuse as a typed error rather than skip as malformed.
    return int(text) if len(text) <= 400 else float(text)


_SLOW_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_int=_parse_int_js)


class _TooDeep(ValueError):
    """Valid JSON nested deeper than Python's parsers go (JSON.parse in V8 has no such limit)."""


def _slow_parse(text: str) -> Any:
    """``JSON.parse`` of a line orjson refused (lone surrogate escapes, nesting beyond orjson's
    1024 levels). Returns _MISSING if JSON.parse would throw too."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        value, end = _SLOW_DECODER.raw_decode(text, _skip_json_ws(text, 0))
    except json.JSONDecodeError:
        return _MISSING
    except RecursionError as exc:
        raise _TooDeep("JSON nested too deeply to parse") from exc
    if _skip_json_ws(text, end) != len(text):
        return _MISSING
    return value


def _skip_json_ws(text: str, position: int) -> int:
    length = len(text)
    while position < length and text[position] in " \t\n\r":
        position += 1
    return position


def _iter_split(data: str | bytes, sep: str | bytes) -> Iterator[Any]:
    start = 0
    while True:
        end = data.find(sep, start)  # type: ignore[arg-type]
        if end < 0:
            yield data[start:]
            return
        yield data[start:end]
        start = end + 1


def _iter_items(lines: Iterable[bytes | bytearray | memoryview | str]) -> Iterator[bytes | str]:
    """Lines from items that are each one or more complete lines (a trailing "\\n" optional)."""
    for item in lines:
        if isinstance(item, str):
            item = item.removesuffix("\n")
            if "\n" in item:
                yield from _iter_split(item, "\n")
            else:
                yield item
        else:
            data = bytes(item) if not isinstance(item, bytes) else item
            if data.endswith(b"\n"):
                data = data[:-1]
            if b"\n" in data:
                yield from _iter_split(data, b"\n")
            else:
                yield data


# --- line sources --------------------------------------------------------------------------------


def _read_chunks(handle: IO[Any], limit: int | None = None) -> Iterator[Any]:
    """``handle.read()`` in 1 MiB chunks; at most ``limit`` units (bytes, or characters of a
    text stream) when given."""
    remaining = limit
    while remaining is None or remaining > 0:
        chunk = handle.read(_READ_CHUNK if remaining is None else min(_READ_CHUNK, remaining))
        if not chunk:
            return
        if remaining is not None:
            remaining -= len(chunk)
        yield chunk


def _split_chunks(chunks: Iterable[Any]) -> Iterator[bytes | str]:
    """Lines of a text given in chunks (all bytes or all str), split on "\\n" only, whatever
    the chunk boundaries are."""
    pending: list[Any] = []
    for chunk in chunks:
        sep: Any = "\n" if isinstance(chunk, str) else b"\n"
        start = 0
        while True:
            end = chunk.find(sep, start)
            if end < 0:
                if start < len(chunk):
                    pending.append(chunk[start:])
                break
            piece = chunk[start:end]
            if pending:
                pending.append(piece)
                yield piece[:0].join(pending)
                pending = []
            else:
                yield piece
            start = end + 1
    if pending:
        yield pending[0][:0].join(pending)


def _iter_stream(stream: IO[bytes] | IO[str]) -> Iterator[bytes | str]:
    """Lines of a readable stream, split on "\\n" only, whatever the read chunks are."""
    return _split_chunks(_read_chunks(stream))


PiSource = str | os.PathLike[str] | bytes | bytearray | memoryview | IO[bytes] | IO[str]


def _is_path(source: object) -> bool:
    return isinstance(source, os.PathLike) or (
        isinstance(source, str) and _looks_like_path(source)
    )


def _looks_like_path(text: str) -> bool:
    return "\n" not in text and not _js_lstrip(text).startswith("{") and text != ""


def _lines_once(source: PiSource) -> Iterator[bytes | str]:
    """The lines of ``source``, read once (see :func:`read_pi_file` for the kinds of source)."""
    if _is_path(source):
        with open(source, "rb") as handle:  # type: ignore[arg-type]
            # Binary file iteration splits on b"\n" only: each line is complete.
            for line in handle:
                yield line[:-1] if line.endswith(b"\n") else line
    elif isinstance(source, (bytes, bytearray, memoryview)):
        yield from _iter_split(bytes(source), b"\n")
    elif isinstance(source, str):
        yield from _iter_split(source, "\n")
    elif hasattr(source, "read"):
        yield from _iter_stream(cast(IO[Any], source))
    else:
        raise TypeError(f"cannot read a pi file from {type(source).__name__}")


class _Replay:
    """The lines of a pi file, for a scan that reads them more than once (and pass 2).

    Every read must give exactly the lines of the first one: minted ids, collapsed
    duplicates and every check of pass 1 are about those lines.
    """

    def lines(self) -> Iterator[bytes | str]:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the source holds (a spooled copy); nothing by default."""


class _Once(_Replay):
    """Lines that can be read only once: for the one-pass readers."""

    def __init__(self, lines: Iterator[bytes | str]) -> None:
        self._lines: Iterator[bytes | str] | None = lines

    def lines(self) -> Iterator[bytes | str]:
        lines, self._lines = self._lines, None
        if lines is None:
            raise RuntimeError("these lines can be read only once")
        return lines


class _InMemory(_Replay):
    """Content the caller passed (bytes or str): immutable, so simply split again."""

    def __init__(self, data: bytes | str) -> None:
        self._data = data

    def lines(self) -> Iterator[bytes | str]:
        return _iter_split(self._data, b"\n" if isinstance(self._data, bytes) else "\n")


class _Reread(_Replay):
    """A path, or a seekable stream, read again from where the first read began.

    Later reads stop at the length the first read saw: pi appends to a live session file,
    and lines appended between the passes are not part of this import. Every line is
    compared with a CRC-32 taken by the first read (4 bytes a line), so that a file that was
    rewritten in between (pi rewrites old files when it migrates them) is refused instead of
    mixing two versions.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None, stream: IO[Any] | None, start: int = 0
    ) -> None:
        self._path = path
        self._stream = stream
        self._start = start
        self._length: int | None = None  # set once a first read has completed
        self._crcs = array("I")

    def lines(self) -> Iterator[bytes | str]:
        if self._path is not None:
            with open(self._path, "rb") as handle:
                yield from self._read(handle)
        else:
            assert self._stream is not None
            yield from self._read(self._stream)

    def _read(self, handle: IO[Any]) -> Iterator[bytes | str]:
        if self._stream is not None:
            handle.seek(self._start)
        length = self._length
        if length is None:
            yield from self._first_read(handle)
            return
        crcs = self._crcs
        count = 0
        for line in _split_chunks(_read_chunks(handle, length)):
            if count >= len(crcs) or _crc(line) != crcs[count]:
                raise self._changed(count + 1)
            count += 1
            yield line
        if count != len(crcs):
            raise self._changed(count + 1)

    def _first_read(self, handle: IO[Any]) -> Iterator[bytes | str]:
        length = 0
        crcs = array("I")

        def counted() -> Iterator[Any]:
            nonlocal length
            for chunk in _read_chunks(handle):
                length += len(chunk)
                yield chunk

        for line in _split_chunks(counted()):
            crcs.append(_crc(line))
            yield line
        self._length, self._crcs = length, crcs

    def _changed(self, lineno: int) -> InvalidInputError:
        what = os.fspath(self._path) if self._path is not None else "the stream"
        return InvalidInputError(
            f"{what}: the file changed while it was being read (line {lineno} is not what "
            "the first pass read); import it again once nothing rewrites it"
        )


def _crc(line: bytes | str) -> int:
    data = line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass")
    return zlib.crc32(data)


class _Spool(_Replay):
    """A stream that cannot be read twice (a pipe, stdin): the first read copies it to an
    anonymous temporary file (disk, not memory), which later reads use."""

    def __init__(self, stream: IO[Any]) -> None:
        self._stream = stream
        self._copy: IO[Any] | None = None
        self._complete = False
        self._closed = False

    def lines(self) -> Iterator[bytes | str]:
        if self._closed:
            raise ValueError("the scan was closed: its copy of the stream is gone")
        if not self._complete:
            return _split_chunks(self._tee())
        if self._copy is None:
            return iter(())  # the stream was empty
        self._copy.seek(0)
        return _split_chunks(_read_chunks(self._copy))

    def _tee(self) -> Iterator[Any]:
        for chunk in _read_chunks(self._stream):
            if self._copy is None:
                # Text is kept as text (newline="" translates nothing), so that later reads
                # give the very same str lines, lone surrogates included.
                # Closed by close(): it has to outlive this read (noqa SIM115).
                self._copy = (
                    tempfile.TemporaryFile(  # noqa: SIM115
                        "w+", encoding="utf-8", errors="surrogatepass", newline=""
                    )
                    if isinstance(chunk, str)
                    else tempfile.TemporaryFile("w+b")  # noqa: SIM115
                )
            self._copy.write(chunk)
            yield chunk
        if self._copy is not None:
            self._copy.flush()
        self._complete = True

    def close(self) -> None:
        self._closed = True
        if self._copy is not None:
            self._copy.close()
            self._copy = None


def _replay(source: PiSource) -> _Replay:
    if _is_path(source):
        return _Reread(source, None)  # type: ignore[arg-type]
    if isinstance(source, (bytes, str)):
        return _InMemory(source)
    if isinstance(source, (bytearray, memoryview)):
        # A snapshot: the caller's buffer could change between the passes.
        return _InMemory(bytes(source))
    if hasattr(source, "read"):
        stream = cast(IO[Any], source)
        try:
            start = stream.tell() if stream.seekable() else None
        except (AttributeError, OSError, ValueError):
            start = None  # not seekable after all (tell() refused): spool it
        return _Spool(stream) if start is None else _Reread(None, stream, start)
    raise TypeError(f"cannot read a pi file from {type(source).__name__}")


# --- parsing -------------------------------------------------------------------------------------


class _Parser:
    """Line-level parsing: ``JSON.parse`` of each line as pi does it, the content hash, and
    the first-value-is-a-header rule. Shared by every reader, and by both passes of a scan."""

    def __init__(self, *, hashing: bool = True) -> None:
        self.hasher = hashlib.sha256() if hashing else None
        self.skipped: list[int] = []
        self.header_state: str | None = None  # None: undecided, "ok", or an empty-reason
        self.entry_count = 0  # values after the header that are not later headers
        self.value_count = 0
        self.seen_nonblank = False
        # A last line that parses only once trailing JS whitespace (NBSP, U+2028, ...) is gone:
        # pi's content.trim() makes that work for the LAST non-blank line only.
        self.tail: tuple[int, Any, bytes] | None = None
        # The value the last feed() accepted (at most one a line), for values().
        self._ready: tuple[int, Any] | None = None

    def values(self, raw_lines: Iterable[bytes | str]) -> Iterator[tuple[int, Any]]:
        """(line number, value) of every value pi keeps, in file order (the header first)."""
        for lineno, raw in enumerate(raw_lines, 1):
            more = self.feed(lineno, raw)
            if self._ready is not None:
                ready, self._ready = self._ready, None
                yield ready
            if not more:
                return
        self.finish()
        if self._ready is not None:
            ready, self._ready = self._ready, None
            yield ready

    def feed(self, lineno: int, raw: bytes | str) -> bool:
        """Consume one line; False once the file is known to be "empty" (stop reading)."""
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return self._feed_slow(lineno, raw)
        if self.tail is not None:
            self.skipped.append(self.tail[0])
            self.tail = None
        self.seen_nonblank = True
        digest_bytes = b""
        if self.hasher is not None:
            if isinstance(raw, bytes):
                digest_bytes = raw.strip(b" \t\r")
            else:
                digest_bytes = raw.strip(" \t\r").encode("utf-8")
        return self._accept(lineno, value, digest_bytes, slow=False)

    def _feed_slow(self, lineno: int, raw: bytes | str) -> bool:
        # Node decodes the file with U+FFFD replacement; so do we.
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if not js_trim(text):
            return True  # a blank line: pi's `if (!line.trim()) continue`
        if self.tail is not None:
            self.skipped.append(self.tail[0])
            self.tail = None
        if not self.seen_nonblank:
            # content.trim() removed the BOM / leading whitespace of the first non-blank line.
            text = _js_lstrip(text)
        self.seen_nonblank = True
        try:
            value = _slow_parse(text)
            if value is _MISSING:
                trimmed = _js_rstrip(text)
                if trimmed != text:
                    value = _slow_parse(trimmed)
                    if value is not _MISSING:
                        self.tail = (lineno, value, _encode(trimmed.strip(" \t\r")))
                        return True
                self.skipped.append(lineno)
                return True
        except _TooDeep as exc:
            # pi would keep this line; skipping it would lose data silently, so refuse it.
            raise InvalidEntryError(f"line {lineno}: {exc}") from exc
        return self._accept(lineno, value, _encode(text.strip(" \t\r")), slow=True)

    def finish(self) -> None:
        if self.tail is not None:
            lineno, value, digest_bytes = self.tail
            self.tail = None
            self._accept(lineno, value, digest_bytes, slow=True)

    def _accept(
        self, lineno: int, value: Any, digest_bytes: bytes, *, slow: bool
    ) -> bool:
        if self.header_state is None:
            if value is None:
                # pi: loadEntriesFromFile reads `header.type` of null and throws a TypeError.
                raise InvalidEntryError(f"line {lineno}: the first JSON value is null")
            if not isinstance(value, dict) or value.get("type") != "session":
                self.header_state = "the first JSON value is not a session header"
                return False
            if not isinstance(value.get("id"), str):
                self.header_state = "the session header has no string id"
                return False
            self.header_state = "ok"
        elif not isinstance(value, dict):
            what = "null" if value is None else f"a JSON {_json_kind(value)}"
            # pi keeps such values as id-less entries (and throws on null): no store can hold them.
            raise InvalidEntryError(
                f"line {lineno}: {what} where an entry object was expected",
                index=self.entry_count,
            )
        elif value.get("type") != "session":
            self.entry_count += 1
        try:
            _normalize_in_place(value, strings=slow)
        except _Unholdable as exc:
            index = self.entry_count - 1 if self.value_count else None
            raise InvalidEntryError(f"line {lineno}: {exc}", index=index) from exc
        if self.hasher is not None:
            self.hasher.update(digest_bytes)
            self.hasher.update(b"\n")
        self.value_count += 1
        self._ready = (lineno, value)
        return True


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else type(value).__name__


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


# --- migration (SPEC §3) -------------------------------------------------------------------------

# A firstKeptEntryIndex whose target pi finds nowhere, or finds to be a session line: pi then
# leaves firstKeptEntryId alone.
_NO_TARGET: Final = object()


@dataclass(slots=True)
class _Plan:
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
    #: the value's id as read (``_MISSING`` if it had none, ``_NO_TARGET`` for a session line).
    forward_ids: dict[int, Any] = field(default_factory=dict)


def _migrate_header(header: dict[str, Any]) -> PiMigration:
    """pi's migrateToCurrentVersion for the header, in place; the steps decide the entries'."""
    raw_version = header.get("version", _MISSING)
    header_version = None if raw_version is _MISSING else raw_version
    # `header.version ?? 1`, then JS relational comparisons (a string "2" compares as 2,
    # something non-numeric as NaN, for which every comparison is false).
    version = 1.0 if raw_version is _MISSING or raw_version is None else js_to_number(raw_version)
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


def _mint_ids(content_hash: bytes, value_count: int, session_positions: list[int]) -> list[str]:
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


def _wanted_forward(value: dict[str, Any], position: int) -> int | None:
    """The later position a v1 compaction's firstKeptEntryIndex names, if any."""
    if value.get("type") != "compaction":
        return None
    index = value.get("firstKeptEntryIndex", _MISSING)
    numeric = isinstance(index, (int, float)) and not isinstance(index, bool)
    if numeric and float(index).is_integer() and index > position:
        return int(index)
    return None


def _migrate_v1_entry(
    value: dict[str, Any], position: int, number: int, plan: _Plan, sessions: set[int]
) -> None:
    """pi's v1->v2 step for the entry at ``position`` (the ``number``-th entry), in place."""
    minted = plan.minted
    # Replaces any existing id: a tree without `version` is flattened into one chain.
    value["id"] = minted[number]
    value["parentId"] = minted[number - 1] if number else None
    if value.get("type") != "compaction":
        return
    index = value.get("firstKeptEntryIndex", _MISSING)
    if not isinstance(index, (int, float)) or isinstance(index, bool):
        return  # a non-numeric index is left untouched
    # entries[index] counts every parsed value, header included; JS gives undefined for a
    # fractional, negative or out-of-range index.
    target: Any = _NO_TARGET
    if float(index).is_integer() and index >= 0:
        where = int(index)
        if where > position:
            # A later value: its old id (or undefined, which JSON drops), as pass 1 read it.
            target = plan.forward_ids.get(where, _NO_TARGET)
        elif where not in sessions:
            # An earlier value (or this one): its minted id.
            target = minted[where - bisect.bisect_right(plan.session_positions, where)]
    if target is _MISSING:
        value.pop("firstKeptEntryId", None)
    elif target is not _NO_TARGET:
        value["firstKeptEntryId"] = target
    del value["firstKeptEntryIndex"]


def _migrate_v2_entry(value: dict[str, Any]) -> None:
    """pi's v2->v3 step for an entry, in place (idempotent)."""
    if value.get("type") == "message":
        message = value.get("message")
        if isinstance(message, dict) and message.get("role") == "hookMessage":
            message["role"] = "custom"


def _final_entries(
    plan: _Plan, values: Iterable[tuple[int, Any]]
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
            _migrate_v2_entry(value)
        number += 1
        yield lineno, value


# --- pass 1: the checks across entries -----------------------------------------------------------

#: ``entry_check(entry, line)`` of :func:`scan_pi_file`.
EntryCheck = Callable[[dict[str, Any], int], None]

_DIGEST_SIZE: Final = 16


def _digest(value: dict[str, Any]) -> bytes:
    """16 bytes that differ exactly when two parsed entries' ``JSON.stringify`` differ.

    marshal's version 0 is, like JSON.stringify, a one-to-one image of a parsed (normalised)
    value, key order and int/float/bool types included; unlike later versions it never
    shares equal objects, so equal values give equal bytes whatever their identity. Unlike
    orjson, it does not leave a cached UTF-8 copy inside every non-ASCII string it writes
    (which would add the size of the text to every entry :func:`read_pi_file` keeps), and
    it takes any depth the parser does.
    """
    return hashlib.blake2b(marshal.dumps(value, 0), digest_size=_DIGEST_SIZE).digest()


class _Checker:
    """The model's rules for each entry and across entries, applied in file order while
    keeping only small bookkeeping per entry: its id, parent id, line and content digest.

    The first refusal is kept and raised by :meth:`finish`, once the whole file has been
    parsed: an unparseable value anywhere in the file is reported first, as
    :func:`read_pi_file` always did.
    """

    def __init__(self, entry_check: EntryCheck | None, *, minted: bool, keep: bool) -> None:
        # Ids minted by the v1 migration are unique and chained in file order: neither
        # duplicates nor cycles nor forward parents can occur, so they are not looked for.
        self.minted = minted
        self.entry_check = entry_check
        #: The entries, when the caller keeps them (read_pi_file).
        self.entries: list[dict[str, Any]] | None = [] if keep else None
        self.index_by_id: dict[str, int] = {}
        self.parents: list[Any] = []
        self.lines = array("Q")
        # A repeated id is settled by comparing digests: kept for every entry when the
        # entries themselves are not kept, computed on demand from the two entries otherwise
        # (repeats are rare; digesting every entry would slow read_pi_file down by half).
        self.digests: bytearray | None = None if keep or minted else bytearray()
        self.collapsed: list[int] = []
        self.error: InvalidEntryError | None = None
        self.check_error: InvalidInputError | None = None
        self.last_id: str | None = None
        self.last_line = 0
        self.last_was_collapsed = False
        self.previous_id: str | None = None

    def add(self, lineno: int, value: dict[str, Any]) -> bool:
        """Check the next entry; True if it is one of the file's entries (not a repeat)."""
        if self.error is not None:
            return False  # the first refusal is the one reported; the rest is moot
        index = len(self.lines)
        try:
            validate_entry(value, index)
        except InvalidEntryError as exc:
            self.error = _at_line(lineno, exc)
            return False
        entry_id = value["id"]
        self.last_id, self.last_line = entry_id, lineno
        index_by_id = self.index_by_id
        earlier = index_by_id.get(entry_id)
        self.last_was_collapsed = earlier is not None
        digests = self.digests
        digest = _digest(value) if digests is not None else b""
        if earlier is not None:
            if self._earlier_digest(earlier) == (digest or _digest(value)):
                # pi's re-append quirk writes the same entries again: keep one copy.
                self.collapsed.append(lineno)
                return False
            self.error = InvalidEntryError(
                f"line {lineno}: duplicate entry id {entry_id!r} with different content "
                f"(first on line {self.lines[earlier]}; pi would let the later one shadow it)",
                index=index,
                entry_id=entry_id,
            )
            return False
        index_by_id[entry_id] = index
        if digests is not None:
            digests += digest
        if self.entries is not None:
            self.entries.append(value)  # the entries' own parentIds serve the checks below
        else:
            parent = value.get("parentId")
            if parent == self.previous_id:
                parent = self.previous_id  # nearly always: one string object instead of two
            self.parents.append(parent)
        self.lines.append(lineno)
        self.previous_id = entry_id
        if self.entry_check is not None and self.check_error is None:
            try:
                self.entry_check(value, lineno)
            except InvalidInputError as exc:
                self.check_error = exc
        return True

    def _earlier_digest(self, index: int) -> bytes | None:
        if self.digests is not None:
            return bytes(self.digests[index * _DIGEST_SIZE : (index + 1) * _DIGEST_SIZE])
        if self.entries is not None:
            return _digest(self.entries[index])
        return None  # minted ids never repeat

    def finish(self) -> tuple[int, str, str] | None:
        """Raise the first refusal; else return the first forward parent (see PiScan)."""
        if self.error is not None:
            raise self.error
        if self.last_was_collapsed and self.last_id != self.previous_id:
            # pi's leaf is the id of the last line; if that line repeats an earlier entry, our
            # leaf (the last distinct entry) would not be pi's.
            raise InvalidEntryError(
                f"line {self.last_line}: the file ends with a repeat of entry {self.last_id!r}, "
                "which would make an earlier entry pi's leaf",
                entry_id=self.last_id,
            )
        forward = None
        if not self.minted:
            ids = list(self.index_by_id)
            entries = self.entries
            if entries is not None:
                parents: list[Any] = [entry.get("parentId") for entry in entries]
                by_id: Mapping[str, Mapping[str, Any]] = dict(zip(ids, entries))
                order: Sequence[Mapping[str, Any]] = entries
            else:
                parents = self.parents
                by_id, order = _LinkMap(self.index_by_id, parents), _Links(ids, parents)
            try:
                check_acyclic(by_id, order)
            except InvalidEntryError as exc:
                line = self.lines[exc.index] if exc.index is not None else 0
                raise _at_line(line, exc) from None
            forward = self._first_forward_parent(ids, parents)
        if self.check_error is not None:
            raise self.check_error
        return forward

    def _first_forward_parent(
        self, ids: list[str], parents: list[Any]
    ) -> tuple[int, str, str] | None:
        index_by_id = self.index_by_id
        for index, parent in enumerate(parents):
            if parent:
                where = index_by_id.get(parent)
                if where is not None and where > index:
                    return self.lines[index], ids[index], parent
        return None


def _at_line(lineno: int, exc: InvalidEntryError) -> InvalidEntryError:
    return InvalidEntryError(
        f"line {lineno}: {_strip_where(exc)}", index=exc.index, entry_id=exc.entry_id
    )


def _strip_where(exc: InvalidEntryError) -> str:
    # InvalidEntryError prefixes "entry N (id X): "; keep only the reason when re-wrapping.
    text = str(exc)
    head, sep, tail = text.partition(": ")
    return tail if sep and head.startswith("entry ") else text


def _link(entry_id: str, parent: Any) -> dict[str, Any]:
    return {"id": entry_id, "parentId": parent}


class _LinkMap(Mapping[str, Mapping[str, Any]]):
    """id -> ``{"id", "parentId"}`` built on demand: what check_acyclic reads of an entry."""

    __slots__ = ("_index", "_parents")

    def __init__(self, index_by_id: dict[str, int], parents: list[Any]) -> None:
        self._index = index_by_id
        self._parents = parents

    def __getitem__(self, key: str) -> Mapping[str, Any]:
        return _link(key, self._parents[self._index[key]])

    def get(self, key: str, default: Any = None) -> Any:  # check_acyclic's hot path
        where = self._index.get(key)
        return default if where is None else _link(key, self._parents[where])

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


class _Links(Sequence[Mapping[str, Any]]):
    """The entries in file order as ``{"id", "parentId"}``, built on demand."""

    __slots__ = ("_ids", "_parents")

    def __init__(self, ids: list[str], parents: list[Any]) -> None:
        self._ids = ids
        self._parents = parents

    @overload
    def __getitem__(self, index: int) -> Mapping[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Mapping[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return _Links(self._ids[index], self._parents[index])
        return _link(self._ids[index], self._parents[index])

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        return map(_link, self._ids, self._parents)

    def __len__(self) -> int:
        return len(self._ids)


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
    #: further down the file. pi and :class:`~store.session.Session` accept that; a store
    #: that needs parents first (sessionstore's) refuses it.
    forward_parent: tuple[int, str, str] | None = None
    _ids: dict[str, int] = field(default_factory=dict, repr=False)
    _plan: _Plan | None = field(default=None, repr=False)
    _source: _Replay | None = field(default=None, repr=False)

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
        if self.header is None:
            raise InvalidEntryError(f"not a pi session file: {self.empty_reason}", index=0)
        return self.header

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
    replay = _replay(source)
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
    parser = _Parser(hashing=False)
    count = 0
    for _, entry in _final_entries(scan._plan, parser.values(scan._source.lines())):
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
    return _read(_Once(_iter_items(lines)))


def read_pi_file(source: PiSource) -> PiFile:
    """Parse a pi session file from a path, its content, or a readable stream.

    ``source`` is: a :class:`os.PathLike` (a path); ``bytes``/``bytearray`` (the content); an
    object with ``read()`` (a stream, read in 1 MiB chunks); or a ``str``, which is taken as the
    content if it contains a newline or its first non-blank character is ``{``, and as a path
    otherwise (pass a :class:`pathlib.Path` to be explicit). Files are read once, in binary
    mode, line by line, so memory holds the parsed values, not the text. For files too large
    for that, use :func:`scan_pi_file` and :func:`iter_pi_entries`.
    """
    return _read(_Once(_lines_once(source)))


def _read(lines: _Replay) -> PiFile:
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
    source: _Replay, *, keep: bool, entry_check: EntryCheck | None
) -> tuple[PiScan, list[dict[str, Any]]]:
    """Pass 1, shared by every reader: parse, migrate as far as the file allows, check.

    ``keep``: also return the entries (one read, values kept: :func:`read_pi_file`);
    otherwise keep only bookkeeping and re-read ``source`` where needed.
    """
    parser = _Parser()
    plan = _Plan()
    migration = PiMigration(None)
    checker = _Checker(entry_check, minted=False, keep=keep)
    dropped: list[int] = []
    # v1 files: ids depend on the hash of the whole file, so this first read only notes what
    # the migration needs; the entries are checked in a second walk, once ids are minted.
    v1_values: list[tuple[int, Any]] = []
    values = parser.values(source.lines())
    first = next(values, None)  # the header, if the file has one
    header: dict[str, Any] | None = None if first is None else first[1]
    position = 0
    if header is not None:
        migration = _migrate_header(header)
        plan.v1 = "v1->v2" in migration.steps
        plan.v2_to_v3 = "v2->v3" in migration.steps
    if plan.v1:
        checker = _Checker(entry_check, minted=True, keep=keep)
        if keep and first is not None:
            v1_values.append(first)
        wanted: set[int] = set()
        for position, (lineno, value) in enumerate(values, 1):
            if keep:
                v1_values.append((lineno, value))
            is_session = value.get("type") == "session"
            if is_session:
                dropped.append(lineno)
                plan.session_positions.append(position)
            if position in wanted:
                plan.forward_ids[position] = _NO_TARGET if is_session else value.get("id", _MISSING)
            target = None if is_session else _wanted_forward(value, position)
            if target is not None:
                wanted.add(target)
    else:
        add = checker.add
        for lineno, value in values:
            if value.get("type") == "session":
                dropped.append(lineno)
                continue
            if plan.v2_to_v3:
                _migrate_v2_entry(value)
            add(lineno, value)

    content_hash = parser.hasher.digest() if parser.hasher is not None else b""
    if parser.header_state != "ok" or header is None:
        empty = PiScan(
            header=None,
            migration=PiMigration(None),
            empty_reason=parser.header_state or "no parseable line",
            skipped_lines=tuple(parser.skipped),
            content_hash=content_hash.hex(),
            _source=source,
        )
        return empty, []

    if plan.v1:
        plan.minted = _mint_ids(content_hash, position + 1, plan.session_positions)
        walk = v1_values if keep else _Parser(hashing=False).values(source.lines())
        for lineno, entry in _final_entries(plan, walk):
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


# --- writing -----------------------------------------------------------------------------------


def export_pi_bytes(
    header: Mapping[str, Any], entries: Iterable[Mapping[str, Any]]
) -> Iterator[bytes]:
    """A v3 pi file as pi writes it: one ``JSON.stringify`` line per value, ``\\n``-terminated,
    header first. Raises :class:`InvalidEntryError` for values JSON cannot hold."""
    if not isinstance(header, Mapping):
        raise InvalidEntryError("the session header must be a JSON object", index=0)
    yield dumps_js(dict(header)) + b"\n"
    for index, entry in enumerate(entries):
        try:
            yield dumps_js(entry) + b"\n"
        except InvalidEntryError as exc:
            raise InvalidEntryError(str(exc), index=index, entry_id=_entry_id(entry)) from None


def export_pi_lines(
    header: Mapping[str, Any], entries: Iterable[Mapping[str, Any]]
) -> Iterator[str]:
    """:func:`export_pi_bytes` as ``str`` lines (each ending in ``\\n``)."""
    for line in export_pi_bytes(header, entries):
        yield line.decode("utf-8")


def _entry_id(entry: Any) -> Any:
    return entry.get("id") if isinstance(entry, Mapping) else None
