"""The Claude Agent SDK's ``SessionStore`` on the store: ``ClaudeSessionStore``.

A transcript mirror that many processes on many machines share::

    from claude_agent_sdk import ClaudeAgentOptions, query
    from store.adapters.claude_agent_sdk import ClaudeSessionStore

    store = await ClaudeSessionStore.open("s3://bucket/claude?endpoint=...", "redis://redis:6379/0")
    async for message in query(prompt="hi", options=ClaudeAgentOptions(session_store=store)):
        ...
    await store.close()

or ``ClaudeSessionStore(async_store)`` over an :class:`~store.aio.AsyncSessionStore` you have.
Every method of the SDK's protocol is implemented: ``append`` and ``load``, and the optional
``list_sessions``, ``list_session_summaries``, ``delete`` and ``list_subkeys``; all are
awaitable and never block the event loop (the store's protocols run on threads).

**Keys.** Each SDK key ``{project_key, session_id, subpath?}`` is one session of the store,
named ``cc.<P>.<S>`` (a main transcript) or ``cc.<P>.<S>.<U>`` (a subpath: a subagent's
transcript, its own stream), where ``P`` hashes the project key (and the store's
``namespace``), ``S`` is the session id itself when it is a plain token of at most 64
characters (a UUID is) and a hash otherwise, and ``U`` hashes the subpath. The header of each
such session names its key in full (``pi_header["claudeAgentSdk"]``).

**Entries.** Each SDK entry is one pi ``custom`` entry whose ``data`` is the entry, verbatim::

    {"type": "custom", "customType": "claude-agent-sdk.entry", "id": <see below>,
     "parentId": <previous entry of the batch>, "timestamp": <the entry's own>,
     "batch": <hash of the batch>, "data": <the SDK entry>}

One ``append`` call is one atomic batch (split only past the store's batch limits, in order).
The id is ``u.<uuid>`` for an entry with a ``uuid``: the store keeps ids unique, so an entry is
stored once however often it is sent, and a batch that mixes stored and new uuids stores only
the new ones (the duplicates' first stored copy wins). An entry without a ``uuid`` in a batch
that has one gets an id derived from its content and its place next to the batch's uuids (the
nearest uuid before it and the distance), so re-sending the batch (after a lost response, a
timeout, ``IndeterminateError``) duplicates nothing, nor does importing the same file again in
batches cut elsewhere, unless a cut falls between such an entry and its anchor. In a batch
without any ``uuid`` they get fresh ids and are appended as sent, as the SDK asks. ``load``
returns the ``data`` of these entries in the store's commit order (one order every reader
agrees on; each writer's calls in its own order).

**The project index.** Per project, one more session, ``cc.<P>``, holds small records (pi
``custom`` entries of type ``claude-agent-sdk.index``): ``reg`` when a key's stream is created,
``del`` when it is deleted (naming the incarnations it ended). Summaries are not written: an
``append`` is one object write (its transcript's segment). ``list_sessions`` and
``list_session_summaries`` read the index (incrementally), then fold each main transcript it
lists with ``fold_session_summary``, only the segments this process has not folded yet, onto
the fold it keeps (``AsyncSessionStore.read_since``): a fold of exactly what ``load`` returns.
``mtime`` (both lists) is the newest write time appends stamp on their entries. (``sum``
records of earlier versions only give the mtime of transcripts written before the stamps.)

**Costs.** A steady append: one PUT and the store's two Redis scripts. A cold ``load`` of an
uncompacted transcript reads its segments (Redis's recent-segments cache serves the newest);
once the compactor has merged it, a few GETs whatever its length
(``tests/test_adapter_claude_agent_sdk.py``, ``benchmarks/peers/claude_agent_sdk.py``). A
listing costs, per main transcript, its new segments and a probe.

A ``delete`` racing with appends to the same key may leave the racing
stream unlisted (the SDK deletes only when asked to).
"""

from __future__ import annotations

from store.adapters.claude_agent_sdk.files import export_claude_projects, import_claude_projects
from store.adapters.claude_agent_sdk.records import ENTRY_TYPE, HEADER_KEY, INDEX_TYPE
from store.adapters.claude_agent_sdk.session_store import ClaudeSessionStore

__all__ = [
    "ENTRY_TYPE",
    "HEADER_KEY",
    "INDEX_TYPE",
    "ClaudeSessionStore",
    "export_claude_projects",
    "import_claude_projects",
]
