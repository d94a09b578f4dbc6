"""AsyncSessionStore: the store from asyncio, on real S3 (moto, SeaweedFS) and a real Redis.

The loop thread must never do network I/O: every socket send and receive of the process is
watched (``socket.socket`` is a Python class; its ``sendall``/``recv_into``/... are wrapped to
record the calling thread, the traffic itself is untouched). How long the loop went without
running its callbacks is measured and reported, not asserted against a clock.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from history import Op, attempt_async, check_history

from store import EMPTY_TAIL, ConflictError, SessionStore
from store.aio import AsyncSessionManager, AsyncSessionStore
from store.errors import (
    InvalidEntryError,
    InvalidInputError,
    SessionExistsError,
    SessionNotFoundError,
)


def _entry(eid: str, parent: str | None, text: str = "") -> dict[str, Any]:
    return {
        "type": "message",
        "id": eid,
        "parentId": parent,
        "timestamp": "2026-11-23T10:00:00.000Z",
        "message": {"role": "user", "content": [{"type": "text", "text": text or eid}]},
    }


class SocketWatch:
    """Records which threads did network I/O (TCP: S3 and Redis) while recording."""

    METHODS = ("send", "sendall", "recv", "recv_into", "connect", "connect_ex")

    def __init__(self) -> None:
        self.threads: dict[str, int] = {}
        self.recording = False
        self._lock = threading.Lock()

    def _record(self) -> None:
        if not self.recording:
            return
        name = threading.current_thread().name
        with self._lock:
            self.threads[name] = self.threads.get(name, 0) + 1

    def install(self) -> Iterator[None]:
        saved = {m: socket.socket.__dict__.get(m) for m in self.METHODS}
        for m in self.METHODS:
            original = getattr(socket.socket, m)

            def wrapped(sock: socket.socket, *a: Any, _o: Any = original, **k: Any) -> Any:
                if sock.family in (socket.AF_INET, socket.AF_INET6):
                    # (the loop's own wake-up socketpair is AF_UNIX: not network I/O)
                    self._record()
                return _o(sock, *a, **k)

            setattr(socket.socket, m, wrapped)
        try:
            yield
        finally:
            for m, value in saved.items():
                if value is None:
                    delattr(socket.socket, m)
                else:
                    setattr(socket.socket, m, value)


@pytest.fixture
def socket_watch() -> Iterator[SocketWatch]:
    watch = SocketWatch()
    yield from _installed(watch)


def _installed(watch: SocketWatch) -> Iterator[SocketWatch]:
    gen = watch.install()
    next(gen)
    try:
        yield watch
    finally:
        with pytest.raises(StopIteration):
            next(gen)


class LoopLag:
    """A task that sleeps 1 ms at a time and records the longest it overslept: how long the
    loop was kept from running its callbacks."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.samples = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            self.worst = max(self.worst, time.perf_counter() - start - 0.001)
            self.samples += 1

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self._task


async def _open(s3_url: str, redis_url: str, redis_prefix: str, **kw: Any) -> AsyncSessionStore:
    return await AsyncSessionStore.open(s3_url, redis_url, redis_prefix=redis_prefix, **kw)


