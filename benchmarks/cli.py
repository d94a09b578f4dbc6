"""``python -m benchmarks``: run every scenario, print the table, write JSON and a plot."""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from benchmarks.backends import (
    Backend,
    start_embedded_backend,
    start_external_backend,
    start_seaweedfs_backend,
    start_moto_backend,
)
from benchmarks.context import Context, Params
from benchmarks.results import (
    Results,
    git_revision,
    loadavg,
    machine_info,
    now_iso,
    table_markdown,
    table_text,
    to_json,
    write_files,
)

SCENARIOS = ("append", "writers", "resume", "compaction", "curve", "local", "aio", "listing")
#: Run only when named with --only: the frameworks' own backends beside their adapters, the
#: HTTP service against the library and the protocol's reference server (extras needed), and
#: the scale scenario (counted, not timed; seeding its sessions at rest takes minutes), and
#: service processes killed under load for minutes (counted). ``http`` includes the HTTP
#: service under load, which ``http-load`` runs alone.
OPTIONAL_SCENARIOS = ("peers", "http", "http-load", "scale", "kills")

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmarks of the session store, each against a floor measured in the same run.",
    )
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--embedded", action="store_true", help="file:// store + embedded Redis (the no-config default; also the default when moto is not installed)")
    where.add_argument("--seaweedfs", action="store_true", help="SeaweedFS (weed mini, from the test extra) + a redis-server, instead of moto")
    where.add_argument("--objects", metavar="URL", help="object store URL (s3://bucket/prefix?endpoint=... or file:///dir); needs --redis")
    ap.add_argument("--redis", metavar="URL", help="Redis URL (with --objects)")
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="tiny sizes, for CI: checks that every figure is produced")
    size.add_argument("--full", action="store_true", help="bigger sizes: 100k-entry resume, more rounds")
    ap.add_argument("--writers", type=int, help="writer processes for throughput and contention (default 4, smoke 2)")
    ap.add_argument("--only", metavar="NAMES", help=f"comma-separated subset of {','.join(SCENARIOS)} (default: all of them), or {','.join(OPTIONAL_SCENARIOS)}")
    ap.add_argument("--peers", metavar="NAMES", help="with --only peers: comma-separated subset of the frameworks compared (default: all)")
    ap.add_argument("--kills-duration", type=float, default=600.0, metavar="SECONDS",
                    help="--only kills: how long processes are killed (default %(default)s)")
    ap.add_argument("--kills-quiet", type=float, default=60.0, metavar="SECONDS",
                    help="--only kills: then how long without faults (default %(default)s)")
    ap.add_argument("--clients-nice", type=int, metavar="N",
                    help="--only http-load: niceness of the load's client processes (default 10: the stack "
                         "and the /healthz prober run first, as with clients on other machines; 0: same priority)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where results go (default benchmarks/results/)")
    ap.add_argument("--no-plot", action="store_true", help="skip the PNG")
    ap.add_argument("--profile", action="store_true", help="also cProfile appends and resumes (results/profile-*.txt)")
    ap.add_argument("--keep", action="store_true", help="leave the run's objects and keys behind")
    args = ap.parse_args(argv)
    if args.objects and not args.redis:
        ap.error("--objects needs --redis")
    if args.redis and not args.objects:
        ap.error("--redis needs --objects")
    return args


def _backend(args: argparse.Namespace, run_id: str) -> Backend:
    if args.embedded:
        return start_embedded_backend(run_id)
    if args.seaweedfs:
        return start_seaweedfs_backend(run_id)
    if args.objects:
        return start_external_backend(run_id, args.objects, args.redis)
    if not moto_available():
        # The README's first install (`pip install -e '.[embedded]'`) has no moto: run on the
        # no-configuration default instead of failing; the figures are the same set.
        print("moto is not installed (it comes with `pip install -e '.[test]'`): running on the "
              "embedded default instead, as with --embedded", file=sys.stderr)
        return start_embedded_backend(run_id)
    return start_moto_backend(run_id)


def moto_available() -> bool:
    """Whether moto's server can be imported (without importing it here: it is slow)."""
    import importlib.util

    try:
        return importlib.util.find_spec("moto") is not None and importlib.util.find_spec("moto.server") is not None
    except (ImportError, ValueError):
        return False


