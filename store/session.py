"""The pure session model: an immutable snapshot of one session, read the way pi reads it.

A :class:`Session` is built from the session header (pi's header object, kept verbatim) and the
entries in commit order (for an imported pi file: file order). Everything here mirrors
``SessionManager`` of ``@mariozechner/pi-coding-agent`` 0.73.1 (see
``tests/fixtures/pi/SPEC.md`` §5-§7 and §9) except where a pi behaviour would hang or crash:

* entries that pi itself cannot handle are refused up front with :class:`InvalidEntryError`
  (non-objects, missing or empty ids, duplicate ids, parent cycles, ``message`` that is not an
  object, ...), so that no walk can loop forever and no context build can crash later;
* ``redaction`` entries (a sessionstore extension, unknown to pi) hide the content of their
  target: see :class:`Session`.

JavaScript semantics that the results depend on are reproduced on purpose: ``String.trim``
(:func:`js_trim`), ``new Date(x).getTime()`` (:func:`js_date_ms`), JS truthiness of labels, and
the stable tree sort whose comparator may return NaN.

Nothing in this module does I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

from store.errors import EntryNotFoundError, InvalidEntryError, InvalidInputError

__all__ = [
    "JS_WHITESPACE",
    "REDACTION_TYPE",
    "Session",
    "TreeNode",
    "branch_path",
    "build_session_context",
    "check_acyclic",
    "is_tombstone",
    "js_date_ms",
    "js_to_string",
    "js_trim",
    "js_truthy",
    "redaction_tombstone",
    "validate_entry",
]

Entry = dict[str, Any]

#: The entry type that hides another entry's content (a sessionstore extension; pi ignores it).
REDACTION_TYPE: Final = "redaction"

# pi's key order for the fields a tombstone keeps.
_TOMBSTONE_KEYS: Final = ("type", "id", "parentId", "timestamp")

_MISSING: Final = object()

# ECMAScript WhiteSpace + LineTerminator: what String.prototype.trim removes. Not the same set
# as Python's str.strip() (which also strips U+001C-U+001F and U+0085, and misses U+FEFF).
JS_WHITESPACE: Final = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)


def js_trim(text: str) -> str:
    """``String.prototype.trim``."""
    return text.strip(JS_WHITESPACE)


def js_truthy(value: Any) -> bool:
    """JavaScript truthiness of a JSON value (``""``, ``0``, ``null`` and NaN are falsy; ``[]`` is not)."""
    if value is None or value is _MISSING:
        return False
    if value is True or value is False:
        return bool(value)
    if isinstance(value, (int, float)):
        return value != 0 and not math.isnan(value)
    if isinstance(value, str):
        return value != ""
    return True


def _js_number_to_string(value: float) -> str:
    # Imported lazily: pi_format depends on this module, not the other way round.
    from store.pi_format import js_number_to_string

    return js_number_to_string(value)


def js_to_string(value: Any) -> str:
    """``String(value)`` for a JSON value (arrays join their elements with ``,``)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return _js_number_to_string(float(value)) if abs(value) > 2**53 else str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        return _js_number_to_string(value)
    if isinstance(value, (list, tuple)):
        # Array.prototype.join: null and undefined elements become "".
        return ",".join("" if item is None else js_to_string(item) for item in value)
    return "[object Object]"


# --- new Date(x).getTime() ---------------------------------------------------------------------

_MS_PER_DAY: Final = 86_400_000
_MAX_TIME: Final = 8.64e15

# The canonical toISOString() shape: almost every timestamp pi writes, so it gets a fast path.
_ISO_FAST = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})\.(\d{3})Z\Z", re.ASCII)

