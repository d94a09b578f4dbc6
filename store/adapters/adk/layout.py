"""How ADK's objects are named and kept as store entries: the store session ids of an app, a
user and a session (:class:`StoreIds`), the entry of an event (:func:`event_entry`), of a
shared-scope delta, and the revision marker ``append_event`` compares against."""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from google.adk.events.event import Event
from google.adk.sessions import _session_util

from store.adapters.names import session_id_for
from store.clock import iso_now
from store.errors import InvalidInputError

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


def _initial_scopes(state: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The scopes of a ``create_session`` state, as ADK's services keep it (JSON-safe)."""
    return _json_safe(_session_util.extract_json_safe_state_delta(dict(state)))  # type: ignore[no-any-return]


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


