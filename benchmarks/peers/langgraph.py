"""LangGraph, side by side: checkpoint savers from PyPI and ``SessionStoreSaver``.

Backends (``backend`` of each row):

- ``sqlite``: ``SqliteSaver`` (``langgraph-checkpoint-sqlite``), LangGraph's own saver for one
  machine, on a file under ``workdir``;
- ``s3``: ``ObjectStorageSaver`` (``langgraph-checkpoint-objectstorage`` on ``s3fs``, the
  ``bench`` extra: one object per checkpoint and per write, the latest found by listing the
  thread) on the same S3 endpoint and bucket as the store, below a prefix of its own (only
  when ``objects_url`` is ``s3://`` and the package is installed; otherwise every one of its
  figures is a row with no value and a ``note`` saying why: never a number).
  ``langgraph-checkpoint-s3`` 0.1.3 is not used: its ``put`` calls ``serde.dumps``, which
  ``langgraph-checkpoint`` 4 no longer has;
- ``sessionstore``: ``store.adapters.langgraph.SessionStoreSaver`` on ``objects_url`` /
  ``redis_url`` (its own Redis prefix and namespace); ``sessionstore+compacted``: the same
  thread after one compaction of its store session (the shape a thread has where the
  compactor runs).

The workload goes through ``BaseCheckpointSaver``'s API, with checkpoints shaped as
LangGraph's loop makes them (each a ``loop`` child of the one before; ``new_versions`` names
the channels its step changed, versions from the saver's own ``get_next_version``). A
"steady" thread has three channels: ``context`` (a 4,000-byte document written by the first
checkpoint and never again), ``step`` (an int) and ``last`` (a 200-byte message), the last
two changed by every checkpoint.

- ``put_ms_p50`` / ``put_ms_p99``: one ``put`` at a time on a steady thread (200; quick: 30);
  ``put_requests`` (object-store requests per ``put``, as the store counts them / as boto3
  sends them) and ``put_redis_calls`` (the store only);
- ``get_tuple_ms_cold_<n>``: ``get_tuple`` of the latest checkpoint of a steady thread of n
  checkpoints (1k, 10k; quick: 1k) by a saver that has never read it (a new connection /
  client / store, built before the clock starts); the median of 3 (quick: 1);
  ``get_tuple_requests_cold_<n>``: its requests; ``get_tuple_ms_warm_<n>``: the same read by
  the saver that wrote the thread (the median of 5). The threads are written with ``put``,
  one checkpoint per call, as LangGraph writes them (``s3``: 32 calls at a time, each its
  own object; the others one at a time), so the store's thread is n segments, uncompacted;
- ``list_100_ms_cold_<n>`` / ``list_100_requests_cold_<n>``: ``list(thread, limit=100)`` by a
  fresh saver, all 100 tuples read;
- ``copy_thread_ms_<n>`` / ``copy_thread_requests_<n>`` (the largest thread): ``copy_thread``
  by a fresh saver; a saver without it (``NotImplementedError``, found by calling it) has a
  row with no value;
- ``bytes_per_checkpoint``: bytes the backend stores for the 1k thread (SQLite: the
  checkpoint and metadata blobs of its rows; S3: the sizes of its objects; the store: the
  objects of its session, header and manifest included), divided by its checkpoints;
  ``bytes_per_checkpoint_growing_list``: the same for a thread whose one channel is a list
  that every checkpoint extends by a 200-byte message (200 checkpoints; quick: 50), as a
  chat's ``messages`` channel is;
- the race (``sqlite`` and ``sessionstore``): two processes continue one thread from one
  checkpoint at the same moment, 20 rounds (quick: 5), through a real ``StateGraph`` (two
  plain nodes, no model): in each round both read the thread's head, wait for each other,
  and ``invoke`` from it. ``race_forked_rounds``: rounds whose checkpoint got two
  ``input``/``loop`` children (a silent fork); ``race_lost_rounds``: rounds in which a run
  that returned normally is missing from the thread's state at its head afterwards;
  ``race_refused_rounds``: rounds in which one writer got ``CheckpointForkError`` (the typed
  error); ``race_error_rounds``: rounds with any other exception (e.g. SQLite's "database is
  locked"); ``race_rounds``: the rounds run.

Standalone: ``python -c "from pathlib import Path; from benchmarks.peers.langgraph import run;
print(run('file:///tmp/x', None, Path('/tmp/w'), quick=True))"``.
"""

