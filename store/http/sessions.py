"""Session extras over HTTP, beside the stream protocol: list, context, fork, redact, pi files.

A session is a stream (``/v1/stream/<name>``: read, append, follow with any Durable Streams
client; entry ids are the idempotency key; ``If-Match: "<entry id>"``). What only a session
has lives at ``/v1/sessions``:

| request | does |
| --- | --- |
| ``GET /v1/sessions?limit=N&after=CURSOR`` | a page of sessions: name, title, first message, cwd, created, updated, entries, bytes, fork of (filters: ``cwd``, ``cwd_prefix``, ``updated_since``, ``title_contains``) |
| ``GET /v1/sessions/<name>:context?leaf=ID`` | the context pi would send to the model at a leaf |
| ``POST /v1/sessions/<name>:fork`` ``{"entry_id", "name"}`` | a new session whose history is the path to the entry (copies nothing) |
| ``POST /v1/sessions/<name>:redact`` ``{"entry_id", "reason"}`` | hide an entry's content from every reader |
| ``GET /v1/sessions/<name>:export`` | the session as a pi v3 JSONL file |
| ``PUT /v1/sessions/<name>:import`` | a pi JSONL file (v1-v3) as a session of that name |

Errors are RFC 9457 problem documents, as on the stream routes; tenants' tokens apply alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from store.errors import InvalidInputError
from store.listing import SessionFilter
from store.streams import PI_KIND, StreamNotFoundError, stream_session_id

if TYPE_CHECKING:
    from store.http.app import StreamService
    from store.records import Header

SESSIONS_ROOT = "/v1/sessions"
DEFAULT_PAGE = 50
MAX_PAGE = 500


class SessionRoutes:
    def __init__(self, service: StreamService) -> None:
        self.service = service
        self.store = service.store

    def close(self) -> None:
        pass  # nothing of its own to release (kept for the service's shutdown)

    # --- list --------------------------------------------------------------------------------

    async def list(self, request: Request) -> Response:
        q = request.query_params
        try:
            limit = int(q.get("limit", DEFAULT_PAGE))
        except ValueError:
            limit = -1
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidInputError(f"limit is 1..{MAX_PAGE}")
        after = q.get("after") or None
        filters = SessionFilter(
            kind=PI_KIND,
            cwd=q.get("cwd"),
            cwd_prefix=q.get("cwd_prefix"),
            updated_since_ms=_int_param(q, "updated_since"),
            name_contains=q.get("title_contains"),
        )
        tenant = self.service.tenant_of(request)
        page, cursor = await self.service.run(self._page, tenant, after, limit, filters)
        return _json({"sessions": page, "next": cursor})

    def _page(
        self, tenant: str | None, after: str | None, limit: int, filters: SessionFilter
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Sessions in the layout's order (shard, then id) after the cursor: one page of the
        store's listing (one LIST and one Redis round trip, ``store/listing.py``), without
        reading any session. The
        filters and the tenant's own are applied to the page: it may be short, even empty,
        while ``next`` moves on (None after the last page)."""
        listed = self.store.list_sessions(cursor=after, limit=limit, filters=filters)
        out = []
        for info in listed.items:
            name = info.path or info.session_id
            if tenant is not None and not self.service.may_access(tenant, name):
                continue
            out.append({
                "name": name,
                "session_id": info.session_id,
                "title": info.name,
                "first_message": info.first_message,
                "cwd": info.cwd,
                "created_at_ms": info.created_at_ms,
                "updated_at_ms": info.updated_at_ms,
                "entries": info.entry_count,
                "bytes": info.bytes,
                "fork_of": None if info.fork_of is None
                else {"session_id": info.fork_of, "entry_id": info.fork_entry_id},
            })
        return out, listed.next_cursor

    # --- actions on one session --------------------------------------------------------------

    async def action(self, request: Request) -> Response:
        rest = request.url.path[len(SESSIONS_ROOT) + 1:]
        name, sep, verb = rest.rpartition(":")
        if not sep or not name:
            raise _not_found(rest)
        self.service.authorize_name(request, name)
        method = request.method
        sid = await self.service.run(self._session_id, name, verb == "import")
        if verb == "context" and method == "GET":
            leaf = request.query_params.get("leaf") or None
            context = await self.service.run(lambda: self.store.load_session(sid).build_context(leaf))
            return _json(context)
        if verb == "fork" and method == "POST":
            body = await _body_json(request)
            entry_id, new_name = body.get("entry_id"), body.get("name")
            if not isinstance(new_name, str) or not new_name or not isinstance(entry_id, (str, type(None))):
                raise InvalidInputError('fork takes {"entry_id": "<id>" (default: the leaf), "name": "<new session>"}')
            self.service.authorize_name(request, new_name)
            await self.service.run(self._fork, sid, entry_id, new_name)
            return Response(status_code=201, headers={
                "Location": str(request.url.replace(path=f"/v1/stream/{new_name}", query="")),
            })
        if verb == "redact" and method == "POST":
            body = await _body_json(request)
            entry_id, reason = body.get("entry_id"), body.get("reason")
            if not isinstance(entry_id, str) or not isinstance(reason, str) or not reason:
                raise InvalidInputError('redact takes {"entry_id": "<id>", "reason": "<why>"}')
            result = await self.service.run(self.store.redact, sid, entry_id, reason)
            self.service.notifier.notify(sid)
            return _json({"seq": result.seq, "entry_id": result.last_appended_entry_id})
        if verb == "export" and method == "GET":
            lines = await self.service.run(lambda: list(self.store.iter_export_pi_session(sid)))
            return Response("".join(lines).encode(), headers={"content-type": "application/x-ndjson"})
        if verb == "import" and method == "PUT":
            data = await self.service.read_body(request)
            handle = await self.service.run(self.store.import_pi_session, data, sid)
            return _json({"name": name, "session_id": handle.session_id}, status=201)
        raise _not_found(rest)

    def _session_id(self, name: str, creating: bool) -> str:
        sid = stream_session_id(name)
        if creating:
            return sid
        header = self.service.streams.header_of(name)
        if header.kind != PI_KIND:
            raise StreamNotFoundError(f"{name!r} is a stream, not a session")
        return sid

    def _fork(self, sid: str, entry_id: str | None, new_name: str) -> Header:
        store = self.store
        if entry_id is None:
            entry_id = store.load_session(sid).leaf_id
            if entry_id is None:
                raise InvalidInputError("the session has no entry to fork from")
        handle = store.branch_from_entry(sid, entry_id, stream_session_id(new_name), config={"path": new_name})
        return handle.header


def _not_found(rest: str) -> StreamNotFoundError:
    return StreamNotFoundError(f"no session action {rest!r} (:context, :fork, :redact, :export, :import)")


async def _body_json(request: Request) -> dict[str, Any]:
    try:
        value = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        raise InvalidInputError("the body is not JSON") from None
    if not isinstance(value, dict):
        raise InvalidInputError("the body is a JSON object")
    return value


def _int_param(q: Any, name: str) -> int | None:
    raw = q.get(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidInputError(f"{name}: epoch milliseconds, an integer") from None


def _json(value: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(value), status_code=status, headers={"content-type": "application/json"})


__all__ = ["SESSIONS_ROOT", "SessionRoutes"]
