"""The servers of a soak run and the faults they can suffer.

* Redis: the harness's :class:`RedisServer` (a real ``redis-server`` process, no
  persistence): kill and restart empty, FLUSHALL, SCRIPT FLUSH, SIGSTOP/SIGCONT.
* S3: moto's server over HTTP in a child process of its own (``python -m tests.soak.servers
  moto``; the harness's write lock makes its conditional PUT atomic there), or SeaweedFS
  through the harness's ``SeaweedServer`` when ``tests/harness/seaweedfs.py`` exists. Every
  process reaches S3 through one :class:`TcpProxy` on a fixed port, which is where the S3
  faults happen: dropped responses, a blackhole (connections accepted, never answered), an
  outage (the proxy closes its port: connections are refused). Only SeaweedFS keeps its data
  across a restart of the server itself, so only there is ``restart`` a real SIGKILL and
  restart of the S3 server; moto's "restart" would be a new, empty S3, which no real S3 does.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.harness import RedisServer, TcpProxy, s3_client
from tests.harness.s3_server import s3_url

REPO = Path(__file__).resolve().parents[2]
BUCKET = "soak"
REGION = "us-east-1"


def child_env() -> dict[str, str]:
    """The environment of every child: this checkout first on the path, dummy credentials."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION=REGION)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        env.pop(name, None)
    return env


def fixed_ports(rng: random.Random) -> Iterator[int]:
    """Candidate ports below the ephemeral range, so that no outgoing connection takes one while
    the proxy has it closed (an S3 outage) and it can be bound again afterwards. The caller
    binds a candidate itself (a port checked free here could be taken before it is bound)."""
    for _ in range(500):
        yield rng.randint(20000, 32000)
    raise RuntimeError("no free port in 20000-32000")


class MotoProcess:
    """moto's S3 server in a child process (so that the orchestrator's own threads, the proxy
    above all, do not share its interpreter lock)."""

    keeps_data = False

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self) -> "MotoProcess":
        log = open(self.workdir / "moto.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.soak.servers", "moto"], cwd=REPO, env=child_env(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"moto did not start: see {self.workdir / 'moto.log'}")
        self.port = int(json.loads(line)["port"])
        return self

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def restart(self) -> None:  # pragma: no cover - see keeps_data
        raise RuntimeError("moto keeps no data across a restart")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class SeaweedBackend:
    """SeaweedFS (``weed mini``) through the harness's SeaweedServer, if there is one."""

    keeps_data = True

    def __init__(self, workdir: Path) -> None:
        try:
            from tests.harness.seaweedfs import SeaweedServer  # type: ignore[import-not-found]
        except ImportError as exc:
            raise RuntimeError("--backend seaweedfs needs tests/harness/seaweedfs.py (SeaweedServer)") from exc
        self.server: Any = SeaweedServer()
        self.workdir = workdir

    def start(self) -> "SeaweedBackend":
        self.server.start()
        return self

    @property
    def endpoint_url(self) -> str:
        return str(self.server.endpoint_url)

    @property
    def port(self) -> int:
        return int(self.server.port)

    def restart(self) -> None:
        """SIGKILL ``weed`` and start it again on the same data directory (on new ports)."""
        pid = self.server.pid
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        self.server.stop()  # reaps it
        self.server.start()

    def stop(self) -> None:
        self.server.close()
        # A process that was SIGKILLed counts as crashed, and the harness keeps its directory
        # for a post-mortem: here the crash was ours.
        shutil.rmtree(self.server.dir, ignore_errors=True)


