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

import base64
import binascii
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from store.errors import InvalidInputError, SessionExistsError
from store.formats.layout import check_session_id
from store.protocol.listing import MAX_PAGE as STORE_PAGE
from store.protocol.listing import SessionFilter
from store.streams import PI_KIND, StreamNotFoundError

if TYPE_CHECKING:
    from store.protocol.handles import SessionHandle
    from store.http.auth import Grant
    from store.http.service import RouteService
    from store.formats.records import Header, SessionInfo

SESSIONS_ROOT = "/v1/sessions"
DEFAULT_PAGE = 50
MAX_PAGE = 500
#: What a listing cursor starts with (the rest: a session id, base64url).
_CURSOR_PREFIX = "s1."


class SessionRoutes:
    def __init__(self, service: RouteService) -> None:
        self.service = service
        self.store = service.store

    def close(self) -> None:
        pass  # nothing of its own to release (kept for the service's shutdown)

    # --- list --------------------------------------------------------------------------------

    async def list(self, request: Request) -> Response:
        q = request.query_params
        limit = _int_param(q, "limit", f"an integer from 1 to {MAX_PAGE}")
        if limit is None:
            limit = DEFAULT_PAGE
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidInputError(f"limit is 1..{MAX_PAGE}")
        after = _cursor_sid(q.get("after") or None)
        filters = SessionFilter(
            kind=PI_KIND,
            cwd=q.get("cwd"),
            cwd_prefix=q.get("cwd_prefix"),
            updated_since_ms=_int_param(q, "updated_since", "epoch milliseconds, an integer"),
            name_contains=q.get("title_contains"),
        )
        grant = self.service.grant_of(request)
        page, cursor = await self.service.run(self._page, grant, after, limit, filters)
        return _json({"sessions": page, "next": cursor})

    def _page(
        self, grant: Grant | None, after: str | None, limit: int, filters: SessionFilter
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Sessions in the layout's order (shard, then id) after the cursor, read from the
        store's listing (each page one LIST and one Redis round trip, ``store/protocol/listing.py``)
        without reading any session; ``next`` is None after the last page.

        Without tenants (and for the operator's token without a prefix), one page of the
        store's listing: the filters are applied to it, so it may be short, even empty, while
        ``next`` moves on.

        A tenant's cursor may name nothing but the sessions its token reaches (its tenant's,
        within the token's prefix if it has one): the cursor is the last session of the page,
        and a page whose last listed session is another tenant's would give it away (their
        ids are unkeyed hashes of their names, so a name can be confirmed offline). So a
        tenant's page is the first ``limit`` of its own sessions (those the filters keep)
        after the cursor, and ``next`` is the last of them: the store's listing is walked,
        in pages growing to 1,000, until they are found or it ends. Every own session after the cursor and up to ``next`` is on the page, and what
        lies between ``next`` and the last session walked is another tenant's (or filtered
        out), so the next page, which walks it again, finds nothing of the tenant's there:
        each of a tenant's sessions is on exactly one page, as before. The price is in
        requests: a page of a tenant that owns few of the store's sessions walks the others'
        too."""
        if grant is None or grant.sees_all:
            listed = self.store.list_sessions(cursor=after, limit=limit, filters=filters)
            return [_row(info) for info in listed.items], _cursor_of(listed.next_cursor)
        out: list[dict[str, Any]] = []
        size = limit
        while True:
            listed = self.store.list_sessions(cursor=after, limit=size, filters=filters)
            for info in listed.items:
                if grant.may_access(info.path or info.session_id):
                    out.append(_row(info))
                    if len(out) == limit:
                        return out, _cursor_of(info.session_id)
            if listed.next_cursor is None:
                return out, None
            after = listed.next_cursor
            size = min(STORE_PAGE, size * 2)

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
            body = _json_object(await self.service.read_body(request))
            entry_id, new_name = body.get("entry_id"), body.get("name")
            if not isinstance(new_name, str) or not new_name or not isinstance(entry_id, (str, type(None))):
                raise InvalidInputError('fork takes {"entry_id": "<id>" (default: the leaf), "name": "<new session>"}')
            self.service.authorize_name(request, new_name)
            await self.service.run(self._fork, sid, entry_id, new_name)
            return Response(status_code=201, headers={
                "Location": str(request.url.replace(path=f"/v1/stream/{new_name}", query="")),
            })
        if verb == "redact" and method == "POST":
            body = _json_object(await self.service.read_body(request))
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
            handle = await self.service.run(self._import, name, sid, data)
            return _json({"name": name, "session_id": handle.session_id}, status=201)
        raise _not_found(rest)

    def _session_id(self, name: str, creating: bool) -> str:
        sid = self.store.layout.stream_id(name)
        if creating:
            return sid
        header = self.service.streams.header_of(name)
        if header.kind != PI_KIND:
            raise StreamNotFoundError(f"{name!r} is a stream, not a session")
        return sid

    def _import(self, name: str, sid: str, data: bytes) -> SessionHandle:
        """The import of a pi file as the session ``name``: its header is written first,
        with the name (as a ``PUT`` does), so that the session is listed as its tenant's and
        the import then fills it (``import_pi_session`` extends a session whose pi header is
        the file's). The file is checked whole first (pass 1, with what a batch would
        refuse), so a refused file writes nothing. Nothing is ever deleted here: a header
        this call wrote may already hold another import's acknowledged entries by the time a
        paused process would delete it. A crash between the header and the import leaves an
        empty session of that name, which the same import, sent again, fills."""
        from store.pi.scan import scan_pi_file
        from store.pi_import import storable_check

        with scan_pi_file(data, entry_check=storable_check(self.store)) as scan:
            pi_header = dict(scan.require_header())
        try:
            self.store.create_session(sid, pi_header=pi_header, config={"path": name})
        except SessionExistsError:
            pass
        return self.store.import_pi_session(data, sid)

    def _fork(self, sid: str, entry_id: str | None, new_name: str) -> Header:
        store = self.store
        if entry_id is None:
            entry_id = store.load_session(sid).leaf_id
            if entry_id is None:
                raise InvalidInputError("the session has no entry to fork from")
        handle = store.branch_from_entry(sid, entry_id, store.layout.stream_id(new_name), config={"path": new_name})
        return handle.header


def _row(info: SessionInfo) -> dict[str, Any]:
    return {
        "name": info.path or info.session_id,
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
    }


def _cursor_of(sid: str | None) -> str | None:
    """A listing cursor: opaque to clients (its form may change), naming a session the
    caller may see."""
    if sid is None:
        return None
    return _CURSOR_PREFIX + base64.urlsafe_b64encode(sid.encode()).decode().rstrip("=")


def _cursor_sid(cursor: str | None) -> str | None:
    if cursor is None:
        return None
    body = cursor[len(_CURSOR_PREFIX):]
    try:
        if not cursor.startswith(_CURSOR_PREFIX) or len(body) > 256:
            raise ValueError
        return check_session_id(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode())
    except (ValueError, binascii.Error, InvalidInputError):
        raise InvalidInputError("after: not a cursor of this listing (pass a page's next)") from None


def _not_found(rest: str) -> StreamNotFoundError:
    return StreamNotFoundError(f"no session action {rest!r} (:context, :fork, :redact, :export, :import)")


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidInputError("the body is not JSON") from None
    if not isinstance(value, dict):
        raise InvalidInputError("the body is a JSON object")
    return value


def _int_param(q: Any, name: str, what: str) -> int | None:
    """An integer of the query; a number of more than 16 digits is refused by its length,
    before Python converts it."""
    raw = q.get(name)
    if raw is None:
        return None
    digits = raw[1:] if raw.startswith("-") else raw
    if not digits.isascii() or not digits.isdigit() or len(digits) > 16:
        raise InvalidInputError(f"{name}: {what}")
    return int(raw)


def _json(value: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(value), status_code=status, headers={"content-type": "application/json"})


__all__ = ["SESSIONS_ROOT", "SessionRoutes"]
