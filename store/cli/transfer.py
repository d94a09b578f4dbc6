"""Moving sessions in and out: ``import`` (pi session files and directories) and ``export``
(pi v3 JSONL files)."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from store.cli.common import CliError, Exit, classify, dump_json, err, out
from store.cli.ctx import Ctx, counted
from store.cli.render import StatusLine, bar
from store.errors import SessionStoreError
from store.formats.layout import check_session_id

if TYPE_CHECKING:
    from store.core import SessionStore


# --- export --------------------------------------------------------------------------------------


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


def _all_or(ctx: Ctx, sessions: list[str], all_flag: bool, what: str) -> list[str]:
    if sessions and all_flag:
        raise CliError("give sessions or --all, not both", Exit.USAGE)
    if all_flag:
        return [i.session_id for i in ctx.store.iter_sessions(page_size=1000)]
    if not sessions:
        raise CliError(f"name the sessions to {what}, or pass --all", Exit.USAGE)
    return [check_session_id(s) for s in sessions]


# --- import --------------------------------------------------------------------------------------


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
    from store.pi_import import peek_header_id

    files = _pi_files(args.paths)
    if args.id and len(files) != 1:
        raise CliError("--id names one session: give exactly one file", Exit.USAGE)
    store = ctx.store
    tally = _Tally(len(files), show_progress=not args.quiet and len(files) > 1)

    def run(paths: list[str]) -> None:
        for path in paths:
            tally.report(_import_one(store, path, args))

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
    if tally.show_progress:
        tally.status.done()
    tally.results.sort(key=lambda r: r["path"])
    _print_import(tally, args, as_json=ctx.json)
    if tally.totals["refused"]:
        if len(files) == 1:
            # One file: its own error class is the exit code.
            return int(tally.results[0]["exit_code"])
        return Exit.FAILED
    return Exit.OK


def _import_one(store: SessionStore, path: str, args: argparse.Namespace) -> dict[str, Any]:
    """Import one file: its row of the report, ``ok`` or the error and its exit code."""
    from store.core import uuid7
    from store.pi_import import ImportConflictError, import_pi_file

    sid = args.id or (uuid7() if args.new_ids else None)
    try:
        source: Any = sys.stdin.buffer if path == "-" else Path(path)  # a pipe is spooled to disk, not memory
        res = import_pi_file(store, source, sid, on_conflict=args.on_conflict)
        row = {"path": path, "ok": True, "session": res.session_id, "status": res.status,
               "entries": res.entries, "appended": res.appended, "skipped_lines": list(res.skipped_lines)}
        if res.header_id is not None:
            row["header_id"] = res.header_id
        return row
    except (SessionStoreError, OSError) as exc:
        code, message = classify(exc)
        if isinstance(exc, ImportConflictError):
            message += " (--id ID, or --on-conflict new-id)"
        return {"path": path, "ok": False, "error": message, "exit_code": int(code)}


class _Tally:
    """The rows and totals of an import, as its threads report them, and its progress line
    (shown for several files, unless --quiet)."""

    def __init__(self, files: int, *, show_progress: bool) -> None:
        self.files = files
        self.show_progress = show_progress
        self.status = StatusLine(sys.stderr)
        self.lock = threading.Lock()
        self.results: list[dict[str, Any]] = []
        self.totals = {"entries": 0, "appended": 0, "refused": 0, "skipped_lines": 0}

    def report(self, res: dict[str, Any]) -> None:
        with self.lock:
            self.results.append(res)
            if res["ok"]:
                self.totals["entries"] += res["entries"]
                self.totals["appended"] += res["appended"]
                self.totals["skipped_lines"] += len(res["skipped_lines"])
            else:
                self.totals["refused"] += 1
            if self.show_progress:
                self.status.update(
                    f"importing {bar(len(self.results), self.files)} {len(self.results)}/{self.files} files"
                    f" · {self.totals['entries']:,} entries · {self.totals['refused']} refused",
                    force=len(self.results) == self.files,
                )


def _print_import(tally: _Tally, args: argparse.Namespace, *, as_json: bool) -> None:
    results, totals, files = tally.results, tally.totals, tally.files
    imported = sum(1 for r in results if r["ok"])
    for res in results:
        if res["ok"] and res["skipped_lines"]:
            # pi skips them too, so the import goes on; but nothing of them is in the store.
            err(f"sessionstore import: {res['path']}: skipped {_skipped(res['skipped_lines'])}")
    if as_json:
        out(dump_json({"imported": imported, "refused": totals["refused"], "entries": totals["entries"],
                       "appended": totals["appended"], "skipped_lines": totals["skipped_lines"],
                       "files": results}))
        return
    for res in results:
        if not res["ok"]:
            out(f"refused {res['path']}: {res['error']}")
        elif args.verbose or files == 1:
            out(_import_line(res))
    if files > 1:
        out(f"imported {imported} of {files} files ({totals['entries']:,} entries, "
            f"{totals['appended']:,} of them new)"
            + (f"; {totals['refused']} refused" if totals["refused"] else ""))


def _skipped(lines: list[int], shown: int = 10) -> str:
    numbers = ", ".join(str(n) for n in lines[:shown]) + (f", ... ({len(lines) - shown} more)" if len(lines) > shown else "")
    return (f"{counted(len(lines), 'line that is', 'lines that are')} not JSON (line{'s' if len(lines) > 1 else ''} "
            f"{numbers}): not imported, as pi skips them when it reads the file")


def _import_line(res: dict[str, Any]) -> str:
    renamed = f"; its header's id {res['header_id']!r} holds other content" if "header_id" in res else ""
    entries = counted(res["entries"], "entry", "entries")
    if res["status"] == "created":
        return f"imported {res['path']} as {res['session']} ({entries}{renamed})"
    if res["status"] == "extended":
        return (f"imported {res['path']} into {res['session']}: {counted(res['appended'], 'new entry', 'new entries')} "
                f"({entries} in the file{renamed})")
    return f"unchanged {res['path']}: {res['session']} already holds its {entries}{renamed}"

