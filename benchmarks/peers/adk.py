"""Google ADK: its database session service (``DatabaseSessionService`` on a SQLite file in
the work directory, ``sqlite+aiosqlite``) against ``store.adapters.adk.SessionStoreSessionService``,
same workload, through ADK's ``BaseSessionService`` API on both sides.

Metrics (rows ``{"framework", "backend", "metric", "value", "unit"}``):

- ``append_ms_p50`` / ``append_ms_p99``: ``append_event`` of one event (a ~1 KB user message
  with a one-key state delta), one call after the other on one session object (200 calls;
  quick: 30).
- ``append_object_writes`` / ``append_requests`` (the store only, as it counts what it sends):
  one ``append_event`` with a session-scoped delta; ``append_user_state_*``: with a ``user:``
  key in its delta (the shared scope is another store session: one more write).
- ``resume_s_1k`` / ``resume_s_10k``: a fresh service (for the store: over a store opened
  beforehand, with no cache of the session; for SQLite: its tables prepared beforehand) reads
  a session of 1k / 10k events with ``get_session``; the median of a few reads. The sessions
  are built in bulk, not through ``append_event`` (SQLite's ``append_event`` costs a
  transaction each, minutes for 10k): for SQLite the service's own ORM rows in one
  transaction, for the store the adapter's own event entries appended 10 at a time (100 /
  1,000 segments of 10, uncompacted). The store is also measured after one compaction
  (backend ``sessionstore+compacted``), the shape a session has in production, where the
  compactor runs. Quick: 1k only.
- ``lost_2_writers`` / ``lost_4_writers``: 2 / 4 writer processes each append N events
  (N=50; quick: 10), one ``append_event`` per event, concurrently to one session, as an ADK
  application must: a writer refused with ``StaleSessionError`` (another process appended
  since it loaded the session) reloads it (``get_session``) and appends the same event again.
  Then a fresh reader counts the acknowledged events it does not see. ``extra_*``: events it
  sees more than once or that no writer had acknowledged; ``stale_*``: refusals as stale
  (retried); ``errors_*``: other exceptions raised by ``append_event`` (retried too; e.g.
  SQLite's "database is locked"), and an event still refused after 200 attempts is given up
  (not acknowledged, so not lost). SQLite's writers share the file on one machine (what it
  supports); the store's writers share only the object store and Redis.

Needs ``google-adk`` and, for the SQLite side, SQLAlchemy's asyncio extra (ADK's ``db`` extra:
``pip install 'sqlalchemy[asyncio]>=2,<3'``; ``aiosqlite`` comes with ``google-adk``).

Standalone: ``python -c "from benchmarks.peers.adk import run; from pathlib import Path;
print(run('file:///tmp/x', None, Path('/tmp/w'), quick=True))"``.
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

FRAMEWORK = "google-adk"
DEFAULT_BACKEND = "sqlite"
ADAPTER_BACKEND = "sessionstore"
APP = "bench"
USER = "u"

_TEXT = ("The quick brown fox jumps over the lazy dog; " * 24)[:1000]
_MAX_ATTEMPTS = 200


def _event(text: str, i: int) -> Any:
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.genai import types

    return Event(
        author="user",
        invocation_id=f"inv-{i}",
        content=types.Content(role="user", parts=[types.Part(text=text)]),
        actions=EventActions(state_delta={"last": i}),
    )


def _text(event: Any) -> str:
    parts = event.content.parts if event.content else None
    return "".join(p.text or "" for p in parts or [])


def _pct(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of a sorted sample."""
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


def _row(backend: str, metric: str, value: float, unit: str) -> dict[str, Any]:
    return {"framework": FRAMEWORK, "backend": backend, "metric": metric, "value": float(value), "unit": unit}


# --- the two backends --------------------------------------------------------------------------