class S3Endpoint:
    """The S3 backend behind a proxy on a fixed port; the S3 faults."""

    def __init__(self, backend: str, workdir: Path) -> None:
        self.backend_name = backend
        self.backend: MotoProcess | SeaweedBackend = (
            MotoProcess(workdir) if backend == "moto" else SeaweedBackend(workdir)
        )
        # Not the run's seeded generator: two soaks of one seed at once would try the same
        # ports, and the seed's schedule would depend on which ports were free.
        self.port_rng = random.Random()
        self.listen_port = 0  # chosen when the proxy first binds it, then kept
        self.proxy: TcpProxy | None = None
        self.down = False

    def start(self) -> "S3Endpoint":
        self.backend.start()
        self._start_proxy()
        client = s3_client(self.backend.endpoint_url)
        try:
            client.create_bucket(Bucket=BUCKET)
        except Exception as exc:  # SeaweedFS may have it already after a restart
            if "BucketAlready" not in str(exc):
                raise
        return self

    def _start_proxy(self) -> None:
        upstream = urllib_port(self.backend.endpoint_url)  # the current one, after a restart too
        if not self.listen_port:  # the first start: the first candidate port that binds
            for port in fixed_ports(self.port_rng):
                try:
                    self.proxy = TcpProxy("127.0.0.1", upstream, listen_port=port, name="s3").start()
                except OSError:
                    continue
                self.listen_port = port
                return
        for attempt in range(50):  # after an outage: the same port again, once it is released
            try:
                self.proxy = TcpProxy("127.0.0.1", upstream, listen_port=self.listen_port, name="s3").start()
                return
            except OSError:
                if attempt == 49:
                    raise
                time.sleep(0.1)

    @property
    def url(self) -> str:
        endpoint = f"http://127.0.0.1:{self.listen_port}"
        # Short client timeouts: a blackholed request should fail in seconds, not minutes.
        return s3_url(BUCKET, "soak", endpoint, REGION) + "&connect_timeout=2&read_timeout=5"

    @property
    def keeps_data(self) -> bool:
        return self.backend.keeps_data

    # --- faults ------------------------------------------------------------------------------

    def drop_responses(self, n: int) -> None:
        assert self.proxy is not None
        self.proxy.drop_next_response(n)

    def blackhole(self) -> None:
        assert self.proxy is not None
        self.proxy.blackhole()

    def heal(self) -> None:
        if self.proxy is not None:
            self.proxy.heal()

    def go_down(self) -> None:
        """Close the port: connecting is refused, open connections are closed."""
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        self.down = True

    def come_up(self) -> None:
        if self.down:
            self._start_proxy()
            self.down = False

    def restart_server(self) -> None:
        """SIGKILL the S3 server and start it again on the same data (SeaweedFS only). Until
        it answers, the proxy's connections to it are refused."""
        self.backend.restart()
        if self.proxy is not None:
            # The server may come back on another port (the harness picks free ones).
            self.proxy.upstream = ("127.0.0.1", urllib_port(self.backend.endpoint_url))
            self.proxy.reset_connections()

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        self.backend.stop()


def urllib_port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1].split("/", 1)[0])


class Redis:
    """The redis-server of the run and its faults."""

    def __init__(self) -> None:
        self.server = RedisServer(persistence="none", config={"maxmemory-policy": "noeviction"})

    def start(self) -> "Redis":
        self.server.start()
        return self

    @property
    def url(self) -> str:
        return self.server.url

    def _client(self) -> Any:
        return self.server.client(socket_timeout=5.0)

    def flushall(self) -> None:
        c = self._client()
        try:
            c.flushall()
        finally:
            c.close()

    def script_flush(self) -> None:
        c = self._client()
        try:
            c.script_flush()
        finally:
            c.close()

    def stop(self) -> None:
        self.server.close()


def _serve_moto() -> int:
    from tests.harness import S3Server

    server = S3Server().start()
    sys.stdout.write(json.dumps({"port": server.port}) + "\n")
    sys.stdout.flush()

    def on_term(signum: int, frame: Any) -> None:
        server.stop()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    while sys.stdin.read(1):
        pass  # the parent holds our stdin open; EOF (the parent died) ends us too
    server.stop()
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["moto"]:
        sys.exit(_serve_moto())
    sys.exit("usage: python -m tests.soak.servers moto")
