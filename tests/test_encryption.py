"""Encryption at rest (issue #15, docs/encryption.md), on the real servers: moto's S3 (and KMS)
over HTTP and a real redis-server.

- No plaintext canary in any object (raw GETs of every key, and their metadata) or any Redis
  value (type-appropriate reads of every key), after appends, a fork, a stream, compaction,
  GC, a redaction and a rebuild of Redis's state; the same scan finds it without encryption.
- Reads and compaction round-trip; KEK rotation; DEK rotation (new segments, then bases);
  a writer paused across a DEK rotation; wrong, missing or shredded keys are typed errors.
- The KMS provider against moto's KMS.
"""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest
import redis

from compactor import Compactor, CompactorOptions
from harness.pausing import FakeClock, InThread, Pause
from store import SessionStore
from store.cli.verify import verify_session
from store.formats.crypto import (
    MAGIC,
    AwsKmsProvider,
    LocalKeyFile,
    create_keyring,
    is_sealed,
    key_provider_from_url,
    rotate_keyring,
    sealed_version,
)
from store.errors import (
    CorruptObjectError,
    DecryptionError,
    EncryptionError,
    InvalidInputError,
    KeyUnavailableError,
)
from store.streams import START, Streams

pytestmark = pytest.mark.s3_backends("moto", reason="KMS is moto's; the object scan reads the test bucket")

GRACE_MS = 60_000


def canary() -> str:
    return f"CANARY{uuid.uuid4().hex}"


def msg(eid: str, parent: str | None, text: str) -> dict[str, Any]:
    return {
        "type": "message", "id": eid, "parentId": parent, "timestamp": "2026-01-01T00:00:00.000Z",
        "message": {"role": "user", "content": text},
    }


def name_entry(eid: str, parent: str | None, name: str) -> dict[str, Any]:
    return {"type": "session_info", "id": eid, "parentId": parent,
            "timestamp": "2026-01-01T00:00:00.000Z", "name": name}


@pytest.fixture
def keyring(tmp_path: Path) -> Path:
    path = tmp_path / "keyring.json"
    create_keyring(path)
    return path


@pytest.fixture
def enc_store(make_store: Callable[..., SessionStore], keyring: Path) -> SessionStore:
    return make_store(key_provider=LocalKeyFile(keyring))


def fill(store: SessionStore, sid: str, n: int, text: str, tag: str = "e") -> list[str]:
    parent = store.get_tail(sid).last_entry_id or None
    ids = []
    for i in range(n):
        eid = f"{tag}{i}"
        store.append_session_entries(sid, [msg(eid, parent, f"{text} #{i}")])
        ids.append(eid)
        parent = eid
    return ids


def compactor_for(store: SessionStore, clock: FakeClock) -> Compactor:
    return Compactor(store, CompactorOptions(grace_ms=GRACE_MS, worker="t"), now=clock)


def bucket_objects(location: Any) -> dict[str, tuple[bytes, dict[str, str]]]:
    """Every object of the test's bucket, by raw GET: bytes and user metadata."""
    client = location.client()
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=location.bucket):
        for item in page.get("Contents", []):
            got = client.get_object(Bucket=location.bucket, Key=item["Key"])
            out[item["Key"]] = (got["Body"].read(), dict(got.get("Metadata") or {}))
    return out


def redis_values(url: str) -> list[bytes]:
    """Every key of the test's Redis database and everything it holds, read by type."""
    r = redis.Redis.from_url(url)
    out: list[bytes] = []
    try:
        for key in r.scan_iter(count=1000):
            out.append(key)
            kind = r.type(key)
            if kind == b"string":
                out.append(r.get(key) or b"")
            elif kind == b"hash":
                for f, v in r.hgetall(key).items():
                    out += [f, v]
            elif kind == b"list":
                out += r.lrange(key, 0, -1)
            elif kind == b"set":
                out += list(r.smembers(key))
            elif kind == b"zset":
                out += [m for m, _ in r.zrange(key, 0, -1, withscores=True)]
            elif kind == b"stream":
                for _, fields in r.xrange(key):
                    for f, v in fields.items():
                        out += [f, v]
            else:
                raise AssertionError(f"unexpected Redis type {kind!r} of {key!r}")
    finally:
        r.close()
    return out


def leaks(secret: str, location: Any, redis_url: str) -> list[str]:
    needle = secret.encode()
    found = []
    for key, (data, metadata) in bucket_objects(location).items():
        if needle in data or needle in json.dumps(metadata).encode() or needle in key.encode():
            found.append(f"object {key}")
    found += [f"redis value {v[:60]!r}" for v in redis_values(redis_url) if needle in v]
    return found


