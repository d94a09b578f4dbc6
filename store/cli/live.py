"""``follow``: entries printed live as any writer appends them."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from store.cli.common import Exit, err
from store.cli.ctx import Ctx
from store.cli.render import summarize
from store.formats.layout import check_session_id


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

