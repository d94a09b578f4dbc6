"""Compaction of one session: segments/s and MB/s merged, against GET all + PUT one object.

The floor reads every segment object of the session (with the store's read parallelism) and
writes one object of the same bytes: what merging cannot avoid. The store side is the
compactor's own entry point for one session. Compaction is destructive, so each session
gives one sample: the floor is measured just before and just after it and the mean is used.

Write amplification (counted, not timed): a session appended one entry per segment and
compacted every 64 segments (the default trigger), as it grows to N entries. Bytes the
compactions write (bases; manifests separately) over bytes appended, and the most bases a
resume had to fetch. Against the same session compacted with every compaction rewriting
everything (``merge_ratio=inf``: what compaction did before runs of bases were kept).
"""

from __future__ import annotations

import hashlib
import math
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
    #: The compactor keeps runs of bases (``merge_ratio``): write amplification is measured.
    tiered: bool = False


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

    api = CompactionAPI(True, description="compactor.Compactor(store).compact_session(sid)", compact=compact)
    try:
        from compactor import CompactorOptions

        api.tiered = "merge_ratio" in CompactorOptions.__dataclass_fields__  # type: ignore[attr-defined]
    except ImportError:
        pass
    return api


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
    if getattr(api, "tiered", False):
        amplification(ctx)


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


# --- write amplification ---------------------------------------------------------------------


def amplification_figures(params: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for n in params["amplification_sizes"]:
        names += [f"amplification.{n}.{k}" for k in ("bases_x", "manifests_x", "max_bases", "compactions")]
        if n <= params["amplification_full_rewrite_max"]:
            names.append(f"amplification.{n}.full_rewrite_x")
    return names


def _grow(ctx: Context, st: Any, sid: str, n: int, every: int, merge_ratio: float) -> dict[str, float]:
    """Append ``n`` one-entry segments to a new session, compacting every ``every``."""
    from compactor import Compactor, CompactorOptions
    from store.formats.entries import encode_entries
    from store.formats.segments import SHA256

    st.create_session(sid)
    inc = st.get_header(sid).incarnation
    comp = Compactor(st, CompactorOptions(merge_ratio=merge_ratio))
    text = "x" * 400  # a short chat message
    parent = None
    appended = bases = manifests = compactions = most = 0
    for seq in range(1, n + 1):
        eid = f"e{seq}"
        body = encode_entries([{"type": "message", "id": eid, "parentId": parent,
                                "timestamp": "2026-11-22T10:00:00.000Z",
                                "message": {"role": "user", "content": f"{eid} {text}"}}])
        # As a writer encodes and puts it (the append path is measured elsewhere): the
        # compactor finds segments by listing.
        st.objects.put_if_absent(st.layout.segment(sid, inc, seq), body,
                                 {SHA256: hashlib.sha256(body).hexdigest()})
        appended += len(body)
        parent = eid
        if seq % every and seq != n:
            continue
        res = comp.compact_session(sid)
        if res.outcome != "compacted":
            raise RuntimeError(f"compaction of {sid} did not compact: {res!r}")
        compactions += 1
        bases += res.bytes_out
        manifest = st.objects.get(res.manifest_key)
        manifests += len(manifest.data)
        latest = st.latest_manifest(sid, inc)
        most = max(most, len(latest.bases))
    return {"appended": appended, "bases": bases, "manifests": manifests, "compactions": compactions,
            "most": most}


def amplification(ctx: Context) -> None:
    p, R = ctx.params, ctx.results
    st = ctx.backend.store()
    every = p.amplification_every
    details: dict[str, Any] = {}
    for n in p.amplification_sizes:
        ctx.log(f"write amplification {n}: one entry per segment, compacting every {every}")
        t0 = time.perf_counter()
        tiered = _grow(ctx, st, f"amp-{ctx.run_id}-{n}", n, every, 2.0)
        pre = f"amplification.{n}"
        bases_x = R.fig(f"{pre}.bases_x", tiered["bases"] / tiered["appended"], "x")
        manifests_x = R.fig(f"{pre}.manifests_x", tiered["manifests"] / tiered["appended"], "x")
        R.fig(f"{pre}.max_bases", tiered["most"])
        R.fig(f"{pre}.compactions", tiered["compactions"])
        full_x = math.nan
        full: dict[str, float] = {}
        if n <= p.amplification_full_rewrite_max:
            full = _grow(ctx, st, f"amp-full-{ctx.run_id}-{n}", n, every, math.inf)
            full_x = R.fig(f"{pre}.full_rewrite_x", full["bases"] / full["appended"], "x")
        details[str(n)] = {"tiered": tiered, "full_rewrite": full, "seconds": time.perf_counter() - t0}
        target = R.target(f"write amplification {n}: bases <= 6x appended", f"{pre}.bases_x", "<=", 6.0) \
            if n == 10_000 else None
        R.row(
            "compaction: bytes written / appended",
            f"{n:,} entries, 1 per segment, compacted every {every} ({tiered['compactions']:.0f}x)",
            f"{bases_x:.2f}x bases (+{manifests_x:.2f}x manifests), at most {tiered['most']:.0f} bases",
            f"{full_x:.2f}x (every compaction rewrites all)" if full else "(not run at this size)",
            f"{bases_x / full_x:.3f}x" if full else "-",
            target=target,
        )
    R.details["amplification"] = details