# V8's ES5 date-time parser (DateParser::ParseES5DateTime): YYYY or ±YYYYYY, optional -MM and
# -DD, optional THH:mm[:ss[.fraction]] and Z or ±hh:mm / ±hhmm. Keywords are case-insensitive.
_ISO_FULL = re.compile(
    r"""
    (?:(?P<sign>[+-])(?P<ey>\d{6})|(?P<y>\d{4}))
    (?:-(?P<mo>\d{2})(?:-(?P<d>\d{2}))?)?
    (?:[Tt]
        (?P<h>\d{2}):(?P<mi>\d{2})
        (?::(?P<s>\d{2})(?:\.(?P<f>\d+))?)?
        (?P<tz>[Zz]|[+-]\d{2}:?\d{2})?
    )?
    \Z
    """,
    re.VERBOSE | re.ASCII,  # \d must not match non-ASCII digits, which V8 rejects
)


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date; ``day`` may overflow the month."""
    y = year - (month <= 2)
    era = y // 400  # floor division: no C-style correction needed for negative years
    yoe = y - era * 400
    mp = (month + 9) % 12
    doy = (153 * mp + 2) // 5
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    # Adding (day - 1) after the month start reproduces MakeDay's overflow (Feb 30 -> Mar 2).
    return era * 146097 + doe - 719468 + (day - 1)


def _time_clip(ms: float) -> int | None:
    if not math.isfinite(ms) or abs(ms) > _MAX_TIME:
        return None
    return int(ms)  # ToIntegerOrInfinity truncates toward zero; -0 becomes 0


def _parse_date_string(text: str) -> int | None:
    m = _ISO_FAST.match(text)
    if m is not None:
        y, mo, d, h, mi, s, f = (int(g) for g in m.groups())
        if not (1 <= mo <= 12 and 1 <= d <= 31 and mi <= 59 and s <= 59):
            return None
        if h > 24 or (h == 24 and (mi or s or f)):
            return None
        days = _days_from_civil(y, mo, d)
        return _time_clip(days * _MS_PER_DAY + h * 3_600_000 + mi * 60_000 + s * 1000 + f)
    m = _ISO_FULL.match(text)
    if m is None:
        # V8 would hand the string to its legacy, locale- and time-zone-dependent parser
        # ("March 1, 2025", "2025/03/01 10:00", ...). We do not: such strings give NaN.
        return None
    if m["ey"] is not None:
        year = int(m["ey"])
        if m["sign"] == "-":
            if year == 0:
                return None  # "-000000" is explicitly invalid
            year = -year
    else:
        year = int(m["y"])
    month = int(m["mo"]) if m["mo"] else 1
    day = int(m["d"]) if m["d"] else 1
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    ms = 0
    offset_min = 0
    if m["h"] is not None:
        hour, minute = int(m["h"]), int(m["mi"])
        second = int(m["s"]) if m["s"] else 0
        # V8 reads the first three fraction digits (padding shorter ones) and ignores the rest.
        frac = int((m["f"] or "")[:3].ljust(3, "0"))
        if hour > 24 or minute > 59 or second > 59:
            return None
        if hour == 24 and (minute or second or frac):
            return None
        tz = m["tz"]
        if tz and tz not in ("Z", "z"):
            digits = tz[1:].replace(":", "")
            tz_h, tz_m = int(digits[:2]), int(digits[2:])
            if tz_h > 23 or tz_m > 59:
                return None
            offset_min = (tz_h * 60 + tz_m) * (1 if tz[0] == "+" else -1)
        # A date-time without offset is LOCAL time in JavaScript. pi's output depends on the
        # machine's time zone there; we use UTC so that results are reproducible.
        ms = hour * 3_600_000 + minute * 60_000 + second * 1000 + frac
    days = _days_from_civil(year, month, day)
    return _time_clip(days * _MS_PER_DAY + ms - offset_min * 60_000)


def js_date_ms(value: Any = _MISSING) -> int | None:
    """``new Date(value).getTime()`` for a JSON value; ``None`` stands for NaN.

    Call without argument for ``new Date(undefined)`` (a missing field), which is NaN, while
    ``null`` is 0. Strings follow V8's ISO parser; see the notes in ``docs/pi-format.md`` for
    the non-ISO strings V8's legacy parser accepts and this function does not.
    """
    if value is _MISSING:
        return None
    if value is None:
        return 0
    if value is True or value is False:
        return int(value)
    if isinstance(value, int) and abs(value) > _MAX_TIME:
        return None  # beyond TimeClip's range (and perhaps beyond a double)
    if isinstance(value, (int, float)):
        return _time_clip(float(value))
    if isinstance(value, str):
        return _parse_date_string(value)
    # Objects go through ToPrimitive: arrays become their joined string, objects
    # "[object Object]" (never a date).
    return _parse_date_string(js_to_string(value))


def _sort_key(entry: Mapping[str, Any]) -> float:
    ms = js_date_ms(entry.get("timestamp", _MISSING))
    # NaN keys make Python's timsort behave exactly like V8's timsort with the comparator
    # `a - b` returning NaN (both treat "not less than" alike; checked against node).
    return math.nan if ms is None else float(ms)


# --- validation --------------------------------------------------------------------------------


def validate_entry(entry: Any, index: int | None = None) -> None:
    """Refuse an entry that the session model (and so the store) cannot hold.

    Context-free checks only; cross-entry rules (unique ids, no parent cycles) are enforced by
    :class:`Session` and by the pi file parser. Raises :class:`InvalidEntryError`.

    Every rule here stands for an input on which pi either hangs, crashes, or gives the entry
    no identity (so that it could never be addressed, branched to or deduplicated).
    """
    if not isinstance(entry, dict):
        what = "null" if entry is None else type(entry).__name__
        raise InvalidEntryError(f"an entry must be a JSON object, not {what}", index=index)
    entry_id = entry.get("id", _MISSING)
    if not isinstance(entry_id, str):
        what = "missing" if entry_id is _MISSING else f"not a string ({entry_id!r})"
        raise InvalidEntryError(f"entry id is {what}", index=index)
    if entry_id == "":
        # pi treats "" as "no leaf" in some places and as a real key in others.
        raise InvalidEntryError("entry id is the empty string", index=index, entry_id=entry_id)
    parent_id = entry.get("parentId", None)
    if parent_id is not None and not isinstance(parent_id, str):
        raise InvalidEntryError(
            f"parentId must be a string or null, not {parent_id!r}", index=index, entry_id=entry_id
        )
    entry_type = entry.get("type", _MISSING)
    if entry_type == "session":
        raise InvalidEntryError(
            "a session header cannot be stored as an entry", index=index, entry_id=entry_id
        )
    if is_tombstone(entry):
        # A redacted entry whose content is gone (a compacted base): it keeps its type but none
        # of the fields that type needs, and the model gives it no effect at all.
        return
    if entry_type == "message" and not isinstance(entry.get("message"), dict):
        # pi's buildSessionContext reads entry.message.role and throws on null/undefined.
        raise InvalidEntryError(
            "a message entry needs a `message` object", index=index, entry_id=entry_id
        )
    if entry_type == "session_info":
        name = entry.get("name")
        if name is not None and not isinstance(name, str):
            # pi calls name.trim() and throws on anything but a string or nullish.
            raise InvalidEntryError(
                "session_info name must be a string", index=index, entry_id=entry_id
            )
    if entry_type == REDACTION_TYPE:
        target = entry.get("targetId")
        if not isinstance(target, str) or target == "":
            raise InvalidEntryError(
                "a redaction entry needs a non-empty string targetId",
                index=index,
                entry_id=entry_id,
            )
        if not isinstance(entry.get("reason"), str):
            raise InvalidEntryError(
                "a redaction entry needs a string reason", index=index, entry_id=entry_id
            )


def _label_key(target: Any, label_id: str) -> Hashable:
    """The key pi's label ``Map`` files ``target`` under (SameValueZero), as a dict key.

    A string is its own key: the only kind an entry id can look up. Other targets (pi keeps
    them, under keys no lookup reaches) get keys that no string equals: ``undefined`` (a
    missing targetId) and ``null`` differ, ``true`` is not ``1``, and each parsed object or
    array is a key of its own (JS compares them by identity), named by its label entry.
    """
    if type(target) is str:
        return target
    if target is _MISSING:
        return ("undefined",)
    if target is None:
        return ("null",)
    if target is True or target is False:
        return ("boolean", target)
    if isinstance(target, (int, float)):
        return ("number", target)  # 1 and 1.0 are one key, as in JS
    return ("object", label_id)


def check_acyclic(
    by_id: Mapping[str, Mapping[str, Any]], order: Sequence[Mapping[str, Any]]
) -> None:
    """Refuse parentId cycles (pi loops forever walking one; a self-parent is a cycle of one)."""
    # Each entry has at most one parent, so following parents from every entry once, and
    # remembering which entries are known to reach a root, is linear overall.
    done: set[str] = set()
    for position, start in enumerate(order):
        trail: list[str] = []
        on_trail: set[str] = set()
        current: Mapping[str, Any] | None = start
        while current is not None:
            cid = current["id"]
            if cid in done:
                break
            if cid in on_trail:
                raise InvalidEntryError(
                    f"parentId cycle through {cid!r} (pi would loop forever walking it)",
                    index=position,
                    entry_id=start["id"],
                )
            trail.append(cid)
            on_trail.add(cid)
            parent_id = current.get("parentId")
            current = by_id.get(parent_id) if parent_id else None
        done.update(trail)


# --- walks and context -------------------------------------------------------------------------


def branch_path(
    by_id: Mapping[str, Mapping[str, Any]], leaf_id: str | None
) -> list[Mapping[str, Any]]:
    """The entries from the root down to ``leaf_id`` (``getBranch``), root first.

    Follows ``parentId`` while it is truthy and known, exactly like pi; an unknown or falsy
    ``leaf_id`` gives ``[]``. Usable on any id -> entry mapping (the store uses it to fork).
    Unlike pi it cannot hang: a parent cycle raises :class:`InvalidEntryError`.
    """
    if not leaf_id:
        return []
    current = by_id.get(leaf_id)
    path: list[Mapping[str, Any]] = []
    # A path longer than the number of entries must revisit one: that is a cycle.
    budget = len(by_id)
    while current is not None:
        if budget == 0:
            raise InvalidEntryError(
                f"parentId cycle on the path from {leaf_id!r}", entry_id=leaf_id
            )
        budget -= 1
        path.append(current)
        parent_id = current.get("parentId")
        if not parent_id or not isinstance(parent_id, str):
            break
        current = by_id.get(parent_id)
    path.reverse()
    return path


def _timestamp_ms(entry: Mapping[str, Any]) -> int | None:
    return js_date_ms(entry.get("timestamp", _MISSING))


def _set_present(
    target: dict[str, Any], key: str, source: Mapping[str, Any], source_key: str
) -> None:
    # `undefined` properties vanish from JSON, so a missing source field must leave no key.
    value = source.get(source_key, _MISSING)
    if value is not _MISSING:
        target[key] = value


def _context_message(entry: Mapping[str, Any]) -> Any:
    """What pi's appendMessage() pushes for an entry, or _MISSING for nothing."""
    entry_type = entry.get("type")
    if entry_type == "message":
        return entry["message"]
    if entry_type == "custom_message":
        # createCustomMessage(): key order role, customType, content, display, details, timestamp.
        message: dict[str, Any] = {"role": "custom"}
        for key in ("customType", "content", "display", "details"):
            _set_present(message, key, entry, key)
        message["timestamp"] = _timestamp_ms(entry)
        return message
    if entry_type == "branch_summary" and js_truthy(entry.get("summary", _MISSING)):
        message = {"role": "branchSummary", "summary": entry["summary"]}
        _set_present(message, "fromId", entry, "fromId")
        message["timestamp"] = _timestamp_ms(entry)
        return message
    return _MISSING


