"""Retention, TTLs and the trash (store/lifecycle/retention.py, compactor/retention.py), against the
real servers (moto over HTTP, a real redis-server).

Time comes from a ``FakeClock`` handed to the runner (and to ``set_retention`` through the
``now`` of ``RetentionStore.put``); activity times are the servers' own (real) clocks, so the
tests move the fake clock by hours and days, never by seconds.
"""

from __future__ import annotations

import uuid

from collections.abc import Callable
from typing import Any

import pytest
from harness.pausing import FakeClock, InThread, Pause
from pi_samples import append_chain
from pi_samples import message as msg
from test_store import snapshot

from compactor.retention import RetentionOptions, RetentionRunner
from store import SessionStore
from store.errors import (
    InvalidEntryError,
    InvalidRetentionError,
    NotInTrashError,
    SessionHasForksError,
    SessionNotFoundError,
    SessionTrashedError,
)
from store.lifecycle.retention import DAY_MS, Retention, RetentionPolicy, trash_mark

HOUR = 60 * 60 * 1000
GRACE = 2 * DAY_MS




def fill(store: SessionStore, sid: str, n: int = 3, **create: Any) -> list[str]:
    store.create_session(sid, **create)
    return append_chain(store, sid, n, tag=f"{sid}-e")


def runner(store: SessionStore, clock: FakeClock, policy: RetentionPolicy | None = None,
           **hooks: Any) -> RetentionRunner:
    # poll_ms=0: every call may run (the fleet-wide rate limit is the lease's period).
    return RetentionRunner(store, policy or RetentionPolicy(grace_ms=GRACE), RetentionOptions(poll_ms=0),
                           now=clock, **hooks)


def visible(store: SessionStore) -> set[str]:
    return {i.session_id for i in store.iter_sessions()}


# --- TTLs and policies ------------------------------------------------------------------------


def test_sliding_and_absolute_ttls_trash_exactly_the_due_sessions(store: SessionStore) -> None:
    clock = FakeClock()
    fill(store, "slide-old")
    fill(store, "slide-new")
    fill(store, "absolute")
    fill(store, "absolute-later")
    fill(store, "plain")
    # Set "a week ago" by the fake clock: a sliding TTL starts at its setting or the last
    # activity, whichever is later; slide-new's activity is now (the servers' clock).
    store.retention.put("slide-old", store.get_header("slide-old").incarnation,
                        Retention.sliding(DAY_MS), now=clock() - 7 * DAY_MS)
    store.set_retention("slide-new", Retention.sliding(3 * DAY_MS))
    store.set_retention("absolute", Retention.absolute(clock() + 12 * HOUR))
    store.set_retention("absolute-later", Retention.absolute(clock() + 5 * DAY_MS))
    assert store.get_retention("plain") is None
    assert store.get_retention("slide-new") == Retention(ttl_ms=3 * DAY_MS, set_at_ms=store.get_retention("slide-new").set_at_ms)

    # Now: slide-old's activity (now) + 1 day is not over yet: nothing due.
    assert runner(store, clock).run().trashed == ()
    clock.advance(DAY_MS + HOUR)
    report = runner(store, clock).run()
    assert set(report.trashed) == {"slide-old", "absolute"}
    assert visible(store) == {"slide-new", "absolute-later", "plain"}
    with pytest.raises(SessionTrashedError) as info:
        store.load_session_entries("absolute")
    assert info.value.purge_after_ms == clock() + GRACE
    assert "sessionstore trash restore absolute" in str(info.value)
    # Nothing else changes until the next deadlines, and those come from the schedule.
    assert store.coord.retention_scheduled("slide-new") is not None
    clock.advance(2 * DAY_MS)
    report = runner(store, clock).run(sweep=False)  # the schedule alone finds them
    assert set(report.trashed) == {"slide-new"}
    # slide-old and absolute were trashed a grace period ago: purged now, not before.
    assert set(report.purged) == {"slide-old", "absolute"}
    for sid in ("slide-old", "absolute"):
        with pytest.raises(SessionNotFoundError):
            store.get_header(sid)
        assert not list(store.objects.list(store.layout.session_prefix(sid)))
        assert not list(store.objects.list(store.layout.retention_prefix + store.layout.dir_name(sid)))
    assert {i.session_id for i in store.list_trash()} == {"slide-new"}
    assert store.coord.retention_stats() == {"trashed": 3, "purged": 2}


