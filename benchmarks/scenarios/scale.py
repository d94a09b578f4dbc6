"""Scale: what one operation costs as the number of sessions at rest grows 10x. Counted, not timed.

Nothing here is a time. Object-store requests come from the store's own request counters
(``ObjectStore.requests``: one count per S3 request, by verb), Redis round trips from a
counter on the coordinator's client (``RedisCallCounter``: a pipeline or a script call is
one), Redis commands from ``INFO commandstats`` deltas (server side: commands a script runs
count too), Redis bytes from ``MEMORY USAGE <key> SAMPLES 0`` of every key of a session.

For each population N (each 10x the one before; the populations are cumulative, the same
store grows):

1. **Seed** the sessions at rest up to N, outside every count: ``create_session`` then one
   ``append_session_entries`` of 2 entries (a user message and an assistant reply, ~2 KB) per
   session, 32 threads at a time, through the store's own API, so the objects (a header and
   one segment) and the Redis state are real. They are never compacted (below the trigger).
2. **Writers**: ``active`` new sessions (created outside the counts), each appended
   ``appends`` single-entry batches (~1 KB), 16 threads. The writers' store compacts after
   ``appends`` pending segments (``compact_after_segments``), so every active session queues
   exactly one compaction job. Requests and Redis round trips per append.
3. **Compaction**: ``compactor.Worker.run(burst=True)`` on a store of its own drains the job
   queue. Requests per compacted session; bytes written (bases + manifests) per appended byte.
4. **GC**: ``GcScheduler.collect_due`` with a clock past the grace period: the schedule names
   only the sessions the compactions retired segments of. Requests per collected session, and
   the object requests that touched any other session (by the key's session, from
   ``Layout.parse``): the sessions at rest have nothing due and should cost 0.
5. **Resumes** by a fresh store (its start-up probe paid by a first read outside the count):
   ``read_session`` of a sample of sessions at rest (uncompacted: one segment) and of the
   active sessions (compacted and collected). Requests and round trips per resume.
6. **Redis bytes** of a sample of sessions at rest, and of the compacted active sessions:
   every key of the session (found by one ``SCAN`` of the run's prefix), ``MEMORY USAGE``.
   Also ``used_memory`` grown per seeded session (``INFO memory``), which includes Redis's
   own per-key overhead.

The last population's figure over the first's is reported for each (flat: about 1.0x).
Besides, at the largest population, one visit of the sweep (``Compactor.gc_session``) to a
sample of sessions at rest: what the daily sweep costs per session (it visits them all). And
one longer session (``scale_long_entries`` entries, appended 100 at a time): the MEMORY USAGE
of its keys before and after its compaction, and of its ids hash per entry.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from benchmarks.backends import RedisCallCounter, redis_commandstats
from benchmarks.context import Context
from benchmarks.workload import chain

#: The object-store verbs counted (``ObjectStore.requests`` keys).
VERBS = ("put", "get", "head", "list", "delete")
#: The idle expiry of the sessions at rest (ms; StoreOptions.idle_state_ttl_ms, an hour by
#: default) and of the longer session, short so that the run measures them as they rest.
IDLE_MS = 3_000
LONG_IDLE_MS = 10_000

#: Per population: (figure suffix, label, how it is printed).
METRICS: list[tuple[str, str]] = [
    ("append.object_requests", "object requests per append"),
    ("append.puts", "PUTs per append"),
    ("append.redis_round_trips", "Redis round trips per append"),
    ("append.redis_commands", "Redis commands per append (server side)"),
    ("resume.uncompacted.object_requests", "object requests per resume, at rest (1 segment)"),
    ("resume.uncompacted.redis_round_trips", "Redis round trips per resume, at rest"),
    ("resume.compacted.object_requests", "object requests per resume, compacted"),
    ("resume.compacted.redis_round_trips", "Redis round trips per resume, compacted"),
    ("compaction.object_requests", "object requests per compacted session"),
    ("gc.object_requests", "object requests per collected session"),
    ("gc.redis_round_trips", "Redis round trips per collected session"),
    ("gc.idle_object_requests", "GC object requests for sessions at rest (nothing due)"),
    ("gc.empty_pass_object_requests", "object requests of a GC pass with nothing due"),
    ("gc.empty_pass_redis_round_trips", "Redis round trips of a GC pass with nothing due"),
    ("redis.bytes_per_idle_session", "Redis bytes per session at rest (MEMORY USAGE)"),
    ("redis.keys_per_idle_session", "Redis keys per session at rest"),
    ("redis.bytes_per_compacted_session", "Redis bytes per compacted session (after GC)"),
    ("written_per_appended", "bytes written (bases + manifests) per byte appended"),
]


def expected_figures(params: dict[str, Any]) -> list[str]:
    pops = list(params["scale_populations"])
    names = [f"scale.{n}.{m}" for n in pops for m, _ in METRICS]
    names += [f"scale.{n}.{k}" for n in pops
              for k in ("sessions", "active", "appends", "redis.used_memory_per_session")]
    names += [f"scale.ratio.{m}" for m, _ in METRICS]
    names += ["scale.sweep.object_requests_per_session", "scale.sweep.redis_round_trips_per_session",
              "scale.long.uncompacted.redis_bytes", "scale.long.compacted.redis_bytes",
              "scale.long.idle.redis_bytes", "scale.long.ids_bytes_per_entry", "scale.long.entries"]
    return names


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)
            if after.get(k, 0) != before.get(k, 0)}


class KeyLog:
    """Records the session each object request names (a pass-through around one store's
    object methods; the requests themselves go to the server unchanged)."""

    def __init__(self, st: Any) -> None:
        self.sessions: Counter[str] = Counter()
        self.bytes_by_kind: Counter[str] = Counter()
        self._lock = threading.Lock()
        layout = st.layout
        objects = st.objects

        def note(key: str) -> None:
            parsed = layout.parse(key)
            with self._lock:
                self.sessions[parsed.session_id if parsed else "-"] += 1

        def wrap(name: str, key_of: Callable[..., list[str]]) -> None:
            original = getattr(objects, name)

            def call(*args: Any, **kwargs: Any) -> Any:
                for key in key_of(*args, **kwargs):
                    note(key)
                return original(*args, **kwargs)

            setattr(objects, name, call)

        def put_keys(key: str, data: bytes, *rest: Any, **kw: Any) -> list[str]:
            parsed = layout.parse(key)
            with self._lock:
                self.bytes_by_kind[parsed.kind if parsed else "other"] += len(data)
            return [key]

        wrap("put_if_absent", put_keys)
        wrap("get", lambda key, *a, **k: [key])
        wrap("head", lambda key, *a, **k: [key])
        wrap("list", lambda prefix, *a, **k: [prefix])
        wrap("list_dirs_page", lambda prefix, *a, **k: [prefix])
        wrap("delete", lambda key, *a, **k: [key])
        wrap("delete_many", lambda keys, *a, **k: list(keys)[:1])

    def clear(self) -> None:
        with self._lock:
            self.sessions.clear()
            self.bytes_by_kind.clear()


class Counted:
    """Object requests (by verb) and Redis round trips of one store, and the server's commands."""

    _counters: dict[int, RedisCallCounter] = {}

    def __init__(self, st: Any, rc: Any) -> None:
        self.st = st
        self.rc = rc
        # One counter per client: a second one would wrap the first and count twice.
        if id(st) not in Counted._counters:
            Counted._counters[id(st)] = RedisCallCounter(st.coord.client)
        self.calls = Counted._counters[id(st)]

    def __enter__(self) -> "Counted":
        self.req0 = dict(self.st.objects.requests)
        self.rt0 = self.calls.snapshot()
        self.cmd0 = redis_commandstats(self.rc)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.requests = _delta(dict(self.st.objects.requests), self.req0)
        self.round_trips = _delta(self.calls.snapshot(), self.rt0)
        cmds = _delta(redis_commandstats(self.rc), self.cmd0)
        cmds["info"] = cmds.get("info", 0) - 1  # our own INFO commandstats
        self.commands = {k: v for k, v in cmds.items() if v}

    @property
    def objects_total(self) -> int:
        return sum(self.requests.values())

    @property
    def rt_total(self) -> int:
        return sum(self.round_trips.values())

    @property
    def cmd_total(self) -> int:
        return sum(self.commands.values())


