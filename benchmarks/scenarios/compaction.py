"""Compaction of one session: segments/s and MB/s merged, against GET all + PUT one object.

The floor reads every segment object of the session (with the store's read parallelism) and
writes one object of the same bytes: what merging cannot avoid. The store side is the
compactor's own entry point for one session. Compaction is destructive, so each session
gives one sample: the floor is measured just before and just after it and the mean is used.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from benchmarks.context import Context
from benchmarks.results import fmt_ms, fmt_ratio


@dataclass
class CompactionAPI:
    available: bool
    reason: str = ""
    description: str = ""
    compact: Callable[[Any, str], Any] | None = None


def find() -> CompactionAPI:
    """The compactor's "compact one session" entry point, if the compactor has one yet."""
    try:
        from compactor import Compactor
    except ImportError as exc:
        return CompactionAPI(False, f"the compactor cannot be imported yet ({exc})")
    if not callable(getattr(Compactor, "compact_session", None)):
        return CompactionAPI(False, "compactor.Compactor has no compact_session() yet")

    def compact(store: Any, sid: str) -> list[Any]:
        comp = Compactor(store)
        results = [comp.compact_session(sid)]
        while results[-1].outcome == "compacted" and getattr(results[-1], "more_pending", False):
            results.append(comp.compact_session(sid))
        if results[0].outcome != "compacted":
            raise RuntimeError(f"compaction of {sid} did not compact: {results[0]!r}")
        return results

    return CompactionAPI(True, description="compactor.Compactor(store).compact_session(sid)", compact=compact)


def run(ctx: Context, api: CompactionAPI) -> None:
    assert api.compact is not None
    b, R = ctx.backend, ctx.results
    st = b.store()
    reader = b.store()
    raw = b.raw()
    par = reader.options.read_concurrency
    pools = {par: ThreadPoolExecutor(max_workers=par)}
    details: dict[str, Any] = {}
    try:
        _run(ctx, api, st, reader, raw, pools, details)
    finally:
        for pool in pools.values():
            pool.shutdown()
        raw.close()
    R.details["compaction"] = details


def _run(ctx: Context, api: CompactionAPI, st: Any, reader: Any, raw: Any, pools: dict[int, ThreadPoolExecutor], details: dict[str, Any]) -> None:
    assert api.compact is not None
    p, R = ctx.params, ctx.results
    par = reader.options.read_concurrency
    for n in p.resume_sizes:
        info = ctx.sessions[n]
        sid = info["sid"]
        header = reader.get_header(sid)
        keys = list(reader.iter_segment_keys(sid, header.incarnation))

        def floor(tag: str, threads: int) -> float:
            t0 = time.perf_counter()
            parts = list(pools[threads].map(lambda k: reader.objects.get(k).data, keys))
            raw.put(f"compaction/{ctx.run_id}/{n}-{tag}-{threads}.jsonl", b"".join(parts))
            return time.perf_counter() - t0

        ctx.log(f"compaction {n}: {len(keys)} segments")
        list(pools[par].map(lambda k: reader.objects.get(k).data, keys[: 2 * par]))  # warm connections
        f_before = floor("before", par)
        t0 = time.perf_counter()
        outcome = api.compact(st, sid)
        store_s = time.perf_counter() - t0
        f_after = floor("after", par)
        floor_s = (f_before + f_after) / 2
        mib = info["bytes"] / 2**20
        pre = f"compaction.{n}"
        R.fig(f"{pre}.store_ms", store_s * 1000, "ms")
        R.fig(f"{pre}.floor_ms", floor_s * 1000, "ms")
        R.fig(f"{pre}.ratio", store_s / floor_s, "x")
        R.fig(f"{pre}.segments_per_s", len(keys) / store_s, "1/s")
        R.fig(f"{pre}.mb_per_s", mib / store_s, "MiB/s")
        R.fig(f"{pre}.floor_segments_per_s", len(keys) / floor_s, "1/s")
        details[str(n)] = {
            "segments": len(keys),
            "bytes": info["bytes"],
            "floor_s": [f_before, f_after],
            "read_concurrency": par,
            "store_s": store_s,
            "results": [repr(r) for r in outcome] if isinstance(outcome, list) else repr(outcome),
        }
        target = R.target(f"compaction {n}: <= 1.5x floor", f"{pre}.ratio", "<=", 1.5) if n == max(p.resume_sizes) else None
        R.row(
            "compaction (one session)",
            f"{n:,} entries, {len(keys)} segments, {mib:.1f} MiB",
            f"{fmt_ms(store_s * 1000)}: {len(keys) / store_s:,.0f} seg/s, {mib / store_s:.1f} MiB/s",
            f"{fmt_ms(floor_s * 1000)} (GET all, {par} at a time, + PUT one)",
            fmt_ratio(store_s / floor_s),
            target=target,
        )
