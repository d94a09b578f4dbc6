"""The compactor against the real servers: compaction, GC, redaction purge, the job queue, the
worker, and crashes at every step (child processes SIGKILLed at named fault points).

Time never comes from sleeping: every compactor here runs on a ``FakeClock`` that the test
moves past the grace period when it means to.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import orjson
import pytest

from compactor import Compactor, CompactorOptions, Worker, WorkerOptions
from harness.pausing import FakeClock

from coordination.jobs import JobQueue
from coordination.redis import Coordinator
from store import SessionStore, StoreOptions
from store.formats.entries import encode_entries
from store.errors import CorruptObjectError
from store.backends.objects import ObjectInfo, ObjectStore, StoredObject, object_store_from_url, s3_prefix_of
from store.formats.records import ForkPoint
from store.model.session import Session


GRACE_MS = 60_000


# --- helpers ---------------------------------------------------------------------------------


def entry(eid: str, parent: str | None, text: str = "") -> dict[str, Any]:
    return {
        "type": "message",
        "id": eid,
        "parentId": parent,
        "timestamp": "2026-11-22T10:00:00.000Z",
        "message": {"role": "user", "content": text or f"text of {eid}"},
    }


def redaction(eid: str, parent: str | None, target: str, reason: str = "pii") -> dict[str, Any]:
    return {
        "type": "redaction",
        "id": eid,
        "parentId": parent,
        "timestamp": "2026-11-22T10:00:01.000Z",
        "targetId": target,
        "reason": reason,
    }


def fill(store: SessionStore, sid: str, segments: int, per_segment: int = 1, tag: str = "e") -> str:
    """Append ``segments`` batches in one chain; returns the last id."""
    parent = store.get_tail(sid).last_entry_id or None
    for s in range(segments):
        batch = []
        for k in range(per_segment):
            eid = f"{tag}{s}-{k}"
            batch.append(entry(eid, parent))
            parent = eid
        store.append_session_entries(sid, batch)
    assert parent is not None
    return parent


def compactor_for(store: SessionStore, clock: FakeClock, **options: Any) -> Compactor:
    options.setdefault("grace_ms", GRACE_MS)
    options.setdefault("worker", f"test-{uuid.uuid4().hex[:6]}")
    hook = options.pop("fault_hook", None)
    return Compactor(store, CompactorOptions(**options), now=clock, fault_hook=hook)


def keys_of(store: SessionStore, sid: str) -> set[str]:
    return {i.key for i in store.objects.list(store.layout.session_prefix(sid))}


def reachable(store: SessionStore, sid: str) -> set[str]:
    """Header, latest manifest, its bases, and segments after it: nothing else may remain."""
    header = store.get_header(sid)
    inc = header.incarnation
    out = {store.layout.header(sid)}
    manifest = store.latest_manifest(sid, inc)
    through = 0
    if manifest is not None:
        through = manifest.through_seq
        out.add(store.layout.manifest(sid, inc, manifest.generation))
        out.update(str(b["key"]) for b in manifest.bases)
    for key in store.iter_segment_keys(sid, inc):
        if int(key.rsplit("/", 1)[-1].split(".")[0]) > through:
            out.add(key)
    return out


def view(store: SessionStore, sid: str) -> tuple[list[str], list[int], list[dict[str, Any]]]:
    """What a reader gets: ids in order, their segment numbers, the stored entries."""
    data = store.read_session(sid)
    return [e["id"] for e in data.entries], list(data.seqs), data.entries


def model_view(store: SessionStore, sid: str) -> list[dict[str, Any]]:
    """pi's view of the session as the read-time model builds it (redacted entries as
    tombstones). Compacting everything must leave exactly this in the bases (invariant 6)."""
    data = store.read_session(sid)
    return list(Session(data.header.pi_header, data.all_entries).entries)


def base_keys(store: SessionStore, sid: str) -> set[str]:
    inc = store.get_header(sid).incarnation
    prefix = store.layout.incarnation_prefix(sid, inc) + "base/"
    return {i.key for i in store.objects.list(prefix)}


# --- compaction and what readers see ---------------------------------------------------------


def test_compaction_merges_segments_and_readers_see_the_same_session(store: SessionStore) -> None:
    clock = FakeClock()
    store.create_session("m1")
    last = fill(store, "m1", 12, per_segment=3)
    store.append_session_entries("m1", [redaction("r1", last, "e2-1")])
    ids, seqs, _ = view(store, "m1")
    expected = model_view(store, "m1")
    c = compactor_for(store, clock)

    res = c.compact_session("m1")

    assert (res.outcome, res.generation, res.segments_merged) == ("compacted", 1, (1, 13))
    assert res.entries == 37 and res.redactions_purged == 1
    assert view(store, "m1") == (ids, seqs, expected)
    assert expected[7]["redacted"] == {"reason": "pii", "redactionId": "r1"}
    inc = store.get_header("m1").incarnation
    raw = orjson.loads(store.objects.get(store.layout.manifest("m1", inc, 1)).data)
    assert raw["schema"] == 1 and raw["session_id"] == "m1" and raw["incarnation"] == inc
    assert raw["through_seq"] == 13 and raw["previous_generation"] == 0
    assert raw["seq_counts"] == [3] * 12 + [1]
    assert raw["entry_count"] == 37 and raw["last_entry_id"] == "r1"
    assert [b["entries"] for b in raw["bases"]] == [37]
    comp = raw["compaction"]
    assert comp["segments_merged"] == [1, 13] and comp["entries"] == 37
    assert comp["redactions_purged"] == 1 and comp["worker"] == c.worker
    assert comp["bytes_in"] == res.bytes_in > 0 and comp["bytes_out"] == res.bytes_out > 0
    assert comp["started_at"].endswith("Z") and comp["finished_at_ms"] == clock()
    assert raw["retired"] == [store.layout.segment("m1", inc, s) for s in range(1, 14)]
    assert raw["delete_after_ms"] == clock() + GRACE_MS
    # The base holds the tombstone, not the content.
    base = store.objects.get(raw["bases"][0]["key"]).data
    assert b"text of e2-1" not in base and b'"redactionId":"r1"' in base

    # Appends go on after the manifest, with segment numbers that keep counting.
    assert store.append_session_entries("m1", [entry("after", "r1")]).seq == 14
    res2 = c.compact_session("m1")
    assert (res2.outcome, res2.generation, res2.segments_merged) == ("compacted", 2, (14, 14))
    raw2 = orjson.loads(store.objects.get(store.layout.manifest("m1", inc, 2)).data)
    assert raw2["previous_generation"] == 1 and raw2["seq_counts"] == [3] * 12 + [1, 1]
    # The first base is far larger than the new segment: kept as it is, named again.
    assert raw2["retired"] == [store.layout.manifest("m1", inc, 1), store.layout.segment("m1", inc, 14)]
    assert raw2["bases"][0] == raw["bases"][0] and [b["entries"] for b in raw2["bases"]] == [37, 1]
    assert raw2["compaction"]["bases_kept"] == 1 and res2.bases_kept == 1 and res2.entries == 1
    assert raw2["entry_count"] == 38 and raw2["redactions"] == [["e2-1", "r1", "pii"]]
    ids2, seqs2, entries2 = view(store, "m1")
    assert (ids2, seqs2) == (ids + ["after"], seqs + [14]) and entries2[:-1] == expected
    history = c.history("m1")
    assert [(h.generation, h.segments_merged) for h in history] == [(2, (14, 14)), (1, (1, 13))]
    # Nothing new: nothing to do.
    assert c.compact_session("m1").outcome == "nothing"


def test_redaction_before_its_target_and_after_a_previous_compaction(store: SessionStore) -> None:
    """A redaction may name an entry that is already in a base, or one not yet appended."""
    clock = FakeClock()
    c = compactor_for(store, clock)
    store.create_session("rd")
    store.append_session_entries("rd", [entry("a", None, "alpha secret"), entry("b", "a")])
    c.compact_session("rd")  # "a" is now in a base
    store.append_session_entries("rd", [redaction("r-a", "b", "a"), redaction("r-late", "r-a", "late")])
    store.append_session_entries("rd", [entry("late", "r-late", "late secret")])
    store.append_session_entries("rd", [redaction("r-a2", "late", "a", "second")])
    expected = model_view(store, "rd")
    res = c.compact_session("rd")
    assert res.redactions_purged == 2
    _, _, entries = view(store, "rd")
    assert entries == expected
    tomb = {e["id"]: e.get("redacted") for e in entries}
    # The earliest redaction names the tombstone, as the read-time model says.
    assert tomb["a"] == {"reason": "pii", "redactionId": "r-a"}
    assert tomb["late"] == {"reason": "pii", "redactionId": "r-late"}
    inc = store.get_header("rd").incarnation
    manifest = store.latest_manifest("rd", inc)
    assert manifest is not None
    base = b"".join(store.objects.get(str(b["key"])).data for b in manifest.bases)
    assert b"secret" not in base


def test_the_read_time_model_loads_a_compacted_redacted_session(store: SessionStore) -> None:
    """The base holds the tombstone (a message without its message): the read-time model
    must take it as a redacted entry, and show the same session as before compaction."""
    clock = FakeClock()
    store.create_session("tm")
    store.append_session_entries("tm", [entry("a", None, "secret"), redaction("r", "a", "a")])
    expected = model_view(store, "tm")
    compactor_for(store, clock).compact_session("tm")
    assert model_view(store, "tm") == expected


def test_bases_are_cut_at_max_base_bytes_and_read_in_order(store: SessionStore) -> None:
    clock = FakeClock()
    store.create_session("cut")
    fill(store, "cut", 30, per_segment=5)
    before = view(store, "cut")
    res = compactor_for(store, clock, max_base_bytes=4096).compact_session("cut")
    assert len(res.base_keys) > 3
    assert view(store, "cut") == before


def test_max_segments_limits_one_compaction(store: SessionStore) -> None:
    clock = FakeClock()
    store.create_session("lim")
    fill(store, "lim", 10)
    c = compactor_for(store, clock, max_segments=4)
    r1 = c.compact_session("lim")
    assert (r1.segments_merged, r1.more_pending) == ((1, 4), True)
    r2 = c.compact_session("lim")
    r3 = c.compact_session("lim")
    assert (r2.segments_merged, r3.segments_merged, r3.more_pending) == ((5, 8), (9, 10), False)
    assert len(view(store, "lim")[0]) == 10


def test_fork_of_a_compacted_session_reads_its_path(store: SessionStore) -> None:
    clock = FakeClock()
    c = compactor_for(store, clock)
    store.create_session("src")
    fill(store, "src", 6)
    inc = store.get_header("src").incarnation
    store.create_session("child", fork=ForkPoint("src", inc, "e3-0", 4))
    store.append_session_entries("child", [entry("c1", "e3-0")])
    before = store.load_session_entries("child")
    c.compact_session("src")
    c.compact_session("child")
    clock.advance(GRACE_MS)
    c.gc()
    assert store.load_session_entries("child") == before
    assert [e["id"] for e in before] == ["e0-0", "e1-0", "e2-0", "e3-0", "c1"]


@pytest.mark.every_backend
def test_loading_a_compacted_10000_entry_session_costs_constant_gets(
    make_store: Callable[..., SessionStore],
) -> None:
    store = make_store(recent_cache_bytes=0)
    clock = FakeClock()
    store.create_session("big")
    fill(store, "big", 100, per_segment=100)
    reader = make_store()
    reader.objects.requests.clear()
    assert len(reader.load_session_entries("big")) == 10_000
    uncompacted = reader.objects.requests["get"]
    # One GET per segment (without Redis's recent-segments cache): what compaction is for.
    assert uncompacted > 100

    compactor_for(store, clock).compact_session("big")
    clock.advance(GRACE_MS)
    compactor_for(store, clock).gc_session("big")
    for rep in range(3):
        reader.objects.requests.clear()
        entries = reader.load_session_entries("big")
        assert len(entries) == 10_000
        # Redis names the newest manifest and the tail: the manifest (first read in this
        # process only: then it is kept parsed), one base, and the probe of the segment
        # after it (the header is cached while Redis names its incarnation). No LIST: the
        # probe's 404 is confirmed by Redis's retired slot, read after it.
        assert reader.objects.requests["get"] == (3 if rep == 0 else 2)
        assert reader.objects.requests["list"] == 0
        assert reader.objects.requests["head"] == 0

    # Without Redis's state (flushed), the long way: the header again (nothing says the
    # cached one is current), a LIST of the manifests (the newest is the one kept parsed),
    # a LIST of the segments after it (no tail hint), the base, the probe, and a LIST after
    # the probe's 404 that shows no newer manifest.
    reader.coord.client.flushall()
    reader.objects.requests.clear()
    assert reader.load_session_entries("big") == entries
    assert reader.objects.requests["get"] == 3
    assert reader.objects.requests["list"] >= 3  # 4 on SeaweedFS (store/backends/s3.py: tree listing)


def _compact_measuring(objects_url: str, redis_url: str, prefix: str, sid: str, out: Any) -> None:
    # In a process of its own: the test process also runs the S3 server, whose allocations
    # (it keeps every object in memory) tracemalloc would count too.
    store = SessionStore.from_url(objects_url, redis_url, redis_prefix=prefix)
    c = Compactor(store, CompactorOptions(grace_ms=GRACE_MS, max_base_bytes=1 << 20))
    tracemalloc.start()
    res = c.compact_session(sid)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out.send((res.entries, res.bytes_in, len(res.base_keys), peak))
    store.close()


def test_100000_entries_compact_in_bounded_memory(
    s3_url: str, redis_url: str, redis_prefix: str, make_store: Callable[..., SessionStore]
) -> None:
    store = make_store()
    store.create_session("huge")
    # Segments put as a writer encodes them (the append path is not what this test is about;
    # readers and the compactor find segments Redis never heard of by listing and probing).
    inc = store.get_header("huge").incarnation
    parent = None
    for s in range(50):
        batch = []
        for k in range(2000):
            batch.append(entry(f"h{s}-{k}", parent))
            parent = batch[-1]["id"]
        body = encode_entries(batch)
        store.objects.put_if_absent(store.layout.segment("huge", inc, s + 1), body,
                                    {"sha256": hashlib.sha256(body).hexdigest()})
    ctx = mp.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_compact_measuring, args=(s3_url, redis_url, redis_prefix, "huge", send))
    proc.start()
    entries, bytes_in, bases, peak = receive.recv()
    proc.join(60)
    assert proc.exitcode == 0
    assert entries == 100_000 and bases >= 10
    # The session is ~12 MB encoded and several times that as Python objects (one base of
    # it all peaks near 30 MB). A compaction holds one segment (~240 kB, decoded) and one
    # base (1 MiB, plus the HTTP client's copies) at a time: about 6 MB. Holding the encoded
    # session even once would break this bound.
    assert bytes_in > 10_000_000
    assert peak < bytes_in * 0.8, (peak, bytes_in)
    assert len(store.load_session_entries("huge")) == 100_000


# --- the reader under compaction and GC ------------------------------------------------------


class _HookedObjects(ObjectStore):
    """The real object store, with a callback before the reader lists segments (a seam
    wrapper, not a mock: every request goes to the S3 server)."""

    def __init__(self, inner: ObjectStore, before_segment_list: Callable[[], None]) -> None:
        super().__init__()
        self.inner = inner
        self.before_segment_list = before_segment_list
        self.fired = False

    def put_if_absent(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> None:
        self.inner.put_if_absent(key, data, metadata)

    def get(self, key: str) -> StoredObject:
        return self.inner.get(key)

    def head(self, key: str) -> ObjectInfo | None:
        return self.inner.head(key)

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        if prefix.endswith("/seg/") and not self.fired:
            self.fired = True
            self.before_segment_list()
        return self.inner.list(prefix, start_after)

    def list_dirs(self, prefix: str) -> Iterator[str]:
        return self.inner.list_dirs(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def delete_if_unchanged(self, key: str, seen: StoredObject) -> bool:
        return self.inner.delete_if_unchanged(key, seen)


def test_reader_slower_than_the_grace_period_starts_over_instead_of_truncating(
    s3_url: str, redis_url: str, redis_prefix: str, make_store: Callable[..., SessionStore]
) -> None:
    """A reader that found no manifest, then (slower than the grace period) lists segments
    after compaction and GC removed them, must not answer "empty session"."""
    store = make_store()
    clock = FakeClock()
    store.create_session("slow")
    fill(store, "slow", 5)
    expected = view(store, "slow")
    store.coord.forget("slow")  # no Redis hint: the reader lists segments

    def compact_and_collect() -> None:
        compactor_for(store, clock).compact_session("slow")
        clock.advance(GRACE_MS)
        deleted = compactor_for(store, clock).gc_session("slow")
        assert deleted.count("segment") == 5

    objects = _HookedObjects(object_store_from_url(s3_url), compact_and_collect)
    coord = Coordinator.from_url(redis_url, prefix=redis_prefix)
    reader = SessionStore(objects, coord, prefix=s3_prefix_of(s3_url),
                          options=StoreOptions(redis_prefix=redis_prefix))
    try:
        assert view(reader, "slow") == expected
        assert objects.fired
    finally:
        reader.close()


# --- garbage collection ----------------------------------------------------------------------


def test_gc_deletes_what_each_manifest_retired_only_after_its_grace(store: SessionStore) -> None:
    clock = FakeClock()
    c = compactor_for(store, clock)
    store.create_session("g")
    fill(store, "g", 6, tag="a")
    c.compact_session("g")  # gen 1 retires segments 1-6 at t0
    clock.advance(10_000)
    fill(store, "g", 3, tag="b")
    c.compact_session("g")  # gen 2 retires manifest 1, its base, segments 7-9 at t0+10s
    fill(store, "g", 2, tag="c")  # the live tail: never deleted
    expected = view(store, "g")
    inc = store.get_header("g").incarnation
    seg = lambda n: store.layout.segment("g", inc, n)  # noqa: E731

    first = c.gc_session("g")
    assert (first.deleted, first.waiting) == ((), 11)
    clock.advance(GRACE_MS - 10_001)
    assert c.gc_session("g").deleted == ()
    clock.advance(1)  # gen 1's grace is over
    second = c.gc_session("g")
    assert sorted(second.deleted_keys) == [seg(n) for n in range(1, 7)]
    assert view(store, "g") == expected
    clock.advance(10_000)  # gen 2's too
    third = c.gc_session("g")
    assert sorted(third.deleted_keys) == sorted(
        [seg(n) for n in range(7, 10)] + [store.layout.manifest("g", inc, 1)]
        + [k for k in third.deleted_keys if "/base/" in k]
    )
    assert (third.count("base"), third.count("manifest")) == (1, 1)
    assert keys_of(store, "g") == reachable(store, "g")
    assert {seg(10), seg(11), store.layout.manifest("g", inc, 2)} <= keys_of(store, "g")
    assert view(store, "g") == expected
    assert c.gc_session("g").deleted == ()


class _Stop(Exception):
    pass


def test_gc_removes_an_orphan_base_after_the_grace_period(store: SessionStore) -> None:
    clock = FakeClock()

    def die_before_manifest(point: str, ctx: dict[str, Any]) -> None:
        if point == "compact.before_manifest":
            raise _Stop()

    store.create_session("o")
    fill(store, "o", 4)
    expected = view(store, "o")
    with pytest.raises(_Stop):
        compactor_for(store, clock, fault_hook=die_before_manifest).compact_session("o")
    (orphan,) = base_keys(store, "o")
    c = compactor_for(store, clock)
    clock.advance(GRACE_MS - 1)
    assert c.gc_session("o").deleted == ()
    clock.advance(1)
    assert c.gc_session("o").deleted == (("orphan_base", orphan),)
    assert view(store, "o") == expected
    # With a manifest in place, an orphan next to the live base goes the same way.
    with pytest.raises(_Stop):
        compactor_for(store, clock, fault_hook=die_before_manifest).compact_session("o")
    c.compact_session("o")
    assert len(base_keys(store, "o")) == 2
    clock.advance(GRACE_MS)
    assert c.gc_session("o").count("orphan_base") == 1
    assert keys_of(store, "o") == reachable(store, "o")
    assert view(store, "o") == expected


def test_gc_removes_other_incarnations_and_headerless_leftovers_after_the_grace(
    store: SessionStore,
) -> None:
    store.create_session("inc")
    fill(store, "inc", 2)
    # After the header exists: its creation time (the real clock) is then never later than
    # the fake clock's start, whatever the machine's load.
    clock = FakeClock()
    c = compactor_for(store, clock)
    expected = view(store, "inc")
    # Leftovers of an earlier life of "inc" (an interrupted delete, a writer with a stale
    # header), and of a session whose header is gone.
    old = uuid.uuid4().hex
    stale = [store.layout.segment("inc", old, n) for n in (1, 2)] + [store.layout.manifest("inc", old, 1)]
    ghost = [store.layout.segment("ghost", old, n) for n in (1, 2, 3)]
    for key in stale + ghost:
        store.objects.put_if_absent(key, b'{"id":"x"}\n')

    first = c.gc()
    assert (first.deleted, first.sessions) == ((), 2)
    redis = store.coord.client
    assert redis.hget(store.coord.keys.gc_seen, f"ghost/{old}") is not None
    clock.advance(GRACE_MS)
    second = c.gc()
    assert sorted(second.deleted_keys) == sorted(stale + ghost)
    assert {k for k, _ in second.deleted} == {"stale_incarnation"}
    assert keys_of(store, "inc") == reachable(store, "inc")
    assert keys_of(store, "ghost") == set()
    assert redis.hlen(store.coord.keys.gc_seen) == 0
    assert view(store, "inc") == expected


# --- redaction purge -------------------------------------------------------------------------


def _bucket_contains(s3_location: Any, needle: bytes) -> list[str]:
    client = s3_location.client()
    hits = []
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=s3_location.bucket, Prefix=s3_location.key_prefix
    ):
        for item in page.get("Contents", []):
            body = client.get_object(Bucket=s3_location.bucket, Key=item["Key"])["Body"].read()
            if needle in body or needle in item["Key"].encode():
                hits.append(item["Key"])
    return hits


def _redis_values(client: Any) -> Iterator[bytes]:
    """Every key and every value in the database, by type (no DUMP: it may compress)."""
    for key in client.scan_iter(count=1000):
        yield key
        kind = client.type(key)
        if kind == b"string":
            yield client.get(key) or b""
        elif kind == b"hash":
            for field, value in client.hgetall(key).items():
                yield field
                yield value
        elif kind == b"list":
            yield from client.lrange(key, 0, -1)
        elif kind == b"set":
            yield from client.smembers(key)
        elif kind == b"zset":
            yield from (m for m, _ in client.zrange(key, 0, -1, withscores=True))
        elif kind == b"stream":
            for _id, fields in client.xrange(key):
                for field, value in fields.items():
                    yield field
                    yield value
        else:
            raise AssertionError(f"unexpected Redis type {kind!r} of {key!r}")


def test_a_redacted_canary_is_gone_from_every_object_and_redis_value(
    make_store: Callable[..., SessionStore], s3_location: Any
) -> None:
    canary = b"CANARY-" + uuid.uuid4().hex.encode()
    store = make_store(compact_after_segments=3)
    clock = FakeClock()
    store.create_session("cv")
    store.append_session_entries("cv", [entry("root", None)])
    store.append_session_entries("cv", [entry("secret", "root", f"my card is {canary.decode()}")])
    store.append_session_entries("cv", [entry("later", "secret")])
    worker = Worker(compactor_for(store, clock), WorkerOptions(claim_idle_ms=0, gc_interval_ms=0))
    assert worker.run(burst=True) == 0  # gen 1: the canary now sits in a base as well
    assert worker.stats.jobs_done == 1
    store.append_session_entries("cv", [redaction("red", "later", "secret", "card number")])
    expected = model_view(store, "cv")
    compactor_for(store, clock).compact_session("cv")  # gen 2 rewrites the base
    # The scan sees it where it still is: its segment, and the base of generation 1.
    hits = _bucket_contains(s3_location, canary)
    assert len(hits) == 2 and any("/seg/" in k for k in hits) and any("/base/0000000000000001-" in k for k in hits)
    assert view(store, "cv")[2] == expected

    clock.advance(GRACE_MS)
    compactor_for(store, clock).gc()
    assert _bucket_contains(s3_location, canary) == []
    values = list(_redis_values(store.coord.client))
    assert any(b"cv" in v for v in values)  # the scan sees the session's keys...
    assert not any(canary in v for v in values)  # ...and no trace of the content
    assert view(store, "cv")[2] == expected
    assert expected[1] == {"type": "message", "id": "secret", "parentId": "root",
                           "timestamp": "2026-11-22T10:00:00.000Z",
                           "redacted": {"reason": "card number", "redactionId": "red"}}


# --- two workers, one session ----------------------------------------------------------------


def test_two_workers_race_for_one_manifest_and_readers_never_notice(
    make_store: Callable[..., SessionStore],
) -> None:
    store = make_store()
    clock = FakeClock()
    store.create_session("race")
    fill(store, "race", 8, per_segment=4)
    expected = view(store, "race")
    both_ready = threading.Barrier(2, timeout=60)
    reads = threading.Condition()
    count = {"reads": 0}
    seen: list[Any] = []
    done = threading.Event()
    reader_ready = threading.Event()

    def await_a_read() -> None:
        with reads:
            target = count["reads"] + 1
            assert reads.wait_for(lambda: count["reads"] >= target, timeout=60)

    def meet(point: str, ctx: dict[str, Any]) -> None:
        if point == "compact.before_manifest":
            both_ready.wait()  # both have written their bases; both now create manifest 1
            await_a_read()  # a reader reads while two unreferenced bases exist
        elif point == "compact.after_manifest":
            await_a_read()  # and right after the winner's manifest appears

    def read_loop() -> None:
        reader = make_store()
        reader_ready.set()
        while not done.is_set():
            got = view(reader, "race")
            with reads:
                seen.append(got)
                count["reads"] += 1
                reads.notify_all()

    workers = [compactor_for(make_store(), clock, fault_hook=meet) for _ in range(2)]
    results: list[Any] = [None, None]

    def run(i: int) -> None:
        results[i] = workers[i].compact_session("race")

    reader = threading.Thread(target=read_loop)
    reader.start()
    assert reader_ready.wait(60)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    done.set()
    reader.join(60)

    assert sorted(r.outcome for r in results) == ["compacted", "lost"]
    winner = next(r for r in results if r.outcome == "compacted")
    loser = next(r for r in results if r.outcome == "lost")
    assert winner.generation == loser.generation == 1
    inc = store.get_header("race").incarnation
    manifests = {i.key for i in store.objects.list(store.layout.manifest_prefix("race", inc))}
    assert manifests == {store.layout.manifest("race", inc, 1)}
    assert base_keys(store, "race") == set(winner.base_keys)
    raw = orjson.loads(store.objects.get(store.layout.manifest("race", inc, 1)).data)
    assert raw["compaction"]["worker"] in {w.worker for w in workers}
    assert len(seen) >= 3 and all(v == expected for v in seen)
    assert view(store, "race") == expected


# --- the job queue and the worker ------------------------------------------------------------


def _stream_len(store: SessionStore) -> int:
    return int(store.coord.client.xlen(store.coord.keys.jobs))


def test_worker_takes_queued_jobs_and_a_job_can_be_queued_while_compacting(
    make_store: Callable[..., SessionStore],
) -> None:
    store = make_store(compact_after_segments=4)
    writer = make_store(compact_after_segments=4)
    clock = FakeClock()
    for sid in ("w1", "w2"):
        store.create_session(sid)
        fill(store, sid, 10)
    assert _stream_len(store) == 2  # one job per session, however many appends passed the mark
    observed: dict[str, Any] = {}

    def during(point: str, ctx: dict[str, Any]) -> None:
        if point == "compact.after_scan" and ctx["session_id"] == "w1" and "heartbeat" not in observed:
            workers = JobQueue(store.coord, group="compactors", consumer="x").workers()
            observed["heartbeat"] = workers
            # The marker was cleared when the job was taken: these appends queue a new job.
            fill(writer, "w1", 5, tag="late")
            observed["queued"] = _stream_len(store)

    worker = Worker(compactor_for(store, clock, fault_hook=during),
                    WorkerOptions(claim_idle_ms=0, gc_interval_ms=0))
    assert worker.run(burst=True) == 0
    assert worker.name in observed["heartbeat"]
    assert observed["heartbeat"][worker.name]["last_seen_ms"] > 0
    assert observed["queued"] == 3  # w1's job (until acknowledged), w2's, and the new w1 job
    s = worker.stats
    assert (s.jobs_done, s.jobs_failed, s.jobs_parked) == (3, 0, 0)
    assert s.segments_merged == 25 and s.bytes_in > 0 and s.lag_ms_max >= s.lag_ms_last >= 0
    assert _stream_len(store) == 0 and worker.queue.pending() == 0
    assert worker.name not in worker.queue.workers()  # heartbeat removed on exit
    for sid, total in (("w1", 15), ("w2", 10)):
        inc = store.get_header(sid).incarnation
        manifest = store.latest_manifest(sid, inc)
        assert manifest is not None and manifest.through_seq == total
        # The trigger's counters were told what was merged.
        assert store.coord.client.hget(store.coord.keys.tail(sid), "pseg") == b"0"
        assert not store.coord.client.exists(store.coord.keys.job_pending(sid))


def test_a_poison_segment_is_parked_and_the_worker_serves_other_sessions(
    make_store: Callable[..., SessionStore],
) -> None:
    store = make_store()
    clock = FakeClock()
    store.create_session("poison")
    fill(store, "poison", 3)
    inc = store.get_header("poison").incarnation
    store.objects.put_if_absent(store.layout.segment("poison", inc, 4), b'{"id": "p4", "type": oops\n')
    store.create_session("healthy")
    fill(store, "healthy", 3)
    store.coord.enqueue_compaction("poison", reason="test")
    store.coord.enqueue_compaction("healthy", reason="test")

    worker = Worker(compactor_for(store, clock),
                    WorkerOptions(claim_idle_ms=0, max_deliveries=3, gc_interval_ms=0))
    assert worker.run(burst=True) == 0

    parked = worker.queue.parked()
    assert set(parked) == {"poison"}
    assert parked["poison"].error_type == "CorruptObjectError"
    assert "seg/0000000000000004.jsonl" in parked["poison"].error
    assert parked["poison"].deliveries == 3 and parked["poison"].worker == worker.name
    s = worker.stats
    assert (s.jobs_failed, s.jobs_parked, s.jobs_done) == (3, 1, 1)
    assert store.latest_manifest("poison", inc) is None
    assert store.latest_manifest("healthy", store.get_header("healthy").incarnation) is not None
    assert _stream_len(store) == 0 and worker.queue.pending() == 0
    with pytest.raises(CorruptObjectError):
        compactor_for(store, clock).compact_session("poison")


def test_a_job_delivered_too_often_without_finishing_is_parked(
    make_store: Callable[..., SessionStore],
) -> None:
    """A job whose workers die on it never fails visibly: its delivery count parks it."""
    store = make_store()
    clock = FakeClock()
    store.create_session("deadly")
    fill(store, "deadly", 2)
    store.coord.enqueue_compaction("deadly", reason="test")
    queue = JobQueue(store.coord, group="compactors", consumer="dies-every-time")
    queue.ensure_group()
    assert len(queue.read_new(1, None)) == 1
    for _ in range(2):  # two more deliveries that never finish
        assert len(queue.claim_stale(0, 1)) == 1
    worker = Worker(compactor_for(store, clock), WorkerOptions(claim_idle_ms=0, max_deliveries=3))
    assert worker.run(burst=True) == 0
    parked = worker.queue.parked()["deadly"]
    assert (parked.error_type, parked.deliveries) == ("TooManyDeliveries", 4)
    assert store.latest_manifest("deadly", store.get_header("deadly").incarnation) is None


def test_first_sigterm_finishes_the_job_second_abandons_it(
    make_store: Callable[..., SessionStore],
) -> None:
    store = make_store()
    clock = FakeClock()
    for sid in ("s1", "s2"):
        store.create_session(sid)
        fill(store, sid, 3)
        store.coord.enqueue_compaction(sid, reason="test")
    signals_to_send = {"n": 1}

    def signal_self(point: str, ctx: dict[str, Any]) -> None:
        if point == "compact.after_scan":
            for _ in range(signals_to_send["n"]):
                os.kill(os.getpid(), signal.SIGTERM)

    # Warm: the job in progress completes, the next one is not taken.
    warm = Worker(compactor_for(store, clock, fault_hook=signal_self), WorkerOptions(gc_interval_ms=0))
    assert warm.run(burst=False) == 0
    assert warm.stats.jobs_done == 1
    assert store.latest_manifest("s1", store.get_header("s1").incarnation) is not None
    assert warm.queue.pending() == 0 and _stream_len(store) == 1

    # Cold: the second SIGTERM abandons s2's job mid-compaction; it stays pending.
    signals_to_send["n"] = 2
    cold = Worker(compactor_for(store, clock, fault_hook=signal_self), WorkerOptions(gc_interval_ms=0))
    assert cold.run(burst=False) == 1
    assert cold.stats.jobs_done == 0
    inc2 = store.get_header("s2").incarnation
    assert store.latest_manifest("s2", inc2) is None
    assert cold.queue.pending() == 1
    assert cold.name not in cold.queue.workers()
    assert signal.getsignal(signal.SIGTERM) is not cold._on_signal  # handlers restored

    # Another worker takes the abandoned job over.
    rescue = Worker(compactor_for(store, clock), WorkerOptions(claim_idle_ms=0, gc_interval_ms=0))
    assert rescue.run(burst=True) == 0
    assert store.latest_manifest("s2", inc2) is not None
    assert rescue.queue.pending() == 0 and _stream_len(store) == 0


def _wait_for(condition: Callable[[], bool], what: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def test_worker_survives_a_redis_flush_that_takes_its_group(
    make_store: Callable[..., SessionStore],
) -> None:
    store = make_store(compact_after_segments=3)
    clock = FakeClock()
    store.create_session("fl")
    worker = Worker(compactor_for(store, clock), WorkerOptions(block_ms=100, gc_interval_ms=0))
    thread = threading.Thread(target=worker.run)  # not the main thread: no signal handlers
    thread.start()
    try:
        inc = store.get_header("fl").incarnation
        fill(store, "fl", 3, tag="a")
        _wait_for(lambda: store.latest_manifest("fl", inc) is not None, "the first compaction")
        store.coord.client.flushall()  # the stream, the group, the tail: all gone
        fill(store, "fl", 3, tag="b")  # rebuilt from the object store; queues a job again
        _wait_for(lambda: getattr(store.latest_manifest("fl", inc), "through_seq", 0) == 6,
                  "a compaction after the flush")
    finally:
        worker.request_stop()
        thread.join(30)
    assert not thread.is_alive()
    assert worker.stats.jobs_done == 2 and worker.stats.jobs_failed == 0


# --- crashes at every step -------------------------------------------------------------------


def _doomed(objects_url: str, redis_url: str, prefix: str, point: str, now_ms: int, sid: str) -> None:
    """Runs in a child process: dies by SIGKILL the moment it reaches ``point``."""

    def hook(p: str, ctx: dict[str, Any]) -> None:
        if p == point:
            os.kill(os.getpid(), signal.SIGKILL)

    store = SessionStore.from_url(objects_url, redis_url, redis_prefix=prefix)
    c = Compactor(store, CompactorOptions(grace_ms=GRACE_MS, worker="doomed"),
                  now=lambda: now_ms, fault_hook=hook)
    if point.startswith("gc."):
        c.gc_session(sid)
    else:
        Worker(c, WorkerOptions(gc_interval_ms=0)).run(burst=True)
    raise SystemExit(3)  # not reached when the hook fires


def _run_doomed(s3_url: str, redis_url: str, prefix: str, point: str, now_ms: int, sid: str) -> None:
    proc = mp.get_context("spawn").Process(
        target=_doomed, args=(s3_url, redis_url, prefix, point, now_ms, sid)
    )
    proc.start()
    proc.join(120)
    assert proc.exitcode == -signal.SIGKILL


def test_worker_killed_after_writing_its_base(
    s3_url: str, redis_url: str, redis_prefix: str, make_store: Callable[..., SessionStore]
) -> None:
    store = make_store()
    clock = FakeClock()
    store.create_session("kb")
    fill(store, "kb", 10, per_segment=2)
    store.coord.enqueue_compaction("kb", reason="test")
    expected = view(store, "kb")

    _run_doomed(s3_url, redis_url, redis_prefix, "compact.after_base", clock(), "kb")

    inc = store.get_header("kb").incarnation
    (orphan,) = base_keys(store, "kb")
    assert store.latest_manifest("kb", inc) is None
    assert view(store, "kb") == expected
    worker = Worker(compactor_for(store, clock), WorkerOptions(claim_idle_ms=0, gc_interval_ms=0))
    assert worker.run(burst=True) == 0
    assert worker.stats.jobs_done == 1 and worker.queue.pending() == 0
    assert store.latest_manifest("kb", inc) is not None
    assert view(store, "kb") == expected
    assert orphan in keys_of(store, "kb")  # within its grace period
    clock.advance(GRACE_MS)
    result = compactor_for(store, clock).gc_session("kb")
    assert ("orphan_base", orphan) in result.deleted
    assert keys_of(store, "kb") == reachable(store, "kb")
    assert view(store, "kb") == expected


def test_worker_killed_after_creating_the_manifest_before_acknowledging(
    s3_url: str, redis_url: str, redis_prefix: str, make_store: Callable[..., SessionStore]
) -> None:
    store = make_store()
    clock = FakeClock()
    store.create_session("km")
    fill(store, "km", 10, per_segment=2)
    store.coord.enqueue_compaction("km", reason="test")
    expected = view(store, "km")

    _run_doomed(s3_url, redis_url, redis_prefix, "compact.after_manifest", clock(), "km")

    inc = store.get_header("km").incarnation
    manifest = store.latest_manifest("km", inc)
    assert manifest is not None and manifest.generation == 1
    assert view(store, "km") == expected
    worker = Worker(compactor_for(store, clock), WorkerOptions(claim_idle_ms=0, gc_interval_ms=0))
    assert worker.queue.pending() == 1  # the dead worker never acknowledged
    assert worker.run(burst=True) == 0
    assert (worker.stats.jobs_done, worker.stats.jobs_empty) == (1, 1)  # nothing left to merge
    assert worker.queue.pending() == 0 and _stream_len(store) == 0
    latest = store.latest_manifest("km", inc)
    assert latest is not None and latest.generation == 1
    clock.advance(GRACE_MS)
    compactor_for(store, clock).gc_session("km")
    assert keys_of(store, "km") == reachable(store, "km")
    assert view(store, "km") == expected


def test_gc_killed_midway_and_another_pass_finishes(
    s3_url: str, redis_url: str, redis_prefix: str, make_store: Callable[..., SessionStore]
) -> None:
    store = make_store()
    clock = FakeClock()
    c = compactor_for(store, clock)
    store.create_session("kg")
    fill(store, "kg", 6, tag="a")
    c.compact_session("kg")
    fill(store, "kg", 4, tag="b")
    c.compact_session("kg")
    fill(store, "kg", 2, tag="c")
    expected = view(store, "kg")
    clock.advance(GRACE_MS)
    inc = store.get_header("kg").incarnation
    before = keys_of(store, "kg")

    _run_doomed(s3_url, redis_url, redis_prefix, "gc.after_delete", clock(), "kg")

    after_crash = keys_of(store, "kg")
    assert after_crash < before  # the segments went before the process died...
    assert store.layout.manifest("kg", inc, 1) in after_crash  # ...the old manifest did not
    assert after_crash != reachable(store, "kg")
    assert view(store, "kg") == expected
    c.gc_session("kg")
    assert keys_of(store, "kg") == reachable(store, "kg")
    assert view(store, "kg") == expected


# --- the command line ------------------------------------------------------------------------


def test_command_line_compact_history_gc(s3_url: str, redis_url: str, redis_prefix: str,
                                         store: SessionStore) -> None:
    store.create_session("cli")
    fill(store, "cli", 5)
    expected = view(store, "cli")
    base = [sys.executable, "-m", "compactor"]
    conn = ["--objects", s3_url, "--redis", redis_url, "--redis-prefix", redis_prefix]

    def run(*args: str) -> Any:
        proc = subprocess.run([*base, *args, *conn], capture_output=True, timeout=120,
                              cwd=Path(__file__).resolve().parent.parent)
        assert proc.returncode == 0, proc.stderr.decode()
        return orjson.loads(proc.stdout)

    (compacted,) = run("compact", "cli", "--name", "cli-worker", "--grace", "0")
    assert (compacted["outcome"], compacted["segments_merged"]) == ("compacted", [1, 5])
    (record,) = run("history", "cli")
    assert (record["generation"], record["worker"]) == (1, "cli-worker")
    (gc,) = run("gc", "--grace", "0")
    assert gc["deleted"] == 5 and gc["errors"] == []
    assert keys_of(store, "cli") == reachable(store, "cli")
    assert view(store, "cli") == expected


# --- Redis Cluster ---------------------------------------------------------------------------


def test_worker_on_redis_cluster(cluster_url: str, s3_url: str) -> None:
    """Every queue command touches one key (or one key's slot): a cluster refuses anything
    else with CROSSSLOT. Jobs, a park, GC marks and the heartbeat all run here."""
    store = SessionStore.from_url(s3_url, cluster_url, compact_after_segments=3)
    clock = FakeClock()
    try:
        sessions = [f"k{i}" for i in range(4)]  # spread over the slots of the nodes
        for sid in sessions:
            store.create_session(sid)
            fill(store, sid, 4)  # past the threshold: each session has its job queued
        inc = store.get_header("k0").incarnation
        store.objects.put_if_absent(store.layout.segment("k0", inc, 5), b"not json\n")
        store.objects.put_if_absent(store.layout.segment("ghost", uuid.uuid4().hex, 1), b'{"id":"x"}\n')
        worker = Worker(compactor_for(store, clock),
                        WorkerOptions(claim_idle_ms=0, max_deliveries=2, gc_interval_ms=0))
        assert worker.run(burst=True) == 0
        assert set(worker.queue.parked()) == {"k0"}
        assert worker.stats.jobs_done == 3
        for sid in sessions[1:]:
            assert store.latest_manifest(sid, store.get_header(sid).incarnation) is not None
        assert compactor_for(store, clock).gc().sessions == 5  # marks the headerless one
        # The GC schedule (buckets in slots of their own) and the sweep's lease.
        from compactor.schedule import GcScheduler

        gc = GcScheduler(compactor_for(store, clock), WorkerOptions(sweep_rate=0.0))
        clock.advance(GRACE_MS)
        collected = gc.collect_due()
        assert collected.sessions == 3 and collected.count("segment") == 12
        assert all(store.coord.gc_scheduled(sid) == (None, None) for sid in sessions)
        swept = gc.sweep()
        assert swept is not None and swept.sessions == 5
    finally:
        store.close()
