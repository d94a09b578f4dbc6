"""Strands Agents' ``SessionRepository`` on the store, and a drop-in session manager.

A drop-in for ``S3SessionManager`` / ``FileSessionManager`` that many processes on many
machines can share, two of them writing one session at once::

    from strands import Agent
    from store.adapters.strands import SessionStoreSessionManager

    manager = SessionStoreSessionManager("user-42", objects_url="s3://bucket/agents?endpoint=...",
                                         redis_url="redis://redis:6379/0")
    agent = Agent(session_manager=manager)
    agent("hi")
    manager.close()

or, for many sessions over one store: ``SessionStoreSessionManager(session_id, store=store)``
(a ``store.SessionStore``, or an ``AsyncSessionStore``, whose ``.sync`` store is used), or the
bare repository ``SessionStoreRepository(store)`` under Strands' own
``RepositorySessionManager``.

**How Strands' records are stored.** A Strands session is a session of the store with the
same id. Its ``Session`` record (type, creation time) is kept in the store's session header,
written exactly once with the session, so a session exists completely or not at all; a session
created by other tools (no such record) reads as an ``AGENT`` session. Everything else is one
pi ``custom`` entry per call, appended as one atomic batch::

    {"type": "custom", "customType": <below>, "id": <random>, "parentId": <previous>,
     "timestamp": <ISO>, "data": {...}}

- ``strands.agent``: ``{"agentId", "agent": SessionAgent.to_dict()}`` (``create_agent``);
- ``strands.agent_update``: the same (``update_agent``);
- ``strands.message``: ``{"agentId", "turn", "writerIndex", "message": SessionMessage.to_dict()}``
  (``create_message``);
- ``strands.message_update``: ``{"agentId", "target": <message entry id>, "message": ...}``
  (``update_message``: a guardrail's redaction);
- ``strands.multi_agent``: ``{"multiAgentId", "state"}`` (``create_multi_agent`` and
  ``update_multi_agent``).

Nothing is ever overwritten: a read (``read_agent``, ``list_messages``, ...) loads the
session's entries and folds them in the store's commit order, the one linear order every
reader agrees on; the repository keeps the last fold and uses it again while the session's
tail has not moved (a restore reads the agent, then its messages: one read). An agent is its latest snapshot (``created_at`` of the
first); a message is its latest version (``created_at`` of the original); a multi-agent state
is the latest one.

**Message indexes.** Strands numbers an agent's messages itself (``message_id`` = previous + 1)
and ``S3SessionManager`` writes ``message_<id>.json``, so two writers on one session overwrite
each other's messages. Here the number a writer proposes is only kept (``writerIndex``); no
write ever replaces another's. The index a reader sees (``read_message``, ``list_messages``,
the ``message_id`` of what they return) is the message's position in the agent's *reading
order*: the commit order, except that the messages of one turn stay together. A turn is what
one writer appends for one prompt: it starts with a user message that holds no ``toolResult``
and goes on with the assistant's messages and the tool results that answer them; every message
names the entry that started its turn (``turn``). Turns are ordered by the commit of their
first message. So two processes that run the same agent on one session at once each leave
whole turns (prompt, tool use, tool result, answer) one after the other, never a tool result
separated from its tool use or two prompts in a row, and an agent that resumes the session
(``RepositorySessionManager.initialize`` lists every message and restores them) gets a history
that a model accepts, with every message of both writers.

A writer's later calls about a message it created or read (``update_message`` from
``redact_latest_message``) find it by its entry id, which the adapter keeps on the
``SessionMessage`` object (attribute ``sessionstore_entry_id``); a ``SessionMessage`` made
elsewhere is found by its ``message_id`` as a reading position.

Caveats: (1) while a turn is still being written, messages of turns that started after it
move further down each time it grows, so a reading position is final only once the turns
before it are finished (with one writer at a time, positions never move). (2) An agent's
state and conversation-manager state are snapshots: with two writers, the latest
``update_agent`` wins, as in Strands' own repositories; a conversation manager's
``removed_message_count`` counts the messages *its* writer removed from the front. (3) An
agent that resumes while another writer is in the middle of a turn sees that turn's committed
part (Strands then repairs a trailing tool use without its result, as it does after a crash).

**Errors.** "Does not exist" and "already exists" are Strands' ``SessionException``, as raised
by ``FileSessionManager`` and ``S3SessionManager``, and at the same time the store's typed
error (``SessionNotFoundInStoreError`` is a ``SessionNotFoundError``, ...). A record that is
not JSON (``NaN``, a ``datetime``, ...) is ``InvalidStrandsRecordError``, an invalid session
id ``InvalidSessionIdError`` (the store's ids: letters, digits, ``.``, ``_``, ``-``, at most
128 characters; Strands itself only refuses path separators), a non-integer ``message_id``
``InvalidInputError`` (all three ``ValueError``, like Strands' own id checks); an update of
an agent, message or multi-agent state that does not exist is ``NotFoundInSessionError`` (a
``SessionException``); in every case nothing was written. Other store
errors (``BackendUnavailableError``, ...) come through as they are. ``IndeterminateError``
(outcome unknown) is answered by re-sending the very same batch, which the store makes
idempotent, a bounded number of times.

**Sync, on purpose.** ``SessionRepository`` is synchronous, and Strands calls the session
manager's hooks as plain callbacks from inside its event loop (``HookRegistry.
invoke_callbacks_async`` calls a non-coroutine callback directly; ``Agent.__call__`` runs that
loop in a thread of its own, ``invoke_async``/``stream_async`` in the caller's loop). The
repository calls the thread-safe synchronous ``store.SessionStore`` directly: it uses no
asyncio, so it is safe inside a running loop, and it blocks the loop for one store round trip
per record, exactly as ``FileSessionManager`` (file I/O) and ``S3SessionManager`` (boto3) do.
Going through ``AsyncSessionStore`` would need a loop of our own in another thread (``asyncio.
run`` refuses to run inside a running loop) and would block on it all the same, one thread hop
dearer.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import threading
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from strands.session.repository_session_manager import RepositorySessionManager
from strands.session.session_repository import SessionRepository
from strands.types.exceptions import SessionException
from strands.types.session import (
    Session,
    SessionAgent,
    SessionMessage,
    SessionType,
    decode_bytes_values,
)

from store.clock import iso_now
from store.core import SessionStore
from store.adapters.names import session_id_for
from store.errors import (
    IndeterminateError,
    InvalidInputError,
    SessionExistsError,
    SessionNotFoundError,
    UnknownParentError,
)

if TYPE_CHECKING:
    from strands.multiagent.base import MultiAgentBase


def _store_id(session_id: str) -> str:
    """The store session of a Strands session: its own id (``store.adapters.names``)."""
    return session_id_for("strands", session_id)


__all__ = [
    "AGENT_TYPE",
    "AGENT_UPDATE_TYPE",
    "MESSAGE_TYPE",
    "MESSAGE_UPDATE_TYPE",
    "MULTI_AGENT_TYPE",
    "InvalidStrandsRecordError",
    "NotFoundInSessionError",
    "SessionExistsInStoreError",
    "SessionNotFoundInStoreError",
    "SessionStoreRepository",
    "SessionStoreSessionManager",
    "StrandsView",
    "read_view",
]

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


class SessionStoreRepository(SessionRepository):
    """Strands' ``SessionRepository`` over a :class:`store.SessionStore`.

    Thread-safe; any number of repositories, in any number of processes, may serve one
    session at once (see the module docstring for what two writers see). The object keeps
    only hints: the last entry id it knows per session (the ``parentId`` of its next entry),
    the turn each of its agents is in, and which agents it knows to exist.

    ``resend_attempts``: re-sends of one batch after ``IndeterminateError`` before giving up.
    """

    def __init__(self, store: Any, *, owns_store: bool = False, resend_attempts: int = 5) -> None:
        if not isinstance(store, SessionStore) and isinstance(
            getattr(store, "sync", None), SessionStore
        ):
            store = store.sync  # an AsyncSessionStore: its synchronous store (see above)
        if not isinstance(store, SessionStore):
            raise TypeError(f"store must be a store.SessionStore, not {type(store).__name__}")
        self._ss_store: SessionStore = store
        self._ss_owns = owns_store
        self._ss_resend = max(1, resend_attempts)
        self._ss_lock = threading.Lock()
        self._ss_last: dict[str, str] = {}  # session -> an entry id known committed
        self._ss_turns: dict[tuple[str, str], str] = {}  # (session, agent) -> turn key
        self._ss_agents: dict[tuple[str, str], Any] = {}  # (session, agent) -> created_at
        self._ss_multi: set[tuple[str, str]] = set()
        self._ss_views: dict[str, StrandsView] = {}  # session -> the last view read

    @classmethod
    def from_url(
        cls, objects_url: str, redis_url: str | None = None, **store_options: Any
    ) -> SessionStoreRepository:
        """A repository over a store of its own (closed by :meth:`close`)."""
        return cls(SessionStore.from_url(objects_url, redis_url, **store_options), owns_store=True)

    @property
    def store(self) -> SessionStore:
        return self._ss_store

    def close(self) -> None:
        """Close the store if this repository made it."""
        if self._ss_owns:
            self._ss_owns = False
            self._ss_store.close()

    # --- plumbing ----------------------------------------------------------------------------

    def _append(self, session_id: str, kind: str, data: dict[str, Any], entry_id: str | None = None) -> str:
        """Append one custom entry; returns its id."""
        eid = entry_id or uuid.uuid4().hex
        with self._ss_lock:
            parent = self._ss_last.get(session_id)
        entry = {"type": "custom", "customType": kind, "id": eid, "parentId": parent,
                 "timestamp": iso_now(), "data": data}
        attempt = 0
        while True:
            try:
                self._ss_store.append_session_entries(session_id, [entry])
                break
            except IndeterminateError:
                attempt += 1
                if attempt >= self._ss_resend:
                    raise
            except UnknownParentError:
                if entry["parentId"] is None or attempt:
                    raise  # (after an unknown outcome only the very same batch may be re-sent)
                entry["parentId"] = None  # the session was deleted and made again meanwhile
            except SessionNotFoundError as exc:
                raise SessionNotFoundInStoreError(session_id) from exc
        with self._ss_lock:
            self._ss_last[session_id] = eid
        return eid

    def _view(self, session_id: str) -> StrandsView | None:
        """The session as Strands sees it now; None if it does not exist.

        The last view read is kept per session and used again while the session's tail is
        the same entry and count (a restore reads the agent, then lists its messages: one
        read, and a look at the tail).
        """
        with self._ss_lock:
            cached = self._ss_views.get(session_id)
        try:
            if cached is not None:
                tail = self._ss_store.get_tail(session_id)
                if (tail.last_entry_id or None) == cached.last_entry_id and tail.entry_count == cached.entry_count:
                    return cached
            entries = self._ss_store.load_session_entries(session_id)
        except SessionNotFoundError:
            with self._ss_lock:
                self._ss_views.pop(session_id, None)
            return None
        view = read_view(entries)
        with self._ss_lock:
            self._ss_views.pop(session_id, None)
            while len(self._ss_views) >= _MAX_CACHED_VIEWS:
                self._ss_views.pop(next(iter(self._ss_views)))
            self._ss_views[session_id] = view
            if view.last_entry_id is not None:
                self._ss_last[session_id] = view.last_entry_id
            for agent_id, record in view.agents.items():
                self._ss_agents[(session_id, agent_id)] = record.get("created_at")
            self._ss_multi.update((session_id, m) for m in view.multi_agents)
        return view

    def _existing_view(self, session_id: str) -> StrandsView:
        view = self._view(session_id)
        if view is None:
            raise SessionNotFoundInStoreError(session_id)
        return view

    # --- sessions ----------------------------------------------------------------------------

    def create_session(self, session: Session, **kwargs: Any) -> Session:
        """Create the session; ``SessionExistsInStoreError`` if it exists."""
        sid = _store_id(session.session_id)
        record = _as_json(
            {
                "session_id": sid,
                "session_type": getattr(session.session_type, "value", session.session_type),
                "created_at": session.created_at,
                "updated_at": session.updated_at,
            },
            "the session",
        )
        pi_header = {"type": "session", "version": 3, "id": sid, "timestamp": iso_now(),
                     "cwd": "", HEADER_KEY: record}
        try:
            self._ss_store.create_session(sid, pi_header=pi_header)
        except SessionExistsError as exc:
            raise SessionExistsInStoreError(sid) from exc
        return session

    def read_session(self, session_id: str, **kwargs: Any) -> Session | None:
        try:
            header = self._ss_store.get_header(_store_id(session_id))
        except SessionNotFoundError:
            return None
        record = header.pi_header.get(HEADER_KEY)
        if isinstance(record, dict):
            return Session.from_dict(record)
        created = datetime.fromtimestamp(header.created_at_ms / 1000, UTC).isoformat()
        return Session(session_id=session_id, session_type=SessionType.AGENT,
                       created_at=created, updated_at=created)

    def delete_session(self, session_id: str, **kwargs: Any) -> None:
        """Delete the session and everything in it (``SessionNotFoundInStoreError`` if none)."""
        sid = _store_id(session_id)
        try:
            self._ss_store.delete_session(sid)
        except SessionNotFoundError as exc:
            raise SessionNotFoundInStoreError(sid) from exc
        with self._ss_lock:
            self._ss_last.pop(sid, None)
            self._ss_views.pop(sid, None)
            for cache in (self._ss_turns, self._ss_agents):
                for key in [k for k in cache if k[0] == sid]:
                    del cache[key]
            self._ss_multi = {k for k in self._ss_multi if k[0] != sid}

    # --- agents ------------------------------------------------------------------------------

    def create_agent(self, session_id: str, session_agent: SessionAgent, **kwargs: Any) -> None:
        sid = _store_id(session_id)
        agent_id = _check_str(session_agent.agent_id, "agent_id")
        record = _as_json(session_agent.to_dict(), f"agent {agent_id!r}")
        self._append(sid, AGENT_TYPE, {"agentId": agent_id, "agent": record})
        with self._ss_lock:
            self._ss_agents.setdefault((sid, agent_id), session_agent.created_at)

    def read_agent(self, session_id: str, agent_id: str, **kwargs: Any) -> SessionAgent | None:
        view = self._view(_store_id(session_id))
        record = None if view is None else view.agents.get(agent_id)
        return None if record is None else _to_session_agent(record)

    def update_agent(self, session_id: str, session_agent: SessionAgent, **kwargs: Any) -> None:
        """Store the agent's new snapshot (``NotFoundInSessionError`` if it has none)."""
        sid = _store_id(session_id)
        agent_id = _check_str(session_agent.agent_id, "agent_id")
        key = (sid, agent_id)
        with self._ss_lock:
            known = key in self._ss_agents
        if not known and agent_id not in self._existing_view(sid).agents:
            raise NotFoundInSessionError(f"Agent {agent_id} in session {sid} does not exist")
        with self._ss_lock:
            created = self._ss_agents.get(key)
        if created is not None:
            session_agent.created_at = created  # as Strands' repositories do
        record = _as_json(session_agent.to_dict(), f"agent {agent_id!r}")
        self._append(sid, AGENT_UPDATE_TYPE, {"agentId": agent_id, "agent": record})

    # --- messages ----------------------------------------------------------------------------

    def create_message(
        self, session_id: str, agent_id: str, session_message: SessionMessage, **kwargs: Any
    ) -> None:
        """Append the message; it never replaces another, whatever its ``message_id``."""
        sid = _store_id(session_id)
        _check_str(agent_id, "agent_id")
        index = _check_index(session_message.message_id)
        record = _as_json(session_message.to_dict(), f"message {index}")
        eid = uuid.uuid4().hex
        key = (sid, agent_id)
        with self._ss_lock:
            turn = self._ss_turns.get(key)
        if turn is None or _starts_turn(session_message.message):
            turn = eid
        data = {"agentId": agent_id, "turn": turn, "writerIndex": index, "message": record}
        self._append(sid, MESSAGE_TYPE, data, entry_id=eid)
        with self._ss_lock:
            self._ss_turns[key] = turn
        _mark(session_message, sid, agent_id, eid)

    def read_message(
        self, session_id: str, agent_id: str, message_id: int, **kwargs: Any
    ) -> SessionMessage | None:
        """The message at reading position ``message_id``; None if there is none."""
        index = _check_index(message_id)
        view = self._view(_store_id(session_id))
        if view is None or index < 0:
            return None
        msgs = view.messages.get(agent_id, [])
        if index >= len(msgs):
            return None
        return _mark(_to_session_message(msgs[index], index), session_id, agent_id, msgs[index].entry_id)

    def update_message(
        self, session_id: str, agent_id: str, session_message: SessionMessage, **kwargs: Any
    ) -> None:
        """Store a new version of a message (``NotFoundInSessionError`` if it does not exist).

        The message is the one this adapter created or read as ``session_message`` (its entry
        id travels with the object), else the one at reading position ``message_id``.
        """
        sid = _store_id(session_id)
        _check_str(agent_id, "agent_id")
        index = _check_index(session_message.message_id)
        target = _marked_entry(session_message, sid, agent_id)
        created_at = session_message.created_at
        if target is None:
            view = self._existing_view(sid)
            msgs = view.messages.get(agent_id, [])
            if not 0 <= index < len(msgs):
                raise NotFoundInSessionError(f"Message {index} does not exist")
            target, created_at = msgs[index].entry_id, msgs[index].created_at
        updated_at = datetime.now(UTC).isoformat()
        record = _as_json({**session_message.to_dict(), "created_at": created_at, "updated_at": updated_at},
                          f"message {index}")
        self._append(sid, MESSAGE_UPDATE_TYPE, {"agentId": agent_id, "target": target, "message": record})
        session_message.created_at, session_message.updated_at = created_at, updated_at

    def list_messages(
        self, session_id: str, agent_id: str, limit: int | None = None, offset: int = 0, **kwargs: Any
    ) -> list[SessionMessage]:
        """The agent's messages in reading order, from ``offset``, at most ``limit``."""
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidInputError(f"offset must be an integer >= 0, not {offset!r}")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise InvalidInputError(f"limit must be None or an integer >= 0, not {limit!r}")
        view = self._existing_view(_store_id(session_id))
        msgs = view.messages.get(agent_id, [])[offset:]
        return [_mark(m, session_id, agent_id, msgs[i].entry_id)
                for i, m in enumerate(view.session_messages(agent_id, offset, limit))]

    # --- multi-agent -------------------------------------------------------------------------

    def create_multi_agent(self, session_id: str, multi_agent: MultiAgentBase, **kwargs: Any) -> None:
        sid = _store_id(session_id)
        ma_id = _check_str(multi_agent.id, "multi-agent id")
        state = _as_json(multi_agent.serialize_state(), f"multi-agent {ma_id!r}")
        self._append(sid, MULTI_AGENT_TYPE, {"multiAgentId": ma_id, "state": state})
        with self._ss_lock:
            self._ss_multi.add((sid, ma_id))

    def read_multi_agent(self, session_id: str, multi_agent_id: str, **kwargs: Any) -> dict[str, Any] | None:
        view = self._view(_store_id(session_id))
        state = None if view is None else view.multi_agents.get(multi_agent_id)
        return None if state is None else copy.deepcopy(state)

    def update_multi_agent(self, session_id: str, multi_agent: MultiAgentBase, **kwargs: Any) -> None:
        sid = _store_id(session_id)
        ma_id = _check_str(multi_agent.id, "multi-agent id")
        with self._ss_lock:
            known = (sid, ma_id) in self._ss_multi
        if not known and ma_id not in self._existing_view(sid).multi_agents:
            raise NotFoundInSessionError(f"MultiAgent state {ma_id} in session {sid} does not exist")
        state = _as_json(multi_agent.serialize_state(), f"multi-agent {ma_id!r}")
        self._append(sid, MULTI_AGENT_TYPE, {"multiAgentId": ma_id, "state": state})