class _Backend:
    """Opens a session service of one backend, in this process or in a worker process
    (picklable: the service itself is not carried over)."""

    def __init__(self, name: str, *, db_path: str | None = None, objects_url: str | None = None,
                 redis_url: str | None = None, redis_prefix: str | None = None,
                 namespace: str = "adk") -> None:
        self.name = name
        self.db_path = db_path
        self.objects_url = objects_url
        self.redis_url = redis_url
        self.redis_prefix = redis_prefix
        self.namespace = namespace
        self.service: Any = None

    def fresh(self) -> _Backend:
        return _Backend(self.name, db_path=self.db_path, objects_url=self.objects_url,
                        redis_url=self.redis_url, redis_prefix=self.redis_prefix,
                        namespace=self.namespace)

    async def open(self) -> None:
        if self.service is not None:
            return
        if self.name == DEFAULT_BACKEND:
            from google.adk.sessions.database_session_service import (
                DatabaseSessionService,
            )

            self.service = DatabaseSessionService(f"sqlite+aiosqlite:///{self.db_path}")
            await self.service.prepare_tables()
        else:
            from store.adapters.adk import SessionStoreSessionService
            from store.aio import AsyncSessionStore

            store = await AsyncSessionStore.open(self.objects_url, self.redis_url,
                                                 redis_prefix=self.redis_prefix)
            self.service = SessionStoreSessionService(store, namespace=self.namespace, owns_store=True)

    async def close(self) -> None:
        if self.service is not None:
            await self.service.close()
            self.service = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "service": None}

    # Building a session of n events in bulk (not a measured path).

    async def build(self, sid: str, n: int, per_call: int = 10) -> None:
        session = await self.service.create_session(app_name=APP, user_id=USER, session_id=sid)
        events = [_event(f"resume {i} {_TEXT}", i) for i in range(n)]
        if self.name == DEFAULT_BACKEND:
            await self._build_sqlite(session, events)
            return
        from store.adapters.adk import event_entry

        store_sid = self.service.store_session_id(APP, USER, sid)
        parent: str | None = None
        for start in range(0, n, per_call):
            batch = []
            for event in events[start:start + per_call]:
                batch.append(event_entry(event, parent))
                parent = batch[-1]["id"]
            await self.service.store.append_session_entries(store_sid, batch)

    async def _build_sqlite(self, session: Any, events: list[Any]) -> None:
        """The rows ``append_event`` would write, in one transaction (ADK's own ORM classes)."""
        service = self.service
        schema = service._get_schema_classes()
        async with service.database_session_factory() as sql:
            for event in events:
                sql.add(schema.StorageEvent.from_event(session, event))
            row = await sql.get(schema.StorageSession, (APP, USER, session.id))
            row.state = {**row.state, "last": len(events) - 1}
            row.update_time = datetime.fromtimestamp(events[-1].timestamp, UTC).replace(tzinfo=None)
            await sql.commit()


# --- the workloads -----------------------------------------------------------------------------


async def _append_latency(backend: _Backend, sid: str, calls: int) -> list[float]:
    service = backend.service
    session = await service.create_session(app_name=APP, user_id=USER, session_id=sid)
    await service.append_event(session, _event("warm", -1))
    times = []
    for i in range(calls):
        event = _event(f"append {i} {_TEXT}", i)
        t0 = time.perf_counter()
        await service.append_event(session, event)
        times.append((time.perf_counter() - t0) * 1000)
    return sorted(times)


async def _append_writes(backend: _Backend, sid: str, delta: dict[str, Any]) -> tuple[float, float]:
    """Object-store writes (PUTs) and requests of one ``append_event`` with ``delta`` as its
    state delta, as the store counts what it sends (the mean of 10 appends)."""
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions

    service = backend.service
    session = await service.create_session(app_name=APP, user_id=USER, session_id=sid)
    await service.append_event(session, _event("warm", -1))
    requests = service.store.sync.objects.requests
    requests.clear()
    for i in range(10):
        await service.append_event(session, Event(author="user", invocation_id=f"w-{i}",
                                                  actions=EventActions(state_delta={**delta, "n": i})))
    return requests["put"] / 10, sum(requests.values()) / 10


async def _resume(backend: _Backend, sid: str, n: int, reads: int) -> float:
    """Median seconds of ``get_session`` by a service that has never seen ``sid`` (opened
    before the clock starts: a process opens it once)."""
    times = []
    for _ in range(reads):
        fresh = backend.fresh()
        await fresh.open()
        try:
            gc.collect()
            t0 = time.perf_counter()
            session = await fresh.service.get_session(app_name=APP, user_id=USER, session_id=sid)
            times.append(time.perf_counter() - t0)
        finally:
            await fresh.close()
        if session is None or len(session.events) != n:
            raise AssertionError(f"{backend.name}: resumed {len(session.events) if session else None} of {n}")
    return statistics.median(times)


def _writer(backend: _Backend, sid: str, wid: int, count: int, start: Any, out: str) -> None:
    """A writer process: ``count`` events, one ``append_event`` each, reloading the session
    whenever it is refused; records what was acknowledged."""

    async def main() -> dict[str, Any]:
        from google.adk.errors import StaleSessionError

        await backend.open()
        service = backend.service
        acked: list[str] = []
        stale = errors = 0
        try:
            session = await service.get_session(app_name=APP, user_id=USER, session_id=sid)
            start.wait(120)
            for i in range(count):
                text = f"writer {wid} item {i}"
                for _ in range(_MAX_ATTEMPTS):
                    try:
                        await service.append_event(session, _event(text, i))
                    except StaleSessionError:
                        stale += 1
                    except Exception:  # noqa: BLE001 - counted, retried: not acknowledged
                        errors += 1
                    else:
                        acked.append(text)
                        break
                    session = await _reload(service, sid)
        finally:
            await backend.close()
        return {"acked": acked, "stale": stale, "errors": errors}

    Path(out).write_text(json.dumps(asyncio.run(main())))


async def _reload(service: Any, sid: str) -> Any:
    for _ in range(_MAX_ATTEMPTS):
        try:
            return await service.get_session(app_name=APP, user_id=USER, session_id=sid)
        except Exception:  # noqa: BLE001 - e.g. SQLite's "database is locked": read again
            await asyncio.sleep(0.01)
    raise RuntimeError(f"session {sid}: could not be read")