def _sid_idle(i: int) -> str:
    return f"idle{i:07d}"


def _seed(st: Any, start: int, stop: int, threads: int) -> None:
    def make(i: int) -> None:
        sid = _sid_idle(i)
        st.create_session(sid, cwd=f"/bench/{i % 50}")
        st.append_session_entries(sid, chain("m", 0, 2, None))

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(make, range(start, stop)))


def _session_keys(rc: Any, prefix: str) -> dict[str, list[bytes]]:
    """Every per-session key under the run's Redis prefix, by session (one SCAN pass)."""
    head = f"{prefix}:{{"
    out: dict[str, list[bytes]] = {}
    for key in rc.scan_iter(match=f"{prefix}:{{*", count=2000):
        text = key.decode()
        sid = text[len(head):].split("}", 1)[0]
        out.setdefault(sid, []).append(key)
    return out


def _memory(rc: Any, keys_of: dict[str, list[bytes]], sids: list[str],
            by_kind: dict[str, float] | None = None) -> tuple[float, float]:
    """Mean MEMORY USAGE (bytes, every key of the session summed) and mean keys per session;
    ``by_kind`` gets the mean bytes per session of each kind of key (tail, ids, recent, ...)."""
    if not sids:
        return float("nan"), float("nan")
    total = nkeys = 0
    kinds: Counter[str] = Counter()
    for i in range(0, len(sids), 200):
        pipe = rc.pipeline(transaction=False)
        chunk = [k for sid in sids[i:i + 200] for k in keys_of.get(sid, [])]
        for key in chunk:
            pipe.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0")
        sizes = [int(v or 0) for v in pipe.execute()]
        total += sum(sizes)
        nkeys += len(chunk)
        for key, size in zip(chunk, sizes):
            kinds[key.decode().rsplit("}:", 1)[-1]] += size
    if by_kind is not None:
        by_kind.update({k: v / len(sids) for k, v in sorted(kinds.items())})
    return total / len(sids), nkeys / len(sids)


