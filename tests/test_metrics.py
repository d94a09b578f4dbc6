"""The store's metrics (``store/metrics.py``): each moves when its operation happens, with the
outcome it had, on the real servers. Each test gives its store a registry of its own, so
counts are exact."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import store.metrics as store_metrics
from store import SessionStore
from store.errors import BackendError, ConflictError
from store.metrics import Metrics, NoMetrics, default_metrics


def entry(eid: str, parent: str | None) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent, "timestamp": "2026-11-29T10:00:00.000Z",
            "message": {"role": "user", "content": f"content of {eid}"}}


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def metered(make_store: Callable[..., SessionStore]) -> tuple[SessionStore, CollectorRegistry]:
    registry = CollectorRegistry()
    return make_store(metrics=Metrics(registry)), registry


def test_appends_are_timed_by_outcome_and_segments_counted(make_store: Callable[..., SessionStore]) -> None:
    store, reg = metered(make_store)
    store.create_session("m")
    store.append_session_entries("m", [entry("a", None), entry("b", "a")])
    store.append_session_entries("m", [entry("c", "b")], "b")
    with pytest.raises(ConflictError):
        store.append_session_entries("m", [entry("x", "a")], "a")
    assert value(reg, "sessionstore_append_seconds_count", outcome="ok") == 2
    assert value(reg, "sessionstore_append_seconds_count", outcome="conflict") == 1
    assert value(reg, "sessionstore_append_seconds_count", outcome="indeterminate") == 0
    # Two segments written, of 2 and 1 entries; the refused append wrote none.
    assert value(reg, "sessionstore_segment_entries_count") == 2
    assert value(reg, "sessionstore_segment_entries_sum") == 3
    # A re-send of a committed batch is an ok append that writes no segment.
    store.append_session_entries("m", [entry("c", "b")], "b")
    assert value(reg, "sessionstore_append_seconds_count", outcome="ok") == 3
    assert value(reg, "sessionstore_segment_entries_count") == 2


def test_object_requests_and_redis_calls_are_counted_by_result(make_store: Callable[..., SessionStore]) -> None:
    store, reg = metered(make_store)
    puts_before = value(reg, "sessionstore_object_request_seconds_count", op="put", result="ok")
    store.create_session("o")
    store.append_session_entries("o", [entry("a", None)])
    puts = value(reg, "sessionstore_object_request_seconds_count", op="put", result="ok") - puts_before
    assert puts >= 2  # the header and the segment
    # A create of a session that exists: its header's conditional PUT is refused.
    with pytest.raises(Exception):
        store.create_session("o")
    assert value(reg, "sessionstore_object_request_seconds_count", op="put", result="exists") >= 1
    store.read_session("o")
    assert value(reg, "sessionstore_read_seconds_count", op="session") == 1
    assert value(reg, "sessionstore_redis_call_seconds_count", result="ok") >= 2
    # Every request the backend made was observed, once.
    observed = sum(s.value for m in reg.collect() if m.name == "sessionstore_object_request_seconds"
                   for s in m.samples if s.name.endswith("_count"))
    assert observed == sum(store.objects.requests.values())


def test_a_redis_outage_is_counted_as_unavailable(
    make_store: Callable[..., SessionStore], redis_server_factory: Callable[..., Any], s3_url: str,
) -> None:
    server = redis_server_factory()
    registry = CollectorRegistry()
    store = SessionStore.from_url(s3_url, server.url, metrics=Metrics(registry),
                                  redis_socket_timeout=0.5)
    try:
        store.create_session("r")
        server.stop()
        with pytest.raises(BackendError):
            store.append_session_entries("r", [entry("a", None)])
        assert value(registry, "sessionstore_redis_call_seconds_count", result="unavailable") >= 1
        assert value(registry, "sessionstore_append_seconds_count", outcome="error") == 1
    finally:
        store.close()


def test_without_prometheus_client_metrics_are_a_no_op(monkeypatch: pytest.MonkeyPatch,
                                                       make_store: Callable[..., SessionStore]) -> None:
    monkeypatch.setattr(store_metrics, "_default", None)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    metrics = default_metrics()
    assert isinstance(metrics, NoMetrics)
    store = make_store(metrics=metrics)
    store.create_session("n")
    store.append_session_entries("n", [entry("a", None)])  # nothing to observe, nothing fails
    assert store.objects.observer is None and store.coord.observer is None
    body, ctype = metrics.exposition()
    assert b"not installed" in body and ctype == "text/plain"


def test_the_default_registry_is_the_process_one() -> None:
    from prometheus_client import REGISTRY

    metrics = default_metrics()
    assert metrics is default_metrics() and metrics.registry is REGISTRY
    body, ctype = metrics.exposition()
    assert b"sessionstore_append_seconds" in body and ctype.startswith("text/plain; version=")


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``url``'s Prometheus exposition, parsed: (sample name, sorted labels) -> value."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_compactor_worker_serves_its_metrics(
    make_store: Callable[..., SessionStore], s3_url: str, redis_url: str, redis_prefix: str, tmp_path: Any,
) -> None:
    """``python -m compactor work --metrics-port``: the queue's backlog while a job waits, the
    job done once the worker took it, and the worker's own object-store requests."""
    import subprocess
    from pathlib import Path

    from harness.serve_process import free_port

    writer = make_store(compact_after_segments=2)
    writer.create_session("w")
    writer.append_session_entries("w", [entry("a", None)])
    writer.append_session_entries("w", [entry("b", "a")])  # a compaction job is queued
    port = free_port()
    log = open(tmp_path / "worker.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "compactor", "work", "--objects", s3_url, "--redis", redis_url,
         "--redis-prefix", redis_prefix, "--grace", "0", "--block", "0.2", "--metrics-port", str(port)],
        cwd=Path(__file__).resolve().parent.parent, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 60
        got: dict[Any, float] = {}
        while time.monotonic() < deadline:  # synchronisation, not a timing assertion
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()
            try:
                got = scrape(url)
            except OSError:
                got = {}
            if got.get(("sessionstore_compactor_jobs_total", (("outcome", "done"),)), 0) >= 1:
                break
            time.sleep(0.1)
        assert got.get(("sessionstore_compactor_jobs_total", (("outcome", "done"),))) == 1, got
        assert got[("sessionstore_compactor_redis_up", ())] == 1
        assert ("sessionstore_compaction_queue_jobs", ()) in got
        assert ("sessionstore_compaction_oldest_job_age_seconds", ()) in got
        # The worker's own requests: it read the segments and wrote a base.
        puts = got.get(("sessionstore_object_request_seconds_count", (("op", "put"), ("result", "ok"))), 0)
        assert puts >= 1, got
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_the_queue_backlog_counts_jobs_and_dates_the_oldest(make_store: Callable[..., SessionStore]) -> None:
    from compactor.worker import WorkerOptions
    from coordination.jobs import JobQueue

    store = make_store(compact_after_segments=2)
    queue = JobQueue(store.coord, group=WorkerOptions().group, consumer="c")
    assert queue.backlog() == (0, None)
    before_ms = int(time.time() * 1000)
    for sid in ("q1", "q2"):
        store.create_session(sid)
        store.append_session_entries(sid, [entry("a", None)])
        store.append_session_entries(sid, [entry("b", "a")])
    length, oldest = queue.backlog()
    assert length == 2 and oldest is not None and oldest >= before_ms - 1000