def expected_figures(params: dict[str, Any], compaction: bool) -> list[str]:
    """Every figure a complete run produces (the smoke test checks them all)."""
    names: list[str] = []
    for size in params["append_batches"]:
        pre = f"append.b{size}"
        names += [f"{pre}.{k}" for k in (
            "store.p50_ms", "store.p99_ms", "floor.p50_ms", "floor.p99_ms", "ratio_p50",
            "ratio_p50_ci_lo", "ratio_p50_ci_hi", "ratio_p99", "object_requests_per_append",
            "redis_commands_per_append",
        )]
    names += ["throughput.store.appends_per_s", "throughput.floor.puts_per_s", "throughput.ratio"]
    names += [
        "contention.store.appends_per_s", "contention.floor.segments_per_s", "contention.ratio",
        "contention.retries_per_append", "contention.lost", "contention.p99_vs_single",
        "contention.longest_run",
    ]
    for k in sorted({1, min(2, params["writers"]), params["writers"]}):
        names += [f"contention.w{k}.{x}" for x in ("p50_ms", "p99_ms", "appends_per_s")]
    states = ("uncompacted", "compacted") if compaction else ("uncompacted",)
    for n in params["resume_sizes"]:
        for state in states:
            pre = f"resume.{n}.{state}"
            names += [f"{pre}.{k}" for k in ("store_ms", "store_load_ms", "store_context_ms", "floor_ms", "ratio")]
        if compaction:
            names += [f"compaction.{n}.{k}" for k in ("store_ms", "floor_ms", "ratio", "segments_per_s", "mb_per_s")]
    if compaction:
        from benchmarks.scenarios.compaction import amplification_figures

        names += amplification_figures(params)
    curve = sorted(set(params["resume_sizes"]) | set(params["curve_small_sizes"]))
    for n in curve:
        names += [f"curve.{n}.{k}" for k in ("store_append_ms", "naive_append_ms", "floor_ms", "naive_resume_ms")]
    from benchmarks.scenarios.local import expected_figures as local_figures

    names += local_figures()
    names += [f"local.{n}.resume_ms" for n in params["resume_sizes"]]
    names += [f"aio.{k}" for k in (
        "store.appends_per_s", "threads.appends_per_s", "ratio", "loop_lag_worst_ms", "loop_lag_p99_ms",
        "redis.native_us_per_call", "redis.offloaded_us_per_call",
    )]
    from benchmarks.scenarios.listing import FIGURES as listing_figures

    names += listing_figures
    return names


def _http_figures(params: dict[str, Any], compaction: bool) -> list[str]:
    from benchmarks.scenarios.http import expected_figures as http_figures

    return http_figures(params, compaction)


def _http_load_figures(params: dict[str, Any]) -> list[str]:
    from benchmarks.scenarios.http_load import expected_figures as load_figures

    return load_figures(params)


