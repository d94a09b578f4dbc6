"""Outages at start-up and during reads: a process that starts while a backend is away
starts anyway and does its work once the backend is back; reads and the tail keep working
from the object store while Redis is down."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from store import SessionStore
from store.errors import BackendUnavailableError

ROOT = Path(__file__).resolve().parent.parent


def entry(eid: str, parent: str | None) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent,
            "timestamp": "2026-11-22T10:00:00.000Z",
            "message": {"role": "user", "content": eid}}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_store_starts_while_the_object_store_is_away_and_writes_once_it_is_back(
    s3_proxy: Any, redis_url: str, redis_prefix: str
) -> None:
    from store.retry import RetryPolicy

    s3_proxy.blackhole()
    quick = RetryPolicy(attempts=2, max_elapsed=1.0, initial_wait=0.01, max_wait=0.02)
    # No exception: the conditional-write check is deferred to the first write.
    # A blackholed request ends at the read timeout: 3 s here instead of the default 10 s.
    store = SessionStore.from_url(s3_proxy.url + "&connect_timeout=3&read_timeout=3", redis_url,
                                  redis_prefix=redis_prefix, retry=quick)
    try:
        with pytest.raises(BackendUnavailableError):
            store.create_session("late")  # still away: the write (and its probe) fails
        s3_proxy.heal()
        store.create_session("late")
        assert store.append_session_entries("late", [entry("a", None)]).seq == 1
        assert store.objects.requests["put"] >= 3  # the probe ran before the first write
    finally:
        s3_proxy.heal()
        store.close()


def test_reads_and_tail_work_from_the_object_store_while_redis_is_down(
    s3_url: str, private_redis: Any, redis_prefix: str
) -> None:
    from store.retry import RetryPolicy

    quick = RetryPolicy(attempts=2, max_elapsed=1.0, initial_wait=0.01, max_wait=0.02)
    writer = SessionStore.from_url(s3_url, private_redis.url, redis_prefix=redis_prefix)
    reader = SessionStore.from_url(s3_url, private_redis.url, redis_prefix=redis_prefix,
                                   retry=quick, redis_socket_timeout=0.3)
    try:
        writer.create_session("rd")
        writer.append_session_entries("rd", [entry("a", None)])
        writer.append_session_entries("rd", [entry("b", "a")])
        private_redis.kill()
        assert [e["id"] for e in reader.load_session_entries("rd")] == ["a", "b"]
        tail = reader.get_tail("rd")
        assert (tail.seq, tail.last_entry_id) == (2, "b")
        private_redis.restart()
        assert writer.append_session_entries("rd", [entry("c", "b")], "b").seq == 3
    finally:
        writer.close()
        reader.close()


def test_compactor_worker_started_during_a_redis_outage_waits_and_then_works(
    s3_url: str, private_redis: Any, redis_prefix: str, tmp_path: Path
) -> None:
    store = SessionStore.from_url(s3_url, private_redis.url, redis_prefix=redis_prefix,
                                  compact_after_segments=2)
    try:
        store.create_session("w")
        store.append_session_entries("w", [entry("a", None)])
        store.append_session_entries("w", [entry("b", "a")])  # a job is queued
        private_redis.kill()
        log = open(tmp_path / "worker.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "compactor", "work", "--objects", s3_url,
             "--redis", private_redis.url, "--redis-prefix", redis_prefix, "--grace", "0",
             "--block", "0.2", "--name", "outage-worker"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            time.sleep(3)
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()
            private_redis.restart()
            # A restarted Redis without persistence lost the queue: queue the job again.
            store.append_session_entries("w", [entry("c", "b")])
            store.append_session_entries("w", [entry("d", "c")])
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                inc = store.get_header("w").incarnation
                if store.latest_manifest("w", inc) is not None:
                    break
                time.sleep(0.2)
            else:
                pytest.fail("the worker never compacted: " + (tmp_path / "worker.log").read_text())
        finally:
            proc.terminate()
            proc.wait(30)
            log.close()
        assert proc.returncode == 0, (tmp_path / "worker.log").read_text()
        assert [e["id"] for e in store.load_session_entries("w")] == ["a", "b", "c", "d"]
    finally:
        store.close()
