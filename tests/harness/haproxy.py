"""HAProxy (Debian's ``haproxy``) as the round-robin balancer in front of ``sessionstore serve``
processes: what an operator puts there (docs/operations.md), for the two-server conformance
run and the load benchmark.

    with HaproxyBalancer(["http://127.0.0.1:8001", "http://127.0.0.1:8002"]) as lb:
        httpx.get(f"{lb.url}/healthz")
        lb.stats()      # ([requests sent to upstream 0, to upstream 1], [errors])

HTTP mode, ``balance roundrobin``: each request (not each connection: HAProxy balances every
request of a kept-alive client connection) goes to the next upstream in turn; method, path,
headers (``Host`` included) and bodies go through as they are. Responses are forwarded as
they arrive (SSE, long-poll) and idle timeouts are long enough for a live reader.
``find_haproxy()`` is ``$SESSIONSTORE_HAPROXY`` or ``haproxy`` on PATH (``/usr/sbin``
included: Debian installs it there); ``.ci/run`` installs it. ``require_haproxy()`` in a
test: skipped without it, failed under ``CI``.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import Self
from urllib.parse import urlparse

import httpx

from harness.serve_process import stop

__all__ = ["HaproxyBalancer", "find_haproxy", "require_haproxy"]


def find_haproxy() -> str | None:
    """The haproxy binary, or None."""
    given = os.environ.get("SESSIONSTORE_HAPROXY")
    if given:
        return given
    return shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")


def require_haproxy() -> None:
    """In a test: skip without haproxy, or fail under ``CI`` (set, not false or 0)."""
    import pytest

    if find_haproxy() is not None:
        return
    why = "no haproxy binary (apt-get install haproxy, or set SESSIONSTORE_HAPROXY)"
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"CI: {why}", pytrace=False)
    pytest.skip(why)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HaproxyBalancer:
    """One ``haproxy`` process on free loopback ports: ``url``, ``pid``, ``stats()``."""

    def __init__(self, upstreams: Sequence[str], binary: str | None = None) -> None:
        self.upstreams = list(upstreams)
        found = binary or find_haproxy()
        if found is None:
            raise RuntimeError("no haproxy binary (apt-get install haproxy, or set SESSIONSTORE_HAPROXY)")
        self.binary = found
        self.url = ""
        self._stats_url = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir = ""

    def _config(self, port: int, stats_port: int) -> str:
        servers = "\n".join(
            f"    server s{i} {urlparse(u).hostname}:{urlparse(u).port} maxconn 1000"
            for i, u in enumerate(self.upstreams)
        )
        return f"""global
    maxconn 8192
    nbthread 1

defaults
    mode http
    timeout connect 5s
    timeout client 10m
    timeout server 10m
    timeout http-request 30s
    timeout http-keep-alive 60s

frontend sessionstore
    bind 127.0.0.1:{port}
    default_backend serve

backend serve
    balance roundrobin
{servers}

frontend stats
    bind 127.0.0.1:{stats_port}
    stats enable
    stats uri /stats
"""

    def __enter__(self) -> Self:
        self._dir = tempfile.mkdtemp(prefix="sessionstore-haproxy-")
        port, stats_port = _free_port(), _free_port()
        cfg = os.path.join(self._dir, "haproxy.cfg")
        with open(cfg, "w") as f:
            f.write(self._config(port, stats_port))
        log = open(os.path.join(self._dir, "haproxy.log"), "wb")
        self._proc = subprocess.Popen([self.binary, "-db", "-f", cfg], stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL)
        log.close()
        self.url = f"http://127.0.0.1:{port}"
        self._stats_url = f"http://127.0.0.1:{stats_port}/stats;csv"
        deadline = time.monotonic() + 10
        while True:
            if self._proc.poll() is not None:
                with open(os.path.join(self._dir, "haproxy.log"), errors="replace") as f:
                    raise RuntimeError(f"haproxy exited ({self._proc.returncode}): {f.read()[-2000:]}")
            try:
                httpx.get(self._stats_url, timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError("haproxy did not start listening within 10 s") from None
                time.sleep(0.05)
        return self

    @property
    def pid(self) -> int:
        assert self._proc is not None, "not started"
        return self._proc.pid

    def stats(self) -> tuple[list[int], list[str]]:
        """Requests each upstream was sent, and a line per kind of error HAProxy counted."""
        text = httpx.get(self._stats_url, timeout=10).text.lstrip("# ")
        rows = {(r["pxname"], r["svname"]): r for r in csv.DictReader(io.StringIO(text))}
        counts = [int(rows[("serve", f"s{i}")]["stot"] or 0) for i in range(len(self.upstreams))]
        errors = []
        backend = rows[("serve", "BACKEND")]
        for field in ("econ", "eresp"):
            if int(backend.get(field) or 0):
                errors.append(f"{field}: {backend[field]}")
        front = rows[("sessionstore", "FRONTEND")]
        if int(front.get("ereq") or 0):
            errors.append(f"ereq: {front['ereq']}")
        return counts, errors

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            stop(self._proc)
            self._proc = None
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = ""
