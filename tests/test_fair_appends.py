"""Fair appends: writers waiting on one session are served first come, first served.

A writer that finds the claim on the next segment taken joins the session's queue in Redis
(a ticket) and blocks until the claim is handed to it; COMMIT hands it to the first waiter,
so the writer that just committed cannot take it again ahead of them. The queue only orders
writers: If-None-Match on the PUT stays the arbiter, so pauses of waiters and of holders are
bounded by their leases and cannot lose or duplicate anything (docs/design.md, "Claims").

Real writer threads (each with a store of its own, as separate processes would have) against
real Redis and S3. Orders and counts are asserted, never durations.

The queue is tested here on its own, one writer a segment (``group_commit_riders=0``); group
commit, where the claim holder also writes the batches waiting behind it, is in
tests/test_group_commit.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from harness.pausing import InThread, Pause
from history import Op, attempt, check_history

from store import SessionStore
from store.errors import BackendUnavailableError, ConflictError


NO_GROUPS = {"group_commit_riders": 0}


@pytest.fixture
def make_store(make_store: Callable[..., SessionStore]) -> Callable[..., SessionStore]:
    """Stores whose writers each write a segment of their own (no group commit)."""

    def make(**options: Any) -> SessionStore:
        return make_store(**{**NO_GROUPS, **options})

    return make


def entry(eid: str, parent: str | None) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent,
            "timestamp": "2026-11-24T10:00:00.000Z",
            "message": {"role": "user", "content": f"content of {eid}"}}


def queued(store: SessionStore, sid: str) -> list[str]:
    """Nonces of the writers waiting on ``sid``, first come first."""
    raw = store.coord.client.zrange(store.coord.keys.queue(sid), 0, -1)
    return [x.decode() for x in raw]


def claim(store: SessionStore, sid: str) -> str | None:
    raw = store.coord.client.get(store.coord.keys.claim(sid))
    return raw.decode() if raw is not None else None


def wait_for(what: Callable[[], bool], why: str) -> None:
    """Synchronisation, not a timing assertion: wait (generously) for a state to arise."""
    deadline = time.monotonic() + 60
    while not what():
        assert time.monotonic() < deadline, f"never happened: {why}"
        time.sleep(0.005)


class Tickets:
    """A fault hook recording, per append, the ticket it last waited with and the segment
    it was committed as (hooks run in the appending thread)."""

    def __init__(self, then: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.served: list[tuple[int, int]] = []  # (ticket, seq) of appends that waited
        self.direct = 0  # appends that never waited
        self._then = then
        self._local = threading.local()
        self._lock = threading.Lock()

    def __call__(self, point: str, ctx: dict[str, Any]) -> None:
        if point == "append.queued":
            self._local.ticket = ctx["ticket"]
        elif point == "append.after_commit":
            ticket = getattr(self._local, "ticket", None)
            self._local.ticket = None
            with self._lock:
                if ticket is None:
                    self.direct += 1
                else:
                    self.served.append((ticket, ctx["seq"]))
        if self._then is not None:
            self._then(point, ctx)


def overtaken(served: list[tuple[int, int]]) -> int:
    """How many times a writer was served after one that came later (by ticket)."""
    seqs = [seq for _, seq in sorted(served)]
    return sum(1 for i, a in enumerate(seqs) for b in seqs[i + 1 :] if b < a)


def test_overtaken_counts_inversions() -> None:
    assert overtaken([(1, 3), (2, 4), (3, 5)]) == 0
    assert overtaken([(1, 5), (2, 3), (3, 4)]) == 2


# --- order of service ------------------------------------------------------------------------


def test_waiters_are_served_in_order_of_arrival_and_the_committer_queues_behind_them(
    make_store: Callable[..., SessionStore],
) -> None:
    """Three writers arrive one after another while a fourth holds the claim: they get the
    next three segments in that order. The holder, appending again the moment it has
    committed, comes after them (before fair appends it took the claim again, up to 32
    times in a row)."""
    hold = Pause("append.before_put")
    holder = make_store(fault_hook=hold)
    base = make_store()
    base.create_session("q")
    base.append_session_entries("q", [entry("a", None)])
    h = InThread(lambda: [holder.append_session_entries("q", [entry(f"h{i}", "a")]).seq for i in range(2)])
    hold.wait_paused()  # holds the claim on segment 2
    waiters = []
    for i in range(3):
        st = make_store()
        waiters.append(InThread(lambda st=st, i=i: st.append_session_entries("q", [entry(f"w{i}", "a")]).seq))
        wait_for(lambda i=i: len(queued(base, "q")) == i + 1, f"writer {i} in the queue")
    hold.release()
    assert [w.result() for w in waiters] == [3, 4, 5]
    assert h.result() == [2, 6]
    assert [e["id"] for e in base.load_session_entries("q")] == ["a", "h0", "w0", "w1", "w2", "h1"]
    assert queued(base, "q") == []


def test_many_writers_on_one_session_nobody_overtaken_nothing_lost(
    make_store: Callable[..., SessionStore],
) -> None:
    """Four writers append 12 batches each to one session as fast as they can. Every batch
    that waited was served in the order of its ticket, and the history checker finds every
    acknowledged batch exactly once."""
    writers, per_writer = 4, 12
    hold = Pause("append.before_put")
    tickets = Tickets()
    base = make_store(fault_hook=lambda p, c: (tickets(p, c), hold(p, c)), claim_ms=30_000)
    base.create_session("m")
    ops: list[Op] = []
    lock = threading.Lock()
    # Long leases: no claim lapses, so the order of service is the queue's alone.
    stores = [make_store(fault_hook=tickets, claim_ms=30_000) for _ in range(writers)]

    def write(w: int) -> None:
        parent: str | None = None
        for i in range(per_writer):
            op = attempt(stores[w], "m", [entry(f"w{w}-{i}", parent)], None)
            with lock:
                ops.append(op)
            if op.outcome == "ok":
                parent = f"w{w}-{i}"

    # A first append holds the claim until every writer has queued behind it, so that the
    # run starts contended; from then on they race freely.
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
    assert len(tickets.served) >= writers  # the run was contended
    assert len(tickets.served) + tickets.direct == writers * per_writer + 1
    assert overtaken(tickets.served) == 0
    assert queued(base, "m") == []


def test_a_lapsed_claim_goes_to_the_first_waiter_not_to_a_newcomer(
    make_store: Callable[..., SessionStore],
) -> None:
    """The holder stops and its claim runs out while the first waiter is stopped too (just
    after joining the queue). A writer that arrives now finds the claim free, yet it is
    handed to the waiter, and the newcomer queues behind it."""
    hold = Pause("append.before_put")
    holder = make_store(fault_hook=hold, claim_ms=300)
    stall = Pause("append.queued")
    waiter = make_store(fault_hook=stall, claim_ms=30_000)
    newcomer = make_store()
    newcomer.create_session("l")
    newcomer.append_session_entries("l", [entry("a", None)])
    h = InThread(lambda: holder.append_session_entries("l", [entry("h", "a")]).seq)
    hold.wait_paused()
    w = InThread(lambda: waiter.append_session_entries("l", [entry("w", "a")]).seq)
    stall.wait_paused()
    nonce = stall.seen[-1][1]["nonce"]
    wait_for(lambda: claim(newcomer, "l") is None, "the stopped holder's claim ran out")
    assert queued(newcomer, "l") == [nonce]
    n = InThread(lambda: newcomer.append_session_entries("l", [entry("n", "a")]).seq)
    # The newcomer's CHECK handed the claim to the waiter (out of the queue) and queued itself.
    wait_for(lambda: queued(newcomer, "l") not in ([], [nonce]), "the newcomer queued")
    assert len(queued(newcomer, "l")) == 1
    assert claim(newcomer, "l") == f"1:{nonce}"
    stall.release()
    assert w.result() == 2
    assert n.result() == 3
    hold.release()  # its slot is taken: the PUT arbitrates, and it appends at the tail
    assert h.result() == 4
    assert [e["id"] for e in newcomer.load_session_entries("l")] == ["a", "w", "n", "h"]


def test_fair_queue_on_redis_cluster(cluster_url: str, s3_url: str) -> None:
    """The queue's keys are hash-tagged like the session's other keys: on a Redis Cluster the
    scripts that hand the claim over (and wake the waiter) stay in the session's slot."""
    hold = Pause("append.before_put")
    holder = SessionStore.from_url(s3_url, cluster_url, fault_hook=hold, **NO_GROUPS)
    stores = [SessionStore.from_url(s3_url, cluster_url, **NO_GROUPS) for _ in range(3)]
    try:
        holder.create_session("cq")
        h = InThread(lambda: holder.append_session_entries("cq", [entry("h", None)]).seq)
        hold.wait_paused()
        waiters = []
        for i, st in enumerate(stores):
            waiters.append(InThread(lambda st=st, i=i: st.append_session_entries("cq", [entry(f"w{i}", None)]).seq))
            wait_for(lambda i=i: len(queued(holder, "cq")) == i + 1, f"writer {i} in the queue")
        hold.release()
        assert h.result() == 1
        assert [w.result() for w in waiters] == [2, 3, 4]
    finally:
        for st in [holder, *stores]:
            st.close()


