"""CHECK and COMMIT through redis-py's client, against a real redis-server: what a connection
goes through (a script cache flushed, every connection killed), and the append that pauses
after its CHECK answered, before its PUT, and carries on with an answer that is stale by then.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from harness.pausing import FakeClock, InThread, Pause
from test_pauses import GRACE_MS, compactor_for, entry

from coordination.redis import Coordinator
from store import SessionStore
from store.errors import ConflictError
from store.backends.objects import FileObjectStore
from store.formats.records import StoreOptions


def test_a_flushed_script_cache_loads_the_scripts_again(redis_url: str, redis_prefix: str) -> None:
    """Redis forgets its scripts (SCRIPT FLUSH, a restart without persistence): the next CHECK
    and COMMIT load them again through the client and answer as before."""
    coord = Coordinator.from_url(redis_url, prefix=redis_prefix)
    coord.install("s1", "inc", seq=0, last="", count=0, ids=())
    assert coord.check("s1", "inc", ["a"], ["h"], [], None).code == "OK"
    coord.client.script_flush()
    assert coord.check("s1", "inc", ["a"], ["h"], [], None).code == "OK"
    coord.client.script_flush()
    assert coord.commit("s1", "inc", 0, ["a"], ["h"]).code == "OK"
    assert coord.check("s1", "inc", ["a"], ["h"], [], None).code == "DUPLICATE"
    coord.close()


def test_killed_connections_are_made_again_by_the_next_call(redis_url: str, redis_prefix: str) -> None:
    """Every connection of the client is reset under it: the retry policy sends CHECK again on
    a new connection, and its answer is the one CHECK gives."""
    coord = Coordinator.from_url(redis_url, prefix=redis_prefix)
    assert coord.check("s1", "inc", ["a"], ["h"], [], None).code == "HYDRATE"  # connected
    coord.client.client_kill_filter(_type="normal", skipme=False)  # every connection, ours too
    assert coord.check("s1", "inc", ["a"], ["h"], [], None).code == "HYDRATE"
    coord.close()


# --- the append that pauses between CHECK and PUT -------------------------------------------


def _file_store(root: Path, redis_url: str, redis_prefix: str, hook: object = None) -> SessionStore:
    objects = FileObjectStore(root, fault_hook=hook)  # type: ignore[arg-type]
    coord = Coordinator.from_url(redis_url, prefix=redis_prefix)
    return SessionStore(objects, coord, options=StoreOptions(redis_prefix=redis_prefix))


def _before_segment_link() -> Pause:
    """A pause of a segment's create, its file written, before its link (the store's own
    objects, such as its conditional-write probe, pass)."""
    return Pause("file.put.before_link", when=lambda ctx: "/seg/" in ctx["key"])


def _ids(store: SessionStore, sid: str) -> list[str]:
    return [e["id"] for e in store.read_session(sid).entries]


@pytest.mark.parametrize("strict", [False, True], ids=["no-expected-tail", "expected-tail"])
def test_an_append_paused_after_its_check(
    tmp_path: Path, redis_url: str, redis_prefix: str, strict: bool
) -> None:
    """Writer A's CHECK answered (slot 2 is free) and A paused before its segment's create. Writer B appended to slot 2 meanwhile. A carries on with its stale
    answer: its create at slot 2 is refused (B's), it rolls B's segment forward and checks
    again: appended at slot 3 (no expected tail), or refused as a conflict (A expected the
    tail it read before B's append): nothing of A's is then visible, nothing of B's lost."""
    root = tmp_path / "objects"
    pause = _before_segment_link()
    a = _file_store(root, redis_url, redis_prefix, pause)
    b = _file_store(root, redis_url, redis_prefix)
    sid = b.create_session(cwd="/w").session_id
    b.append_session_entries(sid, [entry("e1", None)])
    run = InThread(lambda: a.append_session_entries(sid, [entry("a2", "e1")], "e1" if strict else None))
    pause.wait_paused()
    assert b.append_session_entries(sid, [entry("b2", "e1")]).seq == 2
    pause.release()
    if strict:
        with pytest.raises(ConflictError):
            run.result()
        assert _ids(b, sid) == ["e1", "b2"]
        assert _ids(_file_store(root, redis_url, redis_prefix), sid) == ["e1", "b2"]
    else:
        assert run.result().seq == 3
        assert _ids(b, sid) == ["e1", "b2", "a2"]
    assert sorted(p.name for p in (root / ".tmp").iterdir()) == []
    a.close()
    b.close()


def test_an_append_paused_after_its_check_past_compaction_and_gc(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    """As above, but while A is paused B's segment is merged by the compactor and its slot
    deleted by GC a grace period later: the slot A's stale answer names is free again. A's
    create there is a zombie: COMMIT refuses it, A deletes it and checks again, and lands
    after B's entry. Every reader sees e1, b2, a2, once each."""
    root = tmp_path / "objects"
    pause = _before_segment_link()
    clock = FakeClock()
    a = _file_store(root, redis_url, redis_prefix, pause)
    b = _file_store(root, redis_url, redis_prefix)
    sid = b.create_session(cwd="/w").session_id
    b.append_session_entries(sid, [entry("e1", None)])
    run = InThread(lambda: a.append_session_entries(sid, [entry("a2", "e1")]))
    pause.wait_paused()
    b.append_session_entries(sid, [entry("b2", "e1")])
    compactor = compactor_for(b, clock)
    assert compactor.compact_session(sid).outcome == "compacted"
    clock.advance(GRACE_MS + 1)
    compactor.gc_session(sid)
    inc = b.get_header(sid).incarnation
    assert b.objects.head(b.layout.segment(sid, inc, 2)) is None  # the slot is free again
    pause.release()
    result = run.result()
    assert result.seq >= 3
    for reader in (b, _file_store(root, redis_url, redis_prefix)):
        assert _ids(reader, sid) == ["e1", "b2", "a2"]
    a.close()
    b.close()


def test_concurrent_appends_of_two_stores_lose_nothing(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    """Threads of two stores (each with its own connections) append to one session: every
    acknowledged entry is read back once, in the segment it was acknowledged with (queued
    writers may share a segment: group commit), segments in order."""
    root = tmp_path / "objects"
    stores = [_file_store(root, redis_url, redis_prefix) for _ in range(2)]
    sid = stores[0].create_session(cwd="/w").session_id
    acked: list[tuple[int, str]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(25):
                eid = f"t{t}-{i}"
                res = stores[t % 2].append_session_entries(sid, [entry(eid, None)])
                with lock:
                    acked.append((res.seq, eid))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors[:3]
    data = stores[0].read_session(sid)
    stored = [(seq, str(e["id"])) for e, seq in zip(data.entries, data.seqs)]
    assert sorted(stored) == sorted(acked)  # each acknowledged entry once, in its segment
    assert [seq for seq, _ in stored] == sorted(seq for seq, _ in stored)
    assert len(stored) == 100
    for s in stores:
        s.close()
