"""Throughput (P writers over many sessions) and contention (P writers on one session).

One pool of P writer processes serves both. Store phases and floor phases alternate in an
ABBA order (store, floor, floor, store, ...), so a drift of the machine's load over the run
weighs on both sides alike.

- Throughput floor: raw conditional PUTs of the same bytes at the same concurrency.
- Contention floor: one writer's back-to-back PUTs (1 / PUT latency): a session's segments are
  created one at a time. Contention runs 1, 2 and P writers on one session: writers are
  served first come, first served, and the one whose turn it is writes the batches queued
  behind it in its segment (group commit), so the p99 of P writers is held against one
  writer's (target <= 3x); the longest run of segments one writer committed in a row and
  the appends per segment are counted. With group commit the appends/s may beat the floor
  of one segment per PUT.
"""

from __future__ import annotations

from typing import Any

from benchmarks.context import Context
from benchmarks.results import fmt_ms, fmt_rate, fmt_ratio
from benchmarks.stats import summarize
from benchmarks.workers import WriterPool


def _order(k: int) -> tuple[str, str]:
    return ("store", "floor") if k % 2 == 0 else ("floor", "store")


def run(ctx: Context) -> None:
    b, p = ctx.backend, ctx.params
    ctx.log(f"writers: starting {p.writers} writer processes")
    pool = WriterPool(b.worker_spec(), p.writers)
    try:
        _throughput(ctx, pool)
        _contention(ctx, pool)
    finally:
        pool.close()


def _throughput(ctx: Context, pool: WriterPool) -> None:
    b, p, R = ctx.backend, ctx.params, ctx.results
    st = b.store()
    sessions = [
        [f"tp-{ctx.run_id}-w{w}-s{s}" for s in range(p.sessions_per_writer)] for w in range(p.writers)
    ]
    for group in sessions:
        for sid in group:
            st.create_session(sid)
    heads: list[dict[str, str | None]] = [{sid: None for sid in group} for group in sessions]

    def store_phase(tag: str, duration: float) -> dict[str, Any]:
        out = pool.run(
            "many",
            [{"sessions": sessions[w], "heads": heads[w], "duration": duration, "tag": tag} for w in range(p.writers)],
        )
        for w, res in enumerate(out):
            heads[w] = res["heads"]
        return {
            "acked": sum(r["acked"] for r in out),
            "errors": sum(sum(r["errors"].values()) for r in out),
            "latency": [x for r in out for x in r["latency"]],
            "duration": duration,
        }

    def floor_phase(tag: str, duration: float) -> dict[str, Any]:
        out = pool.run("puts", [{"duration": duration, "tag": tag} for _ in range(p.writers)])
        return {
            "acked": sum(r["done"] for r in out),
            "errors": 0,
            "latency": [x for r in out for x in r["latency"]],
            "duration": duration,
        }

    warm = min(1.0, p.phase_s / 2)
    store_phase("tpw", warm)
    floor_phase("tpw", warm)
    phases: dict[str, list[dict[str, Any]]] = {"store": [], "floor": []}
    ctx.log(f"throughput: {p.phases} x ({p.phase_s:.1f} s store + {p.phase_s:.1f} s floor), P={p.writers}")
    for k in range(p.phases):
        for side in _order(k):
            fn = store_phase if side == "store" else floor_phase
            phases[side].append(fn(f"tp{k}", p.phase_s))
    rate = {side: sum(x["acked"] for x in ph) / sum(x["duration"] for x in ph) for side, ph in phases.items()}
    lat = {side: summarize([x for ph in phases[side] for x in ph["latency"]]) for side in phases}
    errors = sum(x["errors"] for x in phases["store"])
    ratio = rate["store"] / rate["floor"] if rate["floor"] else float("nan")
    R.fig("throughput.store.appends_per_s", rate["store"], "1/s")
    R.fig("throughput.floor.puts_per_s", rate["floor"], "1/s")
    R.fig("throughput.ratio", ratio, "x")
    R.fig("throughput.store.p50_ms", lat["store"]["p50"], "ms")
    R.fig("throughput.floor.p50_ms", lat["floor"]["p50"], "ms")
    R.fig("throughput.store.errors", errors)
    R.details["throughput"] = {
        "writers": p.writers,
        "sessions": p.writers * p.sessions_per_writer,
        "phase_s": p.phase_s,
        "phases": {side: [{k: v for k, v in x.items() if k != "latency"} for x in ph] for side, ph in phases.items()},
        "store_latency_ms": lat["store"],
        "floor_latency_ms": lat["floor"],
    }
    t = R.target("throughput >= 0.8x floor", "throughput.ratio", ">=", 0.8)
    R.row(
        "aggregate throughput",
        f"P={p.writers} processes, {p.writers * p.sessions_per_writer} sessions, 1 KB appends",
        f"{fmt_rate(rate['store'])} appends",
        f"{fmt_rate(rate['floor'])} PUTs",
        fmt_ratio(ratio),
        target=t,
    )


