"""The log backend (``store/log_objects.py``): the object-store contract, and what only a log
has: records cut short, torn ends, seals, rewrites and removals, across threads, processes
and pauses."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from harness.pausing import InThread, Pause

from store.errors import ObjectExistsError, ObjectNotFoundError
from store.log_objects import _LOG_PREFIX, LogObjectStore
from store.object_store import ObjectStore
from store.testing import ObjectStoreContract


class TestLogObjectStore(ObjectStoreContract):
    @pytest.fixture
    def objects(self, tmp_path: Path) -> Iterator[ObjectStore]:
        store = LogObjectStore(tmp_path / "objects")
        yield store
        store.close()


class TestLogObjectStoreRewritingAlways(ObjectStoreContract):
    """The contract with every delete rewriting its log (no size threshold): each contract
    test then also runs through seals, successors and removals."""

    @pytest.fixture
    def objects(self, tmp_path: Path) -> Iterator[ObjectStore]:
        store = LogObjectStore(tmp_path / "objects", rewrite_min=0)
        yield store
        store.close()


class TestLogObjectStoreNamedTemporaries(ObjectStoreContract):
    """Where the filesystem has no ``O_TMPFILE``: new logs are written to a named temporary
    file beside them and linked from there."""

    @pytest.fixture
    def objects(self, tmp_path: Path) -> Iterator[ObjectStore]:
        store = LogObjectStore(tmp_path / "objects", rewrite_min=0)
        store._unnamed = False
        yield store
        store.close()


# --- what only a log has ----------------------------------------------------------------------


def _log_files(root: Path, *dirs: str) -> list[Path]:
    return sorted(p for p in root.joinpath(*dirs).iterdir() if p.name.startswith(_LOG_PREFIX))


def paused_removal(root: Path, key: str, data: bytes) -> tuple[Pause, InThread]:
    """A store that put ``key`` and is deleting it, stopped before its tidy-up takes the
    directory's exclusive lock (``log.tidy.before_lock``): its log sealed, nothing unlinked."""
    pause = Pause("log.tidy.before_lock")
    remover = LogObjectStore(root, fault_hook=pause)
    remover.put_if_absent(key, data)
    removal = InThread(lambda: remover.delete(key))
    pause.wait_paused()
    return pause, removal


def _put_record(store: LogObjectStore, log_file: Path, name: str, data: bytes) -> bytes:
    """A whole PUT record for ``log_file``, as a writer of ``store`` would append it."""
    file_id = log_file.read_bytes()[8:24]
    body = store._put_body(name, os.urandom(16), b"{}", data)
    return store._record(file_id, body)


def _fresh(root: Path) -> LogObjectStore:
    return LogObjectStore(root)


