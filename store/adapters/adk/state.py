"""Reading an ADK session back: the fold of its events (:class:`Loaded`), of a shared scope's
deltas, and the state ``get_session`` shows (the three scopes merged)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from google.adk.events.event import Event
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.state import State

from store.adapters.adk.layout import (
    EVENT_TYPE,
    STATE_TYPE,
    _iso,
    _marker,
    _scope_entry,
    _scoped,
)
from store.model.rules import REDACTION_TYPE
from store.formats.records import EMPTY_TAIL, Header


def _fold_scope(entries: Iterable[dict[str, Any]]) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for entry in entries:
        if entry.get("customType") == STATE_TYPE and isinstance(entry.get("data"), dict):
            delta = entry["data"].get("delta")
            if isinstance(delta, dict):
                state.update(delta)
    return state


def _merge_state(
    app_state: Mapping[str, Any], user_state: Mapping[str, Any], session_state: Mapping[str, Any]
) -> dict[str, Any]:
    merged = json.loads(json.dumps(session_state))  # a deep copy of JSON
    for key, value in app_state.items():
        merged[State.APP_PREFIX + key] = value
    for key, value in user_state.items():
        merged[State.USER_PREFIX + key] = value
    return merged


def _without_redacted(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Entries with ``store.redact`` applied (a redacted event is left out by the fold)."""
    if not any(e.get("type") == REDACTION_TYPE for e in entries):
        return entries
    from store.model.session import Session as PiSession

    return list(PiSession({}, entries, validated=True).entries)


class _Loaded:
    """One ADK session as read from the store."""

    def __init__(self, header: Header, entries: list[dict[str, Any]]) -> None:
        self.header = header
        self.meta: dict[str, Any] = header.pi_header.get("adk") or {}
        self.entries = _without_redacted(entries)
        self.tail = entries[-1]["id"] if entries else EMPTY_TAIL
        nonce = self.meta.get("nonce")
        #: The revision marker of a ``Session`` read now (``_marker``).
        self.marker = _marker(nonce if isinstance(nonce, str) else None, self.tail)
        self.events: list[dict[str, Any]] = [
            e for e in self.entries if e.get("customType") == EVENT_TYPE and isinstance(e.get("data"), dict)
        ]

    def names_match(self, app_name: str, user_id: str, session_id: str) -> bool:
        m = self.meta
        return (
            m.get("kind") == "session"
            and m.get("appName") == app_name
            and m.get("userId") == user_id
            and m.get("sessionId") == session_id
        )

    def session_state(self) -> dict[str, Any]:
        state = dict(self.meta.get("state") or {})
        for entry in self.events:
            delta = (entry["data"].get("actions") or {}).get("state_delta") or {}
            state.update(_scoped(delta)["session"])
        return state

    def last_update_time(self) -> float:
        if self.events:
            return float(self.events[-1]["data"].get("timestamp", 0.0))
        return float(self.meta.get("createTime", self.header.created_at_ms / 1000))

    def scope_writes(self) -> list[tuple[str, dict[str, Any]]]:
        """Every shared-scope delta this session wrote: ``(scope, entry)``, oldest first, as
        it was (or is to be) appended to that scope (deterministic: a re-send is idempotent)."""
        out: list[tuple[str, dict[str, Any]]] = []
        source = {"userId": self.meta.get("userId"), "sessionId": self.meta.get("sessionId")}
        ids = self.meta.get("deltaIds") or {}
        if ids:
            scoped = _scoped(self.meta.get("sharedState") or {})
            stamp = self.meta.get("timestamp") or _iso(self.meta.get("createTime", 0.0))
            for scope, delta_id in ids.items():
                out.append((scope, _scope_entry(delta_id, stamp, scoped[scope], {**source, "entryId": ""})))
        for entry in self.events:
            ids = entry.get("adk")
            if not isinstance(ids, dict) or not ids:
                continue
            scoped = _scoped((entry["data"].get("actions") or {}).get("state_delta") or {})
            for scope, delta_id in ids.items():
                out.append(
                    (scope, _scope_entry(delta_id, entry["timestamp"], scoped[scope], {**source, "entryId": entry["id"]}))
                )
        return out


def _filter_events(events: list[Event], config: GetSessionConfig | None) -> list[Event]:
    if config is None:
        return events
    if config.num_recent_events == 0:
        return []
    if config.after_timestamp:
        events = [e for e in events if e.timestamp >= config.after_timestamp]
    if config.num_recent_events is not None:
        events = events[-config.num_recent_events :]
    return events


