"""What a request passes between the guard (``store/http/guard.py``) and the routes: its
route class, its token, its tenant's limits, its scope; and the access log around it all.

:class:`Gate`, in this order, each refusal a problem document that changes nothing:

1. the route class (``store/http/access.py``): none is 404 ``not-found``; a public class
   (``/healthz``, preflights), or a service without tokens, goes straight to the routes;
2. the token: none, or one the tokens in force do not know, is 401 ``unauthorized``;
3. the tenant's request rate, and its byte rate for a request with a body: 429
   ``rate-limited`` with ``Retry-After`` (``store/http/limits.py``);
4. the scope the route class needs: 403 ``insufficient-scope``, naming the scope needed;
5. a live read over the tenant's cap of followers: 429 ``too-many-followers``.

The request then reaches its route with its :class:`~store.http.auth.Grant` in the ASGI scope
(:data:`GRANT`), where each name it touches is checked against the grant's tenant and prefix
(403 ``forbidden``); the bytes of its body are charged to its tenant's byte rate as they
arrive, and a follower is counted until its response ends.

:class:`Requests` (with ``serve --access-log``) writes one JSON line a request, after it ends, on
the ``sessionstore.access`` logger: ``time`` (its start, UTC), ``tenant``, ``route`` (its
class), ``method``, ``status``, ``bytes_in``, ``bytes_out`` (of the bodies) and ``ms``. It
never writes a token, a header, a body, a name or a query string.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson

from store.http.access import PUBLIC, ROUTES, route_class, scope_needed
from store.http.access import refusal as scope_refusal
from store.http.auth import Tokens
from store.http.guard import send_problem
from store.http.limits import Limiter, retry_after
from store.metrics import Metrics

access_log = logging.getLogger("sessionstore.access")

#: ASGI scope keys: the request's grant (set by the gate), the access log's record of it.
GRANT = "sessionstore.grant"
RECORD = "sessionstore.access"
_BODY_METHODS = frozenset({"PUT", "POST"})
_METHODS = frozenset({"GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS"})


class Gate:
    """ASGI middleware: the steps of the module docstring, then the routes."""

    def __init__(self, app: Any, *, tokens: Callable[[], Tokens | None], limiter: Limiter) -> None:
        self.app = app
        self.tokens = tokens
        self.limiter = limiter

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        forked = any(k == b"stream-forked-from" for k, _ in scope["headers"])
        cls = route_class(method, scope["path"], scope.get("query_string", b""), forked)
        record = scope.get(RECORD, {})
        record["route"] = cls
        if cls is None:
            await send_problem(send, 404, "not-found", "no route of this service", [])
            return
        rule = ROUTES[cls]
        tokens = self.tokens()
        if tokens is None or rule.action == PUBLIC:
            await self.app(scope, receive, send)
            return
        authorization = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        grant = tokens.grant_of(authorization.decode("latin-1"))
        if grant is None:
            await send_problem(send, 401, "unauthorized", "a bearer token is needed",
                               [(b"www-authenticate", b'Bearer realm="sessionstore"')])
            return
        tenant = record["tenant"] = grant.tenant
        limits = self.limiter.limits_of(tenant, tokens.limits)
        over = self.limiter.request(tenant, limits, has_body=method in _BODY_METHODS)
        if over is not None:
            what, wait = over
            await send_problem(send, 429, "rate-limited", f"tenant {tenant!r} is over its {what}",
                               [(b"retry-after", retry_after(wait).encode())])
            return
        why = scope_refusal(grant, rule)
        if why is not None:
            needed = scope_needed(rule)
            await send_problem(send, 403, "insufficient-scope", why,
                               [(b"www-authenticate", f'Bearer error="insufficient_scope", scope="{needed}"'.encode())],
                               scope_needed=needed)
            return
        if rule.follower and not self.limiter.follow(tenant, limits):
            await send_problem(send, 429, "too-many-followers",
                               f"tenant {tenant!r} has {limits.followers} live reads open, its limit",
                               [(b"retry-after", b"1")])
            return
        scope[GRANT] = grant

        async def charged_receive() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                self.limiter.body_bytes(tenant, limits, len(message.get("body", b"")))
            return message

        try:
            await self.app(scope, charged_receive if limits.bytes_per_s is not None else receive, send)
        finally:
            if rule.follower:
                self.limiter.unfollow(tenant)


class Requests:
    """ASGI middleware, outermost: every request counted and timed in the store's metrics
    (``sessionstore_http_request_seconds`` by route class, method and status;
    ``sessionstore_http_open_requests``: docs/operations.md) and, with ``log``, one line a
    request on :data:`access_log` (module docstring)."""

    def __init__(self, app: Any, *, metrics: Metrics, log: bool = False) -> None:
        self.app = app
        self.metrics = metrics
        self.log = log

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record: dict[str, Any] = {"route": None, "tenant": None}
        scope[RECORD] = record
        counts = {"in": 0, "out": 0, "status": None}
        started, t0 = time.time(), time.perf_counter()

        async def counted_receive() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                counts["in"] += len(message.get("body", b""))
            return message

        async def counted_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                counts["status"] = message["status"]
            elif message["type"] == "http.response.body":
                counts["out"] += len(message.get("body", b""))
            await send(message)

        self.metrics.http_open.inc()
        try:
            await self.app(scope, counted_receive, counted_send)
        finally:
            seconds = time.perf_counter() - t0
            self.metrics.http_open.dec()
            method = scope["method"] if scope["method"] in _METHODS else "other"
            status = str(counts["status"]) if counts["status"] is not None else "none"
            self.metrics.http_requests.labels(record["route"] or "none", method, status).observe(seconds)
            if self.log:
                access_log.info(orjson.dumps({
                    "time": datetime.fromtimestamp(started, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                    "tenant": record["tenant"],
                    "route": record["route"],
                    "method": scope["method"],
                    "status": counts["status"],
                    "bytes_in": counts["in"],
                    "bytes_out": counts["out"],
                    "ms": round(seconds * 1000, 1),
                }).decode())


__all__ = ["GRANT", "RECORD", "Gate", "Requests", "access_log"]
