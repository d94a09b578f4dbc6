"""The OpenAI Agents SDK's ``Session`` protocol on the store: ``SessionStoreSession``.

A drop-in for ``SQLiteSession`` that many processes on many machines can share::

    from agents import Agent, Runner
    from store.adapters.openai_agents import SessionStoreSession

    session = await SessionStoreSession.open("user-42", "s3://bucket/agents?endpoint=...",
                                             "redis://redis:6379/0")
    result = await Runner.run(agent, "hi", session=session)
    await session.close()

or, for many sessions over one store: ``SessionStoreSession(session_id, async_store)``.

**How items are stored.** A session of the SDK is a session of the store with the same id,
created on first write (a creator that loses the race to another process gets
``SessionExistsError`` and simply uses the session). Each item is one pi ``custom`` entry::

    {"type": "custom", "customType": "openai-agents.item", "id": <random>, "parentId": <previous>,
     "timestamp": <ISO>, "data": <the item, as JSON>}

One ``add_items`` call is one atomic batch (its entries chained by ``parentId``): every reader
sees all of its items or none. The items of a session are the ``openai-agents.item`` entries in
the store's commit order, the one linear order every reader agrees on, minus those that a
later marker entry removed:

- ``pop_item`` appends ``{"customType": "openai-agents.pop", "data": {"itemId": <entry id>}}``
  naming the newest live item, *only if the session's tail is still the entry it read*
  (``expected_tail_entry_id``: a compare-and-set across machines); on ``ConflictError`` it
  reads again and retries. So two concurrent pops never return the same item, and a pop never
  removes an item other than the newest one at the moment it is committed.
- ``clear_session`` appends ``{"customType": "openai-agents.clear"}``: every item committed
  before it is gone for every reader. A marker rather than ``delete_session``: it is one atomic
  append, totally ordered with concurrent ``add_items`` and ``pop_item`` from other processes
  (an item added after the clear is kept, one added before is gone, never "half"), it never
  makes another process's write fail with ``SessionNotFoundError`` or resurrect a session under
  a reader's feet, and the history stays auditable (export, ``sessionstore show``). The bytes of
  cleared items stay in storage; ``await session.delete()`` removes the whole session for good.

Entries of other types or custom types in the same session (e.g. pi messages written by other
tools) are ignored, and a redacted item (``store.redact``) is no longer returned.

``add_items`` first tries to append after the tail it knows (``expected_tail_entry_id``), so
that the entries form one chain in pi's tree too; after a few lost races it appends without
the check (the batch then hangs as a sibling branch off the tail it saw, and the commit order
is unchanged), so it never fails because other writers are busy. ``IndeterminateError``
(outcome unknown) is answered by re-sending the very same batch, which the store makes
idempotent, a bounded number of times.

The SDK's ``session_settings`` (``SessionSettings(limit=...)``) is honoured as by
``SQLiteSession``: ``get_items()`` without a limit returns the latest ``limit`` items.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self, TypeVar

from agents.memory import SessionSettings

from store.clock import iso_now
from store.errors import (
    ConflictError,
    ContentionError,
    IndeterminateError,
    InvalidEntryError,
    InvalidInputError,
    SessionExistsError,
    SessionNotFoundError,
    UnknownParentError,
)
from store.adapters.names import session_id_for
from store.model.rules import REDACTION_TYPE, is_tombstone
from store.formats.records import EMPTY_TAIL, AppendResult

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

    from store.aio import AsyncSessionStore

__all__ = [
    "CLEAR_TYPE",
    "ITEM_TYPE",
    "POP_TYPE",
    "InvalidItemError",
    "SessionStoreSession",
    "items_from_entries",
    "store_session_id",
]

#: ``customType`` of the entry holding one item (``data`` is the item).
ITEM_TYPE = "openai-agents.item"
#: ``customType`` of the marker removing one item (``data.itemId`` names its entry).
POP_TYPE = "openai-agents.pop"
#: ``customType`` of the marker removing every item committed before it.
CLEAR_TYPE = "openai-agents.clear"

_T = TypeVar("_T")

#: Bound on the rounds of one append (only a session deleted and created again over and over
#: while an append runs can use them up: lost compare-and-sets fall back to a plain append).
_MAX_APPEND_ROUNDS = 100


class InvalidItemError(InvalidInputError):
    """An item that cannot be stored (not a JSON object, not JSON-serialisable, NaN, ...).

    ``index`` is its position in the ``add_items`` list. Nothing of that call was written.
    """

    def __init__(self, message: str, *, index: int | None = None) -> None:
        self.index = index
        where = f"item {index}: " if index is not None else ""
        super().__init__(where + message)


def items_from_entries(entries: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """The live items of a session, oldest first, as ``(entry id, item)``: the item entries in
    commit order, without those a later pop or clear marker (or a redaction) removed."""
    live: dict[str, Any] = {}
    if not _fold_items(live, entries):
        from store.model.session import Session

        live.clear()
        _fold_items(live, list(Session({}, entries, validated=True).entries), applied=True)
    return list(live.items())


def _fold_items(live: dict[str, Any], entries: list[dict[str, Any]], *, applied: bool = False) -> bool:
    """Fold ``entries`` (in commit order) into ``live`` (entry id -> item). False when one of
    them is a redaction of something other than a live item (a marker, say): only the whole
    session then tells what is live (``items_from_entries``). ``applied``: the redactions are
    applied already (their targets are tombstones)."""
    for entry in entries:
        if entry.get("type") == REDACTION_TYPE:
            if applied:
                continue
            target = entry.get("targetId")
            if not is_tombstone(entry) and target in live:
                del live[target]  # a redacted item is a tombstone without data: gone
                continue
            return False
        if entry.get("type") != "custom":
            continue
        kind = entry.get("customType")
        if kind == ITEM_TYPE:
            if "data" in entry:  # a redacted item is a tombstone without data: gone
                live[entry["id"]] = entry["data"]
        elif kind == POP_TYPE:
            data = entry.get("data")
            if isinstance(data, dict) and isinstance(data.get("itemId"), str):
                live.pop(data["itemId"], None)
        elif kind == CLEAR_TYPE:
            live.clear()
    return True


@dataclass(frozen=True, slots=True)
class _Items:
    """A session's live items as this process last read them: through segment ``seq`` of
    incarnation ``inc``, whose last entry is ``tail``. Never changed once made (copied)."""

    inc: str
    seq: int
    tail: str
    live: dict[str, Any]


class _ItemCache:
    """This process's copies of sessions' live items, per store (least recently used out
    first): what lets a read fetch only the segments after the ones it holds. A copy can
    only be behind, never wrong (segments never change within an incarnation), and a copy of
    another incarnation is never extended: the read starts over."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._items: OrderedDict[str, _Items] = OrderedDict()

    def get(self, sid: str) -> _Items | None:
        with self._lock:
            got = self._items.get(sid)
            if got is not None:
                self._items.move_to_end(sid)
            return got

    def put(self, sid: str, items: _Items) -> None:
        with self._lock:
            cur = self._items.get(sid)
            if cur is not None and cur.inc == items.inc and cur.seq > items.seq:
                return  # another task of this process read further meanwhile
            self._items[sid] = items
            self._items.move_to_end(sid)
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def drop(self, sid: str) -> None:
        with self._lock:
            self._items.pop(sid, None)


