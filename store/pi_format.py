"""pi session files (JSONL, format v3) in and out.

Reading follows ``SessionManager.open()`` of ``@mariozechner/pi-coding-agent`` 0.73.1 (see
``shared/fixtures/pi/SPEC.md`` §1-§3): blank and unparseable lines are skipped, the first
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

Reading streams: lines are parsed one at a time and only the parsed values are kept.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from array import array
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import IO, Any, Final

import orjson

from store.errors import InvalidEntryError
from store.session import (
    JS_WHITESPACE,
    Session,
    check_acyclic,
    js_to_string,
    js_trim,
    validate_entry,
)

__all__ = [
    "PiFile",
    "PiMigration",
    "dumps_js",
    "export_pi_bytes",
    "export_pi_lines",
    "js_number_to_string",
    "js_to_number",
    "mint_id",
    "normalize_js_value",
    "parse_pi_lines",
    "read_pi_file",
]

CURRENT_VERSION: Final = 3
_MAX_SAFE_INT: Final = 2**53
_I64_MIN: Final = -(2**63)
_U64_MAX: Final = 2**64 - 1
_MISSING: Final = object()
_READ_CHUNK: Final = 1 << 20

# JS JSON.stringify and orjson agree on every string escape (short escapes for \b \t \n \f \r,
# lowercase \u00XX for other C0 controls, DEL and U+2028/U+2029 raw, no "/" escape, raw
# non-ASCII); tests/test_pi_fixtures.py checks this. They differ only in number formatting.


# --- JavaScript numbers ------------------------------------------------------------------------


class _Unholdable(ValueError):
    """A value JSON.parse accepts but the store refuses: a number JavaScript holds as Infinity
    (``1e400``) or a string with a lone surrogate (``"\\ud800"``)."""


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


_SURROGATE = re.compile("[\ud800-\udfff]")


def _normalize_in_place(root: Any, *, check_surrogates: bool = False) -> Any:
    """Make a freshly parsed value hold what JSON.parse would hold. Mutates containers.

    Iterative, so that nesting depth is no problem. ``check_surrogates`` refuses lone
    surrogates (only the slow parser can produce them).
    """
    if type(root) is not dict and type(root) is not list:
        return _normalize_scalar(root, check_surrogates)
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
                    if check_surrogates and _SURROGATE.search(value):
                        raise _Unholdable("lone surrogate in a string")
                elif kind is dict or kind is list:
                    push(value)
                elif kind is int:
                    if not -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT:
                        container[key] = _canonical_int(value)
                elif kind is float:
                    container[key] = _canonical_float(value)
            if check_surrogates and any(_SURROGATE.search(k) for k in container):
                raise _Unholdable("lone surrogate in a key")
            order = _js_key_order(container) if digit_key else None
            if order is not None:
                items = [(k, container[k]) for k in order]
                container.clear()
                container.update(items)
        else:
            for position, value in enumerate(container):
                kind = type(value)
                if kind is str:
                    if check_surrogates and _SURROGATE.search(value):
                        raise _Unholdable("lone surrogate in a string")
                elif kind is dict or kind is list:
                    push(value)
                elif kind is int:
                    if not -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT:
                        container[position] = _canonical_int(value)
                elif kind is float:
                    container[position] = _canonical_float(value)
    return root


def _normalize_scalar(value: Any, check_surrogates: bool) -> Any:
    kind = type(value)
    if kind is int and not -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT:
        return _canonical_int(value)
    if kind is float:
        return _canonical_float(value)
    if kind is str and check_surrogates and _SURROGATE.search(value):
        raise _Unholdable("lone surrogate in a string")
    return value


def normalize_js_value(value: Any) -> Any:
    """A deep copy of a JSON-like value holding what ``JSON.parse(JSON.stringify(value))`` holds.

    Raises :class:`InvalidEntryError` for NaN, infinities, lone surrogates and non-JSON types.
    """
    try:
        return _normalize_in_place(_deep_copy(value), check_surrogates=True)
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
        fixed = _normalize_in_place(_deep_copy(value), check_surrogates=False)
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

    Raises :class:`InvalidEntryError` for what JSON cannot hold faithfully (NaN, infinities,
    lone surrogates, non-string keys, non-JSON types).
    """
    prepared = _prepare_export(value)
    try:
        return orjson.dumps(prepared)
    except (orjson.JSONEncodeError, TypeError) as exc:
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


def _iter_stream(stream: IO[bytes] | IO[str]) -> Iterator[bytes | str]:
    """Lines of a readable stream, split on "\\n" only, whatever the read chunks are."""
    pending: list[Any] = []
    while True:
        chunk = stream.read(_READ_CHUNK)
        if not chunk:
            break
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


