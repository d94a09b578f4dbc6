"""Fault injection at each step of the append protocol. Nothing acknowledged is ever lost,
nothing is duplicated, and a refused or failed append leaves nothing visible."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from botocore.awsrequest import AWSResponse
from history import Op, attempt, check_history, load_ops

from store import SessionStore
from store.errors import (
    BackendUnavailableError,
    IndeterminateError,
    SessionStoreError,
)
from store.retry import RetryPolicy


def entry(eid: str, parent: str | None) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent, "timestamp": "2026-11-22T10:00:00.000Z",
            "message": {"role": "user", "content": eid}}


def seg_numbers(store: SessionStore, sid: str) -> list[int]:
    inc = store.get_header(sid).incarnation
    return [int(k.rsplit("/", 1)[-1].split(".")[0]) for k in store.iter_segment_keys(sid, inc)]


# --- a writer killed between its segment PUT and its Redis commit -----------------------------


def _killed_writer(objects_url: str, redis_url: str, prefix: str, kill_at: int, log_path: str) -> None:
    def hook(point: str, ctx: dict[str, Any]) -> None:
        if point == "append.after_put" and ctx["seq"] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    store = SessionStore.from_url(objects_url, redis_url, redis_prefix=prefix, fault_hook=hook)
    parent = None
    with open(log_path, "ab") as log:
        for i in range(1, 100):
            ids = [f"k{i}a", f"k{i}b"]
            res = store.append_session_entries("sk", [entry(ids[0], parent), entry(ids[1], ids[0])])
            log.write(Op("sk", ids, None, "ok", res.seq).to_json() + b"\n")
            log.flush()
            parent = ids[1]


def test_writer_killed_after_put_before_commit(
    s3_url: str, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    store = SessionStore.from_url(s3_url, redis_url, redis_prefix=redis_prefix)
    store.create_session("sk")
    log_path = tmp_path / "killed.jsonl"
    proc = mp.get_context("spawn").Process(
        target=_killed_writer, args=(s3_url, redis_url, redis_prefix, 6, str(log_path))
    )
    proc.start()
    proc.join(120)
    assert proc.exitcode == -signal.SIGKILL
    ops = load_ops([log_path])
    assert [op.seq for op in ops] == [1, 2, 3, 4, 5]
    # Redis never heard of segment 6; the object store has it.
    assert store.coord.tail("sk").seq == 5  # type: ignore[union-attr]
    assert seg_numbers(store, "sk") == [1, 2, 3, 4, 5, 6]
    # The next writer rolls it forward and lands after it.
    tail = store.get_tail("sk")
    assert (tail.seq, tail.last_entry_id) == (6, "k6b")
    res = store.append_session_entries("sk", [entry("after", "k6b")], "k6b")
    assert res.seq == 7
    ops.append(Op("sk", ["after"], "k6b", "ok", 7))
    ops.append(Op("sk", ["k6a", "k6b"], None, "indeterminate"))  # durable, never acknowledged
    report = check_history(store, ops)
    assert report.problems == []
    assert [e["id"] for e in store.load_session_entries("sk")][-3:] == ["k6a", "k6b", "after"]


def test_writer_without_expected_tail_rolls_forward_a_dead_writers_segment(
    make_store: Callable[..., SessionStore]
) -> None:
    class Died(Exception):
        pass

    def die(point: str, ctx: dict[str, Any]) -> None:
        if point == "append.after_put":
            raise Died()

    dead = make_store(fault_hook=die)
    live = make_store()
    live.create_session("rf2")
    live.append_session_entries("rf2", [entry("a", None)])
    with pytest.raises(Died):
        dead.append_session_entries("rf2", [entry("b", "a")])
    # live's PUT of segment 2 meets the dead writer's object: 412, roll forward, then 3.
    res = live.append_session_entries("rf2", [entry("c", "a")])
    assert res.seq == 3
    assert seg_numbers(live, "rf2") == [1, 2, 3]
    assert [e["id"] for e in live.load_session_entries("rf2")] == ["a", "b", "c"]


# --- a response cut inside its body ----------------------------------------------------------


def test_a_response_cut_inside_its_body_is_a_typed_error_and_retried(
    s3_proxy: Any, redis_url: str, redis_prefix: str
) -> None:
    """The connection is reset after the status, the headers and half the body of a response
    (urllib3's "Connection broken: ConnectionResetError" inside the body): a listing, an
    object's GET, and the error responses whose XML body botocore reads outside its
    transport's translation (the 404 of a reader's probe past the tail, the 412 of a create
    that lost). Each fails with ``BackendUnavailableError``, never the HTTP library's own
    exception (the 404 read as urllib3's ``ProtocolError``, which no retry knew, in the
    soak); the store retries them, so a read through it returns the session."""
    store = SessionStore.from_url(s3_proxy.url, redis_url, redis_prefix=redis_prefix)
    store.create_session("cut")
    store.append_session_entries("cut", [entry("a", None)])
    inc = store.get_header("cut").incarnation
    key = store.layout.segment("cut", inc, 1)
    calls: list[Callable[[], object]] = [
        lambda: list(store.objects.list(store.layout.segment_prefix("cut", inc))),
        lambda: store.objects.get(key),
        lambda: store.objects.get(store.layout.segment("cut", inc, 2)),  # 404
        lambda: store.objects.put_if_absent(key, b"{}\n"),  # 412
    ]
    for call in calls:
        s3_proxy.cut_next_response()
        with pytest.raises(BackendUnavailableError):
            call()
        s3_proxy.heal()
    assert s3_proxy.stats()["cut_responses"] == len(calls)
    reader = SessionStore.from_url(s3_proxy.url, redis_url, redis_prefix=redis_prefix)
    reader.coord.client.flushall()  # no hint: the read LISTs
    for _ in range(3):
        s3_proxy.cut_next_response()
        assert [e["id"] for e in reader.load_session_entries("cut")] == ["a"]
        s3_proxy.heal()
    assert s3_proxy.stats()["cut_responses"] == len(calls) + 3
    store.close()
    reader.close()


# --- the PUT landed but its response was lost ------------------------------------------------


def test_put_response_dropped_then_retried(s3_proxy: Any, redis_url: str, redis_prefix: str) -> None:
    store = SessionStore.from_url(s3_proxy.url, redis_url, redis_prefix=redis_prefix)
    store.create_session("drop")
    store.append_session_entries("drop", [entry("a", None)])
    puts = store.objects.requests["put"]
    s3_proxy.drop_next_response()
    res = store.append_session_entries("drop", [entry("b", "a")], "a")
    assert res.seq == 2
    # The first PUT landed, its answer was lost; the resend met our own object (nonce).
    assert store.objects.requests["put"] - puts == 2
    assert seg_numbers(store, "drop") == [1, 2]
    assert [e["id"] for e in store.load_session_entries("drop")] == ["a", "b"]
    assert store.append_session_entries("drop", [entry("c", "b")], "b").seq == 3
    store.close()


def test_put_that_times_out_but_lands(s3_proxy: Any, redis_url: str, redis_prefix: str) -> None:
    url = s3_proxy.url + "&read_timeout=0.5"
    store = SessionStore.from_url(url, redis_url, redis_prefix=redis_prefix)
    store.create_session("slow")

    def slow_then_heal(point: str, ctx: dict[str, Any]) -> None:
        if point == "append.before_put":
            s3_proxy.delay(1.0, "response")
            threading.Timer(0.7, s3_proxy.heal).start()

    slow = SessionStore(store.objects, store.coord, prefix=store.layout.prefix,
                        options=store.options.__class__(redis_prefix=redis_prefix, fault_hook=slow_then_heal),
                        owns_backends=False)
    res = slow.append_session_entries("slow", [entry("a", None)])
    assert res.seq == 1
    assert seg_numbers(store, "slow") == [1]
    assert store.objects.requests["put"] >= 2
    assert [e["id"] for e in store.load_session_entries("slow")] == ["a"]
    store.close()


# --- the S3 server answers 503 SlowDown once --------------------------------------------------


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.body


def test_slowdown_is_retried(store: SessionStore) -> None:
    store.create_session("slow503")
    calls = {"n": 0}

    def before_send(request: Any, **_: Any) -> AWSResponse | None:
        if request.method == "PUT" and "/seg/" in request.url and calls["n"] == 0:
            calls["n"] += 1
            body = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
            return AWSResponse(request.url, 503, {"Content-Type": "application/xml"}, _Raw(body))
        return None

    store.objects.client.meta.events.register("before-send.s3.PutObject", before_send)  # type: ignore[attr-defined]
    puts = store.objects.requests["put"]
    res = store.append_session_entries("slow503", [entry("a", None)])
    assert res.seq == 1 and calls["n"] == 1
    assert store.objects.requests["put"] - puts == 2
    assert seg_numbers(store, "slow503") == [1]


def test_persistent_outage_is_indeterminate_and_resend_is_safe(store: SessionStore) -> None:
    store.create_session("out")
    store.append_session_entries("out", [entry("first", None)])
    state = {"fail": True}

    def before_send(request: Any, **_: Any) -> AWSResponse | None:
        if state["fail"] and request.method in ("PUT", "GET") and "/seg/" in request.url:
            return AWSResponse(request.url, 503, {}, _Raw(b"<Error><Code>ServiceUnavailable</Code></Error>"))
        return None

    store.objects.client.meta.events.register("before-send.s3", before_send)  # type: ignore[attr-defined]
    quick = SessionStore(store.objects, store.coord, prefix=store.layout.prefix,
                         options=store.options.__class__(redis_prefix=store.options.redis_prefix,
                                                         retry=RetryPolicy(attempts=3, max_elapsed=2)),
                         owns_backends=False)
    with pytest.raises(IndeterminateError):
        quick.append_session_entries("out", [entry("a", None)])
    state["fail"] = False
    first = quick.append_session_entries("out", [entry("a", None)])
    assert quick.append_session_entries("out", [entry("a", None)]) == first
    assert seg_numbers(store, "out") == [1, 2]
    assert [e["id"] for e in store.load_session_entries("out")] == ["first", "a"]


# --- Redis loses its memory mid-run -----------------------------------------------------------


def _threaded_writers(store: SessionStore, sessions: list[str], per_thread: int, threads: int,
                      disrupt: Callable[[int], None]) -> list[Op]:
    ops: list[Op] = []
    lock = threading.Lock()

    def run(wid: int) -> None:
        last: dict[str, str | None] = {s: None for s in sessions}
        for i in range(per_thread):
            sid = sessions[(i + wid) % len(sessions)]
            ids = [f"t{wid}-{i}"]
            expected = None
            parent = last[sid]
            if i % 3 == 0:
                try:
                    expected = store.get_tail(sid).last_entry_id
                except SessionStoreError:
                    continue
                parent = expected or None
            op = attempt(store, sid, [entry(ids[0], parent)], expected)
            if op.outcome == "ok":
                last[sid] = ids[0]
            with lock:
                ops.append(op)

    workers = [threading.Thread(target=run, args=(w,)) for w in range(threads)]
    for w in workers:
        w.start()
    for step in range(3):
        time.sleep(0.3)
        disrupt(step)
    for w in workers:
        w.join(120)
    return ops


def test_flushall_mid_run(make_store: Callable[..., SessionStore]) -> None:
    store = make_store()
    sessions = ["f1", "f2"]
    for s in sessions:
        store.create_session(s)
    ops = _threaded_writers(store, sessions, 60, 3, lambda step: store.coord.client.flushall())
    report = check_history(store, ops)
    assert report.problems == []
    assert report.errors == []
    assert report.acknowledged > 100
    for s in sessions:
        assert seg_numbers(store, s) == list(range(1, len(seg_numbers(store, s)) + 1))


def test_redis_restarted_without_persistence(private_redis: Any, s3_url: str) -> None:
    store = SessionStore.from_url(s3_url, private_redis.url)
    sessions = ["r1", "r2"]
    for s in sessions:
        store.create_session(s)
    ops = _threaded_writers(store, sessions, 50, 3, lambda step: private_redis.restart() if step == 1 else None)
    report = check_history(store, ops)
    assert report.problems == []
    assert report.acknowledged > 80
    # Whatever failed during the restart failed cleanly (nothing visible, checked above).
    assert all(e.startswith("error:BackendUnavailableError") for e in report.errors)
    store.close()


def test_script_cache_flushed(store: SessionStore) -> None:
    store.create_session("sc")
    store.append_session_entries("sc", [entry("a", None)])
    store.coord.client.script_flush()
    assert store.append_session_entries("sc", [entry("b", "a")], "a").seq == 2
    assert store.append_session_entries("sc", [entry("b", "a")], "a").seq == 2


# --- Redis paused (SIGSTOP) past the client timeout --------------------------------------------


def test_redis_paused_before_check_fails_cleanly(private_redis: Any, s3_url: str) -> None:
    store = SessionStore.from_url(s3_url, private_redis.url, redis_socket_timeout=0.3,
                                  retry=RetryPolicy(attempts=3, max_elapsed=2))
    store.create_session("pz")
    store.append_session_entries("pz", [entry("a", None)])
    private_redis.pause()
    try:
        with pytest.raises(BackendUnavailableError):
            store.append_session_entries("pz", [entry("b", "a")])
    finally:
        private_redis.resume()
    assert seg_numbers(store, "pz") == [1]  # nothing was written
    assert store.append_session_entries("pz", [entry("b", "a")], "a").seq == 2
    store.close()


def test_redis_paused_then_resumed_within_retry_budget(private_redis: Any, s3_url: str) -> None:
    store = SessionStore.from_url(s3_url, private_redis.url, redis_socket_timeout=0.3)
    store.create_session("pr")
    private_redis.pause()
    threading.Timer(1.0, private_redis.resume).start()
    assert store.append_session_entries("pr", [entry("a", None)]).seq == 1
    assert store.load_session_entries("pr") == [entry("a", None)]
    store.close()


def test_redis_paused_after_put_still_acknowledges(private_redis: Any, s3_url: str) -> None:
    def pause_after_put(point: str, ctx: dict[str, Any]) -> None:
        if point == "append.after_put" and ctx["seq"] == 2:
            private_redis.pause()
            threading.Timer(3.0, private_redis.resume).start()

    store = SessionStore.from_url(s3_url, private_redis.url, redis_socket_timeout=0.3,
                                  retry=RetryPolicy(attempts=2, max_elapsed=1), fault_hook=pause_after_put)
    store.create_session("pa")
    store.append_session_entries("pa", [entry("a", None)])
    # The segment is the commit point: Redis not answering the commit does not undo it.
    assert store.append_session_entries("pa", [entry("b", "a")]).seq == 2
    time.sleep(3.5)
    assert store.append_session_entries("pa", [entry("c", "b")], "b").seq == 3
    assert [e["id"] for e in store.load_session_entries("pa")] == ["a", "b", "c"]
    store.close()


def test_redis_down_during_delete_then_recreate(private_redis: Any, s3_url: str) -> None:
    store = SessionStore.from_url(s3_url, private_redis.url, redis_socket_timeout=0.3,
                                  retry=RetryPolicy(attempts=2, max_elapsed=1))
    store.create_session("dd")
    for i in range(3):
        store.append_session_entries("dd", [entry(f"e{i}", f"e{i-1}" if i else None)])
    private_redis.pause()
    try:
        store.delete_session("dd")  # Redis cannot be told
    finally:
        private_redis.resume()
    assert store.coord.tail("dd").seq == 3  # type: ignore[union-attr]  # stale state survives
    other = SessionStore.from_url(s3_url, private_redis.url)
    other.create_session("dd")
    assert other.get_tail("dd").seq == 0
    assert other.append_session_entries("dd", [entry("fresh", None)], "").seq == 1
    assert store.load_session_entries("dd") == [entry("fresh", None)]
    # The first store's cached header is of the old life: it must not write there.
    assert store.append_session_entries("dd", [entry("x", "fresh")], "fresh").seq == 2
    assert [e["id"] for e in other.load_session_entries("dd")] == ["fresh", "x"]
    other.close()
    store.close()


def test_claim_of_a_writer_that_died_before_its_put_expires(make_store: Callable[..., SessionStore]) -> None:
    class Died(Exception):
        pass

    def die(point: str, ctx: dict[str, Any]) -> None:
        if point == "append.before_put":
            raise Died()

    dead = make_store(fault_hook=die, claim_ms=400)
    live = make_store(claim_ms=400)
    live.create_session("cl")
    live.append_session_entries("cl", [entry("a", None)])
    with pytest.raises(Died):
        dead.append_session_entries("cl", [entry("b", "a")])  # claimed segment 2, never PUT it
    claim = live.coord.client.get(live.coord.keys.claim("cl"))
    assert claim is not None and claim.startswith(b"1:")  # the dead writer's claim on seg 2
    # The live writer waits behind the claim until it expires, then goes ahead.
    assert live.append_session_entries("cl", [entry("c", "a")]).seq == 2
    assert seg_numbers(live, "cl") == [1, 2]
    assert [e["id"] for e in live.load_session_entries("cl")] == ["a", "c"]


def test_listing_a_sessions_segments_is_retried_like_every_other_call(
    s3_proxy: Any, redis_url: str, redis_prefix: str
) -> None:
    """``iter_segment_keys`` listed without the retry policy: one transient failure (a
    compaction soak met moto's 500 on a LIST racing GC's deletes) reached a reader as
    ``BackendUnavailableError``. It is retried like every other backend call."""
    store = SessionStore.from_url(s3_proxy.url, redis_url, redis_prefix=redis_prefix)
    store.create_session("ls")
    store.append_session_entries("ls", [entry("a", None)])
    store.append_session_entries("ls", [entry("b", "a")])
    inc = store.get_header("ls").incarnation
    s3_proxy.cut_next_response()
    keys = list(store.iter_segment_keys("ls", inc))
    assert keys == [store.layout.segment("ls", inc, 1), store.layout.segment("ls", inc, 2)]
    assert s3_proxy.stats()["cut_responses"] == 1
    store.close()
