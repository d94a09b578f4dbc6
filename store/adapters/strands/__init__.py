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

from store.adapters.strands.manager import SessionStoreSessionManager
from store.adapters.strands.records import (
    AGENT_TYPE,
    AGENT_UPDATE_TYPE,
    MESSAGE_TYPE,
    MESSAGE_UPDATE_TYPE,
    MULTI_AGENT_TYPE,
    InvalidStrandsRecordError,
    NotFoundInSessionError,
    SessionExistsInStoreError,
    SessionNotFoundInStoreError,
    StrandsView,
    read_view,
)
from store.adapters.strands.repository import SessionStoreRepository

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