from __future__ import annotations

import multiprocessing as mp
import operator
import os
import sqlite3
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypedDict
from urllib.parse import parse_qs, unquote, urlparse

from benchmarks.peers import embedded_stopper

FRAMEWORK = "langgraph"
OURS = "sessionstore"
S3_PACKAGE = "langgraph-checkpoint-objectstorage[s3]"

_CONTEXT = ("A reference document the graph reads at every step. " * 80)[:4000]
_MESSAGE = ("The quick brown fox jumps over the lazy dog. " * 5)[:200]


# --- the savers ----------------------------------------------------------------------------------


def _specs(objects_url: str, redis_url: str | None, workdir: Path, run_id: str) -> list[dict[str, Any]]:
    sqlite = {"backend": "sqlite", "path": str(workdir / f"langgraph-{run_id}.sqlite")}
    ours = {"backend": OURS, "objects_url": objects_url, "redis_url": redis_url,
            "redis_prefix": f"peers-lg-{run_id}", "namespace": f"bench{run_id}"}
    parsed = urlparse(objects_url)
    s3: dict[str, Any] = {"backend": "s3"}
    if parsed.scheme != "s3":
        s3["unavailable"] = "not available (needs an s3:// store)"
        return [sqlite, s3, ours]
    try:
        import langgraph_checkpoint_objectstorage  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError:
        s3["unavailable"] = f"not available ({S3_PACKAGE} not installed)"
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    prefix = unquote(parsed.path).strip("/")
    s3.update({
        "root": "/".join(p for p in (parsed.netloc, prefix, f"langgraph-bench-{run_id}") if p),
        "endpoint_url": query.get("endpoint"),
        "region": query.get("region") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
    })
    return [sqlite, s3, ours]


