"""The Claude Agent SDK's ``SessionStore`` over HTTP, for SDKs in other languages.

``store/http/js/claude-session-store.mjs`` implements the TypeScript SDK's ``SessionStore``
with these routes; behind them is the Python adapter (``store.adapters.claude_agent_sdk``),
so a transcript written from TypeScript and one written from Python are the same transcript,
with the same guarantees (uuids stored once however often sent, each writer's order kept,
summaries folded from the transcripts when listed). Each tenant is a namespace of its own.

Every route is ``POST /v1/claude/<method>`` with a JSON body (keys hold any characters, so
they travel in bodies, not in paths), in the TypeScript SDK's own field names:

| method | body | answer |
| --- | --- | --- |
| ``append`` | ``{"key": {"projectKey", "sessionId", "subpath"?}, "entries": [...]}`` | 204 |
| ``load`` | ``{"key": ...}`` | ``{"entries": [...] or null}`` |
| ``list-sessions`` | ``{"projectKey"}`` | ``[{"sessionId", "mtime"}]`` |
| ``list-session-summaries`` | ``{"projectKey"}`` | ``[{"sessionId", "mtime", "data"}]`` |
| ``list-subkeys`` | ``{"key": {"projectKey", "sessionId"}}`` | ``["subagents/agent-1", ...]`` |
| ``delete`` | ``{"key": ...}`` | 204 |

Summaries are folded by the Python SDK's ``fold_session_summary``, whose opaque ``data``
spells its fields in snake case where the TypeScript fold uses camel case (``first_prompt``,
``firstPrompt``); ``list-session-summaries`` answers in the caller's spelling
(``"dialect": "ts"``, the default here, or ``"py"``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from store.errors import InvalidInputError

if TYPE_CHECKING:
    from store.adapters.claude_agent_sdk import ClaudeSessionStore
    from store.http.service import RouteService

CLAUDE_ROOT = "/v1/claude"
_SNAKE = re.compile(r"_([a-z0-9])")


class ClaudeRoutes:
    def __init__(self, service: RouteService) -> None:
        self.service = service
        self._stores: dict[str, ClaudeSessionStore] = {}

    async def close(self) -> None:
        for store in self._stores.values():
            await store.close()
        self._stores.clear()

    def _store_for(self, tenant: str | None) -> ClaudeSessionStore:
        namespace = "" if tenant in (None, "*") else f"tenant:{tenant}"
        store = self._stores.get(namespace)
        if store is None:
            try:
                from store.adapters.claude_agent_sdk import ClaudeSessionStore
                from store.aio import AsyncSessionStore
            except ImportError as exc:
                raise _Unavailable(f"the claude-agent-sdk extra is not installed here ({exc})") from None
            aio = AsyncSessionStore(self.service.store, owns_store=False)
            store = self._stores[namespace] = ClaudeSessionStore(aio, namespace=namespace, owns_store=True)
        return store

    async def handle(self, request: Request) -> Response:
        method = request.url.path[len(CLAUDE_ROOT) + 1:]
        if request.method != "POST":
            raise InvalidInputError("the Claude routes are POST /v1/claude/<method>")
        tenant = self.service.tenant_of(request)
        try:
            body = orjson.loads(await self.service.read_body(request))
        except orjson.JSONDecodeError:
            raise InvalidInputError("the body is not JSON") from None
        if not isinstance(body, dict):
            raise InvalidInputError("the body is a JSON object")
        try:
            store = self._store_for(tenant)
        except _Unavailable as exc:
            return Response(
                orjson.dumps({"status": 501, "code": "not-implemented", "detail": str(exc)}),
                status_code=501, headers={"content-type": "application/problem+json"},
            )
        if method == "append":
            entries = body.get("entries")
            if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
                raise InvalidInputError("entries: a list of JSON objects")
            await store.append(_key(body.get("key")), entries)
            return Response(status_code=204)
        if method == "load":
            return _json({"entries": await store.load(_key(body.get("key")))})
        if method == "list-sessions":
            listed = await store.list_sessions(_project(body))
            return _json([{"sessionId": s["session_id"], "mtime": s["mtime"]} for s in listed])
        if method == "list-session-summaries":
            camel = body.get("dialect", "ts") == "ts"
            summaries = await store.list_session_summaries(_project(body))
            return _json([
                {"sessionId": s["session_id"], "mtime": s["mtime"],
                 "data": {_camel(k): v for k, v in s["data"].items()} if camel else s["data"]}
                for s in summaries
            ])
        if method == "list-subkeys":
            key = body.get("key")
            if not isinstance(key, dict):
                raise InvalidInputError("key: {projectKey, sessionId}")
            sub = {"project_key": _str(key, "projectKey"), "session_id": _str(key, "sessionId")}
            return _json(await store.list_subkeys(sub))  # type: ignore[arg-type]
        if method == "delete":
            await store.delete(_key(body.get("key")))
            return Response(status_code=204)
        raise InvalidInputError(f"no Claude method {method!r}")


class _Unavailable(Exception):
    pass


def _camel(name: str) -> str:
    return _SNAKE.sub(lambda m: m.group(1).upper(), name)


def _str(obj: dict[str, Any], field: str) -> str:
    value = obj.get(field)
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{field}: a non-empty string")
    return value


def _project(body: dict[str, Any]) -> str:
    return _str(body, "projectKey")


def _key(value: Any) -> Any:
    """A TypeScript ``SessionKey`` as the Python adapter's."""
    if not isinstance(value, dict):
        raise InvalidInputError("key: {projectKey, sessionId, subpath?}")
    key: dict[str, Any] = {"project_key": _str(value, "projectKey"), "session_id": _str(value, "sessionId")}
    if value.get("subpath") is not None:
        key["subpath"] = _str(value, "subpath")
    return key


def _json(value: Any) -> Response:
    return Response(orjson.dumps(value), headers={"content-type": "application/json"})


__all__ = ["CLAUDE_ROOT", "ClaudeRoutes"]
