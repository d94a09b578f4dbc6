"""Claude Agent SDK: the store's ``ClaudeSessionStore`` against the SDK's reference S3 adapter's
shape, on the same bucket.

The SDK ships no durable ``SessionStore`` of its own (its default is the CLI's local JSONL
files, mirrored to nothing); the reference it documents for S3
(``examples/session_stores/s3_session_store.py``) writes one part object per ``append``,
``<project>/<session>/part-<epoch ms, 13 digits>-<6 hex>.jsonl`` (named by the writer's clock),
and loads with a LIST of the session's prefix plus one GET per part (16 at a time), with no
dedup. That shape is implemented here directly with the store's own boto3 client (same client
configuration, so the comparison measures the layouts, not the clients). On a ``file://`` run
the same shape is one file per append in a directory under ``workdir`` (LIST = listdir).

Workload: a transcript written in 400 and in 4,000 flushes (quick: 400 only), each flush one
``append`` of a user and an assistant entry (Claude Code's shape, ~0.6 kB); then a cold load
(a fresh store instance, nothing cached), its time and its requests (GET + LIST + HEAD); for
the store also after one compaction (``compactor``). ``append_ms_p50``/``p99`` come from the
400-flush transcript, as do ``append_object_writes`` and ``append_requests`` (per append after
the first, as the store counts what it sends) and ``list_summaries_first_ms_400`` (the first
``list_session_summaries`` of the writer process: the summary is folded from the transcript
when listed, not written by ``append``). ``append_ms_p50_interleaved_adapter`` and
``_store_call``: what the adapter adds to the store call it maps to, 200 rounds of an ``append``
and of ``AsyncSessionStore.append_session_entries`` with the same (wrapped) entries, in one
loop.

Standalone: ``python -c "from pathlib import Path; from benchmarks.peers.claude_agent_sdk import
run; print(run('file:///tmp/ccb', None, Path('/tmp/ccw'), quick=True))"``.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

FRAMEWORK = "claude-agent-sdk"
OURS = "sessionstore"
_LOAD_CONCURRENCY = 16


def _flush(session_id: str, i: int, parent: str | None) -> list[dict[str, Any]]:
    u, a = str(uuid.uuid4()), str(uuid.uuid4())
    common = {"isSidechain": False, "userType": "external", "cwd": "/work/bench",
              "sessionId": session_id, "version": "2.1.30", "gitBranch": "main"}
    return [
        {**common, "parentUuid": parent, "type": "user", "uuid": u,
         "timestamp": "2026-01-10T09:00:00.000Z",
         "message": {"role": "user", "content": f"step {i}: run the tests again and tell me what failed"}},
        {**common, "parentUuid": u, "type": "assistant", "uuid": a,
         "timestamp": "2026-01-10T09:00:01.000Z", "requestId": f"req_{i}",
         "message": {"id": f"msg_{i}", "type": "message", "role": "assistant",
                     "model": "claude-sonnet-4-5-20250929", "stop_reason": "end_turn",
                     "content": [{"type": "text", "text": f"Step {i}: 214 passed, 1 failed "
                                  "(test_expiry: the TTL check races a real sleep)."}],
                     "usage": {"input_tokens": 1800 + i, "output_tokens": 40}}},
    ]


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    k = max(1, -(-len(s) * q // 100))
    return s[int(min(k, len(s))) - 1]


def _row(backend: str, metric: str, value: float, unit: str) -> dict[str, Any]:
    return {"framework": FRAMEWORK, "backend": backend, "metric": metric, "value": float(value), "unit": unit}


# --- the SDK reference adapter's shape -------------------------------------------------------


class _Parts:
    """One part object per append, named by the writer's clock; load = LIST + GET per part."""

    def __init__(self, objects_url: str, workdir: Path) -> None:
        self.requests = 0
        self._last_ms = 0
        self._objects: Any = None
        if objects_url.startswith("s3://"):
            from store.backends.objects import object_store_from_url, s3_prefix_of

            self._objects = object_store_from_url(objects_url)
            self.client = self._objects.client  # type: ignore[attr-defined]
            self.bucket = self._objects.bucket  # type: ignore[attr-defined]
            self.prefix = s3_prefix_of(objects_url).rstrip("/") + "/cc-reference/"
            self.prefix = self.prefix.lstrip("/")
            self.backend = "sdk-s3-reference"
            self.dir: Path | None = None
        else:
            self.dir = workdir / "cc-reference"
            self.backend = "sdk-file-reference"

    def close(self) -> None:
        if self._objects is not None:
            self._objects.close()

    def _name(self) -> str:
        ms = max(int(time.time() * 1000), self._last_ms + 1)
        self._last_ms = ms
        return f"part-{ms:013d}-{secrets.token_hex(3)}.jsonl"

    def put(self, session: str, entries: list[dict[str, Any]]) -> None:
        body = ("\n".join(json.dumps(e, separators=(",", ":")) for e in entries) + "\n").encode()
        if self.dir is None:
            self.client.put_object(Bucket=self.bucket, Key=f"{self.prefix}proj/{session}/{self._name()}",
                                   Body=body, ContentType="application/x-ndjson")
        else:
            d = self.dir / "proj" / session
            d.mkdir(parents=True, exist_ok=True)
            (d / self._name()).write_bytes(body)

    def load(self, session: str) -> list[Any]:
        self.requests = 0
        if self.dir is None:
            prefix = f"{self.prefix}proj/{session}/"
            keys: list[str] = []
            token = None
            while True:
                kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "Delimiter": "/"}
                if token:
                    kwargs["ContinuationToken"] = token
                res = self.client.list_objects_v2(**kwargs)
                self.requests += 1
                keys += [o["Key"] for o in res.get("Contents") or []]
                token = res.get("NextContinuationToken")
                if not token:
                    break
            keys.sort()

            def get(k: str) -> bytes:
                return self.client.get_object(Bucket=self.bucket, Key=k)["Body"].read()  # type: ignore[no-any-return]
        else:
            d = self.dir / "proj" / session
            keys = sorted(str(p) for p in d.iterdir())
            self.requests += 1

            def get(k: str) -> bytes:
                return Path(k).read_bytes()

        with ThreadPoolExecutor(_LOAD_CONCURRENCY) as pool:
            bodies = list(pool.map(get, keys))
        self.requests += len(keys)
        return [json.loads(line) for body in bodies for line in body.decode().splitlines() if line.strip()]