class SessionStoreSessionManager(RepositorySessionManager, SessionStoreRepository):
    """A Strands session manager on the store: usable wherever ``S3SessionManager`` is.

    Like ``FileSessionManager`` and ``S3SessionManager`` it is its own repository (so
    ``manager.list_messages(...)`` works too). The store: ``store`` (a ``store.SessionStore``
    or an ``AsyncSessionStore``, shared, not closed here), or one made from ``objects_url`` /
    ``redis_url`` (``store_options`` as for ``SessionStore.from_url``; closed by
    :meth:`close`). With neither: ``SESSIONSTORE_OBJECTS_URL`` / ``SESSIONSTORE_REDIS_URL``,
    else the embedded default in ``./.sessionstore`` (as the CLI).

    The session is created if it does not exist; a process that loses that race to another
    one uses the session the other created.
    """

    def __init__(
        self,
        session_id: str,
        store: Any = None,
        *,
        objects_url: str | None = None,
        redis_url: str | None = None,
        store_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        _store_id(session_id)  # before any store is made or anything written
        owns = store is None
        if store is None:
            objects_url = objects_url or os.environ.get(ENV_OBJECTS) or Path(DEFAULT_DIR).absolute().as_uri()
            redis_url = redis_url or os.environ.get(ENV_REDIS) or None
            store = SessionStore.from_url(objects_url, redis_url, **dict(store_options or {}))
        elif objects_url is not None or redis_url is not None or store_options:
            raise TypeError("give either store or objects_url/redis_url/store_options, not both")
        try:
            SessionStoreRepository.__init__(self, store, owns_store=owns)
            try:
                RepositorySessionManager.__init__(self, session_id=session_id, session_repository=self, **kwargs)
            except SessionExistsInStoreError:
                # Another process created it between our read and our create: use it.
                RepositorySessionManager.__init__(self, session_id=session_id, session_repository=self, **kwargs)
        except BaseException:
            if owns:
                store.close()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
