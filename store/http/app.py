"""The Durable Streams protocol over HTTP, on the store: an ASGI app (Starlette).

Streams live at ``/v1/stream/{path}`` and speak the protocol of the Durable Streams
specification (``PROTOCOL.md``, version 1.0): ``PUT`` create (and fork), ``POST`` append
and close, ``GET`` catch-up, long-poll and SSE reads, ``HEAD``, ``DELETE``; JSON mode,
``Stream-Seq``, idempotent producers, TTL and Expires-At, ETags, CORS (for the origins
allowed: ``store/http/guard.py``, which also checks ``Host`` and ``Origin``). What a stream *is*
(records, offsets, producer state, forks) is ``store/streams/``; this module is its routes
(statuses of the store's errors: ``store/http/problems.py``; what headers and bodies mean and
how answers are written: ``store/http/wire.py``).

Processes share nothing but the object store and Redis: any number of them serve the same
streams behind any load balancer, with no sticky sessions. A live reader waits on a
notification (``store/http/notify.py``), never by polling S3.

Every blocking call (the store is synchronous) runs on this app's thread pool, so the event
loop only waits; a live reader holds no thread while it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import orjson

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from store.core import SessionStore
from store.errors import SessionStoreError
from store.http.auth import Grant, TokenFile, Tokens
from store.http.claude import CLAUDE_ROOT, ClaudeRoutes
from store.http.gate import GRANT, Gate, Requests
from store.http.guard import DEFAULT_BODY_TIMEOUT_S, Guard
from store.http.limits import Limiter, TenantLimits
from store.http.notify import Notifier
from store.http.problems import problem_of
from store.http.sessions import SESSIONS_ROOT, SessionRoutes
from store.http.viewer import UI_ROOT, ViewerFiles
from store.http.wire import (
    OFFSET_PARAM,
    STREAM_ROOT,
    ClientGone,
    HttpError,
    body_of,
    body_response,
    next_cursor,
    parse_expires_at,
    parse_flag,
    parse_if_match,
    parse_messages,
    parse_producer,
    parse_ttl,
    problem_response,
    sse_base64,
    sse_control,
    sse_data,
    stream_name,
    uint,
)
from store.streams import START, AppendOutcome, Offset, ReadResult, StreamError, StreamInfo, Streams

log = logging.getLogger("sessionstore.http")
T = TypeVar("T")

#: How long a long-poll waits at the tail before answering 204.
DEFAULT_LONG_POLL_S = 2.0
#: How long one SSE response stays open (the client reconnects from its last offset).
DEFAULT_SSE_MAX_S = 60.0
#: Largest request body: a stream's record holds it base64-encoded, within the store's
#: 16 MiB batch limit.
DEFAULT_MAX_BODY = 12 * 1024 * 1024
#: Most bytes one catch-up response carries (clients continue from Stream-Next-Offset).
DEFAULT_MAX_READ = 4 * 1024 * 1024


class StreamService:
    """The protocol on one store. ``app`` is the ASGI application.

    Tokens: ``tokens`` (fixed), or ``tokens_file``, read again whenever it changes while the
    app runs (``store/http/auth.py``); neither: no tokens, everyone is everything. ``limits``:
    every tenant's limits but those the tokens file sets (``store/http/limits.py``).
    ``access_log``: one line a request on the ``sessionstore.access`` logger
    (``store/http/gate.py``). Every request is counted in the store's metrics, which
    ``GET /metrics`` serves to the operator (docs/operations.md)."""

    def __init__(
        self,
        store: SessionStore,
        *,
        long_poll_s: float = DEFAULT_LONG_POLL_S,
        sse_max_s: float = DEFAULT_SSE_MAX_S,
        max_body: int = DEFAULT_MAX_BODY,
        max_read: int = DEFAULT_MAX_READ,
        max_messages: int = 10_000,
        threads: int = 32,
        tokens: Tokens | None = None,
        tokens_file: str | Path | None = None,
        limits: TenantLimits | None = None,
        access_log: bool = False,
        cors_origins: Sequence[str] = (),
        allowed_hosts: Sequence[str] = (),
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    ) -> None:
        self.store = store
        if tokens is not None and tokens_file is not None:
            raise ValueError("tokens or tokens_file, not both")
        self._tokens = tokens
        self.token_file = TokenFile(tokens_file) if tokens_file is not None else None
        self.limiter = Limiter(limits)
        self.max_messages = max_messages
        self.streams = Streams(store)
        self.notifier = Notifier(self.streams.ctx.coord)
        self.long_poll_s = long_poll_s
        self.sse_max_s = sse_max_s
        self.max_body = max_body
        self.max_read = max_read
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="sessionstore-http")
        methods = ["GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS"]
        self.sessions = SessionRoutes(self)
        self.claude = ClaudeRoutes(self)
        self.viewer = ViewerFiles()
        self.app = Starlette(
            routes=[
                Route(STREAM_ROOT + "{name:path}", self.handle, methods=methods),
                Route(SESSIONS_ROOT, self._guarded(self.sessions.list), methods=["GET", "OPTIONS"]),
                Route(SESSIONS_ROOT + "/{rest:path}", self._guarded(self.sessions.action),
                      methods=["GET", "PUT", "POST", "OPTIONS"]),
                Route(CLAUDE_ROOT + "/{method}", self._guarded(self.claude.handle), methods=["POST", "OPTIONS"]),
                Route("/healthz", self.health, methods=["GET"]),
                Route("/readyz", self.ready, methods=["GET"]),
                Route("/metrics", self.metrics, methods=["GET"]),
                # The browser viewer's static files (store/http/viewer.py): GET only, public.
                Route(UI_ROOT.rstrip("/"), self.viewer.redirect, methods=["GET"]),
                Route(UI_ROOT + "{path:path}", self.viewer.handle, methods=["GET"]),
            ],
            lifespan=self._lifespan,
        )
        # Outermost first: the metrics and access log, the guard, the gate, the routes. Host is checked
        # without tokens (loopback: against DNS rebinding) or when names are given; Origin
        # and CORS always (store/http/guard.py); the gate answers with the guard's headers.
        self.app.add_middleware(Gate, tokens=lambda: self.tokens, limiter=self.limiter)
        self.app.add_middleware(
            Guard, check_host=self.tokens is None or bool(allowed_hosts), allowed_hosts=allowed_hosts,
            cors_origins=cors_origins, body_timeout_s=body_timeout_s,
        )
        self.app.add_middleware(Requests, metrics=store.metrics, log=access_log)

    @property
    def tokens(self) -> Tokens | None:
        """The tokens in force (None: no tokens). A tokens file is looked at on every request
        (one ``stat``; read again when it changed): a process that was paused answers its next
        request with the file as it is now, never with the tokens it read before the pause."""
        if self.token_file is None:
            return self._tokens
        self.token_file.poll()
        return self.token_file.tokens

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.notifier.start()
        try:
            yield
        finally:
            await self.claude.close()
            await asyncio.get_running_loop().run_in_executor(None, self.close)

    def close(self) -> None:
        self.notifier.close()
        self.sessions.close()
        self._pool.shutdown(wait=True)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on this service's threads (the store is synchronous)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    _run = run

    def _guarded(self, handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            if request.method == "OPTIONS":
                return Response(status_code=204)
            return await self._answer(request, lambda: handler(request))

        return endpoint

    # --- dispatch ------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        return Response(b"ok\n", headers={"content-type": "text/plain"})

    async def ready(self, request: Request) -> Response:
        """Readiness: 200 when the object store and Redis both answer now, else 503 naming
        the one that does not (``SessionStore.check_backends``)."""
        checks = await self.run(self.store.check_backends)
        body = orjson.dumps({name: "ok" if failed is None else failed for name, failed in checks.items()})
        status = 200 if all(failed is None for failed in checks.values()) else 503
        return Response(body, status_code=status, headers={"content-type": "application/json",
                                                             "Cache-Control": "no-store"})

    async def metrics(self, request: Request) -> Response:
        """The process's Prometheus metrics (docs/operations.md): the operator's (route class
        ``metrics``, ``store/http/access.py``)."""
        body, content_type = await self.run(self.store.metrics.exposition)
        return Response(body, headers={"content-type": content_type, "Cache-Control": "no-store"})

    async def handle(self, request: Request) -> Response:
        # Streams are named by the rest of the path: /v1/stream/acme/chat-1 is "acme/chat-1".
        path = request.url.path[len(STREAM_ROOT):]
        method = request.method
        if method == "OPTIONS":
            return Response(status_code=204)

        async def dispatch() -> Response:
            if not path:
                raise HttpError(404, "stream-not-found", "no stream named")
            self._authorize(request, path)
            if method == "PUT":
                return await self.put(request, path)
            if method == "POST":
                return await self.post(request, path)
            if method == "GET":
                return await self.get(request, path)
            if method == "HEAD":
                return await self.head(request, path)
            return await self.delete(request, path)

        return await self._answer(request, dispatch)

    async def _answer(self, request: Request, respond: Callable[[], Any]) -> Response:
        """``await respond()``, every refusal turned into its status and problem document."""
        try:
            return await respond()
        except ClientGone as exc:
            # Nobody to answer, nothing written: one line, no traceback.
            log.info("%s %s: %s", request.method, request.url.path, exc)
            return Response(status_code=400, headers={"connection": "close"})
        except HttpError as exc:
            return problem_response(exc.status, exc.code, exc.detail, exc.headers)
        except SessionStoreError as exc:
            answer = problem_of(exc)
            if answer is None:
                log.exception("request failed")
                return problem_response(500, "internal", type(exc).__name__)
            status, code, detail, headers = answer
            return problem_response(status, code, detail, headers)

    def grant_of(self, request: Request) -> Grant | None:
        """What the request's token grants, as the gate found it (None when no tokens are
        configured: everyone is everything); 401 without one."""
        if self.tokens is None:
            return None
        grant: Grant | None = request.scope.get(GRANT)
        if grant is None:
            raise HttpError(401, "unauthorized", "a bearer token is needed",
                            {"WWW-Authenticate": 'Bearer realm="sessionstore"'})
        return grant

    def tenant_of(self, request: Request) -> str | None:
        """The request's tenant (None when no tokens are configured); 401 without a token."""
        grant = self.grant_of(request)
        return None if grant is None else grant.tenant

    def authorize_name(self, request: Request, name: str) -> None:
        """401 without a known token, 403 for a name the token does not reach (another
        tenant's, or outside its prefix)."""
        grant = self.grant_of(request)
        if grant is not None and not grant.may_access(name):
            raise HttpError(403, "forbidden", "this token does not reach that name (another tenant's, "
                                              "or outside the token's prefix)")

    def _authorize(self, request: Request, path: str) -> None:
        self.authorize_name(request, path)
        source = request.headers.get("stream-forked-from")
        if source is not None:
            self.authorize_name(request, stream_name(source))

    # --- PUT: create and fork ------------------------------------------------------------------

    async def put(self, request: Request, path: str) -> Response:
        h = request.headers
        ttl_s = parse_ttl(h.get("stream-ttl"))
        expires_at, expires_at_ms = parse_expires_at(h.get("stream-expires-at"))
        if ttl_s is not None and expires_at is not None:
            raise HttpError(400, "bad-request", "Stream-TTL and Stream-Expires-At together")
        close = parse_flag(h.get("stream-closed"))
        fork_from = h.get("stream-forked-from")
        fork_offset = h.get("stream-fork-offset")
        sub = h.get("stream-fork-sub-offset")
        fork_sub = 0
        if sub is not None:
            if fork_from is None:
                raise HttpError(400, "bad-request", "Stream-Fork-Sub-Offset needs Stream-Forked-From")
            fork_sub = uint(sub, "Stream-Fork-Sub-Offset")
        if fork_offset is not None and fork_from is None:
            raise HttpError(400, "bad-request", "Stream-Fork-Offset needs Stream-Forked-From")
        offset = None
        if fork_offset is not None:
            offset = Offset.parse(fork_offset) if fork_offset != "-1" else START
        content_type = h.get("content-type") or None
        body = await self.read_body(request)
        msgs = parse_messages(body, content_type, allow_empty_array=True) if body else []
        if fork_from is not None:
            fork_from = stream_name(fork_from)
        self._check_count(msgs)
        kind = (h.get("stream-kind") or "stream").strip().lower()
        if kind == "session":
            kind = "pi"
        if kind not in ("stream", "pi"):
            raise HttpError(400, "bad-request", "Stream-Kind is stream or session")
        created, info = await self._run(
            self.streams.create,
            path,
            content_type=content_type,
            ttl_s=ttl_s,
            expires_at_ms=expires_at_ms,
            expires_at=expires_at,
            fork_from=fork_from,
            fork_offset=offset,
            fork_sub=fork_sub,
            msgs=msgs,
            close=close,
            kind=kind,
            cwd=h.get("session-cwd"),
        )
        headers = self._info_headers(info)
        if created:
            headers["Location"] = str(request.url.replace(query=""))
            self.notifier.notify(info.session_id)
        return Response(status_code=201 if created else 200, headers=headers)

    # --- POST: append and close ---------------------------------------------------------------

    async def post(self, request: Request, path: str) -> Response:
        h = request.headers
        producer = parse_producer(h)
        close = parse_flag(h.get("stream-closed"))
        stream_seq = h.get("stream-seq")
        content_type = h.get("content-type") or None
        body = await self.read_body(request)
        if not body and not close:
            raise HttpError(400, "empty-body", "an append needs a body")
        if body and content_type is None:
            raise HttpError(400, "bad-request", "an append needs a Content-Type")
        msgs = parse_messages(body, content_type, allow_empty_array=False) if body else []
        self._check_count(msgs)
        if_match = parse_if_match(h.get("if-match"))
        outcome: AppendOutcome = await self._run(
            self.streams.append,
            path,
            msgs,
            content_type=content_type,
            producer=producer,
            stream_seq=stream_seq,
            close=close,
            if_match=if_match,
        )
        headers = {"Stream-Next-Offset": str(outcome.next_offset)}
        if outcome.closed:
            headers["Stream-Closed"] = "true"
        if producer is not None and outcome.producer is not None:
            headers["Producer-Epoch"] = str(outcome.producer[0])
            headers["Producer-Seq"] = str(outcome.producer[1])
        if not outcome.duplicate:
            self.notifier.notify(self.streams.store.layout.stream_id(path))
        status = 200 if producer is not None and not outcome.duplicate and msgs else 204
        return Response(status_code=status, headers=headers)

    # --- GET: catch-up, long-poll, SSE --------------------------------------------------------

    async def get(self, request: Request, path: str) -> Response:
        q = request.query_params
        offsets = q.getlist("offset")
        if len(offsets) > 1:
            raise HttpError(400, "invalid-offset", "one offset parameter at most")
        raw = offsets[0] if offsets else None
        if raw is not None and not OFFSET_PARAM.fullmatch(raw):
            raise HttpError(400, "invalid-offset", "offset is -1, now, or an offset this server returned")
        live = q.get("live")
        if live is not None and live not in ("long-poll", "sse"):
            raise HttpError(400, "bad-request", "live is long-poll or sse")
        if live is not None and raw is None:
            raise HttpError(400, "invalid-offset", f"live={live} needs an offset")
        now = raw == "now"
        offset = None if now else (START if raw in (None, "-1") else Offset.parse(raw))
        if live == "sse":
            return await self._sse(request, path, offset)
        if live == "long-poll":
            return await self._long_poll(request, path, offset)
        res, info, body = await self._run(self._read_body, path, offset)
        headers = self._read_headers(info, res)
        if now:
            headers["Cache-Control"] = "no-store"
        else:
            etag = f'"{info.session_id}:{offset}:{res.next_offset}{":c" if res.closed else ""}"'
            headers["ETag"] = etag
            # With tokens an answer is one tenant's: no shared cache may keep it.
            scope = "public" if self.tokens is None else "private"
            headers["Cache-Control"] = (
                "no-store" if res.up_to_date else f"{scope}, max-age=60, stale-while-revalidate=300"
            )
            if self.tokens is not None:
                headers["Vary"] = "Authorization"
            if request.headers.get("if-none-match") == etag:
                return Response(status_code=304, headers=headers)
        return body_response(body, headers)

    def _read_body(self, path: str, offset: Offset | None) -> tuple[ReadResult, StreamInfo, list[bytes]]:
        """A catch-up read and its body, encoded on the service's threads (never on the event
        loop, which every other request shares)."""
        res, info = self.streams.read_info(path, offset, max_bytes=self.max_read)
        return res, info, body_of(info, res.batches)

    def _sse_chunk(
        self, path: str, offset: Offset | None, info: StreamInfo, b64: bool, cursor: str, first: bool
    ) -> tuple[ReadResult, bytes]:
        """One read of an SSE response and its events, framed (and base64-encoded) on the
        service's threads, not on the event loop."""
        res = self.streams.read(path, offset, max_bytes=self.max_read)
        out: list[bytes] = []
        for i, batch in enumerate(res.batches):
            out.append(sse_data(info, batch, b64))
            last = i == len(res.batches) - 1
            end = res.next_offset if last else batch.end
            out.append(sse_control(end, cursor, up_to_date=last and res.up_to_date, closed=last and res.closed))
        if not res.batches and (first or res.closed):
            out.append(sse_control(res.next_offset, cursor, up_to_date=True, closed=res.closed))
        return res, b"".join(out)

    async def _long_poll(self, request: Request, path: str, offset: Offset | None) -> Response:
        sid = self.streams.store.layout.stream_id(path)
        cursor = next_cursor(request.query_params.get("cursor"))
        deadline = time.monotonic() + self.long_poll_s
        ev = self.notifier.watch(sid)
        followers = self.store.metrics.followers.labels("long_poll")
        followers.inc()
        try:
            while True:
                # Cleared before the read: a wake-up that comes while it reads makes it look
                # again (one cleared after the read could have announced what it missed).
                ev.clear()
                res, info, body = await self._run(self._read_body, path, offset)
                if offset is None:
                    offset = res.tail
                headers = self._read_headers(info, res)
                headers["Cache-Control"] = "no-store"
                if res.batches:
                    if not res.closed:
                        headers["Stream-Cursor"] = cursor
                    return body_response(body, headers)
                if res.closed:
                    return Response(status_code=204, headers=headers)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    headers["Stream-Cursor"] = cursor
                    return Response(status_code=204, headers=headers)
                try:
                    await asyncio.wait_for(ev.wait(), timeout=min(remaining, 5.0))
                except TimeoutError:
                    pass
        finally:
            followers.dec()
            self.notifier.unwatch(sid, ev)

    async def _sse(self, request: Request, path: str, offset: Offset | None) -> Response:
        sid = self.streams.store.layout.stream_id(path)
        # Fail before the 200 if the stream is missing.
        info: StreamInfo = await self._run(self.streams.info, path)
        cursor = next_cursor(request.query_params.get("cursor"))
        b64 = sse_base64(info.config.content_type)
        headers = {
            "content-type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
        if b64:
            headers["Stream-SSE-Data-Encoding"] = "base64"
        return StreamingResponse(
            self._sse_events(path, sid, offset, cursor, info, b64), headers=headers
        )

    async def _sse_events(
        self, path: str, sid: str, offset: Offset | None, cursor: str, info: StreamInfo, b64: bool
    ) -> AsyncIterator[bytes]:
        ev = self.notifier.watch(sid)
        started = time.monotonic()
        first = True
        followers = self.store.metrics.followers.labels("sse")
        followers.inc()
        try:
            while True:
                ev.clear()
                try:
                    res, chunk = await self._run(self._sse_chunk, path, offset, info, b64, cursor, first)
                except StreamError:
                    return  # deleted or expired while followed: end the response
                first = False
                if chunk:
                    yield chunk
                offset = res.next_offset
                if res.closed:
                    return
                if not res.up_to_date:
                    continue
                remaining = self.sse_max_s - (time.monotonic() - started)
                if remaining <= 0:
                    return
                try:
                    await asyncio.wait_for(ev.wait(), timeout=min(remaining, 15.0))
                except TimeoutError:
                    yield b": keep-alive\n\n"
        finally:
            followers.dec()
            self.notifier.unwatch(sid, ev)

    # --- HEAD, DELETE -------------------------------------------------------------------------

    async def head(self, request: Request, path: str) -> Response:
        info: StreamInfo = await self._run(self.streams.info, path)
        headers = self._info_headers(info)
        headers["Cache-Control"] = "no-store"
        return Response(status_code=200, headers=headers)

    async def delete(self, request: Request, path: str) -> Response:
        await self._run(self.streams.delete, path)
        self.notifier.notify(self.streams.store.layout.stream_id(path))
        return Response(status_code=204)

    # --- helpers ------------------------------------------------------------------------------

    async def read_body(self, request: Request) -> bytes:
        """The whole body, or 413 after draining it (answering while a client still sends
        would reset its connection): every route reads its body here, so one limit
        (``max_body``) holds for all. A client gone before its body ended is
        :class:`ClientGone`."""
        chunks: list[bytes] = []
        size = 0
        over = False
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > self.max_body:
                    over = True
                    chunks.clear()
                elif not over:
                    chunks.append(chunk)
        except ClientDisconnect:
            raise ClientGone(f"the client left after {size} bytes of its body") from None
        if over:
            raise HttpError(413, "too-large", f"the body is over {self.max_body} bytes")
        return b"".join(chunks)

    def _check_count(self, msgs: list[Any]) -> None:
        if len(msgs) > self.max_messages:
            raise HttpError(413, "too-large", f"{len(msgs)} messages in one append; the limit is {self.max_messages}")

    def _info_headers(self, info: StreamInfo) -> dict[str, str]:
        headers = {"content-type": info.config.content_type, "Stream-Next-Offset": str(info.tail)}
        if info.closed:
            headers["Stream-Closed"] = "true"
        if info.config.ttl_s is not None:
            headers["Stream-TTL"] = str(info.config.ttl_s)
        if info.config.expires_at is not None:
            headers["Stream-Expires-At"] = info.config.expires_at
        return headers

    def _read_headers(self, info: StreamInfo, res: ReadResult) -> dict[str, str]:
        headers = {"content-type": info.config.content_type, "Stream-Next-Offset": str(res.next_offset)}
        if res.up_to_date:
            headers["Stream-Up-To-Date"] = "true"
        if res.closed:
            headers["Stream-Closed"] = "true"
        return headers


def create_app(store: SessionStore, **options: Any) -> Starlette:
    """The ASGI app serving ``store`` (options: those of :class:`StreamService`)."""
    return StreamService(store, **options).app


__all__ = ["DEFAULT_LONG_POLL_S", "StreamService", "create_app"]
