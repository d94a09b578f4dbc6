"""OpenAI Agents SDK: its default file-backed session (``SQLiteSession``, a SQLite file in the
work directory) against ``store.adapters.openai_agents.SessionStoreSession``, same workload,
through the SDK's ``Session`` API on both sides.

Metrics (rows ``{"framework", "backend", "metric", "value", "unit"}``):

- ``append_ms_p50`` / ``append_ms_p99``: ``add_items`` of one item (a ~1 KB message), one call
  after the other on one session (200 calls; quick: 30).
- ``resume_s_1k`` / ``resume_s_10k``: a fresh session object (and, for the store, a store
  opened beforehand with no cache of the session) reads a session of 1k / 10k items with
  ``get_items()``; the median of a few reads. The sessions are built with ``add_items`` of 10
  items at a time (so the store holds 100 / 1,000 segments of 10, uncompacted). The store is
  also measured after one compaction (backend ``sessionstore+compacted``), the shape a session
  has in production, where the compactor runs. Quick: 1k only.
- ``get_after_one_new_ms_1k`` / ``_10k`` (and, for the store, ``get_after_one_new_requests_*``:
  the object-store requests the read sent): ``get_items()`` at the start of a turn by a process
  that read the session at its last turn, one item added since by another session object.
- ``lost_2_writers`` / ``lost_4_writers``: 2 / 4 writer processes each ``add_items`` N items
  (N=50; quick: 10), one per call, concurrently to one session; then a fresh reader counts the
  acknowledged items it does not see. ``extra_*``: items it sees more than once or that no
  writer had acknowledged; ``errors_*``: ``add_items`` calls that raised (not acknowledged, so
  not counted as lost). SQLite's writers share the file on one machine (what it supports);
  the store's writers share only the object store and Redis.

Standalone: ``python -c "from benchmarks.peers.openai_agents import run; from pathlib import
Path; print(run('file:///tmp/x', None, Path('/tmp/w'), quick=True))"``.
"""

from __future__ import annotations

import asyncio
import gc
import json
import multiprocessing as mp
import statistics
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

FRAMEWORK = "openai-agents"
DEFAULT_BACKEND = "sqlite"
ADAPTER_BACKEND = "sessionstore"

_TEXT = ("The quick brown fox jumps over the lazy dog; " * 24)[:1000]


def _item(tag: str, i: int) -> dict[str, Any]:
    return {"role": "user" if i % 2 == 0 else "assistant", "content": f"{tag} {i} {_TEXT}"}