def test_serve_counts_requests_and_followers_and_serves_metrics_to_the_operator(
    serve: Callable[..., Any], tmp_path: Any,
) -> None:
    """``GET /metrics``: the operator's only (another tenant's token is refused); requests
    counted by route class, method and status; a long-poll counted as a live follower while
    it waits; the appends the requests made, in the same exposition."""
    import json
    import threading

    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    ops, acme = "ops-token-0123456789x", "acme-write-0123456789"
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tenants": {"acme": [acme], "*": [ops]}}))
    registry = CollectorRegistry()
    _, url = serve({"metrics": Metrics(registry)}, tokens_file=path, long_poll_s=20)

    def metrics(token: str = ops) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        r = httpx.get(url + "/metrics", headers={"authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/plain; version=")
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(r.text) for s in f.samples}

    refused = httpx.get(url + "/metrics", headers={"authorization": f"Bearer {acme}"})
    assert refused.status_code == 403 and refused.json()["scope_needed"] == "admin"
    assert httpx.get(url + "/metrics").status_code == 401

    auth = {"authorization": f"Bearer {acme}"}
    stream = url + "/v1/stream/acme/m"
    assert httpx.put(stream, headers={**auth, "content-type": "text/plain"}).status_code == 201
    assert httpx.post(stream, headers={**auth, "content-type": "text/plain"}, content=b"one").status_code in (200, 204)
    got = metrics()
    key = ("sessionstore_http_request_seconds_count",
           (("method", "PUT"), ("route", "stream.create"), ("status", "201")))
    assert got[key] == 1
    appended = [v for (name, labels), v in got.items()
                if name == "sessionstore_http_request_seconds_count" and ("route", "stream.append") in labels]
    assert appended == [1]
    assert got[("sessionstore_append_seconds_count", (("outcome", "ok"),))] >= 1
    assert got[("sessionstore_http_request_seconds_count",
                (("method", "GET"), ("route", "metrics"), ("status", "403")))] == 1
    assert got[("sessionstore_http_live_followers", (("kind", "long_poll"),))] == 0

    # A long-poll at the tail waits: a live follower until it is answered.
    tail = httpx.get(stream + "?offset=-1", headers=auth).headers["stream-next-offset"]
    answered: list[int] = []
    poll = threading.Thread(target=lambda: answered.append(
        httpx.get(f"{stream}?offset={tail}&live=long-poll", headers=auth, timeout=30).status_code))
    poll.start()
    deadline = time.monotonic() + 30
    while metrics()[("sessionstore_http_live_followers", (("kind", "long_poll"),))] != 1:
        assert time.monotonic() < deadline, "the long-poll never counted as a follower"
        time.sleep(0.05)
    assert httpx.post(stream, headers={**auth, "content-type": "text/plain"}, content=b"two").status_code in (200, 204)
    poll.join(30)
    assert answered == [200]
    assert metrics()[("sessionstore_http_live_followers", (("kind", "long_poll"),))] == 0


def test_readyz_answers_503_naming_the_backend_that_is_away(
    redis_server_factory: Callable[..., Any], s3_url: str,
) -> None:
    """``/readyz`` (public: a load balancer's probe): 200 while the object store and Redis
    answer; 503 naming Redis once it is stopped; ``/healthz`` (liveness) stays 200."""
    import httpx
    from harness.asgi_server import AsgiServer

    from store.http.app import StreamService

    redis = redis_server_factory()
    store = SessionStore.from_url(s3_url, redis.url, redis_socket_timeout=0.5)
    service = StreamService(store, tokens=None)
    server = AsgiServer(service.app).start()
    try:
        ready = httpx.get(server.url + "/readyz")
        assert ready.status_code == 200 and ready.json() == {"objects": "ok", "redis": "ok"}
        redis.stop()
        away = httpx.get(server.url + "/readyz", timeout=10)
        assert away.status_code == 503
        assert away.json()["objects"] == "ok" and away.json()["redis"] != "ok"
        assert httpx.get(server.url + "/healthz").status_code == 200
    finally:
        server.stop()
        store.close()