class _Parser:
    """State of one streaming parse (kept in one place so the loop stays readable)."""

    def __init__(self) -> None:
        self.hasher = hashlib.sha256()
        self.values: list[Any] = []
        self.value_lines = array("Q")
        self.skipped: list[int] = []
        self.header_state: str | None = None  # None: undecided, "ok", or an empty-reason
        self.entry_count = 0  # values after the header that are not later headers
        self.seen_nonblank = False
        # A last line that parses only once trailing JS whitespace (NBSP, U+2028, ...) is gone:
        # pi's content.trim() makes that work for the LAST non-blank line only.
        self.tail: tuple[int, Any, bytes] | None = None

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
        if isinstance(raw, bytes):
            digest_bytes = raw.strip(b" \t\r")
        else:
            digest_bytes = raw.strip(" \t\r").encode("utf-8")
        return self._accept(lineno, value, digest_bytes, check_surrogates=False)

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
        return self._accept(lineno, value, _encode(text.strip(" \t\r")), check_surrogates=True)

    def finish(self) -> None:
        if self.tail is not None:
            lineno, value, digest_bytes = self.tail
            self.tail = None
            self._accept(lineno, value, digest_bytes, check_surrogates=True)

    def _accept(
        self, lineno: int, value: Any, digest_bytes: bytes, *, check_surrogates: bool
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
            _normalize_in_place(value, check_surrogates=check_surrogates)
        except _Unholdable as exc:
            index = self.entry_count - 1 if len(self.values) else None
            raise InvalidEntryError(f"line {lineno}: {exc}", index=index) from exc
        self.hasher.update(digest_bytes)
        self.hasher.update(b"\n")
        self.values.append(value)
        self.value_lines.append(lineno)
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


def _migrate(values: list[dict[str, Any]], content_hash: bytes) -> PiMigration:
    """pi's migrateToCurrentVersion, in place (SPEC §3), with deterministic minted ids."""
    header = values[0]
    raw_version = header.get("version", _MISSING)
    header_version = None if raw_version is _MISSING else raw_version
    # `header.version ?? 1`, then JS relational comparisons (a string "2" compares as 2,
    # something non-numeric as NaN, for which every comparison is false).
    version = 1.0 if raw_version is _MISSING or raw_version is None else js_to_number(raw_version)
    if version >= CURRENT_VERSION:
        return PiMigration(header_version)
    steps: list[str] = []
    ids_minted = False
    if version < 2:
        _migrate_v1_to_v2(values, content_hash)
        steps.append("v1->v2")
        ids_minted = True
    if version < 3:
        for value in values:
            if value.get("type") == "session":
                value["version"] = 3
            elif value.get("type") == "message":
                message = value.get("message")
                if isinstance(message, dict) and message.get("role") == "hookMessage":
                    message["role"] = "custom"
        steps.append("v2->v3")
    # A NaN version migrates nothing, but pi still reports a migration and rewrites the file.
    return PiMigration(header_version, tuple(steps), rewritten=True, ids_minted=ids_minted)


def _migrate_v1_to_v2(values: list[dict[str, Any]], content_hash: bytes) -> None:
    minted: set[str] = set()
    previous: str | None = None
    count = len(values)
    for position, value in enumerate(values):
        if value.get("type") == "session":
            value["version"] = 2
            continue
        attempt = 0
        new_id = mint_id(content_hash, position)
        while new_id in minted:
            attempt += 1
            new_id = mint_id(content_hash, position, attempt)
        minted.add(new_id)
        # Replaces any existing id: a tree without `version` is flattened into one chain.
        value["id"] = new_id
        value["parentId"] = previous
        previous = new_id
        if value.get("type") == "compaction":
            index = value.get("firstKeptEntryIndex", _MISSING)
            if isinstance(index, (int, float)) and not isinstance(index, bool):
                # entries[index] counts every parsed value, header included; JS gives undefined
                # for a fractional, negative or out-of-range index.
                target = (
                    values[int(index)] if float(index).is_integer() and 0 <= index < count else None
                )
                if target is not None and target.get("type") != "session":
                    # The target's id "as of that moment": minted if it came earlier, its old
                    # id (or undefined, which JSON drops) if it comes later.
                    target_id = target.get("id", _MISSING)
                    if target_id is _MISSING:
                        value.pop("firstKeptEntryId", None)
                    else:
                        value["firstKeptEntryId"] = target_id
                del value["firstKeptEntryIndex"]


def parse_pi_lines(lines: Iterable[bytes | bytearray | memoryview | str]) -> PiFile:
    """Parse a pi session file given as lines (bytes or str; a trailing "\\n" is optional).

    Each item must be one or more complete lines (items are split on "\\n" only, never on
    U+2028, U+0085 or a lone "\\r"). Use :func:`read_pi_file` for paths, bytes and streams.
    Raises :class:`InvalidEntryError` for what the store cannot hold (see module docs).
    """
    return _parse(_iter_items(lines))


def read_pi_file(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview | IO[bytes] | IO[str],
) -> PiFile:
    """Parse a pi session file from a path, its content, or a readable stream.

    ``source`` is: a :class:`os.PathLike` (a path); ``bytes``/``bytearray`` (the content); an
    object with ``read()`` (a stream, read in 1 MiB chunks); or a ``str``, which is taken as the
    content if it contains a newline or its first non-blank character is ``{``, and as a path
    otherwise (pass a :class:`pathlib.Path` to be explicit). Files are read in binary mode and
    streamed line by line, so memory holds the parsed values, not the text.
    """
    if isinstance(source, os.PathLike) or (isinstance(source, str) and _looks_like_path(source)):
        with open(source, "rb") as handle:
            # Binary file iteration splits on b"\n" only: each line is complete.
            return _parse(line[:-1] if line.endswith(b"\n") else line for line in handle)
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        return _parse(_iter_split(data, b"\n"))
    if isinstance(source, str):
        return _parse(_iter_split(source, "\n"))
    if hasattr(source, "read"):
        return _parse(_iter_stream(source))
    raise TypeError(f"cannot read a pi file from {type(source).__name__}")


def _looks_like_path(text: str) -> bool:
    return "\n" not in text and not _js_lstrip(text).startswith("{") and text != ""


def _parse(raw_lines: Iterable[bytes | str]) -> PiFile:
    parser = _Parser()
    for lineno, raw in enumerate(raw_lines, 1):
        if not parser.feed(lineno, raw):
            break
    else:
        parser.finish()

    content_hash = parser.hasher.digest()
    if parser.header_state != "ok":
        return PiFile(
            header=None,
            entries=[],
            migration=PiMigration(None),
            empty_reason=parser.header_state or "no parseable line",
            skipped_lines=tuple(parser.skipped),
            content_hash=content_hash.hex(),
        )

    values: list[dict[str, Any]] = parser.values
    migration = _migrate(values, content_hash)
    header = values[0]

    entries: list[dict[str, Any]] = []
    entry_lines: list[int] = []
    dropped: list[int] = []
    collapsed: list[int] = []
    position_by_id: dict[str, int] = {}
    last_was_collapsed = False
    last_id: str | None = None
    last_line = 0
    for value, line in zip(values[1:], parser.value_lines[1:]):
        if value.get("type") == "session":
            dropped.append(line)  # pi: getEntries() filters every type:"session" value
            continue
        try:
            validate_entry(value, len(entries))
        except InvalidEntryError as exc:
            raise InvalidEntryError(
                f"line {line}: {_strip_where(exc)}", index=exc.index, entry_id=exc.entry_id
            ) from None
        entry_id = value["id"]
        last_id, last_line = entry_id, line
        earlier = position_by_id.get(entry_id)
        last_was_collapsed = earlier is not None
        if earlier is not None:
            if dumps_js(entries[earlier]) == dumps_js(value):
                # pi's re-append quirk writes the same entries again: keep one copy.
                collapsed.append(line)
                continue
            raise InvalidEntryError(
                f"line {line}: duplicate entry id {entry_id!r} with different content "
                f"(first on line {entry_lines[earlier]}; pi would let the later one shadow it)",
                index=len(entries),
                entry_id=entry_id,
            )
        position_by_id[entry_id] = len(entries)
        entries.append(value)
        entry_lines.append(line)

    if last_was_collapsed and last_id != entries[-1]["id"]:
        # pi's leaf is the id of the last line; if that line repeats an earlier entry, our
        # leaf (the last distinct entry) would not be pi's.
        raise InvalidEntryError(
            f"line {last_line}: the file ends with a repeat of entry {last_id!r}, "
            "which would make an earlier entry pi's leaf",
            entry_id=last_id,
        )

    by_id = {entry["id"]: entry for entry in entries}
    try:
        check_acyclic(by_id, entries)
    except InvalidEntryError as exc:
        line = entry_lines[exc.index] if exc.index is not None else 0
        raise InvalidEntryError(
            f"line {line}: {_strip_where(exc)}", index=exc.index, entry_id=exc.entry_id
        ) from None

    return PiFile(
        header=header,
        entries=entries,
        migration=migration,
        skipped_lines=tuple(parser.skipped),
        dropped_headers=tuple(dropped),
        collapsed_duplicates=tuple(collapsed),
        content_hash=content_hash.hex(),
        entry_lines=tuple(entry_lines),
    )


def _strip_where(exc: InvalidEntryError) -> str:
    # InvalidEntryError prefixes "entry N (id X): "; keep only the reason when re-wrapping.
    text = str(exc)
    head, sep, tail = text.partition(": ")
    return tail if sep and head.startswith("entry ") else text


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
