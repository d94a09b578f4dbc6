"""Append latency: one entry (~1 KB) and batches of 10, against one PUT + one Redis round trip.

Open loop: the store's appends and the floor's operations share one fixed schedule, one slot
each in a random order every round, at about half the store's capacity. Latency is measured
from the slot's intended start, so a stall (GC, a noisy neighbour, a slow request) is paid by
the operations queued behind it instead of disappearing from the sample.

Before the timed part, a closed-loop warm-up counts the object-store requests and Redis
commands one append costs (from the store's request counter and ``INFO commandstats``).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from benchmarks.backends import RedisCallCounter, RedisRoundTrip
from benchmarks.context import Context
from benchmarks.results import fmt_ms, fmt_ratio
from benchmarks.stats import median, open_loop, percentile, ratio_ci, summarize
from benchmarks.workload import chain, encode


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before) if after.get(k, 0) != before.get(k, 0)}


def run(ctx: Context) -> None:
    b, p, R = ctx.backend, ctx.params, ctx.results
    st = b.store()
    raw = b.raw()
    rc = b.redis_client()
    rtt = RedisRoundTrip(rc, f"{b.redis_prefix}:bench:rtt")
    details: dict[str, Any] = {}
    try:
        for size in p.append_batches:
            tag = f"b{size}"
            sid = f"lat-{tag}-{ctx.run_id}"
            st.create_session(sid)
            total = 1 + p.append_warmup + p.append_rounds
            entries = chain(f"{tag}x", 0, total * size, None)
            batches = [entries[i * size : (i + 1) * size] for i in range(total)]
            bodies = [encode(bt) for bt in batches]
            floor_key = f"append/{tag}/"

            # The first append of a new session, alone: it may pay for setting the session up.
            calls = RedisCallCounter(st.coord.client)
            req0, cmd0 = Counter(st.objects.requests), calls.snapshot()
            t0 = time.perf_counter()
            st.append_session_entries(sid, batches[0])
            first_ms = (time.perf_counter() - t0) * 1000
            first_req = _delta(dict(st.objects.requests), dict(req0))
            first_cmd = _delta(calls.snapshot(), cmd0)
            # Warm-up, store alone: also the request accounting of a steady-state append.
            req0, cmd0 = Counter(st.objects.requests), calls.snapshot()
            warm: list[float] = []
            for i in range(1, p.append_warmup + 1):
                t0 = time.perf_counter()
                st.append_session_entries(sid, batches[i])
                warm.append(time.perf_counter() - t0)
            obj_req = _delta(dict(st.objects.requests), dict(req0))
            cmds = _delta(calls.snapshot(), cmd0)
            warm_floor: list[float] = []
            for i in range(p.append_warmup):
                t0 = time.perf_counter()
                raw.put(f"{floor_key}w{i}", bodies[i])
                rtt()
                warm_floor.append(time.perf_counter() - t0)

            # About a third of the machine's capacity for this pair of operations: room for
            # bursts of noise without the schedule falling behind for good.
            interval = p.open_loop_slack * (median(warm) + median(warm_floor)) / 2
            n0 = p.append_warmup + 1
            req1 = Counter(st.objects.requests)
            cmd1 = calls.snapshot()

            def store_op(r: int) -> None:
                st.append_session_entries(sid, batches[n0 + r])

            def floor_op(r: int) -> None:
                raw.put(f"{floor_key}m{r}", bodies[n0 + r])
                rtt()

            ctx.log(f"append {tag}: {p.append_rounds} rounds, open loop every {interval * 1000:.1f} ms")
            res = open_loop({"store": store_op, "floor": floor_op}, p.append_rounds, interval, seed=p.seed + size)
            obj_req_run = _delta(dict(st.objects.requests), dict(req1))
            cmds_run = _delta(calls.snapshot(), cmd1)

            s_lat, f_lat = res.latency["store"], res.latency["floor"]
            ss, fs = summarize(s_lat), summarize(f_lat)
            ratio = ss["p50"] / fs["p50"]
            ci = ratio_ci(s_lat, f_lat, 50)
            pre = f"append.{tag}"
            R.fig(f"{pre}.store.p50_ms", ss["p50"], "ms")
            R.fig(f"{pre}.store.p99_ms", ss["p99"], "ms")
            R.fig(f"{pre}.floor.p50_ms", fs["p50"], "ms")
            R.fig(f"{pre}.floor.p99_ms", fs["p99"], "ms")
            R.fig(f"{pre}.ratio_p50", ratio, "x")
            R.fig(f"{pre}.ratio_p50_ci_lo", ci[0], "x")
            R.fig(f"{pre}.ratio_p50_ci_hi", ci[1], "x")
            R.fig(f"{pre}.ratio_p99", ss["p99"] / fs["p99"], "x")
            R.fig(f"{pre}.store.service_p50_ms", percentile(sorted(res.service["store"]), 50) * 1000, "ms")
            R.fig(f"{pre}.floor.service_p50_ms", percentile(sorted(res.service["floor"]), 50) * 1000, "ms")
            R.fig(f"{pre}.object_requests_per_append", sum(obj_req.values()) / p.append_warmup, "requests")
            R.fig(f"{pre}.redis_commands_per_append", sum(cmds.values()) / p.append_warmup, "round trips")
            R.fig(f"{pre}.redis_commands_per_append_run", sum(cmds_run.values()) / p.append_rounds, "round trips")
            R.fig(f"{pre}.first_append_ms", first_ms, "ms")
            R.fig(f"{pre}.first_append_object_requests", sum(first_req.values()), "requests")
            R.fig(f"{pre}.first_append_redis_commands", sum(first_cmd.values()), "round trips")
            R.fig(f"{pre}.bytes", len(bodies[0]), "bytes")
            saturated = res.late_starts > 0.2 * 2 * p.append_rounds
            if saturated:
                R.notes.append(
                    f"append {tag}: {res.late_starts} of {2 * p.append_rounds} slots started late: the "
                    "machine was slower than at calibration and the open-loop queue built up"
                )
            R.fig(f"{pre}.late_start_fraction", res.late_starts / (2 * p.append_rounds))
            details[tag] = {
                "store_latency_ms": ss,
                "floor_latency_ms": fs,
                "store_service_ms": summarize(res.service["store"]),
                "floor_service_ms": summarize(res.service["floor"]),
                "interval_ms": interval * 1000,
                "late_starts": res.late_starts,
                "slots": 2 * p.append_rounds,
                "first_append": {"ms": first_ms, "object_requests": first_req, "redis_commands": first_cmd},
                "object_requests_warmup": obj_req,
                "redis_commands_warmup": cmds,
                "object_requests_run": obj_req_run,
                "redis_commands_run": cmds_run,
                "warmup_appends": p.append_warmup,
                "rounds": p.append_rounds,
            }
            label = "1 entry" if size == 1 else f"batch of {size}"
            t = R.target(f"append {label}: p50 <= 1.25x floor", f"{pre}.ratio_p50", "<=", 1.25)
            R.row(
                "append latency (open loop)",
                f"{label}, {len(bodies[0]) / 1024:.0f} KB: p50 / p99",
                f"{fmt_ms(ss['p50'])} / {fmt_ms(ss['p99'])}",
                f"{fmt_ms(fs['p50'])} / {fmt_ms(fs['p99'])}",
                f"p50 {fmt_ratio(ratio, ci)}",
                target=t,
            )
    finally:
        rc.close()
        raw.close()
    R.details["append"] = details
    from benchmarks.scenarios import encryption

    encryption.append_cost(ctx)