class _Saver:
    """One saver of one backend, opened anew (nothing cached), with what it sends counted."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.backend = spec["backend"]
        self._requests: Callable[[], int] = lambda: 0
        self._redis: Callable[[], int] = lambda: 0
        if self.backend == "sqlite":
            from langgraph.checkpoint.sqlite import SqliteSaver

            self.conn = sqlite3.connect(spec["path"], check_same_thread=False)
            self.saver: Any = SqliteSaver(self.conn)
        elif self.backend == "s3":
            import s3fs
            from fsspec.asyn import sync
            from langgraph_checkpoint_objectstorage import ObjectStorageSaver

            self.fs = s3fs.S3FileSystem(endpoint_url=spec["endpoint_url"], skip_instance_cache=True,
                                        client_kwargs={"region_name": spec["region"]})
            client = sync(self.fs.loop, self.fs.set_session)
            sent = [0]

            def count(**_: Any) -> None:
                sent[0] += 1

            client.meta.events.register("before-send.s3", count)  # one per HTTP request
            self._requests = lambda: sent[0]
            self.saver = ObjectStorageSaver(self.fs, spec["root"])
        else:
            from benchmarks.backends import RedisCallCounter
            from store import SessionStore
            from store.adapters.langgraph import SessionStoreSaver

            self.store = SessionStore.from_url(spec["objects_url"], spec["redis_url"],
                                               redis_prefix=spec["redis_prefix"])
            self.saver = SessionStoreSaver(self.store, namespace=spec["namespace"], owns_store=True)
            calls = RedisCallCounter(self.store.coord.client)
            self._requests = lambda: sum(self.store.objects.requests.values())
            self._redis = lambda: sum(calls.snapshot().values())

    def counts(self) -> tuple[int, int]:
        """(object-store requests, Redis calls) so far."""
        return self._requests(), self._redis()

    def stored_bytes(self, thread_id: str) -> int:
        if self.backend == "sqlite":
            row = self.conn.execute(
                "SELECT coalesce(sum(length(checkpoint) + length(metadata)), 0) FROM checkpoints WHERE thread_id = ?",
                (thread_id,)).fetchone()
            writes = self.conn.execute("SELECT coalesce(sum(length(value)), 0) FROM writes WHERE thread_id = ?",
                                       (thread_id,)).fetchone()
            return int(row[0]) + int(writes[0])
        if self.backend == "s3":
            found = self.fs.find(f"{self.spec['root']}/{thread_id}/", detail=True)
            return sum(int(info["size"]) for info in found.values())
        sid = self.saver.thread_session_id(thread_id)
        return sum(info.size for info in self.store.objects.list(self.store.layout.session_prefix(sid)))

    def close(self) -> None:
        if self.backend == "sqlite":
            self.conn.close()
        elif self.backend == "s3":
            self.fs.clear_instance_cache()
        else:
            self.saver.close()


# --- checkpoints as LangGraph's loop makes them ------------------------------------------------


class _Thread:
    """Writes one thread's checkpoints, each the ``loop`` child of the one before."""

    def __init__(self, saver: Any, thread_id: str) -> None:
        self.saver = saver
        self.thread_id = thread_id
        self.prev: dict[str, Any] | None = None
        self.config: dict[str, Any] = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        self.step = -1

    def next(self, changed: dict[str, Any]) -> tuple[dict[str, Any], Any, dict[str, Any], dict[str, Any]]:
        """The arguments of the ``put`` of the next checkpoint (and the thread moves on to it)."""
        from langgraph.checkpoint.base import copy_checkpoint, empty_checkpoint
        from langgraph.checkpoint.base.id import uuid6

        checkpoint = empty_checkpoint() if self.prev is None else copy_checkpoint(self.prev)  # type: ignore[arg-type]
        checkpoint["id"] = str(uuid6(clock_seq=self.step))
        checkpoint["ts"] = datetime.now(UTC).isoformat()
        new_versions = {}
        for channel, value in changed.items():
            version = self.saver.get_next_version(checkpoint["channel_versions"].get(channel), None)
            checkpoint["channel_versions"][channel] = new_versions[channel] = version
            checkpoint["channel_values"][channel] = value
        checkpoint["updated_channels"] = sorted(changed)
        metadata = {"source": "input" if self.step == -1 else "loop", "step": self.step, "parents": {}}
        config = self.config
        self.prev = checkpoint  # type: ignore[assignment]
        self.config = {"configurable": {"thread_id": self.thread_id, "checkpoint_ns": "",
                                        "checkpoint_id": checkpoint["id"]}}
        self.step += 1
        return config, checkpoint, metadata, new_versions

    def put(self, changed: dict[str, Any]) -> None:
        self.saver.put(*self.next(changed))

    def steady(self, i: int) -> dict[str, Any]:
        """The channels of a steady thread's checkpoint ``i`` changes."""
        if i == 0:
            return {"context": _CONTEXT, "step": 0, "last": f"message 0 {_MESSAGE}"}
        return {"step": i, "last": f"message {i} {_MESSAGE}"}


def _fill(side: _Saver, thread_id: str, n: int) -> _Thread:
    """A steady thread of n checkpoints, written with ``put`` (not timed)."""
    thread = _Thread(side.saver, thread_id)
    if side.backend == "s3":  # each checkpoint its own object: many at once, as a loader would
        calls = [thread.next(thread.steady(i)) for i in range(n)]
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda args: side.saver.put(*args), calls))
    else:
        for i in range(n):
            thread.put(thread.steady(i))
    return thread