def _contention(ctx: Context, pool: WriterPool) -> None:
    """1, 2 and P writers on one session each (fresh sessions, so each run's segment numbers
    are its own), against one writer's back-to-back PUTs; the phases of one round run in
    one order and those of the next in the reverse order (ABBA over four sides)."""
    b, p, R = ctx.backend, ctx.params, ctx.results
    st = b.store()
    counts = sorted({1, min(2, p.writers), p.writers})
    sids = {k: f"contention-{ctx.run_id}-w{k}" for k in counts}
    for sid in sids.values():
        st.create_session(sid)

    def one(k: int, tag: str, d: float) -> list[dict[str, Any]]:
        return pool.run("one", [{"sid": sids[k], "duration": d, "tag": f"{tag}k{k}"} for _ in range(k)])

    warm = min(1.0, p.phase_s / 2)
    for k in counts:
        one(k, "cw", warm)
    pool.run("puts", [{"duration": warm, "tag": "csw"}])
    ctx.log(f"contention: {p.phases} x ({len(counts)} x {p.phase_s:.1f} s, {counts} writers on one "
            f"session + {p.phase_s:.1f} s serial PUTs)")
    sides: list[int | None] = [*counts, None]  # None: the floor
    store_runs: dict[int, list[list[dict[str, Any]]]] = {k: [] for k in counts}
    floor_runs: list[dict[str, Any]] = []
    for phase in range(p.phases):
        for side in sides if phase % 2 == 0 else reversed(sides):
            if side is None:
                floor_runs.append(pool.run("puts", [{"duration": p.phase_s, "tag": f"cs{phase}"}])[0])
            else:
                store_runs[side].append(one(side, f"c{phase}", p.phase_s))
    duration = p.phases * p.phase_s
    floor_rate = sum(r["done"] for r in floor_runs) / duration
    per_k = {k: _contention_side(st, sids[k], store_runs[k], duration) for k in counts}
    top, single = per_k[p.writers], per_k[1]
    lost = sum(len(x["lost"]) for x in per_k.values())
    ratio = top["rate"] / floor_rate if floor_rate else float("nan")
    p99_ratio = top["latency"]["p99"] / single["latency"]["p99"] if single["latency"]["p99"] else float("nan")
    longest = max((x["longest_run"] for k, x in per_k.items() if k > 1), default=0)
    R.fig("contention.store.appends_per_s", top["rate"], "1/s")
    R.fig("contention.floor.segments_per_s", floor_rate, "1/s")
    R.fig("contention.ratio", ratio, "x")
    R.fig("contention.retries_per_append", top["retries"], "rounds")
    R.fig("contention.gets_per_append", top["gets_per_append"], "requests")
    R.fig("contention.appends_per_segment", top["appends_per_segment"], "appends")
    R.fig("contention.lost", lost, "appends")
    R.fig("contention.errors", sum(sum(x["errors"].values()) for x in per_k.values()), "appends")
    R.fig("contention.acked", top["acked"], "appends")
    R.fig("contention.store.p50_ms", top["latency"]["p50"], "ms")
    R.fig("contention.store.p99_ms", top["latency"]["p99"], "ms")
    for k, x in per_k.items():
        R.fig(f"contention.w{k}.p50_ms", x["latency"]["p50"], "ms")
        R.fig(f"contention.w{k}.p99_ms", x["latency"]["p99"], "ms")
        R.fig(f"contention.w{k}.appends_per_s", x["rate"], "1/s")
    R.fig("contention.p99_vs_single", p99_ratio, "x")
    R.fig("contention.longest_run", longest, "appends")
    R.details["contention"] = {
        "writers": counts,
        "per_writer_count": {
            str(k): {
                "acked": x["acked"],
                "committed_after_deadline": x["late"],
                "lost_ids": x["lost"][:20],
                "errors": x["errors"],
                "object_requests": x["requests"],
                "longest_run_of_one_writer": x["longest_run"],
                "appends_per_segment": x["appends_per_segment"],
                "store_latency_ms": x["latency"],
            }
            for k, x in per_k.items()
        },
        "floor_put_latency_ms": summarize([x for r in floor_runs for x in r["latency"]]),
    }
    t = R.target("contention >= 0.7x floor", "contention.ratio", ">=", 0.7)
    R.target("contention: zero lost", "contention.lost", "<=", 0)
    fair = R.target(f"contention: p99 with {p.writers} writers <= 3x one writer's",
                    "contention.p99_vs_single", "<=", 3.0)
    for k, x in per_k.items():
        R.row(
            "contention (no expected tail)",
            f"P={k} on one session: p50 / p99; rate",
            f"{fmt_ms(x['latency']['p50'])} / {fmt_ms(x['latency']['p99'])}; {fmt_rate(x['rate'])}",
            "",
            "",
        )
    R.row(
        "contention (no expected tail)",
        f"P={p.writers} on one session: p99 / one writer's p99; longest run of one writer",
        f"{p99_ratio:.2f}x; {longest} in a row",
        "",
        fmt_ratio(p99_ratio),
        target=fair,
    )
    R.row(
        "contention (no expected tail)",
        f"P={p.writers} on one session: rate; retries/append; appends/segment; lost",
        f"{fmt_rate(top['rate'])}; {top['retries']:.2f} retries; "
        f"{top['appends_per_segment']:.2f} a segment; {lost} lost",
        f"{fmt_rate(floor_rate)} (1/PUT)",
        fmt_ratio(ratio),
        target=t,
    )


