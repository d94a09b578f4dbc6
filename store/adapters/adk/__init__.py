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
DUPLICATE), so a process that dies or pauses in between loses nothing: the next
``get_session`` of that session, anywhere, finds the deltas missing and appends them (late: a
write to the same key committed in between by another session is then overwritten), and the
writer, back, re-sends the same ids (a duplicate: nothing doubles, nothing is overwritten).
Within the process, a delta that could not be written (backend down) is retried on the next
call for that session. Why this is not one write (one batch per store session, a
compare-and-set per ADK session, and a ``get_session`` that must show every session's shared
writes at a bounded cost cannot all hold): ``docs/adapters.md``, "Why not one write".

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

from store.adapters.adk.layout import (
    EVENT_TYPE,
    INDEX_TYPE,
    STALE_SESSION_MESSAGE,
    STATE_TYPE,
    USER_TYPE,
    StoreIds,
    event_entry,
)
from store.adapters.adk.service import SessionStoreSessionService

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