def test_the_idle_policy_trashes_idle_sessions_and_purges_after_the_grace_period(store: SessionStore) -> None:
    clock = FakeClock()
    for sid in ("a", "b", "kept"):
        fill(store, sid)
    store.set_retention("kept", Retention.keep())
    policy = RetentionPolicy(idle_ms=30 * DAY_MS, grace_ms=GRACE)
    clock.advance(29 * DAY_MS)
    assert runner(store, clock, policy).run().trashed == ()
    clock.advance(2 * DAY_MS)
    report = runner(store, clock, policy).run()
    assert set(report.trashed) == {"a", "b"}
    assert "kept" in visible(store)
    clock.advance(GRACE - HOUR)
    assert runner(store, clock, policy).run().purged == ()
    clock.advance(2 * HOUR)
    assert set(runner(store, clock, policy).run().purged) == {"a", "b"}
    assert visible(store) == {"kept"}


def test_a_setting_of_another_life_of_the_id_does_not_exempt_the_session_from_the_policy(
    store: SessionStore,
) -> None:
    """A "keep" recorded for another life of "again" (a create that was withdrawn and made
    again leaves the first one's record) says nothing of the life that exists now: the sweep
    applies the store-wide idle policy to it. A delete removes its own life's records."""
    clock = FakeClock()
    fill(store, "again", retention=Retention.keep())
    first = store.get_header("again").incarnation
    store.delete_session("again")
    assert store.retention.records_of("again", first) == []
    fill(store, "again")
    store.retention.put("again", uuid.uuid4().hex, Retention.keep())  # a withdrawn create's
    assert store.get_retention("again") is None
    policy = RetentionPolicy(idle_ms=30 * DAY_MS, grace_ms=GRACE)
    clock.advance(31 * DAY_MS)
    assert runner(store, clock, policy).run(sweep=True).trashed == ("again",)


def test_a_session_in_the_trash_refuses_appends_reads_and_settings(store: SessionStore) -> None:
    clock = FakeClock()
    ids = fill(store, "s")
    store.set_retention("s", Retention.absolute(clock() + HOUR))
    clock.advance(2 * HOUR)
    runner(store, clock).run()
    with pytest.raises(SessionTrashedError):
        store.append_session_entries("s", [msg("x", ids[-1])])
    with pytest.raises(SessionTrashedError):
        store.load_session("s")
    with pytest.raises(SessionTrashedError):
        store.set_retention("s", Retention.keep())
    assert store.list_sessions().items == []
    [row] = store.list_sessions(trashed=True).items
    assert row.trash_purge_after_ms == clock() + GRACE
    store.retention.restore("s", now=clock())  # store.restore_session, on the fake clock
    assert [e["id"] for e in store.load_session_entries("s") if e["type"] == "message"] == ids
    store.append_session_entries("s", [msg("x", ids[-1])])
    # Restored after its absolute expiry: kept until another setting.
    clock.advance(DAY_MS)
    assert runner(store, clock).run().trashed == ()


def test_restore_before_the_purge_brings_back_every_entry(store: SessionStore) -> None:
    clock = FakeClock()
    ids = fill(store, "r", n=5)
    from compactor import Compactor

    Compactor(store, now=clock).compact_session("r")  # a base, and segments after it
    store.append_session_entries("r", [msg("late", ids[-1])])
    before = store.load_session_entries("r")
    store.set_retention("r", Retention.sliding(HOUR))
    clock.advance(2 * HOUR)
    assert runner(store, clock).run().trashed == ("r",)
    assert [i.session_id for i in store.list_trash()] == ["r"]
    clock.advance(GRACE - HOUR)
    store.restore_session("r")
    after = store.load_session_entries("r")
    assert [e for e in after if e["type"] != "retention"] == before
    assert [e["action"] for e in after if e["type"] == "retention"] == ["trash", "restore"]
    assert store.list_trash() == []
    assert "r" in visible(store)
    with pytest.raises(NotInTrashError):
        store.restore_session("r")
    clock.advance(2 * HOUR)  # past the trash's old purge time: a restored session is not purged
    report = runner(store, clock).run()
    assert report.purged == ()
    # The restore was activity and its sliding TTL runs from it: by the servers' clock that
    # was now, an hour and more before the fake clock, so it goes back to the trash, afresh.
    assert report.trashed == ("r",)
    assert store.retention.view("r")[0].trash.purge_after_ms == clock() + GRACE  # type: ignore[union-attr]


