"""Compaction without rewriting history: runs of bases merged geometrically
(``compactor/tiers.py``), against the real servers.

What is checked: bytes written per byte appended stay logarithmic (a 10k-entry session
appended one entry at a time), the number of bases stays bounded, readers see the same
session before and after every compaction, GC never deletes a base that several consecutive
manifests name while one that still exists names it, a redaction of an entry in a kept base
purges it, and a compactor paused mid-merge loses to another without losing anything.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import orjson
import pytest
from harness.pausing import FakeClock, InThread, Pause

from compactor import Compactor, CompactorOptions
from compactor.tiers import plan_cut, runs_of
from store import SessionStore
from store.formats.entries import encode_entries
from store.errors import BackendUnavailableError
from store.protocol.manifest import Manifest

GRACE_MS = 60_000


def entry(eid: str, parent: str | None, text: str = "") -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent,
            "timestamp": "2026-11-22T10:00:00.000Z",
            "message": {"role": "user", "content": text or f"text of {eid}"}}


def redaction(eid: str, parent: str | None, target: str, reason: str = "pii") -> dict[str, Any]:
    return {"type": "redaction", "id": eid, "parentId": parent,
            "timestamp": "2026-11-22T10:00:01.000Z", "targetId": target, "reason": reason}


def compactor_for(store: SessionStore, clock: FakeClock, **options: Any) -> Compactor:
    options.setdefault("grace_ms", GRACE_MS)
    options.setdefault("worker", f"test-{uuid.uuid4().hex[:6]}")
    hook = options.pop("fault_hook", None)
    return Compactor(store, CompactorOptions(**options), now=clock, fault_hook=hook)


class Appender:
    """Appends one chain of entries, one segment per call."""

    def __init__(self, store: SessionStore, sid: str) -> None:
        self.store = store
        self.sid = sid
        self.parent: str | None = None
        self.ids: list[str] = []

    def add(self, eid: str, text: str = "") -> None:
        self.store.append_session_entries(self.sid, [entry(eid, self.parent, text)])
        self.parent = eid
        self.ids.append(eid)

    def batch(self, tag: str, count: int, per_segment: int = 1) -> None:
        for s in range(count):
            batch = []
            for k in range(per_segment):
                batch.append(entry(f"{tag}{s}-{k}", self.parent))
                self.parent = batch[-1]["id"]
            self.store.append_session_entries(self.sid, batch)
            self.ids.extend(e["id"] for e in batch)


def latest(store: SessionStore, sid: str) -> Manifest:
    manifest = store.latest_manifest(sid, store.get_header(sid).incarnation)
    assert manifest is not None
    return manifest


def view(store: SessionStore, sid: str) -> tuple[list[str], list[int], list[dict[str, Any]]]:
    data = store.read_session(sid)
    return [e["id"] for e in data.entries], list(data.seqs), data.entries


def base_keys(store: SessionStore, sid: str) -> list[str]:
    prefix = store.layout.incarnation_prefix(sid, store.get_header(sid).incarnation) + "base/"
    return [i.key for i in store.objects.list(prefix)]


def holders(store: SessionStore, sid: str, needle: bytes) -> list[str]:
    keys = [i.key for i in store.objects.list(store.layout.session_prefix(sid))]
    return [k for k in keys if needle in store.objects.get(k).data]


# --- the policy alone ------------------------------------------------------------------------


def _base(stem: str, part: int, size: int, **extra: Any) -> dict[str, Any]:
    return {"key": f"p/sessions/s/i/base/{stem}-{part:05d}.jsonl", "sha256": "x",
            "entries": 1, "bytes": size, **extra}


def test_runs_are_the_bases_of_one_stem_and_the_cut_is_geometric() -> None:
    bases = [_base("01-5-a", 0, 600), _base("01-5-a", 1, 400), _base("03-9-b", 0, 400),
             _base("04-9-c", 0, 100)]
    runs = runs_of(bases)
    assert [len(r) for r in runs] == [2, 1, 1]
    # 50 new bytes: the 100-byte run is not smaller than twice that, everything is kept.
    assert plan_cut(runs, 50, 2.0, knows_redactions=True) == 3
    # 60: the 100-byte run is merged (160 then), the 400-byte one is not (400 < 320 is false).
    assert plan_cut(runs, 60, 2.0, knows_redactions=True) == 2
    # 101: 201, then 400 < 402 merges too (601), then 1000 < 1202 as well.
    assert plan_cut(runs, 101, 2.0, knows_redactions=True) == 0
    assert plan_cut(runs, 101, 4.0, knows_redactions=True) == 0
    assert plan_cut(runs, 101, 1.5, knows_redactions=True) == 2
    # A manifest that does not record its redactions: everything is rewritten once.
    assert plan_cut(runs, 1, 2.0, knows_redactions=False) == 0
    # A run at an older schema is rewritten, and so is everything after it.
    old = [bases[0], bases[1], _base("03-9-b", 0, 300, schema=0), bases[3]]
    assert plan_cut(runs_of(old), 1, 2.0, knows_redactions=True) == 1
    with pytest.raises(ValueError):
        CompactorOptions(merge_ratio=1.0)


# --- write amplification ---------------------------------------------------------------------


@pytest.mark.every_backend
@pytest.mark.long
@pytest.mark.timeout(900)
def test_a_10000_entry_session_appended_one_entry_at_a_time_is_written_about_log_n_times(
    redis_url: str, redis_prefix: str,
) -> None:
    """10,000 segments of one entry each, compacted every 64 segments (the default trigger):
    the bytes the compactions write stay a few times the bytes appended (about 80x when every
    compaction rewrote the whole session), the bases stay few, and a reader sees the same
    session before and after every compaction."""
    # Bytes written are counted, the same on every backend, so the in-memory one (held to the
    # same contract): on S3 servers 10k PUTs and 157 compactions took minutes of the suite.
    store = SessionStore.from_url("memory://", redis_url, redis_prefix=redis_prefix, recent_cache_bytes=0)
    clock = FakeClock()
    store.create_session("amp")
    inc = store.get_header("amp").incarnation
    c = compactor_for(store, clock, read_ahead=16)
    pool = ThreadPoolExecutor(max_workers=8)
    parent = None
    appended = written = read = 0
    most_bases = 0
    ids: list[str] = []
    seq = 0
    for round_ in range(157):
        # Segments put as a writer encodes them (the append path is not what this is about:
        # the compactor finds segments Redis never heard of by listing).
        puts = []
        for _ in range(64 if round_ < 156 else 16):
            seq += 1
            eid = f"e{seq}"
            body = encode_entries([entry(eid, parent)])
            puts.append((store.layout.segment("amp", inc, seq), body))
            appended += len(body)
            parent = eid
            ids.append(eid)
        list(pool.map(lambda kb: store.objects.put_if_absent(
            kb[0], kb[1], {"sha256": hashlib.sha256(kb[1]).hexdigest()}), puts))
        check = round_ % 26 == 0 or round_ == 156
        before = view(store, "amp") if check else None
        res = c.compact_session("amp")
        assert res.outcome == "compacted" and res.segment_count == (64 if round_ < 156 else 16)
        written += res.bytes_out
        read += res.bytes_in
        manifest = latest(store, "amp")
        most_bases = max(most_bases, len(manifest.bases))
        if before is not None:
            assert view(store, "amp") == before
    pool.shutdown()
    assert seq == 10_000
    assert [e["id"] for e in store.load_session_entries("amp")] == ids
    amplification = written / appended
    assert amplification < 6, amplification
    # Each run is at least twice the next newer one: at most log2(sessions/smallest) + 1.
    assert most_bases <= math.log2(10_000 / 64) + 2, most_bases
    # What the manifest says the bases hold is what they hold.
    manifest = latest(store, "amp")
    assert sum(int(b["bytes"]) for b in manifest.bases) == sum(
        len(store.objects.get(str(b["key"])).data) for b in manifest.bases)
    assert manifest.raw["entry_count"] == 10_000 and manifest.raw["last_entry_id"] == "e10000"
    store.close()


# --- GC of bases named by several manifests --------------------------------------------------


def test_gc_keeps_a_base_while_any_existing_manifest_names_it(
    make_store: Callable[..., SessionStore],
) -> None:
    """Run R1 is named by manifests 1, 2 and 3 (kept as it is), R2 by manifest 2 only (merged
    into R3 by manifest 3). When manifest 2's grace is over, manifest 1 goes but R1 stays:
    the newest manifest names it. R2 goes only when manifest 3's grace is over."""
    store = make_store()
    clock = FakeClock()
    store.create_session("sh")
    app = Appender(store, "sh")
    c = compactor_for(store, clock)
    app.batch("a", 10, per_segment=4)
    assert c.compact_session("sh").generation == 1
    m1 = latest(store, "sh")
    clock.advance(GRACE_MS // 2)
    app.add("b")
    r2 = c.compact_session("sh")
    m2 = latest(store, "sh")
    assert r2.bases_kept == 1 and m2.bases[0] == m1.bases[0]
    clock.advance(GRACE_MS // 2)
    app.add("c")
    r3 = c.compact_session("sh")
    m3 = latest(store, "sh")
    # R2 is small next to what is new: merged. R1 is kept once more.
    assert r3.bases_kept == 1 and m3.bases[0] == m1.bases[0]
    r1_key, r2_key = str(m1.bases[0]["key"]), str(m2.bases[1]["key"])
    assert r2_key not in m3.base_keys
    expected = view(store, "sh")
    inc = store.get_header("sh").incarnation

    # Past manifest 2's grace (manifest 1 is retired), before manifest 3's.
    clock.advance(GRACE_MS // 2 + 1)
    result = c.gc_session("sh")
    deleted = set(result.deleted_keys)
    assert store.layout.manifest("sh", inc, 1) in deleted
    assert r1_key not in deleted and r2_key not in deleted
    assert not deleted & m3.base_keys
    assert view(store, "sh") == expected

    # Past manifest 3's grace: R2 (and manifest 2) go, R1 still stays.
    clock.advance(GRACE_MS // 2)
    result = c.gc_session("sh")
    assert ("base", r2_key) in result.deleted
    assert store.layout.manifest("sh", inc, 2) in result.deleted_keys
    assert not set(result.deleted_keys) & m3.base_keys
    assert all(store.objects.head(k) is not None for k in m3.base_keys)
    assert view(make_store(), "sh") == expected
    # And again much later: what the newest manifest names is never garbage.
    clock.advance(10 * GRACE_MS)
    assert not set(c.gc_session("sh").deleted_keys) & m3.base_keys
    assert view(make_store(), "sh") == expected


# --- redaction of what a kept base holds -----------------------------------------------------


def test_a_redaction_of_an_entry_in_a_kept_base_rewrites_from_that_base_on(
    make_store: Callable[..., SessionStore],
) -> None:
    store = make_store()
    clock = FakeClock()
    store.create_session("rk")
    app = Appender(store, "rk")
    c = compactor_for(store, clock)
    app.batch("a", 20, per_segment=4)
    c.compact_session("rk")  # R1: 80 entries
    app.add("mid", "the middle secret-CANARY")
    app.batch("m", 2, per_segment=2)
    c.compact_session("rk")  # R2: 5 entries, R1 kept
    app.add("new")
    c.compact_session("rk")  # R3: 1 entry
    m = latest(store, "rk")
    assert len(runs_of(m.bases)) == 3
    # A redaction of an entry in R2 rewrites R2 and R3 with the new segment, keeps R1.
    store.append_session_entries("rk", [redaction("red-mid", app.parent, "mid", "canary")])
    app.parent = "red-mid"
    res = c.compact_session("rk")
    assert res.bases_kept == 1 and res.redactions_purged == 1
    after = latest(store, "rk")
    assert after.bases[0] == m.bases[0] and len(after.bases) == 2
    assert after.raw["redactions"] == [["mid", "red-mid", "canary"]]
    entries = {e["id"]: e for e in view(store, "rk")[2]}
    assert entries["mid"]["redacted"] == {"reason": "canary", "redactionId": "red-mid"}
    named = b"".join(store.objects.get(str(b["key"])).data for b in after.bases)
    assert b"CANARY" not in named
    # Past the grace period GC leaves the bytes in no object at all.
    clock.advance(GRACE_MS + 1)
    c.gc_session("rk")
    assert holders(store, "rk", b"CANARY") == []


@pytest.mark.every_backend
def test_a_redaction_of_the_oldest_entry_and_one_of_an_entry_still_to_come(
    make_store: Callable[..., SessionStore],
) -> None:
    """A target in the oldest run rewrites everything once; a target not yet appended is
    searched for once (and not found: everything is kept), then recorded in the manifest
    and purged when its entry arrives, without reading the kept bases again."""
    store = make_store()
    clock = FakeClock()
    store.create_session("ro")
    app = Appender(store, "ro")
    c = compactor_for(store, clock)
    app.add("first", "first words secret-CANARY")
    app.batch("a", 20, per_segment=4)
    c.compact_session("ro")
    app.add("b")
    c.compact_session("ro")
    before = view(store, "ro")
    store.append_session_entries("ro", [redaction("r1", app.parent, "first"),
                                        redaction("r2", "r1", "later")])
    app.parent = "r2"
    res = c.compact_session("ro")
    assert res.bases_kept == 0 and res.redactions_purged == 1
    ids, seqs, entries = view(store, "ro")
    assert ids[: len(before[0])] == before[0] and seqs[: len(before[1])] == before[1]
    assert entries[0]["redacted"] == {"reason": "pii", "redactionId": "r1"}
    kept_keys = latest(store, "ro").base_keys
    # The target of r2 arrives later: tombstoned in the new run, the old one kept.
    app.batch("c", 10, per_segment=2)
    app.add("later", "late secret-CANARY")
    store.objects.requests.clear()
    res = c.compact_session("ro")
    assert res.redactions_purged == 1 and res.bases_kept == 1
    # The header and the 11 segments were read: the kept base was not searched again.
    assert store.objects.requests["get"] == 12
    after = latest(store, "ro")
    assert kept_keys <= after.base_keys
    named = b"".join(store.objects.get(str(b["key"])).data for b in after.bases)
    assert b"CANARY" not in named and named.count(b'"redactionId":"r2"') == 1
    clock.advance(GRACE_MS + 1)
    c.gc_session("ro")
    assert holders(store, "ro", b"CANARY") == []


# --- a compactor paused mid-merge ------------------------------------------------------------


@pytest.mark.parametrize("point", ["compact.after_scan", "compact.before_manifest"])
def test_compactor_paused_mid_merge_loses_and_nothing_is_lost(
    make_store: Callable[..., SessionStore], point: str
) -> None:
    """A compactor read the runs it merges and paused. Another compacts twice (merging the
    same runs and more), GC deletes what those retired, a grace period later. The paused one
    goes on: it loses the race for its manifest, withdraws only its own bases, and every
    base the newest manifest names (kept from earlier manifests too) is still there."""
    store = make_store()
    clock = FakeClock()
    store.create_session("pm")
    app = Appender(store, "pm")
    fast = compactor_for(store, clock)
    app.batch("a", 16, per_segment=2)
    fast.compact_session("pm")
    app.batch("b", 4)
    fast.compact_session("pm")
    app.batch("c", 4)
    paused_from = latest(store, "pm")
    pause = Pause(point)
    slow = compactor_for(store, clock, fault_hook=pause)
    job = InThread(lambda: slow.compact_session("pm"))
    pause.wait_paused()
    app.batch("d", 8)
    assert fast.compact_session("pm").outcome == "compacted"
    expected = view(store, "pm")
    newest = latest(store, "pm")
    merged = {str(b["key"]) for b in newest.bases} - set(newest.base_keys & paused_from.base_keys)
    clock.advance(GRACE_MS + 1)
    gone = fast.gc_session("pm").deleted_keys
    # The runs the paused compactor read and merges were merged again, and are deleted now.
    assert set(paused_from.base_keys) - newest.base_keys <= set(gone)
    assert set(paused_from.base_keys) - newest.base_keys
    pause.release()
    if point == "compact.before_manifest":
        result = job.result()
        assert result.outcome == "lost"
        own = result.base_keys
    else:
        # Past half the grace period before writing its bases: it withdraws them itself.
        with pytest.raises(BackendUnavailableError):
            job.result()
        own = tuple(k for k in base_keys(store, "pm") if k not in newest.base_keys)
    assert own == () or all(store.objects.head(k) is None for k in own)
    assert latest(store, "pm").generation == newest.generation
    assert all(store.objects.head(k) is not None for k in newest.base_keys)
    assert merged and view(make_store(), "pm") == expected
    assert [e["id"] for e in make_store().load_session_entries("pm")] == app.ids
    # The session compacts on normally.
    app.add("e")
    assert fast.compact_session("pm").outcome == "compacted"
    assert [e["id"] for e in make_store().load_session_entries("pm")] == app.ids


def test_manifest_records_redactions_and_a_fence_copies_them(
    make_store: Callable[..., SessionStore],
) -> None:
    """A fence manifest (GC taking an abandoned generation) copies the redactions with the
    bases, so the compaction after it still keeps the bases it may keep."""

    class Died(Exception):
        pass

    def die(point: str, ctx: dict[str, Any]) -> None:
        if point == "compact.before_manifest":
            raise Died()

    store = make_store()
    clock = FakeClock()
    store.create_session("fr")
    app = Appender(store, "fr")
    c = compactor_for(store, clock)
    app.add("x", "secret")
    store.append_session_entries("fr", [redaction("rx", "x", "x")])
    app.parent = "rx"
    app.batch("a", 10, per_segment=4)
    c.compact_session("fr")
    app.add("b")
    with pytest.raises(Died):
        compactor_for(store, clock, fault_hook=die).compact_session("fr")
    clock.advance(GRACE_MS + 1)
    c.gc_session("fr")
    fence = latest(store, "fr")
    assert fence.raw["compaction"]["kind"] == "fence"
    assert fence.raw["redactions"] == [["x", "rx", "pii"]]
    res = c.compact_session("fr")
    assert res.outcome == "compacted" and res.bases_kept == 1
    raw = orjson.loads(store.objects.get(
        store.layout.manifest("fr", store.get_header("fr").incarnation, res.generation)).data)
    assert raw["redactions"] == [["x", "rx", "pii"]]


def test_a_manifest_without_redactions_makes_the_next_compaction_rewrite_everything(
    make_store: Callable[..., SessionStore],
) -> None:
    """A manifest written before runs were kept (no ``redactions``) says nothing about the
    redactions its bases hold: the next compaction reads and rewrites every base, and its
    manifest records them, so that a later target is still purged."""
    from store.protocol.manifest import build_manifest, compaction_record

    store = make_store()
    clock = FakeClock()
    store.create_session("old")
    app = Appender(store, "old")
    c = compactor_for(store, clock)
    app.batch("a", 20, per_segment=4)
    store.append_session_entries("old", [redaction("r-late", app.parent, "late")])
    app.parent = "r-late"
    c.compact_session("old")
    first = latest(store, "old")
    inc = store.get_header("old").incarnation
    # Manifest 2 as the compactor before this change wrote it: the same content, no
    # ``redactions``.
    body = build_manifest(
        session_id="old", incarnation=inc, generation=2, previous=first,
        through_seq=first.through_seq, seq_counts=first.seq_counts, bases=[dict(b) for b in first.bases],
        entry_count=sum(first.seq_counts), last_entry_id=str(first.raw["last_entry_id"]),
        compaction=compaction_record(worker="old", started_ms=clock(), finished_ms=clock()),
        retired=[], grace_ms=GRACE_MS, finished_ms=clock(), history_limit=50,
    )
    assert "redactions" not in body
    assert store.manifests.create("old", inc, 2, body, "old-nonce")
    app.add("late", "late secret-CANARY")
    res = c.compact_session("old")
    assert res.generation == 3 and res.bases_kept == 0 and res.redactions_purged == 1
    third = latest(store, "old")
    assert third.raw["redactions"] == [["late", "r-late", "pii"]]
    named = b"".join(store.objects.get(str(b["key"])).data for b in third.bases)
    assert b"CANARY" not in named
    assert [e["id"] for e in view(store, "old")[2]] == app.ids[:80] + ["r-late", "late"]