# --- the run ---------------------------------------------------------------------------------


async def _adapter_side(objects_url: str, redis_url: str | None, sizes: list[int]) -> list[dict[str, Any]]:
    from compactor import Compactor, CompactorOptions
    from store.adapters.claude_agent_sdk import ClaudeSessionStore
    from store.aio import AsyncSessionStore
    from store.core import SessionStore

    prefix = f"ccbench-{uuid.uuid4().hex[:8]}"
    options = {"redis_prefix": prefix}
    rows: list[dict[str, Any]] = []
    writer = await ClaudeSessionStore.open(objects_url, redis_url, namespace=prefix, **options)
    try:
        for n in sizes:
            session = str(uuid.uuid4())
            key = {"project_key": "-work-bench", "session_id": session}
            times: list[float] = []
            parent = None
            requests = writer.store.sync.objects.requests
            for i in range(n):
                batch = _flush(session, i, parent)
                parent = batch[-1]["uuid"]
                if i == 1:
                    requests.clear()  # the first append registers the transcript
                t = time.perf_counter()
                await writer.append(key, batch)  # type: ignore[arg-type]
                times.append(time.perf_counter() - t)
            if n == sizes[0]:
                rows.append(_row(OURS, "append_ms_p50", _pct(times, 50) * 1000, "ms"))
                rows.append(_row(OURS, "append_ms_p99", _pct(times, 99) * 1000, "ms"))
                rows.append(_row(OURS, "append_object_writes", requests["put"] / (n - 1), "PUTs"))
                rows.append(_row(OURS, "append_requests", sum(requests.values()) / (n - 1), "requests"))
                t = time.perf_counter()
                listed = await writer.list_session_summaries("-work-bench")
                rows.append(_row(OURS, f"list_summaries_first_ms_{n}", (time.perf_counter() - t) * 1000, "ms"))
                assert len(listed) == 1

            async def cold(suffix: str, key: dict[str, str] = key, n: int = n) -> None:
                sync = await asyncio.to_thread(SessionStore.from_url, objects_url, redis_url, **options)
                reader = ClaudeSessionStore(AsyncSessionStore(sync), namespace=prefix, owns_store=True)
                try:
                    sync.objects.requests.clear()
                    t = time.perf_counter()
                    loaded = await reader.load(key)  # type: ignore[arg-type]
                    dt = time.perf_counter() - t
                    assert loaded is not None and len(loaded) == 2 * n
                    req = sum(sync.objects.requests.get(k, 0) for k in ("get", "list", "head"))
                finally:
                    await reader.close()
                rows.append(_row(OURS, f"cold_load_ms_{n}{suffix}", dt * 1000, "ms"))
                rows.append(_row(OURS, f"cold_load_requests_{n}{suffix}", req, "requests"))

            await cold("")
            sid = writer.session_id_for(key)  # type: ignore[arg-type]
            await asyncio.to_thread(Compactor(writer.store.sync, CompactorOptions()).compact_session, sid)
            await cold("_compacted")
        rows += await _adapter_against_the_store_call(writer, min(sizes[0], 200))
    finally:
        await writer.close()
    return rows


