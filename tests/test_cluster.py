"""The store on a real three-node Redis Cluster.

Every per-session key is hash-tagged ``{sid}``, so each Lua script touches one slot; the
session index and the job queue live in other slots and are only ever touched by separate
commands. A cluster refuses a script whose keys span slots (CROSSSLOT), so this test fails if
any of that is wrong.
"""

from __future__ import annotations

import threading
from typing import Any

from history import Op, attempt, check_history

from store import SessionStore


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
            op = attempt(store, sid, [_entry(eid, parent)], expected)
            if op.outcome == "ok":
                last[sid] = eid
            with lock:
                ops.append(op)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    # The listing's summaries (one per session, in its own slot) kept up with the commits:
    # one pipeline across the cluster's slots reads them, and no session needs a rebuild.
    store.objects.requests.clear()
    listed = store.list_sessions(limit=1000)
    assert {s.session_id for s in listed.items} == set(sessions)
    assert store.objects.requests["get"] == 0 and store.objects.requests["list"] == 1
    assert {s.session_id: s.entry_count for s in listed.items} == {
        sid: store.get_tail(sid).entry_count for sid in sessions
    }
    # Losing every key (all nodes) must not lose anything either.
    store.coord.client.flushall(target_nodes="all")
    report = check_history(store, ops)
    assert report.problems == [] and report.errors == []
    assert report.acknowledged >= 45
    assert {s.session_id for s in store.iter_sessions()} == set(sessions)
    store.close()