# --- pauses ----------------------------------------------------------------------------------


def test_a_paused_waiter_holds_up_the_others_at_most_its_lease(
    make_store: Callable[..., SessionStore],
) -> None:
    """A writer joins the queue and stops (a GC pause, SIGSTOP) before it waits. It is first
    in line, so the claim is handed to it; nobody else may write meanwhile, but only until
    its lease runs out: the others then go on while it is still paused. When it resumes, it
    appends after them."""
    hold = Pause("append.before_put")
    holder = make_store(fault_hook=hold, claim_ms=30_000)
    stall = Pause("append.queued")
    sleeper = make_store(fault_hook=stall, claim_ms=3000)
    other = make_store()
    other.create_session("p")
    other.append_session_entries("p", [entry("a", None)])
    ops: list[Op] = [Op("p", ["a"], None, "ok", 1)]
    h = InThread(lambda: attempt(holder, "p", [entry("h", "a")], None))
    hold.wait_paused()
    s = InThread(lambda: attempt(sleeper, "p", [entry("s", "a")], None))
    stall.wait_paused()  # in the queue, first in line, and stopped
    nonce = stall.seen[-1][1]["nonce"]

    def others() -> list[Op]:
        out, parent = [], "a"
        for i in range(4):
            out.append(attempt(other, "p", [entry(f"o{i}", parent)], None))
            parent = f"o{i}"
        return out

    o = InThread(others)
    wait_for(lambda: len(queued(other, "p")) == 2, "the other writer queued behind the paused one")
    hold.release()
    ops.append(h.result())
    assert ops[-1].seq == 2
    assert claim(other, "p") == f"2:{nonce}"  # handed to the paused writer, first in line
    done = o.result()  # once its lease ran out, while it is still paused
    assert not stall.go.is_set()
    assert [op.seq for op in done] == [3, 4, 5, 6]
    ops += done
    stall.release()
    ops.append(s.result())
    assert ops[-1].outcome == "ok" and ops[-1].seq == 7
    assert check_history(other, ops).problems == []
    assert queued(other, "p") == []