def test_a_fork_keeps_its_source_until_the_fork_is_gone(store: SessionStore) -> None:
    clock = FakeClock()
    ids = fill(store, "src")
    store.branch_from_entry("src", ids[1], "fork")
    store.append_session_entries("fork", [msg("f1", ids[1])])
    store.set_retention("src", Retention.absolute(clock() + HOUR))
    clock.advance(2 * HOUR)
    assert runner(store, clock).run().trashed == ("src",)
    clock.advance(GRACE + HOUR)
    report = runner(store, clock).run()
    assert report.held == ("src",) and report.purged == ()
    with pytest.raises(SessionHasForksError):
        store.retention.purge(store.retention.view("src")[0], now=clock(), force=True)
    # The fork still reads its history from the trashed source.
    assert [e["id"] for e in store.load_session_entries("fork")] == [ids[0], ids[1], "f1"]
    [item] = store.list_trash()
    assert item.forks == ("fork",)
    # A new fork of a trashed source is refused (and leaves nothing).
    with pytest.raises(SessionTrashedError):
        store.branch_from_entry("src", ids[0], "late-fork")
    with pytest.raises(SessionNotFoundError):
        store.get_header("late-fork")
    # The fork goes (trashed and purged in its turn): then the source is purged.
    store.set_retention("fork", Retention.absolute(clock() + HOUR))
    clock.advance(2 * HOUR)
    assert runner(store, clock).run(sweep=True).trashed == ("fork",)
    clock.advance(GRACE + HOUR)
    purged = set(runner(store, clock).run(sweep=True).purged)
    purged |= set(runner(store, clock).run(sweep=True).purged)  # the source, if judged first
    assert purged == {"fork", "src"}
    assert not list(store.objects.list(store.layout.prefix + "forks/"))


def test_a_purge_paused_before_its_registration_never_drops_the_next_forks(
    make_store: Callable[..., SessionStore],
) -> None:
    """Fork F of S is purged: the purge deleted F's session and paused before deleting F's
    registration with S. Meanwhile F is forked from S again (the same id, a new life) and
    written to. The purge then deletes only the registration of the life it purged (each
    fork registers under a token of its own, kept in its header), so a purge of S still finds
    the new F and keeps S, from which F reads its history."""
    clock = FakeClock()
    pause = Pause("retention.purged_session", lambda ctx: ctx["session_id"] == "fork")
    purger = make_store(fault_hook=pause)
    store = make_store()
    ids = fill(store, "src")
    store.branch_from_entry("src", ids[1], "fork")
    purger.retention.trash(purger.retention.view("fork")[0], reason="test", grace_ms=0, now=clock())
    purging = InThread(lambda: purger.retention.purge(purger.retention.view("fork")[0], now=clock(), force=True))
    pause.wait_paused()
    store.branch_from_entry("src", ids[2], "fork")
    store.append_session_entries("fork", [msg("g1", ids[2])])
    pause.release()
    purging.result()
    store.retention.trash(store.retention.view("src")[0], reason="test", grace_ms=0, now=clock())
    with pytest.raises(SessionHasForksError):
        store.retention.purge(store.retention.view("src")[0], now=clock(), force=True)
    assert [e["id"] for e in store.load_session_entries("fork")] == ids + ["g1"]
    [item] = store.list_trash()
    assert item.forks == ("fork",)


def test_a_restore_paused_before_dropping_its_index_entry_never_hides_the_next_trashing(
    make_store: Callable[..., SessionStore],
) -> None:
    """A restore committed its marker and paused before dropping the trash index entry;
    meanwhile the session is trashed again. The restore then drops only the entry of the
    trash event it undid (each event has its own), so ``trash ls`` still shows the session,
    with the new event's reason; a restore of that event drops its entry in turn."""
    clock = FakeClock()
    pause = Pause("retention.restored", lambda ctx: ctx["session_id"] == "again")
    restorer = make_store(fault_hook=pause)
    store = make_store()
    fill(store, "again")
    store.retention.trash(store.retention.view("again")[0], reason="first", grace_ms=GRACE, now=clock())
    restoring = InThread(lambda: restorer.restore_session("again"))
    pause.wait_paused()
    store.retention.trash(store.retention.view("again")[0], reason="second", grace_ms=GRACE, now=clock())
    pause.release()
    restoring.result()
    [item] = store.list_trash()
    assert (item.session_id, item.reason) == ("again", "second")
    store.restore_session("again")
    assert store.list_trash() == []
    assert not list(store.objects.list(store.layout.trash_prefix))