def _contention_side(st: Any, sid: str, runs: list[list[dict[str, Any]]], duration: float) -> dict[str, Any]:
    """What the runs of one writer count did: rate, latency, retries, lost appends, and the
    longest run of segments one writer committed in a row (FIFO order keeps it near 1)."""
    acked = [i for run in runs for r in run for i in r["acked_ids"]]
    committed = acked + [i for run in runs for r in run for i in r["late_ids"]]
    puts = sum(r["requests"].get("put", 0) for run in runs for r in run)
    gets = sum(r["requests"].get("get", 0) for run in runs for r in run)
    errors: dict[str, int] = {}
    for run in runs:
        for r in run:
            for name, n in r["errors"].items():
                errors[name] = errors.get(name, 0) + n
    present = {str(e["id"]) for e in st.load_session_entries(sid)}
    # Group commit puts several writers' batches in one segment: a PUT per segment written,
    # and any PUT beyond that lost a race (a retry).
    segments = sum(len({seq for r in run for seq in r["seqs"]}) for run in runs)
    longest = 0
    for run in runs:
        order = sorted((seq, w) for w, r in enumerate(run) for seq in r["seqs"])
        streak, prev = 0, None
        for _seq, w in order:
            streak = streak + 1 if w == prev else 1
            prev = w
            longest = max(longest, streak)
    return {
        "rate": len(acked) / duration,
        "acked": len(acked),
        "late": len(committed) - len(acked),
        "lost": [i for i in committed if i not in present],
        "errors": errors,
        "requests": {"put": puts, "get": gets},
        "retries": max(0, puts - segments) / len(committed) if committed else float("nan"),
        "appends_per_segment": len(committed) / segments if segments else float("nan"),
        "gets_per_append": gets / len(committed) if committed else float("nan"),
        "latency": summarize([x for run in runs for r in run for x in r["latency"]]),
        "longest_run": longest,
    }
