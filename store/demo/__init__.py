"""``sessionstore demo``: a fleet of scripted agents on shared sessions, then proof.

Worker processes (multiprocessing, spawn: nothing shared but the store) play agents. Every
turn of a session goes to a different worker than the turn before, which opens the session
by id and continues from its leaf, as a resumed agent on another machine would. Some turns
are played by two workers at once on the same leaf: with plain handles both land (sibling
branches); with strict handles one gets ``ConflictError``, re-reads and continues after the
winner. Some sessions branch with a summary, some are forked; one tool result leaks a token
and is redacted; a compactor worker (``python -m compactor work``) merges segments alongside.
At the end every invariant is checked over everything that was written (``store.demo.check``),
a summary is printed and one session's tree is drawn. Exit code 0 only if all checks pass.

By default it runs on the embedded default in a new temporary directory, removed at the end
with its redis-server (``--keep`` keeps both to explore). With ``--objects`` / ``--redis``
(or the environment) it runs there, under a prefix of its own (``demo-<run>``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from store.cli.common import Exit, dump_json, err, out
from store.cli.render import StatusLine
from store.demo.fleet import COMPACT_AFTER_SEGMENTS, Fleet
from store.demo.location import Location, choose_location, cleanup_external, cleanup_local, run_id, stop_embedded
from store.demo.options import DemoSize, size_from
from store.demo.report import bytes_in_store, pick_tree_session, print_report
from store.demo.schedule import Plan, Stats, count_compactions, schedule, session_steps
from store.errors import SessionStoreError

if TYPE_CHECKING:
    from store.cli.ctx import Ctx
    from store.core import SessionStore
    from store.demo.check import Verification


def _purge(store: SessionStore, sid: str, secret: str, *, alone: bool) -> bool:
    """Delete the redacted text from storage now, as an operator answering an erasure
    request does (``sessionstore redact --purge-now``): compact, then delete every object the
    new manifest does not reach (``compactor.purge``). ``check_redaction`` then looks for the
    secret in every object. False if the purge could not run. ``alone``: every process of the
    fleet has exited, so the purge need not wait out the rebuild age limit (a minute).
    """
    from compactor import Compactor, CompactorOptions
    from compactor.purge import purge_now

    try:
        purge_now(Compactor(store, CompactorOptions(worker="demo-final")), sid, alone=alone)
    except SessionStoreError as exc:
        err(f"sessionstore demo: purge failed ({exc})")
        return False
    return True


def run_demo(args: argparse.Namespace, ctx: Ctx) -> dict[str, Any]:
    """Run the demo; returns the JSON report (``report["ok"]`` is the verdict)."""
    from store.core import SessionStore

    size = size_from(args)
    run = run_id()
    loc = choose_location(args, ctx, run)
    log_dir = Path(tempfile.mkdtemp(prefix="sessionstore-demo-logs-"))
    status = StatusLine(sys.stderr)
    t0 = time.monotonic()
    removed = " (removed at the end; --keep keeps it)" if loc.removes_data and not args.keep else ""
    err(f"sessionstore demo: {size.workers} workers, {size.sessions} sessions x {size.turns} turns "
        f"on {loc.description}{removed}")
    store: SessionStore | None = None
    fleet: Fleet | None = None
    report: dict[str, Any] = {"ok": False}
    try:
        store = SessionStore.from_url(loc.objects_url, loc.redis_url, redis_prefix=loc.redis_prefix,
                                      compact_after_segments=COMPACT_AFTER_SEGMENTS, compact=False)
        secret = f"dtk_{uuid.uuid4().hex}"
        plans: dict[str, Plan] = {}
        stats = Stats()
        # Workers take a few seconds to start (a fresh interpreter each): start them first.
        fleet = Fleet(loc, size, args, log_dir)
        fleet.start()
        write_s, alone = _play(store, fleet, plans, stats, status, size, secret, log_dir)
        sessions = list(plans)
        # Purge the leaked token from storage now, not after the compactor's grace period:
        # every worker has stopped, so no reader can be holding a retired object, and none
        # can install a stale rebuild of Redis's state either (the purge's wait is skipped
        # when every one of them has exited).
        purged = False
        if stats.redaction is not None:
            err("purging the redacted text from storage ...")
            purged = _purge(store, stats.redaction["session"], secret, alone=alone)
        stats.compactions = count_compactions(store, sessions)
        err("verifying everything that was written ...")
        verification = _verify(store, log_dir, stats, sessions, secret, purged=purged)
        report = _report(store, loc, args, size, stats, verification, sessions, write_s, t0)
        if not ctx.json:
            print_report(store, report, report["tree_session"])
        return report
    finally:
        _clean_up(fleet, store, loc, log_dir, keep=bool(args.keep))
        report.setdefault("summary", {})


def _play(store: SessionStore, fleet: Fleet, plans: dict[str, Plan], stats: Stats, status: StatusLine,
          size: DemoSize, secret: str, log_dir: Path) -> tuple[float, bool]:
    """Create the shared sessions (each named, as pi does) and their plans, then let the fleet
    play every step. Returns the seconds the writing took, and whether every process of the
    fleet has exited since."""
    from store.core import uuid7
    from store.demo.agent import RecordingStore

    with open(log_dir / "main.jsonl", "ab") as main_log:
        main_rec = RecordingStore(store, main_log)
        from store.manager import SessionManager

        for i in range(size.sessions):
            sid = uuid7()
            store.create_session(sid, cwd=f"/home/agent/project-{i + 1}")
            SessionManager(main_rec, sid).append_session_info(f"project {i + 1}")  # type: ignore[arg-type]
            steps = session_steps(i, size.turns, secret)
            plans[sid] = Plan(sid, steps)
            stats.turns_total += sum(1 for s in steps if s["kind"] == "turn")
        fleet.wait_ready()
        write_s = schedule(store, fleet, plans, stats, status, size)
        alone = fleet.stop()
    return write_s, alone


def _verify(store: SessionStore, log_dir: Path, stats: Stats, sessions: list[str], secret: str, *,
            purged: bool) -> Verification:
    """Every check of ``store.demo.check`` over everything the run wrote."""
    from store.demo.check import (
        Verification,
        check_forks,
        check_history,
        check_redaction,
        check_round_trip,
        check_store,
        load_ops,
    )

    verification = Verification()
    ops = load_ops(sorted(log_dir.glob("*.jsonl")))
    check_history(store, ops, verification)
    check_store(store, verification)
    check_forks(store, stats.forks, verification)
    check_round_trip(store, sessions, verification)
    check_redaction(store, secret, sessions, stats.redaction["session"] if stats.redaction else None,
                    verification, purged=purged)
    verification.add("workers", stats.errors)
    return verification


def _report(store: SessionStore, loc: Location, args: argparse.Namespace, size: DemoSize, stats: Stats,
            verification: Verification, sessions: list[str], write_s: float, t0: float) -> dict[str, Any]:
    """The JSON report: the verdict, the verification, the run's figures, where it ran, and
    the session whose tree is drawn."""
    entries = 0
    branches = 0
    for sid in sessions:
        s = store.load_session(sid)
        entries += len(s)
        branches += sum(1 for e in s.entries if not s.get_children(e["id"]))
    total_bytes, objects = bytes_in_store(store)
    tree_sid = pick_tree_session(store, sessions)
    summary = {
        "workers": size.workers,
        "sessions": len(sessions),
        "forks": len(stats.forks),
        "entries": entries,
        "branches": branches,
        "turns": stats.turns_done,
        "turns_planned": stats.turns_total,
        "jobs": stats.jobs,
        "handoffs": stats.handoffs,
        "double_turns": stats.double_turns,
        "appends": verification.acknowledged,
        "appends_per_second": round(verification.acknowledged / write_s, 1) if write_s else 0.0,
        "conflicts_handled": verification.conflicts,
        "branch_summaries": stats.branch_summaries,
        "context_compactions": stats.context_compactions,
        "compactions": stats.compactions,
        "redactions": 1 if stats.redaction else 0,
        "bytes": total_bytes,
        "objects": objects,
        "write_seconds": round(write_s, 2),
        "seconds": round(time.monotonic() - t0, 2),
    }
    return {
        "ok": verification.ok,
        "verification": verification.to_json(),
        "summary": summary,
        "store": {"objects": loc.objects_url, "redis": loc.redis_url or "embedded",
                  "redis_prefix": loc.redis_prefix, "kept": bool(args.keep) or not loc.removes_data},
        "tree_session": tree_sid,
    }


def _clean_up(fleet: Fleet | None, store: SessionStore | None, loc: Location, log_dir: Path, *,
              keep: bool) -> None:
    """Stop the workers; unless --keep, remove the run's data and stop the embedded server."""
    if fleet is not None:
        fleet.stop()
    if store is not None:
        if not keep and loc.external:
            cleanup_external(store, loc)
        if not keep:
            # Before the store closes: a store that started the embedded server says on
            # close that it leaves it running, which would not be true here.
            stop_embedded(loc)
        store.close()
    cleanup_local(loc, log_dir, keep=keep)


def run_demo_command(args: argparse.Namespace, ctx: Ctx) -> int:
    report = run_demo(args, ctx)
    if ctx.json:
        out(dump_json(report))
    return Exit.OK if report.get("ok") else Exit.FAILED