def exercise(store: SessionStore, secret: str, clock: FakeClock) -> tuple[str, str]:
    """Everything that writes content: appends (a name, a first user message), a fork and
    its own appends, a stream, a redaction, compaction and GC, a listing, and Redis rebuilt
    from the objects (its summaries too). Returns (session, fork)."""
    sid = store.create_session(cwd="/work").session_id
    store.append_session_entries(sid, [msg("first", None, f"hello {secret}")])
    store.append_session_entries(sid, [name_entry("nm", "first", f"name {secret}")])
    fill(store, sid, 6, f"body {secret}", tag="a")
    fork = store.branch_from_entry(sid, "a3").session_id
    fill(store, fork, 3, f"fork {secret}", tag="f")
    streams = Streams(store)
    streams.create("chat-1", content_type="application/json", msgs=[{"text": f"stream {secret}"}])
    streams.append("chat-1", [{"text": f"more {secret}"}], content_type="application/json")
    assert streams.read("chat-1", START).messages == [{"text": f"stream {secret}"}, {"text": f"more {secret}"}]
    compactor = compactor_for(store, clock)
    assert compactor.compact_session(sid).outcome == "compacted"
    fill(store, sid, 3, f"after {secret}", tag="b")
    store.redact(sid, "a1", "pii")
    assert compactor.compact_session(sid).outcome == "compacted"
    clock.advance(10 * GRACE_MS)
    compactor.gc()
    list(store.iter_sessions())
    return sid, fork


def test_no_plaintext_canary_in_any_object_or_redis_value(
    enc_store: SessionStore, s3_location: Any, redis_url: str
) -> None:
    secret = canary()
    clock = FakeClock()
    sid, fork = exercise(enc_store, secret, clock)
    # Redis rebuilt from the objects: summaries and caches come from reading the session.
    redis.Redis.from_url(redis_url).flushdb()
    assert any(secret in json.dumps(e) for e in enc_store.load_session_entries(sid))
    assert any(secret in json.dumps(e) for e in enc_store.load_session_entries(fork))
    list(enc_store.iter_sessions())
    enc_store.append_session_entries(sid, [msg("late", None, f"late {secret}")])
    assert leaks(secret, s3_location, redis_url) == []
    rows = {r.session_id: r for r in enc_store.iter_sessions()}
    assert rows[sid].name is None and rows[sid].first_message is None  # not kept in Redis
    assert rows[sid].cwd == "/work"  # header fields are not encrypted (docs/encryption.md)


def test_the_scan_finds_the_canary_without_encryption(
    make_store: Callable[..., SessionStore], s3_location: Any, redis_url: str
) -> None:
    secret = canary()
    exercise(make_store(), secret, FakeClock())
    found = leaks(secret, s3_location, redis_url)
    assert any(f.startswith("object ") for f in found)
    assert any(f.startswith("redis ") for f in found)


def test_reads_compaction_and_verify_round_trip(enc_store: SessionStore) -> None:
    sid = enc_store.create_session().session_id
    fill(enc_store, sid, 8, "text")
    before = enc_store.load_session_entries(sid)
    header = enc_store.get_header(sid)
    assert header.encryption == "aes-256-gcm/1"
    seg = enc_store.objects.get(enc_store.layout.segment(sid, header.incarnation, 1))
    assert seg.data.startswith(MAGIC) and b"text" not in seg.data
    assert enc_store.keys.versions(sid, header.incarnation) == [1]
    result = compactor_for(enc_store, FakeClock()).compact_session(sid)
    assert result.outcome == "compacted"
    for key in result.base_keys:
        assert is_sealed(enc_store.objects.get(key).data)
    assert enc_store.load_session_entries(sid) == before
    check = verify_session(enc_store, sid)
    assert check.ok, check.faults
    fill(enc_store, sid, 2, "more", tag="m")
    assert [e["id"] for e in enc_store.load_session_entries(sid)][-2:] == ["m0", "m1"]


def test_a_fresh_process_reads_it_resumes_and_follows(
    make_store: Callable[..., SessionStore], keyring: Path
) -> None:
    writer = make_store(key_provider=LocalKeyFile(keyring))
    sid = writer.create_session().session_id
    fill(writer, sid, 5, "x")
    reader = make_store(key_provider=LocalKeyFile(keyring))
    assert [e["id"] for e in reader.load_session_entries(sid)] == [f"e{i}" for i in range(5)]
    got = list(reader.follow(sid, after_seq=3, timeout_s=0.5))
    assert [e["id"] for _, e in got] == ["e3", "e4"]


