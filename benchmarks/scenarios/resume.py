"""Resume: load a session and build its context, against one GET of the same bytes + parse.

Sessions are built once through the real append path, in the realistic shape (many small
segments: e.g. 1,000 segments of 10 entries for 10k entries), and reused: resume uncompacted,
then the compaction scenario compacts them, then resume compacted, then the size curve appends
to them.

Store side, exactly what ``SessionStore.load_session(sid).build_context()`` does:
``read_session`` (header, manifest, Redis hint, segments in parallel, probe past the tail,
verify) then ``Session(pi_header, entries, validated=True).build_context()`` (the store's
entries were validated on append, so ``load_session`` skips the per-entry checks); both
parts are timed.
Floor: ``GET`` of one object holding the session's JSONL bytes, then ``orjson.loads`` of every
line.

Each timed operation starts after a ``gc.collect()``: parsing 10k entries creates ~300k
objects, and the full collection that this sometimes triggers (100-200 ms on this machine)
would otherwise land on whichever side happens to cross the threshold, store or floor.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import Counter
from typing import Any

import orjson

from benchmarks.context import Context
from benchmarks.results import fmt_ms, fmt_ratio
from benchmarks.stats import median
from benchmarks.workload import chain, encode
from store.model.session import Session


def setup(ctx: Context) -> None:
    """Build one session per resume size, each in its own thread."""
    b, p = ctx.backend, ctx.params
    st = b.store()
    raw = b.raw()
    errors: list[BaseException] = []

    def build(n: int) -> None:
        try:
            per = p.resume_segment.get(n, 10)
            sid = f"resume-{n}-{ctx.run_id}"
            tag = "r"
            st.create_session(sid)
            parent: str | None = None
            blob: list[bytes] = []
            for start in range(0, n, per):
                batch = chain(tag, start, min(per, n - start), parent)
                st.append_session_entries(sid, batch)
                parent = batch[-1]["id"]
                blob.append(encode(batch))
            data = b"".join(blob)
            key = f"resume/{ctx.run_id}/{n}.jsonl"
            raw.put(key, data)
            ctx.sessions[n] = {
                "sid": sid,
                "tag": tag,
                "n": n,
                "segments": (n + per - 1) // per,
                "per_segment": per,
                "floor_key": key,
                "bytes": len(data),
                "last": parent,
            }
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t0 = time.perf_counter()
    desc = ", ".join(f"{n} entries as {n // p.resume_segment.get(n, 10)} segments" for n in p.resume_sizes)
    ctx.log(f"resume: building sessions ({desc})")
    threads = [threading.Thread(target=build, args=(n,)) for n in p.resume_sizes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    raw.close()
    if errors:
        raise errors[0]
    ctx.results.timings["resume_setup"] = time.perf_counter() - t0


def measure(ctx: Context, state: str) -> None:
    """``state``: "uncompacted" or "compacted" (what the sessions are now)."""
    b, p, R = ctx.backend, ctx.params, ctx.results
    st = b.store()
    raw = b.raw()
    details = R.details.setdefault("resume", {})
    warm = False
    try:
        for n in p.resume_sizes:
            info = ctx.sessions[n]
            sid, key = info["sid"], info["floor_key"]
            reps = (p.resume_reps if state == "uncompacted" else p.compacted_reps).get(n, 3)
            store_t: list[tuple[float, float]] = []
            floor_t: list[tuple[float, float]] = []
            counts: list[int] = []

            def store_op() -> None:
                gc.collect()  # see the module doc: no side pays for the other's garbage
                t0 = time.perf_counter()
                data = st.read_session(sid)
                t1 = time.perf_counter()
                Session(data.header.pi_header, data.all_entries, validated=True).build_context()
                t2 = time.perf_counter()
                store_t.append((t1 - t0, t2 - t1))
                counts.append(len(data.all_entries))

            def floor_op() -> None:
                gc.collect()
                t0 = time.perf_counter()
                blob = raw.get(key)
                t1 = time.perf_counter()
                [orjson.loads(line) for line in blob.splitlines()]
                t2 = time.perf_counter()
                floor_t.append((t1 - t0, t2 - t1))

            if not warm:
                # Warm the connections of both sides once, on the smallest session.
                store_op()
                floor_op()
                store_t.clear()
                floor_t.clear()
                counts.clear()
                warm = True
            ctx.log(f"resume {state} {n}: {reps} reps")
            requests: Counter[str] = Counter()
            for r in range(reps):
                ops = [store_op, floor_op] if r % 2 == 0 else [floor_op, store_op]
                for op in ops:
                    before = Counter(st.objects.requests)
                    op()
                    if r == 0 and op is store_op:  # the requests of one resume
                        requests = Counter(st.objects.requests)
                        requests.subtract(before)
            if any(c != n for c in counts):
                raise AssertionError(f"resume of {sid} returned {counts} entries, expected {n}")
            s_total = [a + c for a, c in store_t]
            f_total = [a + c for a, c in floor_t]
            pre = f"resume.{n}.{state}"
            sm, fm = median(s_total) * 1000, median(f_total) * 1000
            R.fig(f"{pre}.store_ms", sm, "ms")
            R.fig(f"{pre}.store_load_ms", median([a for a, _ in store_t]) * 1000, "ms")
            R.fig(f"{pre}.store_context_ms", median([c for _, c in store_t]) * 1000, "ms")
            R.fig(f"{pre}.floor_ms", fm, "ms")
            R.fig(f"{pre}.floor_get_ms", median([a for a, _ in floor_t]) * 1000, "ms")
            R.fig(f"{pre}.floor_parse_ms", median([c for _, c in floor_t]) * 1000, "ms")
            R.fig(f"{pre}.ratio", sm / fm, "x")
            # The load alone against the floor (both read and parse the same bytes; the
            # context is the model's work, which no floor does: reported beside it).
            R.fig(f"{pre}.load_ratio", R.figures[f"{pre}.store_load_ms"] / fm, "x")
            R.fig(f"{pre}.context_vs_parse", R.figures[f"{pre}.store_context_ms"] / R.figures[f"{pre}.floor_parse_ms"], "x")
            R.fig(f"{pre}.object_requests", sum(v for v in requests.values() if v > 0), "requests")
            details[f"{n}.{state}"] = {
                "sid": sid,
                "segments": info["segments"] if state == "uncompacted" else None,
                "bytes": info["bytes"],
                "reps": reps,
                "store_s": store_t,
                "floor_s": f_total,
                "object_requests": {k: v for k, v in requests.items() if v},
            }
            target = None
            if state == "compacted" and n == 10_000:
                target = R.target("resume compacted 10k: load <= 1.2x floor", f"{pre}.load_ratio", "<=", 1.2)
                R.target("resume compacted 10k: build_context <= the floor's parse", f"{pre}.context_vs_parse", "<=", 1.0)
            shape = (
                f"{info['segments']} segments of {info['per_segment']}"
                if state == "uncompacted"
                else "compacted"
            )
            R.row(
                "resume (load + build_context)",
                f"{n:,} entries, {info['bytes'] / 2**20:.1f} MiB, {shape}",
                f"{fmt_ms(sm)} (load {fmt_ms(R.figures[pre + '.store_load_ms'])} + ctx {fmt_ms(R.figures[pre + '.store_context_ms'])})",
                f"{fmt_ms(fm)} (GET {fmt_ms(R.figures[pre + '.floor_get_ms'])} + parse {fmt_ms(R.figures[pre + '.floor_parse_ms'])})",
                f"{fmt_ratio(sm / fm)} (load {fmt_ratio(R.figures[pre + '.load_ratio'])})",
                target=target,
            )
    finally:
        raw.close()


def sessions_info(ctx: Context) -> dict[str, Any]:
    return {str(n): {k: v for k, v in info.items()} for n, info in ctx.sessions.items()}


def tail(ctx: Context) -> None:
    """Resume of a live session whose tail is not compacted yet (8 and 64 segments of 10
    entries: a live session always has such a tail, up to the compaction threshold of 64),
    against the floor of one GET of the same bytes + parse (the store's side also builds the
    context, as in the rows above). The store reads the tail from
    Redis's recent-segments cache in the round trip that reads the tail, probes the slot
    after it and confirms the end in Redis."""
    b, p, R = ctx.backend, ctx.params, ctx.results
    st = b.store()
    raw = b.raw()
    details = R.details.setdefault("resume_tail", {})
    try:
        for segs in p.tail_segments:
            sid = f"tail-{segs}-{ctx.run_id}"
            st.create_session(sid)
            parent: str | None = None
            blob: list[bytes] = []
            for s in range(segs):
                batch = chain("t", s * 10, 10, parent)
                st.append_session_entries(sid, batch)
                parent = batch[-1]["id"]
                blob.append(encode(batch))
            data = b"".join(blob)
            key = f"resume/{ctx.run_id}/tail-{segs}.jsonl"
            raw.put(key, data)
            n = segs * 10
            store_t: list[float] = []
            floor_t: list[float] = []
            requests: Counter[str] = Counter()

            def store_op() -> None:
                gc.collect()
                t0 = time.perf_counter()
                got = st.read_session(sid)
                Session(got.header.pi_header, got.all_entries, validated=True).build_context()
                store_t.append(time.perf_counter() - t0)
                if len(got.all_entries) != n:
                    raise AssertionError(f"resume of {sid}: {len(got.all_entries)} entries, expected {n}")

            def floor_op() -> None:
                gc.collect()
                t0 = time.perf_counter()
                [orjson.loads(line) for line in raw.get(key).splitlines()]
                floor_t.append(time.perf_counter() - t0)

            store_op(), floor_op()  # warm both sides' connections and caches
            store_t.clear(), floor_t.clear()
            reps = p.tail_reps
            ctx.log(f"resume tail of {segs} segments: {reps} reps")
            for r in range(reps):
                for op in ([store_op, floor_op] if r % 2 == 0 else [floor_op, store_op]):
                    before = Counter(st.objects.requests)
                    op()
                    if r == 0 and op is store_op:
                        requests = Counter(st.objects.requests)
                        requests.subtract(before)
            sm, fm = median(store_t) * 1000, median(floor_t) * 1000
            pre = f"resume.tail{segs}"
            R.fig(f"{pre}.store_ms", sm, "ms")
            R.fig(f"{pre}.floor_ms", fm, "ms")
            R.fig(f"{pre}.ratio", sm / fm, "x")
            R.fig(f"{pre}.object_requests", sum(v for v in requests.values() if v > 0), "requests")
            details[str(segs)] = {"store_s": store_t, "floor_s": floor_t,
                                  "object_requests": {k: v for k, v in requests.items() if v}}
            target = None
            if segs == 64:
                target = R.target("resume with a 64-segment tail <= 2x floor", f"{pre}.ratio", "<=", 2.0)
            R.row(
                "resume (load + build_context)",
                f"{n:,} entries in an uncompacted tail of {segs} segments, {len(data) / 1024:.0f} KiB",
                f"{fmt_ms(sm)} ({requests['get']} GET, {requests['list']} LIST)",
                f"{fmt_ms(fm)} (GET + parse)",
                fmt_ratio(sm / fm),
                target=target,
            )
    finally:
        raw.close()
