"""What every request passes before a route sees it: ``Host``, ``Origin``, CORS, and the
time a client may take to send its body.

A web page in a browser can send requests to any address, loopback included, and a page whose
name an attacker re-points at 127.0.0.1 (DNS rebinding) even reads the answers as its own. A
service without tokens (loopback only) is open to every local client, so:

| check | refused with |
| --- | --- |
| ``Host`` is not a loopback name (``localhost``, ``127.0.0.1``, ``[::1]``, any port) nor one of ``allowed_hosts`` (checked without tokens, or whenever ``allowed_hosts`` is set) | 403 ``host-not-allowed`` |
| a state-changing request (not ``GET``, ``HEAD``, ``OPTIONS``) whose ``Origin`` is not one of ``cors_origins`` | 403 ``origin-not-allowed`` |
| the body stalls: no byte of it for ``body_timeout_s`` | 408 ``body-timeout``, and the connection is closed |

CORS: ``Access-Control-Allow-Origin`` is sent only to an origin of ``cors_origins`` (``*``:
any, the old behaviour, for services with tokens), with ``Vary: Origin``; a browser page of any
other origin can neither read an answer nor, past the ``Origin`` check, change anything. The
other CORS headers (methods, headers, exposed headers) say only what the protocol uses and are
sent always.

Requests that never finish their headers, and the number of connections, are the server's
business, not the app's: ``store/http/server.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

import orjson

log = logging.getLogger("sessionstore.http")

#: How long a request's body may stall (seconds without a byte) before 408.
DEFAULT_BODY_TIMEOUT_S = 30.0
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

_ALLOW_HEADERS = (
    "Content-Type, Authorization, If-None-Match, If-Match, Stream-Seq, Stream-TTL, "
    "Stream-Expires-At, Stream-Closed, Producer-Id, Producer-Epoch, Producer-Seq, "
    "Stream-Forked-From, Stream-Fork-Offset, Stream-Fork-Sub-Offset, Stream-Kind, Session-Cwd"
)
_EXPOSE_HEADERS = (
    "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, Stream-TTL, "
    "Stream-Expires-At, Stream-SSE-Data-Encoding, Producer-Epoch, Producer-Seq, "
    "Producer-Expected-Seq, Producer-Received-Seq, Session-Tail-Entry-Id, ETag, Content-Type, Location"
)
_COMMON_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    # Only no-cors loads (<img>, <script>) heed it: CORS requests are governed by the
    # allow-list, so same-origin costs no allowed client anything.
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"access-control-allow-methods", b"GET, POST, PUT, DELETE, HEAD, OPTIONS"),
    (b"access-control-allow-headers", _ALLOW_HEADERS.encode()),
    (b"access-control-expose-headers", _EXPOSE_HEADERS.encode()),
]


def problem_body(status: int, code: str, detail: str, **extra: Any) -> bytes:
    """An RFC 9457 problem document naming the error class (``extra``: its extension
    members)."""
    return orjson.dumps({
        "type": f"https://sessionstore.dev/problems/{code}",
        "title": code.replace("-", " "),
        "status": status,
        "detail": detail,
        "code": code,
        **extra,
    })


def host_name(host: str) -> str:
    """A ``Host`` header's name, lowercased, without its port or a final dot."""
    host = host.strip().lower()
    if host.startswith("["):
        name = host[: host.find("]") + 1] if "]" in host else host
    else:
        name, _, port = host.rpartition(":")
        if not name or not port.isdigit():
            name = host
    return name.rstrip(".")


class Guard:
    """ASGI middleware: the checks of the module docstring, then the app."""

    def __init__(
        self,
        app: Any,
        *,
        check_host: bool,
        allowed_hosts: Iterable[str] = (),
        cors_origins: Iterable[str] = (),
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    ) -> None:
        self.app = app
        self.check_host = check_host
        self.hosts = LOOPBACK_HOSTS | {host_name(h) for h in allowed_hosts}
        self.origins = frozenset(o.strip().rstrip("/").lower() for o in cors_origins)
        self.body_timeout_s = body_timeout_s

    def _refusal(self, scope: Any) -> tuple[str, str] | None:
        headers = {k: v for k, v in scope["headers"] if k in (b"host", b"origin")}
        if self.check_host:
            host = headers.get(b"host")
            if host is None or host_name(host.decode("latin-1")) not in self.hosts:
                return "host-not-allowed", ("this service answers to loopback names and those of "
                                            "--allowed-host only")
        origin = headers.get(b"origin")
        if origin is not None and scope["method"] not in SAFE_METHODS and not self._allows(origin):
            return "origin-not-allowed", "requests from web pages of this origin may not change anything here"
        return None

    def _allows(self, origin: bytes) -> bool:
        return "*" in self.origins or origin.decode("latin-1").strip().rstrip("/").lower() in self.origins

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        common = list(_COMMON_HEADERS)
        origin = next((v for k, v in scope["headers"] if k == b"origin"), None)
        if self.origins:
            common.append((b"vary", b"Origin"))
            if origin is not None and self._allows(origin):
                common.append((b"access-control-allow-origin", b"*" if "*" in self.origins else origin))
        refusal = self._refusal(scope)
        if refusal is not None:
            code, detail = refusal
            await send_problem(send, 403, code, detail, common)
            return

        state = {"body_done": scope["method"] in ("GET", "HEAD"), "timed_out": False, "started": False}

        async def timed_receive() -> Any:
            if state["body_done"]:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.body_timeout_s)
            except TimeoutError:
                # The app sees a client gone; the guard answers 408 once the app returns.
                state["timed_out"] = state["body_done"] = True
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                state["body_done"] = True
            return message

        async def send_with(message: Any) -> None:
            if state["timed_out"]:
                return  # the 408 below answers instead
            if message["type"] == "http.response.start":
                state["started"] = True
                message["headers"] = list(message.get("headers", [])) + common
            await send(message)

        await self.app(scope, timed_receive, send_with)
        if state["timed_out"] and not state["started"]:
            log.info("%s %s: no byte of the body for %ss: 408, connection closed",
                     scope["method"], scope.get("path"), self.body_timeout_s)
            await send_problem(send, 408, "body-timeout",
                                f"no byte of the body for {self.body_timeout_s} s", common,
                                close=True)


async def send_problem(
    send: Any, status: int, code: str, detail: str, headers: list[tuple[bytes, bytes]], *, close: bool = False,
    **extra: Any,
) -> None:
    """Answer a problem document from an ASGI middleware."""
    body = problem_body(status, code, detail, **extra)
    all_headers = [(b"content-type", b"application/problem+json"),
                   (b"content-length", str(len(body)).encode()), *headers]
    if close:
        all_headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body})


__all__ = ["DEFAULT_BODY_TIMEOUT_S", "Guard", "LOOPBACK_HOSTS", "host_name", "problem_body", "send_problem"]
