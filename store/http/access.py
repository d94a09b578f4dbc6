"""Which action every route needs: one table, the only place a route's scope is decided.

Each request is given a *route class* by :func:`route_class` (from its method, path, query
and headers alone, before any route runs), and :data:`ROUTES` says what that class needs.
``store/http/gate.py`` refuses a request whose class is unknown (404), so a route added to
the app without a line here answers nothing until it has one.

| action | granted to |
| --- | --- |
| ``public`` | everyone, without a token (``/healthz``, ``/readyz``, CORS preflights, the viewer's static files under ``/ui/``) |
| ``read`` | every token of the tenant (scope ``read`` or ``write``) |
| ``write``, ``delete`` | tokens of scope ``write`` |
| ``admin`` | the operator's tokens (tenant ``*``, scope ``write``, no prefix) |

``named``: the route touches streams or sessions by name, so a token with a prefix may use it
(the route checks each name, ``authorize_name``); a route that is not named (the Claude
routes, whose keys are no names) refuses such a token. ``follower``: a live read, counted
against the tenant's cap of followers (``store/http/limits.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl

from store.http.auth import ALL_TENANTS, WRITE, Grant

PUBLIC, READ, WRITE_ACTION, DELETE, ADMIN = "public", "read", "write", "delete", "admin"


@dataclass(frozen=True, slots=True)
class Rule:
    action: str
    named: bool = True
    follower: bool = False


#: What each route class needs.
ROUTES: dict[str, Rule] = {
    "health": Rule(PUBLIC, named=False),
    "ready": Rule(PUBLIC, named=False),
    "metrics": Rule(ADMIN, named=False),
    "preflight": Rule(PUBLIC, named=False),
    # /ui/ (store/http/viewer.py): the viewer's files; its data comes from the routes below
    "ui": Rule(PUBLIC, named=False),
    # /v1/stream/<name> (store/http/app.py)
    "stream.create": Rule(WRITE_ACTION),
    "stream.fork": Rule(WRITE_ACTION),
    "stream.append": Rule(WRITE_ACTION),
    "stream.read": Rule(READ),
    "stream.head": Rule(READ),
    "stream.follow": Rule(READ, follower=True),
    "stream.delete": Rule(DELETE),
    # /v1/sessions (store/http/sessions.py)
    "sessions.list": Rule(READ),
    "session.context": Rule(READ),
    "session.export": Rule(READ),
    "session.fork": Rule(WRITE_ACTION),
    "session.redact": Rule(WRITE_ACTION),
    "session.import": Rule(WRITE_ACTION),
    # /v1/claude/<method> (store/http/claude.py)
    "claude.load": Rule(READ, named=False),
    "claude.list-sessions": Rule(READ, named=False),
    "claude.list-session-summaries": Rule(READ, named=False),
    "claude.list-subkeys": Rule(READ, named=False),
    "claude.append": Rule(WRITE_ACTION, named=False),
    "claude.delete": Rule(DELETE, named=False),
}

_SESSION_VERBS = {("GET", "context"): "session.context", ("GET", "export"): "session.export",
                  ("POST", "fork"): "session.fork", ("POST", "redact"): "session.redact",
                  ("PUT", "import"): "session.import"}
_STREAM_METHODS = {"PUT": "stream.create", "POST": "stream.append", "GET": "stream.read",
                   "HEAD": "stream.head", "DELETE": "stream.delete"}
_LIVE = frozenset({"sse", "long-poll"})


def route_class(method: str, path: str, query: bytes, forked: bool) -> str | None:
    """The class of a request (None: no route of this service). ``forked``: it carries
    ``Stream-Forked-From``."""
    if path == "/healthz" and method in ("GET", "HEAD"):
        return "health"
    if path == "/readyz" and method in ("GET", "HEAD"):
        return "ready"
    if path == "/metrics" and method in ("GET", "HEAD"):
        return "metrics"
    if (path == "/ui" or path.startswith("/ui/")) and method in ("GET", "HEAD"):
        return "ui"
    known = path.startswith(("/v1/stream/", "/v1/claude/")) or path == "/v1/sessions" \
        or path.startswith("/v1/sessions/")
    if not known:
        return None
    if method == "OPTIONS":
        return "preflight"
    if path.startswith("/v1/stream/"):
        if method == "PUT" and forked:
            return "stream.fork"
        if method == "GET" and any(k == "live" and v in _LIVE
                                   for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True)):
            return "stream.follow"
        return _STREAM_METHODS.get(method)
    if path.startswith("/v1/claude/"):
        name = "claude." + path[len("/v1/claude/"):]
        return name if method == "POST" and name in ROUTES else None
    if path == "/v1/sessions":
        return "sessions.list" if method in ("GET", "HEAD") else None
    verb = path.rpartition(":")[2]
    return _SESSION_VERBS.get(("GET" if method == "HEAD" else method, verb))


def scope_needed(rule: Rule) -> str:
    """The scope a route class needs, as a refusal names it: ``read``, ``write`` or ``admin``."""
    return {DELETE: WRITE, WRITE_ACTION: WRITE}.get(rule.action, rule.action)


def refusal(grant: Grant, rule: Rule) -> str | None:
    """Why ``grant`` may not use a route of ``rule`` (None: it may). Names the scope needed,
    never the token."""
    if rule.action == PUBLIC or (rule.action == READ and rule.named):
        return None
    if not rule.named and grant.prefix is not None:
        return "a token with a name prefix cannot use this route (its keys are no names)"
    if rule.action == READ:
        return None
    if rule.action == ADMIN:
        if grant.tenant == ALL_TENANTS and grant.scope == WRITE and grant.prefix is None:
            return None
        return "this route needs the operator's write scope (tenant '*', no prefix)"
    if grant.scope != WRITE:
        return f"this route needs the write scope ({rule.action}); the token's scope is {grant.scope}"
    return None


__all__ = ["ADMIN", "DELETE", "PUBLIC", "READ", "ROUTES", "Rule", "WRITE_ACTION", "refusal", "route_class",
           "scope_needed"]
