"""What the demo prints at the end: the summary, the verdict, and the tree of its most
interesting session."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from store.cli.common import human_bytes, out
from store.cli.render import draw_tree

if TYPE_CHECKING:
    from store.core import SessionStore


def pick_tree_session(store: SessionStore, sessions: list[str]) -> str | None:
    best: tuple[int, str] | None = None
    for sid in sessions:
        try:
            s = store.load_session(sid)
        except Exception:
            continue
        leaves = sum(1 for e in s.entries if not s.get_children(e["id"]))
        types = {e.get("type") for e in s.entries}
        score = (3 * leaves + len(s.labels) + 2 * ("branch_summary" in types)
                 + 2 * ("compaction" in types) + 2 * bool(s.redacted_ids))
        if best is None or score > best[0]:
            best = (score, sid)
    return best[1] if best else None


def bytes_in_store(store: SessionStore) -> tuple[int, int]:
    total = count = 0
    for info in store.objects.list(store.layout.sessions_prefix):
        total += info.size
        count += 1
    return total, count


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else (many or one + 's')}"


def print_report(store: SessionStore, report: dict[str, Any], tree_sid: str | None) -> None:
    s = report["summary"]
    v = report["verification"]
    out()
    out(f"sessions     {s['sessions']} ({s['sessions'] - s['forks']} shared, {_n(s['forks'], 'fork')}), "
        f"{s['entries']} entries, {s['branches']} branch tips")
    out(f"turns        {s['turns']} of {s['turns_planned']} planned, by {s['workers']} workers; "
        f"{s['handoffs']} handed to another worker, {s['double_turns']} played by two workers at once")
    out(f"appends      {s['appends']} acknowledged in {s['write_seconds']} s ({s['appends_per_second']}/s); "
        f"{_n(s['conflicts_handled'], 'conflict')} refused and retried after a refresh")
    out(f"compactions  {_n(s['compactions'], 'manifest')} (compactor worker alongside), "
        f"{_n(s['branch_summaries'], 'branch summary', 'branch summaries')}, "
        f"{_n(s['context_compactions'], 'context compaction')}, {_n(s['redactions'], 'redaction')}")
    out(f"storage      {human_bytes(s['bytes'])} in {s['objects']} objects")
    checks = ", ".join(f"{name} {'ok' if ok else 'FAILED'}" for name, ok in v["checks"].items())
    verdict = "PASSED" if v["ok"] else "FAILED"
    out(f"verification {verdict}: {checks}")
    for p in v["problems"][:20]:
        out(f"  problem: {p}")
    if len(v["problems"]) > 20:
        out(f"  ... and {len(v['problems']) - 20} more")
    if tree_sid:
        from store.cli.sessions import describe_session
        from store.model.session import Session

        data = store.read_session(tree_sid)
        session = Session(data.header.pi_header, data.all_entries)
        out()
        out(describe_session(tree_sid, session, data))
        for line in draw_tree(session, stream=sys.stdout):
            out(line)
    out()
    out(f"done in {s['seconds']} s")
    if report["store"]["kept"]:
        objects = report["store"]["objects"]
        flags = f"--objects {objects}"
        if report["store"]["redis"] != "embedded":
            flags += f" --redis {report['store']['redis']}"
        if report["store"]["redis_prefix"] != "ss":
            flags += f" --redis-prefix {report['store']['redis_prefix']}"
        out(f"kept: explore with `sessionstore {flags} ls`")

