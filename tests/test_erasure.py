"""Erasure requests: a subject's data leaves every object and every Redis value, the command
says what it removed, and a byte scan of the whole bucket and Redis proves it.

Real Redis and a real S3 server over HTTP. The canary sits where a subject's data does in
practice: in a user message (which the listing's summary quotes as the first message, and
Redis's recent-segments cache holds while the segment is uncompacted), in the session's name,
in a compacted base and in an uncompacted segment.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import pytest
from harness.pausing import FakeClock

from compactor import Compactor, CompactorOptions
from compactor.erasure import erase_matching, erase_sessions, scan_for
from compactor.purge import purge_now
from store import SessionStore
from store.errors import InvalidInputError, SessionNotFoundError

CANARY = "canary-7f3a9e-Ünïcode"


def msg(eid: str, parent: str | None, text: str) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent,
            "timestamp": "2026-11-26T10:00:00.000Z",
            "message": {"role": "user", "content": text}}


def named(eid: str, parent: str | None, name: str) -> dict[str, Any]:
    return {"type": "session_info", "id": eid, "parentId": parent,
            "timestamp": "2026-11-26T10:00:00.000Z", "name": name}


def populate(store: SessionStore, compactor: Compactor) -> None:
    """a: the canary in its first message, its name and a late message (after a compaction);
    b: once, uncompacted; c: never."""
    store.create_session("a")
    store.append_session_entries("a", [msg("a0", None, f"my address is {CANARY}"), named("a1", "a0", f"chat of {CANARY}")])
    for i in range(2, 8):
        store.append_session_entries("a", [msg(f"a{i}", f"a{i - 1}", f"plain {i}")])
    assert compactor.compact_session("a").outcome == "compacted"
    store.append_session_entries("a", [msg("a8", "a7", f"again {CANARY} here")])
    store.append_session_entries("a", [msg("a9", "a8", "plain 9")])
    store.create_session("b")
    store.append_session_entries("b", [msg("b0", None, "hello"), msg("b1", "b0", f"{CANARY}")])
    store.create_session("c")
    store.append_session_entries("c", [msg("c0", None, "nothing to see")])
    store.list_sessions(limit=10)  # summaries in Redis (they quote first messages)


def snapshot(store: SessionStore) -> tuple[dict[str, bytes], dict[bytes, Any]]:
    objects = {i.key: store.objects.get(i.key).data for i in store.objects.list(store.layout.prefix)}
    client = store.coord.client
    redis: dict[bytes, Any] = {}
    for key in client.scan_iter(match=f"{store.coord.keys.prefix}:*"):
        if b":claim" in key:
            continue  # a writer's claim lapses by itself
        redis[key] = client.dump(key)
    return objects, redis


@pytest.fixture
def backend_args(s3_url: str, redis_url: str, redis_prefix: str) -> list[str]:
    return ["--objects", s3_url, "--redis", redis_url, "--redis-prefix", redis_prefix]


@pytest.fixture
def erasing(make_store: Callable[..., SessionStore]) -> tuple[SessionStore, Compactor]:
    # A purge waits out rebuilds older than the manifest it deletes behind (about a minute
    # by default): the tests make that short.
    store = make_store(compact_after_segments=0, rebuild_max_age_ms=200)
    compactor = Compactor(store, CompactorOptions(grace_ms=60_000, clock_skew_ms=50, worker="t"))
    return store, compactor


def test_erasing_matching_entries_leaves_no_byte_of_them_anywhere(
    erasing: tuple[SessionStore, Compactor],
) -> None:
    store, compactor = erasing
    populate(store, compactor)
    before = scan_for(store, CANARY)
    kinds = {store.layout.parse(h.key).kind for h in before.hits if h.where == "object"}
    redis = {h.key.rsplit(":", 1)[-1] for h in before.hits if h.where == "redis"}
    # It is in a base, in segments, and in Redis: the recent-segments cache and the summary.
    assert kinds == {"base", "segment"} and {"recent", "summary"} <= redis, before.hits
    entries_before = {s: store.load_session_entries(s) for s in "abc"}

    # A dry run says what it would do and changes nothing, byte for byte.
    snap = snapshot(store)
    dry = {r.session_id: r for r in erase_matching(compactor, CANARY, dry_run=True)}
    assert dry["a"].action == "would redact" and dry["a"].entries == ("a0", "a1", "a8")
    assert dry["b"].entries == ("b1",) and dry["c"].action == "unchanged"
    assert snapshot(store) == snap

    done = {r.session_id: r for r in erase_matching(compactor, CANARY)}
    assert done["a"].action == "redacted" and done["a"].entries == ("a0", "a1", "a8")
    assert done["a"].objects_deleted > 0 and done["b"].entries == ("b1",)
    assert done["c"].action == "unchanged"
    after = scan_for(store, CANARY)
    assert after.clean, after.hits
    assert after.objects_scanned > 0 and after.redis_keys_scanned > 0
    # Everything else is as it was; the erased entries are tombstones, the tree whole.
    for sid in "abc":
        now = {e["id"]: e for e in store.load_session_entries(sid)}
        for e in entries_before[sid]:
            if e["id"] in done[sid].entries:
                assert CANARY not in str(now[e["id"]]) and now[e["id"]]["parentId"] == e["parentId"]
            else:
                assert now[e["id"]] == e
    # The session goes on, and a fresh listing shows no trace of it.
    store.append_session_entries("a", [msg("a10", "a9", "after the erasure")])
    page = store.list_sessions(limit=10)
    assert CANARY not in repr(page.items)
    assert scan_for(store, CANARY).clean


def test_erasing_whole_sessions_reports_what_it_removed(erasing: tuple[SessionStore, Compactor]) -> None:
    store, compactor = erasing
    populate(store, compactor)
    b_entries = store.load_session_entries("b")
    dry = erase_sessions(store, ["a"], dry_run=True)
    assert dry[0].action == "would delete" and dry[0].objects_deleted >= 5
    assert store.load_session_entries("a")
    res = erase_sessions(store, ["a", "nope"])
    assert res[0].action == "deleted" and res[0].objects_deleted == dry[0].objects_deleted
    assert res[0].redis_keys_dropped >= 3 and res[1].action == "unchanged"
    with pytest.raises(SessionNotFoundError):
        store.load_session_entries("a")
    hits = scan_for(store, CANARY).hits
    assert hits and {_session_of(h.key) for h in hits} == {"b"}, hits  # only b's canary is left
    assert store.load_session_entries("b") == b_entries
    erase_sessions(store, ["b"])
    assert scan_for(store, CANARY).clean


def _session_of(key: str) -> str:
    if "{" in key:
        return key.split("{", 1)[1].split("}", 1)[0]
    for part in key.split("/"):
        if "=" in part:
            return part.split("=", 1)[1]
    parts = key.split("/")
    return parts[parts.index("sessions") + 1] if "sessions" in parts else key


def test_bad_requests_change_nothing(erasing: tuple[SessionStore, Compactor]) -> None:
    store, compactor = erasing
    populate(store, compactor)
    snap = snapshot(store)
    with pytest.raises(InvalidInputError):
        erase_matching(compactor, "ab")  # too short to mean a subject
    with pytest.raises(InvalidInputError):
        erase_sessions(store, [])
    with pytest.raises(InvalidInputError):
        scan_for(store, "")
    assert snapshot(store) == snap


def test_a_header_that_holds_the_text_is_reported(erasing: tuple[SessionStore, Compactor]) -> None:
    store, compactor = erasing
    store.create_session("h", cwd=f"/home/{CANARY}")
    store.append_session_entries("h", [msg("h0", None, "hi")])
    res = erase_matching(compactor, CANARY, ["h"])
    assert res[0].action == "unchanged"
    assert any("header" in n for n in res[0].notes)
    assert not scan_for(store, CANARY).clean  # the header still holds it ...
    erase_sessions(store, ["h"])
    assert scan_for(store, CANARY).clean  # ... until the session goes


def test_the_cli_erases_and_proves_it(
    make_store: Callable[..., SessionStore], backend_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from store.cli import main
    from store.cli.common import Exit

    store = make_store(compact_after_segments=0)
    populate(store, Compactor(store, CompactorOptions(grace_ms=60_000, worker="t"), now=FakeClock()))

    def run(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main([*backend_args, *args])
        return code, capsys.readouterr().out

    code, text = run("verify", "--canary", CANARY)
    assert code == Exit.FAILED and "canary found" in text and "FOUND in redis" in text
    code, text = run("erase", "--matching", CANARY, "--dry-run")
    assert code == Exit.OK and "a: would redact 3 entries: a0, a1, a8" in text
    code, _ = run("erase", "a", "b")
    assert code == Exit.USAGE  # no --yes: nothing happens
    assert store.load_session_entries("a")
    code, text = run("--json", "erase", "a", "b", "--yes")
    assert code == Exit.OK
    code, text = run("verify", "--canary", CANARY)
    assert code == Exit.OK and "canary not found" in text


def test_a_compactor_paused_with_the_content_in_hand_leaves_none_of_it(
    erasing: tuple[SessionStore, Compactor], make_store: Callable[..., SessionStore]
) -> None:
    """A compactor reads the segments (plaintext canary included), writes its base, and
    pauses before its manifest. The erasure redacts, compacts past it and purges. The paused
    compactor then loses the race for its manifest and deletes its own base: the scan finds
    nothing. (Were it to die there instead, its base would be an orphan that the sweep
    removes and a second erasure's purge deletes: the scan shows it.)"""
    from harness.pausing import InThread, Pause

    store, compactor = erasing
    store.create_session("p")
    store.append_session_entries("p", [msg("p0", None, f"mine: {CANARY}")])
    store.append_session_entries("p", [msg("p1", "p0", "plain")])
    pause = Pause("compact.after_base")
    slow = Compactor(make_store(compact_after_segments=0), CompactorOptions(grace_ms=60_000, worker="slow"),
                     fault_hook=pause)
    job = InThread(lambda: slow.compact_session("p"))
    pause.wait_paused()
    done = erase_matching(compactor, CANARY, ["p"])
    assert done[0].entries == ("p0",)
    pause.release()
    assert job.result().outcome == "lost"
    report = scan_for(store, CANARY)
    assert report.clean, report.hits
    assert [e["id"] for e in store.load_session_entries("p")][:2] == ["p0", "p1"]


def test_a_session_in_the_trash_is_erased_too(erasing: tuple[SessionStore, Compactor]) -> None:
    """Hidden from readers, a trashed session is still in storage until its purge: an
    erasure of every session finds it, and erases it whole (nothing can be appended in the
    trash, a redaction neither)."""
    from compactor.retention import RetentionOptions, RetentionRunner
    from store.lifecycle.retention import Retention, RetentionPolicy

    store, compactor = erasing
    clock = FakeClock()
    store.create_session("t")
    store.append_session_entries("t", [msg("t0", None, f"old {CANARY}")])
    store.create_session("u")
    store.append_session_entries("u", [msg("u0", None, "nothing")])
    store.set_retention("t", Retention.absolute(clock() + 1_000))
    clock.advance(10_000)
    report = RetentionRunner(store, RetentionPolicy(grace_ms=3_600_000), RetentionOptions(poll_ms=0),
                             now=clock).run()
    assert report.trashed == ("t",)
    assert not scan_for(store, CANARY).clean
    dry = {r.session_id: r for r in erase_matching(compactor, CANARY, dry_run=True)}
    assert dry["t"].action == "would delete" and "trash" in dry["t"].notes[0]
    assert dry["u"].action == "unchanged"
    done = {r.session_id: r for r in erase_matching(compactor, CANARY)}
    assert done["t"].action == "deleted" and done["t"].objects_deleted > 0
    assert scan_for(store, CANARY).clean
    assert [e["id"] for e in store.load_session_entries("u")] == ["u0"]


def test_erasing_an_encrypted_session_destroys_its_data_keys(
    make_store: Callable[..., SessionStore], tmp_path: Any
) -> None:
    """With encryption at rest no object or Redis value holds the canary to begin with; an
    erasure then destroys the session's data keys too (crypto-shredding), so a copy of its
    objects kept anywhere (a backup, a noncurrent version) is unreadable."""
    from store.formats.crypto import LocalKeyFile, create_keyring
    from store.errors import KeyUnavailableError

    keyring = tmp_path / "keys.json"
    create_keyring(keyring)
    store = make_store(compact_after_segments=0, key_provider=LocalKeyFile(keyring))
    store.create_session("e")
    store.append_session_entries("e", [msg("e0", None, f"secret {CANARY}")])
    store.append_session_entries("e", [msg("e1", "e0", "more")])
    assert scan_for(store, CANARY).clean  # ciphertext only
    inc = store.get_header("e").incarnation
    kept = {i.key: store.objects.get(i.key) for i in store.objects.list(store.layout.incarnation_prefix("e", inc))}
    res = erase_sessions(store, ["e"])
    assert res[0].action == "deleted" and res[0].keys_destroyed
    assert not list(store.objects.list(store.layout.session_prefix("e")))
    # A copy of a segment kept elsewhere cannot be read: its data key is gone.
    segment = next(obj for key, obj in kept.items() if store.layout.parse(key).kind == "segment")
    other = make_store(key_provider=LocalKeyFile(keyring))
    with pytest.raises(KeyUnavailableError):
        other.keys.open(segment.key, segment.data)


def test_redacting_several_entries_is_one_batch_or_nothing(erasing: tuple[SessionStore, Compactor]) -> None:
    from store.errors import EntryNotFoundError

    store, _ = erasing
    store.create_session("r")
    for i in range(4):
        store.append_session_entries("r", [msg(f"r{i}", f"r{i - 1}" if i else None, f"text {i}")])
    tail = store.get_tail("r")
    with pytest.raises(EntryNotFoundError):
        store.redact_entries("r", ["r1", "nope"], "x")
    assert store.get_tail("r") == tail  # nothing appended
    res = store.redact_entries("r", ["r1", "r3"], "erasure request")
    assert res.seq == tail.seq + 1 and res.appended_count == 2  # one segment
    entries = store.load_session_entries("r")
    redactions = [e for e in entries if e["type"] == "redaction"]
    assert [e["targetId"] for e in redactions] == ["r1", "r3"]
    assert redactions[0]["parentId"] == "r3" and redactions[1]["parentId"] == redactions[0]["id"]
    assert "content" not in str({e["id"]: e for e in entries}["r1"].get("message", {}))


@pytest.mark.parametrize("alone", [False, True])
def test_a_purge_waits_out_rebuilds_unless_it_is_alone_and_fences_either_way(
    make_store: Callable[..., SessionStore], caplog: pytest.LogCaptureFixture, alone: bool
) -> None:
    """``alone`` (every other process of the store has exited: the demo's end) skips only the
    wait for the rebuild age limit; the compaction, the fence and the deletes are the same."""
    # A short age limit when the purge waits (the test does not sleep a minute); the default,
    # a minute, when it must not wait at all. The compactor's clock stands still, so the wait
    # is due however long the compaction before it takes on a slow machine; 3 s because the
    # manifest's time may be the backend's, to the second (S3's Last-Modified).
    store = make_store(compact_after_segments=0, **({} if alone else {"rebuild_max_age_ms": 3000}))
    compactor = Compactor(store, CompactorOptions(grace_ms=60_000, clock_skew_ms=50, worker="t"), now=FakeClock())
    store.create_session("p")
    store.append_session_entries("p", [msg("p0", None, f"secret {CANARY}")])
    store.append_session_entries("p", [msg("p1", "p0", "plain")])
    store.append_session_entries("p", [msg("p2", "p1", "plain")])
    inc = store.get_header("p").incarnation
    caplog.set_level(logging.INFO, logger="sessionstore.compactor.purge")
    res = purge_now(compactor, "p", alone=alone)
    waited = any("waiting for rebuilds" in r.getMessage() for r in caplog.records)
    assert waited is not alone
    assert res.through_seq == 3 and res.count("segment") == 3
    assert store.coord.retired_through("p", inc) == 3  # the fence, set before the deletes
    assert [e["id"] for e in store.load_session_entries("p")] == ["p0", "p1", "p2"]