# --- the measurements --------------------------------------------------------------------------


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    rank = max(1, min(len(s), int(-(-q * len(s) // 100))))
    return s[rank - 1]


def _label(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def _row(backend: str, metric: str, value: float | None, unit: str, note: str = "") -> dict[str, Any]:
    row: dict[str, Any] = {"framework": FRAMEWORK, "backend": backend, "metric": metric,
                           "value": None if value is None else float(value), "unit": unit}
    if note:
        row["note"] = note
    return row


def _put_rows(side: _Saver, run_id: str, calls: int) -> list[dict[str, Any]]:
    thread = _Thread(side.saver, f"put-{run_id}")
    for i in range(3):  # warm-up (and the thread's first checkpoint)
        thread.put(thread.steady(i))
    times = []
    before = side.counts()
    for i in range(3, calls + 3):
        args = thread.next(thread.steady(i))
        started = time.perf_counter()
        side.saver.put(*args)
        times.append((time.perf_counter() - started) * 1000)
    after = side.counts()
    side.saver.delete_thread(thread.thread_id)
    rows = [_row(side.backend, "put_ms_p50", _pct(times, 50), "ms"),
            _row(side.backend, "put_ms_p99", _pct(times, 99), "ms")]
    if side.backend != "sqlite":
        rows.append(_row(side.backend, "put_requests", (after[0] - before[0]) / calls, "requests"))
    if side.backend == OURS:
        rows.append(_row(side.backend, "put_redis_calls", (after[1] - before[1]) / calls, "calls"))
    return rows


def _latest(saver: Any, thread_id: str) -> Any:
    return saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})


def _cold(spec: dict[str, Any], reps: int, work: Callable[[Any], Any]) -> tuple[float, int, Any]:
    """Median seconds of ``work(saver)`` by a saver opened before the clock starts, its
    requests (object store) and the last result."""
    times, requests, result = [], 0, None
    for _ in range(reps):
        fresh = _Saver(spec)
        try:
            fresh.saver.get_next_version(None, None)  # built and ready: nothing of the thread read
            before = fresh.counts()[0]
            started = time.perf_counter()
            result = work(fresh.saver)
            times.append(time.perf_counter() - started)
            requests = fresh.counts()[0] - before
        finally:
            fresh.close()
    return statistics.median(times), requests, result


def _read_rows(spec: dict[str, Any], writer: _Saver, thread: _Thread, n: int, reps: int,
               backend: str) -> list[dict[str, Any]]:
    label, tid = _label(n), thread.thread_id
    want = thread.prev["id"] if thread.prev else None
    seconds, requests, got = _cold(spec, reps, lambda saver: _latest(saver, tid))
    if got is None or got.checkpoint["id"] != want or got.checkpoint["channel_values"].get("context") != _CONTEXT:
        raise RuntimeError(f"{backend}: get_tuple did not return the thread's latest checkpoint")
    rows = [_row(backend, f"get_tuple_ms_cold_{label}", seconds * 1000, "ms")]
    if backend != "sqlite":
        rows.append(_row(backend, f"get_tuple_requests_cold_{label}", requests, "requests"))
    warm = []
    for _ in range(5):
        started = time.perf_counter()
        _latest(writer.saver, tid)
        warm.append(time.perf_counter() - started)
    rows.append(_row(backend, f"get_tuple_ms_warm_{label}", statistics.median(warm) * 1000, "ms"))
    seconds, requests, listed = _cold(spec, reps, lambda saver: list(saver.list(
        {"configurable": {"thread_id": tid}}, limit=100)))
    if len(listed) != min(100, n) or listed[0].checkpoint["id"] != want:
        raise RuntimeError(f"{backend}: list(limit=100) returned {len(listed)} tuples, not the newest first")
    rows.append(_row(backend, f"list_100_ms_cold_{label}", seconds * 1000, "ms"))
    if backend != "sqlite":
        rows.append(_row(backend, f"list_100_requests_cold_{label}", requests, "requests"))
    return rows


def _copy_rows(spec: dict[str, Any], thread: _Thread, n: int, backend: str, copies: list[str]) -> list[dict[str, Any]]:
    label, target = _label(n), f"{thread.thread_id}-copy{len(copies)}"
    copies.append(target)
    try:
        seconds, requests, _ = _cold(spec, 1, lambda saver: saver.copy_thread(thread.thread_id, target))
    except NotImplementedError:
        name = {"sqlite": "SqliteSaver", "s3": "ObjectStorageSaver"}.get(backend, backend)
        return [_row(backend, f"copy_thread_ms_{label}", None, "ms", f"not available ({name} has no copy_thread)")]
    _, _, copied = _cold(spec, 1, lambda saver: _latest(saver, target))
    if copied is None or thread.prev is None or copied.checkpoint["id"] != thread.prev["id"]:
        raise RuntimeError(f"{backend}: the copy's latest checkpoint is not the source's")
    return [_row(backend, f"copy_thread_ms_{label}", seconds * 1000, "ms"),
            _row(backend, f"copy_thread_requests_{label}", requests, "requests")]


def _bytes_rows(side: _Saver, run_id: str, steady: _Thread, steady_n: int, list_n: int) -> list[dict[str, Any]]:
    rows = [_row(side.backend, "bytes_per_checkpoint", side.stored_bytes(steady.thread_id) / steady_n, "bytes")]
    thread = _Thread(side.saver, f"list-{run_id}")
    messages: list[str] = []
    for i in range(list_n):
        messages = [*messages, f"message {i} {_MESSAGE}"]
        thread.put({"messages": messages})
    per = side.stored_bytes(thread.thread_id) / list_n
    side.saver.delete_thread(thread.thread_id)
    rows.append(_row(side.backend, "bytes_per_checkpoint_growing_list", per, "bytes"))
    return rows


def _unavailable(spec: dict[str, Any], sizes: list[int]) -> list[dict[str, Any]]:
    note = spec["unavailable"]
    metrics = ["put_ms_p50", "put_ms_p99", "put_requests", "bytes_per_checkpoint", "bytes_per_checkpoint_growing_list",
               f"copy_thread_ms_{_label(sizes[-1])}"]
    for n in sizes:
        metrics += [f"get_tuple_ms_cold_{_label(n)}", f"get_tuple_ms_warm_{_label(n)}", f"list_100_ms_cold_{_label(n)}"]
    return [_row(spec["backend"], metric, None, "", note) for metric in metrics]


def _saver_rows(spec: dict[str, Any], run_id: str, *, calls: int, sizes: list[int], reps: int,
                list_n: int) -> list[dict[str, Any]]:
    if "unavailable" in spec:
        return _unavailable(spec, sizes)
    side = _Saver(spec)
    backend = spec["backend"]
    threads: list[str] = []
    copies: list[str] = []
    try:
        rows = _put_rows(side, run_id, calls)
        for n in sizes:
            thread = _fill(side, f"steady{n}-{run_id}", n)
            threads.append(thread.thread_id)
            rows += _read_rows(spec, side, thread, n, reps, backend)
            if n == sizes[0]:
                rows += _bytes_rows(side, run_id, thread, n, list_n)
            if n == sizes[-1]:
                rows += _copy_rows(spec, thread, n, backend, copies)
                if backend == OURS:
                    from compactor import Compactor

                    Compactor(side.store).compact_session(side.saver.thread_session_id(thread.thread_id))
                    compacted = f"{OURS}+compacted"
                    rows += [r for r in _read_rows(spec, side, thread, n, reps, compacted) if "warm" not in r["metric"]]
                    rows += _copy_rows(spec, thread, n, compacted, copies)
        return rows
    finally:
        for tid in threads + copies:
            try:
                side.saver.delete_thread(tid)
            except NotImplementedError:
                pass
            except Exception as exc:  # best effort: numbers, not data  # noqa: BLE001
                print(f"langgraph peer: thread {tid} of {backend} not deleted: {exc}", file=sys.stderr)
        side.close()


# --- the race: two processes continuing one thread from one checkpoint ---------------------------


class _State(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(saver: Any) -> Any:
    from langgraph.graph import END, START, StateGraph

    graph = StateGraph(_State)
    graph.add_node("a", lambda state: {"log": [state["log"][-1] + ":a"]})
    graph.add_node("b", lambda state: {"log": [state["log"][-1] + ":b"]})
    graph.add_edge(START, "a")
    graph.add_edge("a", "b")
    graph.add_edge("b", END)
    return graph.compile(checkpointer=saver)


def _racer(spec: dict[str, Any], thread_id: str, me: int, rounds: int, barrier: Any, conn: Any) -> None:
    """One process: each round, read the head, wait for the other, continue from it."""
    from store.adapters.langgraph import CheckpointForkError

    outcomes: list[tuple[str, str, str]] = []
    side = None
    try:
        side = _Saver(spec)
        graph = _graph(side.saver)
        thread = {"configurable": {"thread_id": thread_id}}
        for r in range(rounds):
            barrier.wait(120)
            head = graph.get_state(thread).config  # both read the same head...
            parent = head["configurable"]["checkpoint_id"]
            barrier.wait(120)  # ...and continue from it at the same moment
            try:
                graph.invoke({"log": [f"p{me}r{r}"]}, head)
                outcomes.append(("ok", parent, f"p{me}r{r}"))
            except CheckpointForkError:
                outcomes.append(("refused", parent, ""))
            except Exception as exc:  # noqa: BLE001 - counted: e.g. "database is locked"
                outcomes.append(("error", parent, f"{type(exc).__name__}: {exc}"))
    finally:
        if side is not None:
            side.close()
        conn.send(outcomes)  # what it has, also when it fails (the parent checks the count)
        conn.close()


def _race_rows(spec: dict[str, Any], run_id: str, rounds: int) -> list[dict[str, Any]]:
    backend, thread_id = spec["backend"], f"race-{run_id}"
    thread = {"configurable": {"thread_id": thread_id}}
    side = _Saver(spec)
    try:
        _graph(side.saver).invoke({"log": ["start"]}, thread)
    finally:
        side.close()
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
    procs = [ctx.Process(target=_racer, args=(spec, thread_id, i, rounds, barrier, pipes[i][1])) for i in range(2)]
    for p in procs:
        p.start()
    results = []
    for receive, _ in pipes:
        if not receive.poll(60 + 30 * rounds):
            for p in procs:
                p.kill()
            raise RuntimeError(f"{backend}: a racing process did not report")
        results.append(receive.recv())
    for p in procs:
        p.join(120)
    if any(p.exitcode != 0 for p in procs) or any(len(r) != rounds for r in results):
        raise RuntimeError(f"{backend}: a racing process failed (exit codes {[p.exitcode for p in procs]})")
    side = _Saver(spec)
    try:
        head = _graph(side.saver).get_state(thread).values["log"]
        children: dict[str, set[str]] = {}
        for tup in side.saver.list(thread):
            if tup.parent_config and tup.metadata.get("source") in ("input", "loop"):
                children.setdefault(tup.parent_config["configurable"]["checkpoint_id"], set()).add(
                    tup.config["configurable"]["checkpoint_id"])
        side.saver.delete_thread(thread_id)
    finally:
        side.close()
    forked = lost = refused = errors = 0
    for r in range(rounds):
        outcomes = [results[0][r], results[1][r]]
        forked += any(len(children.get(parent, ())) > 1 for _, parent, _ in outcomes)
        lost += any(kind == "ok" and word not in head for kind, _, word in outcomes)
        refused += any(kind == "refused" for kind, _, _ in outcomes)
        errors += any(kind == "error" for kind, _, _ in outcomes)
    return [
        _row(backend, "race_rounds", rounds, "rounds"),
        _row(backend, "race_forked_rounds", forked, "rounds"),
        _row(backend, "race_lost_rounds", lost, "rounds"),
        _row(backend, "race_refused_rounds", refused, "rounds"),
        _row(backend, "race_error_rounds", errors, "rounds"),
    ]


# --- the entry point ---------------------------------------------------------------------------


def run(objects_url: str, redis_url: str | None, workdir: Path, *, quick: bool,
        sizes: list[int] | None = None, rounds: int | None = None) -> list[dict[str, Any]]:
    """Rows ``{"framework", "backend", "metric", "value", "unit"[, "note"]}`` for every saver
    (``value`` None, with a ``note``, for what a saver cannot be measured on). ``sizes`` and
    ``rounds`` override the profile's thread lengths and race rounds."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:10]
    calls = 30 if quick else 200
    sizes = sorted(sizes or ([1000] if quick else [1000, 10_000]))
    rounds = rounds or (5 if quick else 20)
    reps = 1 if quick else 3
    list_n = 50 if quick else 200
    stop_embedded = embedded_stopper(objects_url, redis_url)
    specs = _specs(objects_url, redis_url, workdir, run_id)
    rows: list[dict[str, Any]] = []
    try:
        for spec in specs:
            rows += _saver_rows(spec, run_id, calls=calls, sizes=sizes, reps=reps, list_n=list_n)
        for spec in specs:
            if spec["backend"] in ("sqlite", OURS):
                rows += _race_rows(spec, run_id, rounds)
    finally:
        stop_embedded()
    return rows


def _iter_rows(rows: list[dict[str, Any]]) -> Iterator[str]:  # pragma: no cover - standalone output
    for row in rows:
        value = "-" if row["value"] is None else f"{row['value']:.4g}"
        yield f"{row['backend']:24} {row['metric']:36} {value} {row['unit']} {row.get('note', '')}"


if __name__ == "__main__":  # pragma: no cover
    url = sys.argv[1] if len(sys.argv) > 1 else Path("/tmp/langgraph-bench/objects").absolute().as_uri()
    print("\n".join(_iter_rows(run(url, None, Path("/tmp/langgraph-bench/work"), quick=True, sizes=[100], rounds=3))))


__all__ = ["run"]