def test_kek_rotation_new_wraps_use_the_new_kek_old_data_still_reads(
    make_store: Callable[..., SessionStore], keyring: Path
) -> None:
    store = make_store(key_provider=LocalKeyFile(keyring))
    old = store.create_session().session_id
    fill(store, old, 3, "old")
    first_kek = LocalKeyFile(keyring).newest_id
    new_kek = rotate_keyring(keyring)
    assert new_kek != first_kek
    # A process started after the rotation (and one that was running: it reloads the file
    # when it meets a KEK it has not seen; its own new wraps wait for its restart).
    after = make_store(key_provider=LocalKeyFile(keyring))
    new = after.create_session().session_id
    fill(after, new, 2, "new")

    def kek_of(s: SessionStore, sid: str, version: int = 1) -> str:
        inc = s.get_header(sid).incarnation
        return json.loads(s.objects.get(s.layout.key_record(sid, inc, version)).data)["kek_id"]

    assert kek_of(after, old) == first_kek
    assert kek_of(after, new) == new_kek
    assert [e["id"] for e in after.load_session_entries(old)] == ["e0", "e1", "e2"]
    assert [e["id"] for e in store.load_session_entries(new)] == ["e0", "e1"]
    # Moving an old session to the new KEK: a new data key, wrapped by it.
    assert after.rotate_data_key(old) == 2
    assert kek_of(after, old, 2) == new_kek
    fill(after, old, 1, "moved", tag="m")
    assert len(after.load_session_entries(old)) == 4


def test_dek_rotation_new_segments_then_bases_use_the_newest(enc_store: SessionStore) -> None:
    sid = enc_store.create_session().session_id
    fill(enc_store, sid, 2, "a", tag="a")
    inc = enc_store.get_header(sid).incarnation
    assert enc_store.rotate_data_key(sid) == 2
    fill(enc_store, sid, 2, "b", tag="b")

    def version(seq: int) -> int:
        key = enc_store.layout.segment(sid, inc, seq)
        return sealed_version(key, enc_store.objects.get(key).data)

    assert [version(s) for s in (1, 2, 3, 4)] == [1, 1, 2, 2]
    assert enc_store.rotate_data_key(sid) == 3
    result = compactor_for(enc_store, FakeClock()).compact_session(sid)
    for key in result.base_keys:
        assert sealed_version(key, enc_store.objects.get(key).data) == 3
    assert [e["id"] for e in enc_store.load_session_entries(sid)] == ["a0", "a1", "b0", "b1"]
    assert enc_store.keys.versions(sid, inc) == [1, 2, 3]


def test_another_process_picks_up_a_rotation_within_its_refresh(
    make_store: Callable[..., SessionStore], keyring: Path
) -> None:
    a = make_store(key_provider=LocalKeyFile(keyring))
    b = make_store(key_provider=LocalKeyFile(keyring), data_key_refresh_s=0)
    sid = a.create_session().session_id
    fill(b, sid, 1, "x", tag="x")
    a.rotate_data_key(sid)
    fill(b, sid, 1, "y", tag="y")
    inc = a.get_header(sid).incarnation
    key = a.layout.segment(sid, inc, 2)
    assert sealed_version(key, a.objects.get(key).data) == 2


def test_a_writer_paused_across_a_dek_rotation_writes_readable_data(
    make_store: Callable[..., SessionStore], keyring: Path
) -> None:
    pause = Pause("append.before_put")
    paused = make_store(key_provider=LocalKeyFile(keyring), fault_hook=pause)
    other = make_store(key_provider=LocalKeyFile(keyring))
    sid = other.create_session().session_id
    fill(other, sid, 1, "before", tag="p")
    paused.get_tail(sid)
    job = InThread(lambda: paused.append_session_entries(sid, [msg("slow", "p0", "slow")]))
    pause.wait_paused()
    assert other.rotate_data_key(sid) == 2
    other.append_session_entries(sid, [msg("fast", "p0", "fast")])
    pause.release()
    job.result()
    fresh = make_store(key_provider=LocalKeyFile(keyring))
    entries = {e["id"]: e for e in fresh.load_session_entries(sid)}
    assert set(entries) == {"p0", "slow", "fast"}
    inc = fresh.get_header(sid).incarnation
    versions = {
        sealed_version(i.key, fresh.objects.get(i.key).data)
        for i in fresh.objects.list(fresh.layout.segment_prefix(sid, inc))
    }
    assert versions == {1, 2}
    compactor_for(fresh, FakeClock()).compact_session(sid)
    assert set(e["id"] for e in fresh.load_session_entries(sid)) == {"p0", "slow", "fast"}


