"""FileObjectStore's cache of open directory fds, against the real filesystem.

A cached fd names a directory as a walk found it at some time in the past: the directory may
have been removed since (a delete pruned it), by this store or another process, and made
again. None of that may lose a create or turn into a false "not found" (docs/design.md, "The
file backend").
"""

from __future__ import annotations

import gc
import os
import random
import shutil
import threading
from pathlib import Path

import pytest
from harness.pausing import InThread, Pause

from store.errors import InvalidInputError, ObjectExistsError, ObjectNotFoundError
from store.backends.objects import FileObjectStore

_DIR = ("sessions", "s1", "inc1", "seg")
_D = "/".join(_DIR)


def _seg(n: int) -> str:
    return f"{_D}/{n:012d}.jsonl"


def _open_fds(root: Path) -> int:
    """Open fds of this process that name something below ``root`` (whatever other threads
    of the test process open or close meanwhile)."""
    n = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{name}").startswith(str(root))
        except OSError:
            pass
    return n


def _rounds(pause_seen: list[tuple[str, dict]]) -> list[int]:
    return [ctx["round"] for point, ctx in pause_seen if point == "file.put.before_link"]


class _Record:
    """A fault hook that only records the points reached."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict]] = []

    def __call__(self, point: str, ctx: dict) -> None:
        self.seen.append((point, dict(ctx)))


def test_a_second_create_in_a_directory_uses_the_cached_fd(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path / "objects")
    store.put_if_absent(_seg(1), b"one")
    assert _DIR in store._dirs
    inode = os.fstat(store._dirs[_DIR]).st_ino
    store.put_if_absent(_seg(2), b"two")
    assert os.fstat(store._dirs[_DIR]).st_ino == inode  # the same fd, put back
    assert store.get(_seg(2)).data == b"two"
    with pytest.raises(ObjectExistsError):
        store.put_if_absent(_seg(2), b"again")  # EEXIST through the cached fd
    assert store.get(_seg(2)).data == b"two"
    store.close()


@pytest.mark.parametrize("deleter", ["same store", "another store"])
def test_a_delete_pruning_the_directory_between_two_puts(tmp_path: Path, deleter: str) -> None:
    """Put, then a delete of that object prunes its directories (all of them: the session is
    gone), then a put into the same directory: it lands at its key, whole, for everyone."""
    root = tmp_path / "objects"
    record = _Record()
    store = FileObjectStore(root, fault_hook=record)
    other = store if deleter == "same store" else FileObjectStore(root)
    store.put_if_absent(_seg(1), b"one")
    assert _DIR in store._dirs

    other.delete(_seg(1))
    assert not (root / "sessions").exists()  # pruned up to the root

    record.seen.clear()
    store.put_if_absent(_seg(2), b"two", {"nonce": "n2"})
    if deleter == "another store":
        # The cached fd was tried and found to name a removed directory: walked again.
        assert _rounds(record.seen)[-1] >= 1
    assert (root / _D / f"{2:012d}.jsonl").is_file()
    fresh = FileObjectStore(root)
    obj = fresh.get(_seg(2))
    assert (obj.data, obj.metadata) == (b"two", {"nonce": "n2"})
    assert store.get(_seg(2)).data == b"two"
    assert [i.key for i in fresh.list("sessions/")] == [_seg(2)]
    for s in {store, other, fresh}:
        s.close()


@pytest.mark.parametrize("op", ["get", "head", "put"])
def test_a_directory_removed_and_made_again_by_another_store(tmp_path: Path, op: str) -> None:
    """Store A holds a cached fd of a directory; store B (another process as far as A can
    tell) deletes the session, pruning the directory, and makes it again with a new object in
    it. A's reads see the new object (never a false "not found", which a reader would take
    for the end of the log) and A's create lands in the new directory."""
    root = tmp_path / "objects"
    a = FileObjectStore(root)
    b = FileObjectStore(root)
    a.put_if_absent(_seg(1), b"one")
    assert a.get(_seg(1)).data == b"one"
    assert _DIR in a._dirs

    b.delete(_seg(1))
    assert not (root / _D).exists()
    b.put_if_absent(_seg(2), b"two")  # the directory made again: a new inode
    assert os.fstat(a._dirs[_DIR]).st_nlink == 0  # A's fd: the removed one

    if op == "get":
        assert a.get(_seg(2)).data == b"two"
    elif op == "head":
        info = a.head(_seg(2))
        assert info is not None and info.size == 3
    else:
        a.put_if_absent(_seg(3), b"three")
        assert b.get(_seg(3)).data == b"three"
        assert a.get(_seg(3)).data == b"three"
    # Whatever the first operation was, A now holds the live directory and sees it all.
    assert a.get(_seg(2)).data == b"two"
    assert os.fstat(a._dirs[_DIR]).st_ino == os.stat(root / _D).st_ino
    with pytest.raises(ObjectNotFoundError):
        a.get(_seg(1))  # deleted: a true "not found" stays one
    assert a.head(_seg(1)) is None
    a.close()
    b.close()


