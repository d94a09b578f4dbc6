"""``FileObjectStore``: the object store in a local directory (the embedded default).

Create-if-absent is ``link(2)`` of a fully written, fsynced temporary file, which the kernel
refuses atomically when the name is taken. ``OSError`` is translated here into
``store.errors``.
"""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path
from typing import Iterator, Mapping

import orjson

from store.errors import (
    BackendRefusedError,
    BackendUnavailableError,
    InvalidInputError,
    ObjectExistsError,
    ObjectNotFoundError,
)
from store.object_store import ObjectInfo, ObjectStore, StoredObject, check_key

_FILE_MAGIC = b"SSOBJ1\n"


class FileObjectStore(ObjectStore):
    """Objects as files below ``root``.

    ``put_if_absent`` writes a temporary file, fsyncs it, then ``os.link``s it to its name:
    link(2) fails with EEXIST when the name is taken, atomically, across processes. A crash
    leaves at most a stray temporary file, never a partial object. Keys are checked
    component by component, and every resolved path must stay below the root, so neither
    ``..`` nor a symlink planted inside the tree can make the store write outside it.
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        super().__init__()
        self.root = Path(root).absolute()
        self.root.mkdir(parents=True, exist_ok=True)
        self._real_root = self.root.resolve()
        self._tmp = self.root / ".tmp"
        self._tmp.mkdir(exist_ok=True)
        self._fsync = fsync

    def _path(self, key: str) -> Path:
        check_key(key)
        path = self.root / key
        parent = path.parent.resolve()
        if parent != self._real_root and self._real_root not in parent.parents:
            raise InvalidInputError(f"object key {key!r} escapes the store's root")
        if path.is_symlink():
            raise InvalidInputError(f"object key {key!r} is a symlink")
        return path

    def put_if_absent(
        self, key: str, data: bytes, metadata: Mapping[str, str] | None = None
    ) -> None:
        path = self._path(key)
        self._count("put")
        tmp = self._tmp / f"{uuid.uuid4().hex}.tmp"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(_FILE_MAGIC)
                    fh.write(orjson.dumps(dict(metadata or {})))
                    fh.write(b"\n")
                    fh.write(data)
                    fh.flush()
                    if self._fsync:
                        os.fsync(fh.fileno())
                os.link(tmp, path)
            except FileExistsError:
                raise ObjectExistsError(key) from None
            if self._fsync:
                _fsync_dir(path.parent)
        except OSError as exc:
            raise _os_error(exc, key) from exc
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass

    def get(self, key: str) -> StoredObject:
        path = self._path(key)
        self._count("get")
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
                mtime_ns = os.fstat(fh.fileno()).st_mtime_ns
        except FileNotFoundError:
            raise ObjectNotFoundError(key) from None
        except OSError as exc:
            raise _os_error(exc, key) from exc
        obj = _unwrap(key, raw)
        return StoredObject(obj.key, obj.data, obj.metadata, mtime_ns // 1_000_000)

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        self._count("head")
        try:
            with open(path, "rb") as fh:
                head = fh.read(len(_FILE_MAGIC))
                meta = fh.readline()
                total = os.fstat(fh.fileno()).st_size
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _os_error(exc, key) from exc
        if head != _FILE_MAGIC:
            return ObjectInfo(key, total)
        return ObjectInfo(key, total - len(head) - len(meta))

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
        base = prefix.rstrip("/")
        if base:
            check_key(base)
        start = self.root / base if base else self.root
        try:
            names = sorted(e.name for e in os.scandir(start) if e.is_dir(follow_symlinks=False))
        except FileNotFoundError:
            return
        yield from (n for n in names if not n.startswith("."))

    def delete(self, key: str) -> None:
        path = self._path(key)
        self._count("delete")
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise _os_error(exc, key) from exc
        # Empty directories are pruned so a deleted session leaves nothing behind; a
        # concurrent writer that loses the race simply recreates its directory.
        parent = path.parent
        while parent != self.root:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent


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


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _os_error(exc: OSError, key: str) -> Exception:
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.ELOOP):
        return BackendRefusedError(f"object {key!r}: {exc}")
    return BackendUnavailableError(f"object {key!r}: {exc}")


# --- S3 --------------------------------------------------------------------------------------


