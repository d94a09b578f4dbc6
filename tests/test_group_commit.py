"""Group commit: the writer that takes the claim on a session's next segment also writes the
batches of the writers queued behind it, in one segment, and COMMIT wakes them.

A queued writer offers its batch (``<queue>:<nonce>:offer`` in Redis, with its lease); CHECK
hands the claim holder the offers of the queue, each at most once; the holder CHECKs the
combined batch again as a whole, PUTs it as its own segment and names the riders to COMMIT.
A rider keeps every duty of a writer: until it hears "done" it goes on checking, and its CHECK
finds its batch stored (DUPLICATE) or not, so a leader that pauses anywhere costs the riders
time, never a batch (docs/design.md, "Group commit").

Real writer threads (each with a store of its own, as separate processes would have) against
real Redis and S3. Orders, counts and contents are asserted, never durations.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from harness.pausing import InThread, Pause
from history import Op, attempt, check_history
from test_fair_appends import queued, wait_for

from store import SessionStore
from store.errors import ConflictError, IdCollisionError, IndeterminateError


def entry(eid: str, parent: str | None, text: str | None = None) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent,
            "timestamp": "2026-11-27T10:00:00.000Z",
            "message": {"role": "user", "content": text or f"content of {eid}"}}


def offers(store: SessionStore, sid: str) -> list[str]:
    """Nonces of the writers whose batches are on offer to ride in the next segment."""
    coord = store.coord
    return [n for n in queued(store, sid) if coord.client.exists(coord.keys.turn(sid, n) + ":offer")]


def segments(store: SessionStore, sid: str) -> list[list[str]]:
    """The ids of each segment of ``sid``, in order."""
    data = store.read_session(sid)
    out: dict[int, list[str]] = {}
    for e, seq in zip(data.entries, data.seqs):
        out.setdefault(seq, []).append(str(e["id"]))
    return [out[k] for k in sorted(out)]


# A claim or a queued writer's lease that outlasts any scheduling delay of a loaded machine:
# with the 2 s default, a claim holder paused while the test sets up could lose its claim to
# the writer that should queue behind it, and the test would see a different (correct) story.
HELD = 60_000


def hold_claim(make_store: Callable[..., SessionStore], sid: str, batch: list[dict[str, Any]],
               expected: str | None = None) -> tuple[Pause, SessionStore, InThread]:
    """A session with entry "a", and a writer of ``batch`` stopped holding the claim on the
    next segment (before its PUT). Returns the pause, a store to look with, the writer."""
    hold = Pause("append.before_put")
    holder = make_store(fault_hook=hold, claim_ms=HELD)
    base = make_store()
    base.create_session(sid)
    base.append_session_entries(sid, [entry("a", None)])
    return hold, base, InThread(lambda: holder.append_session_entries(sid, batch, expected).seq)


def queue_behind(holder_pause: Pause, make: Callable[[int], InThread], count: int,
                 probe: SessionStore, sid: str) -> list[InThread]:
    """Start ``count`` writers one after another behind a paused claim holder, each offering."""
    holder_pause.wait_paused()
    out = []
    for i in range(count):
        out.append(make(i))
        wait_for(lambda i=i: len(offers(probe, sid)) == i + 1, f"writer {i} queued with its offer")
    return out


def test_writers_queued_behind_a_claim_ride_in_one_segment(
    make_store: Callable[..., SessionStore],
) -> None:
    """Three writers queue behind a claim holder. When it commits, the first of them takes the
    claim and writes all three batches, in the order they queued, as one segment: each is
    acknowledged with that segment, and nothing is left in the queue or on offer."""
    hold, base, h = hold_claim(make_store, "g", [entry("h", "a")])
    stores = [make_store(claim_ms=HELD) for _ in range(3)]
    waiters = queue_behind(
        hold, lambda i: InThread(lambda: stores[i].append_session_entries(
            "g", [entry(f"w{i}", "a"), entry(f"w{i}x", f"w{i}")])), 3, base, "g")
    hold.release()
    assert h.result() == 2
    results = [w.result() for w in waiters]
    assert [r.seq for r in results] == [3, 3, 3]
    # The leader wrote the segment and says how much it holds; the riders cannot know.
    assert [r.segment_entries for r in results] == [6, None, None]
    assert segments(base, "g") == [["a"], ["h"], ["w0", "w0x", "w1", "w1x", "w2", "w2x"]]
    assert queued(base, "g") == []
    coord = base.coord
    left = {k.decode() for k in coord.client.keys(coord.keys.queue("g") + ":*")}
    assert left <= {coord.keys.queue_leases("g")}  # no offer, no wake-up left
    # A re-send of a rider's batch is recognised (its ids were indexed by the leader's COMMIT).
    assert stores[2].append_session_entries("g", [entry("w2", "a"), entry("w2x", "w2")]).seq == 3
    # Every entry reads back with its content (the leader wrote the riders' bytes).
    assert [e["message"]["content"] for e in base.load_session_entries("g")][-1] == "content of w2x"


def test_many_writers_with_group_commit_lose_and_duplicate_nothing(
    make_store: Callable[..., SessionStore],
) -> None:
    """Four writers append 12 batches each to one session as fast as they can. The history
    checker finds every acknowledged batch exactly once, whole, in the segment it was
    acknowledged with; and writers did share segments (fewer segments than batches)."""
    writers, per_writer = 4, 12
    hold = Pause("append.before_put")
    base = make_store(fault_hook=hold, claim_ms=30_000)
    base.create_session("m")
    stores = [make_store(claim_ms=30_000) for _ in range(writers)]
    ops: list[Op] = []
    lock = threading.Lock()

    def write(w: int) -> None:
        parent: str | None = None
        for i in range(per_writer):
            op = attempt(stores[w], "m", [entry(f"w{w}-{i}", parent), entry(f"w{w}-{i}b", f"w{w}-{i}")], None)
            with lock:
                ops.append(op)
            if op.outcome == "ok":
                parent = f"w{w}-{i}b"

    first = InThread(lambda: attempt(base, "m", [entry("first", None)], None))
    hold.wait_paused()
    threads = [InThread(lambda w=w: write(w)) for w in range(writers)]
    wait_for(lambda: len(queued(base, "m")) == writers, "every writer in the queue")
    hold.release()
    ops.append(first.result())
    for t in threads:
        t.result()
    report = check_history(base, ops)
    assert report.problems == [] and report.errors == []
    assert report.acknowledged == writers * per_writer + 1
    assert len(segments(base, "m")) < writers * per_writer + 1
    assert queued(base, "m") == []


@pytest.mark.parametrize("point", ["append.grouped", "append.before_put", "append.after_put"])
def test_a_leader_paused_past_its_lease_costs_its_riders_time_never_a_batch(
    make_store: Callable[..., SessionStore], point: str,
) -> None:
    """The writer that took two riders stops (before its combined CHECK, before its PUT,
    after its PUT) until its claim has run out. The riders go on alone: the first takes the
    claim (and the other rider), PUTs the same slot, and either wins it or finds the
    stopped leader's segment there, rolls it forward and finds its batch stored. When the
    leader resumes, its own PUT or COMMIT meets what happened. Every batch is in the session
    exactly once, in the segment it was acknowledged with."""
    hold = Pause("append.before_put")
    holder = make_store(fault_hook=hold, claim_ms=30_000)
    stop = Pause(point, when=lambda ctx: ctx.get("seq") == 3)
    # The leader waits in the queue first: its lease (its claim_ms) must outlast a slow
    # machine's gaps between its renewals (a quarter of it), or it drops out of the queue
    # and a rider leads instead. Two seconds, the default; its claim then lapses in two.
    leader = make_store(fault_hook=stop, claim_ms=2000)
    base = make_store()
    base.create_session("p")
    base.append_session_entries("p", [entry("seed", None)])
    ops: list[Op] = []
    h = InThread(lambda: attempt(holder, "p", [entry("h", "seed")], None))
    hold.wait_paused()
    lead = InThread(lambda: attempt(leader, "p", [entry("L", "seed")], None))
    wait_for(lambda: len(queued(base, "p")) == 1, "the leader-to-be queued")
    riders = [make_store(claim_ms=400) for _ in range(2)]
    threads = []
    for i, st in enumerate(riders):
        threads.append(InThread(lambda st=st, i=i: attempt(st, "p", [entry(f"r{i}", "seed")], None)))
        wait_for(lambda i=i: len(offers(base, "p")) == i + 2, f"rider {i} on offer")
    hold.release()
    ops.append(h.result())
    stop.wait_paused()  # holding the claim on segment 3, with both riders' batches
    results = [t.result() for t in threads]  # they finish without the leader
    ops.extend(results)
    stop.release()
    ops.append(lead.result())
    report = check_history(base, ops)
    assert report.problems == [] and report.errors == []
    assert report.acknowledged == 4
    ids = [e["id"] for e in base.load_session_entries("p")]
    assert sorted(ids) == ["L", "h", "r0", "r1", "seed"]
    segs = segments(base, "p")
    if point == "append.after_put":
        # The stopped leader's segment won slot 3: the riders found their batches in it.
        assert segs == [["seed"], ["h"], ["L", "r0", "r1"]]
        assert {op.seq for op in results} == {3}
    else:
        # The riders took slot 3 (together, or one after the other when one's refreshed
        # offer came too late for the other's turn: grouping is an optimisation, never a
        # promise); the leader's group is void and it appended after them, alone.
        assert segs[:2] == [["seed"], ["h"]] and segs[-1] == ["L"]
        assert sorted(i for seg in segs[2:-1] for i in seg) == ["r0", "r1"]
        assert min(op.seq for op in results) == 3


def test_a_rider_that_gives_up_while_its_batch_is_out_says_indeterminate(
    make_store: Callable[..., SessionStore],
) -> None:
    """A rider's batch was taken by a leader that then stops, holding a long claim. The rider
    gives up waiting; since the leader may still write its batch, it must not say "nothing
    written" (ContentionError): it says IndeterminateError. The leader resumes and writes
    it, and the rider's re-send finds it (the same segment)."""
    hold = Pause("append.before_put")
    holder = make_store(fault_hook=hold, claim_ms=30_000)
    stop = Pause("append.grouped")
    leader = make_store(fault_hook=stop, claim_ms=30_000)
    rider = make_store(claim_ms=30_000, max_wait_s=1.0)
    base = make_store()
    base.create_session("i")
    base.append_session_entries("i", [entry("a", None)])
    h = InThread(lambda: holder.append_session_entries("i", [entry("h", "a")]).seq)
    hold.wait_paused()
    lead = InThread(lambda: leader.append_session_entries("i", [entry("L", "a")]).seq)
    wait_for(lambda: len(queued(base, "i")) == 1, "the leader-to-be queued")
    r = InThread(lambda: rider.append_session_entries("i", [entry("R", "a")]).seq)
    wait_for(lambda: len(offers(base, "i")) == 2, "the rider on offer")
    hold.release()
    assert h.result() == 2
    stop.wait_paused()
    with pytest.raises(IndeterminateError, match="offered to ride"):
        r.result()
    stop.release()
    assert lead.result() == 3
    assert segments(base, "i") == [["a"], ["h"], ["L", "R"]]
    assert rider.append_session_entries("i", [entry("R", "a")]).seq == 3


