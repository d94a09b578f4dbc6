"""Throughput (P writers over many sessions) and contention (P writers on one session).

One pool of P writer processes serves both. Store phases and floor phases alternate in an
ABBA order (store, floor, floor, store, ...), so a drift of the machine's load over the run
weighs on both sides alike.

- Throughput floor: raw conditional PUTs of the same bytes at the same concurrency.
- Contention floor: one writer's back-to-back PUTs (1 / PUT latency): a session's segments are
  created one at a time, so no number of writers can beat that.
"""

from __future__ import annotations

from typing import Any

from benchmarks.context import Context
from benchmarks.results import fmt_rate, fmt_ratio
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
    b, p, R = ctx.backend, ctx.params, ctx.results
    st = b.store()
    sid = f"contention-{ctx.run_id}"
    st.create_session(sid)

    def one(tag: str, d: float) -> list[dict[str, Any]]:
        return pool.run("one", [{"sid": sid, "duration": d, "tag": tag} for _ in range(p.writers)])

    warm = min(1.0, p.phase_s / 2)
    one("cw", warm)
    pool.run("puts", [{"duration": warm, "tag": "csw"}])
    ctx.log(f"contention: {p.phases} x ({p.phase_s:.1f} s, {p.writers} writers on one session + {p.phase_s:.1f} s serial PUTs)")
    store_runs: list[list[dict[str, Any]]] = []
    floor_runs: list[dict[str, Any]] = []
    for k in range(p.phases):
        for side in _order(k):
            if side == "store":
                store_runs.append(one(f"c{k}", p.phase_s))
            else:
                floor_runs.append(pool.run("puts", [{"duration": p.phase_s, "tag": f"cs{k}"}])[0])
    acked = [i for run in store_runs for r in run for i in r["acked_ids"]]
    committed = acked + [i for run in store_runs for r in run for i in r["late_ids"]]
    puts = sum(r["requests"].get("put", 0) for run in store_runs for r in run)
    gets = sum(r["requests"].get("get", 0) for run in store_runs for r in run)
    errors: dict[str, int] = {}
    for run in store_runs:
        for r in run:
            for name, n in r["errors"].items():
                errors[name] = errors.get(name, 0) + n
    duration = p.phases * p.phase_s
    store_rate = len(acked) / duration
    floor_rate = sum(r["done"] for r in floor_runs) / duration
    present = {str(e["id"]) for e in st.load_session_entries(sid)}
    lost = [i for i in committed if i not in present]
    ratio = store_rate / floor_rate if floor_rate else float("nan")
    retries = (puts - len(committed)) / len(committed) if committed else float("nan")
    R.fig("contention.store.appends_per_s", store_rate, "1/s")
    R.fig("contention.floor.segments_per_s", floor_rate, "1/s")
    R.fig("contention.ratio", ratio, "x")
    R.fig("contention.retries_per_append", retries, "rounds")
    R.fig("contention.gets_per_append", gets / len(committed) if committed else float("nan"), "requests")
    R.fig("contention.lost", len(lost), "appends")
    R.fig("contention.errors", sum(errors.values()), "appends")
    R.fig("contention.acked", len(acked), "appends")
    lat = summarize([x for run in store_runs for r in run for x in r["latency"]])
    R.fig("contention.store.p50_ms", lat["p50"], "ms")
    R.fig("contention.store.p99_ms", lat["p99"], "ms")
    R.details["contention"] = {
        "writers": p.writers,
        "acked": len(acked),
        "committed_after_deadline": len(committed) - len(acked),
        "lost_ids": lost[:20],
        "errors": errors,
        "object_requests": {"put": puts, "get": gets},
        "store_latency_ms": lat,
        "floor_put_latency_ms": summarize([x for r in floor_runs for x in r["latency"]]),
    }
    t = R.target("contention >= 0.7x floor", "contention.ratio", ">=", 0.7)
    R.target("contention: zero lost", "contention.lost", "<=", 0)
    R.row(
        "contention (no expected tail)",
        f"P={p.writers} on one session: rate; retries/append; lost",
        f"{fmt_rate(store_rate)}; {retries:.2f} retries; {len(lost)} lost",
        f"{fmt_rate(floor_rate)} (1/PUT)",
        fmt_ratio(ratio),
        target=t,
    )
