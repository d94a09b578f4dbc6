"""Sizes of a run (smoke, default, full) and what every scenario is handed."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.backends import Backend
from benchmarks.results import Results


@dataclass
class Params:
    profile: str = "default"  # smoke | default | full
    #: Append latency: interleaved rounds (one store append + one floor op each) per batch size.
    append_rounds: int = 120
    #: The encryption cost's resume (benchmarks/scenarios/encryption.py): entries, reps.
    encryption_resume_size: int = 2_000
    encryption_resume_reps: int = 8
    append_warmup: int = 20
    append_batches: tuple[int, ...] = (1, 10)
    #: Open-loop schedule: slot interval = this x the mean of the store's and the floor's
    #: median warm-up latency (about 1/3 utilisation).
    open_loop_slack: float = 3.0
    #: Throughput and contention: writer processes and timed phases.
    writers: int = 4
    sessions_per_writer: int = 8
    phase_s: float = 4.0
    phases: int = 2
    #: Resume sizes (entries) and entries per segment for each (the uncompacted shape).
    resume_sizes: tuple[int, ...] = (1_000, 10_000)
    resume_segment: dict[int, int] = field(default_factory=lambda: {1_000: 10, 10_000: 10, 100_000: 100})
    resume_reps: dict[int, int] = field(default_factory=lambda: {1_000: 7, 10_000: 3, 100_000: 2})
    compacted_reps: dict[int, int] = field(default_factory=lambda: {1_000: 15, 10_000: 11, 100_000: 3})
    #: Write amplification: sessions of this many entries, appended one entry per segment and
    #: compacted every ``amplification_every`` segments; the largest is also measured with
    #: every compaction rewriting the whole session (what compaction did before runs were
    #: kept) when it is at most ``amplification_full_rewrite_max`` entries.
    amplification_sizes: tuple[int, ...] = (10_000,)
    amplification_every: int = 64
    amplification_full_rewrite_max: int = 10_000
    #: Uncompacted tails a resume reads (segments of 10 entries), and repetitions.
    tail_segments: tuple[int, ...] = (8, 64)
    tail_reps: int = 15
    #: Naive baseline and append-cost-vs-size curve: extra small sizes, appends per size.
    curve_small_sizes: tuple[int, ...] = (10, 100)
    curve_appends: int = 8
    curve_appends_large: int = 4
    #: On this machine: rounds of one append on each side (pi's file, the embedded default,
    #: SQLiteSession), interleaved.
    local_appends: int = 300
    #: asyncio: tasks of one loop, sessions they share, appends per task, Redis round trips.
    aio_tasks: int = 100
    aio_sessions: int = 10
    aio_appends: int = 5
    aio_redis_calls: int = 2000
    #: HTTP service (--only http): single appends per side (open loop) after a warm-up, of
    #: bodies of this size; catch-up read of a JSON stream of this many messages, appended in
    #: batches, timed this many times per side.
    http_appends: int = 300
    http_append_warmup: int = 20
    http_body_bytes: int = 100
    http_read_messages: int = 10_000
    http_read_batch: int = 100
    http_read_reps: int = 6
    #: HTTP under load (issue #37; benchmarks/scenarios/http_load.py): two serve processes
    #: behind a balancer; idempotent producers on shared JSON streams, each appending every
    #: interval for the duration; live followers of those streams (half SSE, half
    #: long-poll); readers of a binary stream (appended in pieces) reading it whole again and
    #: again; /healthz probed every interval. Followers get ``drain_s`` after the writers
    #: stopped to reach the tail; RSS "after" is taken ``settle_s`` after every client left.
    http_load_writers: int = 50
    http_load_streams: int = 25
    http_load_followers: int = 200
    http_load_readers: int = 20
    http_load_duration_s: float = 60.0
    http_load_append_interval_s: float = 1.0
    http_load_binary_bytes: int = 12 * 2**20
    http_load_binary_piece: int = 256 * 2**10
    http_load_probe_interval_s: float = 0.05
    http_load_drain_s: float = 60.0
    http_load_settle_s: float = 5.0
    #: The niceness the load's client processes run at (writers, followers, readers; not the
    #: prober): on one machine they compete with the stack for its cores, which clients on
    #: other machines would not; 10 lets the stack (and the prober) run first. 0: the same
    #: priority as the stack.
    http_load_clients_nice: int = 10
    #: Listing: sessions, and timed reps of the first page and of every page.
    listing_sessions: int = 2_000
    listing_first_reps: int = 7
    listing_all_reps: int = 3
    #: Scale (counted, not timed): sessions at rest, each population 10x the one before
    #: (cumulative: one store grows); writers on ``scale_active`` new sessions per population,
    #: ``scale_appends`` single-entry appends each (also their compaction trigger); resumes and
    #: MEMORY USAGE of samples; threads seeding the sessions at rest.
    scale_populations: tuple[int, ...] = (1_000, 10_000)
    scale_active: int = 200
    scale_appends: int = 8
    scale_resume_sample: int = 50
    scale_memory_sample: int = 1_000
    #: Peers (--only peers): the frameworks compared (``benchmarks/peers/``); empty: all.
    peers: tuple[str, ...] = ()
    scale_seed_threads: int = 32
    scale_long_entries: int = 1_000
    seed: int = 1

    @classmethod
    def smoke(cls) -> "Params":
        return cls(
            profile="smoke",
            append_rounds=6,
            encryption_resume_size=100,
            encryption_resume_reps=2,
            append_warmup=3,
            writers=2,
            sessions_per_writer=2,
            phase_s=0.6,
            phases=1,
            resume_sizes=(60, 200),
            amplification_sizes=(256,),
            amplification_every=32,
            resume_segment={60: 10, 200: 10},
            resume_reps={60: 2, 200: 2},
            compacted_reps={60: 2, 200: 2},
            tail_segments=(4,),
            tail_reps=2,
            curve_small_sizes=(10,),
            curve_appends=2,
            curve_appends_large=2,
            local_appends=10,
            aio_tasks=10,
            aio_sessions=2,
            aio_appends=2,
            aio_redis_calls=100,
            http_appends=6,
            http_append_warmup=3,
            http_read_messages=200,
            http_read_batch=50,
            http_read_reps=2,
            http_load_writers=5,
            http_load_streams=2,
            http_load_followers=10,
            http_load_readers=2,
            http_load_duration_s=5.0,
            http_load_append_interval_s=0.25,
            http_load_binary_bytes=2**20,
            http_load_binary_piece=128 * 2**10,
            http_load_drain_s=20.0,
            http_load_settle_s=2.0,
            listing_sessions=150,
            listing_first_reps=2,
            listing_all_reps=1,
            scale_populations=(20, 200),
            scale_active=4,
            scale_appends=4,
            scale_resume_sample=5,
            scale_memory_sample=100,
            scale_long_entries=200,
        )

    @classmethod
    def full(cls) -> "Params":
        return cls(
            profile="full",
            append_rounds=300,
            phases=3,
            resume_sizes=(1_000, 10_000, 100_000),
            amplification_sizes=(10_000, 100_000),
            listing_sessions=100_000,
            listing_all_reps=2,
            scale_populations=(10_000, 100_000),
            scale_active=300,
        )

    @property
    def curve_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.curve_small_sizes) | set(self.resume_sizes)))

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["resume_segment"] = {str(k): v for k, v in self.resume_segment.items() if k in self.resume_sizes}
        d["resume_reps"] = {str(k): v for k, v in self.resume_reps.items() if k in self.resume_sizes}
        d["compacted_reps"] = {str(k): v for k, v in self.compacted_reps.items() if k in self.resume_sizes}
        return d


@dataclass
class Context:
    backend: Backend
    params: Params
    results: Results
    run_id: str
    #: Sessions built by the resume scenario, reused by compaction and the size curve.
    sessions: dict[int, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    def log(self, msg: str) -> None:
        elapsed = time.perf_counter() - self.started
        print(f"[{elapsed:6.1f}s] {msg}", file=sys.stderr, flush=True)