def test_wrong_or_missing_keys_are_typed_errors(
    make_store: Callable[..., SessionStore], keyring: Path, tmp_path: Path
) -> None:
    store = make_store(key_provider=LocalKeyFile(keyring))
    sid = store.create_session().session_id
    fill(store, sid, 2, "x")
    inc = store.get_header(sid).incarnation
    # No provider: reading and appending are refused, typed, and nothing is written.
    plain = make_store()
    with pytest.raises(KeyUnavailableError):
        plain.load_session_entries(sid)
    with pytest.raises(KeyUnavailableError):
        plain.append_session_entries(sid, [msg("z", "e1", "z")])
    assert [i.key for i in store.objects.list(store.layout.segment_prefix(sid, inc))][-1].endswith("2.jsonl")
    # Another keyring (the same KEK id with other key material: the wrong key file).
    other = tmp_path / "other.json"
    kid = LocalKeyFile(keyring).newest_id
    other.write_text(json.dumps({"keys": [{"id": kid, "key": base64.b64encode(b"\x01" * 32).decode()}]}))
    with pytest.raises(KeyUnavailableError):
        make_store(key_provider=LocalKeyFile(other)).load_session_entries(sid)
    # A keyring without the KEK at all.
    third = tmp_path / "third.json"
    create_keyring(third)
    with pytest.raises(KeyUnavailableError, match="not in the keyring"):
        make_store(key_provider=LocalKeyFile(third)).load_session_entries(sid)
    # A missing key file.
    with pytest.raises(KeyUnavailableError, match="not found"):
        LocalKeyFile(tmp_path / "nope.json")
    with pytest.raises(KeyUnavailableError):
        key_provider_from_url(f"file://{tmp_path}/nope.json")
    # A missing key record.
    store.objects.delete(store.layout.key_record(sid, inc, 1))
    with pytest.raises(KeyUnavailableError, match="does not exist"):
        make_store(key_provider=LocalKeyFile(keyring)).load_session_entries(sid)


def test_tampered_or_moved_ciphertext_is_refused(enc_store: SessionStore) -> None:
    a = enc_store.create_session().session_id
    b = enc_store.create_session().session_id
    fill(enc_store, a, 1, "secret a")
    fill(enc_store, b, 2, "secret b")
    inc_a, inc_b = (enc_store.get_header(s).incarnation for s in (a, b))
    seg_a = enc_store.objects.get(enc_store.layout.segment(a, inc_a, 1))
    # b's slot 2, replaced by a's segment 1 (same DEK version, another session).
    key_b2 = enc_store.layout.segment(b, inc_b, 2)
    enc_store.objects.delete(key_b2)
    enc_store.objects.put_if_absent(key_b2, seg_a.data, dict(seg_a.metadata))
    with pytest.raises(DecryptionError) as err:
        enc_store.keys.open(key_b2, seg_a.data)
    assert isinstance(err.value, CorruptObjectError) and isinstance(err.value, EncryptionError)
    # One flipped bit.
    key_a1 = seg_a.key
    flipped = bytearray(seg_a.data)
    flipped[-1] ^= 1
    with pytest.raises(DecryptionError):
        enc_store.keys.open(key_a1, bytes(flipped))
    enc_store.objects.delete(key_a1)
    enc_store.objects.put_if_absent(key_a1, bytes(flipped), dict(seg_a.metadata))
    enc_store.coord.forget(a, inc_a)  # no recent-segments cache: the object itself is read
    with pytest.raises(DecryptionError):
        enc_store.load_session_entries(a)