def build_session_context(
    path: Sequence[Mapping[str, Any]], *, skip_ids: Iterable[str] | set[str] | frozenset[str] = ()
) -> dict[str, Any]:
    """pi's ``buildSessionContext`` over a root-first ``path`` -> ``{messages, thinkingLevel, model}``.

    An empty path gives pi's empty context (``resetLeaf()``). Entries whose id is in
    ``skip_ids`` (redacted entries) take part in the walk but have no effect at all. Messages
    of ``message`` entries are the entries' own objects: treat the result as read-only.
    ``thinkingLevel`` is absent when the deciding ``thinking_level_change`` has no value, and
    ``model`` may lack ``provider``/``modelId``, as JSON.stringify would show pi's result.
    """
    skip = skip_ids if isinstance(skip_ids, (set, frozenset)) else frozenset(skip_ids)
    thinking_level: Any = "off"
    model: dict[str, Any] | None = None
    compaction: Mapping[str, Any] | None = None
    compaction_index = -1
    for position, entry in enumerate(path):
        if skip and entry.get("id") in skip:
            continue
        entry_type = entry.get("type")
        if entry_type == "thinking_level_change":
            thinking_level = entry.get("thinkingLevel", _MISSING)
        elif entry_type == "model_change":
            model = {}
            _set_present(model, "provider", entry, "provider")
            _set_present(model, "modelId", entry, "modelId")
        elif entry_type == "message":
            message = entry.get("message")
            if not isinstance(message, dict):
                # pi throws a TypeError here (validate_entry keeps such entries out of sessions).
                raise InvalidEntryError(
                    "a message entry needs a `message` object", entry_id=entry.get("id")
                )
            if message.get("role") == "assistant":
                model = {}
                _set_present(model, "provider", message, "provider")
                _set_present(model, "modelId", message, "model")
        elif entry_type == "compaction":
            # Only the last compaction on the path counts.
            compaction = entry
            compaction_index = position

    messages: list[Any] = []

    def emit(entry: Mapping[str, Any]) -> None:
        if skip and entry.get("id") in skip:
            return
        message = _context_message(entry)
        if message is not _MISSING:
            messages.append(message)

    if compaction is None:
        for entry in path:
            emit(entry)
    else:
        summary: dict[str, Any] = {"role": "compactionSummary"}
        _set_present(summary, "summary", compaction, "summary")
        _set_present(summary, "tokensBefore", compaction, "tokensBefore")
        summary["timestamp"] = _timestamp_ms(compaction)
        messages.append(summary)
        first_kept = compaction.get("firstKeptEntryId", _MISSING)
        found = False
        for entry in path[:compaction_index]:
            # Strict equality: a missing or non-string firstKeptEntryId matches nothing, and
            # then nothing before the compaction is kept.
            if not found and isinstance(first_kept, str) and entry.get("id") == first_kept:
                found = True
            if found:
                emit(entry)
        for entry in path[compaction_index + 1 :]:
            emit(entry)

    result: dict[str, Any] = {"messages": messages}
    if thinking_level is not _MISSING:
        result["thinkingLevel"] = thinking_level
    result["model"] = model
    return result