def run(ctx: Context) -> None:
    from compactor import Compactor, Worker, WorkerOptions
    from compactor.config import CompactorOptions, wall_clock_ms
    from compactor.schedule import GcScheduler

    b, p, R = ctx.backend, ctx.params, ctx.results
    pops = list(p.scale_populations)
    K = p.scale_appends
    rc = b.redis_client()
    rng = random.Random(p.seed)
    # Sessions at rest are measured as they rest: their id index and recent-segments cache
    # expire after StoreOptions.idle_state_ttl_ms (an hour by default; IDLE_MS here, so that
    # the run need not wait an hour). The writers keep the default: they stay active.
    seeder = b.store(idle_state_ttl_ms=IDLE_MS)
    writers = b.store(compact_after_segments=K)
    wlog = KeyLog(writers)
    comp_store = b.store()
    clog = KeyLog(comp_store)
    gc_store = b.store()
    glog = KeyLog(gc_store)
    grace = CompactorOptions().grace_ms

    def later() -> int:  # past every grace period the run's compactions started
        return wall_clock_ms() + grace + 60_000

    worker = Worker(Compactor(comp_store), WorkerOptions(group=f"scale-{ctx.run_id}"))
    gc = GcScheduler(Compactor(gc_store, now=later), WorkerOptions())
    gc_now = GcScheduler(Compactor(gc_store), WorkerOptions())
    claim_s = writers.options.claim_ms / 1000
    details: dict[str, Any] = {"populations": {}, "appends_per_session": K,
                               "compact_after_segments": K, "grace_ms": grace}
    seeded = 0
    try:
        # Warm-up, not counted: one session through every step, so that the scripts are loaded
        # in Redis and the clients connected before the first population is counted.
        writers.create_session("warm0")
        for entry in chain("e", 0, K, None):
            writers.append_session_entries("warm0", [entry])
        worker.run(burst=True)
        gc.collect_due()
        gc_now.collect_due()
        for n in pops:
            d: dict[str, Any] = {}
            pre = f"scale.{n}"
            # 1. Sessions at rest, up to n (not counted).
            mem0 = int(rc.info("memory")["used_memory"])
            t0 = time.perf_counter()
            _seed(seeder, seeded, n, p.scale_seed_threads)
            added = n - seeded
            seeded = n
            mem1 = int(rc.info("memory")["used_memory"])
            seeded_at = time.perf_counter()
            d["seed_s"] = seeded_at - t0
            ctx.log(f"scale {n:,}: {added:,} sessions at rest seeded in {d['seed_s']:.1f} s")
            R.fig(f"{pre}.sessions", n)
            R.fig(f"{pre}.redis.used_memory_per_session", (mem1 - mem0) / max(1, added), "B")

            # 2. Writers on `active` new sessions.
            active = [f"act{n}x{j:05d}" for j in range(p.scale_active)]
            with ThreadPoolExecutor(max_workers=16) as pool:
                list(pool.map(lambda sid: writers.create_session(sid), active))
            wlog.clear()

            def write(sid: str) -> None:
                for entry in chain("e", 0, K, None):  # one entry (~1 KB) per append
                    writers.append_session_entries(sid, [entry])

            with Counted(writers, rc) as c:
                with ThreadPoolExecutor(max_workers=16) as pool:
                    list(pool.map(write, active))
            appends = len(active) * K
            appended_bytes = wlog.bytes_by_kind["segment"]
            R.fig(f"{pre}.active", len(active))
            R.fig(f"{pre}.appends", appends)
            R.fig(f"{pre}.append.object_requests", c.objects_total / appends)
            R.fig(f"{pre}.append.puts", c.requests.get("put", 0) / appends)
            R.fig(f"{pre}.append.redis_round_trips", c.rt_total / appends)
            R.fig(f"{pre}.append.redis_commands", c.cmd_total / appends)
            d["append"] = {"requests": c.requests, "round_trips": c.round_trips, "commands": c.commands,
                           "appends": appends, "appended_bytes": appended_bytes,
                           "idle_sessions_touched": sum(v for s, v in wlog.sessions.items() if s not in set(active))}

            # 3. Compaction: the worker drains the queue (burst).
            clog.clear()
            jobs0 = worker.stats.jobs_done
            with Counted(comp_store, rc) as c:
                worker.run(burst=True)
            jobs = worker.stats.jobs_done - jobs0
            compacted = sorted(s for s in clog.sessions if s in set(active))
            written = clog.bytes_by_kind["base"] + clog.bytes_by_kind["manifest"]
            R.fig(f"{pre}.compaction.object_requests", c.objects_total / max(1, jobs))
            R.fig(f"{pre}.written_per_appended", written / appended_bytes)
            d["compaction"] = {"requests": c.requests, "round_trips": c.round_trips, "commands": c.commands,
                               "jobs": jobs, "sessions": len(compacted), "bytes": dict(clog.bytes_by_kind)}
            if jobs != len(active):
                R.notes.append(f"scale {n}: {jobs} compaction jobs for {len(active)} active sessions")

            # 4. GC of what is due (the active sessions' retired segments), idle ones untouched.
            # A pass with nothing due first (the clock of the writers: their GC is not due
            # yet): what the schedule costs whatever the number of sessions.
            with Counted(gc_store, rc) as empty:
                gc_now.collect_due()
            R.fig(f"{pre}.gc.empty_pass_object_requests", empty.objects_total)
            R.fig(f"{pre}.gc.empty_pass_redis_round_trips", empty.rt_total)
            glog.clear()
            with Counted(gc_store, rc) as c:
                result = gc.collect_due()
            collected = result.sessions
            idle_touched = sum(v for s, v in glog.sessions.items() if s not in set(active))
            R.fig(f"{pre}.gc.object_requests", c.objects_total / max(1, collected))
            # Beyond the pass's own cost (one claim per bucket), per session collected.
            R.fig(f"{pre}.gc.redis_round_trips", (c.rt_total - empty.rt_total) / max(1, collected))
            R.fig(f"{pre}.gc.idle_object_requests", idle_touched)
            d["gc"] = {"requests": c.requests, "round_trips": c.round_trips, "commands": c.commands,
                       "sessions": collected, "deleted": len(result.deleted),
                       "sessions_touched": len(glog.sessions), "idle_requests": idle_touched}

            # The sessions at rest are at rest now: the last writer's claim and their idle
            # state (id index, recent-segments cache) have expired.
            time.sleep(max(0.0, seeded_at + max(claim_s, IDLE_MS / 1000) + 0.5 - time.perf_counter()))
            # 5. Resumes by a fresh store (cold sessions, warm process).
            reader = b.store()
            reader.read_session(_sid_idle(0))  # the start-up probe, once per store
            samples = {
                "uncompacted": [_sid_idle(i) for i in rng.sample(range(1, n), min(p.scale_resume_sample, n - 1))],
                "compacted": rng.sample(active, min(p.scale_resume_sample, len(active))),
            }
            d["resume"] = {}
            for state, sids in samples.items():
                with Counted(reader, rc) as c:
                    for sid in sids:
                        data = reader.read_session(sid)
                        want = 2 if state == "uncompacted" else K
                        if len(data.all_entries) != want:
                            raise RuntimeError(f"scale: {sid} read {len(data.all_entries)} entries, not {want}")
                R.fig(f"{pre}.resume.{state}.object_requests", c.objects_total / len(sids))
                R.fig(f"{pre}.resume.{state}.redis_round_trips", c.rt_total / len(sids))
                d["resume"][state] = {"requests": c.requests, "round_trips": c.round_trips,
                                      "commands": c.commands, "sessions": len(sids)}

            # 6. Redis bytes, at rest (the wait is before the resumes).
            keys_of = _session_keys(rc, b.redis_prefix)
            idle_sample = [_sid_idle(i) for i in rng.sample(range(n), min(p.scale_memory_sample, n))]
            kinds_idle: dict[str, float] = {}
            kinds_comp: dict[str, float] = {}
            bytes_idle, keys_idle = _memory(rc, keys_of, idle_sample, kinds_idle)
            bytes_comp, keys_comp = _memory(rc, keys_of, active, kinds_comp)
            R.fig(f"{pre}.redis.bytes_per_idle_session", bytes_idle, "B")
            R.fig(f"{pre}.redis.keys_per_idle_session", keys_idle)
            R.fig(f"{pre}.redis.bytes_per_compacted_session", bytes_comp, "B")
            d["redis"] = {"idle_sample": len(idle_sample), "keys_per_compacted_session": keys_comp,
                          "bytes_by_key_idle": kinds_idle, "bytes_by_key_compacted": kinds_comp,
                          "key_kinds_idle": dict(Counter(k.decode().rsplit("}:", 1)[-1]
                                                         for sid in idle_sample[:50] for k in keys_of.get(sid, []))),
                          "used_memory_before_after": [mem0, mem1]}
            details["populations"][str(n)] = d

        # The sweep's visit to a session at rest (it visits every session once a day).
        sweep_comp = Compactor(gc_store, now=later)
        sample = [_sid_idle(i) for i in rng.sample(range(pops[-1]), min(p.scale_resume_sample, pops[-1]))]
        with Counted(gc_store, rc) as c:
            for sid in sample:
                sweep_comp.gc_session(sid)
        R.fig("scale.sweep.object_requests_per_session", c.objects_total / len(sample))
        R.fig("scale.sweep.redis_round_trips_per_session", c.rt_total / len(sample))
        details["sweep"] = {"requests": c.requests, "round_trips": c.round_trips, "sessions": len(sample)}

        # One longer session: its Redis bytes grow with its entries (the ids hash) and, until it
        # is compacted, with its segments (the recent-segments cache).
        long_writer = b.store(idle_state_ttl_ms=LONG_IDLE_MS)
        details["long"] = _long_session(ctx, long_writer, Compactor(comp_store), rc, claim_s)
    finally:
        rc.close()
    R.details["scale"] = details
    _rows(ctx, pops)


