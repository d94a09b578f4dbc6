"""``ClaudeSessionStore``: the SDK's ``SessionStore`` protocol over the store (records and
folds in :mod:`store.adapters.claude_agent_sdk.records`; the package's docstring says how it
all fits)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Self

from claude_agent_sdk import fold_session_summary
from claude_agent_sdk.types import (
    SessionKey,
    SessionListSubkeysKey,
    SessionStoreEntry,
    SessionStoreListEntry,
    SessionSummaryEntry,
)
from claude_agent_sdk.types import SessionStore as SdkSessionStore

from store.adapters.claude_agent_sdk.records import (
    _EPOCH_ISO,
    _LIST_CONCURRENCY,
    _MAX_UUID_ID,
    ENTRY_TYPE,
    HEADER_KEY,
    INDEX_TYPE,
    _anchor,
    _canonical,
    _Fold,
    _h,
    _ProjectState,
    _View,
)
from store.adapters.names import session_id_for
from store.clock import iso_now, now_ms
from store.errors import (
    IdCollisionError,
    IndeterminateError,
    InvalidInputError,
    SessionExistsError,
    SessionNotFoundError,
    UnknownParentError,
)
from store.formats.records import EMPTY_TAIL, AppendResult

if TYPE_CHECKING:
    from store.aio import AsyncSessionStore

log = logging.getLogger("sessionstore.claude")

# --- the adapter ------------------------------------------------------------------------------


class ClaudeSessionStore(SdkSessionStore):
    """The Claude Agent SDK's ``SessionStore`` over a :class:`~store.aio.AsyncSessionStore`.

    ``namespace`` separates independent sets of projects in one store (it is hashed into the
    session names). ``resend_attempts``: re-sends of one batch after ``IndeterminateError``
    before it is raised (the SDK then retries the call, which is just as safe).
    """

    def __init__(
        self,
        store: AsyncSessionStore,
        *,
        namespace: str = "",
        owns_store: bool = False,
        resend_attempts: int = 5,
    ) -> None:
        from store.aio import AsyncSessionStore

        if not isinstance(store, AsyncSessionStore):
            raise InvalidInputError("ClaudeSessionStore wraps a store.aio.AsyncSessionStore")
        if not isinstance(namespace, str):
            raise InvalidInputError("namespace must be a string")
        self.store = store
        self.namespace = namespace
        self._owns = owns_store
        self._resend_attempts = max(1, resend_attempts)
        self._views: dict[str, _View] = {}
        #: Summaries folded so far, by transcript (store session id).
        self._folds: dict[str, _Fold] = {}
        self._views_lock = threading.Lock()
        self._closed = False

    # --- construction --------------------------------------------------------------------------

    @classmethod
    def from_url(
        cls, objects_url: str, redis_url: str | None = None, *, namespace: str = "", **options: Any
    ) -> ClaudeSessionStore:
        """Build the store from URLs (``SessionStore.from_url``'s arguments and options, e.g.
        ``redis_prefix``). Synchronous: it connects and probes, so call it before the event
        loop runs or use :meth:`open` from async code."""
        from store.aio import AsyncSessionStore
        from store.core import SessionStore

        sync = SessionStore.from_url(objects_url, redis_url, **options)
        return cls(AsyncSessionStore(sync), namespace=namespace, owns_store=True)

    @classmethod
    async def open(
        cls, objects_url: str, redis_url: str | None = None, *, namespace: str = "", **options: Any
    ) -> ClaudeSessionStore:
        """:meth:`from_url` off the event loop."""
        from store.aio import AsyncSessionStore

        store = await AsyncSessionStore.open(objects_url, redis_url, **options)
        return cls(store, namespace=namespace, owns_store=True)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._owns:
            await self.store.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- names ---------------------------------------------------------------------------------

    def index_id(self, project_key: str) -> str:
        """The store session holding the project's index."""
        return session_id_for("claude-agent-sdk", project_key, namespace=self.namespace)

    async def list_projects(self) -> list[str]:
        """Every project key of this namespace that has an index in the store.

        A scan of the store's sessions (one LIST page per 1,000 sessions and a header read per
        index found), for tools such as ``sessionstore claude-export``; the SDK's own calls
        never need it."""
        found: set[str] = set()
        async for info in self.store.iter_sessions(page_size=1000):
            sid = info.session_id
            if not sid.startswith("cc.") or sid.count(".") != 1:
                continue
            try:
                header = await self.store.get_header(sid)
            except SessionNotFoundError:
                continue
            meta = header.pi_header.get(HEADER_KEY)
            if (
                isinstance(meta, dict)
                and meta.get("kind") == "index"
                and meta.get("namespace", "") == self.namespace
                and isinstance(meta.get("project_key"), str)
                and self.index_id(meta["project_key"]) == sid
            ):
                found.add(meta["project_key"])
        return sorted(found)

    def session_id_for(self, key: SessionKey | SessionListSubkeysKey) -> str:
        """The store session holding ``key``'s stream."""
        names = [key["project_key"], key["session_id"]]
        if key.get("subpath") is not None:
            names.append(key["subpath"])  # type: ignore[typeddict-item]
        return session_id_for("claude-agent-sdk", *names, namespace=self.namespace)

    # --- helpers -------------------------------------------------------------------------------

    async def _send(
        self, sid: str, entries: list[dict[str, Any]], expected: str | None = None
    ) -> AppendResult:
        """Append one batch; re-send the very same batch after ``IndeterminateError``."""
        return await self.store.append_resending(sid, entries, expected, resends=self._resend_attempts - 1)

    def _pi_header(self, sid: str, what: dict[str, Any]) -> dict[str, Any]:
        meta = {**what, "namespace": self.namespace} if self.namespace else what
        return {"type": "session", "version": 3, "id": sid, "timestamp": iso_now(), "cwd": "",
                HEADER_KEY: meta}

    async def _ensure_session(self, sid: str, pi_header: dict[str, Any]) -> None:
        try:
            await self.store.create_session(sid, pi_header=pi_header)
        except SessionExistsError:
            pass
        except IndeterminateError:
            pass  # the caller's append finds out (and creates again if it did not land)

    # --- entries -------------------------------------------------------------------------------

    @staticmethod
    def _wrap_batch(entries: Sequence[SessionStoreEntry]) -> list[list[dict[str, Any]]]:
        """The batch as store entries, in chunks within the store's limits (usually one)."""
        if isinstance(entries, (str, bytes, dict)) or not isinstance(entries, Sequence):
            raise InvalidInputError("entries must be a list of JSON objects")
        for i, e in enumerate(entries):
            if not isinstance(e, dict):
                raise InvalidInputError(f"entry {i} is not a JSON object (a dict)")
        has_uuid = any(isinstance(e.get("uuid"), str) and e.get("uuid") for e in entries)
        texts = [_canonical(e) for e in entries]
        batch = _h("\n".join(texts), 12) if has_uuid else ""
        uuids = [u if isinstance(u := e.get("uuid"), str) and u else None for e in entries]
        out: list[dict[str, Any]] = []
        sizes: list[int] = []
        seen: set[str] = set()
        prev: str | None = None
        stamp = now_ms()  # the write time the listings report (``mtime``)
        for i, e in enumerate(entries):
            u = uuids[i]
            if u is not None:
                eid = f"u.{u}" if len(u) <= _MAX_UUID_ID else f"uh.{_h(u, 16)}"
            elif has_uuid:
                eid = "n." + _h(f"{_anchor(uuids, i)}\x00{texts[i]}", 16)
            else:
                eid = f"r.{uuid.uuid4().hex}"
            if eid in seen:
                continue  # one uuid twice in a batch: its first copy is the one kept
            seen.add(eid)
            ts = e.get("timestamp")
            wrapped = {
                "type": "custom",
                "customType": ENTRY_TYPE,
                "id": eid,
                "parentId": prev,
                "timestamp": ts if isinstance(ts, str) else _EPOCH_ISO,
                "mtime": stamp,
                "data": e,
            }
            if batch:
                wrapped["batch"] = batch
            out.append(wrapped)
            sizes.append(len(texts[i].encode("utf-8", "surrogatepass")) + 256)
            prev = eid
        # The store takes up to 10,000 entries and 16 MiB a batch; the SDK sends at most 500
        # entries and about 1 MiB. Bigger batches are cut, in order.
        chunks: list[list[dict[str, Any]]] = []
        cur: list[dict[str, Any]] = []
        size = 0
        for wrapped, n in zip(out, sizes):
            if cur and (len(cur) >= 5000 or size + n > 8 * 1024 * 1024):
                chunks.append(cur)
                cur, size = [], 0
            cur.append(wrapped)
            size += n
        if cur:
            chunks.append(cur)
        if batch and len(chunks) > 1:
            for k, chunk in enumerate(chunks):
                for wrapped in chunk:
                    wrapped["batch"] = f"{batch}.{k}"
        return chunks

    @staticmethod
    def _unwrap(entries: Sequence[dict[str, Any]]) -> list[SessionStoreEntry]:
        return [
            e["data"]
            for e in entries
            if e.get("type") == "custom" and e.get("customType") == ENTRY_TYPE and "data" in e
        ]

    async def _append_chunk(
        self, key: SessionKey, sid: str, chunk: list[dict[str, Any]]
    ) -> tuple[AppendResult | None, list[dict[str, Any]] | None]:
        """Append the chunk's entries that the session does not hold yet.

        Returns the result (None when nothing was left to append) and the entries committed
        as exactly that segment when that is known (None when the segment may hold other
        batches: a re-send answered with an earlier result, or a group commit)."""
        pending = chunk
        for _ in range(20):
            if not pending:
                return None, None
            try:
                res = await self._send(sid, pending)
                # The segment is exactly these entries only when this call wrote it with no
                # other writer's batch riding in it (group commit); a re-sent batch, or one
                # that rode in another writer's segment, says nothing of the segment's rest.
                return res, (pending if res.segment_entries == len(pending) else None)
            except SessionNotFoundError:
                await self._register(key)
                await self._ensure_session(sid, self._pi_header(sid, self._describe(key)))
            except (IdCollisionError, UnknownParentError):
                # Part of the batch is stored already (a re-send after a lost response, an
                # import over a mirrored session, a uuid sent twice): keep only the rest.
                try:
                    data = await self.store.read_session(sid)
                except SessionNotFoundError:
                    continue
                stored = {e["id"] for e in data.entries}
                pending = [e for e in chunk if e["id"] not in stored]
        raise IndeterminateError(f"session {sid!r}: the batch kept colliding with other writers")

    @staticmethod
    def _describe(key: SessionKey) -> dict[str, Any]:
        what: dict[str, Any] = {"kind": "transcript", "project_key": key["project_key"],
                                "session_id": key["session_id"]}
        if key.get("subpath") is not None:
            what["subpath"] = key["subpath"]
        return what

    # --- the SDK's protocol --------------------------------------------------------------------

    async def append(self, key: SessionKey, entries: list[SessionStoreEntry]) -> None:
        """Mirror a batch: one atomic append (see the module's docstring for dedup)."""
        if not entries:
            return
        sid = self.session_id_for(key)
        chunks = self._wrap_batch(entries)
        for chunk in chunks:
            await self._append_chunk(key, sid, chunk)

    async def load(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        sid = self.session_id_for(key)
        try:
            entries = await self.store.load_session_entries(sid)
        except SessionNotFoundError:
            return None
        return self._unwrap(entries)

    async def list_sessions(self, project_key: str) -> list[SessionStoreListEntry]:
        return [{"session_id": sid, "mtime": fold.mtime} for sid, fold in await self._summaries(project_key)]

    async def list_session_summaries(self, project_key: str) -> list[SessionSummaryEntry]:
        return [
            {"session_id": sid, "mtime": fold.mtime, "data": json.loads(json.dumps(fold.data))}
            for sid, fold in await self._summaries(project_key)
        ]

    async def _summaries(self, project_key: str) -> list[tuple[str, _Fold]]:
        """Each main transcript the project's index lists, with its summary: the fold of the
        transcript as ``load`` returns it, brought up to date from the segments this process
        has not folded yet (``read_since``), read in parallel."""
        view = await self._view(project_key)
        with self._views_lock:
            mains = {sid: m.mtime for sid, m in view.state.mains.items()}
        gate = asyncio.Semaphore(_LIST_CONCURRENCY)

        async def one(session_id: str) -> _Fold | None:
            async with gate:
                return await self._fold(project_key, session_id, mains[session_id])

        folds = await asyncio.gather(*(one(sid) for sid in mains))
        return [(sid, fold) for sid, fold in zip(mains, folds) if fold is not None]

    async def _fold(self, project_key: str, session_id: str, listed_mtime: int) -> _Fold | None:
        """The summary of one main transcript (None: it does not exist). Segments never change
        within an incarnation, so a fold through segment n stays the fold of segments 1..n
        for ever: what is new is folded onto it, in commit order, and the fold is kept."""
        key: SessionKey = {"project_key": project_key, "session_id": session_id}
        sid = self.session_id_for(key)
        with self._views_lock:
            known = self._folds.get(sid)
        try:
            changes = await self.store.read_since(
                sid,
                incarnation=known.inc if known is not None else None,
                after_seq=known.seq if known is not None else 0,
            )
        except SessionNotFoundError:
            with self._views_lock:
                self._folds.pop(sid, None)
            return None
        prev: SessionSummaryEntry | None = None
        mtime = listed_mtime
        if known is not None and not changes.whole:
            if not changes.entries:
                return _Fold(known.inc, known.seq, known.data, max(known.mtime, listed_mtime))
            prev = {"session_id": session_id, "mtime": known.mtime, "data": known.data}
            mtime = max(mtime, known.mtime)
        batch = self._unwrap(changes.entries)
        for e in changes.entries:
            stamp = e.get("mtime")
            if isinstance(stamp, int) and not isinstance(stamp, bool):
                mtime = max(mtime, stamp)
        folded = fold_session_summary(prev, key, batch)
        fold = _Fold(changes.header.incarnation, changes.seq, folded["data"], mtime or changes.header.created_at_ms)
        with self._views_lock:
            cur = self._folds.get(sid)
            if cur is None or cur.inc != fold.inc or cur.seq <= fold.seq:
                self._folds[sid] = fold
        return fold

    async def list_subkeys(self, key: SessionListSubkeysKey) -> list[str]:
        view = await self._view(key["project_key"])
        with self._views_lock:
            return list(view.state.subs.get(key["session_id"], {}))

    async def delete(self, key: SessionKey) -> None:
        """Delete a stream; a main key takes its subpaths with it."""
        project_key, session_id = key["project_key"], key["session_id"]
        subpath = key.get("subpath")
        view = await self._view(project_key)
        subs = list(view.state.subs.get(session_id, {}))
        if subpath is None:
            targets = [self.session_id_for({"project_key": project_key, "session_id": session_id})]
            targets += [self.session_id_for({"project_key": project_key, "session_id": session_id,
                                             "subpath": u}) for u in subs]
            listed = session_id in view.state.mains or bool(subs)
        else:
            targets = [self.session_id_for(key)]
            listed = subpath in subs
        incs: list[str] = []
        for sid in targets:
            try:
                header = await self.store.get_header(sid)
                await self.store.delete_session(sid)
            except SessionNotFoundError:
                continue
            incs.append(header.incarnation)
        if incs or listed:
            rec: dict[str, Any] = {"op": "del", "session_id": session_id, "incs": incs,
                                   "mtime": now_ms()}
            if subpath is not None:
                rec["subpath"] = subpath
            await self._index_append(project_key, [rec])

    # --- the index -----------------------------------------------------------------------------

    async def _register(self, key: SessionKey) -> None:
        rec: dict[str, Any] = {"op": "reg", "session_id": key["session_id"], "mtime": now_ms()}
        if key.get("subpath") is not None:
            rec["subpath"] = key["subpath"]
        await self._index_append(key["project_key"], [rec])

    def _index_entries(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {"type": "custom", "customType": INDEX_TYPE, "id": uuid.uuid4().hex,
             "parentId": None, "timestamp": iso_now(), "data": rec}
            for rec in records
        ]

    async def _index_append(
        self, project_key: str, records: list[dict[str, Any]], *, view: _View | None = None
    ) -> AppendResult:
        """Append records to the index; with ``view``, only right after the tail it read
        (``ConflictError`` otherwise), and the view then holds them."""
        isid = self.index_id(project_key)
        entries = self._index_entries(records)
        expected = None if view is None else (view.tail or EMPTY_TAIL)
        for _ in range(5):
            try:
                res = await self._send(isid, entries, expected)
                break
            except SessionNotFoundError:
                meta = {"kind": "index", "project_key": project_key}
                await self._ensure_session(isid, self._pi_header(isid, meta))
        else:
            raise SessionNotFoundError(isid)
        if view is not None:
            with self._views_lock:
                if self._views.get(isid) is view and res.seq == view.seq + 1:
                    for e in entries:
                        view.state.apply(e)
                    view.seq, view.tail = res.seq, entries[-1]["id"]
        return res

    async def _view(self, project_key: str, *, refresh: bool = True, full: bool = False) -> _View:
        """The project's index as this process knows it; ``refresh`` reads what was added
        since (a few requests), ``full`` reads it all again."""
        isid = self.index_id(project_key)
        with self._views_lock:
            view = None if full else self._views.get(isid)
        if view is not None and view.header is not None:
            if not refresh:
                return view
            base = view.seq
            try:
                changes = await self.store.read_since(
                    isid, incarnation=view.header.incarnation, after_seq=base
                )
            except SessionNotFoundError:
                changes = None
            if changes is not None and not changes.whole:
                with self._views_lock:
                    if self._views.get(isid) is view and view.seq == base:
                        for e in changes.entries:
                            view.state.apply(e)
                        if changes.entries:
                            view.tail = str(changes.entries[-1]["id"])
                        view.seq = max(view.seq, changes.seq)
                        return view
            # Another task moved the view meanwhile, or the index is gone: read it whole.
        try:
            data = await self.store.read_session(isid)
        except SessionNotFoundError:
            new = _View(None, 0, EMPTY_TAIL, _ProjectState())
        else:
            state = _ProjectState()
            for e in data.entries:
                state.apply(e)
            new = _View(data.header, data.seq, data.last_entry_id, state)
        with self._views_lock:
            self._views[isid] = new
        return new