#: Sessions whose items a process keeps per store.
CACHED_SESSIONS = 256
_CACHES: weakref.WeakKeyDictionary[Any, _ItemCache] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def _cache_of(store: Any) -> _ItemCache:
    with _CACHES_LOCK:
        cache = _CACHES.get(store)
        if cache is None:
            cache = _CACHES[store] = _ItemCache(CACHED_SESSIONS)
        return cache


def store_session_id(session_id: str) -> str:
    """The store's session id for an SDK session id.

    The SDK takes any string (``"user:42"``, an email address, ...); the store's ids are
    letters, digits, ``.``, ``_`` and ``-``, at most 128 characters. An id that is a valid
    store id is used as it is (``sessionstore show support-42`` finds it); any other string is
    mapped to ``oai-`` and the first 40 hex digits of its SHA-256, the same in every process.
    """
    return session_id_for("openai-agents", session_id)


def _new_id() -> str:
    return uuid.uuid4().hex


def _as_json(item: Any, index: int) -> dict[str, Any]:
    """The item as the JSON it will be read back as (what ``SQLiteSession`` stores), or a
    typed error."""
    if not isinstance(item, Mapping):
        what = "None" if item is None else type(item).__name__
        raise InvalidItemError(f"an item must be a JSON object (a dict), not {what}", index=index)
    try:
        text = json.dumps(item, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidItemError(f"not serialisable as JSON: {exc}", index=index) from None
    return json.loads(text)  # type: ignore[no-any-return]


async def _finish(awaitable: Awaitable[_T]) -> _T:
    """Await a write to its end even if the caller is cancelled meanwhile (then re-raise the
    cancellation), as the SDK's own sessions do: a write in the store's thread cannot be
    stopped halfway, and the caller must not go on (or close the store) before it ends."""
    task = asyncio.ensure_future(awaitable)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" warning
        raise cancelled
    return task.result()


class SessionStoreSession:
    """The SDK's ``Session`` protocol over a :class:`~store.aio.AsyncSessionStore`.

    A structural implementation of ``agents.memory.Session`` (``isinstance(s, Session)``
    holds), as the SDK asks of third-party sessions (its ``SessionABC`` is for its own).

    ``session_id`` is any non-empty string, as in the SDK; the store session it lives in is
    ``store_session_id`` (the same id when it is a valid store id, else a stable hash of it:
    :func:`store_session_id`). Any number of these objects, in any
    number of processes, may serve one session at once. The object keeps no state but a hint
    of the session's tail, so it is cheap: build one per conversation over a shared store.

    ``cas_rounds``: how many times ``add_items`` appends after the tail it read before it
    appends without the check. ``resend_attempts``: re-sends of one batch after
    ``IndeterminateError`` before giving up (raising it). ``pop_rounds``: reads-and-retries of
    ``pop_item`` lost to other writers before ``ContentionError``.
    """

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        session_id: str,
        store: AsyncSessionStore,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        cas_rounds: int = 3,
        resend_attempts: int = 5,
        pop_rounds: int = 100,
        owns_store: bool = False,
    ) -> None:
        self.session_id = session_id
        self.store_session_id = store_session_id(session_id)
        self.store = store
        if isinstance(session_settings, Mapping):
            session_settings = SessionSettings(**session_settings)
        elif session_settings is not None and not isinstance(session_settings, SessionSettings):
            raise InvalidInputError("session_settings must be a SessionSettings or a dict")
        self.session_settings = session_settings if session_settings is not None else SessionSettings()
        self._cas_rounds = max(0, int(cas_rounds))
        self._resend_attempts = max(0, int(resend_attempts))
        self._pop_rounds = max(1, int(pop_rounds))
        self._owns_store = owns_store
        #: The last tail this object saw (an entry id, EMPTY_TAIL, or None: unknown).
        self._tail: str | None = None

    @classmethod
    async def open(
        cls,
        session_id: str,
        objects_url: str,
        redis_url: str | None = None,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        **store_options: Any,
    ) -> SessionStoreSession:
        """A session over a store of its own, built from URLs (``AsyncSessionStore.open``);
        ``await session.close()`` closes that store."""
        from store.aio import AsyncSessionStore

        store_session_id(session_id)  # a bad id fails before a store is opened
        store = await AsyncSessionStore.open(objects_url, redis_url, **store_options)
        return cls(session_id, store, session_settings=session_settings, owns_store=True)

    async def close(self) -> None:
        """Close the store if this session owns it (built by :meth:`open`)."""
        if self._owns_store:
            await self.store.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"SessionStoreSession({self.session_id!r})"

    # --- reads -------------------------------------------------------------------------------

    async def _read(self) -> tuple[list[tuple[str, Any]], str]:
        """The live items and the tail they were read at (EMPTY_TAIL: no entry yet).

        Only what is new since this process last read the session is fetched
        (``AsyncSessionStore.read_since``: the segments after the ones held, the probe after
        them); the first read in a process, and a read of a session deleted and created
        again since, read it whole."""
        sid = self.store_session_id
        cache = _cache_of(self.store)
        known = cache.get(sid)
        try:
            changes = await self.store.read_since(
                sid,
                incarnation=known.inc if known is not None else None,
                after_seq=known.seq if known is not None else 0,
            )
        except SessionNotFoundError:
            cache.drop(sid)
            self._tail = EMPTY_TAIL
            return [], EMPTY_TAIL
        if changes.whole or known is None:
            live: dict[str, Any] = dict(items_from_entries(changes.entries))
            tail = str(changes.entries[-1]["id"]) if changes.entries else EMPTY_TAIL
        else:
            live, tail = dict(known.live), known.tail
            if changes.entries:
                tail = str(changes.entries[-1]["id"])
                if not _fold_items(live, changes.entries):
                    cache.drop(sid)  # a redaction only the whole session can apply
                    return await self._read()
        cache.put(sid, _Items(changes.header.incarnation, changes.seq, tail, live))
        self._tail = tail
        return list(live.items()), tail

    def _note_append(self, entries: list[dict[str, Any]], result: AppendResult) -> None:
        """Extend this process's copy with a batch it just appended, when that batch alone is
        the segment right after the copy (else the next read fetches it)."""
        cache = _cache_of(self.store)
        known = cache.get(self.store_session_id)
        if known is None or result.seq != known.seq + 1 or result.segment_entries != len(entries):
            return
        live = dict(known.live)
        if _fold_items(live, entries):
            cache.put(self.store_session_id, _Items(known.inc, result.seq, result.last_appended_entry_id, live))

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The session's items in chronological (commit) order; with ``limit`` (or
        ``session_settings.limit``), the latest ``limit`` of them. ``limit=0`` returns none;
        a negative limit returns all, as ``SQLiteSession`` does."""
        session_limit = limit
        if session_limit is None and self.session_settings is not None:
            session_limit = self.session_settings.limit
        live, _ = await self._read()
        items = [item for _, item in live]
        if session_limit is None or session_limit < 0:
            return items
        if session_limit == 0:
            return []
        return items[-session_limit:]

    # --- writes ------------------------------------------------------------------------------

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append the items as one atomic batch (all or nothing, for every reader)."""
        if isinstance(items, (str, bytes, Mapping)) or not hasattr(items, "__iter__"):
            raise InvalidItemError(f"add_items takes a list of items, not {type(items).__name__}")
        data = [_as_json(item, i) for i, item in enumerate(items)]
        if not data:
            return
        await _finish(self._add(data))

    async def _add(self, data: list[dict[str, Any]]) -> None:
        ids = [_new_id() for _ in data]
        stamp = iso_now()

        def batch(parent: str | None) -> list[dict[str, Any]]:
            return [
                {
                    "type": "custom",
                    "customType": ITEM_TYPE,
                    "id": eid,
                    "parentId": parent if i == 0 else ids[i - 1],
                    "timestamp": stamp,
                    "data": item,
                }
                for i, (eid, item) in enumerate(zip(ids, data))
            ]

        try:
            await self._append_after_tail(batch, create=True)
        except InvalidEntryError as exc:
            raise InvalidItemError(f"refused by the store ({exc})", index=exc.index) from exc

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item (None if there is none), atomically across
        machines: concurrent pops return distinct items."""
        return await _finish(self._pop())

    async def _pop(self) -> TResponseInputItem | None:
        for round_ in range(self._pop_rounds):
            if round_:
                # Lost to another writer: let the winners' writes land before reading again.
                await asyncio.sleep(random.uniform(0, min(0.002 * 2**round_, 0.1)))
            live, tail = await self._read()
            if not live:
                return None
            victim_id, item = live[-1]
            marker = {
                "type": "custom",
                "customType": POP_TYPE,
                "id": _new_id(),
                "parentId": tail or None,
                "timestamp": iso_now(),
                "data": {"itemId": victim_id},
            }
            try:
                result = await self._append([marker], tail)
                self._note_append([marker], result)
            except ConflictError:
                continue  # another writer got in first: read again
            except SessionNotFoundError:
                continue  # deleted meanwhile: the next read says it is empty
            self._tail = result.last_appended_entry_id
            return item  # type: ignore[no-any-return]
        raise ContentionError(
            f"session {self.session_id!r}: pop_item lost {self._pop_rounds} rounds to other writers"
        )

    async def clear_session(self) -> None:
        """Remove every item committed so far (a ``clear`` marker; see the module's doc)."""
        await _finish(self._clear())

    async def _clear(self) -> None:
        marker_id, stamp = _new_id(), iso_now()

        def batch(parent: str | None) -> list[dict[str, Any]]:
            return [
                {
                    "type": "custom",
                    "customType": CLEAR_TYPE,
                    "id": marker_id,
                    "parentId": parent,
                    "timestamp": stamp,
                    "data": {},
                }
            ]

        await self._append_after_tail(batch, create=False)

    async def delete(self) -> None:
        """Delete the whole session from the store, history included (``delete_session``).
        Unlike :meth:`clear_session` this is not ordered with other processes' writes."""
        try:
            await _finish(self.store.delete_session(self.store_session_id))
        except SessionNotFoundError:
            pass
        _cache_of(self.store).drop(self.store_session_id)
        self._tail = None

    # --- the store ---------------------------------------------------------------------------

    async def _create(self) -> None:
        attempt = 0
        while True:
            try:
                await self.store.create_session(self.store_session_id)
                return
            except SessionExistsError:
                return  # another process (or task) created it first, or our unknown try did
            except IndeterminateError:
                if attempt >= self._resend_attempts:
                    raise
                attempt += 1
                await asyncio.sleep(min(0.05 * 2**attempt, 1.0))

    async def _append_after_tail(
        self, batch: Callable[[str | None], list[dict[str, Any]]], *, create: bool
    ) -> None:
        """Append ``batch(parent)`` after the session's tail: first only if the tail is still
        the one this object knows (so the entries extend pi's tree as one chain), after
        ``cas_rounds`` lost races without that check (a sibling branch off the tail last seen;
        the commit order, which is what readers go by, is the same). A missing session is
        created first (``create``) or left alone."""
        parent = self._tail if self._tail is not None else EMPTY_TAIL
        rounds = 0
        for _ in range(_MAX_APPEND_ROUNDS):
            strict = rounds < self._cas_rounds
            entries = batch(parent or None)
            try:
                result = await self._append(entries, parent if strict else None)
            except ConflictError as exc:
                rounds += 1
                parent = exc.actual_tail_entry_id or EMPTY_TAIL
                continue
            except UnknownParentError:
                # The tail we knew is gone (the session was deleted and made anew): find the
                # new one through the compare-and-set.
                if not parent:
                    raise
                parent, rounds = EMPTY_TAIL, 0
                continue
            except SessionNotFoundError:
                if not create:
                    self._tail = EMPTY_TAIL
                    return
                await self._create()
                parent = EMPTY_TAIL
                continue
            self._tail = result.last_appended_entry_id
            self._note_append(entries, result)
            return
        raise ContentionError(
            f"session {self.session_id!r}: the session was deleted and created again "
            f"{_MAX_APPEND_ROUNDS} times while appending"
        )

    async def _append(self, entries: list[dict[str, Any]], expected: str | None) -> AppendResult:
        """One batch; after ``IndeterminateError`` the very same batch again (idempotent)."""
        return await self.store.append_resending(
            self.store_session_id, entries, expected, resends=self._resend_attempts
        )
