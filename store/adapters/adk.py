"""Google ADK's ``BaseSessionService`` on the store: ``SessionStoreSessionService``.

A drop-in for ``DatabaseSessionService`` that many processes on many machines can share::

    from google.adk.runners import Runner
    from store.adapters.adk import SessionStoreSessionService

    service = await SessionStoreSessionService.open("s3://bucket/adk?endpoint=...",
                                                    "redis://redis:6379/0")
    runner = Runner(app_name="app", agent=agent, session_service=service)
    ...
    await service.close()

or, over a store you already have: ``SessionStoreSessionService(async_store)``.

**How ADK's data maps onto the store.** ADK names a session by ``(app_name, user_id,
session_id)``, three arbitrary strings; the store's ids are ``[A-Za-z0-9._-]``, at most 128
characters. So every ADK object lives in a store session whose id is a digest of its names
(``<namespace>-<kind>-<40 hex digits of SHA-256>``, see :class:`StoreIds`), and the names
themselves are kept inside (in the header's ``pi_header["adk"]``):

- ``<ns>-s-…``, one per ADK session. Its **header** is the session's creation: the names, a
  random nonce, ``createTime`` and the initial state (session-scoped, and the ``app:``/``user:``
  keys it sets), written once with the store's conditional create (so ``create_session`` is
  atomic, and a second one with the same id gets ADK's ``AlreadyExistsError``). Each
  **event** is one pi ``custom`` entry::

      {"type": "custom", "customType": "adk.event", "id": "ev:<event.id>",
       "parentId": <previous entry>, "timestamp": <ISO of event.timestamp>,
       "data": event.model_dump(exclude_none=True, mode="json")}

  State deltas travel inside the event (``data.actions.state_delta``), exactly as ADK keeps
  them; the session's state is rebuilt by folding, in commit order, the initial state and the
  session-scoped keys of every event's delta (``temp:`` keys are never stored: ADK's own
  trimming runs first, as in every service of the framework).
- ``<ns>-a-…`` (one per app) and ``<ns>-u-…`` (one per app and user): the ``app:`` and
  ``user:`` scopes, shared by sessions. Each holds ``adk.state`` entries whose ``data.delta``
  is one event's (or one creation's) delta for that scope, without the prefix; the scope's
  state is their fold in the store's commit order (the last committed write of a key wins,
  the order every reader agrees on).
- ``<ns>-i-…`` (one per app and user): the session index, so ``list_sessions`` never scans
  the store. ``adk.index`` entries ``{"op": "created"|"deleted", "sessionId", "nonce"}``.
  ``<ns>-r-…`` (one per app): the app's users (``adk.user``), for
  ``list_sessions(app_name, user_id=None)``.

**Stale writers.** ``append_event`` appends with ``expected_tail_entry_id`` = the last entry
the caller's ``Session`` object knows: a compare-and-set. That entry is kept in ADK's own
revision marker, ``Session._storage_update_marker`` (``<creation nonce>/<tail entry id>``),
which this service sets on every session it returns or appends to, so a session read with a
``GetSessionConfig`` filter (fewer events) still knows the true tail; without a marker (a
``Session`` built elsewhere) it is the entry of the object's last event. While a session is
empty its tail is the same in every life of it, so the first append also checks the creation
nonce (a session deleted and created again since the object was read is another session).
A writer whose session object is behind the store (another process appended since it loaded)
gets ADK's ``StaleSessionError`` with ``DatabaseSessionService``'s message, and nothing is
written: it reloads (``get_session``) and appends again. Writers never merge silently. Within
one process, appends to one session are serialised (as the database service does), so tasks
sharing one ``Session`` object do not refuse each other.

**Shared scopes are written after the event.** One atomic batch reaches one store session,
so an event with ``app:``/``user:`` keys commits first (the event, with its delta, is the
truth), then its deltas are appended to the shared scopes under ids recorded in the event
entry (``"adk": {"app": <id>, "user": <id>}``). A re-send is idempotent (the store answers
DUPLICATE), so a process that dies in between loses nothing: the next ``get_session`` of that
session, anywhere, finds the deltas missing and appends them (late: a write to the same key
committed in between by another session is then overwritten). Within the process, a delta
that could not be written (backend down) is retried on the next call for that session.

**Listing.** ``list_sessions(app_name, user_id)`` reads that user's index (not the store),
then each listed session (in parallel) for its state and ``last_update_time``, as ADK's
``ListSessionsResponse`` carries state. ADK's interface has no pagination; the cost is one
read per session of the user. The index records ``created`` *before* the session is created
and ``deleted`` after it is gone, each with the creation's random nonce, so it is a superset
of the live sessions whatever crashes or races happen; sessions that do not exist are dropped
when read.

**Costs.** ``create_session``: the index record, then the header, with the two scopes read
meanwhile. ``append_event``: one append (plus one per shared scope its delta writes; the first append
through a session object read while the session was empty also reads the header).
``get_session``: three store sessions read at once (the session, its app scope, its user
scope); ``get_user_state`` reads one. A scope session grows by one entry per event that writes
it (the compactor keeps its reads cheap).

**Deleting** a session deletes its store session (every event); the app and user scopes keep
what it wrote, as in ``DatabaseSessionService``. An event hidden with ``store.redact`` is
left out of ``events`` and of the session's state fold.

Session ids are stripped of surrounding whitespace on create, get and delete, as the in-memory
and SQLite services do; a blank or missing one is generated (``google.adk.platform.uuid``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Self, TypeVar

from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import (
    SessionNotFoundError as AdkSessionNotFoundError,
)
from google.adk.events.event import Event
from google.adk.platform import time as platform_time
from google.adk.platform import uuid as platform_uuid
from google.adk.sessions import _session_util
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from google.adk.sessions.state import State

from store.adapters.names import digest, session_id_for
from store.clock import iso_now
from store.errors import (
    BackendError,
    ConflictError,
    IdCollisionError,
    IndeterminateError,
    InvalidInputError,
    SessionExistsError,
    SessionNotFoundError,
)
from store.model.rules import REDACTION_TYPE
from store.records import EMPTY_TAIL, AppendResult, Header

if TYPE_CHECKING:
    from store.aio import AsyncSessionStore
    from store.core import SessionStore

__all__ = [
    "EVENT_TYPE",
    "INDEX_TYPE",
    "STALE_SESSION_MESSAGE",
    "STATE_TYPE",
    "USER_TYPE",
    "SessionStoreSessionService",
    "StoreIds",
    "event_entry",
]

log = logging.getLogger("sessionstore.adk")

#: ``customType`` of the entry holding one event (``data`` is the event's JSON).
EVENT_TYPE = "adk.event"
#: ``customType`` of a delta of the ``app:`` or ``user:`` scope (``data.delta``).
STATE_TYPE = "adk.state"
#: ``customType`` of a session index record (``data.op`` is ``created`` or ``deleted``).
INDEX_TYPE = "adk.index"
#: ``customType`` of an app's user record (``data.userId``).
USER_TYPE = "adk.user"
#: Prefix of an event's entry id (the rest is ``event.id``).
EVENT_ID_PREFIX = "ev:"

#: What ``DatabaseSessionService`` says to a stale writer (its ``StaleSessionError``).
STALE_SESSION_MESSAGE = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)

_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,40}$")
_T = TypeVar("_T")


# --- naming ----------------------------------------------------------------------------------


class StoreIds:
    """The store session ids of an ADK app, user and session (``<ns>-<kind>-<digest>``).

    Kinds: ``s`` a session's events, ``u`` a user's ``user:`` state, ``i`` a user's session
    index, ``a`` an app's ``app:`` state, ``r`` an app's users. The digest is the first 40 hex
    digits of SHA-256 over the JSON list ``[kind, app_name, user_id, session_id]``.
    """

    def __init__(self, namespace: str = "adk") -> None:
        if not isinstance(namespace, str) or not _NAMESPACE_RE.match(namespace):
            raise InvalidInputError(
                f"namespace must match {_NAMESPACE_RE.pattern}, not {namespace!r}"
            )
        self.namespace = namespace

    def _id(self, kind: str, *names: str) -> str:
        return session_id_for("google-adk", kind, *names, namespace=self.namespace)

    def session(self, app_name: str, user_id: str, session_id: str) -> str:
        return self._id("s", app_name, user_id, session_id)

    def user_state(self, app_name: str, user_id: str) -> str:
        return self._id("u", app_name, user_id)

    def index(self, app_name: str, user_id: str) -> str:
        return self._id("i", app_name, user_id)

    def app_state(self, app_name: str) -> str:
        return self._id("a", app_name)

    def users(self, app_name: str) -> str:
        return self._id("r", app_name)


# --- entries ---------------------------------------------------------------------------------


def _json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (the store refuses NaN and
    Infinity; JSON has neither, and pydantic's JSON output writes them as null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _iso(ts: float) -> str:
    try:
        when = datetime.fromtimestamp(ts, UTC)
    except (OverflowError, OSError, ValueError):
        return iso_now()
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _event_data(event: Event) -> dict[str, Any]:
    """The event as JSON, as ``DatabaseSessionService`` stores it."""
    return _json_safe(event.model_dump(exclude_none=True, mode="json"))  # type: ignore[no-any-return]


def _scoped(delta: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"app": ..., "user": ..., "session": ...}`` of a JSON delta (``temp:`` dropped)."""
    return _session_util.extract_state_delta(dict(delta))


