"""Walks of a session's entry tree: pi's ``getBranch`` and ``buildSessionContext``.

Both work on any id -> entry mapping and root-first path, so the store uses them too (to
fork, to verify). Entries whose id is skipped (redacted entries) take part in the walk but
have no effect.

Pure: no I/O; of the store, only its errors.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from store.errors import InvalidEntryError
from store.model.js import MISSING, js_date_ms, js_truthy

__all__ = ["branch_path", "build_session_context"]


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
    return js_date_ms(entry.get("timestamp", MISSING))


def _set_present(
    target: dict[str, Any], key: str, source: Mapping[str, Any], source_key: str
) -> None:
    # `undefined` properties vanish from JSON, so a missing source field must leave no key.
    value = source.get(source_key, MISSING)
    if value is not MISSING:
        target[key] = value


def _context_message(entry: Mapping[str, Any]) -> Any:
    """What pi's appendMessage() pushes for an entry, or MISSING for nothing."""
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
    if entry_type == "branch_summary" and js_truthy(entry.get("summary", MISSING)):
        message = {"role": "branchSummary", "summary": entry["summary"]}
        _set_present(message, "fromId", entry, "fromId")
        message["timestamp"] = _timestamp_ms(entry)
        return message
    return MISSING


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
    thinking_level, model, compaction_index = _settings(path, skip)
    result: dict[str, Any] = {"messages": _messages(path, skip, compaction_index)}
    if thinking_level is not MISSING:
        result["thinkingLevel"] = thinking_level
    result["model"] = model
    return result


def _settings(
    path: Sequence[Mapping[str, Any]], skip: Collection[str]
) -> tuple[Any, dict[str, Any] | None, int]:
    """The thinking level, the model and the position of the last compaction (-1: none) that
    the entries on ``path`` leave in force."""
    thinking_level: Any = "off"
    model: dict[str, Any] | None = None
    compaction_index = -1
    for position, entry in enumerate(path):
        if skip and entry.get("id") in skip:
            continue
        entry_type = entry.get("type")
        if entry_type == "thinking_level_change":
            thinking_level = entry.get("thinkingLevel", MISSING)
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
            compaction_index = position
    return thinking_level, model, compaction_index


def _messages(
    path: Sequence[Mapping[str, Any]], skip: Collection[str], compaction_index: int
) -> list[Any]:
    """The context's messages: after a compaction, its summary, then the entries it kept."""
    messages: list[Any] = []

    def emit(entry: Mapping[str, Any]) -> None:
        if skip and entry.get("id") in skip:
            return
        message = _context_message(entry)
        if message is not MISSING:
            messages.append(message)

    if compaction_index < 0:
        for entry in path:
            emit(entry)
        return messages
    compaction = path[compaction_index]
    summary: dict[str, Any] = {"role": "compactionSummary"}
    _set_present(summary, "summary", compaction, "summary")
    _set_present(summary, "tokensBefore", compaction, "tokensBefore")
    summary["timestamp"] = _timestamp_ms(compaction)
    messages.append(summary)
    first_kept = compaction.get("firstKeptEntryId", MISSING)
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
    return messages