def _pct(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of a sorted sample."""
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


def _row(backend: str, metric: str, value: float, unit: str) -> dict[str, Any]:
    return {"framework": FRAMEWORK, "backend": backend, "metric": metric, "value": float(value), "unit": unit}


# --- the two backends --------------------------------------------------------------------------


class _Backend:
    """Opens sessions of one backend, in this process or in a worker process (picklable)."""

    def __init__(self, name: str, *, db_path: str | None = None, objects_url: str | None = None,
                 redis_url: str | None = None, redis_prefix: str | None = None) -> None:
        self.name = name
        self.db_path = db_path
        self.objects_url = objects_url
        self.redis_url = redis_url
        self.redis_prefix = redis_prefix
        self._store: Any = None

    async def open(self) -> None:
        if self.name != DEFAULT_BACKEND and self._store is None:
            from store.aio import AsyncSessionStore

            self._store = await AsyncSessionStore.open(
                self.objects_url, self.redis_url, redis_prefix=self.redis_prefix
            )

    def session(self, sid: str) -> Any:
        if self.name == DEFAULT_BACKEND:
            from agents import SQLiteSession

            return SQLiteSession(sid, self.db_path)
        from store.adapters.openai_agents import SessionStoreSession

        return SessionStoreSession(sid, self._store)

    async def release(self, session: Any) -> None:
        if self.name == DEFAULT_BACKEND:
            session.close()

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()
            self._store = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_store": None}


# --- the workloads -----------------------------------------------------------------------------


async def _append_latency(backend: _Backend, sid: str, calls: int) -> list[float]:
    session = backend.session(sid)
    try:
        await session.add_items([_item("warm", 0)])  # creates the session (both sides)
        times = []
        for i in range(calls):
            item = [_item("append", i)]
            t0 = time.perf_counter()
            await session.add_items(item)
            times.append((time.perf_counter() - t0) * 1000)
        return sorted(times)
    finally:
        await backend.release(session)


async def _build(backend: _Backend, sid: str, n: int, per_call: int = 10) -> None:
    session = backend.session(sid)
    try:
        for start in range(0, n, per_call):
            await session.add_items([_item("resume", i) for i in range(start, min(n, start + per_call))])
    finally:
        await backend.release(session)


async def _resume(backend: _Backend, sid: str, n: int, reads: int) -> float:
    """Median seconds of ``get_items()`` by a session object that has never seen ``sid``,
    over a store of its own (opened before the clock starts: a process opens it once)."""
    times = []
    for _ in range(reads):
        fresh = _Backend(backend.name, db_path=backend.db_path, objects_url=backend.objects_url,
                         redis_url=backend.redis_url, redis_prefix=backend.redis_prefix)
        await fresh.open()
        session = fresh.session(sid)
        try:
            gc.collect()
            t0 = time.perf_counter()
            items = await session.get_items()
            times.append(time.perf_counter() - t0)
        finally:
            await fresh.release(session)
            await fresh.close()
        if len(items) != n:
            raise AssertionError(f"{backend.name}: resumed {len(items)} items of {n}")
    return statistics.median(times)


async def _turn_read(backend: _Backend, sid: str, n: int) -> tuple[float, int | None]:
    """``get_items()`` at the start of a turn: a process that read the session at its last
    turn, one new item since (added by another session object). Seconds, and for the store the
    object-store requests of that read (its own count of the requests it sent)."""
    reader = _Backend(backend.name, db_path=backend.db_path, objects_url=backend.objects_url,
                      redis_url=backend.redis_url, redis_prefix=backend.redis_prefix)
    await reader.open()
    try:
        first = reader.session(sid)
        try:
            before = len(await first.get_items())
        finally:
            await reader.release(first)
        writer = backend.session(sid)
        try:
            await writer.add_items([_item("turn", n)])
        finally:
            await backend.release(writer)
        session = reader.session(sid)
        requests = reader._store.sync.objects.requests if reader._store is not None else None
        if requests is not None:
            requests.clear()
        try:
            t0 = time.perf_counter()
            items = await session.get_items()
            dt = time.perf_counter() - t0
        finally:
            await reader.release(session)
        if len(items) != before + 1:
            raise AssertionError(f"{backend.name}: {len(items)} items after one new of {before}")
        return dt, (sum(requests.values()) if requests is not None else None)
    finally:
        await reader.close()


def _writer(backend: _Backend, sid: str, wid: int, count: int, start: Any, out: str) -> None:
    """A writer process: ``count`` items, one ``add_items`` each; records what was acknowledged."""

    async def main() -> dict[str, Any]:
        await backend.open()
        session = backend.session(sid)
        acked: list[str] = []
        errors: list[str] = []
        start.wait(120)
        try:
            for i in range(count):
                content = f"writer {wid} item {i}"
                try:
                    await session.add_items([{"role": "user", "content": content}])
                except Exception as exc:  # noqa: BLE001 - counted: not acknowledged
                    errors.append(f"{type(exc).__name__}: {exc}")
                else:
                    acked.append(content)
        finally:
            await backend.release(session)
            await backend.close()
        return {"acked": acked, "errors": errors}

    Path(out).write_text(json.dumps(asyncio.run(main())))


async def _lost(backend: _Backend, ctx: Any, sid: str, writers: int, count: int, workdir: Path) -> dict[str, int]:
    start = ctx.Barrier(writers)
    outs = [workdir / f"{backend.name}-{sid}-{w}.json" for w in range(writers)]
    procs = [ctx.Process(target=_writer, args=(backend, sid, w, count, start, str(outs[w])))
             for w in range(writers)]
    for p in procs:
        p.start()
    for p in procs:
        await asyncio.to_thread(p.join, 300)
    acked: list[str] = []
    errors = 0
    for p, out in zip(procs, outs):
        if p.exitcode != 0 or not out.exists():
            raise RuntimeError(f"{backend.name}: a writer process failed (exit code {p.exitcode})")
        report = json.loads(out.read_text())
        acked += report["acked"]
        errors += len(report["errors"])
    session = backend.session(sid)
    try:
        seen = Counter(str(item.get("content")) for item in await session.get_items())
    finally:
        await backend.release(session)
    acknowledged = set(acked)
    lost = sum(1 for content in acknowledged if seen[content] == 0)
    extra = sum(n if c not in acknowledged else n - 1 for c, n in seen.items() if n > 1 or c not in acknowledged)
    return {"lost": lost, "extra": extra, "errors": errors}


# --- the run -----------------------------------------------------------------------------------


def _embedded_redis(objects_url: str) -> tuple[str, Any]:
    """The embedded redis-server beside a file:// store, started if needed: (url, to stop)."""
    from store.backends.embedded import EmbeddedRedis
    from store.backends.objects import object_store_from_url

    objects = object_store_from_url(objects_url)
    try:
        embedded = EmbeddedRedis(objects.root / ".redis")  # type: ignore[attr-defined]
        was_running = embedded.running()
        url = embedded.ensure_running()
    finally:
        objects.close()
    return url, (None if was_running else embedded)


async def _run(objects_url: str, redis_url: str | None, workdir: Path, quick: bool) -> list[dict[str, Any]]:
    run_id = uuid.uuid4().hex[:8]
    calls = 30 if quick else 200
    sizes = [1000] if quick else [1000, 10_000]
    reads = 1 if quick else 3
    per_writer = 10 if quick else 50
    backends = [
        _Backend(DEFAULT_BACKEND, db_path=str(workdir / f"openai_agents-{run_id}.sqlite")),
        _Backend(ADAPTER_BACKEND, objects_url=objects_url, redis_url=redis_url,
                 redis_prefix=f"peers-oa-{run_id}"),
    ]
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["agents", "store.aio", "store.adapters.openai_agents", __name__])
    rows: list[dict[str, Any]] = []
    created: list[str] = []
    for backend in backends:
        await backend.open()
        try:
            sid = f"oa-append-{run_id}"
            created.append(sid)
            times = await _append_latency(backend, sid, calls)
            rows.append(_row(backend.name, "append_ms_p50", _pct(times, 50), "ms"))
            rows.append(_row(backend.name, "append_ms_p99", _pct(times, 99), "ms"))
            for n in sizes:
                sid = f"oa-resume-{n}-{run_id}"
                created.append(sid)
                await _build(backend, sid, n)
                label = f"resume_s_{n // 1000}k"
                rows.append(_row(backend.name, label, await _resume(backend, sid, n, reads), "s"))
                dt, requests = await _turn_read(backend, sid, n)
                rows.append(_row(backend.name, f"get_after_one_new_ms_{n // 1000}k", dt * 1000, "ms"))
                if requests is not None:
                    rows.append(_row(backend.name, f"get_after_one_new_requests_{n // 1000}k", requests, "requests"))
                if backend.name == ADAPTER_BACKEND:
                    from compactor import Compactor

                    await asyncio.to_thread(Compactor(backend._store.sync).compact_session, sid)
                    rows.append(_row(f"{ADAPTER_BACKEND}+compacted", label,
                                     await _resume(backend, sid, n + 1, reads), "s"))
            for writers in (2, 4):
                sid = f"oa-writers-{writers}-{run_id}"
                created.append(sid)
                counts = await _lost(backend, ctx, sid, writers, per_writer, workdir)
                rows.append(_row(backend.name, f"lost_{writers}_writers", counts["lost"], "items"))
                rows.append(_row(backend.name, f"extra_{writers}_writers", counts["extra"], "items"))
                rows.append(_row(backend.name, f"errors_{writers}_writers", counts["errors"], "calls"))
            if backend.name == ADAPTER_BACKEND:
                for sid in created:  # leave nothing behind in the given store
                    await backend.session(sid).delete()
        finally:
            await backend.close()
    return rows


def run(objects_url: str, redis_url: str | None, workdir: Path, *, quick: bool) -> list[dict[str, Any]]:
    """The side-by-side rows (see the module's doc). SQLite's file goes under ``workdir``."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    stop = None
    if redis_url is None and urlparse(objects_url).scheme == "file":
        # One embedded redis-server for this process and the writer processes; stopped again
        # at the end if this run started it.
        redis_url, stop = _embedded_redis(objects_url)
    try:
        return asyncio.run(_run(objects_url, redis_url, workdir, quick))
    finally:
        if stop is not None:
            stop.stop()


__all__ = ["run"]
