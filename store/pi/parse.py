"""Parsing a pi file's lines as pi does: ``JSON.parse`` of each line, then the header rule.

Follows ``SessionManager.open()`` of ``@mariozechner/pi-coding-agent`` 0.73.1 (see
``tests/fixtures/pi/SPEC.md`` §1-§2): blank and unparseable lines are skipped (and reported),
the first parsed value must be a session header with a string id, and the last non-blank line
may end in JavaScript whitespace (pi trims the whole content). Parsed values are normalised to
what ``JSON.parse`` holds (:func:`store.model.js_json.normalize_in_place`). The SHA-256 of the
parsed lines seeds the ids the v1 migration mints.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from store.errors import InvalidEntryError
from store.model.js import MISSING, js_trim, js_trim_end, js_trim_start
from store.model.js_json import Unholdable, normalize_in_place, reject_constant

__all__ = ["Parser"]


def _parse_int_js(text: str) -> int | float:
    # Python refuses to convert more than 4300 digits; JS reads them as a (possibly infinite)
    # double, which we then refuse as a typed error rather than skip as malformed.
    return int(text) if len(text) <= 400 else float(text)


_SLOW_DECODER = json.JSONDecoder(parse_constant=reject_constant, parse_int=_parse_int_js)


class _TooDeep(ValueError):
    """Valid JSON nested deeper than Python's parsers go (JSON.parse in V8 has no such limit)."""


def _slow_parse(text: str) -> Any:
    """``JSON.parse`` of a line orjson refused (lone surrogate escapes, nesting beyond orjson's
    1024 levels). Returns MISSING if JSON.parse would throw too."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        value, end = _SLOW_DECODER.raw_decode(text, _skip_json_ws(text, 0))
    except json.JSONDecodeError:
        return MISSING
    except RecursionError as exc:
        raise _TooDeep("JSON nested too deeply to parse") from exc
    if _skip_json_ws(text, end) != len(text):
        return MISSING
    return value


def _skip_json_ws(text: str, position: int) -> int:
    length = len(text)
    while position < length and text[position] in " \t\n\r":
        position += 1
    return position


class Parser:
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
            text = js_trim_start(text)
        self.seen_nonblank = True
        try:
            value = _slow_parse(text)
            if value is MISSING:
                trimmed = js_trim_end(text)
                if trimmed != text:
                    value = _slow_parse(trimmed)
                    if value is not MISSING:
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
            normalize_in_place(value, strings=slow)
        except Unholdable as exc:
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
