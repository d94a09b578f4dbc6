"""``FileObjectStore``: the object store in a local directory (the embedded default).

Create-if-absent is ``link(2)`` of a fully written, fsynced file that has no name yet, which
the kernel refuses atomically when the name is taken; then the directory is fsynced, and only
then is the create acknowledged. ``OSError`` is translated here into ``store.errors``.

What survives what (docs/design.md, "The file backend"):

- a crash of the process at any point: either no object or the whole object (a name only
  ever appears on a complete file);
- a power loss (or kernel crash), on a journaling filesystem (ext4 with its journal, XFS):
  every acknowledged object, whole; an unacknowledged one is absent or whole. Both fsyncs
  are needed for that: the file's before the link (or a name could survive on a file whose
  bytes did not), the directory's after it (or the name could be lost after the store said
  it was written, and Redis, which is told after, would be ahead of the objects).
  ``fsync=False`` keeps the first guarantee only.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import uuid
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import orjson

from store.errors import (
    BackendRefusedError,
    BackendUnavailableError,
    InvalidInputError,
    ObjectExistsError,
    ObjectNotFoundError,
)
from store.faults import FaultHook
from store.backends.object_store import ObjectInfo, ObjectStore, StoredObject, check_key, requested

_FILE_MAGIC = b"SSOBJ1\n"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
#: A file with no name in a directory, linked into place once written (Linux 3.11+).
_O_TMPFILE = getattr(os, "O_TMPFILE", 0)
#: Times the directory of a key is opened again when it was removed under a create (a
#: delete of the session pruning it): each round trip re-creates it.
_DIR_ROUNDS = 8
#: Open directory fds kept per store (least recently used closed first): a create or read in a
#: directory met before costs no walk. A cached fd is a hint, checked by the kernel at each
#: use (docs/design.md, "The file backend": the directory cache).
_DIR_CACHE = 32


class FileObjectStore(ObjectStore):
    """Objects as files below ``root``; several processes may share one directory.

    ``put_if_absent`` writes the object into a file without a name (``O_TMPFILE``; or a
    temporary file in ``.tmp/`` where the filesystem has no such files), fsyncs it,
    ``link``s it to its name (``EEXIST`` when the name is taken: atomic across processes)
    and fsyncs the directory. A crash leaves no partial object, at most a stray file in
    ``.tmp/``.

    Keys are checked syntactically (``check_key``: no ``..``, no absolute path, ...), then
    walked directory by directory from the root with ``O_NOFOLLOW``, so neither a key nor a
    symlink planted inside the tree can make the store read or write outside it, at the cost
    of one ``open`` per component and no other lookup. Missing directories are created on
    the way (and their parent fsynced) by ``put_if_absent`` only, so a directory is never
    "known" to exist: a directory removed between the walk and the link makes the link fail
    (``ENOENT``), and the walk is made again.

    The fds of the last ``dir_cache`` directories used are kept open, so that a create or a
    read in a directory met before makes no walk. A cached fd may be a removed directory's:
    a create through it fails and walks again (as above), a read that finds nothing through
    it walks afresh before it answers "not found". ``close()`` closes them.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        fsync: bool = True,
        fault_hook: FaultHook | None = None,
        dir_cache: int = _DIR_CACHE,
    ) -> None:
        super().__init__()
        self.root = Path(root).absolute()
        self.root.mkdir(parents=True, exist_ok=True)
        self._root = str(self.root)
        self._tmp = self.root / ".tmp"
        self._tmp.mkdir(exist_ok=True)
        self._fsync = fsync
        #: Named points of the create protocol where tests inject crashes and pauses.
        self._fault = fault_hook
        #: Files without a name, linked through /proc (else named temporary files in .tmp/).
        self._unnamed = bool(_O_TMPFILE) and os.path.isdir("/proc/self/fd")
        #: Directory parts -> an open fd of that directory, as a walk found it at some time
        #: in the past (it may have been removed since). A user takes the fd out of the cache
        #: and puts it back when done, so no fd is ever closed while another thread uses it.
        self._dirs: OrderedDict[tuple[str, ...], int] = OrderedDict()
        self._dirs_lock = threading.Lock()
        self._dirs_max = max(0, dir_cache)  # 0: no cache, every use walks
        self._dirs_finalizer = weakref.finalize(self, _close_fds, self._dirs, self._dirs_lock)

    @property
    def fsync(self) -> bool:
        """Whether creates are fsynced (the power-loss guarantee), as constructed."""
        return self._fsync

    # --- keys and directories ------------------------------------------------------------

    def _open_dir(self, parts: list[str], *, create: bool) -> int:
        """An fd of the directory ``root/parts...`` (``open_dir``)."""
        return open_dir(self.root, parts, create=create, fsync=self._fsync)

    def _take_dir(self, dirs: tuple[str, ...]) -> int | None:
        """The cached fd of ``dirs``, taken out of the cache (the caller owns it until it
        gives it back with ``_give_dir`` or closes it), or None."""
        with self._dirs_lock:
            return self._dirs.pop(dirs, None)

    def _give_dir(self, dirs: tuple[str, ...], fd: int) -> None:
        """Put ``fd`` (a directory the caller walked or took, and no longer uses) in the
        cache, as the most recently used; the least recently used beyond the bound is closed."""
        evicted: list[int] = []
        with self._dirs_lock:
            if dirs in self._dirs:
                evicted.append(fd)  # another thread's fd of it came back first
            else:
                self._dirs[dirs] = fd
                while len(self._dirs) > self._dirs_max:
                    evicted.append(self._dirs.popitem(last=False)[1])
        for old in evicted:
            os.close(old)  # out of the cache: nobody else holds it

    def _forget_dir(self, dirs: tuple[str, ...]) -> None:
        fd = self._take_dir(dirs)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """Close the cached directory fds (the store stays usable: it walks again)."""
        with self._dirs_lock:
            fds = list(self._dirs.values())
            self._dirs.clear()
        for fd in fds:
            os.close(fd)

    def _open_object(self, key: str) -> int:
        """A read fd of the object ``key`` (a regular file, not a symlink).

        Through the cached fd of its directory when there is one; ``ENOENT`` there is never
        taken for "no such object" (that directory may have been removed, and the key's
        directory made again, since the fd was walked): the directory is walked afresh and
        asked again."""
        parts = check_key(key).split("/")
        dirs, name = tuple(parts[:-1]), parts[-1]
        dfd = self._take_dir(dirs)
        try:
            if dfd is not None:
                try:
                    return os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
                except FileNotFoundError:
                    os.close(dfd)  # perhaps a removed directory's: walk afresh
                    dfd = None
            dfd = self._open_dir(parts[:-1], create=False)
            return os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFoundError(key) from None
        except OSError as exc:
            raise _os_error(exc, key) from exc
        finally:
            if dfd is not None:
                self._give_dir(dirs, dfd)

    # --- create ------------------------------------------------------------------------------

    @requested("put")
    def put_if_absent(
        self, key: str, data: bytes, metadata: Mapping[str, str] | None = None
    ) -> None:
        parts = check_key(key).split("/")
        blob = _blob(data, metadata)
        try:
            self._create(key, parts, blob)
        except (FileExistsError, NotADirectoryError):
            # The name is taken (by an object, or a directory of other keys), or a component
            # of it is an object (the contract's "a/b" beside "a/b/c").
            raise ObjectExistsError(key) from None
        except OSError as exc:
            raise _os_error(exc, key) from exc

    def _create(self, key: str, parts: list[str], blob: bytes) -> None:
        dirs, name = parts[:-1], parts[-1]
        cache_key = tuple(dirs)
        fd: int | None = None
        tmp: str | None = None
        dfd = -1
        try:
            for round_no in range(_DIR_ROUNDS):
                try:
                    # The cached fd first (round 0 only): a directory walked in the past,
                    # no different from one walked just now and then paused on. If it was
                    # removed since, the link in it fails with ENOENT (below: walk again),
                    # and so may the O_TMPFILE open, with whatever error the filesystem
                    # gives for a removed directory (ext4: EPERM): walk again too.
                    taken = self._take_dir(cache_key) if round_no == 0 else None
                    cached = taken is not None
                    if taken is not None:
                        dfd = taken
                    else:
                        dfd = self._open_dir(dirs, create=True)
                    if fd is None:
                        try:
                            fd, tmp = self._new_file(dfd)
                        except OSError:
                            # A cached fd's error is never trusted; a walked one's is when
                            # its directory still stands (ext4 answers EPERM for an O_TMPFILE
                            # in a removed one, which a delete may prune right after our walk).
                            if not cached and not _removed(dfd):
                                raise
                            os.close(dfd)
                            dfd = -1
                            if round_no == _DIR_ROUNDS - 1:
                                raise
                            continue
                        _write_all(fd, blob)
                        if self._fsync:
                            os.fsync(fd)  # the bytes are durable before a name points at them
                    self._hook("file.put.before_link", key=key, fd=fd, round=round_no)
                    # linkat(AT_SYMLINK_FOLLOW): the /proc link names the open file itself.
                    _link_shared(tmp or f"/proc/self/fd/{fd}", name, dfd)
                    break
                except FileNotFoundError:
                    # A directory on the way was removed since we walked it (a delete of
                    # the session pruned it): linking into a removed directory fails, so
                    # walk (and create) again. The written file is kept for the next try.
                    if round_no == _DIR_ROUNDS - 1 or (tmp is not None and not os.path.exists(tmp)):
                        raise
                    if dfd >= 0:
                        os.close(dfd)
                        dfd = -1
            self._hook("file.put.linked", key=key)
            if self._fsync:
                os.fsync(dfd)  # the name is durable before the create is acknowledged
        finally:
            if fd is not None:
                os.close(fd)
            if tmp is not None:
                _unlink_quietly(tmp)
            if dfd >= 0:
                self._give_dir(cache_key, dfd)

    def _new_file(self, dfd: int) -> tuple[int, str | None]:
        """A file to write the object into: (fd, None) for a file with no name in the
        key's directory, or (fd, path) for a named temporary file in ``.tmp/``."""
        if self._unnamed:
            try:
                return os.open(".", _O_TMPFILE | os.O_WRONLY, 0o644, dir_fd=dfd), None
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                    raise
                self._unnamed = False  # this filesystem has none: named files from now on
        tmp = f"{self._tmp}/{uuid.uuid4().hex}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:
            self._tmp.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        return fd, tmp

    def _hook(self, point: str, **ctx: Any) -> None:
        if self._fault is not None:
            self._fault(point, ctx)

    def flush(self, key: str) -> None:
        """``ObjectStore.flush``: the object's bytes were fsynced before its name appeared;
        its name, and the directories above it, are fsynced here (its creator may have died
        or paused before its directory's fsync, or a directory on the way may be another
        process's, made a moment ago)."""
        if not self._fsync:
            return
        parts = check_key(key).split("/")
        try:
            for depth in range(len(parts)):  # the root, ..., the key's own directory
                try:
                    fd = self._open_dir(parts[:depth], create=False)
                except (FileNotFoundError, NotADirectoryError):
                    return  # removed since: nothing of it to keep
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except OSError as exc:
            raise _os_error(exc, key) from exc
        self._hook("file.flushed", key=key)

    # --- read --------------------------------------------------------------------------------

    @requested("get")
    def get(self, key: str) -> StoredObject:
        fd = self._open_object(key)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ObjectNotFoundError(key)  # a directory of other keys
            raw = _read_all(fd, st.st_size)
        except OSError as exc:
            raise _os_error(exc, key) from exc
        finally:
            os.close(fd)
        obj = _unwrap(key, raw)
        # ctime, not mtime: link(2) sets it when the object appears under its name, while
        # the mtime is when its bytes were written, which a pause before the link makes
        # early (GC trusts this time not to be early; docs/design.md, "Pauses").
        return StoredObject(obj.key, obj.data, obj.metadata, max(st.st_ctime_ns, st.st_mtime_ns) // 1_000_000)

    @requested("head")
    def head(self, key: str) -> ObjectInfo | None:
        try:
            fd = self._open_object(key)
        except ObjectNotFoundError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            first = os.read(fd, 4096)
            if first.startswith(_FILE_MAGIC):
                nl = first.find(b"\n", len(_FILE_MAGIC))
                if nl < 0:  # metadata longer than the first read
                    first += _read_all(fd, st.st_size)
                    nl = first.find(b"\n", len(_FILE_MAGIC))
                return ObjectInfo(key, st.st_size - (nl + 1 if nl >= 0 else len(first)))
            return ObjectInfo(key, st.st_size)
        except OSError as exc:
            raise _os_error(exc, key) from exc
        finally:
            os.close(fd)

    @property
    def identity(self) -> str:
        return f"file {self._root}"

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        self._count("list")
        base, _, _ = prefix.rpartition("/")
        start = self.root / base if base else self.root
        if base:
            check_key(base)
        if not start.is_dir():
            return
        found: list[str] = []
        for dirpath, dirnames, filenames in os.walk(start):
            rel_dir = os.path.relpath(dirpath, self.root)
            # Dot-directories are the store's own (temporary files, the embedded Redis).
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if name.startswith("."):
                    continue  # the store's own (.format), never a key
                key = name if rel_dir == "." else f"{rel_dir.replace(os.sep, '/')}/{name}"
                if key.startswith(prefix):
                    found.append(key)
        for key in sorted(found):
            if start_after is not None and key <= start_after:
                continue
            info = self.head(key)
            if info is not None:
                yield info

    def list_dirs(self, prefix: str) -> Iterator[str]:
        self._count("list")
        yield from subdirectories(self.root, prefix)

    @requested("delete")
    def delete(self, key: str) -> None:
        parts = check_key(key).split("/")
        try:
            dfd = self._open_dir(parts[:-1], create=False)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise _os_error(exc, key) from exc
        try:
            if stat.S_ISLNK(os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False).st_mode):
                raise InvalidInputError(f"object key {key!r} is a symlink")
            os.unlink(parts[-1], dir_fd=dfd)
        except FileNotFoundError:
            return
        except IsADirectoryError:
            return  # a directory of other keys, not an object
        except OSError as exc:
            raise _os_error(exc, key) from exc
        finally:
            os.close(dfd)
        self._prune(parts)

    @requested("delete")
    def delete_if_unchanged(self, key: str, seen: StoredObject) -> bool:
        """Unlink ``key`` if it holds ``seen``'s bytes and metadata, under an exclusive
        ``flock`` of its directory: every link into a directory holds a shared one
        (``_link_shared``), so no create can give the name to another object between the
        comparison and the unlink (a plain unlink by name cannot be made conditional)."""
        parts = check_key(key).split("/")
        try:
            dfd = self._open_dir(parts[:-1], create=False)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:
            raise _os_error(exc, key) from exc
        try:
            fcntl.flock(dfd, fcntl.LOCK_EX)  # released with the fd
            try:
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
            except (FileNotFoundError, IsADirectoryError):
                return False
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    return False  # a directory of other keys
                raw = _read_all(fd, st.st_size)
            finally:
                os.close(fd)
            held = _unwrap(key, raw)
            if held.data != seen.data or dict(held.metadata) != dict(seen.metadata):
                return False
            self._hook("file.delete.matched", key=key)
            os.unlink(parts[-1], dir_fd=dfd)
        except FileNotFoundError:
            return False  # deleted unconditionally meanwhile
        except OSError as exc:
            raise _os_error(exc, key) from exc
        finally:
            os.close(dfd)
        self._prune(parts)
        return True

    def _prune(self, parts: Sequence[str]) -> None:
        """Empty directories are pruned so a deleted session leaves nothing behind; a
        concurrent writer that loses the race walks (creates) its directory again."""
        parent = self.root.joinpath(*parts[:-1])
        dirs = tuple(parts[:-1])
        while parent != self.root:
            try:
                parent.rmdir()
            except OSError:
                break
            self._forget_dir(dirs)  # a removed directory's fd: of no use any more
            parent = parent.parent
            dirs = dirs[:-1]