@pytest.mark.parametrize("cut", ["header", "half", "all_but_one"])
def test_a_record_cut_short_is_skipped_by_every_reader(tmp_path: Path, cut: str) -> None:
    """A writer killed inside its write (or a full disk) leaves part of a record, and later
    writers append after it: readers skip it and find every record after it."""
    root = tmp_path / "objects"
    store = LogObjectStore(root)
    store.put_if_absent("d/a", b"A")
    (log_file,) = _log_files(root, "d")
    record = _put_record(store, log_file, "ghost", b"G" * 5000 + b"\xd3SR1" * 50)
    keep = {"header": 20, "half": len(record) // 2, "all_but_one": len(record) - 1}[cut]
    with open(log_file, "ab") as f:
        f.write(record[:keep])
    assert _fresh(root).head("d/ghost") is None  # the end: "not there yet"
    other = LogObjectStore(root)
    other.put_if_absent("d/b", b"B")
    with pytest.raises(ObjectExistsError):
        other.put_if_absent("d/a", b"A2")
    store.put_if_absent("d/c", b"C")  # a process whose index predates the cut record
    for reader in (store, other, _fresh(root)):
        assert [i.key for i in reader.list("d/")] == ["d/a", "d/b", "d/c"]
        assert [reader.get(k).data for k in ("d/a", "d/b", "d/c")] == [b"A", b"B", b"C"]
        with pytest.raises(ObjectNotFoundError):
            reader.get("d/ghost")


def test_a_torn_end_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """After a power loss the log may end in part of a record nobody acknowledged (or in
    zeros): every acknowledged object before it reads back, and writes go on after it."""
    root = tmp_path / "objects"
    store = LogObjectStore(root)
    for i in range(5):
        store.put_if_absent(f"d/{i}", str(i).encode())
    (log_file,) = _log_files(root, "d")
    whole = log_file.read_bytes()
    torn = _put_record(store, log_file, "5", b"five")
    log_file.write_bytes(whole + torn[: len(torn) - 3] + bytes(4096))
    after = _fresh(root)
    assert [i.key for i in after.list("d/")] == [f"d/{i}" for i in range(5)]
    after.put_if_absent("d/5", b"5 again")
    assert _fresh(root).get("d/5").data == b"5 again"
    assert [_fresh(root).get(f"d/{i}").data for i in range(5)] == [str(i).encode() for i in range(5)]


def test_records_of_another_store_or_log_are_not_records_here(tmp_path: Path) -> None:
    """A record's MAC is keyed with the store's secret and salted with its log's id: bytes
    copied from another store's log, or from another log of this store (a block freed by a
    rewrite that a crash leaves at the end of a file), never count."""
    root = tmp_path / "objects"
    store = LogObjectStore(root)
    store.put_if_absent("d/a", b"A")
    store.put_if_absent("e/a", b"A")
    (log_d,) = _log_files(root, "d")
    (log_e,) = _log_files(root, "e")
    stranger = LogObjectStore(tmp_path / "other")
    stranger.put_if_absent("d/x", b"x")
    (log_x,) = _log_files(tmp_path / "other", "d")
    foreign = _put_record(stranger, log_x, "evil", b"from another store")
    sibling = _put_record(store, log_e, "evil", b"from another log")
    with open(log_d, "ab") as f:
        f.write(foreign + sibling)
    store.put_if_absent("d/b", b"B")
    assert [i.key for i in _fresh(root).list("d/")] == ["d/a", "d/b"]


def test_a_rewrite_keeps_every_live_object_with_its_time_and_identity(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    store = LogObjectStore(root, rewrite_min=0)
    for i in range(20):
        store.put_if_absent(f"d/{i:02d}", bytes([i]) * 100, {"i": str(i)})
    before = {k: _fresh(root).get(k) for k in (f"d/{i:02d}" for i in range(10, 20))}
    seen = before["d/15"]
    store.delete_many([f"d/{i:02d}" for i in range(10)])  # dead > live: rewritten
    (log_file,) = _log_files(root, "d")
    assert log_file.name != f"{_LOG_PREFIX}00000000"
    after = _fresh(root)
    for key, obj in before.items():
        got = after.get(key)
        assert (got.data, got.metadata, got.last_modified_ms, got.etag) == (
            obj.data, obj.metadata, obj.last_modified_ms, obj.etag)
    assert after.delete_if_unchanged("d/15", seen) is True
    assert after.head("d/15") is None


def test_removing_the_last_object_removes_the_directory(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    store = LogObjectStore(root)
    store.put_if_absent("s/x/1", b"1")
    store.put_if_absent("s/x/2", b"2")
    store.delete_many(["s/x/1", "s/x/2"])
    assert not (root / "s").exists()
    store.put_if_absent("s/x/1", b"again")  # a process that still has the old log cached
    assert _fresh(root).get("s/x/1").data == b"again"


def test_an_object_is_never_older_than_it_is(tmp_path: Path) -> None:
    """GC trusts an object's time not to be early: it is read after the write, by the
    writer, or when a reader first meets the object."""
    root = tmp_path / "objects"
    pause = Pause("log.put.written", lambda ctx: ctx["key"] == "d/k")
    writer = LogObjectStore(root, fault_hook=pause)
    writer.put_if_absent("d/first", b"x")
    before_ms = time.time_ns() // 1_000_000
    put = InThread(lambda: writer.put_if_absent("d/k", b"v"))
    pause.wait_paused()
    time.sleep(0.05)
    met = _fresh(root).get("d/k")  # visible, not acknowledged: its writer has written no time
    pause.release()
    put.result()
    assert met.last_modified_ms >= before_ms + 50
    later = _fresh(root).get("d/k")
    assert before_ms <= later.last_modified_ms <= met.last_modified_ms


# --- pauses across seals, rewrites and removals -----------------------------------------------


def test_a_writer_paused_before_its_write_while_the_log_is_removed(tmp_path: Path) -> None:
    """The writer resolved the log, paused; meanwhile its last object was deleted, so the log
    was sealed, unlinked and its directory removed. The write lands in the removed file after
    the seal: void, and the writer creates the directory's log again and wins there."""
    root = tmp_path / "objects"
    pause = Pause("log.put.before_write", lambda ctx: ctx["key"] == "d/k")
    writer = LogObjectStore(root, fault_hook=pause)
    writer.put_if_absent("d/old", b"old")
    put = InThread(lambda: writer.put_if_absent("d/k", b"mine"))
    pause.wait_paused()
    other = LogObjectStore(root)
    other.delete("d/old")
    assert not (root / "d").exists()
    pause.release()
    put.result()
    assert _fresh(root).get("d/k").data == b"mine"
    assert [i.key for i in _fresh(root).list("d/")] == ["d/k"]


def test_a_writer_paused_after_its_write_while_the_log_is_rewritten(tmp_path: Path) -> None:
    """Written before the seal, decided after it: the rewrite carried the object into the
    successor (whoever made it), and the writer's acknowledgement stands."""
    root = tmp_path / "objects"
    pause = Pause("log.put.written", lambda ctx: ctx["key"] == "d/k")
    writer = LogObjectStore(root, fault_hook=pause)
    for i in range(10):
        writer.put_if_absent(f"d/{i}", b"x" * 200)
    put = InThread(lambda: writer.put_if_absent("d/k", b"mine"))
    pause.wait_paused()
    other = LogObjectStore(root, rewrite_min=0)
    other.delete_many([f"d/{i}" for i in range(10)])  # sealed, successor with d/k only
    assert len(_log_files(root, "d")) == 1
    pause.release()
    put.result()
    assert _fresh(root).get("d/k").data == b"mine"
    with pytest.raises(ObjectExistsError):
        writer.put_if_absent("d/k", b"again")


def test_a_sealer_paused_making_its_successor_blocks_no_writer(tmp_path: Path) -> None:
    """A rewrite sealed the log and paused while making the successor (holding the shared
    lock of the directory): writers meet the seal, make the successor themselves and go on;
    only an unlink in the directory (which takes the exclusive lock) waits for the sealer."""
    root = tmp_path / "objects"
    pause = Pause("log.link.before", lambda ctx: ctx["gen"] > 0)
    sealer = LogObjectStore(root, fault_hook=pause)
    for i in range(6):
        sealer.put_if_absent(f"d/{i}", b"x" * 100)
    rewrite = InThread(lambda: sealer.delete_many([f"d/{i}" for i in range(4)]))
    pause.wait_paused()
    other = LogObjectStore(root)
    other.put_if_absent("d/new", b"new")
    other.put_if_absent("d/newer", b"newer")
    with pytest.raises(ObjectExistsError):
        other.put_if_absent("d/5", b"taken")
    assert sorted(i.key for i in _fresh(root).list("d/")) == ["d/4", "d/5", "d/new", "d/newer"]
    pause.release()
    rewrite.result()
    assert sorted(i.key for i in _fresh(root).list("d/")) == ["d/4", "d/5", "d/new", "d/newer"]
    assert _fresh(root).get("d/new").data == b"new"
    assert len(_log_files(root, "d")) == 1  # the sealer's tidy-up unlinked the sealed log


def test_a_delete_leaves_no_deleted_bytes_on_disk(tmp_path: Path) -> None:
    """Erasure: once a delete returns, the deleted object's bytes are in no log file (the
    log it was in is rewritten without it and unlinked), as an unlinked file's would be."""
    root = tmp_path / "objects"
    store = LogObjectStore(root)
    store.put_if_absent("d/keep", b"kept bytes")
    store.put_if_absent("d/secret", b"PERSONAL-DATA-1234")
    with pytest.raises(ObjectExistsError):
        store.put_if_absent("d/keep", b"LOSING-CREATE-5678")
    store.delete("d/secret")
    files = [p for p in root.rglob("*") if p.is_file()]
    assert not any(b"PERSONAL-DATA-1234" in p.read_bytes() for p in files)
    assert not any(b"LOSING-CREATE-5678" in p.read_bytes() for p in files)
    assert _fresh(root).get("d/keep").data == b"kept bytes"


def test_a_remover_paused_before_unlinking_never_unlinks_a_later_log(tmp_path: Path) -> None:
    """The remover sealed an emptied log and paused before its exclusive lock. Meanwhile the
    directory went on: a successor was made, emptied, removed with its directory, and the
    directory begun again with a new log of the same name as the remover's. The remover
    checks under its lock that the name is still its file: the new log stays."""
    root = tmp_path / "objects"
    pause, removal = paused_removal(root, "d/a", b"a")
    assert [p.name for p in _log_files(root, "d")] == [f"{_LOG_PREFIX}00000000"]
    other = LogObjectStore(root)
    other.put_if_absent("d/b", b"b")  # meets the seal: successor .log.00000001
    other.delete("d/b")  # emptied: .log.00000000 and .log.00000001 unlinked, d/ removed
    assert not (root / "d").exists()
    other.put_if_absent("d/c", b"c")  # begun again: a new .log.00000000
    assert [p.name for p in _log_files(root, "d")] == [f"{_LOG_PREFIX}00000000"]
    pause.release()
    removal.result()
    assert _fresh(root).get("d/c").data == b"c"


# --- processes ----------------------------------------------------------------------------------


def _race(root: str, who: int, keys: int, queue: "mp.Queue[tuple[int, list[int]]]") -> None:
    store = LogObjectStore(root)
    won = []
    for k in range(keys):
        try:
            store.put_if_absent(f"d/{k:04d}", f"{who}".encode() * 100)
            won.append(k)
        except ObjectExistsError:
            pass
    queue.put((who, won))


def test_processes_racing_for_the_same_keys_agree_on_one_winner_each(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    LogObjectStore(root)
    ctx = mp.get_context("spawn")
    queue: "mp.Queue[tuple[int, list[int]]]" = ctx.Queue()
    keys = 300
    procs = [ctx.Process(target=_race, args=(str(root), who, keys, queue)) for who in range(4)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    winners: dict[int, int] = {}
    for who, won in results.items():
        for k in won:
            assert k not in winners, f"key {k} won by {winners[k]} and {who}"
            winners[k] = who
    assert sorted(winners) == list(range(keys))
    reader = _fresh(root)
    for k, who in winners.items():
        assert reader.get(f"d/{k:04d}").data == f"{who}".encode() * 100


_CHURN = r"""
import os, sys
sys.path.insert(0, sys.argv[3])
from store.log_objects import LogObjectStore
root, who = sys.argv[1], int(sys.argv[2])
store = LogObjectStore(root, rewrite_min=4096)
i = 0
while True:
    key = f"d/{who}-{i:06d}"
    store.put_if_absent(key, (key * 40).encode())
    print(key, flush=True)  # acknowledged
    junk = f"d/junk-{who}-{i:06d}"
    store.put_if_absent(junk, b"j" * 300)
    store.delete(junk)  # dead weight: the log is rewritten again and again
    i += 1
"""


def test_processes_killed_anywhere_lose_nothing_acknowledged(tmp_path: Path) -> None:
    """Writers that also delete (so the log is sealed and rewritten all the time) are killed
    with SIGKILL at arbitrary points, three times over; every object a writer acknowledged
    reads back whole, and nothing else but junk that was never deleted is there."""
    root = tmp_path / "objects"
    LogObjectStore(root)
    repo = str(Path(__file__).resolve().parents[1])
    acked: list[str] = []
    for round_no in range(3):
        procs = [subprocess.Popen([sys.executable, "-c", _CHURN, str(root), f"{round_no}{w}", repo],
                                  stdout=subprocess.PIPE, text=True) for w in range(3)]
        time.sleep(1.5 + round_no * 0.7)
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            out, _ = p.communicate(timeout=30)
            acked.extend(out.split())
    assert len(acked) > 30, "the writers made too little progress to test anything"
    reader = _fresh(root)
    listed = {i.key for i in reader.list("d/")}
    for key in acked:
        assert reader.get(key).data == (key * 40).encode(), key
    assert {k for k in listed if "junk" not in k} >= set(acked)
    # Besides junk, only a writer's last object may be there unacknowledged (killed after
    # its create, before it printed it).
    unacked = {k for k in listed if "junk" not in k} - set(acked)
    assert len(unacked) <= 9, unacked
    newest = _log_files(root, "d")[-1]
    assert int(newest.name[len(_LOG_PREFIX):]) > 3, "the log was hardly ever rewritten"


def test_an_object_file_of_the_file_backend_in_a_log_store_is_refused_loudly(tmp_path: Path) -> None:
    """A process of the file backend (an earlier version, or ?format=files) writing into a log
    store would split it in two without a word: the log backend refuses a directory where
    it meets such a file, with an error that says what happened."""
    from store.errors import BackendRefusedError
    from store.file_objects import FileObjectStore

    root = tmp_path / "objects"
    LogObjectStore(root).put_if_absent("s/a/header.json", b"log")
    FileObjectStore(root).put_if_absent("s/a/seg-by-an-old-process", b"file")
    for op in (lambda st: st.get("s/a/header.json"), lambda st: st.put_if_absent("s/a/x", b"x"),
               lambda st: list(st.list("s/"))):
        with pytest.raises(BackendRefusedError, match="file backend"):
            op(_fresh(root))