def test_a_plaintext_object_put_into_an_encrypted_session_is_refused(
    make_store: Callable[..., SessionStore], keyring: Path, redis_url: str
) -> None:
    """Someone with write access to the bucket puts a plaintext segment into an encrypted
    session, at the next slot (with metadata that checks out) or in place of a real one:
    every reader refuses it (``DecryptionError``), fresh or not, and so does the compactor,
    instead of reading it as the session's own. The same for a plaintext value planted in
    Redis's recent-segments cache."""
    from coordination.redis import recent_value
    from store.formats.entries import prepare_batch
    from store.formats.migrations import CURRENT_SCHEMA
    from store.formats.segments import segment_metadata

    store = make_store(key_provider=LocalKeyFile(keyring))
    sid = store.create_session().session_id
    fill(store, sid, 2, "sealed")
    inc = store.get_header(sid).incarnation
    planted = prepare_batch([msg("planted", "e1", "not from the store")])
    key = store.layout.segment(sid, inc, 3)
    store.objects.put_if_absent(key, planted.body, segment_metadata("x", planted.checksum, 1))
    fresh = make_store(key_provider=LocalKeyFile(keyring))
    for reader in (store, fresh):
        with pytest.raises(DecryptionError, match="plaintext object in an encrypted session"):
            reader.load_session_entries(sid)
    with pytest.raises(DecryptionError):
        Compactor(fresh, CompactorOptions(grace_ms=GRACE_MS, worker="t")).compact_session(sid)
    # In place of a real segment, and in the recent-segments cache.
    store.objects.delete(key)
    real = store.layout.segment(sid, inc, 2)
    store.objects.delete(real)
    store.objects.put_if_absent(real, planted.body, segment_metadata("x", planted.checksum, 1))
    store.coord.forget(sid, inc)
    with pytest.raises(DecryptionError):
        make_store(key_provider=LocalKeyFile(keyring)).load_session_entries(sid)
    other = store.create_session().session_id
    fill(store, other, 2, "sealed")
    other_inc = store.get_header(other).incarnation
    assert len(store.load_session_entries(other)) == 2
    client = redis.Redis.from_url(redis_url)
    cache = store.coord.keys.recent(other)
    assert client.hexists(cache, 2)  # the slot is read from the cache, not the object
    client.hset(cache, 2, recent_value(other_inc, planted.checksum, CURRENT_SCHEMA, planted.body))
    client.close()
    with pytest.raises(DecryptionError):
        store.load_session_entries(other)
    # A plaintext session is read as ever by a store that has met encrypted ones.
    plain = make_store().create_session().session_id
    store.append_session_entries(plain, [msg("p", None, "plain")])
    assert [e["id"] for e in store.load_session_entries(plain)] == ["p"]


def test_plaintext_sessions_from_before_stay_readable_and_plaintext(
    make_store: Callable[..., SessionStore], keyring: Path
) -> None:
    plain = make_store()
    old = plain.create_session().session_id
    plain.append_session_entries(old, [name_entry("n", None, "old name")])
    enc = make_store(key_provider=LocalKeyFile(keyring))
    enc.append_session_entries(old, [msg("m", "n", "later")])
    assert [e["id"] for e in enc.load_session_entries(old)] == ["n", "m"]
    inc = enc.get_header(old).incarnation
    assert not enc.get_header(old).encryption
    assert not is_sealed(enc.objects.get(enc.layout.segment(old, inc, 2)).data)
    rows = {r.session_id: r for r in enc.iter_sessions()}
    assert rows[old].name == "old name"
    with pytest.raises(InvalidInputError):
        enc.rotate_data_key(old)


def test_shredded_session_is_unreadable_everywhere(
    make_store: Callable[..., SessionStore], keyring: Path, s3_location: Any
) -> None:
    store = make_store(key_provider=LocalKeyFile(keyring))
    secret = canary()
    sid = store.create_session().session_id
    fill(store, sid, 4, secret)
    store.rotate_data_key(sid)
    fill(store, sid, 1, secret, tag="r")
    compactor_for(store, FakeClock()).compact_session(sid)
    keep = store.create_session().session_id
    fill(store, keep, 1, "kept")
    assert store.shred_keys(sid) == 2
    inc = store.get_header(sid).incarnation
    assert store.keys.versions(sid, inc) == []
    with pytest.raises(KeyUnavailableError):
        store.load_session_entries(sid)  # this process forgot its keys too
    with pytest.raises(KeyUnavailableError):
        make_store(key_provider=LocalKeyFile(keyring)).load_session_entries(sid)
    with pytest.raises(KeyUnavailableError):
        store.append_session_entries(sid, [msg("no", None, "no")])
    with pytest.raises(KeyUnavailableError):
        store.rotate_data_key(sid)
    for key, (data, _) in bucket_objects(s3_location).items():
        assert secret.encode() not in data, key
    assert [e["id"] for e in store.load_session_entries(keep)] == ["e0"]


