"""``SessionStoreSessionService``: ADK's ``BaseSessionService`` over the store (the layout is
in :mod:`store.adapters.adk.layout`, the reading fold in :mod:`store.adapters.adk.state`; the
package's docstring says how it all fits)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import (
    SessionNotFoundError as AdkSessionNotFoundError,
)
from google.adk.events.event import Event
from google.adk.platform import time as platform_time
from google.adk.platform import uuid as platform_uuid
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from google.adk.sessions.state import State

from store.adapters.adk.layout import (
    EVENT_ID_PREFIX,
    INDEX_TYPE,
    STALE_SESSION_MESSAGE,
    USER_TYPE,
    StoreIds,
    _initial_scopes,
    _iso,
    _marker,
    _new_delta_ids,
    _parse_marker,
    _scope_entry,
    _scoped,
    event_entry,
)
from store.adapters.adk.state import (
    _filter_events,
    _fold_scope,
    _Loaded,
    _merge_state,
    _without_redacted,
)
from store.adapters.names import digest
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
from store.formats.records import EMPTY_TAIL, AppendResult

if TYPE_CHECKING:
    from store.aio import AsyncSessionStore
    from store.core import SessionStore

log = logging.getLogger("sessionstore.adk")

_T = TypeVar("_T")


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
        scoped = _initial_scopes(state)
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
