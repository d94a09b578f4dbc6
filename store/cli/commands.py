"""The subcommands. Each takes the parsed arguments and a ``Ctx`` and returns an exit code;
errors are raised and turned into one line and an exit code by ``store.cli.main``."""

from __future__ import annotations

import argparse
import functools
import os
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from store.cli.common import (
    CliError,
    Config,
    Exit,
    classify,
    dump_json,
    err,
    human_age,
    human_bytes,
    is_tty,
    iso_of_ms,
    open_store,
    out,
    read_jsonl,
)
from store.cli.render import StatusLine, bar, draw_tree, summarize
from store.errors import (
    BackendError,
    ObjectNotFoundError,
    SessionNotFoundError,
    SessionStoreError,
)
from store.layout import check_session_id

if TYPE_CHECKING:
    from store.core import SessionStore


@dataclass
class Ctx:
    config: Config
    json: bool = False
    _store: SessionStore | None = field(default=None, repr=False)

    @property
    def store(self) -> SessionStore:
        if self._store is None:
            self._store = open_store(self.config)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def _now_ms() -> int:
    return int(time.time() * 1000)


def _iso_now() -> str:
    from store.manager import iso_now

    return iso_now()


# --- create / append ---------------------------------------------------------------------------


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
    from store.records import EMPTY_TAIL

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
    now = _iso_now()
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


# --- reading -----------------------------------------------------------------------------------


def _session_row(store: SessionStore, info: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "session": info.session_id,
        "name": None,
        "entries": None,
        "created_at_ms": info.created_at_ms,
        "updated_at_ms": info.updated_at_ms or info.created_at_ms,
        "created_at": iso_of_ms(info.created_at_ms),
        "updated_at": iso_of_ms(info.updated_at_ms or info.created_at_ms),
        "cwd": info.cwd,
        "fork_of": info.fork_of,
        "error": None,
    }
    try:
        session = store.load_session(info.session_id)
        row["name"] = session.name
        row["entries"] = len(session)
        row["leaf"] = session.leaf_id
    except SessionNotFoundError:
        row["error"] = "deleted meanwhile"
    except SessionStoreError as exc:
        row["error"] = f"unreadable: {exc}"
    return row


def cmd_ls(args: argparse.Namespace, ctx: Ctx) -> int:
    store = ctx.store
    infos = store.list_sessions()
    with ThreadPoolExecutor(max_workers=8) as pool:
        rows = list(pool.map(lambda i: _session_row(store, i), infos))
    rows = [r for r in rows if r["error"] != "deleted meanwhile"]
    rows.sort(key=lambda r: r["updated_at_ms"] or 0, reverse=True)
    if args.limit is not None:
        rows = rows[: args.limit]
    if ctx.json:
        out(dump_json(rows))
        return Exit.OK
    if not rows:
        err("no sessions")
        return Exit.OK
    now = _now_ms()
    width = max(7, max(len(r["session"]) for r in rows))
    out(f"{'SESSION':<{width}}  {'ENTRIES':>7}  {'UPDATED':<9}  NAME")
    for r in rows:
        name = r["name"] or ""
        if r["fork_of"]:
            name = (name + " " if name else "") + f"(fork of {r['fork_of']})"
        if r["error"]:
            name = f"! {r['error']}"
        entries = "-" if r["entries"] is None else str(r["entries"])
        out(f"{r['session']:<{width}}  {entries:>7}  {human_age(r['updated_at_ms'], now):<9}  {name}")
    return Exit.OK


def cmd_info(args: argparse.Namespace, ctx: Ctx) -> int:
    store = ctx.store
    sid = check_session_id(args.session)
    data = store.read_session(sid)
    from store.model.session import Session

    session = Session(data.header.pi_header, data.all_entries)
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
    data = store.read_session(sid)
    from store.model.session import Session

    session = Session(data.header.pi_header, data.all_entries)
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


def cmd_export(args: argparse.Namespace, ctx: Ctx) -> int:
    """One session to stdout or a file; several (or --all) to a directory, one file each.

    ``export --all -o DIR`` then ``import DIR`` against another store moves every session.
    """
    store = ctx.store
    sids = _all_or(ctx, args.sessions, args.all, "export")
    if len(sids) == 1 and not args.all and (args.output in (None, "-") or not Path(args.output).is_dir()):
        lines = store.iter_export_pi_session(sids[0])
        if args.output in (None, "-"):
            for line in lines:
                sys.stdout.write(line)
            sys.stdout.flush()
            return Exit.OK
        count = _write_atomically(Path(args.output), lines)
        if ctx.json:
            out(dump_json([{"session": sids[0], "path": args.output, "entries": count - 1}]))
        else:
            err(f"exported {sids[0]} to {args.output} ({count - 1} entries)")
        return Exit.OK
    if args.output in (None, "-"):
        raise CliError("several sessions go to a directory: give -o DIR", Exit.USAGE)
    directory = Path(args.output)
    directory.mkdir(parents=True, exist_ok=True)
    rows = []
    for sid in sids:
        path = directory / f"{sid}.jsonl"
        count = _write_atomically(path, store.iter_export_pi_session(sid))
        rows.append({"session": sid, "path": str(path), "entries": count - 1})
    if ctx.json:
        out(dump_json(rows))
    else:
        err(f"exported {len(rows)} sessions to {directory}")
    return Exit.OK


