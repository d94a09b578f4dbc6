"""Redis bounded by activity: an idle session's id index and recent-segments cache expire.

Each commit renews them for ``StoreOptions.idle_state_ttl_ms``; once a session is idle that
long, Redis keeps only its tail hash and its listing summary, a few hundred bytes whatever the
session's length. The next append rebuilds the index from the object store (which holds every
entry), so a re-send of any batch, however old, still returns its original result, and a
parent from the start of the session is still known. Expiry is Redis's own (real TTLs, real
time): nothing here deletes a key by hand.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest
from harness.pausing import FakeClock, InThread, Pause
from history import Op, attempt, check_history

from compactor import Compactor, CompactorOptions
from store import SessionStore
from store.errors import IdCollisionError

TTL_MS = 400
GRACE_MS = 60_000


def entry(eid: str, parent: str | None, text: str = "x" * 40) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent,
            "timestamp": "2026-11-26T10:00:00.000Z",
            "message": {"role": "user", "content": text}}


def fill(store: SessionStore, sid: str, entries: int, batch: int = 1, tag: str = "") -> list[str]:
    """Append ``entries`` entries in batches, chained from the tail; ids ``<sid><tag>-<i>``."""
    parent = store.get_tail(sid).last_entry_id or None
    ids: list[str] = []
    for start in range(0, entries, batch):
        chunk = []
        for i in range(start, min(entries, start + batch)):
            eid = f"{sid}{tag}-{i}"
            chunk.append(entry(eid, parent))
            parent = eid
            ids.append(eid)
        store.append_session_entries(sid, chunk)
    return ids


def session_keys(store: SessionStore, sid: str) -> list[bytes]:
    return sorted(store.coord.client.scan_iter(match=f"{store.coord.keys.prefix}:{{{sid}}}:*"))


def redis_bytes(store: SessionStore, sid: str) -> int:
    client = store.coord.client
    return sum(int(client.memory_usage(k) or 0) for k in session_keys(store, sid))


def wait_idle(store: SessionStore, *sids: str, claims: bool = False, timeout: float = 20.0) -> None:
    """Until Redis itself expired the sessions' id indexes and caches (``claims``: and the
    last writer's claim, which lapses after its lease)."""
    keys = store.coord.keys
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        names = [k for s in sids for k in (keys.ids(s), keys.recent(s)) + ((keys.claim(s),) if claims else ())]
        if not store.coord.client.exists(*names):
            return
        time.sleep(0.05)
    raise AssertionError(f"the id indexes of {sids} never expired")


def test_an_idle_sessions_redis_state_does_not_grow_with_its_length(
    make_store: Callable[..., SessionStore],
) -> None:
    store = make_store(idle_state_ttl_ms=TTL_MS, claim_ms=TTL_MS)  # the claim lapses too
    store.create_session("short")
    store.create_session("long")
    fill(store, "short", 10)
    fill(store, "long", 2_000, batch=50)
    active_short, active_long = redis_bytes(store, "short"), redis_bytes(store, "long")
    assert active_long > 20 * active_short  # while active, the long one's index is large
    client, keys = store.coord.client, store.coord.keys
    assert 0 < client.pttl(keys.ids("long")) <= TTL_MS
    wait_idle(store, "short", "long", claims=True)
    idle_short, idle_long = redis_bytes(store, "short"), redis_bytes(store, "long")
    # The tail and the summary remain: the same few hundred bytes whatever the length (the
    # digits of the counts differ).
    left = {k.rsplit(b":", 1)[1] for k in session_keys(store, "long")}
    assert left == {b"tail", b"summary"}
    assert idle_long <= idle_short + 64, (idle_short, idle_long)
    assert idle_long < active_long / 50
    # Listing still reads the idle sessions from Redis alone: no session is read.
    store.objects.requests.clear()
    page = store.list_sessions(limit=10)
    assert {s.session_id: s.entry_count for s in page.items} == {"short": 10, "long": 2_000}
    assert store.objects.requests["get"] == 0


