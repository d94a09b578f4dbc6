"""A small HTTP load balancer on loopback: round-robin per request over N upstream servers.

    with Balancer(["http://127.0.0.1:8001", "http://127.0.0.1:8002"]) as lb:
        httpx.get(f"{lb.url}/v1/stream/x?offset=-1")
        lb.counts        # [requests sent to upstream 0, to upstream 1]

Every request (not every connection: clients keep theirs alive) goes to the next upstream in
turn. Method, path and query, headers (``Host`` included, so ``Location`` headers the
upstreams build name the balancer) and body are forwarded as they are; the status, headers and
body of the answer come back the same way. Bodies stream both ways without buffering and with
no read timeout, so SSE and long-poll work through it. Only hop-by-hop headers
(``Connection``, ``Transfer-Encoding``, ...) are dropped: each hop frames its own messages, and
responses keep exactly the ``Content-Length`` the upstream sent (none on chunked ones). When
the client goes away, the upstream request is closed too.

It is a raw ASGI app (so nothing adds a charset or a header of its own) under uvicorn, in a
background thread with its own event loop; one ``httpx.AsyncClient`` keeps connections to the
upstreams alive.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from types import TracebackType
from typing import Any, Self

import httpx
import uvicorn

__all__ = ["Balancer", "BalancerProcess"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: RFC 9110 7.6.1: meaningful for one connection only, never forwarded.
_HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection",
    b"te", b"trailer", b"transfer-encoding", b"upgrade",
})
#: Headers httpx adds to every request of its own accord: removed again unless the client sent them.
_HTTPX_DEFAULTS = ("accept", "accept-encoding", "user-agent")


def _end_to_end(headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``headers`` without the hop-by-hop ones (those named by ``Connection`` included)."""
    named = {
        token.strip().lower()
        for name, value in headers
        if name.lower() == b"connection"
        for token in value.split(b",")
    }
    return [(n, v) for n, v in headers if n.lower() not in _HOP_BY_HOP and n.lower() not in named]


class Balancer:
    """Round-robin reverse proxy in front of ``upstreams`` (base URLs, ``http://host:port``)."""

    def __init__(self, upstreams: Sequence[str], *, host: str = "127.0.0.1", connect_timeout: float = 10.0) -> None:
        if not upstreams:
            raise ValueError("a balancer needs at least one upstream")
        self.upstreams = [u.rstrip("/") for u in upstreams]
        self.host = host
        self.port = 0
        #: requests forwarded to each upstream so far, in the order of ``upstreams``
        self.counts = [0] * len(self.upstreams)
        #: upstream failures: no answer (the client got a 502) or one broken off midway
        self.errors: list[str] = []
        self._connect_timeout = connect_timeout
        self._next = 0
        self._client: httpx.AsyncClient | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def total(self) -> int:
        return sum(self.counts)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> Self:
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP,
        # and without it every keep-alive response waits ~40 ms for a delayed ACK.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app,
            interface="asgi3",  # a bound method: uvicorn's guess would take it for ASGI2
            lifespan="off",
            proxy_headers=False,  # the scope as the client sent it
            log_level="warning",
            access_log=False,
            server_header=False,  # the upstream's headers only
            date_header=False,
            timeout_keep_alive=30,
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(target=self._run, args=(server, sock), name=f"balancer-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the balancer's server thread died while starting")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the balancer did not start within {timeout}s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)
        self._server = None
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def _run(self, server: uvicorn.Server, sock: socket.socket) -> None:
        async def serve() -> None:
            timeout = httpx.Timeout(connect=self._connect_timeout, read=None, write=None, pool=None)
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=30)
            async with httpx.AsyncClient(timeout=timeout, limits=limits, follow_redirects=False) as client:
                self._client = client
                await server.serve(sockets=[sock])

        try:
            asyncio.run(serve())
        finally:
            sock.close()

    # --- the proxy ---------------------------------------------------------------------------

    def _pick(self) -> int:
        index = self._next
        self._next = (index + 1) % len(self.upstreams)
        self.counts[index] += 1
        return index

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # no websockets, no lifespan
            return
        if scope["path"] == STATS_PATH:  # BalancerProcess asks for the counts
            body = json.dumps({"counts": self.counts, "errors": self.errors}).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        client = self._client
        assert client is not None
        upstream = self.upstreams[self._pick()]
        target = upstream + scope["raw_path"].decode("latin-1")
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        incoming: list[tuple[bytes, bytes]] = list(scope["headers"])
        names = {n.lower() for n, _ in incoming}
        has_body = b"content-length" in names or b"transfer-encoding" in names
        body_done = asyncio.Event()

        async def request_body() -> AsyncIterator[bytes]:
            try:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise ConnectionResetError("the client went away while sending its body")
                    if message.get("body"):
                        yield message["body"]
                    if not message.get("more_body", False):
                        return
            finally:
                body_done.set()

        if not has_body:
            body_done.set()
        request = client.build_request(
            scope["method"],
            target,
            headers=_end_to_end(incoming),  # Host included: the upstream names the balancer
            content=request_body() if has_body else None,
        )
        for name in _HTTPX_DEFAULTS:
            if name.encode() not in names:
                del request.headers[name]

        async def relay() -> None:
            try:
                response = await client.send(request, stream=True)
            except httpx.HTTPError as exc:
                self.errors.append(f"{scope['method']} {target}: {exc!r}")
                await send({"type": "http.response.start", "status": 502, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
            try:
                await send({
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": _end_to_end(response.headers.raw),
                })
                async for chunk in response.aiter_raw():  # as it arrives, still encoded
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
            except httpx.HTTPError as exc:  # the upstream broke off: so does the client's response
                self.errors.append(f"{scope['method']} {target} (after the headers): {exc!r}")
                raise
            finally:
                await response.aclose()

        async def until_disconnect() -> None:
            await body_done.wait()
            while (await receive())["type"] != "http.disconnect":
                pass

        # Whichever ends first ends both: a client that hangs up closes the upstream request
        # (an SSE or long-poll response would otherwise run on until the upstream ends it).
        relay_task = asyncio.ensure_future(relay())
        watch_task = asyncio.ensure_future(until_disconnect())
        try:
            await asyncio.wait({relay_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (relay_task, watch_task):
                task.cancel()
            results = await asyncio.gather(relay_task, watch_task, return_exceptions=True)
        if isinstance(results[0], Exception):
            raise results[0]


STATS_PATH = "/__balancer__/stats"


class BalancerProcess:
    """A :class:`Balancer` in a process of its own (``python -m harness.balancer URL...``), so
    that forwarding does not compete for the test process's GIL with the servers running in
    it (moto's, for one): ``url``, and ``stats()`` -> (counts, errors)."""

    def __init__(self, upstreams: Sequence[str]) -> None:
        self.upstreams = list(upstreams)
        self._proc: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> Self:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "harness.balancer", *self.upstreams],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line.startswith("PORT "):
            self._proc.kill()
            raise RuntimeError(f"the balancer process did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"
        return self

    @property
    def pid(self) -> int:
        assert self._proc is not None, "not started"
        return self._proc.pid

    def stats(self) -> tuple[list[int], list[str]]:
        got = httpx.get(self.url + STATS_PATH, timeout=10).json()
        return list(got["counts"]), list(got["errors"])

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def main(argv: Sequence[str]) -> None:
    with Balancer(argv) as balancer:
        print(f"PORT {balancer.port}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    main(sys.argv[1:])
