"""Retention and the trash: ``retention set|show|run``, ``trash ls|restore|purge``
(docs/lifecycle.md)."""

from __future__ import annotations

import argparse
import re
from typing import Any

from store.cli.common import CliError, Exit, dump_json, err, iso_of_ms, out, parse_time_ms
from store.cli.ctx import Ctx
from store.clock import now_ms
from store.errors import InvalidRetentionError, NotInTrashError
from store.formats.layout import check_session_id
from store.lifecycle.retention import DAY_MS, DEFAULT_GRACE_MS, Retention, RetentionPolicy

_UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": DAY_MS, "w": 7 * DAY_MS}
_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)([smhdw]?)\Z")


def duration_ms(text: str) -> int:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w``, or seconds: milliseconds."""
    m = _DURATION.match(text.strip())
    if m is None:
        raise InvalidRetentionError(f"not a duration: {text!r} (e.g. 30d, 12h, 90m)")
    return int(float(m.group(1)) * _UNITS[m.group(2) or "s"])


def _time_ms(text: str) -> int:
    when = parse_time_ms(text)
    if when is None:
        raise InvalidRetentionError(f"not a time: {text!r} (ISO 8601 or epoch ms)")
    return when


def _retention_dict(r: Retention | None) -> dict[str, Any]:
    if r is None:
        return {"mode": "policy"}
    return {"mode": r.mode, "ttl_ms": r.ttl_ms, "expires_at": iso_of_ms(r.expires_at_ms),
            "set_at": iso_of_ms(r.set_at_ms)}


def _policy(args: argparse.Namespace) -> RetentionPolicy:
    idle = getattr(args, "idle", None)
    grace = getattr(args, "grace", None)
    return RetentionPolicy(idle_ms=None if idle is None else duration_ms(idle),
                           grace_ms=DEFAULT_GRACE_MS if grace is None else duration_ms(grace))


def cmd_retention(args: argparse.Namespace, ctx: Ctx) -> int:
    store = ctx.store
    if args.action == "run":
        from compactor.retention import RetentionOptions, RetentionRunner

        runner = RetentionRunner(store, _policy(args), RetentionOptions(poll_ms=0), worker="cli")
        report = runner.run(dry_run=args.dry_run, sweep=True)
        if not report.ran:
            raise CliError("a retention run is under way elsewhere (a compactor worker): try again",
                           Exit.CONFLICT)
        result: dict[str, Any] = {"dry_run": report.dry_run, "trashed": list(report.trashed), "purged": list(report.purged),
                  "held_by_forks": list(report.held), "changed_meanwhile": list(report.changed),
                  "errors": list(report.errors)}
        if ctx.json:
            out(dump_json(result))
        else:
            verb = "would " if report.dry_run else ""
            for key, label in (("trashed", "trash"), ("purged", "purge"), ("held_by_forks", "keep (forks)")):
                for sid in result[key]:
                    out(f"{verb}{label:<12} {sid}")
            if not any(result[k] for k in ("trashed", "purged", "held_by_forks")):
                err("nothing due")
        return Exit.FAILED if report.errors else Exit.OK
    if not args.sessions:
        if args.action == "show":
            stats = store.coord.retention_stats()
            out(dump_json(stats) if ctx.json else "  ".join(f"{k} {v}" for k, v in sorted(stats.items())) or "no retention events yet")
            return Exit.OK
        raise CliError("name a session", Exit.USAGE)
    rows = []
    for sid in map(check_session_id, args.sessions):
        if args.action == "set":
            given = [x for x in (args.ttl, args.expires_at, args.keep or None) if x]
            if len(given) != 1:
                raise CliError("give one of --ttl, --expires-at, --keep", Exit.USAGE)
            if args.ttl:
                r = Retention.sliding(duration_ms(args.ttl))
            elif args.expires_at:
                r = Retention.absolute(_time_ms(args.expires_at))
            else:
                r = Retention.keep()
            rows.append({"session": sid, **_retention_dict(store.set_retention(sid, r))})
        else:
            rows.append(retention_state(store, sid, _policy(args)))
    if ctx.json:
        out(dump_json(rows if len(rows) > 1 else rows[0]))
    else:
        for row in rows:
            out("  ".join(f"{k}={v}" for k, v in row.items() if v is not None))
    return Exit.OK


def retention_state(store: Any, sid: str, policy: RetentionPolicy, now: int | None = None) -> dict[str, Any]:
    """A session's setting, when it expires under it (or ``policy``), and its trash state."""
    view, _ = store.retention.view(sid)
    decision = store.retention.decide(view, policy, now_ms() if now is None else now)
    row: dict[str, Any] = {"session": sid, **_retention_dict(view.retention)}
    if view.trash is not None:
        row["trash"] = "purging" if view.trash.purging else f"purged after {iso_of_ms(view.trash.purge_after_ms)}"
    elif decision.action == "trash":
        row["expires"] = "now (at the next retention run)"
    elif decision.action == "wait":
        row["expires"] = iso_of_ms(decision.next_ms)
    else:
        row["expires"] = "never"
    return row