def test_key_records_survive_gc_and_leave_with_the_session(
    enc_store: SessionStore
) -> None:
    clock = FakeClock()
    sid = enc_store.create_session().session_id
    fill(enc_store, sid, 3, "x")
    compactor = compactor_for(enc_store, clock)
    compactor.compact_session(sid)
    clock.advance(10 * GRACE_MS)
    compactor.gc()
    inc = enc_store.get_header(sid).incarnation
    assert enc_store.keys.versions(sid, inc) == [1]
    assert len(enc_store.load_session_entries(sid)) == 3
    enc_store.delete_session(sid)
    assert list(enc_store.objects.list(enc_store.layout.session_prefix(sid))) == []


def test_kms_provider_against_moto_kms(
    make_store: Callable[..., SessionStore], moto_server: Any, s3_location: Any, redis_url: str
) -> None:
    import boto3

    kms = boto3.client("kms", endpoint_url=moto_server.endpoint_url, region_name="us-east-1")
    key_id = kms.create_key(Description="sessionstore test")["KeyMetadata"]["KeyId"]
    provider = key_provider_from_url(f"kms://{key_id}?region=us-east-1&endpoint={moto_server.endpoint_url}")
    assert isinstance(provider, AwsKmsProvider)
    store = make_store(key_provider=provider)
    secret = canary()
    sid = store.create_session().session_id
    fill(store, sid, 3, secret)
    inc = store.get_header(sid).incarnation
    record = json.loads(store.objects.get(store.layout.key_record(sid, inc, 1)).data)
    assert record["provider"] == "kms" and key_id in record["kek_id"]
    other = make_store(key_provider=AwsKmsProvider(key_id, endpoint_url=moto_server.endpoint_url, region="us-east-1"))
    assert len(other.load_session_entries(sid)) == 3
    # KEK rotation by pointing at a new KMS key: new wraps use it, old records still unwrap.
    key2 = kms.create_key(Description="sessionstore test 2")["KeyMetadata"]["KeyId"]
    rotated = make_store(key_provider=AwsKmsProvider(key2, endpoint_url=moto_server.endpoint_url, region="us-east-1"))
    assert rotated.rotate_data_key(sid) == 2
    fill(rotated, sid, 1, secret, tag="k")
    record2 = json.loads(rotated.objects.get(rotated.layout.key_record(sid, inc, 2)).data)
    assert key2 in record2["kek_id"]
    assert len(rotated.load_session_entries(sid)) == 4
    assert leaks(secret, s3_location, redis_url) == []
    # A wrapped key moved from another session's record: KMS refuses it (the encryption
    # context names the session and incarnation), a typed error, never another key.
    donor = rotated.create_session().session_id
    donor_inc = rotated.get_header(donor).incarnation
    moved = json.loads(rotated.objects.get(rotated.layout.key_record(donor, donor_inc, 1)).data)
    moved.update(session_id=sid, incarnation=inc)
    rotated.objects.delete(rotated.layout.key_record(sid, inc, 1))
    rotated.objects.put_if_absent(rotated.layout.key_record(sid, inc, 1), json.dumps(moved).encode(), {})
    with pytest.raises(KeyUnavailableError, match="InvalidCiphertext"):
        make_store(key_provider=provider).load_session_entries(sid)
    rotated.shred_keys(sid)
    with pytest.raises(KeyUnavailableError):
        make_store(key_provider=provider).load_session_entries(sid)


def test_a_create_paused_before_its_header_past_the_gc_grace_never_leaves_a_keyless_session(
    make_store: Callable[..., SessionStore], keyring: Path
) -> None:
    """The creator writes the session's data key, passes its own time check, then pauses
    before the header for longer than GC's grace: GC collects the header-less key record
    (done here by deleting it, as GC does). The header then lands on an incarnation without
    a key. The creator finds the key gone after its header, withdraws that incarnation and
    creates the session again: what it returns is readable."""
    seen: list[str] = []

    def hook(point: str, ctx: dict[str, Any]) -> None:
        if point == "create.before_header" and not seen:
            seen.append(ctx["incarnation"])
            store.objects.delete(store.layout.key_record(ctx["session_id"], ctx["incarnation"], 1))

    store = make_store(key_provider=LocalKeyFile(keyring), fault_hook=hook)
    handle = store.create_session("late")
    assert seen and handle.header.incarnation != seen[0]
    store.append_session_entries("late", [msg("l0", None, "readable")])
    fresh = make_store(key_provider=LocalKeyFile(keyring))
    assert [e["id"] for e in fresh.load_session_entries("late")] == ["l0"]
    assert not list(store.objects.list(store.layout.incarnation_prefix("late", seen[0])))