def _new_delta_ids(scoped: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    return {scope: f"d-{uuid.uuid4().hex}" for scope in ("app", "user") if scoped.get(scope)}


def event_entry(
    event: Event, parent_id: str | None, *, delta_ids: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The store entry an (already trimmed) ADK event is kept as.

    ``delta_ids``: the ids under which its ``app:``/``user:`` deltas are appended to the shared
    scopes (new random ones by default, when it has such deltas).
    """
    data = _event_data(event)
    entry: dict[str, Any] = {
        "type": "custom",
        "customType": EVENT_TYPE,
        "id": EVENT_ID_PREFIX + event.id,
        "parentId": parent_id,
        "timestamp": _iso(event.timestamp),
        "data": data,
    }
    if delta_ids is None:
        delta_ids = _new_delta_ids(_scoped((data.get("actions") or {}).get("state_delta") or {}))
    if delta_ids:
        entry["adk"] = dict(delta_ids)
    return entry


def _scope_entry(
    delta_id: str, timestamp: str, delta: dict[str, Any], source: dict[str, str]
) -> dict[str, Any]:
    return {
        "type": "custom",
        "customType": STATE_TYPE,
        "id": delta_id,
        "parentId": None,
        "timestamp": timestamp,
        "data": {"delta": delta, "source": source},
    }


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


def _marker(nonce: str | None, tail: str) -> str:
    """The ``Session._storage_update_marker`` this service sets: ``<creation nonce>/<tail
    entry id>`` (the tail is what ``append_event`` expects; the nonce tells the lives of a
    session apart while they are empty)."""
    return tail if nonce is None else f"{nonce}/{tail}"


def _parse_marker(marker: str | None) -> tuple[str | None, str | None]:
    """``(nonce, tail)`` of a marker (``(None, None)``: no marker)."""
    if marker is None:
        return None, None
    nonce, sep, tail = marker.partition("/")
    if sep and re.fullmatch(r"[0-9a-f]{32}", nonce):
        return nonce, tail
    return None, marker


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


def _check_name(what: str, value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string, not {type(value).__name__}")
    return value


def _norm_session_id(session_id: Any) -> str:
    _check_name("session_id", session_id)
    return str(session_id).strip()


async def _finish(awaitable: Awaitable[_T]) -> _T:
    """Await a write to its end even if the caller is cancelled meanwhile (then re-raise the
    cancellation): a write running in the store's thread cannot be stopped halfway, and the
    shared scopes must get the deltas of an event that was committed."""
    task = asyncio.ensure_future(awaitable)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    if cancelled is not None:
        if not task.cancelled():
            task.exception()
        raise cancelled
    return task.result()


# --- the service -----------------------------------------------------------------------------


class SessionStoreSessionService(BaseSessionService):
    """ADK's ``BaseSessionService`` over a :class:`~store.aio.AsyncSessionStore`.

    Any number of these services, in any number of processes, may serve the same sessions
    at once. ``namespace`` prefixes every store session id this service uses (so several
    independent ADK deployments can share one store). ``resend_attempts``: re-sends of one
    batch after ``IndeterminateError`` before giving up. ``list_concurrency``: sessions read
    at once by ``list_sessions``.
    """

    def __init__(
        self,
        store: AsyncSessionStore | SessionStore,
        *,
        namespace: str = "adk",
        resend_attempts: int = 5,
        list_concurrency: int = 16,
        owns_store: bool = False,
    ) -> None:
        from store.aio import AsyncSessionStore
        from store.core import SessionStore

        if isinstance(store, SessionStore):
            store = AsyncSessionStore(store, owns_store=owns_store)
        elif not isinstance(store, AsyncSessionStore):
            raise InvalidInputError("store must be a store.aio.AsyncSessionStore or a store.SessionStore")
        self.store = store
        self.ids = StoreIds(namespace)
        self._resend_attempts = max(0, int(resend_attempts))
        self._list_concurrency = max(1, int(list_concurrency))
        self._owns_store = owns_store
        self._locks: dict[str, asyncio.Lock] = {}
        self._lock_users: dict[str, int] = {}
        #: Shared-scope writes of committed events not written yet: store sid -> [(target, entry)].
        self._pending: dict[str, list[tuple[str, dict[str, Any]]]] = {}

    @classmethod
    async def open(
        cls,
        objects_url: str,
        redis_url: str | None = None,
        *,
        namespace: str = "adk",
        **store_options: Any,
    ) -> SessionStoreSessionService:
        """A service over a store of its own (``AsyncSessionStore.open``); ``await
        service.close()`` closes it."""
        from store.aio import AsyncSessionStore

        StoreIds(namespace)
        store = await AsyncSessionStore.open(objects_url, redis_url, **store_options)
        return cls(store, namespace=namespace, owns_store=True)

    async def close(self) -> None:
        """Close the store if this service owns it."""
        if self._owns_store:
            await self.store.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def store_session_id(self, app_name: str, user_id: str, session_id: str) -> str:
        """The store session holding this ADK session's events."""
        return self.ids.session(app_name, user_id, session_id.strip())

    # --- create ------------------------------------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        _check_name("app_name", app_name)
        _check_name("user_id", user_id)
        if state is not None and not isinstance(state, Mapping):
            raise InvalidInputError(f"state must be a dict, not {type(state).__name__}")
        if state and not all(isinstance(key, str) for key in state):
            raise InvalidInputError("state keys must be strings")
        session_id = _norm_session_id(session_id) if session_id is not None else ""
        if not session_id:
            session_id = platform_uuid.new_uuid()
        return await _finish(self._create(app_name, user_id, dict(state or {}), session_id))

    async def _create(
        self, app_name: str, user_id: str, state: dict[str, Any], session_id: str
    ) -> Session:
        sid = self.ids.session(app_name, user_id, session_id)
        scoped = _json_safe(_session_util.extract_json_safe_state_delta(state))
        shared = {State.APP_PREFIX + k: v for k, v in scoped["app"].items()}
        shared.update({State.USER_PREFIX + k: v for k, v in scoped["user"].items()})
        nonce = uuid.uuid4().hex
        create_time = platform_time.get_time()
        stamp = _iso(create_time)
        meta = {
            "kind": "session",
            "appName": app_name,
            "userId": user_id,
            "sessionId": session_id,
            "nonce": nonce,
            "createTime": create_time,
            "timestamp": stamp,
            "state": scoped["session"],
        }
        delta_ids = _new_delta_ids(scoped)
        if delta_ids:
            meta["sharedState"] = shared
            meta["deltaIds"] = delta_ids
        pi_header = {"type": "session", "version": 3, "id": sid, "timestamp": stamp, "cwd": "", "adk": meta}
        # The index learns of the session before it exists: it is a superset of the live ones.
        await asyncio.gather(
            self._index(app_name, user_id, "created", session_id, nonce),
            self._register_user(app_name, user_id),
        )
        created = asyncio.ensure_future(self.store.create_session(sid, pi_header=pi_header))
        scopes = asyncio.ensure_future(self._load_scopes(app_name, user_id))
        try:
            await created
        except SessionExistsError:
            await asyncio.gather(scopes, return_exceptions=True)
            with contextlib.suppress(BackendError, IndeterminateError):
                await self._index(app_name, user_id, "deleted", session_id, nonce)  # abandoned
            raise AlreadyExistsError(f"Session with id {session_id} already exists.") from None
        except BaseException:
            await asyncio.gather(scopes, return_exceptions=True)
            raise
        app_entries, user_entries = await scopes
        loaded = _Loaded(created.result().header, [])
        writes = loaded.scope_writes()
        await self._write_scopes(sid, app_name, user_id, writes)
        app_state = _fold_scope([*app_entries, *(e for s, e in writes if s == "app")])
        user_state = _fold_scope([*user_entries, *(e for s, e in writes if s == "user")])
        session = Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=_merge_state(app_state, user_state, scoped["session"]),
            events=[],
            last_update_time=create_time,
        )
        session._storage_update_marker = _marker(nonce, EMPTY_TAIL)
        return session

    # --- read --------------------------------------------------------------------------------

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        _check_name("app_name", app_name)
        _check_name("user_id", user_id)
        session_id = _norm_session_id(session_id)
        if not session_id:
            return None
        sid = self.ids.session(app_name, user_id, session_id)
        loaded, (app_entries, user_entries) = await asyncio.gather(
            self._load(sid), self._load_scopes(app_name, user_id)
        )
        if loaded is None or not loaded.names_match(app_name, user_id, session_id):
            return None
        # Deltas of committed events that never reached their scope (a writer died between
        # the two appends): write them now, and count them in this read.
        present = {e["id"] for e in app_entries} | {e["id"] for e in user_entries}
        missing = [(s, e) for s, e in loaded.scope_writes() if e["id"] not in present]
        self._pending.pop(sid, None)
        if missing:
            await _finish(self._write_scopes(sid, app_name, user_id, missing))
            app_entries = [*app_entries, *(e for s, e in missing if s == "app")]
            user_entries = [*user_entries, *(e for s, e in missing if s == "user")]
        events = [Event.model_validate(e["data"]) for e in loaded.events] if (
            config is None or config.num_recent_events != 0
        ) else []
        session = Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=_merge_state(_fold_scope(app_entries), _fold_scope(user_entries), loaded.session_state()),
            events=_filter_events(events, config),
            last_update_time=loaded.last_update_time(),
        )
        session._storage_update_marker = loaded.marker
        return session

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        _check_name("app_name", app_name)
        _check_name("user_id", user_id)
        return _fold_scope(await self._entries(self.ids.user_state(app_name, user_id)))

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """The sessions of a user (or of every user of the app), without their events, with
        their merged state; least recently updated first (ADK's order)."""
        _check_name("app_name", app_name)
        if user_id is not None:
            users = [_check_name("user_id", user_id)]
        else:
            users = sorted({
                e["data"]["userId"]
                for e in await self._entries(self.ids.users(app_name))
                if e.get("customType") == USER_TYPE and isinstance((e.get("data") or {}).get("userId"), str)
            })
        gate = asyncio.Semaphore(self._list_concurrency)

        async def gated(coro: Awaitable[_T]) -> _T:
            async with gate:
                return await coro

        app_entries, *per_user = await asyncio.gather(
            gated(self._entries(self.ids.app_state(app_name))),
            *(self._list_user(app_name, u, gated) for u in users),
        )
        app_state = _fold_scope(app_entries)
        sessions: list[Session] = []
        for user, (user_state, found) in zip(users, per_user):
            for session_id, loaded in found:
                session = Session(
                    id=session_id,
                    app_name=app_name,
                    user_id=user,
                    state=_merge_state(app_state, user_state, loaded.session_state()),
                    events=[],
                    last_update_time=loaded.last_update_time(),
                )
                session._storage_update_marker = loaded.marker
                sessions.append(session)
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    async def _list_user(
        self, app_name: str, user_id: str, gated: Any
    ) -> tuple[dict[str, Any], list[tuple[str, _Loaded]]]:
        # Only the reads are gated (never a task that waits for other gated tasks).
        index_entries, user_entries = await asyncio.gather(
            gated(self._entries(self.ids.index(app_name, user_id))),
            gated(self._entries(self.ids.user_state(app_name, user_id))),
        )
        live: dict[str, set[str]] = {}
        for entry in index_entries:
            data = entry.get("data")
            if entry.get("customType") != INDEX_TYPE or not isinstance(data, dict):
                continue
            nonces = live.setdefault(data.get("sessionId"), set())
            if data.get("op") == "created":
                nonces.add(data.get("nonce"))
            elif data.get("op") == "deleted":
                nonces.discard(data.get("nonce"))
        candidates = sorted(s for s, nonces in live.items() if nonces and isinstance(s, str))
        loaded = await asyncio.gather(
            *(gated(self._load(self.ids.session(app_name, user_id, s))) for s in candidates)
        )
        found = [
            (s, one)
            for s, one in zip(candidates, loaded)
            if one is not None and one.names_match(app_name, user_id, s)
        ]
        return _fold_scope(user_entries), found

    # --- delete ------------------------------------------------------------------------------

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        _check_name("app_name", app_name)
        _check_name("user_id", user_id)
        session_id = _norm_session_id(session_id)
        if not session_id:
            return
        await _finish(self._delete(app_name, user_id, session_id))

    async def _delete(self, app_name: str, user_id: str, session_id: str) -> None:
        sid = self.ids.session(app_name, user_id, session_id)
        try:
            header = await self.store.get_header(sid)
            await self.store.delete_session(sid)
        except SessionNotFoundError:
            return
        self._pending.pop(sid, None)
        nonce = (header.pi_header.get("adk") or {}).get("nonce")
        if isinstance(nonce, str):
            await self._index(app_name, user_id, "deleted", session_id, nonce)

    # --- append ------------------------------------------------------------------------------

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        _check_name("app_name", session.app_name)
        _check_name("user_id", session.user_id)
        # As every ADK service: temp: state reaches the in-memory session, never the store.
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        sid = self.ids.session(session.app_name, session.user_id, session.id)
        async with self._session_lock(sid):
            marker = await _finish(self._append_event(sid, session, event))
            session._storage_update_marker = marker
            session.last_update_time = event.timestamp
        return self._commit_event_to_session(session, event)

    async def _append_event(self, sid: str, session: Session, event: Event) -> str:
        await self._flush_pending(sid, session.app_name, session.user_id)
        nonce, expected = _parse_marker(session._storage_update_marker)
        if expected is None:  # a session object this service did not return
            expected = EVENT_ID_PREFIX + session.events[-1].id if session.events else EMPTY_TAIL
        try:
            if expected == EMPTY_TAIL and nonce is not None:
                # Every new life of a session starts empty: only its creation's nonce tells
                # whether this object saw this life (deleted and created again meanwhile?).
                header = await self.store.get_header(sid)
                if (header.pi_header.get("adk") or {}).get("nonce") != nonce:
                    raise StaleSessionError(STALE_SESSION_MESSAGE)
            entry = event_entry(event, expected or None)
            await self._append(sid, [entry], expected)
        except ConflictError as exc:
            raise StaleSessionError(STALE_SESSION_MESSAGE) from exc
        except SessionNotFoundError:
            raise AdkSessionNotFoundError(f"Session {session.id} not found.") from None
        except IdCollisionError as exc:
            raise AlreadyExistsError(
                f"Event with id {event.id} already exists in session {session.id}."
            ) from exc
        ids = entry.get("adk")
        if ids:
            source = {"userId": session.user_id, "sessionId": session.id, "entryId": entry["id"]}
            scoped = _scoped(entry["data"]["actions"]["state_delta"])
            writes = [(s, _scope_entry(i, entry["timestamp"], scoped[s], source)) for s, i in ids.items()]
            await self._write_scopes(sid, session.app_name, session.user_id, writes)
        return _marker(nonce, str(entry["id"]))

    # --- the store ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _session_lock(self, sid: str) -> AsyncIterator[None]:
        """Appends to one session from this process, one at a time (as ADK's database service
        does): tasks sharing a ``Session`` object then each see the others' marker."""
        lock = self._locks.get(sid)
        if lock is None:
            lock = self._locks[sid] = asyncio.Lock()
        self._lock_users[sid] = self._lock_users.get(sid, 0) + 1
        try:
            async with lock:
                yield
        finally:
            left = self._lock_users[sid] - 1
            if left:
                self._lock_users[sid] = left
            else:
                del self._lock_users[sid]
                del self._locks[sid]

    async def _append(
        self, sid: str, entries: list[dict[str, Any]], expected: str | None = None
    ) -> AppendResult:
        """One batch; an unknown outcome is answered by re-sending it (idempotent)."""
        return await self.store.append_resending(sid, entries, expected, resends=self._resend_attempts)

    async def _append_creating(self, sid: str, entries: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        """Append to a session of the service's own (scope, index), creating it on first use."""
        try:
            await self._append(sid, entries)
            return
        except SessionNotFoundError:
            pass
        pi_header = {"type": "session", "version": 3, "id": sid, "timestamp": iso_now(), "cwd": "", "adk": meta}
        with contextlib.suppress(SessionExistsError):
            await self.store.create_session(sid, pi_header=pi_header)
        await self._append(sid, entries)

    async def _entries(self, sid: str) -> list[dict[str, Any]]:
        try:
            return _without_redacted(await self.store.load_session_entries(sid))
        except SessionNotFoundError:
            return []

    async def _load(self, sid: str) -> _Loaded | None:
        try:
            data = await self.store.read_session(sid)
        except SessionNotFoundError:
            return None
        return _Loaded(data.header, list(data.all_entries))

    async def _load_scopes(
        self, app_name: str, user_id: str
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        app_entries, user_entries = await asyncio.gather(
            self._entries(self.ids.app_state(app_name)),
            self._entries(self.ids.user_state(app_name, user_id)),
        )
        return app_entries, user_entries

    async def _write_scopes(
        self, sid: str, app_name: str, user_id: str, writes: list[tuple[str, dict[str, Any]]]
    ) -> None:
        """Append shared-scope deltas of ``sid``'s committed entries; on a backend failure keep
        them for the next call on that session (they are committed in the session already)."""
        if not writes:
            return
        targets = {
            "app": (self.ids.app_state(app_name), {"kind": "app-state", "appName": app_name}),
            "user": (
                self.ids.user_state(app_name, user_id),
                {"kind": "user-state", "appName": app_name, "userId": user_id},
            ),
        }
        failed: list[tuple[str, dict[str, Any]]] = []
        for scope, entry in writes:
            target, meta = targets[scope]
            try:
                await self._append_creating(target, [entry], meta)
            except (BackendError, IndeterminateError) as exc:
                log.warning("ADK %s state delta %s of session %s not written yet (%s): "
                            "retried on the next call for that session", scope, entry["id"], sid, exc)
                failed.append((scope, entry))
        if failed:
            self._pending.setdefault(sid, []).extend(failed)

    async def _flush_pending(self, sid: str, app_name: str, user_id: str) -> None:
        writes = self._pending.pop(sid, None)
        if writes:
            await self._write_scopes(sid, app_name, user_id, writes)

    async def _index(self, app_name: str, user_id: str, op: str, session_id: str, nonce: str) -> None:
        entry = {
            "type": "custom",
            "customType": INDEX_TYPE,
            "id": f"{op}-{nonce}",
            "parentId": None,
            "timestamp": iso_now(),
            "data": {"op": op, "sessionId": session_id, "nonce": nonce},
        }
        await self._append_creating(
            self.ids.index(app_name, user_id),
            [entry],
            {"kind": "session-index", "appName": app_name, "userId": user_id},
        )

    async def _register_user(self, app_name: str, user_id: str) -> None:
        user_digest = digest(json.dumps(user_id), scheme="sha256-40")
        entry = {
            "type": "custom",
            "customType": USER_TYPE,
            "id": f"user-{user_digest}",
            "parentId": None,
            "timestamp": iso_now(),
            "data": {"userId": user_id},
        }
        try:
            await self._append_creating(
                self.ids.users(app_name), [entry], {"kind": "app-users", "appName": app_name}
            )
        except IdCollisionError:
            pass  # registered before (the record differs only by its timestamp)