def cmd_trash(args: argparse.Namespace, ctx: Ctx) -> int:
    store = ctx.store
    if args.action == "ls":
        items = store.list_trash()
        rows: list[dict[str, Any]] = [{"session": i.session_id, "purge_after": iso_of_ms(i.purge_after_ms), "purging": i.purging,
                 "trashed_at": iso_of_ms(i.trashed_at_ms or None), "reason": i.reason, "held_by_forks": list(i.forks)}
                for i in items]
        if ctx.json:
            out(dump_json(rows))
        elif not rows:
            err("the trash is empty")
        else:
            for r in rows:
                state = "purging" if r["purging"] else f"purge after {r['purge_after']}"
                held = f"  kept for forks {', '.join(r['held_by_forks'])}" if r["held_by_forks"] else ""
                out(f"{r['session']}  {state}  ({r['reason']}){held}")
        return Exit.OK
    if not args.sessions:
        raise CliError(f"trash {args.action}: name the sessions", Exit.USAGE)
    done = []
    for sid in map(check_session_id, args.sessions):
        if args.action == "restore":
            store.restore_session(sid)
        else:
            view, _ = store.retention.view(sid)
            if view.trash is None:
                raise NotInTrashError(sid)
            store.retention.purge(view, now=now_ms(), force=args.now)
        done.append(sid)
        if not ctx.json:
            out(f"{'restored' if args.action == 'restore' else 'purged'} {sid}")
    if ctx.json:
        out(dump_json({args.action + "d": done}))
    return Exit.OK


def add_retention_commands(add: Any) -> None:
    p = add("retention", "a session's TTL (set, show), or a retention run now (run [--dry-run])", cmd_retention)
    p.add_argument("action", choices=["set", "show", "run"])
    p.add_argument("sessions", nargs="*", metavar="SESSION")
    p.add_argument("--ttl", metavar="DURATION", help="set: expire this long after the last activity (30d, 12h, ...)")
    p.add_argument("--expires-at", metavar="TIME", help="set: expire at this time (ISO 8601 or epoch ms)")
    p.add_argument("--keep", action="store_true", help="set: never expire, whatever the store-wide policy")
    p.add_argument("--idle", metavar="DURATION",
                   help="show/run: the store-wide policy: sessions without a TTL expire this long after their last activity")
    p.add_argument("--grace", metavar="DURATION", help="run: how long the trash keeps a session restorable (default 7d)")
    p.add_argument("--dry-run", action="store_true", help="run: show what would be trashed and purged, change nothing")

    p = add("trash", "sessions in the trash: ls, restore SESSION..., purge SESSION... [--now]", cmd_trash)
    p.add_argument("action", choices=["ls", "restore", "purge"])
    p.add_argument("sessions", nargs="*", metavar="SESSION")
    p.add_argument("--now", action="store_true", help="purge: before the grace period is over")