@pytest.mark.parametrize("point", ["append.before_put", "append.after_put"])
def test_a_paused_holder_resuming_after_its_turn_passed_loses_and_duplicates_nothing(
    make_store: Callable[..., SessionStore], point: str
) -> None:
    """The holder of the claim stops before its PUT (or after it, before its COMMIT) for
    longer than its lease. Two writers go on past it, queueing and handing the claim over.
    When it resumes, the PUT decides: before its PUT, its slot is taken and it appends at
    the tail; after it, its segment was rolled forward by the next writer and it is
    acknowledged at that slot. Nothing lost, nothing twice, and the queue works on."""
    pause = Pause(point)
    holder = make_store(fault_hook=pause, claim_ms=400)
    writers = [make_store() for _ in range(2)]
    writers[0].create_session("r")
    writers[0].append_session_entries("r", [entry("a", None)])
    ops: list[Op] = [Op("r", ["a"], None, "ok", 1)]
    late = InThread(lambda: attempt(holder, "r", [entry("late", "a")], None))
    pause.wait_paused()

    def write(w: int) -> list[Op]:
        out, parent = [], "a"
        for i in range(4):
            out.append(attempt(writers[w], "r", [entry(f"w{w}-{i}", parent)], None))
            parent = f"w{w}-{i}"
        return out

    threads = [InThread(lambda w=w: write(w)) for w in range(2)]
    for t in threads:
        ops += t.result()
    assert all(op.outcome == "ok" for op in ops)
    pause.release()
    op = late.result()
    ops.append(op)
    assert op.outcome == "ok"
    assert op.seq == (2 if point == "append.after_put" else 10)
    assert sorted(o.seq for o in ops) == list(range(1, 11))
    # The queue is not left in a state that stalls or reorders anyone.
    assert queued(writers[0], "r") == []
    more = [attempt(st, "r", [entry(f"more{i}", None)], None) for i, st in enumerate([holder, *writers])]
    assert [o.seq for o in more] == [11, 12, 13]
    report = check_history(writers[0], ops + more)
    assert report.problems == [] and report.errors == []


# --- leaving the queue -----------------------------------------------------------------------


