"""Writer processes for the throughput and contention scenarios.

Each process builds its own ``SessionStore`` and its own raw floor client (processes share
nothing but the servers, as a fleet does), then obeys commands sent over a pipe. Phases start
at a wall-clock instant given by the parent, so all writers start together, and each counts
only what was acknowledged before the phase's deadline.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from collections import Counter
from multiprocessing.connection import Connection
from typing import Any, Callable

from benchmarks.backends import WorkerSpec, make_raw
from benchmarks.workload import encode, entry_id, make_entry


def _wait_until(epoch: float) -> None:
    delay = epoch - time.time()
    if delay > 0:
        time.sleep(delay)


def _many(store: Any, raw: Any, wid: int, *, sessions: list[str], heads: dict[str, str | None],
          start_at: float, duration: float, tag: str) -> dict[str, Any]:
    """Closed loop over many sessions: one ~1 KB entry per append, round robin."""
    heads = dict(heads)
    errors: Counter[str] = Counter()
    lat: list[float] = []
    acked = 0
    i = 0
    _wait_until(start_at)
    deadline = time.perf_counter() + duration
    while True:
        t0 = time.perf_counter()
        if t0 >= deadline:
            break
        sid = sessions[i % len(sessions)]
        eid = entry_id(f"{tag}w{wid}n", i)
        entry = make_entry(eid, heads[sid], i)
        i += 1
        try:
            store.append_session_entries(sid, [entry])
        except Exception as exc:
            errors[type(exc).__name__] += 1
            continue
        t1 = time.perf_counter()
        heads[sid] = eid
        if t1 <= deadline:
            acked += 1
            lat.append(t1 - t0)
    return {"acked": acked, "errors": dict(errors), "heads": heads, "latency": lat}


def _puts(store: Any, raw: Any, wid: int, *, start_at: float, duration: float, tag: str) -> dict[str, Any]:
    """Closed loop of raw conditional PUTs of one ~1 KB segment's bytes, to fresh keys."""
    body = encode([make_entry(entry_id("floor", 0), None, 1)])
    done = 0
    lat: list[float] = []
    n = 0
    _wait_until(start_at)
    deadline = time.perf_counter() + duration
    while True:
        t0 = time.perf_counter()
        if t0 >= deadline:
            break
        raw.put(f"tp/{tag}/w{wid}/{n}", body)
        n += 1
        t1 = time.perf_counter()
        if t1 <= deadline:
            done += 1
            lat.append(t1 - t0)
    return {"done": done, "latency": lat}


def _one(store: Any, raw: Any, wid: int, *, sid: str, start_at: float, duration: float, tag: str) -> dict[str, Any]:
    """Contention: everyone appends to one session, no expected tail; each writer chains its
    own entries, so concurrent appends become sibling branches."""
    errors: Counter[str] = Counter()
    acked_ids: list[str] = []
    late_ids: list[str] = []
    seqs: list[int] = []
    parent: str | None = None
    before = Counter(store.objects.requests)
    i = 0
    lat: list[float] = []
    _wait_until(start_at)
    deadline = time.perf_counter() + duration
    while True:
        t0 = time.perf_counter()
        if t0 >= deadline:
            break
        eid = entry_id(f"{tag}w{wid}n", i)
        entry = make_entry(eid, parent, i)
        i += 1
        try:
            seq = store.append_session_entries(sid, [entry]).seq
        except Exception as exc:
            errors[type(exc).__name__] += 1
            continue
        t1 = time.perf_counter()
        parent = eid
        seqs.append(seq)
        if t1 <= deadline:
            acked_ids.append(eid)
            lat.append(t1 - t0)
        else:
            late_ids.append(eid)
    req = Counter(store.objects.requests)
    req.subtract(before)
    return {
        "acked_ids": acked_ids,
        "late_ids": late_ids,
        "seqs": seqs,
        "attempts": i,
        "errors": dict(errors),
        "requests": {k: v for k, v in req.items() if v},
        "latency": lat,
    }


HANDLERS: dict[str, Callable[..., dict[str, Any]]] = {"many": _many, "puts": _puts, "one": _one}


def worker_main(spec: WorkerSpec, wid: int, conn: Connection) -> None:
    os.environ.update(spec.env)
    store = raw = None
    try:
        from store.core import SessionStore

        store = SessionStore.from_url(spec.objects_url, spec.redis_url, redis_prefix=spec.redis_prefix)
        raw = make_raw(spec.kind, spec.objects_url, spec.floor_prefix)
        conn.send({"ready": wid})
        while True:
            msg = conn.recv()
            cmd, args = msg
            if cmd == "quit":
                break
            try:
                conn.send(HANDLERS[cmd](store, raw, wid, **args))
            except Exception:
                conn.send({"error": traceback.format_exc()})
    except Exception:
        try:
            conn.send({"error": traceback.format_exc()})
        except Exception:
            pass
    finally:
        if store is not None:
            store.close()
        if raw is not None:
            raw.close()


class WriterPool:
    """P writer processes (spawned: nothing inherited but the spec)."""

    def __init__(self, spec: WorkerSpec, count: int) -> None:
        ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        for wid in range(count):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(spec, wid, child), daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        for conn in self.conns:
            msg = conn.recv()
            if "error" in msg:
                self.close()
                raise RuntimeError(f"writer process failed to start:\n{msg['error']}")

    def run(self, cmd: str, per_worker: list[dict[str, Any]], *, lead: float = 0.3) -> list[dict[str, Any]]:
        """Send ``cmd`` to the first len(per_worker) writers, all starting ``lead`` s from now."""
        start_at = time.time() + lead
        users = self.conns[: len(per_worker)]
        for conn, args in zip(users, per_worker):
            conn.send((cmd, {**args, "start_at": start_at}))
        out = [conn.recv() for conn in users]
        for msg in out:
            if "error" in msg:
                raise RuntimeError(f"writer process failed:\n{msg['error']}")
        return out

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(("quit", {}))
            except (OSError, BrokenPipeError):
                pass
        for proc in self.procs:
            proc.join(timeout=15)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        for conn in self.conns:
            conn.close()
