"""Adversarial tests of the log backend (``store/log_objects.py``): interleavings of writers,
deleters, sealers, successor makers and removers across threads and processes, with pauses
(fault hooks, and a debugger-style breakpoint for points that have no hook), SIGKILL at
chosen points, records cut short, and directory listings racing rewrites.

Everything runs on real files, real processes and threads; no os call is replaced. Where a
point of the protocol has no fault hook, ``PauseIn`` stops the thread there with
``sys.settrace`` (a breakpoint: the code of the store runs unchanged), and a child process is
killed at such a point by the same mechanism.

Tests whose docstring starts "Found in review" failed against the first version of the
backend; each names the interleaving, and the code now handles it.
"""

from __future__ import annotations

import linecache
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, Callable

import pytest
from harness.pausing import InThread, Pause

from store.errors import ObjectExistsError, ObjectNotFoundError
from store.log_objects import _LOG_PREFIX, LogObjectStore
from test_log_objects import _log_files, paused_removal

REPO = str(Path(__file__).resolve().parents[1])


# --- helpers --------------------------------------------------------------------------------------


def _files_holding(root: Path, needle: bytes) -> list[str]:
    """Every file below ``root`` (by name) whose bytes contain ``needle``."""
    found = []
    for p in root.rglob("*"):
        try:
            if p.is_file() and needle in p.read_bytes():
                found.append(str(p.relative_to(root)))
        except FileNotFoundError:
            pass
    return found


def _fresh(root: Path, **kw: Any) -> LogObjectStore:
    """A store with nothing cached: what another process sees."""
    return LogObjectStore(root, **kw)


