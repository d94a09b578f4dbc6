"""The records of Strands sessions in the store: their entry types, the errors Strands' own
repositories raise, the fold a session's entries are read back with (``read_view``) and the
checks a record passes before it is written."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from strands.types.exceptions import SessionException
from strands.types.session import (
    SessionAgent,
    SessionMessage,
    decode_bytes_values,
)

from store.errors import (
    InvalidInputError,
    SessionExistsError,
    SessionNotFoundError,
)


#: ``customType`` of each record kind (see the module docstring).
AGENT_TYPE = "strands.agent"
AGENT_UPDATE_TYPE = "strands.agent_update"
MESSAGE_TYPE = "strands.message"
MESSAGE_UPDATE_TYPE = "strands.message_update"
MULTI_AGENT_TYPE = "strands.multi_agent"

#: The key of the session header (pi's ``session`` line) holding Strands' ``Session`` record.
HEADER_KEY = "strands"

#: Where ``SessionStoreSessionManager`` keeps sessions when given no store and no URL (and
#: ``SESSIONSTORE_OBJECTS_URL`` is unset): the CLI's embedded default.
DEFAULT_DIR = ".sessionstore"
ENV_OBJECTS = "SESSIONSTORE_OBJECTS_URL"
ENV_REDIS = "SESSIONSTORE_REDIS_URL"

#: The attribute a ``SessionMessage`` read or written by this adapter carries: its entry id
#: (and, in ``_SCOPE_ATTR``, the session and agent it belongs to).
ENTRY_ID_ATTR = "sessionstore_entry_id"
_SCOPE_ATTR = "_sessionstore_scope"

#: Views kept by one repository (the sessions it read last).
_MAX_CACHED_VIEWS = 8

_MESSAGE_FIELDS = tuple(f.name for f in dataclasses.fields(SessionMessage))
_AGENT_FIELDS = tuple(f.name for f in dataclasses.fields(SessionAgent))


# --- errors ----------------------------------------------------------------------------------


class SessionNotFoundInStoreError(SessionException, SessionNotFoundError):
    """The session does not exist (Strands' ``SessionException`` and the store's error)."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        Exception.__init__(self, f"Session {session_id} does not exist")  # Strands' wording


class SessionExistsInStoreError(SessionException, SessionExistsError):
    """``create_session`` of a session that exists (Strands' and the store's error)."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        Exception.__init__(self, f"Session {session_id} already exists")  # Strands' wording


class NotFoundInSessionError(SessionException, LookupError):
    """``update_agent`` / ``update_message`` / ``update_multi_agent`` of a record that does not
    exist: nothing was written."""


class InvalidStrandsRecordError(InvalidInputError):
    """A record that cannot be stored as JSON (NaN, Infinity, a ``datetime``, a non-string
    key, ...) or of the wrong type. Nothing was written."""


# --- reading: the fold -----------------------------------------------------------------------


@dataclasses.dataclass
class _Message:
    entry_id: str
    turn: str
    record: dict[str, Any]  # SessionMessage.to_dict() of the latest version
    created_at: Any


@dataclasses.dataclass
class StrandsView:
    """What a session's entries mean to Strands, folded in commit order."""

    agents: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: Per agent, its messages in reading order (see the module docstring).
    messages: dict[str, list[_Message]] = dataclasses.field(default_factory=dict)
    multi_agents: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: The last entry of the session when it was read, and how many entries it had.
    last_entry_id: str | None = None
    entry_count: int = 0

    def session_messages(
        self, agent_id: str, offset: int = 0, limit: int | None = None
    ) -> list[SessionMessage]:
        """The agent's messages from reading position ``offset`` on, at most ``limit``."""
        msgs = self.messages.get(agent_id, [])
        end = len(msgs) if limit is None else offset + limit
        return [_to_session_message(m, i) for i, m in enumerate(msgs[offset:end], start=offset)]


