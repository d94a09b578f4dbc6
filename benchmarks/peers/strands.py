"""Strands Agents, side by side: its own session backends and ``SessionStoreSessionManager``.

Backends (``backend`` of each row):

- ``file``: ``FileSessionManager``, Strands' local default (a directory under ``workdir``);
- ``s3``: ``S3SessionManager`` on the same S3 endpoint and bucket, below a prefix of its own
  (only when ``objects_url`` is ``s3://``; credentials from the environment, as the store's);
- ``sessionstore``: ``store.adapters.strands.SessionStoreSessionManager`` on ``objects_url`` /
  ``redis_url`` (``None``: the embedded redis-server, stopped at the end if this run started it).

The same workload on each, through Strands' own API:

- ``append_ms_p50`` / ``append_ms_p99``: ``RepositorySessionManager.append_message`` of one
  message (~200 bytes of text) on an initialised agent, one call at a time (200 calls; quick: 30);
- ``resume_s_1k`` / ``resume_s_10k``: a fresh reader (a new manager over a new store / client,
  nothing cached) builds ``Agent(session_manager=...)``, which reads the session, the agent
  and every message (``RepositorySessionManager.initialize``); the clients themselves are built
  before the clock starts (a worker has them; ``S3SessionManager`` makes its boto3 client
  in its constructor, so that is timed). The sessions are written beforehand through
  the repository, one message per call, as Strands writes them; for the store, ten messages
  per append instead (its 1k session is 100 segments, its 10k one 1000, none compacted): a
  session Strands writes holds one segment per message until the compactor that a deployment
  runs beside the store merges them (every 64 segments by default), so ten per segment and
  no compaction lies between the two, and the set-up stays short;
- ``lost_{2,4}_writers``: 2 / 4 writer processes, each with its own manager and agent on ONE
  session (created, with its agent, beforehand), append N messages each (50; quick: 10) at
  once with ``append_message``; then a fresh reader lists the agent's messages. ``lost_*``:
  acknowledged messages it does not see; ``extra_*``: messages it sees that no writer had
  acknowledged, or sees more than once. Strands' own backends name a message by the
  writer's index (``message_<i>.json``): both writers start at 0 and overwrite each other.

Standalone: ``python -c "from pathlib import Path; from benchmarks.peers.strands import run;
print(run('file:///tmp/x', None, Path('/tmp/w'), quick=True))"``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from benchmarks.peers import embedded_stopper

FRAMEWORK = "strands"
AGENT_ID = "bench-agent"


# --- backends: a picklable spec per backend -----------------------------------------------------


def _specs(objects_url: str, redis_url: str | None, workdir: Path, run_id: str) -> list[dict[str, Any]]:
    specs: list[dict[str, Any]] = [
        {"backend": "file", "dir": str(workdir / f"strands-file-{run_id}")},
    ]
    parsed = urlparse(objects_url)
    if parsed.scheme == "s3":
        query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        prefix = unquote(parsed.path).strip("/")
        specs.append({
            "backend": "s3",
            "bucket": parsed.netloc,
            "prefix": "/".join(p for p in (prefix, f"strands-bench-{run_id}") if p),
            "endpoint_url": query.get("endpoint"),
            "region": query.get("region") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
        })
    specs.append({"backend": "sessionstore", "objects_url": objects_url, "redis_url": redis_url})
    return specs


def _client(spec: dict[str, Any]) -> Any:
    """What a long-lived worker holds: the store, or a boto3 session (None for files)."""
    if spec["backend"] == "sessionstore":
        from store import SessionStore

        return SessionStore.from_url(spec["objects_url"], spec["redis_url"])
    if spec["backend"] == "s3":
        import boto3

        return boto3.Session(region_name=spec["region"])
    return None


def _close_client(client: Any) -> None:
    from store import SessionStore

    if isinstance(client, SessionStore):
        client.close()


def _manager(spec: dict[str, Any], sid: str, client: Any) -> Any:
    if spec["backend"] == "sessionstore":
        from store.adapters.strands import SessionStoreSessionManager

        return SessionStoreSessionManager(sid, store=client)
    if spec["backend"] == "s3":
        from strands.session import S3SessionManager

        return S3SessionManager(sid, bucket=spec["bucket"], prefix=spec["prefix"], boto_session=client,
                                region_name=spec["region"], endpoint_url=spec["endpoint_url"])
    from strands.session import FileSessionManager

    return FileSessionManager(sid, storage_dir=spec["dir"])


def _model() -> Any:
    """A model that is never called (the agents here only store and restore messages)."""
    from strands.models import Model

    class Idle(Model):
        def update_config(self, **model_config: Any) -> None:
            pass

        def get_config(self) -> Any:
            return {}

        async def structured_output(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError
            yield

        async def stream(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the benchmark never calls the model")
            yield

    return Idle()


def _agent(manager: Any) -> Any:
    from strands import Agent
    from strands.agent.conversation_manager import NullConversationManager

    return Agent(agent_id=AGENT_ID, model=_model(), session_manager=manager, callback_handler=None,
                 conversation_manager=NullConversationManager())


def _message(text: str, role: str = "user") -> dict[str, Any]:
    return {"role": role, "content": [{"text": text + " " + "x" * 160}]}


# --- set-up of big sessions (not timed) --------------------------------------------------------


def _fill(spec: dict[str, Any], client: Any, sid: str, n: int) -> None:
    """A session of ``sid`` whose agent has ``n`` messages, written as Strands writes them."""
    from strands.types.session import SessionMessage

    manager = _manager(spec, sid, client)
    _agent(manager)  # creates the session and the agent
    msgs = [SessionMessage.from_message(_message(f"m{i}", "user" if i % 2 == 0 else "assistant"), i)
            for i in range(n)]
    if spec["backend"] == "sessionstore":
        _fill_store_batches(client, sid, msgs, per_append=10)
    elif spec["backend"] == "s3":  # one PUT per message, many at once
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda m: manager.create_message(sid, AGENT_ID, m), msgs))
    else:
        for m in msgs:
            manager.create_message(sid, AGENT_ID, m)


def _fill_store_batches(store: Any, sid: str, msgs: list[Any], *, per_append: int) -> None:
    """The entries ``create_message`` writes, ``per_append`` to a batch."""
    from store.adapters.strands import MESSAGE_TYPE
    from store.clock import iso_now

    parent = store.get_tail(sid).last_entry_id or None
    for start in range(0, len(msgs), per_append):
        batch = []
        for m in msgs[start:start + per_append]:
            eid = uuid.uuid4().hex
            batch.append({"type": "custom", "customType": MESSAGE_TYPE, "id": eid, "parentId": parent,
                          "timestamp": iso_now(),
                          "data": {"agentId": AGENT_ID, "turn": eid, "writerIndex": m.message_id,
                                   "message": m.to_dict()}})
            parent = eid
        store.append_session_entries(sid, batch)


# --- the measurements --------------------------------------------------------------------------


def _percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    rank = max(1, -(-len(s) * q // 100))
    return s[int(min(rank, len(s))) - 1]


def _append_rows(spec: dict[str, Any], client: Any, run_id: str, calls: int) -> list[dict[str, Any]]:
    sid = f"append-{run_id}"
    manager = _manager(spec, sid, client)
    agent = _agent(manager)
    for i in range(3):  # warm-up
        manager.append_message(_message(f"warm {i}"), agent)
    times = []
    for i in range(calls):
        msg = _message(f"message {i}", "user" if i % 2 == 0 else "assistant")
        started = time.perf_counter()
        manager.append_message(msg, agent)
        times.append(time.perf_counter() - started)
    _cleanup(spec, manager, sid)
    return [
        _row(spec, "append_ms_p50", _percentile(times, 50) * 1000, "ms"),
        _row(spec, "append_ms_p99", _percentile(times, 99) * 1000, "ms"),
    ]


def _resume_rows(spec: dict[str, Any], client: Any, run_id: str, sizes: list[int], reps: int) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        sid = f"resume{n}-{run_id}"
        _fill(spec, client, sid, n)
        times = []
        for _ in range(reps):
            fresh = _client(spec)  # a new store / boto3 session: nothing cached
            try:
                started = time.perf_counter()
                manager = _manager(spec, sid, fresh)
                agent = _agent(manager)
                times.append(time.perf_counter() - started)
                if len(agent.messages) != n:
                    raise RuntimeError(f"{spec['backend']}: resumed {len(agent.messages)} of {n} messages")
            finally:
                _close_client(fresh)
        cleaner = _manager(spec, sid, client)
        _cleanup(spec, cleaner, sid)
        rows.append(_row(spec, f"resume_s_{n // 1000}k", sorted(times)[len(times) // 2], "s"))
    return rows


def _writer(spec: dict[str, Any], sid: str, wid: int, n: int, barrier: Any) -> list[str]:
    """One writer process: N messages on the shared session; returns those acknowledged."""
    client = _client(spec)
    try:
        manager = _manager(spec, sid, client)
        agent = _agent(manager)
        barrier.wait(timeout=300)
        acked = []
        for i in range(n):
            text = f"w{wid}-{i}"
            manager.append_message({"role": "user", "content": [{"text": text}]}, agent)
            acked.append(text)
        return acked
    finally:
        _close_client(client)


def _warm(_: int) -> int:
    import strands  # noqa: F401  (the import is what a worker pays once)

    import store.adapters.strands  # noqa: F401

    time.sleep(0.3)  # so that each warm-up task lands on its own worker
    return os.getpid()


def _lost_rows(spec: dict[str, Any], client: Any, run_id: str, pool: ProcessPoolExecutor, sync: Any,
               writers: int, n: int) -> list[dict[str, Any]]:
    sid = f"writers{writers}-{run_id}"
    setup = _manager(spec, sid, client)
    _agent(setup)  # the session and its agent exist before the writers start
    barrier = sync.Barrier(writers)
    futures = [pool.submit(_writer, spec, sid, w, n, barrier) for w in range(writers)]
    acked = [text for f in futures for text in f.result()]
    fresh = _client(spec)
    try:
        reader = _manager(spec, sid, fresh)
        seen = [" ".join(b.get("text", "") for b in m.message["content"])
                for m in reader.list_messages(sid, AGENT_ID)]
    finally:
        _close_client(fresh)
    want = set(acked)
    lost = len(want - set(seen))
    extra = len(seen) - len(want & set(seen))  # never acknowledged, or seen twice
    _cleanup(spec, setup, sid)
    return [
        _row(spec, f"lost_{writers}_writers", float(lost), "messages"),
        _row(spec, f"extra_{writers}_writers", float(extra), "messages"),
    ]


def _cleanup(spec: dict[str, Any], manager: Any, sid: str) -> None:
    """Delete a session from S3 or the store (the files stay in ``workdir``, the caller's)."""
    from strands.types.exceptions import SessionException

    from store.errors import SessionStoreError

    if spec["backend"] in ("s3", "sessionstore"):
        try:
            manager.delete_session(sid)
        except (SessionException, SessionStoreError) as exc:  # best effort: numbers, not data
            print(f"strands peer: session {sid} of {spec['backend']} not deleted: {exc}", file=sys.stderr)


def _row(spec: dict[str, Any], metric: str, value: float, unit: str) -> dict[str, Any]:
    return {"framework": FRAMEWORK, "backend": spec["backend"], "metric": metric, "value": float(value), "unit": unit}


# --- the entry point ---------------------------------------------------------------------------


def run(objects_url: str, redis_url: str | None, workdir: Path, *, quick: bool) -> list[dict[str, Any]]:
    """Rows ``{"framework", "backend", "metric", "value", "unit"}`` for every backend."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:10]
    calls = 30 if quick else 200
    sizes = [1000] if quick else [1000, 10_000]
    per_writer = 10 if quick else 50
    reps = 1 if quick else 3
    stop_embedded = embedded_stopper(objects_url, redis_url)
    specs = _specs(objects_url, redis_url, workdir, run_id)
    rows: list[dict[str, Any]] = []
    try:
        # Latency first, with nothing else running on the machine ...
        for spec in specs:
            client = _client(spec)
            try:
                rows += _append_rows(spec, client, run_id, calls)
                rows += _resume_rows(spec, client, run_id, sizes, reps)
            finally:
                _close_client(client)
        # ... then the writer processes (started and warmed once for every backend).
        ctx = mp.get_context("spawn")
        with ProcessPoolExecutor(max_workers=4, mp_context=ctx) as pool, ctx.Manager() as sync:
            for future in [pool.submit(_warm, i) for i in range(4)]:
                future.result()
            for spec in specs:
                client = _client(spec)
                try:
                    for writers in (2, 4):
                        rows += _lost_rows(spec, client, run_id, pool, sync, writers, per_writer)
                finally:
                    _close_client(client)
    finally:
        stop_embedded()
    return rows


if __name__ == "__main__":  # pragma: no cover
    import json

    url = sys.argv[1] if len(sys.argv) > 1 else Path("/tmp/strands-bench/objects").absolute().as_uri()
    print(json.dumps(run(url, None, Path("/tmp/strands-bench/work"), quick=True), indent=1))


__all__ = ["run"]