@pytest.mark.timeout(600)
def test_hundred_tasks_ten_sessions_history_clean_and_loop_never_does_io(
    s3_url: str, redis_url: str, redis_prefix: str, socket_watch: SocketWatch
) -> None:
    sessions = [f"aio-{i}" for i in range(10)]
    tasks, appends_each = 100, 4
    lag = LoopLag()

    async def main() -> tuple[list[Op], str]:
        loop_thread = threading.current_thread().name
        socket_watch.recording = True  # from here to the store's close: the loop's own life
        store = await _open(s3_url, redis_url, redis_prefix)
        async with store:
            for sid in sessions:
                await store.create_session(sid)
            lag.start()

            async def worker(t: int) -> list[Op]:
                rng = random.Random(t)
                ops: list[Op] = []
                last: dict[str, str | None] = {}
                for i in range(appends_each):
                    sid = sessions[(t + i) % len(sessions)]
                    expected: str | None = None
                    parent = last.get(sid)
                    if rng.random() < 0.5:
                        expected = (await store.get_tail(sid)).last_entry_id
                        parent = expected or None
                    ids = [f"t{t}-{i}-{k}" for k in range(rng.randint(1, 3))]
                    batch = [_entry(ids[0], parent)] + [_entry(ids[k], ids[k - 1]) for k in range(1, len(ids))]
                    op = await attempt_async(store, sid, batch, expected)
                    if op.outcome == "ok":
                        last[sid] = ids[-1]
                    ops.append(op)
                return ops

            results = await asyncio.gather(*(worker(t) for t in range(tasks)))
            await lag.stop()
        socket_watch.recording = False
        return [op for ops in results for op in ops], loop_thread

    ops, loop_thread = asyncio.run(main())
    assert len(ops) == tasks * appends_each
    errors = [op.outcome for op in ops if op.outcome.startswith("error")]
    assert errors == []
    # Every outcome judged against what a fresh store reads: nothing lost, duplicated, torn,
    # and no stale expected tail accepted.
    from store import SessionStore

    with SessionStore.from_url(s3_url, redis_url, redis_prefix=redis_prefix) as fresh:
        report = check_history(fresh, ops)
    assert report.problems == [], report.problems[:10]
    assert report.acknowledged > 0
    assert report.acknowledged + report.conflicts + report.indeterminate == len(ops)
    # The loop's thread did no network I/O at all; the store's threads did it all.
    assert loop_thread not in socket_watch.threads, socket_watch.threads
    assert any(name.startswith("sessionstore-aio") for name in socket_watch.threads)
    assert lag.samples > 0
    print(f"\nloop lag: worst {lag.worst * 1000:.1f} ms over {lag.samples} samples; "
          f"{report.acknowledged} acknowledged, {report.conflicts} conflicts")


def test_follow_sees_every_entry_from_other_writers(s3_url: str, redis_url: str, redis_prefix: str) -> None:
    async def main() -> list[str]:
        async with await _open(s3_url, redis_url, redis_prefix) as store:
            handle = await store.create_session("followed")
            await handle.append([_entry("a", None)])
            seen: list[str] = []

            async def follower() -> None:
                async for seq, entry in store.follow("followed", after_seq=1, poll_s=0.2, timeout_s=60):
                    seen.append(entry["id"])
                    if len(seen) == 5:
                        return

            task = asyncio.create_task(follower())
            # Meanwhile another writer (the sync store, as another process would) appends.
            writer = store.sync
            parent = "a"
            for i in range(5):
                await asyncio.to_thread(writer.append_session_entries, "followed", [_entry(f"b{i}", parent)])
                parent = f"b{i}"
            await asyncio.wait_for(task, 60)
            return seen

    assert asyncio.run(main()) == [f"b{i}" for i in range(5)]


def test_follow_stops_at_once_when_cancelled(s3_url: str, redis_url: str, redis_prefix: str) -> None:
    async def main() -> None:
        async with await _open(s3_url, redis_url, redis_prefix) as store:
            await store.create_session("quiet")
            got: list[Any] = []

            async def follower() -> None:
                async for item in store.follow("quiet", poll_s=30):
                    got.append(item)

            task = asyncio.create_task(follower())
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert got == []
            # The store still works after a follower was cancelled mid-wait.
            await store.append_session_entries("quiet", [_entry("x", None)])
            assert [e["id"] for e in await store.load_session_entries("quiet")] == ["x"]

    asyncio.run(main())


def test_follow_of_a_missing_session_raises(s3_url: str, redis_url: str, redis_prefix: str) -> None:
    async def main() -> None:
        async with await _open(s3_url, redis_url, redis_prefix) as store:
            with pytest.raises(SessionNotFoundError):
                async for _ in store.follow("nobody", poll_s=0.1):
                    pass

    asyncio.run(main())


