"""Claude Code's transcripts on disk (``~/.claude/projects/<project>/<session>.jsonl``) into
the store and back: ``import_claude_projects``, ``export_claude_projects``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from claude_agent_sdk.types import SessionKey, SessionStoreEntry

from store.adapters.claude_agent_sdk.records import _canonical, _h
from store.adapters.claude_agent_sdk.session_store import ClaudeSessionStore
from store.errors import InvalidInputError


# --- Claude Code's on-disk layout -------------------------------------------------------------


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                value = json.loads(line)
                if isinstance(value, dict):
                    out.append(value)
    return out


def _write_jsonl(path: Path, entries: list[Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for e in entries:
            f.write(json.dumps(e, separators=(",", ":"), ensure_ascii=False) + "\n")
    tmp.replace(path)


async def import_claude_projects(
    store: ClaudeSessionStore, directory: str | Path, *, batch_size: int = 500
) -> list[SessionKey]:
    """Import a Claude Code projects directory (``~/.claude/projects``):
    ``<dir>/<project>/<session>.jsonl`` and the subagent transcripts beside them,
    ``<dir>/<project>/<session>/subagents/**/agent-*.jsonl`` (with their ``.meta.json``
    sidecars, as the SDK's ``import_session_to_store`` does). Idempotent: entries are keyed by
    their uuid and the batches are cut the same way each time, so importing the same tree
    again (or a longer version of it) stores nothing twice. Returns the keys imported."""
    root = Path(directory)
    keys: list[SessionKey] = []
    for project_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        project_key = project_dir.name
        for main in sorted(project_dir.glob("*.jsonl")):
            session_id = main.name[: -len(".jsonl")]
            key: SessionKey = {"project_key": project_key, "session_id": session_id}
            await _import_file(store, key, main, batch_size)
            keys.append(key)
            session_dir = project_dir / session_id
            for sub in sorted((session_dir / "subagents").rglob("*.jsonl")) if session_dir.is_dir() else ():
                rel = list(sub.relative_to(session_dir).parts)
                rel[-1] = rel[-1][: -len(".jsonl")]
                sub_key: SessionKey = {**key, "subpath": "/".join(rel)}
                await _import_file(store, sub_key, sub, batch_size)
                meta_path = sub.with_name(sub.name[: -len(".jsonl")] + ".meta.json")
                if meta_path.is_file():
                    try:
                        meta = json.loads(meta_path.read_text(encoding="utf-8"))
                    except ValueError:
                        meta = None
                    if isinstance(meta, dict):
                        # Keyed by the sidecar's content (a uuid of our own), so that a
                        # second import finds it stored.
                        marker = "meta-" + _h(_canonical(meta), 16)
                        meta_entry = cast(SessionStoreEntry, {**meta, "type": "agent_metadata", "uuid": marker})
                        await store.append(sub_key, [meta_entry])
                keys.append(sub_key)
    return keys


async def _import_file(store: ClaudeSessionStore, key: SessionKey, path: Path, batch_size: int) -> None:
    entries = _read_jsonl(path)
    for i in range(0, len(entries), batch_size):
        await store.append(key, cast("list[SessionStoreEntry]", entries[i : i + batch_size]))


async def export_claude_projects(
    store: ClaudeSessionStore, directory: str | Path, project_keys: Sequence[str]
) -> list[Path]:
    """Write the given projects back in Claude Code's layout under ``directory``: each main
    transcript as ``<project>/<session>.jsonl``, each subpath as ``<project>/<session>/<subpath>.jsonl``
    (an ``agent_metadata`` entry goes back to its ``.meta.json`` sidecar). Returns the files."""
    root = Path(directory)
    written: list[Path] = []
    for project_key in project_keys:
        if "/" in project_key or project_key in (".", ".."):
            raise InvalidInputError(f"project key {project_key!r} is not a directory name")
        for listed in await store.list_sessions(project_key):
            session_id = listed["session_id"]
            key: SessionKey = {"project_key": project_key, "session_id": session_id}
            entries = await store.load(key)
            if entries is None:
                continue
            path = root / project_key / f"{session_id}.jsonl"
            _write_jsonl(path, entries)
            written.append(path)
            for subpath in await store.list_subkeys(key):
                parts = subpath.split("/")
                if any(p in ("", ".", "..") for p in parts):
                    continue
                sub_entries = await store.load({**key, "subpath": subpath})
                if sub_entries is None:
                    continue
                meta = [e for e in sub_entries if e.get("type") == "agent_metadata"]
                lines = [e for e in sub_entries if e.get("type") != "agent_metadata"]
                sub_path = root / project_key / session_id / (subpath + ".jsonl")
                _write_jsonl(sub_path, lines)
                written.append(sub_path)
                if meta:
                    sidecar = {k: v for k, v in meta[-1].items() if k not in ("type", "uuid")}
                    meta_path = sub_path.with_name(sub_path.name[: -len(".jsonl")] + ".meta.json")
                    meta_path.write_text(json.dumps(sidecar), encoding="utf-8")
                    written.append(meta_path)
    return written
