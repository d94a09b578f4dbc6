"""The resume path's requests, counted: Redis names the newest manifest and keeps the live tail.

A resume of a compacted session makes the floor's request (the base) plus the probe of the
slot after the tail; a resume of an uncompacted tail reads it from Redis's recent-segments
cache in the round trip that reads the tail. Both are hints: every test here also breaks the
hint (a corrupted or foreign cache value, a cache of another life, a flushed Redis) and checks
that the session still reads whole, from the object store.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
from harness.pausing import FakeClock

from compactor import Compactor, CompactorOptions
from store import SessionStore

GRACE_MS = 60_000


def entry(eid: str, parent: str | None, size: int = 40) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent,
            "timestamp": "2026-11-24T10:00:00.000Z",
            "message": {"role": "user", "content": "x" * size}}


def fill(store: SessionStore, sid: str, segments: int, *, first: int = 0, size: int = 40) -> list[str]:
    parent = store.get_tail(sid).last_entry_id or None
    ids = []
    for s in range(first, first + segments):
        eid = f"e{s}"
        store.append_session_entries(sid, [entry(eid, parent, size)])
        ids.append(eid)
        parent = eid
    return ids


def compactor_for(store: SessionStore, clock: FakeClock) -> Compactor:
    return Compactor(store, CompactorOptions(grace_ms=GRACE_MS, worker="t"), now=clock)


def counted_resume(reader: SessionStore, sid: str) -> tuple[list[str], dict[str, int]]:
    reader.objects.requests.clear()
    ids = [str(e["id"]) for e in reader.load_session_entries(sid)]
    return ids, {k: reader.objects.requests[k] for k in ("get", "list", "head")}


@pytest.mark.every_backend
def test_an_uncompacted_tail_resumes_from_the_cache_in_one_round(
    make_store: Callable[..., SessionStore],
) -> None:
    writer = make_store()
    writer.create_session("t")
    ids = fill(writer, "t", 64)
    reader = make_store()
    got, first = counted_resume(reader, "t")
    assert got == ids
    # The header (first read in this process), the probe past the tail; no segment GET.
    assert first == {"get": 2, "list": 0, "head": 0}
    got, warm = counted_resume(reader, "t")
    assert got == ids and warm == {"get": 1, "list": 0, "head": 0}


@pytest.mark.every_backend
def test_a_cached_segment_that_does_not_match_its_digest_is_read_from_the_object_store(
    make_store: Callable[..., SessionStore],
) -> None:
    writer = make_store()
    writer.create_session("c")
    ids = fill(writer, "c", 8)
    coord = writer.coord
    key = coord.keys.recent("c")
    value = coord.client.hget(key, "3")
    assert value is not None and value.endswith(b"\n")
    # Same length, other content: valid JSON that a reader trusting the cache would return.
    coord.client.hset(key, "3", value.replace(b'"e2"', b'"zz"'))
    other_life = value.replace(writer.get_header("c").incarnation.encode(), b"0" * 32)
    coord.client.hset(key, "5", other_life.replace(b'"e4"', b'"yy"'))
    reader = make_store()
    got, counts = counted_resume(reader, "c")
    assert got == ids
    assert counts["get"] == 1 + 1 + 2  # header, probe, and the two refused cache values


@pytest.mark.every_backend
def test_the_cache_is_bounded_and_trimmed_by_compaction(
    make_store: Callable[..., SessionStore],
) -> None:
    writer = make_store(recent_cache_bytes=8 * 1024)
    writer.create_session("b")
    ids = fill(writer, "b", 30, size=400)  # about 550 bytes a segment
    cached = {int(k) for k in writer.coord.client.hkeys(writer.coord.keys.recent("b"))}
    # Cached while at most 8 KiB are pending compaction: the first segments only.
    assert cached and min(cached) == 1 and max(cached) < 30
    values = writer.coord.client.hvals(writer.coord.keys.recent("b"))
    assert sum(len(v.partition(b"\n")[2]) for v in values) <= 8 * 1024  # the segments' bytes
    reader = make_store()
    got, counts = counted_resume(reader, "b")
    assert got == ids
    assert counts["get"] == 1 + 1 + (30 - len(cached))  # header, probe, the uncached ones

    clock = FakeClock()
    assert compactor_for(writer, clock).compact_session("b").outcome == "compacted"
    # The manifest retired every cached slot: nothing of them is kept.
    assert writer.coord.client.hlen(writer.coord.keys.recent("b")) == 0
    more = fill(writer, "b", 3, first=30, size=400)
    cached = sorted(int(k) for k in writer.coord.client.hkeys(writer.coord.keys.recent("b")))
    assert cached == [31, 32, 33]
    got, counts = counted_resume(reader, "b")
    assert got == ids + more
    # The manifest (new to this process), its base, the probe: the tail from the cache.
    assert counts == {"get": 3, "list": 0, "head": 0}


def test_a_delete_drops_the_cache_and_a_new_life_never_reads_the_old_one(
    make_store: Callable[..., SessionStore],
) -> None:
    writer = make_store()
    writer.create_session("d")
    fill(writer, "d", 4)
    old = dict(writer.coord.client.hgetall(writer.coord.keys.recent("d")))
    writer.delete_session("d")
    assert writer.coord.client.exists(writer.coord.keys.recent("d")) == 0
    writer.create_session("d")
    new_ids = fill(writer, "d", 2, first=100)
    # The old life's values put back (a Redis that lost the delete, say): never used.
    writer.coord.client.hset(writer.coord.keys.recent("d"), mapping={b"3": old[b"3"], b"4": old[b"4"]})
    writer.append_session_entries("d", [entry("e102", "e101")])
    assert [str(e["id"]) for e in make_store().load_session_entries("d")] == new_ids + ["e102"]


@pytest.mark.every_backend
@pytest.mark.parametrize("redis_state", ["flushed", "cache evicted"])
def test_without_the_hints_a_resume_reads_the_object_store(
    make_store: Callable[..., SessionStore], redis_state: str
) -> None:
    writer = make_store()
    writer.create_session("f")
    ids = fill(writer, "f", 10)
    clock = FakeClock()
    compactor_for(writer, clock).compact_session("f")
    ids += fill(writer, "f", 5, first=10)
    if redis_state == "flushed":
        writer.coord.client.flushall()
    else:
        writer.coord.client.delete(writer.coord.keys.recent("f"))
    reader = make_store()
    got, counts = counted_resume(reader, "f")
    assert got == ids
    if redis_state == "flushed":
        # LIST + GET of the manifest, LIST of the segments after it, base, 5 segments, probe,
        # header, LIST after the probe's 404.
        # (4 on SeaweedFS: a process's first listing there also learns its listing order.)
        assert counts["get"] == 1 + 1 + 1 + 5 + 1 and counts["list"] >= 3
    else:
        # Redis names the manifest; the segments come from the object store.
        assert counts == {"get": 1 + 1 + 1 + 5 + 1, "list": 0, "head": 0}


@pytest.mark.every_backend
def test_recent_cache_off(make_store: Callable[..., SessionStore]) -> None:
    writer = make_store(recent_cache_bytes=0)
    writer.create_session("o")
    ids = fill(writer, "o", 6)
    assert writer.coord.client.exists(writer.coord.keys.recent("o")) == 0
    got, counts = counted_resume(make_store(recent_cache_bytes=0), "o")
    assert got == ids and counts == {"get": 1 + 6 + 1, "list": 0, "head": 0}


@pytest.mark.every_backend
def test_beside_a_large_base_the_probe_waits_for_its_bytes_and_the_base_is_verified(
    make_store: Callable[..., SessionStore], s3_location: Any
) -> None:
    """Beside 4 MiB of bases and more, the probe goes out once their bytes are here (the same
    requests as always), the digest is computed beside the parse, and an altered base is
    refused all the same."""
    from store.errors import CorruptObjectError
    from store.protocol.read import _PROBE_AFTER_BYTES

    writer = make_store()
    writer.create_session("L")
    parent = None
    ids = []
    for s in range(60):
        batch = [entry(f"L{s}-{k}", parent if k == 0 else f"L{s}-{k - 1}", 9_000) for k in range(10)]
        writer.append_session_entries("L", batch)
        parent = batch[-1]["id"]
        ids.extend(e["id"] for e in batch)
    clock = FakeClock()
    compactor_for(writer, clock).compact_session("L")
    inc = writer.get_header("L").incarnation
    manifest = writer.latest_manifest("L", inc)
    assert manifest is not None and len(manifest.bases) == 1
    base = manifest.bases[0]
    assert base["bytes"] >= _PROBE_AFTER_BYTES
    reader = make_store()
    got, counts = counted_resume(reader, "L")
    assert got == ids
    assert counts == {"get": 1 + 1 + 1 + 1, "list": 0, "head": 0}  # header, manifest, base, probe

    # The base altered behind the store's back (a plain PUT, same length): refused.
    client = s3_location.client()
    data = client.get_object(Bucket=s3_location.bucket, Key=base["key"])["Body"].read()
    altered = data.replace(b'"L30-5"', b'"L30-X"', 1)
    assert len(altered) == len(data) and altered != data
    client.put_object(Bucket=s3_location.bucket, Key=base["key"], Body=altered)
    with pytest.raises(CorruptObjectError, match="checksum mismatch"):
        make_store().load_session_entries("L")


@pytest.mark.parametrize("big", [False, True], ids=["small", "hashed-beside"])
def test_an_id_that_appears_twice_is_refused_even_when_every_object_verifies(
    make_store: Callable[..., SessionStore], big: bool,
) -> None:
    """The decoders gather the ids while they parse (store/formats/entries.py, ``EntryIds``); a
    duplicate across objects, each with a valid digest, still fails the read."""
    import hashlib

    import orjson

    from store.errors import CorruptObjectError
    from store.formats.segments import segment_metadata

    writer = make_store()
    writer.create_session("d")
    fill(writer, "d", 3, size=1_100_000 if big else 40)  # 3 segments: e0 e1 e2
    inc = writer.get_header("d").incarnation
    # Segment 4, past the tail Redis knows (a writer that died before telling it): the probe
    # reads it. Its one entry repeats e0's id.
    body = orjson.dumps(entry("e0", "e2")) + b"\n"
    writer.objects.put_if_absent(
        writer.layout.segment("d", inc, 4), body,
        segment_metadata("n", hashlib.sha256(body).hexdigest(), 1),
    )
    with pytest.raises(CorruptObjectError, match="'e0' appears twice"):
        make_store().load_session_entries("d")
