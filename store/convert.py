"""Converting a local store made before the log backend (a file per object) into a log store
(``sessionstore embedded convert``; docs/cli.md, "Converting a store of the file backend").

The store must be at rest: its embedded redis-server stopped, and no process with anything
open below its directory. The conversion then holds the embedded Redis's start lock (so no
process can start one, and with it use the store, until it is done), copies every object into
a new log store beside the directory, each with its bytes, metadata and time (the file
backend's, which GC already trusts), compares every object of the two, and swaps the two
directories in one ``renameat2(RENAME_EXCHANGE)``: at every moment the directory's path names
either the whole old store or the whole new one. The old store is kept beside it, renamed,
with its Redis state; the new store starts with an empty embedded Redis, which the store
rebuilds from the objects session by session (as after any loss of Redis). A failure before
the swap leaves the old store as it was and removes the half-made copy.

What the start lock keeps out is the embedded default's processes: a process that uses the
directory with a Redis of its own (``--redis``) needs no embedded server, so only the check
of open files stands between it and the conversion. Stop those processes first: one that
wrote during the copy would have written into the store that is kept aside.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from store.embedded import EmbeddedRedis
from store.errors import InvalidInputError, WriteRefusedError
from store.file_objects import FileObjectStore
from store.log_objects import FORMAT_FILES, FORMAT_LOG, LogObjectStore, local_format

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


class StoreInUseError(WriteRefusedError):
    """The store is not at rest: its embedded Redis runs, or processes have it open."""


@dataclass(frozen=True)
class Conversion:
    root: Path
    objects: int
    bytes: int
    #: Where the old store (a file per object, and its Redis state) was kept.
    kept: Path
    seconds: float


def processes_using(root: Path) -> list[int]:
    """Pids of the processes (other than this one) with a file or directory open below
    ``root``, as ``/proc/<pid>/fd`` shows them (a store's processes keep directory fds)."""
    prefix = str(root.absolute())
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{entry.name}/fd")
        except OSError:
            continue  # gone, or not ours to read
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry.name}/fd/{fd}")
            except OSError:
                continue
            if target == prefix or target.startswith(prefix + "/"):
                found.append(int(entry.name))
                break
    return sorted(found)


def convert_to_log(
    root: str | os.PathLike[str],
    *,
    progress: Callable[[int], None] | None = None,
    fault: Callable[[str], None] | None = None,
) -> Conversion:
    """Convert the file-backend store in ``root`` into a log store (see the module)."""
    started = time.monotonic()
    root = Path(root).absolute()
    if not root.is_dir():
        raise InvalidInputError(f"{root}: no such directory")
    held = local_format(root)
    if held == FORMAT_LOG:
        raise InvalidInputError(f"{root} is a log store already")
    assert held == FORMAT_FILES
    redis_dir = root / ".redis"
    embedded = EmbeddedRedis(redis_dir)
    if embedded.held() or embedded.pid() is not None:
        raise StoreInUseError(
            f"the embedded redis-server of {root} is running (pid {embedded.pid()}): stop every process "
            f"of the store, then `sessionstore --objects {root} embedded stop`, then convert"
        )
    redis_dir.mkdir(exist_ok=True)
    with open(redis_dir / "start.lock", "w") as start_lock:
        fcntl.flock(start_lock, fcntl.LOCK_EX)  # no server starts (and no process works) meanwhile
        if embedded.held():
            raise StoreInUseError(f"an embedded redis-server of {root} started meanwhile: stop it first")
        users = processes_using(root)
        if users:
            raise StoreInUseError(
                f"processes {', '.join(map(str, users))} have files below {root} open: stop them first"
            )
        new = root.parent / f".{root.name}.converting-{uuid.uuid4().hex[:8]}"
        try:
            count, size = _copy(root, new, progress, fault)
            _exchange(root, new)
        except BaseException:
            shutil.rmtree(new, ignore_errors=True)
            raise
        # ``new`` is the old store now: kept beside the converted one, Redis state and all.
        kept = root.parent / f"{root.name}.files-{time.strftime('%Y%m%dT%H%M%S')}"
        os.rename(new, kept)
    return Conversion(root, count, size, kept, time.monotonic() - started)


def _copy(root: Path, new: Path, progress: Callable[[int], None] | None,
          fault: Callable[[str], None] | None) -> tuple[int, int]:
    """Every object of the file store ``root`` into a new log store at ``new``, then every
    one compared: (objects, bytes)."""
    old = FileObjectStore(root)
    local_format(new, FORMAT_LOG)
    target = LogObjectStore(new)
    count = size = 0
    try:
        for info in old.list(""):
            obj = old.get(info.key)
            target.import_object(obj.key, obj.data, obj.metadata, obj.last_modified_ms)
            count += 1
            size += len(obj.data)
            if progress is not None:
                progress(count)
            if fault is not None:
                fault("copied")
        compared = 0
        for info in old.list(""):
            obj, got = old.get(info.key), target.get(info.key)
            if (got.data, dict(got.metadata)) != (obj.data, dict(obj.metadata)):
                raise InvalidInputError(f"{info.key}: the copy differs from the original; nothing was changed")
            compared += 1
        if compared != count or sum(1 for _ in target.list("")) != count:
            raise InvalidInputError(f"{root} changed while it was converted; nothing was changed")
    finally:
        old.close()
        target.close()
    return count, size


def _exchange(a: Path, b: Path) -> None:
    """Swap two directories' names atomically (``renameat2`` with ``RENAME_EXCHANGE``)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        raise InvalidInputError("this system has no renameat2: the two directories cannot be swapped atomically")
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise InvalidInputError(f"swapping {a} and {b}: {os.strerror(err)}")
    fd = os.open(a.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["Conversion", "StoreInUseError", "convert_to_log", "processes_using"]
