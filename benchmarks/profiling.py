"""``--profile``: where an append and a resume spend their time beyond the floor.

Three views, written to ``<out>/profile-*.txt`` and into the JSON (``details.profile``):

- cProfile of many single-entry appends, and of resumes (every thread: the store's read pool
  is profiled too), with self time grouped by component (network wait, botocore, redis-py,
  store, coordination, tenacity, orjson, ...);
- client CPU per operation (``time.process_time``), store append against its floor;
- micro-costs of individual steps on the hot paths, each the median of many calls.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from benchmarks.backends import RedisRoundTrip
from benchmarks.context import Context
from benchmarks.stats import median
from benchmarks.workload import chain, encode

_WAIT_NAMES = ("recv", "send", "poll", "select", "connect", "'acquire'", "wait", "sleep")


def _component(filename: str, func: str) -> str:
    f = filename.replace("\\", "/")
    if f == "~":
        if "SimpleQueue" in func:
            return "idle pool threads"
        if "orjson" in func:
            return "orjson"
        if "_hashlib" in func or "sha256" in func or "blake2" in func or "hmac" in func:
            return "hashing"
        if any(w in func for w in _WAIT_NAMES):
            return "waiting (network, locks)"
        return "builtins (other)"
    for needle, name in (
        ("/botocore/", "botocore / boto3"),
        ("/boto3/", "botocore / boto3"),
        ("/urllib3/", "urllib3 / http.client"),
        ("/http/client.py", "urllib3 / http.client"),
        ("/email/", "urllib3 / http.client"),
        ("/dateutil/", "botocore / boto3"),
        ("/redis/", "redis-py"),
        ("/tenacity/", "tenacity (retry)"),
        ("/coordination/", "coordination/ (ours)"),
        ("/store/model/", "store/model/ (context)"),
        ("/store/", "store/ (ours)"),
        ("/concurrent/", "threads / futures"),
        ("threading.py", "threads / futures"),
        ("/queue.py", "threads / futures"),
        ("/benchmarks/", "benchmark harness"),
    ):
        if needle in f:
            return name
    return "python stdlib / other"


def _breakdown(stats: pstats.Stats, per: int) -> dict[str, float]:
    """Self time per component, in ms per operation."""
    out: dict[str, float] = defaultdict(float)
    for (filename, _line, func), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        out[_component(filename, func)] += tt
    out.pop("idle pool threads", None)
    return {k: round(v * 1000 / per, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def _text(stats: pstats.Stats, title: str, breakdown: dict[str, float], per_label: str) -> str:
    buf = io.StringIO()
    buf.write(f"# {title}\n\nself time by component, ms per {per_label}:\n")
    for k, v in breakdown.items():
        buf.write(f"  {v:9.3f}  {k}\n")
    buf.write("\n")
    stats.stream = buf  # type: ignore[attr-defined]
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(25)
    return buf.getvalue()


class _AllThreads:
    """cProfile in the calling thread and in every thread started while active."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self._lock = threading.Lock()

    def _hook(self, frame: Any, event: str, arg: Any) -> None:
        sys.setprofile(None)
        pr = cProfile.Profile()
        with self._lock:
            self.profiles.append(pr)
        pr.enable()

    def __enter__(self) -> "_AllThreads":
        threading.setprofile(self._hook)
        self.main = cProfile.Profile()
        self.main.enable()
        return self

    def __exit__(self, *exc: object) -> None:
        self.main.disable()
        threading.setprofile(None)

    def stats(self) -> pstats.Stats:
        st = pstats.Stats(self.main)
        for pr in self.profiles:
            try:
                st.add(pr)
            except TypeError:  # a profile that recorded nothing
                pass
        return st


def _median_us(fn: Callable[[], object], n: int) -> float:
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return median(xs) * 1e6


