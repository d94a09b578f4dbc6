"""``SessionStoreSaver``: LangGraph's ``BaseCheckpointSaver`` on the store.

One store session per thread (``records.py`` has the entries). Every write is one append with
``expected_tail_entry_id`` = the session's last entry as this process last read it: the
store's compare-and-set. A write that loses (another process appended meanwhile) reads what
is new (``read_since``: only the new segments) and is checked and sent again, so **what a
write was checked against is exactly what it lands after**, whatever pauses:

- **No silent fork.** A checkpoint of source ``input`` or ``loop`` whose parent already has a
  child in its namespace is refused with :class:`CheckpointForkError` (a ``ConflictError``),
  nothing written. Two processes continuing a thread from one checkpoint: the first append
  wins; the other's compare-and-set fails, its re-read shows the winner's child, and its
  ``invoke`` raises. ``fork`` and ``update`` checkpoints (time travel, ``update_state``) are
  branches by intent and are never refused. A checkpoint without a parent (a thread's first)
  is not checked: LangGraph's contract lets a thread hold several roots.
- Each append chains its entries to the tail (``parentId``), so the session is one path: a
  fork of the store session at its tail (``copy_thread``) holds the whole thread, copying
  nothing.

The sync methods call the sync store in the caller's thread; the async ones run the same
code on a thread pool of the saver's own (as ``store/aio.py`` does), so there is one
implementation. A cancelled ``await`` of a write lets it run to its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    SerializerProtocol,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)

from store import SessionStore
from store.adapters.langgraph.records import (
    HEADER_KEY,
    StoredCheckpoint,
    ThreadFold,
    blob_entry,
    checkpoint_entry,
    version_key,
    writes_entry,
)
from store.adapters.langgraph.threads import Threads, sliding, thread_key
from store.errors import (
    ConflictError,
    InvalidInputError,
    SessionNotFoundError,
    WriteRefusedError,
)
from store.formats.markers import trash_mark

T = TypeVar("T")

#: Sources that continue a thread: at most one such child per checkpoint.
GUARDED_SOURCES = frozenset({"input", "loop"})


class CheckpointForkError(ConflictError):
    """A checkpoint that would fork a thread silently: its parent already has a child in its
    namespace and its source (``input``/``loop``) says it continues the thread. Nothing was
    written. Another process continued the thread first: load its state again
    (``graph.get_state``) and run from there, or branch on purpose (``update_state``, or a
    ``checkpoint_id`` with no input)."""

    def __init__(
        self, session_id: str, thread_id: str, checkpoint_ns: str, parent_id: str, children: list[str],
        source: str, tail: str,
    ) -> None:
        self.session_id = session_id
        self.thread_id = thread_id
        self.checkpoint_ns = checkpoint_ns
        self.parent_id = parent_id
        self.children = children
        self.source = source
        self.expected_tail_entry_id = None
        self.actual_tail_entry_id = tail
        self.actual_seq = 0
        WriteRefusedError.__init__(
            self,
            f"thread {thread_id!r} (namespace {checkpoint_ns!r}): checkpoint {parent_id} already has "
            f"a child ({', '.join(children)}); a {source!r} checkpoint from it would fork the thread "
            "silently. Another run continued this thread first: reload its state and run again.",
        )


class SessionStoreSaver(BaseCheckpointSaver[str]):
    """LangGraph's checkpoint saver over a :class:`store.SessionStore`.

    ``SessionStoreSaver.from_url(objects_url, redis_url=None, **options)`` (the arguments of
    ``SessionStore.from_url``; a context manager that closes its store), or
    ``SessionStoreSaver(store)`` over a ``SessionStore`` or ``AsyncSessionStore`` you have.
    ``namespace`` keeps independent deployments apart in one store. ``ttl_ms``: each thread
    expires that long after its last write (the store's sliding TTL: it goes to the trash,
    docs/lifecycle.md). ``cached_threads``: threads whose fold this process keeps, so a read
    fetches only what is new.
    """

    def __init__(
        self,
        store: Any,
        *,
        namespace: str = "",
        serde: SerializerProtocol | None = None,
        ttl_ms: int | None = None,
        owns_store: bool = False,
        cached_threads: int = 256,
        max_workers: int = 8,
    ) -> None:
        super().__init__(serde=serde)
        from store.aio import AsyncSessionStore

        if isinstance(store, AsyncSessionStore):
            store = store.sync
        if not isinstance(store, SessionStore):
            raise InvalidInputError("store must be a store.SessionStore or a store.aio.AsyncSessionStore")
        if not isinstance(namespace, str):
            raise InvalidInputError("namespace must be a string")
        if ttl_ms is not None and (isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or ttl_ms <= 0):
            raise InvalidInputError("ttl_ms must be a positive integer (milliseconds) or None")
        for name, value in (("cached_threads", cached_threads), ("max_workers", max_workers)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(f"{name} must be a positive integer")
        self.store = store
        self.namespace = namespace
        self.ttl_ms = ttl_ms
        self._owns = owns_store
        self.threads = Threads(store, namespace, ttl_ms=ttl_ms, cached=cached_threads)
        self._max_workers = max_workers
        self._pool_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    @classmethod
    def from_url(
        cls,
        objects_url: str,
        redis_url: str | None = None,
        *,
        namespace: str = "",
        serde: SerializerProtocol | None = None,
        ttl_ms: int | None = None,
        **options: Any,
    ) -> SessionStoreSaver:
        store = SessionStore.from_url(objects_url, redis_url, **options)
        try:
            return cls(store, namespace=namespace, serde=serde, ttl_ms=ttl_ms, owns_store=True)
        except BaseException:
            store.close()
            raise

    def close(self) -> None:
        """Wait for the async calls still running, then close the store if the saver owns it."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._owns:
            self.store.close()

    def __enter__(self) -> SessionStoreSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> SessionStoreSaver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    def thread_session_id(self, thread_id: object) -> str:
        """The store session holding ``thread_id`` (``store.adapters.names``)."""
        return self.threads.session_id(thread_id)

    # --- reads -------------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, ns, checkpoint_id = _where(config)
        sid = self.thread_session_id(thread_id)
        with self.threads.lock(sid):
            fold = self.threads.refresh(sid)
            if fold is None:
                return None
            stored = fold.checkpoints.get(ns, {}).get(checkpoint_id) if checkpoint_id else fold.latest(ns)
            return None if stored is None else self._tuple(thread_id, fold, stored)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        if limit is not None and limit <= 0:
            return
        if config is not None:
            thread_id, _, checkpoint_id = _where(config)
            threads: Any = [(self.thread_session_id(thread_id), thread_id)]
            ns_only = config["configurable"].get("checkpoint_ns")
        else:
            threads, ns_only, checkpoint_id = ((sid, None) for sid in self.threads.every_thread()), None, None
        before_id = get_checkpoint_id(before) if before else None
        left = limit
        for sid, thread_id in threads:
            with self.threads.lock(sid):
                fold = self.threads.refresh(sid)
                if fold is None:
                    continue
                shown = thread_id if thread_id is not None else fold.thread_id
                found = []
                for ns, checkpoints in list(fold.checkpoints.items()):
                    if ns_only is not None and ns != ns_only:
                        continue
                    for cid in sorted(checkpoints, reverse=True):
                        if (checkpoint_id and cid != checkpoint_id) or (before_id and cid >= before_id):
                            continue
                        stored = checkpoints[cid]
                        if filter and not _matches(self.serde.loads_typed(stored.metadata), filter):
                            continue
                        found.append(self._tuple(shown, fold, stored))
                        if left is not None:
                            left -= 1
                            if left == 0:
                                break
                    if left == 0:
                        break
            yield from found
            if left == 0:
                return

    def _tuple(self, thread_id: Any, fold: ThreadFold, stored: StoredCheckpoint) -> CheckpointTuple:
        checkpoint = self.serde.loads_typed(stored.checkpoint)
        values: dict[str, Any] = {}
        for channel, version in checkpoint["channel_versions"].items():
            blob = fold.blobs.get((stored.ns, channel, version_key(version)))
            if blob is not None and blob[0] != "empty":
                values[channel] = self.serde.loads_typed(blob)
        writes = fold.writes.get((stored.ns, stored.checkpoint_id), {})
        ordered = sorted(writes.items(), key=lambda kv: writes_sort_key(kv[1][3], *kv[0]))
        where = {"thread_id": thread_id, "checkpoint_ns": stored.ns}
        return CheckpointTuple(
            config={"configurable": {**where, "checkpoint_id": stored.checkpoint_id}},
            checkpoint={**checkpoint, "channel_values": values},
            metadata=self.serde.loads_typed(stored.metadata),
            parent_config=(
                {"configurable": {**where, "checkpoint_id": stored.parent_id}} if stored.parent_id else None
            ),
            pending_writes=[(task, channel, self.serde.loads_typed(value))
                            for _, (task, channel, value, _path) in ordered],
        )

    # --- writes ------------------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint and the channel values of ``new_versions`` (the others are
        already stored, under their versions). ``CheckpointForkError`` for an ``input`` or
        ``loop`` checkpoint whose parent has a child already."""
        thread_id, ns, parent_id = _where(config)
        body = dict(checkpoint)
        values = body.pop("channel_values", None) or {}
        meta = get_checkpoint_metadata(config, metadata)
        source = meta.get("source")
        run_id = None if meta.get("run_id") is None else str(meta["run_id"])
        blobs = [
            blob_entry(ns, channel, version,
                       self.serde.dumps_typed(values[channel]) if channel in values else ("empty", b""))
            for channel, version in new_versions.items()
        ]
        cid = str(checkpoint["id"])
        entry = checkpoint_entry(ns, cid, parent_id, self.serde.dumps_typed(body),
                                 self.serde.dumps_typed(meta), source, run_id)
        sid = self.thread_session_id(thread_id)
        if run_id is not None:
            self.threads.record_run(run_id, thread_key(thread_id))

        def build(fold: ThreadFold) -> list[dict[str, Any]]:
            if entry["id"] in fold.ids:
                return []
            if parent_id is not None and source in GUARDED_SOURCES:
                children = fold.children.get((ns, parent_id), set()) - {cid}
                if children:
                    raise CheckpointForkError(sid, thread_key(thread_id), ns, parent_id, sorted(children),
                                              str(source), fold.last)
            return [b for b in blobs if b["id"] not in fold.ids] + [entry]

        self.threads.append(sid, thread_key(thread_id), build)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}}

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        thread_id, ns, checkpoint_id = _where(config)
        if not checkpoint_id:
            raise InvalidInputError("put_writes needs the checkpoint_id of the checkpoint the writes belong to")
        items = [(WRITES_IDX_MAP.get(channel, idx), channel, self.serde.dumps_typed(value))
                 for idx, (channel, value) in enumerate(writes)]
        if not items:
            return
        entry = writes_entry(ns, checkpoint_id, str(task_id), str(task_path), items)
        idxs = [idx for idx, _, _ in items]

        def build(fold: ThreadFold) -> list[dict[str, Any]]:
            if entry["id"] in fold.ids or fold.has_writes(ns, checkpoint_id, str(task_id), idxs):
                return []
            return [entry]

        self.threads.append(self.thread_session_id(thread_id), thread_key(thread_id), build)

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's store session: every namespace, checkpoint and write of it."""
        sid = self.thread_session_id(thread_id)
        with self.threads.lock(sid):
            with contextlib.suppress(SessionNotFoundError):
                self.store.delete_session(sid)
            self.threads.forget(sid)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """A fork of the source's store session at its tail: nothing is copied or read, the
        target reads the source's entries through the fork point (docs/design.md, "Forks"),
        then its own. Its header names the target thread (and carries the saver's TTL), so
        the copy costs the source's tail (Redis) and a few object requests whatever the
        thread's length. ``SessionExistsError`` when the target thread exists. A source with
        no checkpoint (or none, or in the trash) copies nothing."""
        source = self.thread_session_id(source_thread_id)
        target = self.thread_session_id(target_thread_id)
        try:
            tail = self.store.get_tail(source).last_entry_id
        except SessionNotFoundError:
            return
        if not tail or trash_mark(tail) is not None:
            return
        named = {HEADER_KEY: {"thread": thread_key(target_thread_id), "namespace": self.namespace}}
        retention = sliding(self.ttl_ms) if self.ttl_ms is not None else None
        with contextlib.suppress(SessionNotFoundError):  # deleted or trashed since its tail was read
            self.store.branch_from_entry(source, tail, target, pi_header=named, retention=retention)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: every checkpoint but the newest of each namespace is dropped (one
        ``langgraph.drop`` entry; its bytes stay until the thread is deleted). ``delete``:
        the threads are deleted."""
        if strategy not in ("keep_latest", "delete"):
            raise InvalidInputError(f"unknown prune strategy {strategy!r} (keep_latest or delete)")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue

            def older(fold: ThreadFold) -> list[str]:
                return [stored.entry_id for checkpoints in fold.checkpoints.values()
                        for cid, stored in checkpoints.items() if cid != max(checkpoints)]

            self.threads.drop(thread_id, older)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Drop every checkpoint (and its writes) whose metadata ``run_id`` is one of
        ``run_ids``, in every thread the run index names for them."""
        runs = {str(run) for run in run_ids}
        if not runs:
            return
        for thread_id in sorted(self.threads.threads_of(runs)):
            self.threads.drop(thread_id, lambda fold: [s.entry_id for s in fold.by_entry.values() if s.run_id in runs])

    def get_next_version(self, current: str | None, channel: None = None) -> str:  # type: ignore[override]
        """``InMemorySaver``'s versions: a counter and a random part, so two branches that
        write one channel at the same step never name different values alike."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # --- async: the same code on the saver's threads -----------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._offload(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        found = await self._offload(lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._offload(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._offload(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._offload(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._offload(self.delete_for_runs, list(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._offload(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._offload(functools.partial(self.prune, list(thread_ids), strategy=strategy))

    async def _offload(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise InvalidInputError("the saver is closed")
        if self._pool is None:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._max_workers, thread_name_prefix="sessionstore-langgraph")
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))


def _where(config: RunnableConfig) -> tuple[Any, str, str | None]:
    """(thread id, namespace, checkpoint id) of a config."""
    configurable = (config or {}).get("configurable") or {}
    thread_id = configurable.get("thread_id")
    thread_key(thread_id)
    ns = configurable.get("checkpoint_ns") or ""
    if not isinstance(ns, str):
        raise InvalidInputError("checkpoint_ns must be a string")
    checkpoint_id = configurable.get("checkpoint_id")
    return thread_id, ns, None if checkpoint_id in (None, "") else str(checkpoint_id)


def _matches(metadata: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return all(metadata.get(key) == value for key, value in wanted.items())


__all__ = ["GUARDED_SOURCES", "CheckpointForkError", "SessionStoreSaver"]