def test_a_rider_whose_batch_clashes_with_the_leaders_is_sent_back_and_refused(
    make_store: Callable[..., SessionStore],
) -> None:
    """Two writers queue with the same entry id and different content. The first takes the
    claim and the other's offer, finds the clash in the combined batch, sends the rider
    back and writes its own batch alone; the rider's CHECK then refuses it (IdCollisionError)
    and nothing of it is visible."""
    hold, base, h = hold_claim(make_store, "c", [entry("h", "a")])
    first, second = make_store(claim_ms=HELD), make_store(claim_ms=HELD)
    waiters = queue_behind(hold, lambda i: InThread(lambda: (first, second)[i].append_session_entries(
        "c", [entry("x", "a", text=f"version {i}")]).seq), 2, base, "c")
    hold.release()
    assert h.result() == 2
    assert waiters[0].result() == 3
    with pytest.raises(IdCollisionError):
        waiters[1].result()
    assert segments(base, "c") == [["a"], ["h"], ["x"]]
    assert base.load_session_entries("c")[-1]["message"]["content"] == "version 0"
    assert queued(base, "c") == []


def test_a_rider_whose_batch_was_stored_meanwhile_is_not_written_twice(
    make_store: Callable[..., SessionStore],
) -> None:
    """A batch is re-sent from another machine while its first sending holds the claim: the
    re-send queues and offers it (not stored yet, so its CHECK let it wait). The first
    sending commits it; the next claim holder takes the offer, and its CHECK of the combined
    batch finds the batch stored: it writes its own batch alone, and the re-send's CHECK
    answers with the segment the batch was committed as."""
    batch = [entry("x", "a"), entry("y", "x")]
    hold, base, h = hold_claim(make_store, "d", batch)
    leader, resend = make_store(claim_ms=HELD), make_store(claim_ms=HELD)
    waiters = queue_behind(hold, lambda i: InThread(
        lambda: (leader.append_session_entries("d", [entry("L", "a")]) if i == 0
                 else resend.append_session_entries("d", batch)).seq), 2, base, "d")
    hold.release()
    assert h.result() == 2
    assert [w.result() for w in waiters] == [3, 2]
    assert segments(base, "d") == [["a"], ["x", "y"], ["L"]]
    assert queued(base, "d") == []