def test_trash_ls_shows_one_item_a_session_whatever_entries_are_left(store: SessionStore) -> None:
    """An entry left by an earlier trash event (a restore that stopped before dropping it)
    or written before entries were named by their event is shown only for the event in the
    log, once."""
    clock = FakeClock()
    fill(store, "left")
    store.retention.trash(store.retention.view("left")[0], reason="first", grace_ms=GRACE, now=clock())
    inc = store.get_header("left").incarnation
    first = [i.key for i in store.objects.list(store.layout.trash_entries_prefix("left", inc))]
    restored_from = store.get_tail("left").last_entry_id
    store.restore_session("left")
    # As if that restore had stopped before its delete, and an entry of an older version.
    store.objects.put_if_absent(first[0], b'{"reason": "first", "at": 1}')
    store.objects.put_if_absent(store.layout.trash_entry("left", inc), b'{"reason": "legacy", "at": 2}')
    assert store.layout.trash_entry("left", inc, restored_from) == first[0]
    assert store.list_trash() == []  # not in the trash: every entry left out
    clock.advance(10)
    store.retention.trash(store.retention.view("left")[0], reason="second", grace_ms=GRACE, now=clock())
    [item] = store.list_trash()
    assert item.reason == "second"
    store.delete_session("left")  # every entry of the incarnation goes with it
    assert not list(store.objects.list(store.layout.trash_prefix))


def test_dry_run_changes_nothing(store: SessionStore) -> None:
    clock = FakeClock()
    for sid in ("d1", "d2", "d3"):
        fill(store, sid)
    store.set_retention("d1", Retention.absolute(clock() + HOUR))
    clock.advance(2 * HOUR)
    runner(store, clock).run()  # d1 in the trash
    store.set_retention("d2", Retention.absolute(clock() + HOUR))
    clock.advance(GRACE + HOUR)
    list(store.iter_sessions(filters=None, trashed=None))  # summaries settled, as any listing does
    before = snapshot(store)
    report = runner(store, clock, RetentionPolicy(idle_ms=DAY_MS, grace_ms=GRACE)).run(dry_run=True)
    assert report.dry_run
    assert set(report.trashed) == {"d2", "d3"} and report.purged == ("d1",)
    assert snapshot(store) == before
    assert store.coord.retention_stats() == {"trashed": 1}


# --- pauses -----------------------------------------------------------------------------------


def test_a_runner_paused_after_deciding_does_not_trash_a_session_appended_to_meanwhile(
    make_store: Callable[..., SessionStore],
) -> None:
    store = make_store()
    clock = FakeClock()
    ids = fill(store, "p")
    store.set_retention("p", Retention.sliding(HOUR))
    clock.advance(2 * HOUR)
    pause = Pause("retention.decided")
    paused = InThread(lambda: runner(store, clock, fault_hook=pause).run())
    pause.wait_paused()
    store.append_session_entries("p", [msg("fresh", ids[-1])])  # the session is active again
    pause.release()
    report = paused.result()
    assert report.trashed == () and report.changed == ("p",)
    assert store.load_session_entries("p")[-1]["id"] == "fresh"
    assert trash_mark(store.get_tail("p").last_entry_id) is None
    assert store.coord.retention_scheduled("p") is not None  # judged again on the next run


@pytest.mark.parametrize("first", ["restore", "purge"])
def test_a_restore_and_a_purge_interleaved_end_in_exactly_one_outcome(
    make_store: Callable[..., SessionStore], first: str
) -> None:
    clock = FakeClock()
    point = "retention.before_purge" if first == "restore" else "retention.before_restore"
    pause = Pause(point)
    store = make_store(fault_hook=pause)
    ids = fill(store, "x")
    store.set_retention("x", Retention.absolute(clock() + HOUR))
    clock.advance(2 * HOUR)
    runner(store, clock).run()
    clock.advance(GRACE + HOUR)
    if first == "restore":
        # The purge decided and checked the forks, then pauses before its marker; a restore
        # runs meanwhile. The purge's marker then finds the tail moved: nothing is purged.
        paused = InThread(lambda: runner(store, clock).run())
        pause.wait_paused()
        store.restore_session("x")
        pause.release()
        report = paused.result()
        assert report.purged == () and report.changed == ("x",)
        assert [e["id"] for e in store.load_session_entries("x") if e["type"] == "message"] == ids
    else:
        # The restore read the trash marker, then pauses; the purge runs to its end.
        restoring = InThread(lambda: store.restore_session("x"))
        pause.wait_paused()
        assert runner(store, clock).run().purged == ("x",)
        pause.release()
        with pytest.raises(SessionNotFoundError):
            restoring.result()
        with pytest.raises(SessionNotFoundError):
            store.get_header("x")
        assert not list(store.objects.list(store.layout.session_prefix("x")))