def _long_session(ctx: Context, writers: Any, comp: Any, rc: Any, claim_s: float) -> dict[str, Any]:
    """A session of ``scale_long_entries`` entries appended 100 at a time: MEMORY USAGE of its
    keys before and after its compaction, and once it is idle (its id index and cache expired,
    ``LONG_IDLE_MS`` after its last append; one session: not a population figure)."""
    R, n = ctx.results, ctx.params.scale_long_entries
    sid = "long0"
    writers.create_session(sid)
    entries = chain("e", 0, n, None)
    for i in range(0, n, 100):
        writers.append_session_entries(sid, entries[i:i + 100])
    out: dict[str, Any] = {"entries": n, "segments": (n + 99) // 100}
    last_append = time.perf_counter()
    for state in ("uncompacted", "compacted", "idle"):
        if state == "compacted":
            comp.compact_session(sid)
        if state == "idle":
            time.sleep(max(0.0, last_append + LONG_IDLE_MS / 1000 + 0.5 - time.perf_counter()))
        time.sleep(claim_s + 0.5)
        keys = list(rc.scan_iter(match=f"{ctx.backend.redis_prefix}:{{{sid}}}:*", count=2000))
        kinds: dict[str, float] = {}
        total, _ = _memory(rc, {sid: keys}, [sid], kinds)
        R.fig(f"scale.long.{state}.redis_bytes", total, "B")
        out[state] = kinds
    # Measured uncompacted: a compaction drops the compacted entries' ids from Redis.
    R.fig("scale.long.ids_bytes_per_entry", out["uncompacted"].get("ids", 0.0) / n, "B")
    R.fig("scale.long.entries", n)
    return out


def _fmt(x: float) -> str:
    if x != x:  # nan
        return "-"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def _rows(ctx: Context, pops: list[int]) -> None:
    R = ctx.results
    first, last = pops[0], pops[-1]
    span = f"{first:,} -> {last:,}"
    for m, label in METRICS:
        a, z = R.figures[f"scale.{first}.{m}"], R.figures[f"scale.{last}.{m}"]
        if a == 0 and z == 0:
            ratio = 1.0
        elif a == 0:
            ratio = float("inf")
        else:
            ratio = z / a
        R.fig(f"scale.ratio.{m}", ratio if ratio != float("inf") else 1e9, "x")
        flat = "flat" if 0.9 <= ratio <= 1.1 else "NOT flat"
        values = " / ".join(_fmt(R.figures[f"scale.{n}.{m}"]) for n in pops)
        R.row(
            "scale (counted)",
            f"{label}; sessions at rest {span}",
            values,
            "",
            f"{ratio:.2f}x {flat}",
        )
    mem = " / ".join(_fmt(R.figures[f"scale.{n}.redis.used_memory_per_session"]) for n in pops)
    R.row("scale (counted)", "Redis used_memory grown per session seeded (INFO memory; with Redis's "
          "own overhead, noisy at small sizes)", mem, "", "")
    n = int(R.figures["scale.long.entries"])
    R.row("scale (counted)", f"Redis bytes of one session of {n:,} entries (appends of 100): "
          "uncompacted / compacted (its ids left Redis) / idle (index and cache expired); of its "
          "ids hash per entry, uncompacted",
          f"{_fmt(R.figures['scale.long.uncompacted.redis_bytes'])} / "
          f"{_fmt(R.figures['scale.long.compacted.redis_bytes'])} / "
          f"{_fmt(R.figures['scale.long.idle.redis_bytes'])}; "
          f"{_fmt(R.figures['scale.long.ids_bytes_per_entry'])} per entry", "", "")
    sw = R.figures["scale.sweep.object_requests_per_session"]
    R.row("scale (counted)", f"the daily sweep: object requests per session visited, at {last:,}",
          f"{_fmt(sw)} (+{_fmt(R.figures['scale.sweep.redis_round_trips_per_session'])} Redis round trips)",
          "", "")