def read_view(entries: list[dict[str, Any]]) -> StrandsView:
    """Fold a session's entries (commit order) into Strands' agents, messages, multi-agents.

    Entries of other types and redacted entries (tombstones, without ``data``) are ignored.
    """
    view = StrandsView()
    # agent -> turn key -> messages of that turn, in commit order; dicts keep the order in
    # which each turn was first seen, which is the order of the turns.
    turns: dict[str, dict[str, list[_Message]]] = {}
    by_entry: dict[str, _Message] = {}
    for entry in entries:
        if entry.get("type") != "custom":
            continue
        data = entry.get("data")
        if not isinstance(data, dict):
            continue  # a tombstone, or not ours
        kind = entry.get("customType")
        if kind == MESSAGE_TYPE:
            agent_id, record = data.get("agentId"), data.get("message")
            if not isinstance(agent_id, str) or not _is_message_record(record):
                continue
            turn = data.get("turn")
            key = turn if isinstance(turn, str) else entry["id"]
            msg = _Message(entry["id"], key, record, record.get("created_at"))
            turns.setdefault(agent_id, {}).setdefault(key, []).append(msg)
            by_entry[entry["id"]] = msg
        elif kind == MESSAGE_UPDATE_TYPE:
            target_id, record = data.get("target"), data.get("message")
            target = by_entry.get(target_id) if isinstance(target_id, str) else None
            if target is not None and _is_message_record(record):
                target.record = {**record, "created_at": target.created_at}
        elif kind in (AGENT_TYPE, AGENT_UPDATE_TYPE):
            agent_id, record = data.get("agentId"), data.get("agent")
            if not isinstance(agent_id, str) or not isinstance(record, dict):
                continue
            previous = view.agents.get(agent_id)
            if previous is not None:
                record = {**record, "created_at": previous.get("created_at")}
            view.agents[agent_id] = record
        elif kind == MULTI_AGENT_TYPE:
            ma_id, state = data.get("multiAgentId"), data.get("state")
            if isinstance(ma_id, str) and isinstance(state, dict):
                view.multi_agents[ma_id] = state
    for agent_id, agent_turns in turns.items():
        view.messages[agent_id] = [m for turn in agent_turns.values() for m in turn]
    if entries:
        view.last_entry_id = entries[-1]["id"]
    view.entry_count = len(entries)
    return view


def _is_message_record(record: Any) -> bool:
    return isinstance(record, dict) and isinstance(record.get("message"), dict)


def _to_session_message(msg: _Message, index: int) -> SessionMessage:
    fields = {k: msg.record[k] for k in _MESSAGE_FIELDS if k in msg.record}
    fields["message_id"] = index
    return SessionMessage(**decode_bytes_values(fields))


def _mark(message: SessionMessage, session_id: str, agent_id: str, entry_id: str) -> SessionMessage:
    setattr(message, ENTRY_ID_ATTR, entry_id)
    setattr(message, _SCOPE_ATTR, (session_id, agent_id))
    return message


def _marked_entry(message: SessionMessage, session_id: str, agent_id: str) -> str | None:
    """The entry id of a message this adapter read or wrote in that session, for that agent."""
    entry_id = getattr(message, ENTRY_ID_ATTR, None)
    if isinstance(entry_id, str) and getattr(message, _SCOPE_ATTR, None) == (session_id, agent_id):
        return entry_id
    return None


def _to_session_agent(record: dict[str, Any]) -> SessionAgent:
    fields = {k: record[k] for k in _AGENT_FIELDS if k in record}
    return SessionAgent(**decode_bytes_values(fields))


# --- writing ---------------------------------------------------------------------------------


def _as_json(value: Any, what: str) -> Any:
    """``value`` as the JSON it will be read back as, or ``InvalidStrandsRecordError``."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidStrandsRecordError(f"{what} is not storable as JSON: {exc}") from None
    return json.loads(text)


def _starts_turn(message: Any) -> bool:
    """A user message without a tool result starts a turn; the rest continue one."""
    if not isinstance(message, Mapping) or message.get("role") == "assistant":
        return False
    content = message.get("content")
    blocks = content if isinstance(content, list) else []
    return not any(isinstance(b, Mapping) and "toolResult" in b for b in blocks)


def _check_str(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{what} must be a non-empty string, not {value!r}")
    return value


def _check_index(message_id: Any) -> int:
    if isinstance(message_id, bool) or not isinstance(message_id, int):
        raise InvalidInputError(f"message_id=<{message_id}> | message id must be an integer")
    return message_id


