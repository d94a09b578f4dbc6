"""Many processes, few sessions: the history checker finds every promise kept."""

from __future__ import annotations

import multiprocessing as mp
import random
from pathlib import Path
from typing import Any

import pytest
from history import attempt, check_history, load_ops

from store import SessionStore


def _entry(eid: str, parent: str | None) -> dict[str, Any]:
    return {
        "type": "message",
        "id": eid,
        "parentId": parent,
        "timestamp": "2026-11-22T10:00:00.000Z",
        "message": {"role": "assistant", "content": [{"type": "text", "text": eid * 3}]},
    }


def writer(
    objects_url: str,
    redis_url: str,
    redis_prefix: str,
    wid: int,
    sessions: list[str],
    appends: int,
    log_path: str,
) -> None:
    store = SessionStore.from_url(objects_url, redis_url, redis_prefix=redis_prefix)
    rng = random.Random(wid)
    last: dict[str, str | None] = {sid: None for sid in sessions}
    with open(log_path, "ab") as log:
        for i in range(appends):
            sid = sessions[(i + wid) % len(sessions)]
            ids = [f"w{wid}-{i}-{k}" for k in range(rng.randint(1, 3))]
            expected: str | None = None
            parent = last[sid]
            if i % 2 == 0:
                expected = store.get_tail(sid).last_entry_id
                parent = expected or None
            batch = [_entry(ids[0], parent)] + [_entry(ids[k], ids[k - 1]) for k in range(1, len(ids))]
            op = attempt(store, sid, batch, expected)
            if op.outcome == "ok":
                last[sid] = ids[-1]
            log.write(op.to_json() + b"\n")
            log.flush()
    store.close()


def six_writers_keep_every_promise(
    store: SessionStore, objects_url: str, redis_url: str | None, redis_prefix: str,
    tmp_path: Path, appends: int,
) -> None:
    """Six writer processes (``writer``) on three new sessions of ``store``'s backends, each
    making ``appends`` appends, half of them expecting a tail; the history checker finds
    every promise kept, and every session reads back whole."""
    sessions = ["alpha", "beta", "gamma"]
    for sid in sessions:
        store.create_session(sid)
    ctx = mp.get_context("spawn")
    logs = [tmp_path / f"w{i}.jsonl" for i in range(6)]
    procs = [
        ctx.Process(
            target=writer,
            args=(objects_url, redis_url, redis_prefix, i, sessions, appends, str(logs[i])),
        )
        for i in range(6)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(540)
        assert p.exitcode == 0
    ops = load_ops(logs)
    assert len(ops) == 6 * appends
    report = check_history(store, ops)
    assert report.problems == []
    assert report.errors == []
    assert report.acknowledged > 3 * appends
    assert report.conflicts > 0  # half the appends expect a tail while five others write
    total = sum(len(op.ids) for op in ops if op.outcome == "ok")
    assert sum(len(store.load_session_entries(s)) for s in sessions) == total


@pytest.mark.long
@pytest.mark.timeout(600)
def test_six_processes_three_sessions(
    s3_url: str, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    store = SessionStore.from_url(s3_url, redis_url, redis_prefix=redis_prefix)
    try:
        six_writers_keep_every_promise(store, s3_url, redis_url, redis_prefix, tmp_path, 150)
    finally:
        store.close()