def test_a_resend_of_an_old_batch_after_expiry_returns_its_original_result(
    make_store: Callable[..., SessionStore],
) -> None:
    store = make_store(idle_state_ttl_ms=TTL_MS, compact_after_segments=0)
    store.create_session("s")
    first = [entry("a0", None), entry("a1", "a0")]
    original = store.append_session_entries("s", first)
    fill(store, "s", 30, batch=3)
    # Compact and collect: the first batch's segment is merged into a base and deleted.
    clock = FakeClock()
    compactor = Compactor(store, CompactorOptions(grace_ms=GRACE_MS, worker="t"), now=clock)
    assert compactor.compact_session("s").outcome == "compacted"
    clock.advance(2 * GRACE_MS)
    compactor.gc_session("s")
    inc = store.get_header("s").incarnation
    assert store.objects.head(store.layout.segment("s", inc, original.seq)) is None
    tail = store.get_tail("s")
    wait_idle(store, "s")

    other = make_store(idle_state_ttl_ms=TTL_MS)  # another process: nothing cached
    again = other.append_session_entries("s", first)
    assert again == original
    assert other.get_tail("s").seq == tail.seq  # nothing was written
    wait_idle(other, "s")
    with pytest.raises(IdCollisionError):
        other.append_session_entries("s", [entry("a0", None, text="other content")])
    assert other.get_tail("s").seq == tail.seq
    # A parent from the start of the session is known again.
    wait_idle(other, "s")
    branch = other.append_session_entries("s", [entry("b0", "a1")])
    assert branch.seq == tail.seq + 1
    assert [e["id"] for e in other.load_session_entries("s")][-1] == "b0"


@pytest.mark.parametrize("point", ["append.before_put", "append.after_put"])
def test_a_writer_paused_while_its_sessions_index_expires(
    make_store: Callable[..., SessionStore], point: str
) -> None:
    """A writer stops after CHECK (or after its PUT, before COMMIT) for longer than the idle
    TTL; another writer appends meanwhile and the index expires again. The paused writer's
    batch lands once, at the slot the object store gave it, and nothing is lost."""
    store = make_store(idle_state_ttl_ms=TTL_MS)
    store.create_session("p")
    ops: list[Op] = []
    for b in range(5):
        batch = [entry(f"p-{4 * b + i}", f"p-{4 * b + i - 1}" if 4 * b + i else None) for i in range(4)]
        ops.append(attempt(store, "p", batch, None))
    pause = Pause(point)
    paused = make_store(idle_state_ttl_ms=TTL_MS, fault_hook=pause)
    other = make_store(idle_state_ttl_ms=TTL_MS)
    job = InThread(lambda: attempt(paused, "p", [entry("paused", None)], None))
    pause.wait_paused()
    wait_idle(store, "p")
    ops.append(attempt(other, "p", [entry("meanwhile", None)], None))
    wait_idle(store, "p")
    pause.release()
    ops.append(job.result())
    assert [op.outcome for op in ops] == ["ok"] * 7
    ids = [e["id"] for e in other.load_session_entries("p")]
    assert ids.count("paused") == 1 and ids.count("meanwhile") == 1 and len(ids) == 22
    # A re-send of the paused batch, after yet another expiry, is recognised.
    wait_idle(store, "p")
    seq = paused.append_session_entries("p", [entry("paused", None)]).seq
    assert seq == ops[-1].seq
    report = check_history(other, ops)
    assert report.problems == [] and report.errors == []


def test_with_no_ttl_a_rebuilt_index_never_expires(make_store: Callable[..., SessionStore]) -> None:
    store = make_store(idle_state_ttl_ms=0)
    store.create_session("n")
    fill(store, "n", 5)
    keys, client = store.coord.keys, store.coord.client
    assert client.pttl(keys.ids("n")) == -1
    client.delete(keys.ids("n"))  # lost keys (eviction): the next append rebuilds the index
    store.append_session_entries("n", [entry("n-5", "n-4")])
    # The rebuild's scratch hash expires (a rebuild that dies leaves nothing); the index
    # installed from it must not.
    assert client.hlen(keys.ids("n")) == 6 and client.pttl(keys.ids("n")) == -1