def test_cancelled_append_is_resent_idempotently(s3_url: str, redis_url: str, redis_prefix: str) -> None:
    """Cancelling an append in flight leaves its outcome unknown to the caller; the append
    itself runs to its end, and re-sending the same batch never duplicates it."""

    async def main() -> None:
        committed = threading.Event()
        hook_seen: list[str] = []

        def hook(point: str, info: dict[str, Any]) -> None:
            if point == "append.before_put" and info.get("session_id") == "cancel":
                hook_seen.append(point)
                time.sleep(0.3)  # the await is cancelled while the append is in flight
            if point == "append.after_commit" and info.get("session_id") == "cancel":
                committed.set()

        async with await _open(s3_url, redis_url, redis_prefix, fault_hook=hook) as store:
            await store.create_session("cancel")
            batch = [_entry("c1", None), _entry("c2", "c1")]
            task = asyncio.create_task(store.append_session_entries("cancel", batch))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The append runs to its end in its thread.
            assert await asyncio.to_thread(committed.wait, 30)
            again = await store.append_session_entries("cancel", batch)
            assert again.seq == 1 and again.last_appended_entry_id == "c2"
            assert [e["id"] for e in await store.load_session_entries("cancel")] == ["c1", "c2"]
            assert hook_seen == ["append.before_put"]

    asyncio.run(main())


def test_close_waits_for_operations_still_running(s3_url: str, redis_url: str, redis_prefix: str) -> None:
    async def main() -> None:
        def slow(point: str, info: dict[str, Any]) -> None:
            if point == "append.before_put":
                time.sleep(0.3)

        store = await _open(s3_url, redis_url, redis_prefix, fault_hook=slow)
        await store.create_session("closing")
        task = asyncio.create_task(store.append_session_entries("closing", [_entry("z", None)]))
        await asyncio.sleep(0.05)
        task.cancel()
        await store.close()  # returns only when the append has ended
        with pytest.raises(InvalidInputError):
            await store.get_tail("closing")

    asyncio.run(main())
    from store import SessionStore

    with SessionStore.from_url(s3_url, redis_url, redis_prefix=redis_prefix) as fresh:
        assert [e["id"] for e in fresh.load_session_entries("closing")] == ["z"]


def test_errors_are_the_sync_stores_and_change_nothing(s3_url: str, redis_url: str, redis_prefix: str) -> None:
    async def main() -> None:
        async with await _open(s3_url, redis_url, redis_prefix) as store:
            handle = await store.create_session("errs")
            with pytest.raises(SessionExistsError):
                await store.create_session("errs")
            with pytest.raises(SessionNotFoundError):
                await store.get_tail("missing")
            with pytest.raises(InvalidEntryError):
                await handle.append([{"type": "message", "id": ""}])
            with pytest.raises(InvalidInputError):
                await store.append_session_entries("not a valid id/", [_entry("q", None)])
            r = await handle.append([_entry("a", None)], EMPTY_TAIL)
            with pytest.raises(ConflictError) as exc:
                await handle.append([_entry("b", None)], EMPTY_TAIL)
            assert exc.value.actual_tail_entry_id == "a"
            assert (await handle.tail()).seq == r.seq == 1
            assert [e["id"] for e in await handle.load_entries()] == ["a"]

    asyncio.run(main())
    with pytest.raises(InvalidInputError):
        AsyncSessionStore(object())  # type: ignore[arg-type]


def test_manager_appends_batches_and_forks(s3_url: str, redis_url: str, redis_prefix: str) -> None:
    async def main() -> None:
        async with await _open(s3_url, redis_url, redis_prefix) as store:
            await store.create_session("mgr")
            m = await store.open_session("mgr")
            assert isinstance(m, AsyncSessionManager)
            first = await m.append_message({"role": "user", "content": "hi", "timestamp": 1})
            async with m.batch():
                a = await m.append_message({"role": "assistant", "content": [], "timestamp": 2})
                b = await m.append_session_info("named")
            assert m.get_leaf_id() == b
            assert [e["id"] for e in m.get_branch()] == [first, a, b]
            # The batch is one segment: seq 2 holds both entries.
            data = await store.read_session("mgr")
            assert data.seqs == [1, 2, 2]
            with pytest.raises(RuntimeError):
                async with m.batch():
                    await m.append_message({"role": "user", "content": "lost", "timestamp": 3})
                    raise RuntimeError("the block fails")
            assert len(await store.load_session_entries("mgr")) == 3
            other = await store.open_session("mgr")
            assert other.get_session_name() == "named"
            fork = await store.branch_from_entry("mgr", first, "mgr-fork")
            assert [e["id"] for e in await fork.load_entries()] == [first]
            sessions = {s.session_id for s in (await store.list_sessions()).items}
            assert {"mgr", "mgr-fork"} <= sessions
            await store.delete_session("mgr-fork")
            with pytest.raises(SessionNotFoundError):
                await store.get_header("mgr-fork")

    asyncio.run(main())