def test_writers_with_an_expected_tail_never_ride(make_store: Callable[..., SessionStore]) -> None:
    """A writer appending with an expected tail must land right after it: it queues without
    offering its batch, and writes its own segment when its turn comes."""
    hold, base, h = hold_claim(make_store, "e", [entry("h", "a")], "a")
    hold.wait_paused()
    w = make_store(claim_ms=HELD)
    plain = InThread(lambda: w.append_session_entries("e", [entry("p", "a")]).seq)
    wait_for(lambda: len(offers(base, "e")) == 1, "the plain writer on offer")
    expecting = make_store(claim_ms=HELD)
    # Its CHECK passes now (the tail is "a"); after the holder's commit it is refused.
    e = InThread(lambda: expecting.append_session_entries("e", [entry("x", "a")], "a").seq)
    wait_for(lambda: len(queued(base, "e")) == 2, "the expecting writer queued")
    assert len(offers(base, "e")) == 1  # it offered nothing
    hold.release()
    assert h.result() == 2
    assert plain.result() == 3
    with pytest.raises(ConflictError):
        e.result()
    assert segments(base, "e") == [["a"], ["h"], ["p"]]


def test_a_batch_appended_alone_starts_its_segment(make_store: Callable[..., SessionStore]) -> None:
    """``alone=True`` (what the stream service uses, whose offsets are (segment, index)): the
    writer queues without offering its batch, so it never rides; handed the claim, it still
    takes the riders behind it, after its own batch, so (seq, appended_count) is the
    position right after its batch."""
    hold = Pause("append.before_put")
    holder = make_store(fault_hook=hold, claim_ms=HELD)
    base = make_store()
    base.create_session("s")
    h = InThread(lambda: holder.append_session_entries("s", [entry("h", None)]).seq)
    hold.wait_paused()
    lone, other = make_store(claim_ms=HELD), make_store(claim_ms=HELD)
    first = InThread(lambda: lone.append_session_entries(
        "s", [entry("s1", None), entry("s2", "s1")], alone=True))
    wait_for(lambda: len(queued(base, "s")) == 1, "the lone writer queued")
    r = InThread(lambda: other.append_session_entries("s", [entry("r", None)]).seq)
    wait_for(lambda: len(queued(base, "s")) == 2, "the rider queued")
    wait_for(lambda: len(offers(base, "s")) == 1, "the rider's offer")
    assert offers(base, "s") == queued(base, "s")[1:]  # the lone writer offered nothing
    hold.release()
    assert h.result() == 1
    res = first.result()
    assert (res.seq, res.appended_count) == (2, 2)
    assert r.result() == 2
    assert segments(base, "s") == [["h"], ["s1", "s2", "r"]]


def test_group_commit_on_redis_cluster(cluster_url: str, s3_url: str) -> None:
    """The offers and wake-ups are named from the queue's key, in the session's hash slot: on a
    Redis Cluster the scripts that take offers and wake riders stay in that slot."""
    hold = Pause("append.before_put")
    holder = SessionStore.from_url(s3_url, cluster_url, fault_hook=hold)
    stores = [SessionStore.from_url(s3_url, cluster_url) for _ in range(3)]
    try:
        holder.create_session("gq")
        h = InThread(lambda: holder.append_session_entries("gq", [entry("h", None)]).seq)
        waiters = queue_behind(hold, lambda i: InThread(
            lambda: stores[i].append_session_entries("gq", [entry(f"w{i}", None)]).seq), 3, holder, "gq")
        hold.release()
        assert h.result() == 1
        assert [w.result() for w in waiters] == [2, 2, 2]
        assert segments(holder, "gq") == [["h"], ["w0", "w1", "w2"]]
    finally:
        for st in [holder, *stores]:
            st.close()
