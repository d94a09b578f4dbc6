"""The cost of encryption at rest (docs/encryption.md), as ratios measured in the same run.

Two stores on the same backend, one plain and one with a local keyring (``LocalKeyFile``),
interleaved so that noise hits both alike:

- append (part of the ``append`` scenario): one ~1 KB entry, open loop, one slot per side
  each round in a random order; the ratio of the p50s (encrypted over plain).
- resume (part of the ``resume`` scenario): a session of ``encryption_resume_size`` entries
  built as segments of 10, read by ``read_session`` (a fresh store each time, so the data
  key is unwrapped as a resume in a new process would: one GET of the key record more),
  uncompacted and then compacted, ABBA; the ratio of the medians.

Skipped, with a note, without the ``cryptography`` package.
"""

from __future__ import annotations

import gc
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.context import Context
from benchmarks.results import fmt_ms, fmt_ratio
from benchmarks.stats import median, open_loop, summarize
from benchmarks.workload import chain


def _provider(ctx: Context) -> Any | None:
    try:
        import cryptography  # noqa: F401
    except ImportError:
        ctx.results.notes.append("encryption not measured: the 'cryptography' package is missing")
        return None
    from store.formats.crypto import LocalKeyFile, create_keyring

    path = Path(tempfile.mkdtemp(prefix="sessionstore-bench-keys-")) / "keyring.json"
    create_keyring(path)
    return LocalKeyFile(path)


def append_cost(ctx: Context) -> None:
    b, p, R = ctx.backend, ctx.params, ctx.results
    provider = _provider(ctx)
    if provider is None:
        return
    plain, enc = b.store(), b.store(key_provider=provider)
    rounds = p.append_rounds
    total = p.append_warmup + rounds
    sids = {}
    batches = {}
    for name, st in (("plain", plain), ("encrypted", enc)):
        sid = f"enc-append-{name}-{ctx.run_id}"
        st.create_session(sid)
        sids[name] = sid
        entries = chain(f"x{name[0]}", 0, total, None)
        batches[name] = [[e] for e in entries]
    warm: dict[str, list[float]] = {"plain": [], "encrypted": []}
    for i in range(p.append_warmup):
        for name, st in (("plain", plain), ("encrypted", enc)):
            t0 = time.perf_counter()
            st.append_session_entries(sids[name], batches[name][i])
            warm[name].append(time.perf_counter() - t0)
    interval = p.open_loop_slack * (median(warm["plain"]) + median(warm["encrypted"])) / 2
    n0 = p.append_warmup

    def op(name: str, st: Any) -> Any:
        return lambda r: st.append_session_entries(sids[name], batches[name][n0 + r])

    ctx.log(f"append, encrypted vs plain: {rounds} rounds, open loop every {interval * 1000:.1f} ms")
    res = open_loop({"plain": op("plain", plain), "encrypted": op("encrypted", enc)}, rounds, interval,
                    seed=p.seed + 7)
    ps, es = summarize(res.latency["plain"]), summarize(res.latency["encrypted"])
    pre = "append.b1.encryption"
    R.fig(f"{pre}.plain_p50_ms", ps["p50"], "ms")
    R.fig(f"{pre}.encrypted_p50_ms", es["p50"], "ms")
    R.fig(f"{pre}.plain_p99_ms", ps["p99"], "ms")
    R.fig(f"{pre}.encrypted_p99_ms", es["p99"], "ms")
    R.fig(f"{pre}.ratio_p50", es["p50"] / ps["p50"], "x")
    R.fig(f"{pre}.ratio_p99", es["p99"] / ps["p99"], "x")
    R.row(
        "encryption at rest",
        "append 1 entry: p50 / p99, encrypted vs plain",
        f"{fmt_ms(es['p50'])} / {fmt_ms(es['p99'])}",
        f"{fmt_ms(ps['p50'])} / {fmt_ms(ps['p99'])}",
        f"p50 {fmt_ratio(es['p50'] / ps['p50'])}",
    )


def resume_cost(ctx: Context) -> None:
    b, p, R = ctx.backend, ctx.params, ctx.results
    provider = _provider(ctx)
    if provider is None:
        return
    n = p.encryption_resume_size
    stores = {"plain": b.store(), "encrypted": b.store(key_provider=provider)}
    sids = {}
    for name, st in stores.items():
        sid = f"enc-resume-{name}-{ctx.run_id}"
        st.create_session(sid)
        parent = None
        for start in range(0, n, 10):
            batch = chain(f"r{name[0]}", start, min(10, n - start), parent)
            st.append_session_entries(sid, batch)
            parent = batch[-1]["id"]
        sids[name] = sid

    def timed(name: str) -> float:
        from store.core import SessionStore

        options: dict[str, Any] = {"redis_prefix": b.redis_prefix}
        if name == "encrypted":
            options["key_provider"] = provider
        fresh = SessionStore.from_url(b.objects_url, b.redis_url, **options)
        try:
            gc.collect()
            t0 = time.perf_counter()
            data = fresh.read_session(sids[name])
            took = time.perf_counter() - t0
            assert len(data.all_entries) == n
            return took
        finally:
            fresh.close()

    for state in ("uncompacted", "compacted"):
        if state == "compacted":
            from compactor import Compactor

            for name, st in stores.items():
                Compactor(st).compact_session(sids[name])
        times: dict[str, list[float]] = {"plain": [], "encrypted": []}
        timed("plain"), timed("encrypted")  # warm the connections
        for r in range(p.encryption_resume_reps):
            order = ("plain", "encrypted") if r % 2 == 0 else ("encrypted", "plain")
            for name in order:
                times[name].append(timed(name))
        pm, em = median(times["plain"]) * 1000, median(times["encrypted"]) * 1000
        pre = f"resume.{n}.{state}.encryption"
        R.fig(f"{pre}.plain_ms", pm, "ms")
        R.fig(f"{pre}.encrypted_ms", em, "ms")
        R.fig(f"{pre}.ratio", em / pm, "x")
        R.row(
            "encryption at rest",
            f"resume {n:,} entries {state} (fresh process): encrypted vs plain",
            fmt_ms(em),
            fmt_ms(pm),
            fmt_ratio(em / pm),
        )