#: SessionStore methods with no awaitable twin, and why.
_SYNC_ONLY = {
    "from_url": "AsyncSessionStore.open builds the store off the loop",
    "follower": "a follow's state for a driver of its own: AsyncSessionStore.follow drives it",
    "append_prepared": "an importer's seam: the batch is prepared by the caller",
    "hydrate": "rebuilds Redis's state: an operator's tool (the CLI)",
    "iter_export_pi_session": "a generator of lines; export_pi_session awaits the whole file",
    "iter_segment_keys": "the compactor's and tools' listing",
    "latest_manifest": "the compactor's",
}


def test_every_public_method_of_the_store_has_an_awaitable_twin() -> None:
    """The asyncio API does not drift behind the sync one: a new public method of
    SessionStore needs its twin here, or a reason in _SYNC_ONLY."""
    import inspect

    sync = {n for n, v in inspect.getmembers(SessionStore) if not n.startswith("_") and callable(v)}
    sync -= {"close"}  # AsyncSessionStore.close is its own (waits for the pool)
    missing = sorted(n for n in sync - set(_SYNC_ONLY) if not hasattr(AsyncSessionStore, n))
    assert missing == []
    for name in sync - set(_SYNC_ONLY):
        twin = getattr(AsyncSessionStore, name)
        assert inspect.iscoroutinefunction(twin) or inspect.isasyncgenfunction(twin), name
    assert set(_SYNC_ONLY) <= sync  # no stale excuse


def test_lifecycle_and_keys_from_asyncio(
    s3_url: str, redis_url: str, redis_prefix: str, tmp_path: Any, socket_watch: SocketWatch
) -> None:
    from store.formats.crypto import LocalKeyFile, create_keyring
    from store.errors import KeyUnavailableError, NotInTrashError
    from store.lifecycle.retention import Retention

    keyring = tmp_path / "keyring.json"
    create_keyring(keyring)

    async def main() -> None:
        async with await _open(s3_url, redis_url, redis_prefix, key_provider=LocalKeyFile(keyring)) as store:
            handle = await store.create_session("life")
            await handle.append([_entry("a", None), _entry("b", "a"), _entry("c", "b")])
            assert await store.get_retention("life") is None
            kept = await store.set_retention("life", Retention.sliding(3_600_000))
            assert await store.get_retention("life") == kept
            assert await store.list_trash() == []
            with pytest.raises(NotInTrashError):
                await store.restore_session("life")
            await store.redact_entries("life", ["a", "b"], "pii")
            loaded = await store.load_session_entries("life")
            assert [e["id"] for e in loaded][:3] == ["a", "b", "c"]
            assert [e["type"] for e in loaded[3:]] == ["redaction", "redaction"]  # one batch
            assert [("message" in e, e.get("redacted", {}).get("reason")) for e in loaded[:3]] == [
                (False, "pii"), (False, "pii"), (True, None)
            ]
            assert await store.rotate_data_key("life") == 2
            await handle.append([_entry("d", "c")])
            assert [e["id"] for e in await store.load_session_entries("life")][-1] == "d"
            assert await store.shred_keys("life") == 2
        async with await _open(s3_url, redis_url, redis_prefix, key_provider=LocalKeyFile(keyring)) as fresh:
            with pytest.raises(KeyUnavailableError):
                await fresh.load_session_entries("life")

    socket_watch.recording = True
    asyncio.run(main())
    socket_watch.recording = False
    assert "MainThread" not in socket_watch.threads
