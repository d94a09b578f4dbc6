"""The store on a real three-node Redis Cluster.

Every per-session key is hash-tagged ``{sid}``, so each Lua script touches one slot; the
session index and the job queue live in other slots and are only ever touched by separate
commands. A cluster refuses a script whose keys span slots (CROSSSLOT), so this test fails if
any of that is wrong.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from typing import Any, Iterator

import pytest

from harness import RedisServer
from harness.redis_server import find_redis_server
from history import Op, check_history
from store import SessionStore
from store.errors import ConflictError, SessionStoreError


def _redis_cli() -> str | None:
    server = find_redis_server()
    for candidate in (server.replace("redis-server", "redis-cli"), shutil.which("redis-cli")):
        if candidate and shutil.os.access(candidate, shutil.os.X_OK):  # type: ignore[attr-defined]
            return candidate
    return None


@pytest.fixture
def cluster_url() -> Iterator[str]:
    import os

    if os.environ.get("SESSIONSTORE_TEST_REDIS_URL"):
        pytest.skip("external Redis configured: this test starts a cluster of its own")
    cli = _redis_cli()
    assert cli, "redis-cli not found next to redis-server"
    nodes = [
        RedisServer(port=_cluster_port(), config={"cluster-enabled": "yes", "cluster-node-timeout": "2000",
                                                  "cluster-config-file": f"nodes-{i}.conf"}).start()
        for i in range(3)
    ]
    try:
        subprocess.run(
            [cli, "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in nodes],
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )
        # Wait until every node agrees the cluster is up.
        import time

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = [n.client().cluster("info").get("cluster_state") for n in nodes]
            if all(s == "ok" for s in states):
                break
            time.sleep(0.2)
        yield f"redis://127.0.0.1:{nodes[0].port}/0?cluster=true"
    finally:
        for n in nodes:
            n.close()


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too (both must be <= 65535)."""
    import random
    import socket

    for _ in range(200):
        port = random.randint(20000, 45000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for a cluster node")


def _entry(eid: str, parent: str | None) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent, "message": {"role": "user", "content": eid}}


def test_store_on_redis_cluster(cluster_url: str, s3_url: str) -> None:
    store = SessionStore.from_url(s3_url, cluster_url)
    sessions = [f"c{i}" for i in range(6)]  # spread over the slots of all three nodes
    for sid in sessions:
        store.create_session(sid)
    ops: list[Op] = []
    lock = threading.Lock()

    def writer(w: int) -> None:
        last: dict[str, str | None] = {s: None for s in sessions}
        for i in range(30):
            sid = sessions[(i + w) % len(sessions)]
            eid = f"w{w}-{i}"
            expected = store.get_tail(sid).last_entry_id if i % 2 else None
            parent = (expected or None) if i % 2 else last[sid]
            op = Op(sid, [eid], expected, "ok")
            try:
                op.seq = store.append_session_entries(sid, [_entry(eid, parent)], expected).seq
                last[sid] = eid
            except ConflictError:
                op.outcome = "conflict"
            except SessionStoreError as exc:
                op.outcome = f"error:{type(exc).__name__}:{exc}"
            with lock:
                ops.append(op)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    # The session index (another slot) was kept up to date beside the commits.
    assert set(store.coord.session_index()) == set(sessions)
    # Losing every key (all nodes) must not lose anything either.
    store.coord.client.flushall(target_nodes="all")
    report = check_history(store, ops)
    assert report.problems == [] and report.errors == []
    assert report.acknowledged >= 45
    assert {s.session_id for s in store.list_sessions()} == set(sessions)
    store.close()
