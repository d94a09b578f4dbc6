"""The demo's sizes and flags (kept apart so the CLI parser does not import the demo)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DemoSize:
    workers: int
    sessions: int
    turns: int
    #: Stop starting new turns after this many seconds (0: no limit).
    seconds: float


#: Finishes in about 20 s on a 2-core machine.
DEFAULT = DemoSize(workers=4, sessions=10, turns=10, seconds=30.0)
#: For CI: a few seconds, still every feature (handoff, races, branches, a fork, compaction,
#: a redaction).
SMALL = DemoSize(workers=2, sessions=3, turns=4, seconds=30.0)


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, help=f"agent processes (default {DEFAULT.workers})")
    p.add_argument("--sessions", type=int, help=f"shared sessions at the start (default {DEFAULT.sessions})")
    p.add_argument("--turns", type=int, help=f"agent turns per session (default {DEFAULT.turns})")
    p.add_argument("--seconds", type=float,
                   help=f"stop starting turns after this long, 0 for no limit (default {DEFAULT.seconds:g})")
    p.add_argument("--small", action="store_true",
                   help=f"a small run for CI ({SMALL.workers} workers, {SMALL.sessions} sessions, {SMALL.turns} turns)")
    p.add_argument("--dir", help="run the embedded default in this directory (default: a new temporary one)")
    p.add_argument("--keep", action="store_true",
                   help="keep the data and leave the embedded redis-server running, to explore afterwards")
    p.add_argument("--no-compactor", action="store_true", help="do not run a compactor worker alongside")
    p.add_argument("--seed", type=int, default=7, help="seed of the scripted conversations (default %(default)s)")


def size_from(args: argparse.Namespace) -> DemoSize:
    base = SMALL if args.small else DEFAULT
    return DemoSize(
        workers=max(2, args.workers if args.workers is not None else base.workers),
        sessions=max(1, args.sessions if args.sessions is not None else base.sessions),
        turns=max(1, args.turns if args.turns is not None else base.turns),
        seconds=max(0.0, args.seconds if args.seconds is not None else base.seconds),
    )