class PauseIn:
    """Stop the thread running ``wrap(fn)`` when it enters ``function`` (a function of the
    store's code), or, given ``line``, at the first line of it whose source contains
    ``line``; ``when(frame)`` narrows it down. A breakpoint: nothing of the store is
    replaced, the thread simply stops there, as a process stopped by SIGSTOP would."""

    def __init__(self, function: str, line: str | None = None,
                 when: Callable[[FrameType], bool] = lambda frame: True) -> None:
        self.function, self.line, self.when = function, line, when
        self.reached = threading.Event()
        self.go = threading.Event()
        self.fired = False

    def _stop(self) -> None:
        self.fired = True
        self.reached.set()
        assert self.go.wait(120), "never released"

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and not self.fired and self.line is not None:
            source = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
            if self.line in source and self.when(frame):
                self._stop()
        return self._local

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if self.fired or code.co_name != self.function or f"{os.sep}store{os.sep}" not in code.co_filename:
            return None
        if self.line is None:
            if self.when(frame):
                self._stop()
            return None
        return self._local

    def wrap(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            sys.settrace(self._global)
            try:
                return fn()
            finally:
                sys.settrace(None)
        return run

    def wait_paused(self) -> None:
        assert self.reached.wait(60), f"never reached {self.function} {self.line or ''}"

    def release(self) -> None:
        self.go.set()


#: Prepended to child scripts: a way to die by SIGKILL at a line of the store's code.
_CHILD_PRELUDE = r"""
import linecache, os, signal, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
from store.log_objects import LogObjectStore

def die_at(function, line=None):
    '''SIGKILL this process when it reaches ``line`` of ``function`` (or enters it).'''
    def local(frame, event, arg):
        if event == "line" and line in linecache.getline(frame.f_code.co_filename, frame.f_lineno):
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return local
    def glob(frame, event, arg):
        if frame.f_code.co_name == function and "/store/" in frame.f_code.co_filename:
            if line is None:
                os.kill(os.getpid(), signal.SIGKILL)
            return local
        return None
    sys.settrace(glob)

def kill_at(point):
    '''A fault hook that kills this process by SIGKILL at ``point``.'''
    def hook(where, ctx):
        if where == point:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    return hook
"""


def _child(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (after the prelude) in a new interpreter; argv[2:] are ``args``."""
    code = _CHILD_PRELUDE + textwrap.dedent(script)
    return subprocess.run([sys.executable, "-c", code, REPO, *args], capture_output=True, text=True,
                          timeout=timeout)


# --- found in review: erasure broken when another process sealed the log and died ---------------------------


def test_a_delete_returns_only_after_its_bytes_left_the_disk_though_another_sealer_died(tmp_path: Path) -> None:
    """Found in review. The deleter D's tombstone lands in log 0 before a SEAL that another process S
    appends (S is deleting another object and is killed by SIGKILL right after its seal,
    before making the successor and unlinking the log). D's ``_maintain`` catches up, finds
    the log sealed, and returns: D's delete returns with the deleted bytes still in
    ``.log.00000000`` under its name. They stay there until a later delete in that
    directory removes an object (its tidy-up unlinks every superseded log): reads never
    finish S's rewrite, and neither do creates (a create that meets the seal makes the
    successor but never unlinks the sealed log). Now a deleter that finds its log sealed by
    another process finishes that rewrite (successor, then the tidy-up) before it returns."""
    root = tmp_path / "objects"
    base = LogObjectStore(root)
    base.put_if_absent("d/a", b"PERSONAL-DATA-AAAA")
    base.put_if_absent("d/b", b"b")
    base.put_if_absent("d/c", b"c")
    deleter = LogObjectStore(root)
    stop = PauseIn("_maintain")  # D: its tombstone written, caught up (a hit), fdatasynced
    delete = InThread(stop.wrap(lambda: deleter.delete("d/a")))
    stop.wait_paused()
    killed = _child("""
        store = LogObjectStore(sys.argv[2], fault_hook=kill_at("log.seal.written"))
        store.delete("d/b")
    """, str(root))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    stop.release()
    delete.result()  # D's delete returned
    reader = _fresh(root)
    assert reader.head("d/a") is None
    assert sorted(i.key for i in reader.list("d/")) == ["d/c"]
    _fresh(root).put_if_absent("d/later", b"l")  # a create in the directory meanwhile
    assert _files_holding(root, b"PERSONAL-DATA-AAAA") == []


# --- found in review: a delete that meets a removal in progress leaves a directory behind for good ----------


def test_two_deleters_of_a_directory_s_last_object_leave_no_directory(tmp_path: Path) -> None:
    """Found in review. Two processes delete a session's last object (two GC runs, or GC and
    delete_session). R's tombstone wins, R seals the emptied log and pauses before its
    exclusive lock (``log.tidy.before_lock``). D's delete finds the newest log sealed with
    no successor and makes one (``_delete``'s sealed branch calls ``_successor``) although
    nothing is live in it, then finds nothing to delete. R's tidy-up unlinks log 0 but not
    D's empty log 1, which is not R's: the directory stays, with an empty unsealed log that
    no later delete ever seals (a delete with nothing live writes nothing), and list_dirs
    names it for ever (the contract: list_dirs gives directories that hold objects). Now a
    deleter that meets a sealed log deletes only what is live as of its seal: here nothing."""
    root = tmp_path / "objects"
    pause, removal = paused_removal(root, "s/x/k", b"x")
    other = LogObjectStore(root)
    other.delete("s/x/k")
    pause.release()
    removal.result()
    _fresh(root).delete_many(["s/x/k"])  # later deletes change nothing
    assert list(_fresh(root).list_dirs("s/")) == []
    assert not (root / "s").exists(), sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_delete_that_lost_the_race_to_a_removal_recreates_no_directory(tmp_path: Path) -> None:
    """Found in review. D's delete found ``s/x/k`` live in an unsealed log and stopped before
    ``_make_durable`` (its log came from ``_current``: not durable yet). Meanwhile another
    process deleted the key: the log was sealed, unlinked, and ``s/x`` and ``s`` removed.
    D resumes: ``_make_durable`` walks to the directory with ``create=True`` and makes
    ``s/x`` again, empty; its tombstone lands after the seal (void); there is no log to
    retry in, so D returns, leaving two empty directories that list_dirs names and that
    nothing removes. Now the durability step walks to existing directories only."""
    root = tmp_path / "objects"
    base = LogObjectStore(root)
    base.put_if_absent("s/x/k", b"x")
    deleter = LogObjectStore(root)
    stop = PauseIn("_delete", line="if not log.durable")
    delete = InThread(stop.wrap(lambda: deleter.delete("s/x/k")))
    stop.wait_paused()
    base.delete("s/x/k")
    assert not (root / "s").exists()
    stop.release()
    delete.result()
    assert list(_fresh(root).list_dirs("")) == []
    assert not (root / "s").exists()


# --- found in review: named temporary files of a killed process keep deleted bytes ----------------------------


def test_a_successor_half_made_by_a_killed_process_leaves_no_copy_of_deleted_bytes(tmp_path: Path) -> None:
    """Found in review (filesystems without O_TMPFILE, where ``_link_new`` writes a named ``.tmp-*`` file
    beside the logs). A process making a successor is killed by SIGKILL after writing the
    temporary file, before linking and unlinking it. Nothing ever removes it: it holds every
    object live at that seal, so an object deleted later keeps its bytes on the disk under
    that name (erasure), and the directory can never be removed (rmdir: not empty). Now the
    tidy-up, under the exclusive lock, removes such files (a live maker holds the shared one)."""
    root = tmp_path / "objects"
    LogObjectStore(root)
    killed = _child("""
        store = LogObjectStore(sys.argv[2], rewrite_min=0)
        store._unnamed = False  # as on a filesystem without O_TMPFILE
        store.put_if_absent("d/secret", b"PERSONAL-DATA-TMP-1234")
        store.put_if_absent("d/junk", b"junk")
        die_at("_link_new", "os.link(tmp, name")
        store.delete("d/junk")  # rewrites the log: the successor holds d/secret
    """, str(root))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    later = LogObjectStore(root)
    later._unnamed = False
    assert later.get("d/secret").data == b"PERSONAL-DATA-TMP-1234"
    later.delete("d/secret")  # the directory's last object
    assert _files_holding(root, b"PERSONAL-DATA-TMP-1234") == []
    assert not (root / "d").exists(), sorted(p.name for p in (root / "d").iterdir())


# --- found in review: a directory listing that races a rewrite sees no log at all ---------------------------------

_CHURN = r"""
store = LogObjectStore(sys.argv[2], fsync=False, rewrite_min=0)
who, i = sys.argv[3], 0
print("started", flush=True)
while True:  # each delete rewrites the log: link .log.<g+1>, then unlink .log.<g>
    store.put_if_absent(f"top/j{who}-{i}", b"j")
    store.delete(f"top/j{who}-{i}")
    i += 1
"""


def test_reads_and_deletes_are_not_fooled_by_a_listing_that_raced_a_rewrite(tmp_path: Path) -> None:
    """Found in review. ``_resolve`` and ``_current`` list the directory without a lock to find its
    newest log. A listing (``getdents``) is not atomic when it takes more than one call (a
    directory with many entries: here, keys beside 1500 directories of keys): a log linked
    during it may be missed (it went in behind the cursor: ext4 and XFS list in hash order)
    and the log unlinked during it too (it went before the cursor reached it). A rewrite
    in another process does exactly that, link ``.log.<g+1>`` then unlink ``.log.<g>``, so
    the listing finds no log: ``head``/``get`` say an acknowledged object is not there,
    ``delete`` returns having deleted nothing (the object is still there after the delete
    returned, for good), ``delete_if_unchanged`` answers False. ``_tidy``, ``_successor``
    and ``_make_first`` list under the directory's flock and are safe: under the shared
    lock no log is unlinked, so a log there when it was taken is listed. Probabilistic: a
    few misses in a thousand reads here (ext4); the test stops at the first. Now a listing
    that finds no log, or only the sealed one it had, is made again under the shared lock."""
    root = tmp_path / "objects"
    setup = LogObjectStore(root, fsync=False)
    setup.put_if_absent("top/anchor", b"kept")
    for i in range(1500):
        os.mkdir(root / "top" / (f"sub{i:05d}-" + "x" * 200))
    churns = [subprocess.Popen([sys.executable, "-c", _CHILD_PRELUDE + _CHURN, REPO, str(root), str(w)],
                               stdout=subprocess.PIPE, text=True) for w in range(4)]
    missing = 0
    deleted: list[str] = []
    try:
        for churn in churns:
            assert churn.stdout is not None and churn.stdout.readline().strip() == "started"
        writer = LogObjectStore(root, fsync=False)
        deadline = time.monotonic() + 12
        n = 0
        while time.monotonic() < deadline and not missing:
            n += 1
            if _fresh(root, fsync=False).head("top/anchor") is None:
                missing += 1
            if n % 8 == 0:
                key = f"top/k{n}"
                writer.put_if_absent(key, b"v")
                _fresh(root, fsync=False).delete(key)
                deleted.append(key)
                if _fresh(root, fsync=False).head(key) is not None:
                    break  # a delete that returned without deleting
    finally:
        for churn in churns:
            churn.kill()
            churn.wait()
    final = {i.key for i in _fresh(root).list("top/")}  # nothing moves now: a true answer
    assert "top/anchor" in final
    assert sorted(final & set(deleted)) == [], "deletes that returned without deleting"
    assert missing == 0, f"an acknowledged object reported missing (after {n} reads)"


# --- cached logs and deleted bytes ---------------------------------------------------------------


def test_a_process_holding_an_unlinked_log_drops_it_at_its_next_use_of_the_store(tmp_path: Path) -> None:
    """A process that read an object keeps the log open in its cache; another process's
    delete rewrites the log and unlinks it, but an open fd keeps the old file's blocks, the
    deleted bytes included. The holder drops every cached log that was unlinked at its next
    use of the store (any key: a sweep at most once a second, here at every use), so the
    bytes outlive the delete only while a process that read them stays idle (docs/design.md,
    "The log backend": erasure). Shown through /proc: no fd of this process reaches them."""
    root = tmp_path / "objects"
    reader = LogObjectStore(root)
    reader._sweep_s = 0.0
    reader.put_if_absent("d/keep", b"k")
    reader.put_if_absent("d/secret", b"PERSONAL-DATA-FD-5678")
    assert reader.get("d/secret").data == b"PERSONAL-DATA-FD-5678"
    LogObjectStore(root).delete("d/secret")  # returned: rewritten, the old log unlinked
    assert _files_holding(root, b"PERSONAL-DATA-FD-5678") == []  # no name holds them

    def held_by_this_process() -> list[str]:
        found = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
                if target.startswith(str(root)) and target.endswith("(deleted)"):
                    with open(f"/proc/self/fd/{fd}", "rb") as f:
                        if b"PERSONAL-DATA-FD-5678" in f.read():
                            found.append(target)
            except OSError:
                pass
        return found

    assert held_by_this_process() != []  # the reader has not used the store since
    assert reader.head("e/unrelated") is None  # its next use, of any directory
    assert held_by_this_process() == []


# --- passing: interleavings the existing tests do not cover -------------------------------------------


def test_a_create_whose_parent_directory_is_pruned_mid_walk_walks_again(tmp_path: Path) -> None:
    """B walks to ``s/`` to create ``s/b/k`` and stops just before ``mkdir("b")``;
    meanwhile A deletes ``s/a/k``, the last object under ``s/``, and prunes ``s/a`` and
    ``s``. B's mkdir in the removed ``s`` fails with ENOENT: B walks (and makes) the path
    again and wins."""
    root = tmp_path / "objects"
    a = LogObjectStore(root)
    a.put_if_absent("s/a/k", b"x")
    b = LogObjectStore(root)
    stop = PauseIn("open_dir", line="os.mkdir(part", when=lambda f: f.f_locals.get("part") == "b")
    put = InThread(stop.wrap(lambda: b.put_if_absent("s/b/k", b"mine")))
    stop.wait_paused()
    a.delete("s/a/k")
    assert not (root / "s").exists()
    stop.release()
    put.result()
    assert _fresh(root).get("s/b/k").data == b"mine"


def test_delete_if_unchanged_paused_across_a_rewrite_spares_the_object_created_again(tmp_path: Path) -> None:
    """The conditional deleter compared the object and paused (``log.delete.matched``).
    Meanwhile the object was deleted (the log rewritten) and created again with the very
    same bytes and metadata, and the log rewritten once more. The tombstone names the nonce
    compared: it deletes nothing, and the deleter answers False."""
    root = tmp_path / "objects"
    pause = Pause("log.delete.matched")
    deleter = LogObjectStore(root, fault_hook=pause)
    other = LogObjectStore(root, rewrite_min=0)
    other.put_if_absent("d/keep", b"k")
    other.put_if_absent("d/h", b"same", {"m": "1"})
    seen = deleter.get("d/h")
    conditional = InThread(lambda: deleter.delete_if_unchanged("d/h", seen))
    pause.wait_paused()
    other.delete("d/h")
    other.put_if_absent("d/h", b"same", {"m": "1"})
    other.put_if_absent("d/junk", b"j")
    other.delete("d/junk")  # rewritten again: d/h carried with its nonce
    pause.release()
    assert conditional.result() is False
    again = _fresh(root).get("d/h")
    assert again.data == b"same" and again.etag != seen.etag


def test_creators_on_both_sides_of_a_seal_agree_on_one_winner(tmp_path: Path) -> None:
    """W1 resolved log 0 and paused before its write. The log is rewritten (sealed, log 1
    made). W2 creates the same key in log 1. W1's record lands after the seal (void); it
    retries in log 1 and loses to W2. Every process agrees: W2's object."""
    root = tmp_path / "objects"
    pause = Pause("log.put.before_write", lambda ctx: ctx["key"] == "d/k" and ctx["gen"] == 0)
    w1 = LogObjectStore(root, fault_hook=pause)
    w1.put_if_absent("d/a", b"a")
    w1.put_if_absent("d/b", b"b")
    first = InThread(lambda: w1.put_if_absent("d/k", b"from w1"))
    pause.wait_paused()
    LogObjectStore(root, rewrite_min=0).delete("d/a")  # sealed, rewritten into log 1
    w2 = LogObjectStore(root)
    w2.put_if_absent("d/k", b"from w2")
    pause.release()
    with pytest.raises(ObjectExistsError):
        first.result()
    for reader in (w1, w2, _fresh(root)):
        assert reader.get("d/k").data == b"from w2"
    assert [p.name for p in _log_files(root, "d")] == [f"{_LOG_PREFIX}00000001"]


def test_a_sealer_killed_between_its_seal_and_the_successor(tmp_path: Path) -> None:
    """A deleter is killed (SIGKILL) right after its SEAL reached the disk: log 0 is sealed,
    the newest, with no successor. Readers answer from its state at the seal; racing
    creators of one key (in threads of two stores) make the successor, and exactly one
    wins; the next delete finishes the rewrite and unlinks log 0."""
    root = tmp_path / "objects"
    base = LogObjectStore(root)
    for k in "abc":
        base.put_if_absent(f"d/{k}", k.encode())
    killed = _child("""
        LogObjectStore(sys.argv[2], fault_hook=kill_at("log.seal.written")).delete("d/a")
    """, str(root))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert [p.name for p in _log_files(root, "d")] == [f"{_LOG_PREFIX}00000000"]
    assert sorted(i.key for i in _fresh(root).list("d/")) == ["d/b", "d/c"]
    assert base.head("d/a") is None
    stores = [LogObjectStore(root), LogObjectStore(root)]
    start = threading.Barrier(4)

    def create(store: LogObjectStore, who: int) -> bool:
        start.wait()
        try:
            store.put_if_absent("d/new", f"{who}".encode())
            return True
        except ObjectExistsError:
            return False

    racers = [InThread(lambda s=stores[i % 2], w=i: create(s, w)) for i in range(4)]
    won = [r.result() for r in racers]
    assert won.count(True) == 1
    winner = won.index(True)
    for reader in (*stores, base, _fresh(root)):
        assert reader.get("d/new").data == f"{winner}".encode()
    _fresh(root).delete("d/b")
    assert sorted(i.key for i in _fresh(root).list("d/")) == ["d/c", "d/new"]
    assert len(_log_files(root, "d")) == 1


def test_a_record_cut_short_whose_length_swallows_the_seal(tmp_path: Path) -> None:
    """A writer killed inside its write left a record whose length field claims far more
    than was written; the log is then sealed (the SEAL lies inside the extent the cut
    record claims) and void records land after the seal. Every reader, old index or new,
    skips the cut record, stops at the SEAL, and agrees on the state."""
    root = tmp_path / "objects"
    store = LogObjectStore(root, rewrite_min=0)
    store.put_if_absent("d/a", b"A")
    store.put_if_absent("d/b", b"B")
    old_reader = LogObjectStore(root)
    assert old_reader.get("d/a").data == b"A"
    (log_file,) = _log_files(root, "d")
    file_id = log_file.read_bytes()[8:24]
    cut = store._record(file_id, store._put_body("ghost", os.urandom(16), b"{}", b"G" * 4000))
    with open(log_file, "ab") as f:
        f.write(cut[:200])  # header says 4000+ bytes; 200 written
    LogObjectStore(root, rewrite_min=0).delete("d/a")  # DEL, SEAL, successor, unlink
    for reader in (old_reader, store, _fresh(root)):
        assert sorted(i.key for i in reader.list("d/")) == ["d/b"]
        with pytest.raises(ObjectNotFoundError):
            reader.get("d/ghost")
    store.put_if_absent("d/c", b"C")
    assert sorted(i.key for i in _fresh(root).list("d/")) == ["d/b", "d/c"]


def test_a_reader_paused_with_an_index_of_a_removed_directory(tmp_path: Path) -> None:
    """A reader holds an index of ``d``'s log 0 (cached). The key is deleted (``d`` removed),
    created again (a new ``d`` and a new ``.log.00000000``: same name, another file), and
    that log rewritten. The reader's next calls see the new object, and its conditional
    delete of the old one deletes nothing."""
    root = tmp_path / "objects"
    reader = LogObjectStore(root)
    reader.put_if_absent("d/k", b"old")
    seen = reader.get("d/k")
    other = LogObjectStore(root, rewrite_min=0)
    other.delete("d/k")
    assert not (root / "d").exists()
    other.put_if_absent("d/k", b"new")
    other.put_if_absent("d/j", b"j")
    assert [p.name for p in _log_files(root, "d")] == [f"{_LOG_PREFIX}00000000"]
    assert reader.get("d/k").data == b"new"
    assert reader.delete_if_unchanged("d/k", seen) is False
    assert _fresh(root).get("d/k").data == b"new"


def test_threads_sharing_one_store_with_a_one_log_cache(tmp_path: Path) -> None:
    """Eight threads share one store whose cache holds a single log (every call evicts
    another thread's log, whose fd closes with its last user), plus a second store in the
    same process: racing creates of the same keys over four directories, while deletes
    rewrite those logs again and again. Exactly one winner per key, every winner's object
    reads back, and no thread meets a closed fd or an error."""
    root = tmp_path / "objects"
    shared = LogObjectStore(root, log_cache=1, rewrite_min=0)
    second = LogObjectStore(root, log_cache=2, rewrite_min=0)
    keys = [f"d{i % 4}/k{i:03d}" for i in range(120)]
    start = threading.Barrier(8)

    def work(who: int) -> list[str]:
        store = shared if who % 4 else second
        rng = random.Random(who)
        order = keys[:]
        rng.shuffle(order)
        won = []
        start.wait()
        for n, key in enumerate(order):
            try:
                store.put_if_absent(key, f"{who}".encode())
                won.append(key)
            except ObjectExistsError:
                pass
            if n % 10 == who % 10:
                junk = f"d{n % 4}/junk-{who}-{n}"
                store.put_if_absent(junk, b"j")
                store.delete(junk)  # the log is rewritten
            store.head(order[(n * 7) % len(order)])
        return won

    threads = [InThread(lambda w=w: work(w)) for w in range(8)]
    results = {w: t.result() for w, t in enumerate(threads)}
    winners: dict[str, int] = {}
    for who, won in results.items():
        for key in won:
            assert key not in winners, f"{key} won by {winners[key]} and {who}"
            winners[key] = who
    assert sorted(winners) == sorted(keys)
    for reader in (shared, second, _fresh(root)):
        for key, who in winners.items():
            assert reader.get(key).data == f"{who}".encode()
    assert sorted(i.key for i in _fresh(root).list("")) == sorted(keys)


def test_a_remover_killed_holding_the_exclusive_lock(tmp_path: Path) -> None:
    """A deleter is killed (SIGKILL) inside its tidy-up, holding the directory's exclusive
    flock, after the successor was linked and before the superseded log was unlinked. The
    kernel drops the lock with the process: writers, readers and the next delete go on, the
    successor is the directory's state, and the next tidy-up unlinks the leftover."""
    root = tmp_path / "objects"
    base = LogObjectStore(root)
    for k in "abc":
        base.put_if_absent(f"d/{k}", k.encode())
    killed = _child("""
        die_at("_tidy", "_unlink_quietly(dfd, name)")
        LogObjectStore(sys.argv[2]).delete("d/a")
    """, str(root))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert [p.name for p in _log_files(root, "d")] == [f"{_LOG_PREFIX}00000000", f"{_LOG_PREFIX}00000001"]
    for reader in (base, _fresh(root)):
        assert sorted(i.key for i in reader.list("d/")) == ["d/b", "d/c"]
    base.put_if_absent("d/new", b"n")
    with pytest.raises(ObjectExistsError):
        _fresh(root).put_if_absent("d/b", b"again")
    _fresh(root).delete("d/c")
    assert sorted(i.key for i in _fresh(root).list("d/")) == ["d/b", "d/new"]
    assert len(_log_files(root, "d")) == 1
