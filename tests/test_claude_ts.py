"""The TypeScript Claude Agent SDK's ``SessionStore`` over the HTTP service
(``store/http/js/claude-session-store.mjs``), under node with the SDK's npm package (pinned in
tests/claude-node): its declarations type-check against the SDK's ``SessionStore`` (tsc), the SDK's
own store-backed functions give the same answers on it as on the SDK's ``InMemorySessionStore``,
the contract holds with four writers re-sending every batch, and what TypeScript wrote is what
the Python adapter reads."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import _in_ci
from harness.asgi_server import AsgiServer

from store import SessionStore
from store.http.app import StreamService
from store.http.auth import Tokens

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
NODE_DIR = ROOT / "tests" / "claude-node"
FIXTURE = ROOT / "tests" / "fixtures" / "claude"
SID = "8f14e45f-ceea-467a-9af0-7a1a0bc1e9d2"
PROJECT_DIR = "/work/demo"
PROJECT_KEY = "-work-demo"


def _need(path: Path) -> str:
    node = shutil.which("node")
    if node is None or not path.exists():
        message = f"node or {path.relative_to(ROOT)} missing (run .ci/run once)"
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return node


SDK = NODE_DIR / "node_modules" / "@anthropic-ai" / "claude-agent-sdk"
TSC = NODE_DIR / "node_modules" / "typescript" / "bin" / "tsc"


def test_the_module_is_the_sdks_session_store_by_its_own_types() -> None:
    node = _need(TSC)
    _need(SDK)
    r = subprocess.run([node, str(TSC), "-p", str(NODE_DIR)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture
def served(make_store: Callable[..., SessionStore]) -> Iterator[tuple[str, SessionStore]]:
    store = make_store()
    service = StreamService(store, tokens=Tokens.parse_env("acme:tok-acme-0123456789"))
    with AsgiServer(service.app) as server:
        yield server.url, store


def test_sdk_functions_and_contract_over_http(served: tuple[str, SessionStore], tmp_path: Path) -> None:
    node = _need(SDK)
    base, store = served
    config = tmp_path / "claude"
    shutil.copytree(FIXTURE, config)
    env = {**os.environ, "BASE": base, "TOKEN": "tok-acme-0123456789", "CLAUDE_CONFIG_DIR": str(config),
           "DIR": PROJECT_DIR, "SID": SID, "PROJECT_KEY": PROJECT_KEY}
    r = subprocess.run([node, str(NODE_DIR / "claude-store-check.mjs")], cwd=NODE_DIR, env=env,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    mem, http = out["memory"], out["http"]
    # The SDK's own functions see the same sessions, messages, subagents, titles, tags,
    # forks and deletes on the store as on its in-memory reference.
    assert http["messages"] and http["subagents"] and http["subagentMessages"]
    for field in ("listed", "messages", "subagents", "subagentMessages", "afterRenameAndTag",
                  "forkMessages", "sessionsWithFork"):
        assert http[field] == mem[field], field
    assert http["afterRenameAndTag"][0]["customTitle"] == "A renamed session"
    assert http["afterRenameAndTag"][0]["tag"] == "urgent"
    assert http["afterDelete"] == [SID]
    # The contract: 4 writers x 10 batches x 2 entries, each batch sent twice at once.
    c = out["contract"]
    loaded = c["loaded"]
    assert len(loaded) == 80 and len(set(loaded)) == 80, "an entry was lost or stored twice"
    for w in range(4):
        mine = [u for u in loaded if u.startswith(f"w{w}-")]
        assert mine == [f"w{w}-b{b}-{i}" for b in range(10) for i in range(2)], "a writer's order changed"
    assert c["never"] is None
    assert c["subkeys"] == ["subagents/agent-x"]
    assert c["listed"] == [c["key"]["sessionId"]]
    assert c["badKey"] == 400
    # What TypeScript wrote is what the Python adapter reads (the tenant is the namespace).
    from store.adapters.claude_agent_sdk import ClaudeSessionStore
    from store.aio import AsyncSessionStore

    async def py_load() -> object:
        claude = ClaudeSessionStore(AsyncSessionStore(store, owns_store=False), namespace="tenant:acme")
        try:
            return await claude.load({"project_key": PROJECT_KEY, "session_id": SID})
        finally:
            await claude.close()

    assert asyncio.run(py_load()) == out["load"]
