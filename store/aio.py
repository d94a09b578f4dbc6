"""The store from asyncio: ``AsyncSessionStore``, and async handles and managers.

Every method that touches the object store or Redis runs the synchronous protocol
(``store/protocol/append.py``, ``store/protocol/read.py``, ...) on a thread pool of this store's own, so the event
loop only ever waits; nothing is re-implemented, and the sync and async APIs cannot drift
apart. The loop thread does no network I/O (``tests/test_aio.py`` watches every socket call).

Why threads and not native async clients: the protocol has exactly one implementation, the
one the pause and fault suites prove, and boto3 is synchronous (the async S3 clients wrap
botocore with pinned versions). ``python -m benchmarks --only aio`` measures what the offload
costs against plain threads driving the sync store (docs/performance.md).

**Cancellation.** A cancelled ``await`` of a write (an append, a create, a delete) cannot stop
its thread mid-protocol, and must not: the operation runs to its end in the background and
the caller sees ``CancelledError``. Its outcome is then unknown to the caller, exactly like
``IndeterminateError``: re-sending the same batch (same ids, same content) is idempotent and
returns the original result if the first one was committed. :meth:`AsyncSessionStore.close`
waits for every operation still running.

**Concurrency.** Appends from many tasks run in parallel up to ``max_workers`` (default 4 per
core, at most 32, the S3 client's connection pool size) and queue beyond it. Writers to one session are ordered
by the store's own protocol (Redis's claim on the next slot), never by a lock of this module,
so tasks of one event loop, of other processes and of other machines are treated alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from store.core import SessionChanges, SessionData, SessionStore
from store.errors import IndeterminateError, InvalidInputError
from store.protocol.handles import SessionHandle
from store.protocol.listing import SessionFilter, SessionPage
from store.formats.records import AppendResult, ForkPoint, Header, SessionInfo, TailInfo

if TYPE_CHECKING:
    from store.manager import SessionManager
    from store.lifecycle.retention import Retention, TrashItem
    from store.model.session import Session

P = ParamSpec("P")
T = TypeVar("T")

#: Threads per store: 4 per core, at most 32. Every thread competes for the GIL with the loop;
#: measured on 2 cores (100 tasks, 10 sessions), 8 threads gave 131 appends/s and a loop lag
#: p99 of 13-15 ms where 32 gave 82-101/s and 26-50 ms: appends wait on the network, so a few
#: threads keep it busy, and more only thrash.
DEFAULT_MAX_WORKERS = min(32, 4 * (os.cpu_count() or 1))


class AsyncSessionStore:
    """A :class:`~store.core.SessionStore` for asyncio: the same methods, awaitable.

    Build one with ``await AsyncSessionStore.open(objects_url, redis_url, **options)`` (the
    arguments of ``SessionStore.from_url``), or wrap a store you have:
    ``AsyncSessionStore(store)``. Use it as ``async with``, or ``await store.close()``.
    """

    def __init__(
        self,
        store: SessionStore,
        *,
        max_workers: int = DEFAULT_MAX_WORKERS,
        owns_store: bool = True,
    ) -> None:
        if not isinstance(store, SessionStore):
            raise InvalidInputError("AsyncSessionStore wraps a store.SessionStore")
        if not isinstance(max_workers, int) or isinstance(max_workers, bool) or max_workers < 1:
            raise InvalidInputError("max_workers must be a positive integer")
        self._store = store
        self._owns = owns_store
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="sessionstore-aio")
        self._closed = False

    @classmethod
    async def open(
        cls,
        objects_url: str,
        redis_url: str | None = None,
        *,
        max_workers: int = DEFAULT_MAX_WORKERS,
        **options: Any,
    ) -> AsyncSessionStore:
        """``SessionStore.from_url`` off the loop (it may start an embedded Redis and probes
        the object store), wrapped."""
        store = await _in_thread(SessionStore.from_url, objects_url, redis_url, **options)
        try:
            return cls(store, max_workers=max_workers)
        except BaseException:
            store.close()
            raise

    @property
    def sync(self) -> SessionStore:
        """The synchronous store underneath (for code that runs in a thread of its own)."""
        return self._store

    async def close(self) -> None:
        """Wait for every operation still running (cancelled awaits included), then close the
        store's connections if this object owns them."""
        if self._closed:
            return
        self._closed = True
        await _in_thread(self._pool.shutdown, wait=True)
        if self._owns:
            await _in_thread(self._store.close)

    async def __aenter__(self) -> AsyncSessionStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if self._closed:
            raise InvalidInputError("the store is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    # --- sessions ----------------------------------------------------------------------------

    async def create_session(
        self,
        session_id: str | None = None,
        *,
        cwd: str | None = None,
        pi_header: dict[str, Any] | None = None,
        fork: ForkPoint | None = None,
    ) -> AsyncSessionHandle:
        handle = await self._run(
            self._store.create_session, session_id, cwd=cwd, pi_header=pi_header, fork=fork
        )
        return AsyncSessionHandle(self, handle.header)

    async def get_header(self, session_id: str) -> Header:
        return await self._run(self._store.get_header, session_id)

    async def check_backends(self) -> dict[str, str | None]:
        return await self._run(self._store.check_backends)

    async def append_session_entries(
        self,
        session_id: str,
        entries: Sequence[dict[str, Any]],
        expected_tail_entry_id: str | None = None,
    ) -> AppendResult:
        """One atomic batch (see ``SessionStore.append_session_entries``). The entries are
        read (validated and encoded) in the store's thread: do not change them until the
        ``await`` has returned."""
        return await self._run(
            self._store.append_session_entries, session_id, list(entries), expected_tail_entry_id
        )

    async def append_resending(
        self,
        session_id: str,
        entries: Sequence[dict[str, Any]],
        expected_tail_entry_id: str | None = None,
        *,
        resends: int = 5,
    ) -> AppendResult:
        """``append_session_entries``, answering ``IndeterminateError`` (outcome unknown) by
        sending the very same batch again, which the store makes idempotent: at most
        ``resends`` more times, with jittered exponential backoff; then the error is raised."""
        batch = list(entries)
        for attempt in range(resends + 1):
            try:
                return await self.append_session_entries(session_id, batch, expected_tail_entry_id)
            except IndeterminateError:
                if attempt >= resends:
                    raise
                await asyncio.sleep(min(0.05 * 2**attempt, 1.0) * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    async def load_session_entries(self, session_id: str) -> list[dict[str, Any]]:
        return await self._run(self._store.load_session_entries, session_id)

    async def read_session(self, session_id: str) -> SessionData:
        return await self._run(self._store.read_session, session_id)

    async def read_since(
        self, session_id: str, *, incarnation: str | None, after_seq: int, probe: bool = True
    ) -> SessionChanges:
        return await self._run(
            self._store.read_since, session_id, incarnation=incarnation, after_seq=after_seq, probe=probe
        )

    async def get_tail(self, session_id: str) -> TailInfo:
        return await self._run(self._store.get_tail, session_id)

    async def list_sessions(
        self,
        *,
        cursor: str | None = None,
        limit: int | None = None,
        filters: SessionFilter | None = None,
        **filter_args: Any,
    ) -> SessionPage:
        """One page of sessions (``SessionStore.list_sessions``)."""
        return await self._run(
            functools.partial(
                self._store.list_sessions, cursor=cursor, limit=limit, filters=filters, **filter_args
            )
        )

    async def iter_sessions(
        self, *, page_size: int | None = None, filters: SessionFilter | None = None, **filter_args: Any
    ) -> AsyncIterator[SessionInfo]:
        """Every session, page after page (``SessionStore.iter_sessions``)."""
        cursor: str | None = None
        while True:
            page = await self.list_sessions(
                cursor=cursor, limit=page_size, filters=filters, **filter_args
            )
            for info in page.items:
                yield info
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def delete_session(self, session_id: str) -> None:
        await self._run(self._store.delete_session, session_id)

    async def load_session(self, session_id: str) -> Session:
        return await self._run(self._store.load_session, session_id)

    async def open_session(self, session_id: str, *, strict: bool = False) -> AsyncSessionManager:
        manager = await self._run(self._store.open_session, session_id, strict=strict)
        return AsyncSessionManager(self, manager)

    async def branch_from_entry(
        self,
        session_id: str,
        from_entry_id: str,
        new_session_id: str | None = None,
        *,
        config: dict[str, Any] | None = None,
        pi_header: dict[str, Any] | None = None,
        retention: Retention | None = None,
    ) -> AsyncSessionHandle:
        handle = await self._run(
            self._store.branch_from_entry, session_id, from_entry_id, new_session_id,
            config=config, pi_header=pi_header, retention=retention,
        )
        return AsyncSessionHandle(self, handle.header)

    async def redact(self, session_id: str, entry_id: str, reason: str) -> AppendResult:
        return await self._run(self._store.redact, session_id, entry_id, reason)

    async def redact_entries(self, session_id: str, entry_ids: list[str], reason: str) -> AppendResult:
        return await self._run(self._store.redact_entries, session_id, list(entry_ids), reason)

    # --- data lifecycle (docs/lifecycle.md) ----------------------------------------------------

    async def set_retention(self, session_id: str, retention: Retention) -> Retention:
        return await self._run(self._store.set_retention, session_id, retention)

    async def get_retention(self, session_id: str) -> Retention | None:
        return await self._run(self._store.get_retention, session_id)

    async def list_trash(self) -> list[TrashItem]:
        return await self._run(self._store.list_trash)

    async def restore_session(self, session_id: str) -> None:
        await self._run(self._store.restore_session, session_id)

    async def rotate_data_key(self, session_id: str) -> int:
        return await self._run(self._store.rotate_data_key, session_id)

    async def shred_keys(self, session_id: str) -> int:
        return await self._run(self._store.shred_keys, session_id)

    async def import_pi_session(
        self, source: Any, session_id: str | None = None, *, on_conflict: str = "refuse"
    ) -> AsyncSessionHandle:
        handle = await self._run(
            self._store.import_pi_session, source, session_id, on_conflict=on_conflict
        )
        return AsyncSessionHandle(self, handle.header)

    async def export_pi_session(self, session_id: str) -> str:
        return await self._run(self._store.export_pi_session, session_id)

    # --- live follow ---------------------------------------------------------------------------

    async def follow(
        self,
        session_id: str,
        *,
        after_seq: int | None = None,
        poll_s: float = 1.0,
        timeout_s: float | None = None,
    ) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        """``async for seq, entry in store.follow(sid)``: ``SessionStore.follow``'s protocol
        (``store/protocol/follow.py``), driven from asyncio.

        Each follower has one thread of its own for its reads and its waits on the
        notification channel, so idle followers never hold up appends, and a follower's steps
        never overlap. Stopping the iteration (``break``, cancellation, ``aclose()``) returns
        at once; the subscription is closed when the step under way ends (at most ``poll_s``).
        """
        if self._closed:
            raise InvalidInputError("the store is closed")
        follower = self._store.follower(session_id, after_seq=after_seq)
        thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sessionstore-follow")
        loop = asyncio.get_running_loop()

        def step(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> asyncio.Future[T]:
            return loop.run_in_executor(thread, functools.partial(fn, *args, **kwargs))

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            await step(follower.open)
            while True:
                for item in await step(follower.poll):
                    yield item
                wait = poll_s
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        return
                await step(follower.wait, wait)
        finally:
            # Queued behind whatever step is still running in the follower's thread.
            thread.submit(follower.close)
            thread.shutdown(wait=False)


class AsyncSessionHandle:
    """What ``create_session``, a fork and an import return, for asyncio."""

    def __init__(self, store: AsyncSessionStore, header: Header) -> None:
        self.store = store
        self.header = header

    @property
    def session_id(self) -> str:
        return self.header.session_id

    @property
    def sync(self) -> SessionHandle:
        return SessionHandle(self.store.sync, self.header)

    async def append(
        self, entries: Sequence[dict[str, Any]], expected_tail_entry_id: str | None = None
    ) -> AppendResult:
        return await self.store.append_session_entries(self.session_id, entries, expected_tail_entry_id)

    async def load_entries(self) -> list[dict[str, Any]]:
        return await self.store.load_session_entries(self.session_id)

    async def tail(self) -> TailInfo:
        return await self.store.get_tail(self.session_id)

    def __repr__(self) -> str:
        return f"AsyncSessionHandle({self.session_id!r})"


class AsyncSessionManager:
    """pi's ``SessionManager`` (``store.manager``) for asyncio.

    Reads of the manager's snapshot (``get_leaf_id``, ``get_branch``, ``get_tree``,
    ``build_session_context``, ...) and moves of its leaf (``branch``, ``reset_leaf``) need no
    I/O: they are the sync manager's own methods, reached through this object. Everything that
    writes or re-reads is awaitable: ``await m.append_message(...)``, ``await m.refresh()``,
    and ``async with m.batch(): ...`` (the block's appends become one atomic segment when it
    exits; nothing is written if it raises).

    One manager is one writer with a leaf: use it from one task at a time.
    """

    _WRITES = frozenset({
        "append_message",
        "append_thinking_level_change",
        "append_model_change",
        "append_compaction",
        "append_custom_entry",
        "append_custom_message_entry",
        "append_label_change",
        "append_session_info",
        "branch_with_summary",
        "refresh",
    })

    def __init__(self, store: AsyncSessionStore, manager: SessionManager) -> None:
        self.store = store
        self.sync = manager
        self._in_batch = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.sync, name)
        if name not in self._WRITES:
            return attr

        async def write(*args: Any, **kwargs: Any) -> Any:
            if self._in_batch:
                # Inside a batch an append only adds to the pending list: no I/O.
                return attr(*args, **kwargs)
            return await self.store._run(attr, *args, **kwargs)

        write.__name__ = name
        write.__doc__ = attr.__doc__
        return write

    @contextlib.asynccontextmanager
    async def batch(self) -> AsyncIterator[AsyncSessionManager]:
        """Group the block's appends into one atomic segment, committed when it exits."""
        cm = self.sync.batch()
        cm.__enter__()
        self._in_batch = True
        try:
            yield self
        except BaseException as exc:
            self._in_batch = False
            cm.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self._in_batch = False
        # The commit (the block's exit) is the write: off the loop.
        await self.store._run(cm.__exit__, None, None, None)

    def __repr__(self) -> str:
        return f"Async{self.sync!r}"


async def _in_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """For the calls before a store's pool exists and after it is shut down."""
    return await asyncio.to_thread(fn, *args, **kwargs)


__all__ = ["AsyncSessionHandle", "AsyncSessionManager", "AsyncSessionStore"]
