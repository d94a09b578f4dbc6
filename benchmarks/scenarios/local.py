"""For reference: pi's own way, a local JSONL file on this machine.

pi appends each entry with ``appendFileSync`` (open, write one line, close; no fsync) and
resumes by reading the file and parsing every line. Both are measured here, plus an append
with fsync (what durability on one disk costs), and the same ``build_context`` the store's
resume does.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time

import orjson

from benchmarks.context import Context
from benchmarks.results import fmt_ms
from benchmarks.stats import median, summarize
from benchmarks.workload import chain, encode
from store.session import Session

_HEADER = {"type": "session", "version": 3, "id": "local", "timestamp": "2026-01-01T00:00:00.000Z", "cwd": "/bench"}


def run(ctx: Context) -> None:
    p, R = ctx.params, ctx.results
    root = tempfile.mkdtemp(prefix="ssbench-local-")
    try:
        path = os.path.join(root, "append.jsonl")
        with open(path, "wb") as fh:
            fh.write(orjson.dumps(_HEADER) + b"\n")
        lines = [encode([e]) for e in chain("l", 0, 2 * p.local_appends, None)]
        plain: list[float] = []
        synced: list[float] = []
        for i in range(p.local_appends):
            t0 = time.perf_counter()
            with open(path, "ab") as fh:  # appendFileSync
                fh.write(lines[2 * i])
            t1 = time.perf_counter()
            with open(path, "ab") as fh:
                fh.write(lines[2 * i + 1])
                fh.flush()
                os.fsync(fh.fileno())
            t2 = time.perf_counter()
            plain.append(t1 - t0)
            synced.append(t2 - t1)
        ps, ss = summarize(plain), summarize(synced)
        R.fig("local.append.p50_ms", ps["p50"], "ms")
        R.fig("local.append.p99_ms", ps["p99"], "ms")
        R.fig("local.append_fsync.p50_ms", ss["p50"], "ms")
        R.fig("local.append_fsync.p99_ms", ss["p99"], "ms")
        R.row(
            "local file (pi), reference",
            "append 1 entry: no fsync (pi) / with fsync, p50",
            f"{fmt_ms(ps['p50'])} / {fmt_ms(ss['p50'])}",
            "",
            "",
        )
        for n in p.resume_sizes:
            fpath = os.path.join(root, f"{n}.jsonl")
            with open(fpath, "wb") as fh:
                fh.write(orjson.dumps(_HEADER) + b"\n")
                fh.write(encode(chain("r", 0, n, None)))
            reps = max(3, (p.compacted_reps.get(n, 3)))
            parse_t: list[float] = []
            total_t: list[float] = []
            for _ in range(reps + 1):
                gc.collect()
                t0 = time.perf_counter()
                with open(fpath, "rb") as fh:
                    data = fh.read()
                rows = [orjson.loads(line) for line in data.splitlines()]
                t1 = time.perf_counter()
                Session(rows[0], rows[1:]).build_context()
                t2 = time.perf_counter()
                parse_t.append(t1 - t0)
                total_t.append(t2 - t0)
            parse_ms, total_ms = median(parse_t[1:]) * 1000, median(total_t[1:]) * 1000
            R.fig(f"local.{n}.read_parse_ms", parse_ms, "ms")
            R.fig(f"local.{n}.resume_ms", total_ms, "ms")
            R.row(
                "local file (pi), reference",
                f"resume {n:,} entries: read + parse (+ build_context)",
                f"{fmt_ms(parse_ms)} ({fmt_ms(total_ms)})",
                "",
                "",
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