async def _adapter_against_the_store_call(writer: Any, n: int) -> list[dict[str, Any]]:
    """What the adapter adds to the store call it maps to: ``n`` rounds, each one ``append``
    through the adapter to one transcript and the same entries, as the adapter wraps them,
    through ``AsyncSessionStore.append_session_entries`` to another, in one loop (so both
    see the same load)."""
    via_adapter, via_store = str(uuid.uuid4()), str(uuid.uuid4())
    keys = [{"project_key": "-work-bench", "session_id": s} for s in (via_adapter, via_store)]
    for k in keys:  # the first append registers the transcript
        await writer.append(k, _flush(k["session_id"], 0, None))  # type: ignore[arg-type]
    sid = writer.session_id_for(keys[1])  # type: ignore[arg-type]
    times: tuple[list[float], list[float]] = ([], [])
    parents: list[str | None] = [None, None]
    for i in range(1, n):
        for side, k in enumerate(keys):
            batch = _flush(k["session_id"], i, parents[side])
            parents[side] = batch[-1]["uuid"]
            t = time.perf_counter()
            if side == 0:
                await writer.append(k, batch)
            else:
                (chunk,) = writer._wrap_batch(batch)
                await writer.store.append_session_entries(sid, chunk)
            times[side].append(time.perf_counter() - t)
    return [
        _row(OURS, "append_ms_p50_interleaved_adapter", _pct(times[0], 50) * 1000, "ms"),
        _row(OURS, "append_ms_p50_interleaved_store_call", _pct(times[1], 50) * 1000, "ms"),
    ]


def _reference_side(objects_url: str, workdir: Path, sizes: list[int]) -> list[dict[str, Any]]:
    parts = _Parts(objects_url, workdir)
    rows: list[dict[str, Any]] = []

    async def write(session: str, n: int) -> list[float]:
        times = []
        parent = None
        for i in range(n):
            batch = _flush(session, i, parent)
            parent = batch[-1]["uuid"]
            t = time.perf_counter()
            await asyncio.to_thread(parts.put, session, batch)  # as the reference: off the loop
            times.append(time.perf_counter() - t)
        return times

    try:
        for n in sizes:
            session = str(uuid.uuid4())
            times = asyncio.run(write(session, n))
            if n == sizes[0]:
                rows.append(_row(parts.backend, "append_ms_p50", _pct(times, 50) * 1000, "ms"))
                rows.append(_row(parts.backend, "append_ms_p99", _pct(times, 99) * 1000, "ms"))
            t = time.perf_counter()
            loaded = parts.load(session)
            dt = time.perf_counter() - t
            assert len(loaded) == 2 * n
            rows.append(_row(parts.backend, f"cold_load_ms_{n}", dt * 1000, "ms"))
            rows.append(_row(parts.backend, f"cold_load_requests_{n}", parts.requests, "requests"))
    finally:
        parts.close()
    return rows


def run(objects_url: str, redis_url: str | None, workdir: Path, *, quick: bool) -> list[dict[str, Any]]:
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    sizes = [400] if quick else [400, 4000]
    rows = asyncio.run(_adapter_side(objects_url, redis_url, sizes))
    rows += _reference_side(objects_url, workdir, sizes)
    return rows


if __name__ == "__main__":  # pragma: no cover
    import sys

    url = sys.argv[1] if len(sys.argv) > 1 else Path("/tmp/ccbench-objects").absolute().as_uri()
    for r in run(url, sys.argv[2] if len(sys.argv) > 2 else None, Path(os.environ.get("TMPDIR", "/tmp")) / "ccbench",
                 quick="--full" not in sys.argv):
        print(r)
