"""``LogObjectStore``: the object store in a local directory, each directory's objects kept
in a log of its own (the embedded default for new stores).

A create is one ``write(2)`` of a record to the end of the log of the key's directory and
one ``fdatasync``: no file is made per object, which is what a create costs on most disks
(docs/performance.md, "The protocol's floor"). The argument, point by point, is in
docs/design.md, "The log backend"; in short:

- *Records.* A log starts with a header (a random file id) and holds records: ``PUT`` (key,
  nonce, metadata, bytes), ``TIME`` (when the writer saw its ``PUT`` written), ``DEL`` (a
  tombstone, of any object under the key or of one nonce) and ``SEAL`` (the log is closed).
  Each record carries a MAC keyed with the store's secret (``.logkey``) and salted with the
  file id, so neither a session's content nor a stale block of another log can pass for one.
- *Creates, lock-free.* Writers append with ``O_APPEND`` (the kernel orders the writes of a
  file, and one does not start before the one before it has ended), then read the log up to
  their own record: the first ``PUT`` of a key with no ``DEL`` of it in between holds the key,
  for every reader alike. A create is acknowledged after its ``fdatasync``, which makes
  everything before it in the file durable too. No lock is held, so a writer paused anywhere
  stops nobody.
- *Cut-short records* (a writer killed inside its ``write``, a full disk) fail their MAC;
  readers skip them and resynchronise on the next record whose MAC holds. A torn end after a
  power loss lies after the last acknowledged record, and is skipped the same way.
- *Sealing.* A ``SEAL`` record closes a log: records after the first one are void, and their
  writers retry in the successor, ``.log.<g+1>``, which holds the live objects of the log as
  of the seal. Anyone who meets a sealed log that is still the newest makes the successor
  (created whole, then linked: the first link wins), so a sealer that pauses blocks nobody.
  Logs are rewritten this way when their dead bytes outweigh the live ones, and removed
  (directory and all) when nothing in them is live.
- *Names.* Logs are linked into place holding a shared ``flock`` of their directory, and
  unlinked holding an exclusive one, after checking under it that the name is still the file
  they mean: a remover that paused can never unlink a log made after it looked.
- *Time.* An object's time is read by its writer after its ``PUT`` was written (``TIME``), or,
  where that record is missing, when a reader first met the object: never earlier than the
  object appeared, which is what GC needs.

Each process keeps, per log it used recently, an index of the live objects (where their
bytes are in the file), caught up by reading what was appended since: a read is one ``pread``
once caught up. Objects are immutable, so bytes read from a log that was sealed and unlinked
since are still the object's.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import hmac
import os
import stat
import struct
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import orjson

from store.errors import (
    BackendRefusedError,
    BackendUnavailableError,
    InvalidInputError,
    ObjectExistsError,
    ObjectNotFoundError,
)
from store.file_objects import (
    _O_TMPFILE,
    _os_error,
    _removed,
    _write_all,
    open_dir,
    subdirectories,
)
from store.object_store import ObjectInfo, ObjectStore, Staged, StoredObject, check_key

FaultHook = Callable[[str, dict[str, Any]], None]

#: A log file: magic, then a random file id (the MAC's salt).
_LOG_MAGIC = b"SSLOG1\n\x00"
_FILE_ID = 16
_HEADER = len(_LOG_MAGIC) + _FILE_ID
_LOG_PREFIX = ".log."
#: A record: magic, body length, MAC of (length, body); then the body.
_REC_MAGIC = b"\xd3SR1"
_REC = struct.Struct(">4sI16s")
_MAC = 16
_PUT, _TIME, _DEL, _SEAL = b"P", b"T", b"D", b"S"
#: PUT body after its kind: nonce, writer's time (0: none), key length, metadata length.
_PUT_HEAD = struct.Struct(">16sQHI")
#: TIME body: nonce of the PUT, time in ns, key length; DEL body: its own id, the nonce it
#: deletes (zeros: whatever the key holds), key length; SEAL body: its id.
_TIME_HEAD = struct.Struct(">16sQH")
_DEL_HEAD = struct.Struct(">16s16sH")
_ANY = bytes(16)
#: A record's body may not be larger than this (an object of 1 GiB at most).
_MAX_BODY = 1 << 30
#: Bytes a catch-up reads at a time (a record larger than that is read whole).
_CHUNK = 1 << 20
#: Times a write is retried in the successor of a log sealed under it.
_ROUNDS = 16
#: Logs (open fds and indexes) kept per store, least recently used dropped first.
_LOG_CACHE = 64
#: A log is rewritten after a delete, and once its dead bytes pass its live ones and this size.
_REWRITE_MIN = 256 * 1024
_FORMAT_FILE = ".format"
#: Named temporary files of new logs (where there is no O_TMPFILE), made under the directory's
#: shared lock: one found under the exclusive lock is a dead process's.
_TMP_PREFIX = ".tmp-"
_KEY_FILE = ".logkey"


class _Obj:
    """A live object in a log: where its bytes are, its nonce, raw metadata, time (ns)."""

    __slots__ = ("offset", "size", "nonce", "meta", "time_ns", "record")

    def __init__(self, offset: int, size: int, nonce: bytes, meta: bytes, time_ns: int, record: int) -> None:
        self.offset = offset
        self.size = size
        self.nonce = nonce
        self.meta = meta
        self.time_ns = time_ns
        self.record = record  # the PUT record's length, for the dead-bytes count


class _Log:
    """One log file open in this process, and its index as of ``pos``."""

    __slots__ = ("dirs", "gen", "fd", "file_id", "ino", "pos", "live", "sealed", "lock",
                 "dead", "live_size", "pending", "durable", "flush_lock", "failed", "flushes",
                 "flushed", "__weakref__")

    def __init__(self, dirs: tuple[str, ...], gen: int, fd: int, file_id: bytes, ino: tuple[int, int]) -> None:
        self.dirs = dirs
        self.gen = gen
        self.fd = fd
        self.file_id = file_id
        self.ino = ino
        self.pos = _HEADER
        self.live: dict[str, _Obj] = {}
        #: Offset of the first SEAL (nothing after it counts), or None.
        self.sealed: int | None = None
        self.lock = threading.Lock()
        #: Bytes of records that hold nothing live (lost creates, tombstones, times, deleted).
        self.dead = 0
        #: Bytes of the PUT records of the live objects.
        self.live_size = 0
        #: Ids of this process's records not yet met by a catch-up -> their outcome.
        self.pending: dict[bytes, str | None] = {}
        #: Whether this process made sure the log's name is durable (``_make_durable``).
        self.durable = False
        #: Held across each ``fdatasync`` of ``fd`` (``_sync``): the threads of a process share
        #: the fd, and the kernel reports a failed write-back to one ``fdatasync`` per open file.
        self.flush_lock = threading.Lock()
        #: The error of a failed ``fdatasync``: no later one of this fd is believed.
        self.failed: OSError | None = None
        #: ``fdatasync``s of ``fd`` begun, and the number of the last one that succeeded: one
        #: begun after a write returned covers it, so a thread whose write a flush begun
        #: after it covered makes none of its own (``_sync``).
        self.flushes = 0
        self.flushed = 0
        weakref.finalize(self, _close_quietly, fd)


class LogObjectStore(ObjectStore):
    """Objects below ``root``, one log per directory of keys; several processes may share it.

    Keys are checked and walked as ``FileObjectStore`` walks them (``O_NOFOLLOW``, one
    component at a time); the key's last component is a name inside its directory's log.
    ``fsync=False`` keeps the crash guarantee (no partial object) and drops the power-loss one.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        fsync: bool = True,
        fault_hook: FaultHook | None = None,
        log_cache: int = _LOG_CACHE,
        rewrite_min: int = _REWRITE_MIN,
    ) -> None:
        super().__init__()
        self.root = Path(root).absolute()
        self.root.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync
        self._fault = fault_hook
        self._logs: OrderedDict[tuple[str, ...], _Log] = OrderedDict()
        self._logs_lock = threading.Lock()
        self._logs_max = max(1, log_cache)
        self._rewrite_min = rewrite_min
        #: Seconds between sweeps of the cache for logs unlinked by others (``_sweep``).
        self._sweep_s = 1.0
        self._swept = time.monotonic()
        self._unnamed = bool(_O_TMPFILE) and os.path.isdir("/proc/self/fd")
        self._secret = self._load_secret()

    @property
    def fsync(self) -> bool:
        return self._fsync

    @property
    def identity(self) -> str:
        return f"log {self.root}"

    def _hook(self, point: str, **ctx: Any) -> None:
        if self._fault is not None:
            self._fault(point, ctx)

    # --- the secret ------------------------------------------------------------------------

    def _load_secret(self) -> bytes:
        """The store's MAC key: ``.logkey``, made once (whole, then linked: first wins)."""
        path = self.root / _KEY_FILE
        for _ in range(3):
            dfd = os.open(str(self.root), os.O_RDONLY | os.O_DIRECTORY)
            try:
                try:
                    secret = path.read_bytes()
                except FileNotFoundError:
                    self._link_new(dfd, _KEY_FILE, os.urandom(32), tmp_prefix=".keytmp-")
                    continue
                if len(secret) != 32:
                    raise BackendUnavailableError(f"{path}: {len(secret)} bytes, not a store's key")
                if self._fsync:
                    # Its name is durable before anything sealed with it is acknowledged (the
                    # process that linked it may not have fsynced the root yet).
                    os.fsync(dfd)
                return secret
            finally:
                os.close(dfd)
        raise BackendUnavailableError(f"{path}: could not be made")

    # --- records ---------------------------------------------------------------------------

    def _mac(self, file_id: bytes, body: bytes | memoryview) -> bytes:
        """The MAC of a record: keyed with the store's secret, salted with its log's id."""
        h = hashlib.blake2b(struct.pack(">I", len(body)), key=self._secret, salt=file_id, digest_size=_MAC)
        h.update(body)
        return h.digest()

    def _record(self, file_id: bytes, body: bytes) -> bytes:
        return _REC.pack(_REC_MAGIC, len(body), self._mac(file_id, body)) + body

    def _valid(self, file_id: bytes, buf: bytes, at: int, length: int, mac: bytes) -> bool:
        body = memoryview(buf)[at + _REC.size : at + _REC.size + length]
        return hmac.compare_digest(self._mac(file_id, body), mac)

    @staticmethod
    def _put_body(key: str, nonce: bytes, meta: bytes, data: bytes, time_ns: int = 0) -> bytes:
        k = key.encode()
        return b"".join((_PUT, _PUT_HEAD.pack(nonce, time_ns, len(k), len(meta)), k, meta, data))

    # --- catching up -----------------------------------------------------------------------

    def _catch_up(self, log: _Log) -> None:
        """Read what was appended to ``log`` since ``log.pos`` into its index (``log.lock``
        held), ``_CHUNK`` bytes at a time (more for a record larger than that). Stops at the
        first SEAL, and before a record not complete yet."""
        if log.sealed is not None:
            return
        end = os.fstat(log.fd).st_size
        window = _CHUNK
        while log.pos < end:
            buf = _pread_all(log.fd, min(end - log.pos, window), log.pos)
            at_eof = log.pos + len(buf) >= end
            used = self._parse(log, buf, at_eof)
            if log.sealed is not None or (used == 0 and at_eof):
                return
            window = window * 4 if used == 0 else _CHUNK  # a record larger than the window

    def _parse(self, log: _Log, buf: bytes, at_eof: bool) -> int:
        """Apply the whole records at the start of ``buf`` (the log from ``log.pos``; up to
        the end of the file if ``at_eof``); advance ``log.pos`` past them; how far."""
        base, n, i = log.pos, len(buf), 0
        met_ns = time.time_ns()  # after the bytes were read: never early for what they hold
        while n - i >= _REC.size:
            magic, length, mac = _REC.unpack_from(buf, i)
            if magic == _REC_MAGIC and length <= _MAX_BODY:
                if i + _REC.size + length <= n:
                    if self._valid(log.file_id, buf, i, length, mac):
                        if self._apply(log, buf, i, length, base, met_ns):
                            break  # sealed: nothing after it counts
                        i += _REC.size + length
                        continue
                elif not at_eof:
                    break  # the rest of it is past this window
            # Not a whole record here: one still being written (wait for it), or one cut short
            # (a writer killed inside its write, a full disk, a torn end): skip to the next
            # record whose MAC holds. If there is none yet, the bytes are "not there yet".
            nxt = self._resync(log.file_id, buf, i + 1, at_eof)
            if nxt is None:
                break
            log.dead += nxt - i
            i = nxt
        log.pos = base + i
        return i

    def _resync(self, file_id: bytes, buf: bytes, start: int, at_eof: bool) -> int | None:
        """The offset in ``buf`` of the next record whose MAC holds, or None (none yet; or,
        short of the end of the file, one that may run past this window)."""
        n = len(buf)
        j = buf.find(_REC_MAGIC, start)
        while j >= 0:
            if n - j < _REC.size:
                return None
            _, length, mac = _REC.unpack_from(buf, j)
            if length <= _MAX_BODY:
                if j + _REC.size + length <= n:
                    if self._valid(file_id, buf, j, length, mac):
                        return j
                elif not at_eof:
                    return None  # read further before deciding
            j = buf.find(_REC_MAGIC, j + 1)
        return None

    def _apply(self, log: _Log, buf: bytes, i: int, length: int, base: int, met_ns: int) -> bool:
        """Apply the record at ``buf[i]`` to ``log``'s index; True for a SEAL."""
        body = i + _REC.size
        kind = buf[body : body + 1]
        size = _REC.size + length
        if kind == _PUT:
            nonce, t, klen, mlen = _PUT_HEAD.unpack_from(buf, body + 1)
            at = body + 1 + _PUT_HEAD.size
            key = buf[at : at + klen].decode()
            if key in log.live:
                log.dead += size
                outcome = "lost"
            else:
                meta = buf[at + klen : at + klen + mlen]
                data_at = at + klen + mlen
                log.live[key] = _Obj(base + data_at, body + length - data_at, nonce, meta, t or met_ns, size)
                log.live_size += size
                outcome = "won"
            if nonce in log.pending:
                log.pending[nonce] = outcome
        elif kind == _TIME:
            nonce, t, klen = _TIME_HEAD.unpack_from(buf, body + 1)
            at = body + 1 + _TIME_HEAD.size
            obj = log.live.get(buf[at : at + klen].decode())
            if obj is not None and obj.nonce == nonce and t < obj.time_ns:
                obj.time_ns = t
            log.dead += size
        elif kind == _DEL:
            rid, target, klen = _DEL_HEAD.unpack_from(buf, body + 1)
            at = body + 1 + _DEL_HEAD.size
            key = buf[at : at + klen].decode()
            obj = log.live.get(key)
            if obj is not None and (target == _ANY or target == obj.nonce):
                del log.live[key]
                log.live_size -= obj.record
                log.dead += obj.record
                outcome = "hit"
            else:
                outcome = "miss"
            log.dead += size
            if rid in log.pending:
                log.pending[rid] = outcome
        elif kind == _SEAL:
            log.sealed = base + i
            return True
        else:
            log.dead += size  # a kind of a later version: not ours to interpret
        return False

    # --- finding a directory's log ---------------------------------------------------------

    def _cached(self, dirs: tuple[str, ...]) -> _Log | None:
        now = time.monotonic()
        if now - self._swept >= self._sweep_s:
            self._sweep(now)
        with self._logs_lock:
            log = self._logs.get(dirs)
            if log is not None:
                self._logs.move_to_end(dirs)
            return log

    def _sweep(self, now: float) -> None:
        """Drop the cached logs that were unlinked (rewritten or removed by another process):
        their fds would keep the old files' blocks, deleted objects' bytes included, on the
        disk for as long as this process lives."""
        self._swept = now
        with self._logs_lock:
            logs = list(self._logs.values())
        for log in logs:
            try:
                gone = os.fstat(log.fd).st_nlink == 0
            except OSError:
                gone = True
            if gone:
                self._forget(log)

    def _forget(self, log: _Log) -> None:
        with self._logs_lock:
            if self._logs.get(log.dirs) is log:
                del self._logs[log.dirs]

    def _remember(self, log: _Log) -> _Log:
        with self._logs_lock:
            held = self._logs.get(log.dirs)
            if held is not None and held.ino == log.ino:
                self._logs.move_to_end(log.dirs)
                return held  # another thread opened the same file first: one index
            self._logs[log.dirs] = log
            while len(self._logs) > self._logs_max:
                self._logs.popitem(last=False)  # its fd closes with its last user
            return log

    def _open_dir(self, dirs: Sequence[str], *, create: bool) -> int | None:
        try:
            return open_dir(self.root, dirs, create=create, fsync=self._fsync)
        except (FileNotFoundError, NotADirectoryError):
            if create:
                raise
            return None

    def _resolve(self, dirs: tuple[str, ...], *, create: bool) -> _Log | None:
        """The newest log of ``dirs`` (made if there is none and ``create``), or None."""
        log = self._cached(dirs)
        if log is not None and log.sealed is None:
            # Unsealed as far as this process read: the newest, since a log is only ever
            # superseded after it is sealed. A seal not read yet is met by the catch-up.
            if create and not log.durable:
                self._make_durable(log)
            return log
        for _ in range(_ROUNDS):
            dfd = self._open_dir(dirs, create=create)
            if dfd is None:
                return None
            try:
                top = _newest(dfd, strict=True)
                if top is None:
                    # A listing is not atomic: one that raced a rewrite (the successor linked
                    # behind its cursor, the old log unlinked before it) sees neither. Under
                    # the shared lock no log is unlinked: the newest there then is listed.
                    top = _newest_locked(dfd)
                if top is None:
                    if not create:
                        return None
                    try:
                        self._make_first(dfd)
                    except (FileNotFoundError, PermissionError):
                        # ext4 refuses an O_TMPFILE in a removed directory (EPERM), a link
                        # into one fails (ENOENT): a remover pruned it after our walk.
                        if not _removed(dfd):
                            raise
                    continue
                try:
                    fd = os.open(top[1], os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW, dir_fd=dfd)
                except FileNotFoundError:
                    continue  # unlinked since we listed it
                try:
                    head = os.pread(fd, _HEADER, 0)
                    st = os.fstat(fd)
                except BaseException:
                    os.close(fd)
                    raise
                if len(head) != _HEADER or not head.startswith(_LOG_MAGIC):
                    os.close(fd)
                    raise BackendUnavailableError(f"{self.root.joinpath(*dirs, top[1])}: not a log")
                log = self._remember(_Log(dirs, top[0], fd, head[len(_LOG_MAGIC) :], (st.st_dev, st.st_ino)))
                if create and not log.durable:
                    self._make_durable(log, dfd)
                return log
            finally:
                os.close(dfd)
        raise BackendUnavailableError(f"the log of {'/'.join(dirs)!r} kept changing")

    def _make_durable(self, log: _Log, dfd: int | None = None) -> None:
        """Before this process acknowledges anything in ``log``, the log's name and the
        directories above it are durable: another process may have linked or made them a
        moment ago and not fsynced them yet. A directory gone meanwhile was removed after
        its log was sealed: a write in that log is void, and nothing is made here."""
        if self._fsync:
            for depth in range(len(log.dirs) + 1):
                given = dfd is not None and depth == len(log.dirs)
                fd = dfd if given else self._open_dir(log.dirs[:depth], create=False)
                if fd is None:
                    return
                try:
                    os.fsync(fd)
                finally:
                    if not given:
                        os.close(fd)
        log.durable = True

    def _make_first(self, dfd: int) -> None:
        """Link ``.log.0`` into a directory that has no log (under the shared lock, and only
        if it still has none: a remover holds the exclusive one while it unlinks)."""
        fcntl.flock(dfd, fcntl.LOCK_SH)
        try:
            if _newest(dfd) is None:
                self._link_log(dfd, 0, [])
        finally:
            fcntl.flock(dfd, fcntl.LOCK_UN)

    def _link_log(self, dfd: int, gen: int, carried: Iterable[bytes]) -> None:
        """Make log ``gen`` whole (header, then the carried PUT bodies), fsynced, and link it;
        a name taken already is fine (another process made it, from the same state)."""
        file_id = os.urandom(_FILE_ID)
        parts = [_LOG_MAGIC, file_id]
        parts.extend(self._record(file_id, body) for body in carried)
        self._hook("log.link.before", gen=gen)
        self._link_new(dfd, f"{_LOG_PREFIX}{gen:08d}", b"".join(parts))

    def _link_new(self, dfd: int, name: str, blob: bytes, *, tmp_prefix: str = _TMP_PREFIX) -> bool:
        """Create ``name`` in ``dfd`` holding ``blob``, whole or not at all: True if this call
        made it, False if the name was taken. The directory is fsynced either way. Where the
        filesystem has no ``O_TMPFILE``, through a named temporary file (``tmp_prefix``: the
        logs' are removed by ``_tidy`` when a process died before removing its own)."""
        fd: int | None = None
        tmp: str | None = None
        if self._unnamed:
            try:
                fd = os.open(".", _O_TMPFILE | os.O_WRONLY, 0o644, dir_fd=dfd)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                    raise
                self._unnamed = False  # this filesystem has none: named files from now on
        if fd is None:
            tmp = f"{tmp_prefix}{uuid.uuid4().hex}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dfd)
        try:
            _write_all(fd, blob)
            if self._fsync:
                os.fsync(fd)
            try:
                if tmp is None:
                    os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dfd, follow_symlinks=True)
                else:
                    os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                made = True
            except FileExistsError:
                made = False
        finally:
            os.close(fd)
            if tmp is not None:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except FileNotFoundError:
                    pass
        if self._fsync:
            os.fsync(dfd)
        return made

    def _successor(self, log: _Log) -> None:
        """``log`` is sealed: make sure the directory's newest log is another one, making the
        successor from ``log``'s state at the seal if ``log`` is still the newest."""
        self._forget(log)
        dfd = self._open_dir(log.dirs, create=False)
        if dfd is None:
            return  # removed: the next write makes the first log again
        try:
            fcntl.flock(dfd, fcntl.LOCK_SH)
            try:
                top = _newest(dfd)
                if top is None or top[0] != log.gen or not _same_file(dfd, top[1], log.ino):
                    return  # superseded already, or removed (and perhaps begun again)
                with log.lock:
                    carried = [self._carry(log, key, obj) for key, obj in sorted(log.live.items())]
                self._link_log(dfd, log.gen + 1, carried)
            finally:
                fcntl.flock(dfd, fcntl.LOCK_UN)
        finally:
            os.close(dfd)

    def _carry(self, log: _Log, key: str, obj: _Obj) -> bytes:
        data = _pread_all(log.fd, obj.size, obj.offset)
        return self._put_body(key, obj.nonce, bytes(obj.meta), data, obj.time_ns)

    def _tidy(self, log: _Log) -> None:
        """Under the exclusive lock of ``log``'s directory: unlink every log older than the
        newest, and the newest too if it is ``log``, sealed with nothing live; then remove
        the directories left empty."""
        self._hook("log.tidy.before_lock", dirs=log.dirs, gen=log.gen)
        dfd = self._open_dir(log.dirs, create=False)
        if dfd is None:
            return
        emptied = False
        try:
            fcntl.flock(dfd, fcntl.LOCK_EX)
            try:
                names = _logs(dfd)
                if not names:
                    return
                top_gen, top_name = names[-1]
                if len(names) > 1 and self._fsync:
                    # The successor's name is durable before its predecessor's goes: another
                    # process may have linked it a moment ago and not fsynced yet (and without
                    # a journal the two changes may reach the disk in any order).
                    os.fsync(dfd)
                for _, name in names[:-1]:
                    _unlink_quietly(dfd, name)  # superseded: sealed, its successor exists
                for name in os.listdir(dfd):
                    if name.startswith(_TMP_PREFIX):
                        _unlink_quietly(dfd, name)  # a dead process's: a live one holds the lock
                with log.lock:
                    retire = log.sealed is not None and not log.live
                if retire and top_gen == log.gen and _same_file(dfd, top_name, log.ino):
                    if len(names) > 1 and self._fsync:
                        os.fsync(dfd)  # the older logs gone first: none may outlive the newest
                    _unlink_quietly(dfd, top_name)
                    emptied = True
                if self._fsync:
                    os.fsync(dfd)
            finally:
                fcntl.flock(dfd, fcntl.LOCK_UN)
        finally:
            os.close(dfd)
        if emptied:
            self._prune(log.dirs)

    def _prune(self, dirs: tuple[str, ...]) -> None:
        """Remove the empty directories of ``dirs`` upwards. A writer that made one of them
        just now and is about to link its first log meets ENOENT and walks (makes) it again."""
        while dirs:
            try:
                os.rmdir(self.root.joinpath(*dirs))
            except OSError:
                return
            dirs = dirs[:-1]

    # --- create ----------------------------------------------------------------------------

    def put_if_absent(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> None:
        self._create(key, data, metadata, 0)

    def put_staged(self, key: str, staged: Staged) -> None:
        self._create(key, staged.data, staged.metadata, 0, staged.before_flush)

    def import_object(self, key: str, data: bytes, metadata: Mapping[str, str] | None,
                      last_modified_ms: int | None) -> None:
        """``put_if_absent`` of an object copied from another backend, keeping the time that
        backend gave it (``store/convert.py``): GC trusts an object's time not to be early,
        and the source's own time is at least as early as this copy."""
        self._create(key, data, metadata, (last_modified_ms or 0) * 1_000_000)

    def _create(self, key: str, data: bytes, metadata: Mapping[str, str] | None, time_ns: int,
                before_flush: Callable[[], None] | None = None) -> None:
        parts = check_key(key).split("/")
        dirs, name = tuple(parts[:-1]), parts[-1]
        meta = orjson.dumps(dict(metadata or {}))
        if len(data) + len(meta) + len(name) + 64 > _MAX_BODY:
            raise InvalidInputError(f"object {key!r} is larger than the log backend's 1 GiB")
        self._count("put")
        try:
            self._put(key, dirs, name, meta, data, time_ns, before_flush)
        except (FileExistsError, NotADirectoryError):
            raise ObjectExistsError(key) from None  # a component of the key is not a directory
        except OSError as exc:
            raise _os_error(exc, key) from exc

    def _put(self, key: str, dirs: tuple[str, ...], name: str, meta: bytes, data: bytes, time_ns: int,
             before_flush: Callable[[], None] | None = None) -> None:
        for _ in range(_ROUNDS):
            try:
                log = self._resolve(dirs, create=True)
            except FileNotFoundError:
                continue  # a directory on the way was removed while we walked it: again
            assert log is not None
            nonce = os.urandom(16)
            record = self._record(log.file_id, self._put_body(name, nonce, meta, data, time_ns))
            with log.lock:
                log.pending[nonce] = None
            try:
                self._hook("log.put.before_write", key=key, gen=log.gen)
                _append(log.fd, record, key)
                seen_ns = time.time_ns()  # after the write: never before the object appeared
                self._hook("log.put.written", key=key, gen=log.gen)
                n = name.encode()
                _append(log.fd, self._record(log.file_id, b"".join(
                    (_TIME, _TIME_HEAD.pack(nonce, seen_ns, len(n)), n))), key)
                with log.lock:
                    self._catch_up(log)
                    outcome = log.pending.get(nonce)
            finally:
                with log.lock:
                    log.pending.pop(nonce, None)
            self._hook("log.put.decided", key=key, outcome=outcome, gen=log.gen)
            if outcome == "lost":
                raise ObjectExistsError(key)
            if outcome == "won":
                if before_flush is not None:
                    before_flush()  # the key is ours, visible to all, not durable yet
                self._sync(log)  # and with it everything before it in the log
                return
            if log.sealed is None:
                raise BackendUnavailableError(f"object {key!r}: its record was not found in the log")
            self._successor(log)  # written after a seal: void; again in the successor
        raise BackendUnavailableError(f"object {key!r}: the log kept being sealed under the write")

    # --- durability --------------------------------------------------------------------------

    def _sync(self, log: _Log) -> None:
        """Make everything written to ``log`` so far durable: its ``fdatasync``, or, once one
        of them failed, a successor (``_recover``). Raises ``BackendUnavailableError`` when
        neither can be done; nothing in the log is then known to be durable."""
        if not self._fsync:
            return
        need = log.flushes + 1  # read after our writes returned: a flush numbered so covers them
        with log.flush_lock:
            if log.failed is None:
                if log.flushed >= need:
                    return  # another thread's flush, begun after our writes, covered them
                log.flushes += 1
                number = log.flushes
                try:
                    self._hook("log.flush.before", dirs=log.dirs, gen=log.gen)
                    os.fdatasync(log.fd)
                except OSError as exc:
                    log.failed = exc
                else:
                    log.flushed = number
                    self._hook("log.flushed", dirs=log.dirs, gen=log.gen)
                    return
        self._recover(log)

    def _recover(self, log: _Log) -> None:
        """A flush of ``log`` failed (EIO, a full disk, ...). What it held may never reach the
        disk, and another ``fdatasync`` would not say so: the kernel reports a failed
        write-back once per open file and then forgets it, and the page stays readable,
        clean, in the page cache. So the log is sealed and its live objects, as every
        process reads them, are written into its successor, a new file written whole,
        fsynced, linked and its directory fsynced, whose own flush reports its own errors.
        Once the successor is linked, every object of the log, this write's included, is
        durable there; everyone reads there. Another process that meets the same failure,
        or a seal unfinished, ends the same way (the first seal counts, the first successor
        is linked)."""
        try:
            with log.lock:
                self._catch_up(log)
                sealed = log.sealed is not None
            if not sealed:
                _append(log.fd, self._record(log.file_id, _SEAL + os.urandom(16)), "/".join(log.dirs))
            self._hook("log.recover.sealed", dirs=log.dirs, gen=log.gen)
            self._finish_seal(log)
        except OSError as exc:
            raise BackendUnavailableError(
                f"the log of {'/'.join(log.dirs)!r}: a flush failed ({log.failed}) and its "
                f"objects could not be rewritten ({exc}); nothing in it is known to be durable"
            ) from exc

    def flush(self, key: str) -> None:
        """``ObjectStore.flush``: the log of the key's directory made durable, name and all.
        A log that is sealed and still the newest (its successor not made yet, a sealer
        paused or dead) gets its successor instead, which is written whole and fsynced."""
        if not self._fsync:
            return
        parts = check_key(key).split("/")
        try:
            log = self._current(tuple(parts[:-1]))
            if log is None:
                return
            if not log.durable:
                self._make_durable(log)
            if log.sealed is not None:
                self._finish_seal(log)
            else:
                self._sync(log)
        except OSError as exc:
            raise _os_error(exc, key) from exc

    # --- read --------------------------------------------------------------------------------

    def _current(self, dirs: tuple[str, ...]) -> _Log | None:
        """``dirs``'s newest log, caught up, or None when the directory holds no objects."""
        for _ in range(_ROUNDS):
            log = self._resolve(dirs, create=False)
            if log is None:
                return None
            with log.lock:
                self._catch_up(log)
                sealed = log.sealed is not None
            if not sealed:
                return log
            # Sealed: its state at the seal is the directory's, if it is still the newest
            # (its successor not made yet); otherwise read the newer one, or nothing.
            dfd = self._open_dir(dirs, create=False)
            if dfd is None:
                self._forget(log)
                return None
            try:
                top = _newest(dfd)
                if top is None or top[0] == log.gen:
                    top = _newest_locked(dfd)  # not fooled by a listing that raced a rewrite
                newest = top is not None and top[0] == log.gen and _same_file(dfd, top[1], log.ino)
            finally:
                os.close(dfd)
            if newest:
                return log
            self._forget(log)
            if top is None:
                return None
        raise BackendUnavailableError(f"the log of {'/'.join(dirs)!r} kept changing")

    def _find(self, key: str) -> tuple[_Log, _Obj] | None:
        parts = check_key(key).split("/")
        try:
            log = self._current(tuple(parts[:-1]))
        except OSError as exc:
            raise _os_error(exc, key) from exc
        if log is None:
            return None
        with log.lock:
            obj = log.live.get(parts[-1])
        return None if obj is None else (log, obj)

    def get(self, key: str) -> StoredObject:
        self._count("get")
        found = self._find(key)
        if found is None:
            raise ObjectNotFoundError(key)
        log, obj = found
        try:
            data = _pread_all(log.fd, obj.size, obj.offset)
        except OSError as exc:
            raise _os_error(exc, key) from exc
        return StoredObject(key, data, _meta(obj), obj.time_ns // 1_000_000, etag=obj.nonce.hex())

    def head(self, key: str) -> ObjectInfo | None:
        self._count("head")
        found = self._find(key)
        return None if found is None else ObjectInfo(key, found[1].size)

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        self._count("list")
        base, _, _ = prefix.rpartition("/")
        if base:
            check_key(base)
        start = self.root / base if base else self.root
        if not start.is_dir():
            return
        found: list[ObjectInfo] = []
        for dirpath, dirnames, _ in os.walk(start):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            # Every directory is asked, not only those the walk saw a log in: the walk's
            # listing may have raced a rewrite and seen neither log (``_resolve`` lists again).
            rel = os.path.relpath(dirpath, self.root)
            dirs = () if rel == "." else tuple(rel.split(os.sep))
            try:
                log = self._current(dirs)
            except OSError as exc:
                raise _os_error(exc, "/".join(dirs)) from exc
            if log is None:
                continue
            with log.lock:
                items = [(k, o.size) for k, o in log.live.items()]
            head = "/".join(dirs) + "/" if dirs else ""
            found.extend(ObjectInfo(head + k, size) for k, size in items if (head + k).startswith(prefix))
        found.sort(key=lambda info: info.key)
        for info in found:
            if start_after is None or info.key > start_after:
                yield info

    def list_dirs(self, prefix: str) -> Iterator[str]:
        self._count("list")
        yield from subdirectories(self.root, prefix)

    # --- delete ------------------------------------------------------------------------------

    def delete(self, key: str) -> None:
        self.delete_many([key])

    def delete_many(self, keys: Sequence[str]) -> None:
        by_dir: dict[tuple[str, ...], list[tuple[str, bytes]]] = {}
        for key in keys:
            parts = check_key(key).split("/")
            by_dir.setdefault(tuple(parts[:-1]), []).append((parts[-1], _ANY))
        for dirs, names in by_dir.items():
            self._count("delete")
            try:
                self._delete(dirs, names)
            except OSError as exc:
                raise _os_error(exc, "/".join(dirs)) from exc

    def delete_if_unchanged(self, key: str, seen: StoredObject) -> bool:
        """Delete ``key`` if it holds ``seen``'s bytes and metadata: a tombstone naming the
        nonce of the object compared, which deletes nothing if the key holds another object
        where the tombstone lands (deleted and created again meanwhile)."""
        parts = check_key(key).split("/")
        dirs, name = tuple(parts[:-1]), parts[-1]
        self._count("delete")
        try:
            found = self._find(key)
            if found is None:
                return False
            log, obj = found
            if _pread_all(log.fd, obj.size, obj.offset) != seen.data or _meta(obj) != dict(seen.metadata):
                return False
            if seen.etag is not None and seen.etag != obj.nonce.hex():
                return False  # the same bytes, but another object (created again since)
            self._hook("log.delete.matched", key=key)
            return self._delete(dirs, [(name, obj.nonce)]).get(name) == "hit"
        except OSError as exc:
            raise _os_error(exc, key) from exc

    def _delete(self, dirs: tuple[str, ...], names: list[tuple[str, bytes]]) -> dict[str, str]:
        """Tombstones for ``names`` (name, nonce or ``_ANY``) that are live, in one write and
        one fdatasync; name -> "hit" or "miss". Then the log is rewritten or removed if it
        deserves it."""
        outcomes: dict[str, str] = {}
        todo = list(names)
        for _ in range(_ROUNDS):
            log = self._current(dirs)
            if log is None:
                return outcomes
            with log.lock:
                sealed_log = log if log.sealed is not None else None
                todo = [(n, t) for n, t in todo if n in log.live and (t == _ANY or log.live[n].nonce == t)]
                if not todo:
                    break  # nothing of ours is live (in a sealed log: as of its seal)
            if sealed_log is not None:
                # The newest log is sealed with no successor yet: make it, then delete there.
                self._successor(sealed_log)
                continue
            if not log.durable:
                self._make_durable(log)
            sent = [(os.urandom(16), n, target) for n, target in todo]
            chunks = []
            for rid, n, target in sent:
                k = n.encode()
                chunks.append(self._record(log.file_id, b"".join((_DEL, _DEL_HEAD.pack(rid, target, len(k)), k))))
            with log.lock:
                log.pending.update(dict.fromkeys(rid for rid, _, _ in sent))
            try:
                _append(log.fd, b"".join(chunks), "/".join(dirs))
                with log.lock:
                    self._catch_up(log)
                    got = [log.pending.get(rid) for rid, _, _ in sent]
            finally:
                with log.lock:
                    for rid, _, _ in sent:
                        log.pending.pop(rid, None)
            self._sync(log)
            todo = []
            for (_, n, target), outcome in zip(sent, got):
                if outcome is None:
                    todo.append((n, target))  # after a seal: void
                else:
                    outcomes[n] = outcome
            if not todo:
                self._maintain(log, erased="hit" in got)
                break
            self._successor(log)  # some landed after a seal: again in the successor
        else:
            raise BackendUnavailableError(f"deletes in {'/'.join(dirs)!r}: the log kept being sealed")
        for n, _ in names:
            outcomes.setdefault(n, "miss")
        return outcomes

    def _maintain(self, log: _Log, *, erased: bool) -> None:
        """After deletes: seal and remove a log with nothing live; seal and rewrite one that
        held an object deleted just now (``erased``: its bytes leave the disk before the
        delete returns, as an unlinked file's do), or whose dead bytes (creates that lost,
        times) outweigh its live ones."""
        with log.lock:
            self._catch_up(log)
            sealed = log.sealed is not None
            empty = not log.live
            heavy = log.dead > log.live_size and log.dead + log.live_size >= self._rewrite_min
        if sealed and erased:
            # Sealed by another process, which may have paused or died before finishing:
            # finish it, so that what this delete removed leaves the directory first.
            self._finish_seal(log)
        elif not sealed and (empty or erased or heavy):
            self._seal(log)

    def _seal(self, log: _Log) -> None:
        """Append a SEAL to ``log`` (the first one in the log counts) and finish it."""
        _append(log.fd, self._record(log.file_id, _SEAL + os.urandom(16)), "/".join(log.dirs))
        self._sync(log)
        self._hook("log.seal.written", dirs=log.dirs, gen=log.gen)
        self._finish_seal(log)

    def _finish_seal(self, log: _Log) -> None:
        """``log`` is sealed: make its successor (none when nothing is live at the seal) and
        unlink what is superseded. Whoever finds a seal unfinished may do this."""
        with log.lock:
            self._catch_up(log)
            empty = not log.live
        if not empty:
            self._successor(log)
        self._tidy(log)
        self._forget(log)

    def close(self) -> None:
        with self._logs_lock:
            self._logs.clear()


# --- helpers ------------------------------------------------------------------------------------


def _append(fd: int, record: bytes, what: str) -> None:
    """One ``write(2)`` of a whole record; a short one leaves a record that is cut short (its
    MAC fails, readers skip it) and is reported as not written."""
    written = os.write(fd, record)
    if written != len(record):
        raise BackendUnavailableError(f"{what}: {written} of {len(record)} bytes written to the log")


def _meta(obj: _Obj) -> dict[str, str]:
    try:
        meta = orjson.loads(obj.meta) if obj.meta else {}
    except orjson.JSONDecodeError:
        return {}
    return meta if isinstance(meta, dict) else {}


def _pread_all(fd: int, size: int, offset: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) == size:
        return data
    chunks, got = [data], len(data)
    while got < size:
        chunk = os.pread(fd, size - got, offset + got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _logs(dfd: int, *, strict: bool = False) -> list[tuple[int, str]]:
    """The logs in a directory, (generation, name), oldest first. ``strict``: a file that is
    not the store's own (an object as the file backend keeps it) is refused."""
    found = []
    with os.scandir(dfd) as entries:
        for entry in entries:
            name = entry.name
            if name.startswith(_LOG_PREFIX) and name[len(_LOG_PREFIX) :].isdigit():
                found.append((int(name[len(_LOG_PREFIX) :]), name))
            elif strict and not name.startswith(".") and entry.is_file(follow_symlinks=False):
                raise BackendRefusedError(
                    f"{name!r} is a file in a log store's directory: a process of the file backend "
                    "(this store opened with ?format=files, or a version before the log backend) "
                    "wrote it, and the log backend does not read it. Stop that process; "
                    "docs/design.md, \"The log backend\", says why the two cannot share a store")
    found.sort()
    return found


def _newest(dfd: int, *, strict: bool = False) -> tuple[int, str] | None:
    logs = _logs(dfd, strict=strict)
    return logs[-1] if logs else None


def _newest_locked(dfd: int) -> tuple[int, str] | None:
    """``_newest`` under the directory's shared lock: no log is unlinked meanwhile, so the
    newest there when the lock was taken (or a newer one) is listed."""
    fcntl.flock(dfd, fcntl.LOCK_SH)
    try:
        return _newest(dfd)
    finally:
        fcntl.flock(dfd, fcntl.LOCK_UN)


def _same_file(dfd: int, name: str, ino: tuple[int, int]) -> bool:
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == ino


def _unlink_quietly(dfd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


# --- which backend a directory holds -------------------------------------------------------------

#: The formats of a local store, recorded in ``<root>/.format`` when it is first opened.
FORMAT_LOG = "log1"
FORMAT_FILES = "files"
FORMATS = (FORMAT_LOG, FORMAT_FILES)


def local_format(root: str | os.PathLike[str], wanted: str | None = None) -> str:
    """The format of the local store at ``root``: as recorded, else recorded now: ``wanted``,
    or ``files`` for a directory that already holds objects (a store made before the log
    backend), or ``log1`` for a new one. ``InvalidInputError`` if ``wanted`` is not what the
    store holds."""
    if wanted is not None and wanted not in FORMATS:
        raise InvalidInputError(f"local store format {wanted!r}: one of {', '.join(FORMATS)}")
    path = Path(root).absolute()
    path.mkdir(parents=True, exist_ok=True)
    marker = path / _FORMAT_FILE
    for _ in range(3):
        try:
            held = marker.read_text().strip()
        except FileNotFoundError:
            held = None
        if held:
            if held not in FORMATS:
                raise InvalidInputError(f"{marker}: unknown local store format {held!r}")
            if wanted is not None and wanted != held:
                raise InvalidInputError(f"the store at {path} is in format {held!r}, not {wanted!r}")
            dfd = os.open(str(path), os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)  # the marker's name is durable before the store is used
            finally:
                os.close(dfd)
            return held
        choice = wanted
        if choice is None:
            old = any(not e.name.startswith(".") for e in os.scandir(path))
            choice = FORMAT_FILES if old else FORMAT_LOG
        dfd = os.open(str(path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            _link_whole(dfd, _FORMAT_FILE, f"{choice}\n".encode())
        finally:
            os.close(dfd)
    raise BackendUnavailableError(f"{marker}: could not be read or made")


def _link_whole(dfd: int, name: str, blob: bytes) -> None:
    tmp = f".fmttmp-{uuid.uuid4().hex}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dfd)
    try:
        _write_all(fd, blob)
        os.fsync(fd)
        try:
            os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except FileExistsError:
            pass
    finally:
        os.close(fd)
        os.unlink(tmp, dir_fd=dfd)
    os.fsync(dfd)