def test_a_writer_refused_while_queued_leaves_the_queue_and_passes_the_claim_on(
    make_store: Callable[..., SessionStore],
) -> None:
    """A queued writer whose expected tail went stale is handed the claim, and its CHECK
    answers CONFLICT: it leaves the queue and the claim goes straight to the next waiter.
    Leases here outlast the test's patience, so the next waiter can only finish if it was
    handed the claim."""
    hold = Pause("append.before_put")
    long = 600_000
    holder = make_store(fault_hook=hold, claim_ms=long)
    nonces: list[str] = []
    stale = make_store(fault_hook=lambda p, c: nonces.append(c["nonce"]) if p == "append.queued" else None,
                       claim_ms=long)
    nxt = make_store(claim_ms=long, max_wait_s=long / 1000)
    nxt.create_session("c")
    nxt.append_session_entries("c", [entry("a", None)])
    h = InThread(lambda: holder.append_session_entries("c", [entry("h", "a")]).seq)
    hold.wait_paused()
    s = InThread(lambda: stale.append_session_entries("c", [entry("s", "a")], "a"))
    wait_for(lambda: len(queued(holder, "c")) == 1, "the writer with an expected tail queued")
    n = InThread(lambda: nxt.append_session_entries("c", [entry("n", "a")]).seq)
    wait_for(lambda: len(queued(holder, "c")) == 2, "the next writer queued behind it")
    hold.release()
    assert h.result() == 2
    with pytest.raises(ConflictError):
        s.result()
    assert n.result() == 3
    assert nonces[0] not in queued(holder, "c")
    assert not holder.coord.client.exists(holder.coord.keys.turn("c", nonces[0]))
    assert [e["id"] for e in holder.load_session_entries("c")] == ["a", "h", "n"]


def test_a_holder_that_gives_up_passes_the_claim_on(make_store: Callable[..., SessionStore]) -> None:
    """The holder's append fails after CHECK (here: the object store unreachable at its
    PUT, with no retries left): it gives the claim to the next waiter rather than leave it
    to run out its lease."""
    long = 600_000
    hold = Pause("append.before_put")

    def fail(point: str, ctx: dict[str, Any]) -> None:
        hold(point, ctx)
        if point == "append.before_put":
            raise BackendUnavailableError("object store unreachable")

    holder = make_store(fault_hook=fail, claim_ms=long)
    nxt = make_store(claim_ms=long, max_wait_s=long / 1000)
    holder.create_session("g")
    h = InThread(lambda: holder.append_session_entries("g", [entry("h", None)]))
    hold.wait_paused()
    n = InThread(lambda: nxt.append_session_entries("g", [entry("n", None)]).seq)
    wait_for(lambda: len(queued(holder, "g")) == 1, "the next writer queued")
    hold.release()
    with pytest.raises(BackendUnavailableError):
        h.result()
    assert n.result() == 1
    assert [e["id"] for e in nxt.load_session_entries("g")] == ["n"]


# --- connections -----------------------------------------------------------------------------


def test_waiters_never_block_more_than_a_quarter_of_the_connection_pool(
    private_redis: Any, s3_url: str
) -> None:
    """Six threads of one store wait on one session with a pool of 8 connections: at most 2
    of them block in Redis at a time (the others poll), so the commands that hand them
    their turn always find a connection. They are still served in order of arrival."""
    url = private_redis.url + "?max_connections=8"
    hold = Pause("append.before_put")
    holder = SessionStore.from_url(s3_url, private_redis.url, fault_hook=hold, claim_ms=30_000, **NO_GROUPS)
    tickets = Tickets()
    shared = SessionStore.from_url(s3_url, url, fault_hook=tickets, **NO_GROUPS)
    probe = private_redis.client()
    try:
        holder.create_session("k")
        h = InThread(lambda: holder.append_session_entries("k", [entry("h", None)]).seq)
        hold.wait_paused()
        threads = [InThread(lambda i=i: shared.append_session_entries("k", [entry(f"t{i}", None)]).seq)
                   for i in range(6)]
        wait_for(lambda: len(queued(holder, "k")) == 6, "six waiters in the queue")
        blocked = []
        for _ in range(50):
            blocked.append(int(probe.info("clients")["blocked_clients"]))
            time.sleep(0.01)
        assert max(blocked) <= 2
        assert max(blocked) >= 1  # and they do block rather than all poll
        hold.release()
        assert h.result() == 1
        assert sorted(t.result() for t in threads) == [2, 3, 4, 5, 6, 7]
        assert len(tickets.served) == 6 and overtaken(tickets.served) == 0
    finally:
        probe.close()
        holder.close()
        shared.close()