def test_a_purge_paused_after_its_marker_cannot_be_restored_and_is_finished_by_the_next_run(
    make_store: Callable[..., SessionStore],
) -> None:
    clock = FakeClock()
    pause = Pause("retention.purge_marked")
    store = make_store(fault_hook=pause)
    fill(store, "m")
    store.set_retention("m", Retention.absolute(clock() + HOUR))
    clock.advance(2 * HOUR)
    runner(store, clock).run()
    clock.advance(GRACE + HOUR)
    paused = InThread(lambda: runner(store, clock, worker="slow").run(sweep=False))
    pause.wait_paused()
    with pytest.raises(SessionTrashedError) as info:
        store.restore_session("m")
    assert info.value.purging
    pause.release()
    assert paused.result().purged == ("m",)
    with pytest.raises(SessionNotFoundError):
        store.get_header("m")


@pytest.mark.parametrize("until", ["trashed", "purged"])
def test_a_writer_paused_before_its_put_is_never_acknowledged_into_a_trashed_session(
    make_store: Callable[..., SessionStore], until: str
) -> None:
    clock = FakeClock()
    pause = Pause("append.before_put", lambda ctx: ctx["session_id"] == "w" and ctx["seq"] == 4)
    store = make_store(fault_hook=pause, claim_ms=0)
    other = make_store(claim_ms=0)
    ids = fill(other, "w")
    other.set_retention("w", Retention.absolute(clock() + HOUR))
    clock.advance(2 * HOUR)
    writing = InThread(lambda: store.append_session_entries("w", [msg("late", ids[-1])]))
    pause.wait_paused()  # CHECK said OK at tail 3; the PUT of segment 4 waits
    assert runner(other, clock).run().trashed == ("w",)  # the trash marker took segment 4
    if until == "purged":
        clock.advance(GRACE + HOUR)
        assert runner(other, clock).run().purged == ("w",)
    pause.release()
    with pytest.raises(SessionNotFoundError):  # SessionTrashedError while in the trash
        writing.result()
    if until == "trashed":
        other.restore_session("w")
        assert "late" not in {e["id"] for e in other.load_session_entries("w")}
    else:
        # Its PUT landed in the purged incarnation's key space and was deleted again.
        assert not list(other.objects.list(other.layout.session_prefix("w")))


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda: Retention.sliding(-1),
    lambda: Retention.sliding(0),
    lambda: Retention.absolute(-5),
    lambda: Retention(ttl_ms=1, expires_at_ms=2),
    lambda: Retention(ttl_ms=True),
    lambda: Retention.sliding(1.5),  # type: ignore[arg-type]
    lambda: RetentionPolicy(idle_ms=-1),
    lambda: RetentionPolicy(grace_ms=-1),
])
def test_bad_retention_is_a_typed_error(make: Callable[[], object]) -> None:
    with pytest.raises(InvalidRetentionError):
        make()


def test_bad_input_changes_nothing(store: SessionStore) -> None:
    fill(store, "b")
    list(store.iter_sessions())
    before = snapshot(store)
    with pytest.raises(InvalidRetentionError):
        store.set_retention("b", 3600)  # type: ignore[arg-type]
    with pytest.raises(InvalidRetentionError):
        store.create_session("b2", kind="stream", retention=Retention.sliding(HOUR))
    with pytest.raises(InvalidEntryError):
        store.append_session_entries("b", [msg("sessionstore.trash.1.x", None)])
    with pytest.raises(NotInTrashError):
        store.restore_session("b")
    with pytest.raises(SessionNotFoundError):
        store.set_retention("nope", Retention.keep())
    assert snapshot(store) == before


def test_a_ttl_given_at_creation_is_recorded_with_the_session(store: SessionStore) -> None:
    clock = FakeClock()
    store.create_session("c", retention=Retention.sliding(HOUR))
    assert store.get_retention("c").ttl_ms == HOUR  # type: ignore[union-attr]
    assert store.coord.retention_scheduled("c") is not None
    clock.advance(2 * HOUR)
    assert runner(store, clock).run(sweep=False).trashed == ("c",)
