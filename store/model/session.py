"""The session snapshot: one session, read the way pi reads it.

A :class:`Session` is built from the session header (pi's header object, kept verbatim) and the
entries in commit order (for an imported pi file: file order). Everything here mirrors
``SessionManager`` of ``@mariozechner/pi-coding-agent`` 0.73.1 (see
``tests/fixtures/pi/SPEC.md`` §5-§7 and §9) except where a pi behaviour would hang or crash:

* entries that pi itself cannot handle are refused up front with :class:`InvalidEntryError`
  (non-objects, missing or empty ids, duplicate ids, parent cycles, ``message`` that is not an
  object, ...: :mod:`store.model.rules`), so that no walk can loop forever and no context
  build can crash later;
* ``redaction`` entries (a sessionstore extension, unknown to pi) hide the content of their
  target: see :class:`Session`.

JavaScript semantics that the results depend on are reproduced on purpose
(:mod:`store.model.js`): ``String.trim``, ``new Date(x).getTime()``, JS truthiness of labels,
and the stable tree sort whose comparator may return NaN.

Pure: no I/O; of the store, only its errors.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from store.errors import EntryNotFoundError, InvalidEntryError, InvalidInputError
from store.model.context import branch_path, build_session_context
from store.model.js import MISSING, js_date_ms, js_trim, js_truthy
from store.model.rules import (
    REDACTION_TYPE,
    Entry,
    check_acyclic,
    is_tombstone,
    redaction_tombstone,
    validate_entry,
)

__all__ = ["Session", "TreeNode"]


def _sort_key(entry: Mapping[str, Any]) -> float:
    ms = js_date_ms(entry.get("timestamp", MISSING))
    # NaN keys make Python's timsort behave exactly like V8's timsort with the comparator
    # `a - b` returning NaN (both treat "not less than" alike; checked against node).
    return math.nan if ms is None else float(ms)


def _label_key(target: Any, label_id: str) -> Hashable:
    """The key pi's label ``Map`` files ``target`` under (SameValueZero), as a dict key.

    A string is its own key: the only kind an entry id can look up. Other targets (pi keeps
    them, under keys no lookup reaches) get keys that no string equals: ``undefined`` (a
    missing targetId) and ``null`` differ, ``true`` is not ``1``, and each parsed object or
    array is a key of its own (JS compares them by identity), named by its label entry.
    """
    if type(target) is str:
        return target
    if target is MISSING:
        return ("undefined",)
    if target is None:
        return ("null",)
    if target is True or target is False:
        return ("boolean", target)
    if isinstance(target, (int, float)):
        return ("number", target)  # 1 and 1.0 are one key, as in JS
    return ("object", label_id)


#: pi's label Map: key (:func:`_label_key`) -> (targetId as JSON shows it, label).
_LabelMap = dict[Hashable, tuple[Any, Any]]


def _index_entries(
    entries: Iterable[Mapping[str, Any]], validated: bool
) -> tuple[list[Entry], dict[str, Entry]]:
    """The entries in commit order and by id; refuses what :class:`Session` cannot hold
    (only duplicate ids when ``validated``)."""
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
    return raw, by_id


def _apply_redactions(
    raw: list[Entry], by_id: dict[str, Entry]
) -> tuple[list[Entry], dict[str, Entry], frozenset[str]]:
    """The entries as readers see them (redacted ones as tombstones), by id, and the ids of
    the redacted entries."""
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
    return view, by_id, frozenset(redactions).union(stored_tombstones)


def _labels_children_name(
    view: list[Entry], redacted: frozenset[str]
) -> tuple[_LabelMap, dict[Hashable, Any], dict[str | None, list[Entry]], str | None]:
    """pi's label Map and the label timestamps (both keyed by :func:`_label_key`), the
    children of every parentId, and the session name."""
    # Labels (SPEC §5): file order, truthiness decides set vs delete; a delete followed by
    # a set moves the key to the end, like a JS Map. Keyed as pi's Map keys them
    # (_label_key): key -> (targetId as JSON shows it, label).
    labels: _LabelMap = {}
    label_timestamps: dict[Hashable, Any] = {}
    children: dict[str | None, list[Entry]] = {}
    name: str | None = None
    for entry in view:
        parent_id = entry.get("parentId", MISSING)
        if parent_id is not MISSING:
            children.setdefault(parent_id, []).append(entry)
        if entry["id"] in redacted:
            continue
        entry_type = entry.get("type")
        if entry_type == "label":
            target_id = entry.get("targetId", MISSING)
            key = _label_key(target_id, entry["id"])
            label = entry.get("label", MISSING)
            if js_truthy(label):
                labels[key] = (None if target_id is MISSING else target_id, label)
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
    return labels, label_timestamps, children, name


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
        raw, by_id = _index_entries(entries, validated)
        view, by_id, redacted = _apply_redactions(raw, by_id)
        labels, label_timestamps, children, name = _labels_children_name(view, redacted)

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
