"""Claude Code's transcripts in and out: ``claude-import`` and ``claude-export``.

Claude Code keeps a project's transcripts as ``<projects dir>/<project>/<session>.jsonl``, with
subagent transcripts beside them (``<session>/subagents/agent-*.jsonl``). These commands move
such a tree into the store through the Claude Agent SDK adapter
(``store/adapters/claude_agent_sdk/``; ``pip install 'sessionstore[claude-agent-sdk]'``) and
back out to the same layout, so that an existing fleet can move its history in and out.
Importing the same tree again (or a longer version of it) stores nothing twice: an entry's
``uuid`` is its identity.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from store.cli.common import CliError, Exit, dump_json, err, out
from store.cli.ctx import Ctx, counted


def _adapter() -> Any:
    try:
        from store.adapters import claude_agent_sdk
    except ImportError as exc:
        raise CliError(
            f"the Claude Agent SDK adapter needs its extra: pip install 'sessionstore[claude-agent-sdk]' ({exc})",
            Exit.USAGE,
        ) from None
    return claude_agent_sdk


async def _with_claude(ctx: Ctx, namespace: str, work: Any) -> Any:
    from store.aio import AsyncSessionStore

    module = _adapter()
    store = AsyncSessionStore(ctx.store, owns_store=False)
    claude = module.ClaudeSessionStore(store, namespace=namespace)
    try:
        return await work(module, claude)
    finally:
        await claude.close()
        await store.close()


def cmd_claude_import(args: argparse.Namespace, ctx: Ctx) -> int:
    root = Path(args.directory)
    if not root.is_dir():
        raise CliError(f"{root}: not a directory (a Claude Code projects directory, e.g. ~/.claude/projects)", Exit.NOT_FOUND)

    async def work(module: Any, claude: Any) -> list[dict[str, Any]]:
        return list(await module.import_claude_projects(claude, root))

    keys = asyncio.run(_with_claude(ctx, args.namespace, work))
    if ctx.json:
        out(dump_json(keys))
    else:
        sessions = {(k["project_key"], k["session_id"]) for k in keys}
        projects = {k["project_key"] for k in keys}
        err(f"imported {counted(len(sessions), 'transcript', 'transcripts')} of "
            f"{counted(len(projects), 'project', 'projects')} from {root} "
            f"({counted(len(keys) - len(sessions), 'subagent transcript', 'subagent transcripts')})")
    return Exit.OK


def cmd_claude_export(args: argparse.Namespace, ctx: Ctx) -> int:
    root = Path(args.output)
    if root.exists() and not root.is_dir():
        raise CliError(f"{root}: exists and is not a directory", Exit.USAGE)

    async def work(module: Any, claude: Any) -> list[Path]:
        projects = args.projects or await claude.list_projects()
        return list(await module.export_claude_projects(claude, root, projects))

    written = asyncio.run(_with_claude(ctx, args.namespace, work))
    if ctx.json:
        out(dump_json([str(p) for p in written]))
    else:
        err(f"exported {counted(len(written), 'file', 'files')} to {root}")
    return Exit.OK


def add_claude_commands(add: Any) -> None:
    p = add("claude-import", "import Claude Code transcripts (a projects directory, subagents included)",
            cmd_claude_import)
    p.add_argument("directory", help="a Claude Code projects directory (<project>/<session>.jsonl)")
    p.add_argument("--namespace", default="", help="the ClaudeSessionStore namespace (default: none)")

    p = add("claude-export", "write projects back in Claude Code's layout", cmd_claude_export)
    p.add_argument("projects", nargs="*", metavar="PROJECT",
                   help="project keys (directory names) to export, after -- since they start with a dash "
                        "(default: every project in the store)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="the projects directory to write")
    p.add_argument("--namespace", default="", help="the ClaudeSessionStore namespace (default: none)")