def test_a_read_of_a_removed_directory_that_is_not_made_again_is_not_found(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    a = FileObjectStore(root)
    a.put_if_absent(_seg(1), b"one")
    FileObjectStore(root).delete(_seg(1))
    with pytest.raises(ObjectNotFoundError):
        a.get(_seg(1))
    assert a.head(_seg(2)) is None
    assert _DIR not in a._dirs  # nothing cached for a directory that is not there
    a.close()


def test_a_cached_directory_swapped_for_a_symlink_is_refused(tmp_path: Path) -> None:
    """The cached directory is removed and a symlink put in its place: the create walks
    again and refuses the symlink; the read too. Nothing is written or read outside."""
    root = tmp_path / "objects"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / f"{1:012d}.jsonl").write_bytes(b"planted")
    store = FileObjectStore(root)
    store.put_if_absent(_seg(2), b"two")
    shutil.rmtree(root / _D)
    os.symlink(outside, root / _D)
    with pytest.raises(InvalidInputError):
        store.put_if_absent(_seg(3), b"x")
    with pytest.raises(InvalidInputError):
        store.get(_seg(1))
    assert sorted(p.name for p in outside.iterdir()) == [f"{1:012d}.jsonl"]
    store.close()


def test_a_create_paused_on_a_cached_fd_while_the_directory_is_removed(tmp_path: Path) -> None:
    """The create took the cached fd, wrote and synced its file, then paused; the session's
    directory was pruned and made again meanwhile. Resumed, the link in the removed directory
    fails and the create walks again: it lands in the directory that exists now."""
    root = tmp_path / "objects"
    pause = Pause("file.put.before_link")
    writer = FileObjectStore(root, fault_hook=pause)
    writer._unnamed = True
    other = FileObjectStore(root)
    pause.release()  # the first create runs through
    writer.put_if_absent(_seg(1), b"one")
    assert _DIR in writer._dirs
    pause2 = Pause("file.put.before_link")
    writer._fault = pause2
    put = InThread(lambda: writer.put_if_absent(_seg(2), b"two"))
    pause2.wait_paused()
    assert pause2.seen[-1][1]["round"] == 0  # through the cached fd
    other.delete(_seg(1))
    assert not (root / "sessions").exists()
    other.put_if_absent(_seg(5), b"five")
    pause2.release()
    put.result()
    assert other.get(_seg(2)).data == b"two"
    assert sorted(i.key for i in other.list("sessions/")) == [_seg(2), _seg(5)]


