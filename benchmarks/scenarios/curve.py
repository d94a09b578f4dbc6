"""Append cost against session size: the store, its floor, and the naive JSON-blob baseline.

The naive baseline is what a store that keeps a session as one JSON document does on every
append: GET the document, parse it, add the entry, serialise it, PUT it back (with If-Match on
the ETag, the compare-and-swap two writers would need). Its cost grows with the session, O(n);
the store's append writes one small segment whatever the session's size, O(1).

At each size, one store append, one naive append and one floor operation (PUT of the same
bytes + one Redis round trip) run per round, in a random order. The naive baseline's resume
(GET + parse of the document + the same ``build_context`` the store does) is measured too.
"""

from __future__ import annotations

import gc
import random
import time
from typing import Any

import orjson

from benchmarks.backends import RawObjects, RedisRoundTrip
from benchmarks.context import Context
from benchmarks.results import fmt_ms
from benchmarks.stats import median
from benchmarks.workload import chain, encode
from store.model.session import Session


class NaiveBlobStore:
    """A session as one JSON object ``{"header": ..., "entries": [...]}``, rewritten per append."""

    def __init__(self, raw: RawObjects) -> None:
        self.raw = raw

    def seed(self, key: str, header: dict[str, Any], entries: list[dict[str, Any]]) -> None:
        self.raw.put_replace(key, orjson.dumps({"header": header, "entries": entries}), None)

    def append(self, key: str, entries: list[dict[str, Any]]) -> None:
        data, etag = self.raw.get_with_etag(key)
        doc = orjson.loads(data)
        doc["entries"].extend(entries)
        self.raw.put_replace(key, orjson.dumps(doc), etag)

    def load(self, key: str) -> dict[str, Any]:
        doc: dict[str, Any] = orjson.loads(self.raw.get(key))
        return doc


def run(ctx: Context) -> None:
    b, p, R = ctx.backend, ctx.params, ctx.results
    st = b.store()
    raw = b.raw()
    rc = b.redis_client()
    rtt = RedisRoundTrip(rc, f"{b.redis_prefix}:bench:rtt")
    naive = NaiveBlobStore(raw)
    rng = random.Random(p.seed)
    details: dict[str, Any] = {}
    header = {"type": "session", "version": 3, "id": "naive", "timestamp": "2026-01-01T00:00:00.000Z", "cwd": "/bench"}
    try:
        for n in p.curve_sizes:
            if n in ctx.sessions:
                sid, last, tag = ctx.sessions[n]["sid"], ctx.sessions[n]["last"], ctx.sessions[n]["tag"]
            else:
                sid, tag, last = f"curve-{n}-{ctx.run_id}", "r", None
                st.create_session(sid)
                for start in range(0, n, 10):
                    batch = chain(tag, start, min(10, n - start), last)
                    st.append_session_entries(sid, batch)
                    last = batch[-1]["id"]
            base = chain(tag, 0, n, None)
            nkey = f"naive/{ctx.run_id}/{n}.json"
            naive.seed(nkey, header, base)
            naive_last = base[-1]["id"]
            del base
            k = p.curve_appends if n <= 1_000 else p.curve_appends_large if n <= 10_000 else 2
            samples: dict[str, list[float]] = {"store": [], "naive": [], "floor": [], "naive_resume": []}
            state = {"store_last": last, "naive_last": naive_last, "i": n}

            def store_op() -> float:
                e = chain(tag, state["i"], 1, state["store_last"])
                t0 = time.perf_counter()
                st.append_session_entries(sid, e)
                dt = time.perf_counter() - t0
                state["store_last"] = e[0]["id"]
                return dt

            def naive_op() -> float:
                e = chain(tag, state["i"], 1, state["naive_last"])
                t0 = time.perf_counter()
                naive.append(nkey, e)
                dt = time.perf_counter() - t0
                state["naive_last"] = e[0]["id"]
                return dt

            def floor_op() -> float:
                body = encode(chain(tag, state["i"], 1, state["store_last"]))
                t0 = time.perf_counter()
                raw.put(f"curve/{ctx.run_id}/{n}/{state['i']}", body)
                rtt()
                return time.perf_counter() - t0

            def naive_resume_op() -> float:
                t0 = time.perf_counter()
                doc = naive.load(nkey)
                Session(doc["header"], doc["entries"]).build_context()
                return time.perf_counter() - t0

            ops = {"store": store_op, "naive": naive_op, "floor": floor_op, "naive_resume": naive_resume_op}
            ctx.log(f"curve {n}: {k} rounds of store / naive / floor")
            for r in range(k + 1):  # round 0 warms up and is dropped
                order = list(ops)
                rng.shuffle(order)
                for name in order:
                    gc.collect()  # as in the resume scenario: nobody pays for the other's garbage
                    dt = ops[name]()
                    if r > 0:
                        samples[name].append(dt)
                state["i"] += 1
            pre = f"curve.{n}"
            m = {name: median(xs) * 1000 for name, xs in samples.items()}
            R.fig(f"{pre}.store_append_ms", m["store"], "ms")
            R.fig(f"{pre}.naive_append_ms", m["naive"], "ms")
            R.fig(f"{pre}.floor_ms", m["floor"], "ms")
            R.fig(f"{pre}.naive_resume_ms", m["naive_resume"], "ms")
            R.fig(f"{pre}.store_ratio", m["store"] / m["floor"], "x")
            R.fig(f"{pre}.naive_ratio", m["naive"] / m["floor"], "x")
            details[str(n)] = {"samples_ms": {k2: [x * 1000 for x in v] for k2, v in samples.items()}}
            R.row(
                "append cost vs session size",
                f"append 1 entry at {n:,} entries: store (naive blob)",
                f"{fmt_ms(m['store'])} (naive {fmt_ms(m['naive'])})",
                fmt_ms(m["floor"]),
                f"store {m['store'] / m['floor']:.2f}x, naive {m['naive'] / m['floor']:.1f}x",
            )
    finally:
        rc.close()
        raw.close()
    R.details["curve"] = details