def _write_atomically(target: Path, lines: Iterator[str]) -> int:
    """Write beside the target and rename, so that a failed export never leaves half a file."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    count = 0
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
            for line in lines:
                fh.write(line)
                count += 1
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return count


# --- writing -----------------------------------------------------------------------------------


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

        purge = purge_now(_compactor(ctx, None), sid, through_seq=result.seq)
        row.update(purged=True, manifest=purge.generation, deleted=len(purge.deleted))
    if ctx.json:
        out(dump_json(row))
        return Exit.OK
    out(f"redacted {args.entry} in {sid} (redaction {result.last_appended_entry_id}, segment {result.seq}): "
        "hidden from every reader now")
    if purge is not None:
        out(_purged_line(sid, purge))
    else:
        out("its bytes stay in storage until a compaction rewrites the session and gc then deletes the "
            "old objects, after the grace period (default 10 min); `--purge-now` deletes them now")
    return Exit.OK


def _purged_line(sid: str, purge: Any) -> str:
    kinds = ", ".join(_count(purge.count(k), k, k + "s") for k in ("segment", "base", "manifest") if purge.count(k))
    return (f"{sid}: purged: every object older than manifest {purge.generation} deleted now "
            f"({kinds or 'nothing left to delete'}); redacted content is in no object of the store")


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


# --- import ------------------------------------------------------------------------------------


def _pi_files(paths: list[str]) -> list[str]:
    files: list[str] = []
    for p in paths:
        if p == "-":
            files.append(p)
            continue
        path = Path(p)
        if path.is_dir():
            found = sorted(str(f) for f in path.rglob("*.jsonl") if f.is_file())
            if not found:
                raise CliError(f"{p}: no *.jsonl files in this directory", Exit.NOT_FOUND)
            files.extend(found)
        elif path.exists():
            files.append(str(path))
        else:
            raise CliError(f"{p}: no such file or directory", Exit.NOT_FOUND)
    return files


def cmd_import(args: argparse.Namespace, ctx: Ctx) -> int:
    """Import pi files. Files that name the same session are imported one after the other,
    in path order (so which one creates it, extends it or is refused is the same on every
    run); different sessions a few at once. Per-file lines come out in path order."""
    from store.core import uuid7
    from store.pi_import import ImportConflictError, import_pi_file, peek_header_id

    files = _pi_files(args.paths)
    if args.id and len(files) != 1:
        raise CliError("--id names one session: give exactly one file", Exit.USAGE)
    store = ctx.store
    status = StatusLine(sys.stderr)
    lock = threading.Lock()
    results: list[dict[str, Any]] = []
    totals = {"entries": 0, "appended": 0, "refused": 0}
    show_progress = not args.quiet and len(files) > 1

    def one(path: str) -> dict[str, Any]:
        sid = args.id or (uuid7() if args.new_ids else None)
        try:
            source: Any = sys.stdin.buffer if path == "-" else Path(path)  # a pipe is spooled to disk, not memory
            res = import_pi_file(store, source, sid, on_conflict=args.on_conflict)
            row = {"path": path, "ok": True, "session": res.session_id, "status": res.status,
                   "entries": res.entries, "appended": res.appended}
            if res.header_id is not None:
                row["header_id"] = res.header_id
            return row
        except (SessionStoreError, OSError) as exc:
            code, message = classify(exc)
            if isinstance(exc, ImportConflictError):
                message += " (--id ID, or --on-conflict new-id)"
            return {"path": path, "ok": False, "error": message, "exit_code": int(code)}

    def report(res: dict[str, Any]) -> None:
        with lock:
            results.append(res)
            if res["ok"]:
                totals["entries"] += res["entries"]
                totals["appended"] += res["appended"]
            else:
                totals["refused"] += 1
            if show_progress:
                status.update(
                    f"importing {bar(len(results), len(files))} {len(results)}/{len(files)} files"
                    f" · {totals['entries']:,} entries · {totals['refused']} refused",
                    force=len(results) == len(files),
                )

    def run(paths: list[str]) -> None:
        for path in paths:
            report(one(path))

    # Group by the session id each header names (read from the first line only).
    groups: dict[str, list[str]] = {}
    later: list[str] = []  # stdin, and files whose first value is not a header: after the rest
    for path in files:
        if args.id or args.new_ids:
            groups[path] = [path]
            continue
        hid = None if path == "-" else peek_header_id(path)
        if hid is None:
            later.append(path)
        else:
            groups.setdefault(hid, []).append(path)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for fut in [pool.submit(run, sorted(paths)) for paths in groups.values()]:
            fut.result()
    run(later)
    if show_progress:
        status.done()
    results.sort(key=lambda r: r["path"])
    imported = sum(1 for r in results if r["ok"])
    if ctx.json:
        out(dump_json({"imported": imported, "refused": totals["refused"], "entries": totals["entries"],
                       "appended": totals["appended"], "files": results}))
    else:
        for res in results:
            if not res["ok"]:
                out(f"refused {res['path']}: {res['error']}")
            elif args.verbose or len(files) == 1:
                out(_import_line(res))
        if len(files) > 1:
            out(f"imported {imported} of {len(files)} files ({totals['entries']:,} entries, "
                f"{totals['appended']:,} of them new)"
                + (f"; {totals['refused']} refused" if totals["refused"] else ""))
    if totals["refused"]:
        if len(files) == 1:
            # One file: its own error class is the exit code.
            return int(results[0]["exit_code"])
        return Exit.FAILED
    return Exit.OK


def _import_line(res: dict[str, Any]) -> str:
    renamed = f"; its header's id {res['header_id']!r} holds other content" if "header_id" in res else ""
    entries = _count(res["entries"], "entry", "entries")
    if res["status"] == "created":
        return f"imported {res['path']} as {res['session']} ({entries}{renamed})"
    if res["status"] == "extended":
        return (f"imported {res['path']} into {res['session']}: {_count(res['appended'], 'new entry', 'new entries')} "
                f"({entries} in the file{renamed})")
    return f"unchanged {res['path']}: {res['session']} already holds its {entries}{renamed}"


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


# --- follow ------------------------------------------------------------------------------------


def cmd_follow(args: argparse.Namespace, ctx: Ctx) -> int:
    """Print entries as they are committed, from any writer anywhere (``SessionStore.follow``:
    notifications only say when to look, so a lost one delays an entry by at most ``--poll``
    and never loses it; a session deleted and created again is followed into its new life)."""
    store = ctx.store
    sid = check_session_id(args.session)
    poll = max(0.05, args.poll)
    data = store.read_session(sid)
    limit = args.count

    def emit(entry: dict[str, Any], seq: int) -> None:
        if ctx.json:
            sys.stdout.write(orjson.dumps(entry).decode() + "\n")
        else:
            sys.stdout.write(f"{seq:>6}  {str(entry.get('id'))[:16]:<16}  {summarize(entry)}\n")
        sys.stdout.flush()

    backlog: list[tuple[dict[str, Any], int]] = [(e, 0) for e in data.inherited]
    backlog += list(zip(data.entries, data.seqs, strict=True))
    if not args.from_start:
        backlog = backlog[len(backlog) - args.lines :] if args.lines > 0 else []
    for entry, seq in backlog:
        emit(entry, seq)
    err(f"following {sid} after segment {data.seq} (Ctrl-C to stop)")
    printed = 0
    stream = store.follow(sid, after_seq=data.seq, poll_s=poll, timeout_s=args.timeout)
    try:
        for seq, entry in stream:
            emit(entry, seq)
            printed += 1
            if limit is not None and printed >= limit:
                break
    finally:
        stream.close()
    return Exit.OK


# --- compaction ----------------------------------------------------------------------------------


def _compactor(ctx: Ctx, grace: float | None) -> Any:
    from compactor import Compactor, CompactorOptions
    from compactor.config import DEFAULT_GRACE_MS

    grace_ms = DEFAULT_GRACE_MS if grace is None else int(grace * 1000)
    return Compactor(ctx.store, CompactorOptions(grace_ms=grace_ms))


def _all_or(ctx: Ctx, sessions: list[str], all_flag: bool, what: str) -> list[str]:
    if sessions and all_flag:
        raise CliError("give sessions or --all, not both", Exit.USAGE)
    if all_flag:
        return [i.session_id for i in ctx.store.list_sessions()]
    if not sessions:
        raise CliError(f"name the sessions to {what}, or pass --all", Exit.USAGE)
    return [check_session_id(s) for s in sessions]


def cmd_compact(args: argparse.Namespace, ctx: Ctx) -> int:
    if args.sessions and args.all:
        raise CliError("give sessions or --all, not both", Exit.USAGE)
    # Like gc and verify: no session named means every session (--all says so explicitly).
    sids = [check_session_id(s) for s in args.sessions] or [i.session_id for i in ctx.store.list_sessions()]
    compactor = _compactor(ctx, args.grace)
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
                                f"holding them go at gc after {iso_of_ms(_now_ms() + grace_ms)}"
                                + ("" if args.purge_now else " (or now with --purge-now)"))
                    out(f"{sid}: segments {first}-{last} -> manifest {res.generation} "
                        f"({res.entries} entries, {human_bytes(res.bytes_in)} -> {human_bytes(res.bytes_out)}{tomb})")
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
                out(_purged_line(sid, purge))
    if ctx.json:
        out(dump_json(results))
    elif not sids:
        err("no sessions")
    return Exit.OK


def cmd_gc(args: argparse.Namespace, ctx: Ctx) -> int:
    compactor = _compactor(ctx, args.grace)
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


# --- checks --------------------------------------------------------------------------------------


def cmd_verify(args: argparse.Namespace, ctx: Ctx) -> int:
    from store.cli.verify import verify_store

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
    from store.embedded import EmbeddedRedis

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