def test_concurrent_creates_reads_and_deletes_from_several_threads(tmp_path: Path) -> None:
    """Threads of one store create, read and delete in a few shared directories while those
    are pruned and made again, with a cache smaller than the directories in use (fds evicted
    and closed all the time): every create lands whole at its own key, every object not
    deleted is there, and reads of objects that exist never say "not found"."""
    root = tmp_path / "objects"
    store = FileObjectStore(root, fsync=False, dir_cache=2)
    other = FileObjectStore(root, fsync=False)  # prunes directories behind the store's back
    dirs = [f"sessions/s{i}/inc/seg" for i in range(4)]
    kept: set[str] = set()
    kept_lock = threading.Lock()
    errors: list[BaseException] = []
    fds_before = _open_fds(root)

    def work(t: int) -> None:
        rng = random.Random(t)
        try:
            for i in range(150):
                d = rng.choice(dirs)
                key = f"{d}/{t:02d}-{i:04d}"
                data = key.encode()
                store.put_if_absent(key, data)
                assert store.get(key).data == data
                info = store.head(key)
                assert info is not None and info.size == len(data)
                if rng.random() < 0.5:
                    (store if rng.random() < 0.5 else other).delete(key)  # may prune the dir
                else:
                    with kept_lock:
                        kept.add(key)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors[:3]
    fresh = FileObjectStore(root)
    assert {i.key for i in fresh.list("sessions/")} == kept
    for key in kept:
        assert fresh.get(key).data == key.encode()
        assert store.get(key).data == key.encode()
    assert len(store._dirs) <= 2
    store.close()
    other.close()
    fresh.close()
    assert _open_fds(root) == fds_before


def test_eviction_and_close_close_the_fds(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    before = _open_fds(root)
    store = FileObjectStore(root, dir_cache=3)
    for i in range(10):
        store.put_if_absent(f"d{i}/k", b"x")
        assert _open_fds(root) == before + min(i + 1, 3)
    assert list(store._dirs) == [("d7",), ("d8",), ("d9",)]  # the most recently used
    assert store.get("d8/k").data == b"x"
    assert list(store._dirs) == [("d7",), ("d9",), ("d8",)]
    assert store.get("d0/k").data == b"x"  # walked, cached: d7 evicted
    assert list(store._dirs) == [("d9",), ("d8",), ("d0",)]
    assert _open_fds(root) == before + 3
    store.close()
    assert _open_fds(root) == before
    store.put_if_absent("d0/k2", b"y")  # still usable after close: walks again
    assert _open_fds(root) == before + 1
    store.close()

    uncached = FileObjectStore(root, dir_cache=0)
    uncached.put_if_absent("d1/k2", b"z")
    assert uncached.get("d1/k2").data == b"z"
    assert _open_fds(root) == before and not uncached._dirs

    dropped = FileObjectStore(root)
    dropped.put_if_absent("d2/k2", b"z")
    assert _open_fds(root) == before + 1
    del dropped  # never closed: the finalizer closes its fds
    gc.collect()
    assert _open_fds(root) == before


def test_a_conditional_delete_holds_off_creates_between_its_comparison_and_its_unlink(
    tmp_path: Path,
) -> None:
    """The deleter compared the object with the one it read and paused before its unlink.
    Meanwhile another process deleted the object and created the name again. Its create's
    link waits for the deleter (whose unlink of the old name then finds nothing), so the new
    object stays: without the directory lock, the deleter's unlink by name would remove it."""
    root = tmp_path / "objects"
    pause = Pause("file.delete.matched")
    deleter = FileObjectStore(root, fault_hook=pause)
    other = FileObjectStore(root)
    key = "sessions/s1/header.json"
    other.put_if_absent("sessions/s1/inc0/k", b"x")  # the directory is not pruned
    other.put_if_absent(key, b"life 1", {"nonce": "1"})
    seen = deleter.get(key)
    deleting = InThread(lambda: deleter.delete_if_unchanged(key, seen))
    pause.wait_paused()
    other.delete(key)
    creating = InThread(lambda: other.put_if_absent(key, b"life 2", {"nonce": "2"}))
    assert creating.waiting(0.5)  # its link waits for the deleter's lock
    pause.release()
    assert deleting.result() is False  # the object it saw was gone when it unlinked
    creating.result()
    assert other.get(key).data == b"life 2"
    assert FileObjectStore(root).get(key).data == b"life 2"


def test_a_conditional_delete_of_a_symlink_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    store = FileObjectStore(root)
    store.put_if_absent("a/real", b"x")
    seen = store.get("a/real")
    os.symlink(root / "a" / "real", root / "a" / "link")
    with pytest.raises(InvalidInputError):
        store.delete_if_unchanged("a/link", seen)
    assert store.get("a/real").data == b"x"
