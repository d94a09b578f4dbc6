"""The existing Durable Streams clients, unchanged, against ``sessionstore serve`` on real S3
and Redis: the ``durable-streams`` Python package and ``@durable-streams/client`` under node
(tests/ds-node, pinned), and docs/http.md's pi mirror (a node process copying a live pi
session file into the store as pi writes it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import _in_ci
from harness.asgi_server import AsgiServer

from store import SessionStore
from store.http.app import StreamService
from store.http.auth import Tokens

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
DS_NODE = ROOT / "tests" / "ds-node"
PI_FIXTURES = ROOT / "tests" / "fixtures" / "pi"


def _need_node() -> str:
    node = shutil.which("node")
    if node is None or not (DS_NODE / "node_modules" / "@durable-streams" / "client").is_dir():
        message = "node or tests/ds-node/node_modules missing (run .ci/run once)"
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return node


@pytest.fixture
def service_url(make_store: Callable[..., SessionStore]) -> Iterator[str]:
    service = StreamService(make_store(), tokens=Tokens.parse_env("acme:secret-acme-0123456789"))
    with AsgiServer(service.app) as server:
        yield server.url


AUTH = {"Authorization": "Bearer secret-acme-0123456789"}


def test_python_client_creates_appends_reads_and_follows(service_url: str) -> None:
    from durable_streams import DurableStream, StreamExistsError, stream

    url = service_url + "/v1/stream/acme/py"
    handle = DurableStream.create(url, content_type="application/json", headers=AUTH, batching=False)
    with pytest.raises(StreamExistsError):
        DurableStream.create(url, content_type="text/plain", headers=AUTH)
    for i in range(3):
        handle.append({"i": i})
    assert handle.head().content_type == "application/json"
    with stream(url, live=False, headers=AUTH) as res:
        assert res.read_json() == [{"i": 0}, {"i": 1}, {"i": 2}]
    tail = handle.head().offset

    got: list[Any] = []

    def follow() -> None:
        with stream(url, offset=tail, live="sse", headers=AUTH) as res:
            for item in res.iter_json():
                got.append(item)
                if len(got) == 5:
                    return

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    time.sleep(0.3)
    for i in range(3, 8):
        handle.append({"i": i})
    t.join(30)
    assert got == [{"i": i} for i in range(3, 8)]
    # Another tenant's token reaches nothing of acme's.
    with pytest.raises(Exception):
        with stream(url, live=False, headers={"Authorization": "Bearer wrong"}) as res:
            res.read_json()


NODE_CLIENT = r"""
import { DurableStream, IdempotentProducer, stream } from "@durable-streams/client"
const url = process.env.URL
const headers = { Authorization: process.env.AUTH }
const handle = await DurableStream.create({ url, headers, contentType: "application/json" })
const producer = new IdempotentProducer(handle, "node-writer", { autoClaim: true, onError: (e) => { console.error(e); process.exit(3) } })
for (let i = 0; i < 50; i++) producer.append(JSON.stringify({ i }))
await producer.flush()
await producer.detach()
const res = await stream({ url, headers, live: false })
const items = await res.json()
// Follow live over SSE from the tail while a second producer writes.
const { offset } = await handle.head()
const live = await stream({ url, headers, offset, live: "sse" })
const seen = []
const done = new Promise((resolve) => {
  live.subscribeJson(async (batch) => {
    for (const item of batch.items) seen.push(item)
    if (seen.length >= 10) resolve()
  })
})
const second = new IdempotentProducer(handle, "node-writer-2", { autoClaim: true })
for (let i = 50; i < 60; i++) second.append(JSON.stringify({ i }))
await second.flush()
await second.detach()
await done
live.cancel?.()
console.log(JSON.stringify({ items, seen }))
process.exit(0)
"""


def test_node_client_with_idempotent_producers_and_sse(service_url: str, tmp_path: Path) -> None:
    node = _need_node()
    script = DS_NODE / f".client-check-{os.getpid()}.mjs"
    script.write_text(NODE_CLIENT)
    try:
        r = subprocess.run(
            [node, str(script)], cwd=DS_NODE, capture_output=True, text=True, timeout=120,
            env={**os.environ, "URL": service_url + "/v1/stream/acme/node", "AUTH": AUTH["Authorization"]},
        )
    finally:
        script.unlink()
    assert r.returncode == 0, r.stderr + r.stdout
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["items"] == [{"i": i} for i in range(50)]
    assert out["seen"] == [{"i": i} for i in range(50, 60)]


def test_pi_mirror_copies_a_live_pi_session_file_as_it_grows(service_url: str, tmp_path: Path) -> None:
    """docs/http.md's mirror: pi's file is written line by line while the mirror runs; the
    session in the store ends with exactly the file's entries, and a second run (a restart)
    adds nothing."""
    node = _need_node()
    source = (PI_FIXTURES / "branch_with_summary" / "session.jsonl").read_text().splitlines(keepends=True)
    assert len(source) > 3
    live = tmp_path / "session.jsonl"
    live.write_text(source[0])
    url = service_url + "/v1/stream/acme/mirrored"
    env = {**os.environ, "SESSIONSTORE_TOKEN": "secret-acme-0123456789"}
    cmd = [node, str(DS_NODE / "pi-mirror.mjs"), str(live), url, "--idle", "2"]
    mirror = subprocess.Popen(cmd, cwd=DS_NODE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        for line in source[1:]:
            time.sleep(0.05)
            with live.open("a") as f:
                f.write(line)
        out, err = mirror.communicate(timeout=60)
    finally:
        mirror.kill()
    assert mirror.returncode == 0, err + out
    import httpx

    expected = [json.loads(line) for line in source[1:] if line.strip()]
    got = httpx.get(url, params={"offset": "-1"}, headers=AUTH, timeout=30).json()
    assert got == expected
    again = subprocess.run(cmd, cwd=DS_NODE, capture_output=True, text=True, timeout=60, env=env)
    assert again.returncode == 0, again.stderr
    assert httpx.get(url, params={"offset": "-1"}, headers=AUTH, timeout=30).json() == expected
    header = json.loads(source[0])
    page = httpx.get(service_url + "/v1/sessions", headers=AUTH, timeout=30).json()
    [info] = [s for s in page["sessions"] if s["name"] == "acme/mirrored"]
    assert info["cwd"] == header.get("cwd", "") and info["entries"] == len(expected)


def test_docs_show_the_mirror_that_is_tested() -> None:
    doc = (ROOT / "docs" / "http.md").read_text()
    assert (DS_NODE / "pi-mirror.mjs").read_text().strip() in doc
