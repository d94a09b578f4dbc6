"""asyncio: many tasks of one event loop appending through ``AsyncSessionStore``.

- Store: T tasks append single-entry batches round-robin over S sessions through one
  ``AsyncSessionStore`` (its threads run the sync protocol). The loop's worst lag (how long a
  1 ms sleeper overslept) is recorded alongside.
- Floor: the same work by as many plain threads as the store has, calling the sync
  ``SessionStore`` directly: what the
  offload costs is the ratio of the two.
- Native Redis for comparison: N concurrent round trips (PING) through ``redis.asyncio`` on the
  loop, and the same N offloaded to the store's threads through sync redis-py. This is the
  whole of what a native async Redis client could save per call; the S3 side has no native
  client in the dependencies (aiobotocore pins botocore).

Store and floor phases alternate (ABBA) so a drift of the machine's load weighs on both.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks.context import Context
from benchmarks.results import fmt_rate, fmt_ratio
from benchmarks.workload import chain


def run(ctx: Context) -> None:
    b, p, R = ctx.backend, ctx.params, ctx.results
    tasks, sessions_n, per_task = p.aio_tasks, p.aio_sessions, p.aio_appends
    from store.aio import DEFAULT_MAX_WORKERS

    workers = min(tasks, DEFAULT_MAX_WORKERS)  # the floor's threads: as many as the store's
    sync_store = b.store()
    sessions = [f"aio-{ctx.run_id}-{s}" for s in range(sessions_n)]
    for sid in sessions:
        sync_store.create_session(sid)
    counter = iter(range(10**9))
    lock = threading.Lock()

    def batch(tag: str) -> list[dict[str, Any]]:
        with lock:
            n = next(counter)
        return chain(f"{tag}{n}-", 0, 1, None)

    def async_phase(tag: str) -> tuple[float, list[float]]:
        from store.aio import AsyncSessionStore

        async def main() -> tuple[float, list[float]]:
            lags: list[float] = []
            stop = asyncio.Event()

            async def sleeper() -> None:
                while not stop.is_set():
                    t0 = time.perf_counter()
                    await asyncio.sleep(0.001)
                    lags.append(time.perf_counter() - t0 - 0.001)

            store = AsyncSessionStore(sync_store, owns_store=False, max_workers=workers)
            lag = asyncio.create_task(sleeper())

            async def task(t: int) -> None:
                for i in range(per_task):
                    await store.append_session_entries(sessions[(t + i) % sessions_n], batch(tag))

            t0 = time.perf_counter()
            await asyncio.gather(*(task(t) for t in range(tasks)))
            elapsed = time.perf_counter() - t0
            stop.set()
            await lag
            await store.close()
            return tasks * per_task / elapsed, lags

        return asyncio.run(main())

    def thread_phase(tag: str) -> float:
        def task(t: int) -> None:
            for i in range(per_task):
                sync_store.append_session_entries(sessions[(t + i) % sessions_n], batch(tag))

        with ThreadPoolExecutor(max_workers=workers) as ex:
            t0 = time.perf_counter()
            list(ex.map(task, range(tasks)))
            return tasks * per_task / (time.perf_counter() - t0)

    aio_rates: list[float] = []
    thread_rates: list[float] = []
    lags: list[float] = []
    for k in range(p.phases * 2):
        order = ("store", "floor") if k % 2 == 0 else ("floor", "store")
        for side in order:
            if side == "store":
                rate, phase_lags = async_phase(f"a{k}")
                aio_rates.append(rate)
                lags += phase_lags
            else:
                thread_rates.append(thread_phase(f"t{k}"))
    aio_rate = sum(aio_rates) / len(aio_rates)
    thread_rate = sum(thread_rates) / len(thread_rates)
    R.fig("aio.store.appends_per_s", aio_rate, "/s")
    R.fig("aio.threads.appends_per_s", thread_rate, "/s")
    R.fig("aio.ratio", thread_rate / aio_rate if aio_rate else float("nan"))
    lags.sort()
    worst_lag = lags[-1] if lags else float("nan")
    p99_lag = lags[min(len(lags) - 1, int(len(lags) * 0.99))] if lags else float("nan")
    R.fig("aio.loop_lag_worst_ms", worst_lag * 1000, "ms")
    R.fig("aio.loop_lag_p99_ms", p99_lag * 1000, "ms")
    R.row("aio", f"{tasks} tasks, {sessions_n} sessions", fmt_rate(aio_rate), fmt_rate(thread_rate),
          fmt_ratio(thread_rate / aio_rate if aio_rate else float("nan")))

    native, offloaded = _redis_round_trips(b.redis_rtt_url, p.aio_redis_calls, workers)
    R.fig("aio.redis.native_us_per_call", native * 1e6, "us")
    R.fig("aio.redis.offloaded_us_per_call", offloaded * 1e6, "us")
    R.row("aio", "Redis round trip: offloaded vs redis.asyncio", f"{offloaded * 1e6:.0f} us",
          f"{native * 1e6:.0f} us", fmt_ratio(offloaded / native if native else float("nan")))
    ctx.log(f"aio: {aio_rate:.0f}/s async vs {thread_rate:.0f}/s threads; worst loop lag "
            f"{worst_lag * 1000:.1f} ms (p99 {p99_lag * 1000:.1f} ms); Redis {offloaded * 1e6:.0f} us offloaded vs "
            f"{native * 1e6:.0f} us native per call")


def _redis_round_trips(url: str, calls: int, concurrency: int) -> tuple[float, float]:
    """Seconds per PING, ``concurrency`` at a time: redis.asyncio on the loop, and sync
    redis-py offloaded to a thread pool from the loop."""
    import redis
    import redis.asyncio as aredis

    async def native() -> float:
        client = aredis.Redis.from_url(url)
        sem = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with sem:
                await client.ping()

        await client.ping()
        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(calls)))
        elapsed = time.perf_counter() - t0
        await client.aclose()
        return elapsed / calls

    async def offloaded() -> float:
        client = redis.Redis.from_url(url)
        pool = ThreadPoolExecutor(max_workers=concurrency)
        loop = asyncio.get_running_loop()
        client.ping()
        t0 = time.perf_counter()
        await asyncio.gather(*(loop.run_in_executor(pool, client.ping) for _ in range(calls)))
        elapsed = time.perf_counter() - t0
        pool.shutdown()
        client.close()
        return elapsed / calls

    n1 = asyncio.run(native())
    o1 = asyncio.run(offloaded())
    o2 = asyncio.run(offloaded())
    n2 = asyncio.run(native())
    return (n1 + n2) / 2, (o1 + o2) / 2
