"""Operating a store: ``compact``, ``gc``, ``verify``, ``doctor`` and ``embedded`` (the
checks themselves are ``store.cli.verify`` and ``store.cli.doctor``)."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from store.cli.common import CliError, Exit, dump_json, err, human_bytes, iso_of_ms, out
from store.cli.ctx import Ctx, counted, now_ms
from store.formats.layout import check_session_id

# --- compaction ----------------------------------------------------------------------------------


def compactor_for(ctx: Ctx, grace: float | None) -> Any:
    from compactor import Compactor, CompactorOptions
    from compactor.config import DEFAULT_GRACE_MS

    grace_ms = DEFAULT_GRACE_MS if grace is None else int(grace * 1000)
    return Compactor(ctx.store, CompactorOptions(grace_ms=grace_ms))


def cmd_compact(args: argparse.Namespace, ctx: Ctx) -> int:
    if args.sessions and args.all:
        raise CliError("give sessions or --all, not both", Exit.USAGE)
    # Like gc and verify: no session named means every session (--all says so explicitly).
    sids = [check_session_id(s) for s in args.sessions] or [i.session_id for i in ctx.store.iter_sessions(page_size=1000)]
    compactor = compactor_for(ctx, args.grace)
    grace_ms = compactor.options.grace_ms
    results: list[dict[str, Any]] = []
    for sid in sids:
        rounds = 0
        while True:
            res = compactor.compact_session(sid)
            rounds += 1
            row = asdict(res)
            results.append(row)
            if not ctx.json:
                if res.outcome == "compacted":
                    first, last = res.segments_merged or (0, 0)
                    tomb = ""
                    if res.redactions_purged:
                        tomb = (f", {res.redactions_purged} redacted entries written as tombstones; the old objects "
                                f"holding them go at gc after {iso_of_ms(now_ms() + grace_ms)}"
                                + ("" if args.purge_now else " (or now with --purge-now)"))
                    kept = f", {res.bases_kept} bases kept as they are" if res.bases_kept else ""
                    out(f"{sid}: segments {first}-{last} -> manifest {res.generation} "
                        f"({res.entries} entries, {human_bytes(res.bytes_in)} -> {human_bytes(res.bytes_out)}{kept}{tomb})")
                elif res.outcome == "nothing":
                    out(f"{sid}: nothing to compact (manifest {res.generation})")
                else:
                    out(f"{sid}: another compactor wrote manifest {res.generation} first")
            if res.outcome != "compacted" or not res.more_pending or rounds >= 100:
                break
        if args.purge_now:
            from compactor.purge import purge_now

            purge = purge_now(compactor, sid)
            results.append({"session_id": sid, "outcome": "purged", "generation": purge.generation,
                            "through_seq": purge.through_seq,
                            "deleted": {k: purge.count(k) for k in ("segment", "base", "manifest")}})
            if not ctx.json:
                out(purged_line(sid, purge))
    if ctx.json:
        out(dump_json(results))
    elif not sids:
        err("no sessions")
    return Exit.OK


def cmd_gc(args: argparse.Namespace, ctx: Ctx) -> int:
    compactor = compactor_for(ctx, args.grace)
    if args.sessions:
        total = None
        for sid in args.sessions:
            res = compactor.gc_session(check_session_id(sid))
            total = res if total is None else total + res
    else:
        total = compactor.gc()
    assert total is not None
    kinds: dict[str, int] = {}
    for kind, _ in total.deleted:
        kinds[kind] = kinds.get(kind, 0) + 1
    if ctx.json:
        out(dump_json({"sessions": total.sessions, "deleted": len(total.deleted), "by_kind": kinds,
                       "waiting": total.waiting, "errors": list(total.errors)}))
    else:
        detail = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "nothing"
        waiting = ""
        if total.waiting:
            # --grace only lengthens the wait: each manifest records the grace of the
            # compaction that wrote it (docs/compaction.md).
            waiting = (f"; {total.waiting} objects wait for their grace period (the one each compaction "
                       "recorded; `compact --purge-now` deletes a session's old objects now)")
        out(f"gc: {total.sessions} sessions, deleted {detail}{waiting}")
        for e in total.errors:
            out(f"error: {e}")
    return Exit.FAILED if total.errors else Exit.OK


def purged_line(sid: str, purge: Any) -> str:
    kinds = ", ".join(counted(purge.count(k), k, k + "s") for k in ("segment", "base", "manifest") if purge.count(k))
    return (f"{sid}: purged: every object older than manifest {purge.generation} deleted now "
            f"({kinds or 'nothing left to delete'}); redacted content is in no object of the store")


# --- checks --------------------------------------------------------------------------------------


def cmd_verify(args: argparse.Namespace, ctx: Ctx) -> int:
    from store.cli.verify import verify_store

    if args.canary is not None:
        return _verify_canary(args, ctx)
    store = ctx.store
    sids = [check_session_id(s) for s in args.sessions] or None
    checks = verify_store(store, sids)
    faults = sum(len(c.faults) for c in checks)
    warnings = sum(len(c.warnings) for c in checks)
    ok = faults == 0 and not (args.strict and warnings)
    if ctx.json:
        out(dump_json({"ok": ok, "sessions": len(checks), "faults": faults, "warnings": warnings,
                       "results": [c.to_json() for c in checks]}))
    else:
        for c in checks:
            if c.faults:
                state = "FAULT"
            elif c.warnings:
                state = "warn "
            else:
                state = "ok   "
            extra = f", fork of {c.fork_of}" if c.fork_of else ""
            stored = f"{c.segments} segments after manifest {c.generation}" if c.generation else f"{c.segments} segments"
            out(f"{state} {c.session_id} ({c.entries} entries, {stored}{extra})")
            for f in c.faults:
                out(f"      fault: {f}")
            for w in c.warnings:
                out(f"      warning: {w}")
        out(f"verified {len(checks)} sessions: {faults} faults, {warnings} warnings")
    return Exit.OK if ok else Exit.FAILED


def _verify_canary(args: argparse.Namespace, ctx: Ctx) -> int:
    from compactor.erasure import scan_for

    if args.sessions:
        raise CliError("--canary scans the whole store: name no session", Exit.USAGE)
    report = scan_for(ctx.store, args.canary)
    if ctx.json:
        out(dump_json({"ok": report.clean, "objects_scanned": report.objects_scanned,
                       "redis_keys_scanned": report.redis_keys_scanned, "vanished": report.vanished,
                       "hits": [asdict(h) for h in report.hits]}))
    else:
        for h in report.hits:
            out(f"FOUND in {h.where} {h.key}" + (f" ({h.part})" if h.part else ""))
        verdict = "found" if report.hits else "not found"
        out(f"canary {verdict}: scanned {report.objects_scanned} objects and "
            f"{report.redis_keys_scanned} Redis keys ({len(report.hits)} hits)")
    return Exit.OK if report.clean else Exit.FAILED


def cmd_erase(args: argparse.Namespace, ctx: Ctx) -> int:
    from compactor.erasure import erase_matching, erase_sessions

    if not args.yes and not args.dry_run:
        raise CliError("an erasure cannot be undone: pass --yes to confirm (or --dry-run)", Exit.USAGE)
    if args.matching is None:
        if not args.sessions:
            raise CliError("name the sessions to erase (or give --matching TEXT)", Exit.USAGE)
        results = erase_sessions(ctx.store, args.sessions, dry_run=args.dry_run)
    else:
        sids = [check_session_id(s) for s in args.sessions] or None
        results = erase_matching(compactor_for(ctx, None), args.matching, sids, dry_run=args.dry_run)
    if ctx.json:
        out(dump_json({"dry_run": args.dry_run, "results": [r.to_json() for r in results]}))
        return Exit.OK
    for r in results:
        what = {
            "deleted": f"deleted: {r.objects_deleted} objects, {r.redis_keys_dropped} Redis keys",
            "would delete": f"would delete {r.objects_deleted} objects and {r.redis_keys_dropped} Redis keys",
            "redacted": f"redacted {len(r.entries)} entries, purged {r.objects_deleted} objects",
            "would redact": f"would redact {len(r.entries)} entries: {', '.join(r.entries)}",
            "unchanged": "nothing to erase",
        }[r.action]
        keys = ", data keys destroyed" if r.keys_destroyed else ""
        out(f"{r.session_id}: {what}{keys}")
        for note in r.notes:
            out(f"  note: {note}")
    return Exit.OK


def cmd_doctor(args: argparse.Namespace, ctx: Ctx) -> int:
    from store.cli.doctor import run_doctor

    checks = run_doctor(ctx.config)
    failed = [c for c in checks if c.status == "fail"]
    warned = [c for c in checks if c.status == "warn"]
    ok = not failed and not (args.strict and warned)
    if ctx.json:
        out(dump_json({"ok": ok, "checks": [c.to_json() for c in checks]}))
    else:
        for c in checks:
            out(f"{c.status.upper():<4}  {c.name:<28} {c.detail}")
        out(f"{len(checks)} checks: {len(checks) - len(failed) - len(warned)} ok, {len(warned)} warnings, "
            f"{len(failed)} failed")
    return Exit.OK if ok else Exit.FAILED


def cmd_embedded(args: argparse.Namespace, ctx: Ctx) -> int:
    from store.backends.embedded import EmbeddedRedis

    directory = ctx.config.local_dir
    if directory is None or ctx.config.redis_url is not None:
        raise CliError("the embedded Redis exists only for a local directory without --redis", Exit.USAGE)
    embedded = EmbeddedRedis(directory / ".redis")
    if args.action == "stop":
        pid = embedded.pid()
        stopped = embedded.stop()
        if ctx.json:
            out(dump_json({"dir": str(embedded.dir), "stopped": stopped, "pid": pid}))
        else:
            out(f"stopped the embedded redis-server of {directory}" + (f" (pid {pid})" if pid else "")
                if stopped else f"no embedded redis-server running for {directory}")
        return Exit.OK
    pid = embedded.pid()
    answering = embedded.running()
    info = {"dir": str(embedded.dir), "socket": str(embedded.socket), "running": answering or pid is not None,
            "answering": answering, "pid": pid}
    if ctx.json:
        out(dump_json(info))
    elif answering:
        out(f"embedded redis-server for {directory}: running (pid {pid}, socket {embedded.socket})")
    elif pid is not None:
        out(f"embedded redis-server for {directory}: running but not answering yet (pid {pid}: loading, "
            "or stopped); `sessionstore embedded stop` stops it")
    else:
        out(f"embedded redis-server for {directory}: not running")
    return Exit.OK