def _scale_figures(params: dict[str, Any]) -> list[str]:
    from benchmarks.scenarios.scale import expected_figures as scale_figures

    return scale_figures(params)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = Params.smoke() if args.smoke else Params.full() if args.full else Params()
    if args.writers:
        params.writers = args.writers
    if args.clients_nice is not None:
        if not 0 <= args.clients_nice <= 19:
            print(f"--clients-nice must be 0 to 19, not {args.clients_nice}", file=sys.stderr)
            return 2
        params.http_load_clients_nice = args.clients_nice
    only = set(SCENARIOS if not args.only else [s.strip() for s in args.only.split(",") if s.strip()])
    unknown = only - set(SCENARIOS) - set(OPTIONAL_SCENARIOS)
    if unknown:
        print(f"unknown scenario(s): {', '.join(sorted(unknown))}; choose from "
              f"{', '.join(SCENARIOS + OPTIONAL_SCENARIOS)}", file=sys.stderr)
        return 2
    if args.peers:
        from benchmarks.scenarios.peers import FRAMEWORKS

        params.peers = tuple(p.strip() for p in args.peers.split(",") if p.strip())
        if not params.peers or set(params.peers) - set(FRAMEWORKS):
            print(f"unknown peer(s): {args.peers!r}; choose from {', '.join(FRAMEWORKS)}", file=sys.stderr)
            return 2
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
    started = now_iso()
    load_start = loadavg()
    t_start = time.perf_counter()
    results = Results()
    print(f"sessionstore benchmarks, run {run_id} ({params.profile})", file=sys.stderr)
    backend = _backend(args, run_id)
    ctx = Context(backend=backend, params=params, results=results, run_id=run_id)
    ctx.log(f"backend: {backend.description}")

    from benchmarks.scenarios import aio, append, compaction, curve, listing, local, resume, writers

    compaction_api = compaction.find()
    steps: list[tuple[str, Callable[[], None]]] = []
    if "append" in only:
        steps.append(("append", lambda: append.run(ctx)))
    if "writers" in only:
        steps.append(("writers", lambda: writers.run(ctx)))
    needs_sessions = bool(only & {"resume", "compaction", "curve"})
    if needs_sessions:
        steps.append(("resume_setup", lambda: resume.setup(ctx)))
    if "resume" in only:
        steps.append(("resume_uncompacted", lambda: resume.measure(ctx, "uncompacted")))
        steps.append(("resume_tail", lambda: resume.tail(ctx)))
    compacted = False
    if compaction_api.available and only & {"compaction", "resume"}:
        steps.append(("compaction", lambda: compaction.run(ctx, compaction_api)))
        compacted = True
        if "resume" in only:
            steps.append(("resume_compacted", lambda: resume.measure(ctx, "compacted")))
            from benchmarks.scenarios import encryption

            steps.append(("resume_encryption", lambda: encryption.resume_cost(ctx)))
    elif not compaction_api.available:
        results.notes.append(f"compaction not measured: {compaction_api.reason}")
        ctx.log(f"compaction skipped: {compaction_api.reason}")
    if "curve" in only:
        steps.append(("curve", lambda: curve.run(ctx)))
    if "local" in only:
        steps.append(("local", lambda: local.run(ctx)))
    if "aio" in only:
        steps.append(("aio", lambda: aio.run(ctx)))
    if "listing" in only:
        steps.append(("listing", lambda: listing.run(ctx)))
    if "scale" in only:
        from benchmarks.scenarios import scale

        steps.append(("scale", lambda: scale.run(ctx)))
    if "peers" in only:
        from benchmarks.scenarios import peers

        steps.append(("peers", lambda: peers.run(ctx)))
    if "http" in only:
        from benchmarks.scenarios import http

        steps.append(("http", lambda: http.run(ctx)))
    if only & {"http", "http-load"}:
        from benchmarks.scenarios import http_load

        steps.append(("http_load", lambda: http_load.run(ctx)))
    if "kills" in only:
        from benchmarks.scenarios import kills

        steps.append(("kills", lambda: kills.run(ctx, args.kills_duration, args.kills_quiet)))

    status = 0
    try:
        for name, fn in steps:
            t0 = time.perf_counter()
            fn()
            results.timings[name] = round(time.perf_counter() - t0, 2)
        if args.profile:
            from benchmarks import profiling

            t0 = time.perf_counter()
            profiling.run(ctx, args.out)
            results.timings["profile"] = round(time.perf_counter() - t0, 2)
    except BaseException:
        status = 1
        raise
    finally:
        backend.close(keep=args.keep)
        duration = time.perf_counter() - t_start
        meta = {
            "run_id": run_id,
            "command": "python -m benchmarks " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
            "started_at": started,
            "duration_s": round(duration, 1),
            "complete": status == 0,
            "machine": machine_info(),
            "loadavg_start": load_start,
            "loadavg_end": loadavg(),
            "versions": backend.versions,
            "git": git_revision(),
            "backend": {"kind": backend.kind, "description": backend.description},
            "params": params.to_json(),
            "scenarios": sorted(only),
            "compaction_api": compaction_api.description,
            "expected_figures": (expected_figures(params.to_json(), compacted) if only == set(SCENARIOS) else [])
            + (_http_figures(params.to_json(), compaction_api.available) if "http" in only else [])
            + (_http_load_figures(params.to_json()) if only & {"http", "http-load"} else [])
            + (_scale_figures(params.to_json()) if "scale" in only else []),
        }
        plot_note: str | None = "not drawn (--no-plot or an incomplete run)"
        png = args.out / f"{run_id}.png"
        if status == 0 and not args.no_plot:
            from benchmarks import plot

            data = to_json(results, meta)
            plot_note = plot.draw(data, png)
        meta["plot"] = str(png) if plot_note is None else None
        if plot_note is not None:
            meta["plot_note"] = plot_note
        data = to_json(results, meta)
        paths = write_files(args.out, run_id, data, table_markdown(results))
        if plot_note is None:
            (args.out / "latest.png").write_bytes(png.read_bytes())
            paths["png"] = png
        if status == 0:
            if plot_note is not None:
                print(f"no plot: {plot_note}", file=sys.stderr)
            print()
            print(table_text(results))
            print()
            for t in results.targets:
                state = {True: "met", False: "NOT MET", None: "n/a"}[t.met]
                value = "-" if t.value is None or math.isnan(t.value) else f"{t.value:.3g}"
                print(f"target {t.name}: {value} -> {state}")
            for note in results.notes:
                print(f"note: {note}")
            print(f"\n{len(results.figures)} figures in {duration:.0f} s; loadavg {meta['loadavg_start']} -> {meta['loadavg_end']}")
            for kind, path in paths.items():
                print(f"{kind}: {path}")
    return status