def run(ctx: Context, out_dir: Path) -> None:
    b, p, R = ctx.backend, ctx.params, ctx.results
    smoke = p.profile == "smoke"
    out_dir.mkdir(parents=True, exist_ok=True)
    n_app = 10 if smoke else 100
    report: dict[str, Any] = {}
    st = b.store()
    raw = b.raw()
    rc = b.redis_client()
    rtt = RedisRoundTrip(rc, f"{b.redis_prefix}:bench:rtt")

    # --- appends ----------------------------------------------------------------------------
    ctx.log(f"profile: {n_app} appends under cProfile")
    sid = f"prof-append-{ctx.run_id}"
    st.create_session(sid)
    entries = chain("p", 0, 3 * n_app + 10, None)
    for e in entries[:5]:
        st.append_session_entries(sid, [e])
    pr = cProfile.Profile()
    pr.enable()
    for e in entries[5 : 5 + n_app]:
        st.append_session_entries(sid, [e])
    pr.disable()
    stats = pstats.Stats(pr)
    bd = _breakdown(stats, n_app)
    report["append_breakdown_ms"] = bd
    (out_dir / "profile-append.txt").write_text(_text(stats, f"{n_app} appends of 1 entry", bd, "append"))

    # Client CPU per operation, store against floor.
    bodies = [encode([e]) for e in entries]
    c0 = time.process_time()
    for e in entries[5 + n_app : 5 + 2 * n_app]:
        st.append_session_entries(sid, [e])
    c1 = time.process_time()
    for i in range(n_app):
        raw.put(f"profile/{ctx.run_id}/{i}", bodies[i])
        rtt()
    c2 = time.process_time()
    report["cpu_ms_per_append"] = round((c1 - c0) * 1000 / n_app, 3)
    report["cpu_ms_per_floor_op"] = round((c2 - c1) * 1000 / n_app, 3)
    R.fig("profile.cpu_ms_per_append", report["cpu_ms_per_append"], "ms")
    R.fig("profile.cpu_ms_per_floor_op", report["cpu_ms_per_floor_op"], "ms")

    # --- resume -----------------------------------------------------------------------------
    if ctx.sessions:
        n = max(ctx.sessions)
        info = ctx.sessions[n]
        reps = 2 if smoke or n >= 100_000 else 3
        ctx.log(f"profile: {reps} resumes of {n} entries under cProfile (all threads)")
        from store.model.session import Session

        reader = b.store()  # a fresh read pool, started under the profiler
        with _AllThreads() as prof:
            for _ in range(reps):
                data = reader.read_session(info["sid"])
                Session(data.header.pi_header, data.all_entries, validated=True).build_context()
        rstats = prof.stats()
        rbd = _breakdown(rstats, reps)
        report["resume_size"] = n
        report["resume_breakdown_ms"] = rbd
        (out_dir / "profile-resume.txt").write_text(
            _text(rstats, f"{reps} resumes of {n} entries (all threads; pool threads overlap)", rbd, "resume")
        )

    # --- micro-costs of steps on the hot paths ---------------------------------------------
    ctx.log("profile: micro-costs")
    from store.formats import entries as entries_mod
    from store.protocol.read import check_unique_ids
    from store.retry import DEFAULT_RETRY
    from store.model.session import Session

    micro: dict[str, float] = {}
    one = entries[0]
    k = 200 if smoke else 2000
    micro["retry_policy_call_overhead_us"] = _median_us(lambda: DEFAULT_RETRY.call(lambda: None), k) - _median_us(lambda: (lambda: None)(), k)
    micro["prepare_batch_1_entry_us"] = _median_us(lambda: entries_mod.prepare_batch([one]), k)
    micro["entry_hash_1kb_us"] = _median_us(lambda: entries_mod.entry_hash(one), k)
    if hasattr(entries_mod, "_check_finite"):
        micro["check_finite_1kb_us"] = _median_us(lambda: entries_mod._check_finite(one, 0, "x"), k)
    import orjson

    micro["orjson_dumps_1kb_us"] = _median_us(lambda: orjson.dumps(one), k)
    kr = 50 if smoke else 300
    micro["redis_rtt_floor_us"] = _median_us(rtt, kr)
    # The job marker is set once the threshold is crossed and no compactor took the job:
    # from then on every append repeats this SET NX.
    st.coord.enqueue_compaction(sid, reason="bench")
    micro["redis_enqueue_compaction_pending_us"] = _median_us(lambda: st.coord.enqueue_compaction(sid, reason="bench"), kr)
    micro["redis_tail_hmget_us"] = _median_us(lambda: st.coord.tail(sid), kr)
    header_key = st.layout.header(sid)
    inc = st.get_header(sid).incarnation
    kg = 10 if smoke else 40
    micro["s3_get_header_ms"] = _median_us(lambda: st.objects.get(header_key), kg) / 1000
    micro["s3_list_manifests_ms"] = _median_us(lambda: list(st.objects.list(st.layout.manifest_prefix(sid, inc))), kg) / 1000

    def probe() -> None:
        try:
            st.objects.get(st.layout.segment(sid, inc, 10**9))
        except Exception:
            pass

    micro["s3_probe_404_ms"] = _median_us(probe, kg) / 1000
    micro["s3_put_floor_ms"] = _median_us(lambda: raw.put(f"profile/{ctx.run_id}/m{time.perf_counter_ns()}", bodies[0]), kg) / 1000
    big_n = 2000 if smoke else 10_000
    big = chain("m", 0, big_n, None)
    blob = encode(big)
    import hashlib

    sha = hashlib.sha256(blob).hexdigest()
    km = 3 if smoke else 7
    micro[f"decode_segment_{big_n}_ms"] = _median_us(lambda: entries_mod.decode_segment("k", blob, sha), km) / 1000
    micro[f"per_line_orjson_{big_n}_ms"] = _median_us(lambda: [orjson.loads(x) for x in blob.splitlines()], km) / 1000
    micro[f"check_unique_ids_{big_n}_ms"] = _median_us(lambda: check_unique_ids("s", [], big), km) / 1000
    header = {"type": "session", "version": 3, "id": "m", "timestamp": "2026-01-01T00:00:00.000Z", "cwd": "/"}
    micro[f"session_init_{big_n}_ms"] = _median_us(lambda: Session(header, big), km) / 1000
    micro[f"session_init_validated_{big_n}_ms"] = _median_us(lambda: Session(header, big, validated=True), km) / 1000
    sess = Session(header, big)
    micro[f"build_context_only_{big_n}_ms"] = _median_us(sess.build_context, km) / 1000
    # What one full collection costs while a resumed session of that size is alive (parsing
    # it allocates ~30 objects per entry; every so often that triggers one).
    import gc

    micro[f"gc_full_collection_with_{big_n}_loaded_ms"] = _median_us(gc.collect, 3) / 1000
    micro["gc_tracked_objects"] = float(len(gc.get_objects()))
    report["micro"] = {k2: round(v, 3) for k2, v in micro.items()}
    for k2, v in micro.items():
        R.fig(f"profile.{k2}", v)
    R.details["profile"] = report
    lines = [f"{k2:45s} {v:10.3f}" for k2, v in micro.items()]
    (out_dir / "profile-micro.txt").write_text(
        "micro-costs (median of many calls; *_us microseconds, *_ms milliseconds)\n"
        + "\n".join(lines)
        + f"\n\nclient CPU per append {report['cpu_ms_per_append']} ms, per floor op {report['cpu_ms_per_floor_op']} ms\n"
    )
    rc.close()
    raw.close()
