"""``SessionStoreRepository``: Strands' ``SessionRepository`` over the store (records and the
fold in :mod:`store.adapters.strands.records`; the package's docstring says how it all fits)."""

from __future__ import annotations

import copy
import threading
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from strands.session.session_repository import SessionRepository
from strands.types.session import (
    Session,
    SessionAgent,
    SessionMessage,
    SessionType,
)

from store.adapters.strands.records import (
    _MAX_CACHED_VIEWS,
    AGENT_TYPE,
    AGENT_UPDATE_TYPE,
    HEADER_KEY,
    MESSAGE_TYPE,
    MESSAGE_UPDATE_TYPE,
    MULTI_AGENT_TYPE,
    NotFoundInSessionError,
    SessionExistsInStoreError,
    SessionNotFoundInStoreError,
    StrandsView,
    _as_json,
    _check_index,
    _check_str,
    _mark,
    _marked_entry,
    _starts_turn,
    _to_session_agent,
    _to_session_message,
    read_view,
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


