"""The session commands: create, append, ls, info, show, context, fork, redact, delete."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from store.cli.common import (
    CliError,
    Exit,
    dump_json,
    err,
    human_age,
    is_tty,
    iso_of_ms,
    out,
    parse_time_ms,
    read_jsonl,
)
from store.cli.ctx import Ctx, now_ms
from store.cli.operate import compactor_for, purged_line
from store.cli.render import draw_tree
from store.clock import iso_now
from store.formats.layout import check_session_id
from store.protocol.listing import SessionFilter

if TYPE_CHECKING:
    from store.core import SessionStore
    from store.model.session import Session
    from store.protocol.read import SessionData
    from store.formats.records import SessionInfo


# --- create / append -----------------------------------------------------------------------------


def cmd_create(args: argparse.Namespace, ctx: Ctx) -> int:
    store = ctx.store
    cwd = args.cwd if args.cwd is not None else os.getcwd()
    handle = store.create_session(args.session, cwd=cwd)
    sid = handle.session_id
    if args.name:
        store.open_session(sid).append_session_info(args.name)
    if ctx.json:
        out(dump_json({"session": sid, "name": args.name or None, "cwd": cwd}))
    else:
        out(sid)
    return Exit.OK


def cmd_append(args: argparse.Namespace, ctx: Ctx) -> int:
    from store.errors import ConflictError, ContentionError
    from store.formats.records import EMPTY_TAIL

    sid = check_session_id(args.session)
    if args.file in (None, "-"):
        if is_tty(sys.stdin):
            err("sessionstore: reading entries from the terminal, one JSON object a line; "
                "Ctrl-D to append them as one batch, Ctrl-C to cancel")
        entries = list(read_jsonl(sys.stdin.buffer, "stdin"))
        source = "stdin"
    else:
        with open(args.file, "rb") as fh:
            entries = list(read_jsonl(fh, args.file))
        source = args.file
    if not entries:
        raise CliError(f"{source}: no entries to append", Exit.USAGE)
    expected: str | None = args.expect_tail
    if args.expect_empty:
        expected = EMPTY_TAIL
    store = ctx.store
    try:
        for _ in range(store.options.max_rounds):
            filled, tail = fill_entries(store, sid, entries, expected)
            try:
                # An entry whose parentId was filled from the tail goes onto that tail or not at
                # all: concurrent appends of such entries chain, one after the other, instead of
                # landing as siblings of the tail they all read.
                result = store.append_session_entries(sid, filled, expected if expected is not None else tail)
                break
            except ConflictError:
                if expected is not None:
                    raise
                continue  # another writer moved the tail: chain onto the new one
        else:
            raise ContentionError(f"session {sid!r}: lost every round to other writers; try again")
    except ConflictError as exc:
        if not args.expect_empty:
            raise
        raise CliError(
            f"session {sid!r} is not empty (its last entry is {exc.actual_tail_entry_id!r}, segment "
            f"{exc.actual_seq}): --expect-empty refused the append; append without it, or with "
            f"--expect-tail {exc.actual_tail_entry_id}",
            Exit.CONFLICT,
        ) from None
    if ctx.json:
        out(dump_json({"session": sid, "seq": result.seq, "last": result.last_appended_entry_id,
                       "count": result.appended_count}))
    else:
        noun = "entry" if result.appended_count == 1 else "entries"
        out(f"appended {result.appended_count} {noun} to {sid} as segment {result.seq} "
            f"(last {result.last_appended_entry_id})")
    return Exit.OK


def fill_entries(
    store: SessionStore, sid: str, entries: list[dict[str, Any]], expected: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """Hand-written entries made whole: a missing ``id`` minted, a missing ``timestamp`` set
    to now, a missing ``parentId`` chained to the tail (or to the previous entry of the batch).
    Returns the entries and the tail the first one was chained to (None if it was not:
    the caller appends strictly on that tail, so that the chain holds).

    A re-send of a batch must be the same batch, or the store answers "same id, different
    content" instead of the original result. So an entry whose ``id`` is given and already
    in the session takes its missing ``timestamp`` and ``parentId`` from the stored entry:
    re-sending a file after an unknown outcome (exit 7) gives exactly what the first attempt
    sent, whichever way that attempt went (pi's meaning is kept: the timestamp is when the
    entry was first written). Minted ids cannot be re-sent: give ids for that.
    """
    from store.manager import new_entry_id

    missing = [e for e in entries if "timestamp" not in e or "parentId" not in e]
    stored: dict[str, dict[str, Any]] = {}
    given = {e["id"] for e in missing if isinstance(e.get("id"), str)}
    if given:
        # Only then is the session read: a batch of fully written entries costs nothing here.
        stored = {e["id"]: e for e in store.load_session_entries(sid) if e.get("id") in given}
    parent: str | None = None
    tail: str | None = None
    first_id = entries[0].get("id")
    if "parentId" not in entries[0] and not (isinstance(first_id, str) and first_id in stored):
        tail = expected if expected is not None else store.get_tail(sid).last_entry_id
        parent = tail or None
    taken = {e["id"] for e in entries if isinstance(e.get("id"), str)}
    filled: list[dict[str, Any]] = []
    now = iso_now()
    for entry in entries:
        if "id" not in entry:
            eid = new_entry_id(taken)
            taken.add(eid)
        else:
            eid = entry["id"]
        before = stored.get(eid) if isinstance(eid, str) else None
        if before is not None:
            default_parent, default_time = before.get("parentId"), before.get("timestamp", now)
        else:
            default_parent, default_time = parent, now
        # pi's key order, then the entry's own fields in theirs.
        head = {"type": entry.get("type"), "id": eid, "parentId": entry.get("parentId", default_parent),
                "timestamp": entry.get("timestamp", default_time)}
        if "type" not in entry:
            del head["type"]  # left for the store to refuse, with its own message
        filled.append({**head, **{k: v for k, v in entry.items() if k not in head}})
        parent = eid if isinstance(eid, str) else parent
    return filled, tail


# --- reading -------------------------------------------------------------------------------------


def _session_row(info: SessionInfo) -> dict[str, Any]:
    updated = info.updated_at_ms or info.created_at_ms
    return {
        "session": info.session_id,
        "name": info.name,
        "kind": info.kind,
        "entries": info.entry_count,
        "bytes": info.bytes,
        "first_message": info.first_message,
        "created_at_ms": info.created_at_ms,
        "updated_at_ms": updated,
        "created_at": iso_of_ms(info.created_at_ms),
        "updated_at": iso_of_ms(updated),
        "cwd": info.cwd,
        "fork_of": info.fork_of,
        "trash_purge_after_ms": info.trash_purge_after_ms,
    }


def _listing_filter(args: argparse.Namespace) -> SessionFilter:
    since = None
    if args.since is not None:
        since = _time_ms(args.since)
    return SessionFilter(
        cwd=args.cwd, cwd_prefix=args.cwd_prefix, kind=args.kind,
        updated_since_ms=since, name_contains=args.name, trashed=bool(getattr(args, "trashed", False)),
    )


def _time_ms(text: str) -> int:
    when = parse_time_ms(text)
    if when is None:
        raise CliError(f"--since {text!r}: not epoch milliseconds or an ISO 8601 time", Exit.USAGE)
    return when


def cmd_ls(args: argparse.Namespace, ctx: Ctx) -> int:
    store = ctx.store
    filters = _listing_filter(args)
    paged = args.page_size is not None or args.cursor is not None
    if paged:
        if args.limit is not None:
            raise CliError("--limit sorts every session: not with --page-size or --cursor", Exit.USAGE)
        page = store.list_sessions(cursor=args.cursor, limit=args.page_size, filters=filters)
        rows = [_session_row(i) for i in page.items]
        next_cursor = page.next_cursor
    else:
        rows = [_session_row(i) for i in store.iter_sessions(page_size=1000, filters=filters)]
        rows.sort(key=lambda r: r["updated_at_ms"] or 0, reverse=True)
        if args.limit is not None:
            rows = rows[: args.limit]
        next_cursor = None
    if ctx.json:
        out(dump_json({"sessions": rows, "next_cursor": next_cursor} if paged else rows))
        return Exit.OK
    if not rows:
        err("no sessions" if not paged or next_cursor is None else "no sessions on this page")
    else:
        now = now_ms()
        width = max(7, max(len(r["session"]) for r in rows))
        out(f"{'SESSION':<{width}}  {'ENTRIES':>7}  {'UPDATED':<9}  NAME")
        for r in rows:
            name = r["name"] or (f"[{r['kind']}]" if r["kind"] != "pi" else "")
            if r["fork_of"]:
                name = (name + " " if name else "") + f"(fork of {r['fork_of']})"
            if not r["name"] and r["first_message"]:
                name = (name + " " if name else "") + f"“{_cut(r['first_message'], 60)}”"
            if r.get("trash_purge_after_ms") is not None:
                name = f"[trash: purged after {iso_of_ms(r['trash_purge_after_ms'])}] " + name
            out(f"{r['session']:<{width}}  {r['entries']:>7}  {human_age(r['updated_at_ms'], now):<9}  {name}")
    if next_cursor is not None:
        err(f"more: sessionstore ls --cursor {next_cursor}")
    return Exit.OK


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _read_with_model(store: SessionStore, sid: str) -> tuple[SessionData, Session]:
    """The session as stored and with pi's semantics, from one read (entries the store
    returns were validated when appended: not again)."""
    from store.model.session import Session

    data = store.read_session(sid)
    return data, Session(data.header.pi_header, data.all_entries, validated=True)


def cmd_info(args: argparse.Namespace, ctx: Ctx) -> int:
    store = ctx.store
    sid = check_session_id(args.session)
    from store.cli.retention import retention_state
    from store.errors import SessionTrashedError
    from store.lifecycle.retention import RetentionPolicy

    try:
        data, session = _read_with_model(store, sid)
    except SessionTrashedError as exc:
        state = retention_state(store, sid, RetentionPolicy())
        state["restore"] = f"sessionstore trash restore {sid}"
        out(dump_json(state) if ctx.json else "\n".join(f"{k:<26} {v}" for k, v in state.items()))
        return Exit.NOT_FOUND if exc.purging else Exit.OK
    header = data.header
    info: dict[str, Any] = {
        "session": sid,
        "name": session.name,
        "entries": len(session),
        "own_entries": len(data.entries),
        "leaf": session.leaf_id,
        "seq": data.seq,
        # Storage (the compactor's manifests) and pi's context compactions are different
        # things: each has its own name here and in `show`.
        "manifest": data.manifest.generation if data.manifest else 0,
        "segments_after_manifest": data.seq - (data.manifest.through_seq if data.manifest else 0),
        "context_compactions": sum(1 for e in session.entries if e.get("type") == "compaction"),
        "created_at": iso_of_ms(header.created_at_ms),
        "created_at_ms": header.created_at_ms,
        "incarnation": header.incarnation,
        "cwd": header.pi_header.get("cwd"),
        "fork": None if header.fork is None else asdict(header.fork),
        "redacted": len(session.redacted_ids),
        "labels": len(session.labels),
    }
    if header.kind == "pi":
        # Expiry by the session's own TTL (the store-wide idle policy is the worker's).
        state = retention_state(store, sid, RetentionPolicy())
        info["retention"] = state["mode"]
        info["expires"] = state.get("expires")
    if ctx.json:
        out(dump_json(info))
        return Exit.OK
    for key, value in info.items():
        if key == "created_at_ms":
            continue  # the ISO line says it (--json has both)
        if key == "fork" and value:
            value = f"{value['session_id']} at entry {value['entry_id']}"
        if key == "manifest" and not value:
            value = "none (never compacted)"
        out(f"{key.replace('_', ' '):<26} {'-' if value is None else value}")
    return Exit.OK


def cmd_show(args: argparse.Namespace, ctx: Ctx) -> int:
    store = ctx.store
    sid = check_session_id(args.session)
    data, session = _read_with_model(store, sid)
    if ctx.json:
        out(dump_json({
            "session": sid,
            "name": session.name,
            "leaf": session.leaf_id,
            "entries": len(session),
            "manifest": data.manifest.generation if data.manifest else 0,
            "context_compactions": sum(1 for e in session.entries if e.get("type") == "compaction"),
            "tree": [node.to_dict() for node in session.get_tree()],
        }))
        return Exit.OK
    out(describe_session(sid, session, data))
    for line in draw_tree(session, stream=sys.stdout):
        out(line)
    return Exit.OK


def describe_session(sid: str, session: Any, data: Any) -> str:
    """The header line of ``show``: name, size, branches, context compactions (pi's
    ``compaction`` entries), storage (segments after the compactor's latest manifest), fork."""
    leaves = sum(1 for e in session.entries if not session.get_children(e["id"]))
    parts = [f"session {sid}"]
    if session.name:
        parts.append(f"{session.name!r}")
    parts.append(f"{len(session)} entries")
    parts.append(f"{leaves} branch{'es' if leaves != 1 else ''}")
    pi_compactions = sum(1 for e in session.entries if e.get("type") == "compaction")
    if pi_compactions:
        parts.append(f"{pi_compactions} context compaction{'s' if pi_compactions != 1 else ''}")
    live = data.seq - (data.manifest.through_seq if data.manifest else 0)
    stored = f"stored as {live} segment{'s' if live != 1 else ''}"
    if data.manifest is not None:
        stored += f" after manifest {data.manifest.generation}"
    parts.append(stored)
    if data.header.fork is not None:
        parts.append(f"fork of {data.header.fork.session_id} at {data.header.fork.entry_id}")
    if session.redacted_ids:
        parts.append(f"{len(session.redacted_ids)} redacted")
    return " · ".join(parts)


def cmd_context(args: argparse.Namespace, ctx: Ctx) -> int:
    session = ctx.store.load_session(check_session_id(args.session))
    context = session.build_context(args.leaf)
    out(dump_json(context, pretty=not args.compact))
    return Exit.OK


# --- writing -------------------------------------------------------------------------------------


def cmd_fork(args: argparse.Namespace, ctx: Ctx) -> int:
    store = ctx.store
    sid = check_session_id(args.session)
    entry = args.entry
    if entry is None:
        entry = store.load_session(sid).leaf_id
        if entry is None:
            raise CliError(f"session {sid!r} has no entries to fork from", Exit.USAGE)
    handle = store.branch_from_entry(sid, entry, args.id)
    if args.name:
        store.open_session(handle.session_id).append_session_info(args.name)
    if ctx.json:
        out(dump_json({"session": handle.session_id, "source": sid, "entry": entry}))
    else:
        out(handle.session_id)
    return Exit.OK


def cmd_redact(args: argparse.Namespace, ctx: Ctx) -> int:
    sid = check_session_id(args.session)
    result = ctx.store.redact(sid, args.entry, args.reason)
    row: dict[str, Any] = {"session": sid, "entry": args.entry, "redaction": result.last_appended_entry_id,
                           "seq": result.seq, "purged": False}
    purge = None
    if args.purge_now:
        from compactor.purge import purge_now

        purge = purge_now(compactor_for(ctx, None), sid, through_seq=result.seq)
        row.update(purged=True, manifest=purge.generation, deleted=len(purge.deleted))
    if ctx.json:
        out(dump_json(row))
        return Exit.OK
    out(f"redacted {args.entry} in {sid} (redaction {result.last_appended_entry_id}, segment {result.seq}): "
        "hidden from every reader now")
    if purge is not None:
        out(purged_line(sid, purge))
    else:
        out("its bytes stay in storage until a compaction rewrites the session and gc then deletes the "
            "old objects, after the grace period (default 10 min); `--purge-now` deletes them now")
    return Exit.OK


def cmd_delete(args: argparse.Namespace, ctx: Ctx) -> int:
    sid = check_session_id(args.session)
    if not args.yes:
        raise CliError(f"deleting {sid!r} removes every entry: pass --yes to confirm", Exit.USAGE)
    ctx.store.delete_session(sid)
    if ctx.json:
        out(dump_json({"session": sid, "deleted": True}))
    else:
        out(f"deleted {sid}")
    return Exit.OK

