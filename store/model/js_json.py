"""JSON as JavaScript reads and writes it: ``JSON.parse`` values and ``JSON.stringify`` bytes.

Values are held the way JavaScript holds them after ``JSON.parse``: integers beyond 2**53 are
rounded like doubles (``18446744073709551616`` becomes ``18446744073709552000``), integral
floats are ints (``1.0`` -> ``1``, ``-0`` -> ``0``), and all-digit object keys come first, in
numeric order, as in a JS object (:func:`normalize_js_value`, :func:`normalize_in_place`).
:func:`dumps_js` is ``JSON.stringify`` byte for byte: no spaces, non-ASCII and U+2028 raw, JS
number formatting.

Strings may hold lone UTF-16 surrogates (JavaScript writes ``"\\ud83d"`` when a tool's output is
cut inside an emoji, and pi reads it back). orjson refuses them both ways, so
:func:`encode_json` writes them as ``JSON.stringify`` does (lowercase ``\\udXXX`` escapes) and
:func:`decode_json` reads such text with the standard library's parser: orjson stays on the
path of every other value.

Pure: no I/O; of the store, only its errors.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any, Final

import orjson

from store.errors import InvalidEntryError
from store.model.js import js_number_to_string

__all__ = [
    "Unholdable",
    "decode_json",
    "dumps_js",
    "encode_json",
    "normalize_in_place",
    "normalize_js_value",
    "reject_constant",
]

_MAX_SAFE_INT: Final = 2**53
_I64_MIN: Final = -(2**63)
_U64_MAX: Final = 2**64 - 1

# JS JSON.stringify and orjson agree on every string escape (short escapes for \b \t \n \f \r,
# lowercase \u00XX for other C0 controls, DEL and U+2028/U+2029 raw, no "/" escape, raw
# non-ASCII); tests/test_pi_fixtures.py checks this. orjson refuses lone surrogates, which
# encode_json writes as JSON.stringify does (\ud83d); otherwise the two differ only in number
# formatting.


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


def reject_constant(name: str) -> Any:
    """``parse_constant`` of a :class:`json.JSONDecoder` that, like ``JSON.parse``, refuses
    ``NaN``, ``Infinity`` and ``-Infinity``."""
    raise ValueError(f"{name} is not JSON")


_ESCAPE_DECODER = json.JSONDecoder(parse_constant=reject_constant)


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


# --- JavaScript numbers and objects -------------------------------------------------------------


class Unholdable(ValueError):
    """A value JSON.parse accepts but the store refuses: a number JavaScript holds as Infinity
    (``1e400``)."""


def _canonical_float(value: float) -> int | float:
    if not math.isfinite(value):
        raise Unholdable(f"number {value!r} is not finite")
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
        raise Unholdable("integer too large for a double") from exc
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


def _join_pairs(text: str) -> str:
    """``text`` as JavaScript holds it: a surrogate pair given as two code points is the one
    character (lone surrogates stay, as JS strings keep them)."""
    if not _SPLIT_PAIR.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def normalize_in_place(root: Any, *, strings: bool = False) -> Any:
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
        return normalize_in_place(_deep_copy(value), strings=True)
    except Unholdable as exc:
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
        fixed = normalize_in_place(_deep_copy(value))
    except Unholdable as exc:
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