# --- redaction ---------------------------------------------------------------------------------


def redaction_tombstone(entry: Mapping[str, Any], redaction: Mapping[str, Any]) -> Entry:
    """What is left of ``entry`` once ``redaction`` hides it."""
    tombstone: Entry = {key: entry[key] for key in _TOMBSTONE_KEYS if key in entry}
    tombstone["redacted"] = {"reason": redaction["reason"], "redactionId": redaction["id"]}
    return tombstone


def is_tombstone(entry: Mapping[str, Any]) -> bool:
    """Whether ``entry`` is a stored tombstone (the compactor writes them into bases).

    Only the exact shape :func:`redaction_tombstone` produces counts, so that an ordinary entry
    that happens to carry a ``redacted`` field is not mistaken for one.
    """
    marker = entry.get("redacted")
    return (
        isinstance(marker, dict)
        and isinstance(marker.get("reason"), str)
        and isinstance(marker.get("redactionId"), str)
        and len(marker) == 2
        and all(key in _TOMBSTONE_KEYS or key == "redacted" for key in entry)
    )


# --- the snapshot ------------------------------------------------------------------------------


@dataclass(slots=True)
class TreeNode:
    """One node of :meth:`Session.get_tree` (pi's ``SessionTreeNode``)."""

    entry: Entry
    children: list[TreeNode] = field(default_factory=list)
    #: The entry's label (always truthy), or None.
    label: Any = None
    #: The timestamp of the label entry that set :attr:`label`; may be None when that entry's
    #: timestamp was null or missing, so :attr:`label_timestamp_present` tells which.
    label_timestamp: Any = None
    #: Whether pi's node has a ``labelTimestamp`` at all (its label entry had a timestamp key).
    label_timestamp_present: bool = field(default=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """pi's node shape; ``label``/``labelTimestamp`` only when set (iterative, any depth)."""
        out = self._shallow()
        stack = [(self, out)]
        while stack:
            node, node_out = stack.pop()
            for child in node.children:
                child_out = child._shallow()
                node_out["children"].append(child_out)
                stack.append((child, child_out))
        return out

    def _shallow(self) -> dict[str, Any]:
        out: dict[str, Any] = {"entry": self.entry, "children": []}
        if self.label is not None:
            out["label"] = self.label
        if self.label_timestamp_present:
            out["labelTimestamp"] = self.label_timestamp
        return out


class Session:
    """An immutable snapshot of a session: pi's header plus its entries in commit order.

    The leaf is the id of the last entry, whatever its type (pi's leaf after re-opening a
    file, SPEC §5); a branch position that was never committed does not exist here.

    Redaction: an entry ``{"type": "redaction", "targetId": X, "reason": ...}`` replaces
    entry ``X`` in :attr:`entries` (and everywhere else) by a tombstone that keeps only
    ``type``, ``id``, ``parentId``, ``timestamp`` and ``"redacted": {"reason", "redactionId"}``.
    A redacted entry keeps its place in the tree but has no other effect: it emits nothing into
    the context, changes no model or thinking level, is no compaction, sets no label and no
    name. The redaction entry itself behaves like any unknown entry type (like a label: a tree
    node that emits nothing). A redaction whose target is unknown, or is itself a redaction,
    has no effect; the earliest redaction of an entry is the one reported in its tombstone.
    Entries that are stored as tombstones already (the compactor purges redacted content
    from bases) are recognised by their exact shape (:func:`is_tombstone`) and behave the same.

    Returned entries and messages are the snapshot's own dicts: treat them as read-only.

    Raises :class:`InvalidEntryError` for entries pi cannot handle (see :func:`validate_entry`),
    duplicate ids and parentId cycles, and :class:`InvalidInputError` for a header that is not
    a JSON object.
    """

    __slots__ = (
        "_by_id",
        "_children",
        "_entries",
        "_header",
        "_label_map",
        "_label_timestamps",
        "_labels",
        "_name",
        "_redacted",
    )

    _header: Entry
    _entries: tuple[Entry, ...]
    _by_id: dict[str, Entry]
    _redacted: frozenset[str]
    _labels: dict[str, Any]
    _label_map: tuple[tuple[Any, Any], ...]
    _label_timestamps: dict[str, Any]
    _children: dict[str | None, list[Entry]]
    _name: str | None

    def __init__(
        self,
        header: Mapping[str, Any],
        entries: Iterable[Mapping[str, Any]],
        *,
        validated: bool = False,
    ) -> None:
        """``validated=True``: every entry already passed :func:`validate_entry` and the set is
        known to be acyclic (the store's reader: appends are validated and parents always
        precede children), so the per-entry checks are skipped. Duplicate ids are still
        refused, and walks keep their own cycle guard either way."""
        if not isinstance(header, Mapping):
            raise InvalidInputError("a session header must be a JSON object")
        raw: list[Entry] = []
        by_id: dict[str, Entry] = {}
        for index, entry in enumerate(entries):
            if not validated:
                validate_entry(entry, index)
            entry = cast(Entry, entry)  # validate_entry admits dicts only
            entry_id = entry["id"]
            if entry_id in by_id:
                raise InvalidEntryError(
                    "duplicate entry id (pi would let the later entry shadow the earlier one)",
                    index=index,
                    entry_id=entry_id,
                )
            by_id[entry_id] = entry
            raw.append(entry)
        if not validated:
            check_acyclic(by_id, raw)

        # Redactions apply whatever their position relative to the target. Tombstones already
        # stored as such (compacted bases) are redacted entries too, whether or not their
        # redaction is still around; recomputing one from its redaction gives the same dict.
        redactions: dict[str, Entry] = {}
        stored_tombstones: set[str] = set()
        for entry in raw:
            if entry.get("type") == REDACTION_TYPE and not is_tombstone(entry):
                target = by_id.get(entry["targetId"])
                if target is None or target.get("type") == REDACTION_TYPE:
                    continue
                redactions.setdefault(entry["targetId"], entry)
            elif "redacted" in entry and is_tombstone(entry):
                stored_tombstones.add(entry["id"])
        if redactions:
            view = [
                redaction_tombstone(e, redactions[e["id"]]) if e["id"] in redactions else e
                for e in raw
            ]
            by_id = {e["id"]: e for e in view}
        else:
            view = raw
        redacted = frozenset(redactions).union(stored_tombstones)

        # Labels (SPEC §5): file order, truthiness decides set vs delete; a delete followed by
        # a set moves the key to the end, like a JS Map. Keyed as pi's Map keys them
        # (_label_key): key -> (targetId as JSON shows it, label).
        labels: dict[Hashable, tuple[Any, Any]] = {}
        label_timestamps: dict[Hashable, Any] = {}
        children: dict[str | None, list[Entry]] = {}
        name: str | None = None
        for entry in view:
            parent_id = entry.get("parentId", _MISSING)
            if parent_id is not _MISSING:
                children.setdefault(parent_id, []).append(entry)
            if entry["id"] in redacted:
                continue
            entry_type = entry.get("type")
            if entry_type == "label":
                target_id = entry.get("targetId", _MISSING)
                key = _label_key(target_id, entry["id"])
                label = entry.get("label", _MISSING)
                if js_truthy(label):
                    labels[key] = (None if target_id is _MISSING else target_id, label)
                    # A label entry without timestamp leaves pi's labelTimestamp undefined.
                    if "timestamp" in entry:
                        label_timestamps[key] = entry["timestamp"]
                    else:
                        label_timestamps.pop(key, None)
                else:
                    labels.pop(key, None)
                    label_timestamps.pop(key, None)
            elif entry_type == "session_info":
                # The last session_info in commit order decides, even an empty one (SPEC §9).
                raw_name = entry.get("name")
                name = (js_trim(raw_name) or None) if isinstance(raw_name, str) else None

        self._header = dict(header)
        self._entries = tuple(view)
        self._by_id = by_id
        self._redacted = redacted
        # Only string keys can ever be looked up (by an entry's id).
        self._labels = {k: label for k, (_, label) in labels.items() if type(k) is str}
        self._label_map = tuple(labels.values())
        self._label_timestamps = {k: t for k, t in label_timestamps.items() if type(k) is str}
        self._children = children
        self._name = name

    # -- plain accessors ------------------------------------------------------------------------

    @property
    def header(self) -> Entry:
        """pi's session header, verbatim (a copy)."""
        return dict(self._header)

    @property
    def session_id(self) -> str:
        header_id = self._header.get("id")
        return header_id if isinstance(header_id, str) else ""

    @property
    def entries(self) -> tuple[Entry, ...]:
        """All entries in commit order, redacted ones as tombstones (pi's ``getEntries()``)."""
        return self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._by_id

    def __repr__(self) -> str:
        return (
            f"Session(id={self.session_id!r}, entries={len(self._entries)}, leaf={self.leaf_id!r})"
        )

    @property
    def leaf_id(self) -> str | None:
        """The id of the last entry (pi's leaf after re-opening), ``None`` without entries."""
        return self._entries[-1]["id"] if self._entries else None

    @property
    def leaf_entry(self) -> Entry | None:
        return self._entries[-1] if self._entries else None

    @property
    def redacted_ids(self) -> frozenset[str]:
        return self._redacted

    def get_entry(self, entry_id: str) -> Entry | None:
        return self._by_id.get(entry_id)

    def get_children(self, parent_id: str | None) -> list[Entry]:
        """Entries whose ``parentId`` equals ``parent_id`` (``None`` means ``null``), commit order."""
        return list(self._children.get(parent_id, ()))

    def get_label(self, entry_id: str) -> Any:
        return self._labels.get(entry_id)

    @property
    def labels(self) -> dict[str, Any]:
        """targetId -> label for string targetIds, in pi's Map insertion order (a copy).

        These are the labels pi can show: it looks labels up by entry id. See
        :attr:`label_map` for every key of pi's Map."""
        return dict(self._labels)

    @property
    def label_map(self) -> tuple[tuple[Any, Any], ...]:
        """pi's label ``Map`` in full, as ``(targetId, label)`` pairs in insertion order.

        Besides :attr:`labels`, it holds the labels whose ``targetId`` is not a string (missing,
        ``null``, a number, a boolean, an object or an array): pi keeps them under keys that no
        entry id reaches. A missing ``targetId`` (``undefined`` in pi's Map) shows as ``None``,
        as ``JSON.stringify`` shows it."""
        return self._label_map

    @property
    def label_timestamps(self) -> dict[str, Any]:
        """targetId -> timestamp of the label entry that set the label (when it had one)."""
        return dict(self._label_timestamps)

    @property
    def name(self) -> str | None:
        """The session name: the last ``session_info`` in commit order, trimmed (SPEC §9)."""
        return self._name

    # -- walks ----------------------------------------------------------------------------------

    def get_branch(self, from_id: str | None = None) -> list[Entry]:
        """pi's ``getBranch``: root-first path to ``from_id`` (default: the leaf); ``[]`` if unknown."""
        start = self.leaf_id if from_id is None else from_id
        return branch_path(self._by_id, start)  # type: ignore[return-value]

    def get_tree(self) -> list[TreeNode]:
        """pi's ``getTree``: roots in commit order, children sorted by parsed timestamp.

        Roots are entries whose ``parentId`` is ``null`` and orphans (unknown, empty or
        missing ``parentId``); pi keeps orphans and so do we. Fresh nodes on every call.
        """
        label_timestamps = self._label_timestamps
        nodes = {
            entry["id"]: TreeNode(
                entry,
                label=self._labels.get(entry["id"]),
                label_timestamp=label_timestamps.get(entry["id"]),
                label_timestamp_present=entry["id"] in label_timestamps,
            )
            for entry in self._entries
        }
        roots: list[TreeNode] = []
        for entry in self._entries:
            node = nodes[entry["id"]]
            parent_id = entry.get("parentId")
            parent = nodes.get(parent_id) if isinstance(parent_id, str) else None
            if parent is None:
                roots.append(node)
            else:
                parent.children.append(node)
        keys = {entry["id"]: _sort_key(entry) for entry in self._entries}
        for node in nodes.values():
            if len(node.children) > 1:
                node.children.sort(key=lambda child: keys[child.entry["id"]])
        return roots

    def build_context(self, leaf_id: str | None = None) -> dict[str, Any]:
        """pi's ``buildSessionContext()`` with the leaf at ``leaf_id`` (default: the session leaf).

        An explicit ``leaf_id`` must exist: pi's ``branch()`` throws for unknown ids, and so
        do we (:class:`EntryNotFoundError`). A session without entries gives the empty context.
        """
        if leaf_id is None:
            leaf_id = self.leaf_id
            if leaf_id is None:
                return build_session_context(())
        elif leaf_id not in self._by_id:
            raise EntryNotFoundError(self.session_id, leaf_id)
        return build_session_context(branch_path(self._by_id, leaf_id), skip_ids=self._redacted)

    def to_pi_entries(self) -> Iterator[Entry]:
        """The entries in a form pi can open safely, for exporting a redacted session.

        A tombstone keeps its ``type``, and pi would read e.g. a contentless ``message`` and
        crash, or take a contentless ``compaction`` as real. Exported tombstones are therefore
        retyped ``"redacted"`` (an unknown type: a tree node that pi otherwise ignores) and
        keep their original type in ``redacted.type``. Other entries are yielded unchanged.
        """
        for entry in self._entries:
            if entry["id"] not in self._redacted:
                yield entry
                continue
            exported: Entry = {"type": "redacted"}
            exported.update((k, v) for k, v in entry.items() if k not in ("type", "redacted"))
            exported["redacted"] = {**entry["redacted"], "type": entry.get("type")}
            yield exported