def subdirectories(root: Path, prefix: str) -> list[str]:
    """The directories of keys directly below ``prefix`` (which ends with '/'), in name
    order: a local store's ``list_dirs`` (dot-directories are the store's own)."""
    base = prefix.rstrip("/")
    if base:
        check_key(base)
    start = root / base if base else root
    try:
        names = sorted(e.name for e in os.scandir(start) if e.is_dir(follow_symlinks=False))
    except FileNotFoundError:
        return []
    return [n for n in names if not n.startswith(".")]


def open_dir(root: Path, parts: Sequence[str], *, create: bool, fsync: bool) -> int:
    """An fd of the directory ``root/parts...``, walked one component at a time, no symlink
    followed. ``create``: make missing directories (their parents fsynced when ``fsync``)."""
    try:
        fd = os.open(str(root), os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        if not create:
            raise
        root.mkdir(parents=True, exist_ok=True)  # the whole tree was removed
        fd = os.open(str(root), os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            try:
                sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except NotADirectoryError:
                if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise OSError(errno.ELOOP, "a symlink in the store's tree", part) from None
                raise  # an object where the key needs a directory
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass  # another process made it: we sync its entry all the same
                if fsync:
                    # The new entry is durable before anything inside it is acknowledged.
                    os.fsync(fd)
                sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd


def _link_shared(src: str, name: str, dfd: int) -> None:
    """``linkat`` of ``src`` to ``name`` in ``dfd``, holding a shared ``flock`` of the
    directory: ``delete_if_unchanged`` holds an exclusive one across its comparison and
    unlink (creates in one directory do not wait for each other)."""
    fcntl.flock(dfd, fcntl.LOCK_SH)
    try:
        os.link(src, name, dst_dir_fd=dfd, follow_symlinks=True)
    finally:
        fcntl.flock(dfd, fcntl.LOCK_UN)


def _removed(dfd: int) -> bool:
    """Whether the directory open as ``dfd`` has been removed (no name links to it)."""
    try:
        return os.fstat(dfd).st_nlink == 0
    except OSError:
        return False


def _close_fds(fds: dict[Any, int], lock: threading.Lock) -> None:
    """The finalizer of a store dropped without ``close()``: its cached fds are closed."""
    with lock:
        left = list(fds.values())
        fds.clear()
    for fd in left:
        try:
            os.close(fd)
        except OSError:
            pass


def _blob(data: bytes, metadata: Mapping[str, str] | None) -> bytes:
    return b"".join((_FILE_MAGIC, orjson.dumps(dict(metadata or {})), b"\n", data))


def _write_all(fd: int, blob: bytes) -> None:
    view = memoryview(blob)
    while view:
        view = view[os.write(fd, view) :]


def _read_all(fd: int, size: int) -> bytes:
    """The rest of the file: one read when it is ``size`` bytes as fstat said, more if it is
    not (a file dropped in by hand may change)."""
    chunks = []
    got = 0
    want = size + 1
    while True:
        chunk = os.read(fd, want)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        got += len(chunk)
        if got == size and len(chunk) < want:  # all of it, and a short read: the end
            return b"".join(chunks)
        want = 65536


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _unwrap(key: str, raw: bytes) -> StoredObject:
    if not raw.startswith(_FILE_MAGIC):
        # A file dropped into the tree by hand: no metadata.
        return StoredObject(key, raw, {})
    nl = raw.find(b"\n", len(_FILE_MAGIC))
    try:
        meta = orjson.loads(raw[len(_FILE_MAGIC) : nl]) if nl > 0 else {}
    except orjson.JSONDecodeError:
        meta = {}
    return StoredObject(key, raw[nl + 1 :], meta if isinstance(meta, dict) else {})


def _os_error(exc: OSError, key: str) -> Exception:
    if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink on the way
        return InvalidInputError(f"object key {key!r}: a symlink in the store's tree ({exc})")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.ELOOP):
        return BackendRefusedError(f"object {key!r}: {exc}")
    return BackendUnavailableError(f"object {key!r}: {exc}")


# --- S3 --------------------------------------------------------------------------------------