async def _lost(backend: _Backend, ctx: Any, sid: str, writers: int, count: int, workdir: Path) -> dict[str, int]:
    await backend.service.create_session(app_name=APP, user_id=USER, session_id=sid)
    start = ctx.Barrier(writers)
    outs = [workdir / f"adk-{backend.name}-{sid}-{w}.json" for w in range(writers)]
    procs = [ctx.Process(target=_writer, args=(backend, sid, w, count, start, str(outs[w])))
             for w in range(writers)]
    for p in procs:
        p.start()
    for p in procs:
        await asyncio.to_thread(p.join, 600)
    acked: list[str] = []
    stale = errors = 0
    for p, out in zip(procs, outs):
        if p.exitcode != 0 or not out.exists():
            raise RuntimeError(f"{backend.name}: a writer process failed (exit code {p.exitcode})")
        report = json.loads(out.read_text())
        acked += report["acked"]
        stale += report["stale"]
        errors += report["errors"]
    reader = backend.fresh()
    await reader.open()
    try:
        session = await reader.service.get_session(app_name=APP, user_id=USER, session_id=sid)
    finally:
        await reader.close()
    seen = Counter(_text(e) for e in session.events)
    acknowledged = set(acked)
    lost = sum(1 for text in acknowledged if seen[text] == 0)
    extra = sum(n if t not in acknowledged else n - 1 for t, n in seen.items() if n > 1 or t not in acknowledged)
    return {"lost": lost, "extra": extra, "stale": stale, "errors": errors}


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


async def _cleanup(backend: _Backend, sids: list[str]) -> None:
    """Leave nothing behind in the given store: every store session the run's namespace used."""
    from store.errors import SessionNotFoundError

    service = backend.service
    ids = service.ids
    store_sids = [ids.session(APP, USER, s) for s in sids]
    store_sids += [ids.index(APP, USER), ids.user_state(APP, USER), ids.app_state(APP), ids.users(APP)]
    for store_sid in store_sids:
        try:
            await service.store.delete_session(store_sid)
        except SessionNotFoundError:
            pass


async def _run(objects_url: str, redis_url: str | None, workdir: Path, quick: bool) -> list[dict[str, Any]]:
    run_id = uuid.uuid4().hex[:8]
    calls = 30 if quick else 200
    sizes = [1000] if quick else [1000, 10_000]
    reads = 1 if quick else 3
    per_writer = 10 if quick else 50
    backends = [
        _Backend(DEFAULT_BACKEND, db_path=str(workdir / f"adk-{run_id}.sqlite")),
        _Backend(ADAPTER_BACKEND, objects_url=objects_url, redis_url=redis_url,
                 redis_prefix=f"peers-adk-{run_id}", namespace=f"bench{run_id}"),
    ]
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["google.adk.events", "google.adk.sessions", "store.aio",
                                "store.adapters.adk", __name__])
    rows: list[dict[str, Any]] = []
    for backend in backends:
        await backend.open()
        created: list[str] = []
        try:
            sid = f"append-{run_id}"
            created.append(sid)
            times = await _append_latency(backend, sid, calls)
            rows.append(_row(backend.name, "append_ms_p50", _pct(times, 50), "ms"))
            rows.append(_row(backend.name, "append_ms_p99", _pct(times, 99), "ms"))
            if backend.name == ADAPTER_BACKEND:
                for label, delta in (("", {}), ("_user_state", {"user:seen": 1})):
                    sid = f"writes{label}-{run_id}"
                    created.append(sid)
                    puts, total = await _append_writes(backend, sid, delta)
                    rows.append(_row(backend.name, f"append{label}_object_writes", puts, "PUTs"))
                    rows.append(_row(backend.name, f"append{label}_requests", total, "requests"))
            for n in sizes:
                sid = f"resume-{n}-{run_id}"
                created.append(sid)
                await backend.build(sid, n)
                label = f"resume_s_{n // 1000}k"
                rows.append(_row(backend.name, label, await _resume(backend, sid, n, reads), "s"))
                if backend.name == ADAPTER_BACKEND:
                    from compactor import Compactor

                    store_sid = backend.service.store_session_id(APP, USER, sid)
                    await asyncio.to_thread(Compactor(backend.service.store.sync).compact_session, store_sid)
                    rows.append(_row(f"{ADAPTER_BACKEND}+compacted", label,
                                     await _resume(backend, sid, n, reads), "s"))
            for writers in (2, 4):
                sid = f"writers-{writers}-{run_id}"
                created.append(sid)
                counts = await _lost(backend, ctx, sid, writers, per_writer, workdir)
                rows.append(_row(backend.name, f"lost_{writers}_writers", counts["lost"], "events"))
                rows.append(_row(backend.name, f"extra_{writers}_writers", counts["extra"], "events"))
                rows.append(_row(backend.name, f"stale_{writers}_writers", counts["stale"], "calls"))
                rows.append(_row(backend.name, f"errors_{writers}_writers", counts["errors"], "calls"))
            if backend.name == ADAPTER_BACKEND:
                await _cleanup(backend, created)
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
