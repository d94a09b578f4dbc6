"""Writing pi session files: v3 JSONL as pi writes it, ``JSON.stringify`` byte for byte.

No spaces, non-ASCII and U+2028 raw, JS number formatting, lone surrogates as ``\\udXXX``
escapes (:func:`store.model.js_json.dumps_js`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from store.errors import InvalidEntryError
from store.model.js_json import dumps_js

__all__ = ["export_pi_bytes", "export_pi_lines"]


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
