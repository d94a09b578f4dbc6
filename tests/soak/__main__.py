"""python -m tests.soak: the nemesis soak of sessionstore.

Starts its own servers (a redis-server process; moto's S3 server over HTTP, or SeaweedFS,
behind a fault-injecting TCP proxy), then writer, reader and compactor processes on a few
sessions, and a seeded nemesis that, for --duration seconds:

  kills writers and compactors (SIGKILL) and restarts them; pauses writers, compactors and
  readers (SIGSTOP) for longer than the GC grace period; kills Redis and restarts it empty;
  FLUSHALLs it; SCRIPT FLUSHes it; pauses it (SIGSTOP); drops S3 responses; makes S3 refuse
  connections, or accept them and never answer, for a while (moto keeps no data across a
  restart, so S3 itself is restarted only on SeaweedFS: --backend seaweedfs). Writers also
  stop themselves now and then at a point of the append protocol (between the CHECK and the
  segment PUT, after the PUT, after the commit), to be resumed after such a pause.

Writers append batches (half with an expected tail) and re-send a batch whose outcome is
unknown until it is known; readers read sessions over and over; every operation and every
read is logged with its time. At the end a fresh process reads every session, and the history
checker (tests/history.py) judges all of it: acknowledged batches lost, duplicated, torn or
misplaced; refused batches visible; expected-tail appends acknowledged although the tail had
moved; reads missing an append acknowledged before they began, not a prefix of the final
session, or losing what an earlier read saw; errors outside the store's error tree.

Exit status: 0 when no guarantee was broken, 1 when one was, 2 when the soak itself failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback

from tests.soak.config import FAULT_KINDS, SoakConfig


def parser() -> argparse.ArgumentParser:
    d = SoakConfig()
    p = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=d.duration_s, help="seconds of faults (default %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="seeds the nemesis, the writers and the readers (default %(default)s)")
    p.add_argument("--writers", type=int, default=d.writers, help="writer processes (default %(default)s)")
    p.add_argument("--readers", type=int, default=d.readers, help="reader processes (default %(default)s)")
    p.add_argument("--compactors", type=int, default=d.compactors,
                   help="compactor processes, python -m compactor work (default %(default)s)")
    p.add_argument("--sessions", type=int, default=d.sessions, help="sessions written to (default %(default)s)")
    p.add_argument("--grace-ms", type=int, default=d.grace_ms,
                   help="the compactors' GC grace period; process pauses last longer (default %(default)s)")
    p.add_argument("--gc-interval-ms", type=int, default=0,
                   help="full GC pass of each compactor this often (default: a third of the grace period)")
    p.add_argument("--compact-after", type=int, default=d.compact_after,
                   help="writers queue a compaction after this many segments (default %(default)s)")
    p.add_argument("--max-segments", type=int, default=d.max_segments,
                   help="segments one compaction merges at most (default %(default)s)")
    p.add_argument("--backend", choices=("moto", "seaweedfs"), default=d.backend,
                   help="S3 server (default %(default)s; seaweedfs needs tests/harness/seaweedfs.py)")
    p.add_argument("--fault-interval", type=float, default=d.fault_interval_s,
                   help="mean seconds between two faults (default %(default)s)")
    p.add_argument("--aimed-interval", type=float, default=d.aimed_interval_s,
                   help="mean seconds between two self-pauses of a writer at a protocol point, 0 for none "
                        "(default %(default)s)")
    p.add_argument("--pace", type=float, default=d.pace_s,
                   help="mean seconds a writer waits between two appends, 0 for none (default %(default)s)")
    p.add_argument("--faults", default="",
                   help="comma-separated fault kinds to inject (default: all the backend supports; none for none): "
                        + ", ".join(FAULT_KINDS))
    p.add_argument("--workdir", default="", help="keep logs here (default: a temporary directory, "
                                                  "removed after a clean run unless --keep)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory after a clean run")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout (progress goes to stderr)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    cfg = SoakConfig(
        duration_s=args.duration, seed=args.seed, writers=args.writers, readers=args.readers,
        compactors=args.compactors, sessions=args.sessions, grace_ms=args.grace_ms,
        gc_interval_ms=args.gc_interval_ms, compact_after=args.compact_after,
        max_segments=args.max_segments, backend=args.backend,
        fault_interval_s=args.fault_interval, aimed_interval_s=args.aimed_interval, pace_s=args.pace,
        faults=[k.strip() for k in args.faults.split(",") if k.strip()], workdir=args.workdir,
    )
    if cfg.writers < 1 or cfg.sessions < 1 or cfg.duration_s <= 0:
        print("error: --writers, --sessions and --duration must be positive", file=sys.stderr)
        return 2
    from tests.soak.run import cleanup, render, run

    progress = None if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    try:
        summary = run(cfg, progress=progress)
    except Exception:
        traceback.print_exc()
        print("error: the soak itself failed (not a verdict on the store)", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(render(summary))
    if summary["ok"] and not args.workdir and not args.keep:
        cleanup(summary)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
