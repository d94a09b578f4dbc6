"""Scoped tokens, the tokens file read again while the service runs, per-tenant limits and the
access log (issue #37, item 2), against a real ``StreamService`` behind uvicorn on the test's
S3 server and redis-server (the ``serve`` fixture), and, for the flags and the access log, a
real ``sessionstore serve`` process.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness.serve_process import cli, serve, server_env
from starlette.routing import Route

from store.errors import InvalidInputError
from store.http.access import ADMIN, DELETE, READ, ROUTES, Rule, refusal, route_class
from store.http.app import StreamService
from store.http.auth import Grant, TokenFile, Tokens
from store.http.limits import Bucket, Limiter, TenantLimits

pytestmark = pytest.mark.timeout(300)

ROOT = "/v1/stream/"
JSON = {"content-type": "application/json"}
TEXT = {"content-type": "text/plain"}
ACME_W = "acme-write-0123456789"
ACME_R = "acme-read-0123456789x"
ACME_BOTS = "acme-bots-0123456789"
BETA_W = "beta-write-0123456789"
OPS = "ops-token-0123456789x"
TOKENS_FILE = {
    "tenants": {
        "acme": [ACME_W, {"token": ACME_R, "scope": "read"},
                 {"token": ACME_BOTS, "scope": "write", "prefix": "acme/bots/"}],
        "beta": [BETA_W],
        "*": [OPS],
    },
}
ALL_TOKENS = (ACME_W, ACME_R, ACME_BOTS, BETA_W, OPS)


def bearer(token: str, **more: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", **more}


def write_tokens(path: Path, data: Any) -> None:
    """Replace the tokens file as an operator should: a new file renamed over the old."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(data if isinstance(data, str) else json.dumps(data))
    os.replace(tmp, path)


def _entry(eid: str, parent: str | None, text: str) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent, "timestamp": "2026-11-24T10:00:00.000Z",
            "message": {"role": "user", "content": text}}


def _session(c: httpx.Client, url: str, name: str, token: str = ACME_W) -> None:
    r = c.put(url + ROOT + name, headers=bearer(token, **JSON, **{"stream-kind": "session"}),
              content=json.dumps([_entry("e1", None, "hello"), _entry("e2", "e1", "again")]))
    assert r.status_code == 201, r.text


@pytest.fixture
def tokens_path(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.json"
    write_tokens(path, TOKENS_FILE)
    return path


def _refused(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert (r.status_code, r.headers.get("content-type")) == (status, "application/problem+json"), r.text
    body = r.json()
    assert body["code"] == code, body
    for token in ALL_TOKENS:
        assert token not in r.text
    return body


# --- one table for every route ------------------------------------------------------------------

#: A request of every class: (method, path, query, forked) -> class.
SAMPLES = [
    ("GET", "/healthz", b"", False, "health"),
    ("HEAD", "/healthz", b"", False, "health"),
    ("GET", "/readyz", b"", False, "ready"),
    ("HEAD", "/readyz", b"", False, "ready"),
    ("GET", "/metrics", b"", False, "metrics"),
    ("HEAD", "/metrics", b"", False, "metrics"),
    ("GET", "/ui", b"", False, "ui"),
    ("HEAD", "/ui", b"", False, "ui"),
    ("GET", "/ui/", b"", False, "ui"),
    ("HEAD", "/ui/viewer.js", b"", False, "ui"),
    ("OPTIONS", ROOT + "acme/s", b"", False, "preflight"),
    ("OPTIONS", "/v1/sessions", b"", False, "preflight"),
    ("OPTIONS", "/v1/sessions/acme/s:fork", b"", False, "preflight"),
    ("OPTIONS", "/v1/claude/append", b"", False, "preflight"),
    ("PUT", ROOT + "acme/s", b"", False, "stream.create"),
    ("PUT", ROOT + "acme/s", b"", True, "stream.fork"),
    ("POST", ROOT + "acme/s", b"", False, "stream.append"),
    ("GET", ROOT + "acme/s", b"offset=-1", False, "stream.read"),
    ("GET", ROOT + "acme/s", b"offset=-1&live=sse", False, "stream.follow"),
    ("GET", ROOT + "acme/s", b"live=long-poll&offset=now", False, "stream.follow"),
    ("HEAD", ROOT + "acme/s", b"", False, "stream.head"),
    ("DELETE", ROOT + "acme/s", b"", False, "stream.delete"),
    ("GET", "/v1/sessions", b"limit=2", False, "sessions.list"),
    ("HEAD", "/v1/sessions", b"", False, "sessions.list"),
    ("GET", "/v1/sessions/acme/s:context", b"", False, "session.context"),
    ("HEAD", "/v1/sessions/acme/s:context", b"", False, "session.context"),
    ("GET", "/v1/sessions/acme/s:export", b"", False, "session.export"),
    ("POST", "/v1/sessions/acme/s:fork", b"", False, "session.fork"),
    ("POST", "/v1/sessions/acme/s:redact", b"", False, "session.redact"),
    ("PUT", "/v1/sessions/acme/s:import", b"", False, "session.import"),
    *[("POST", "/v1/claude/" + m, b"", False, "claude." + m)
      for m in ("append", "load", "list-sessions", "list-session-summaries", "list-subkeys", "delete")],
]


def test_every_route_and_method_of_the_app_has_a_class_and_every_class_is_reachable(store) -> None:
    service = StreamService(store)
    try:
        for method, path, query, forked, cls in SAMPLES:
            assert route_class(method, path, query, forked) == cls, (method, path, query)
        assert {s[-1] for s in SAMPLES} == set(ROUTES)
        routes = [r for r in service.app.routes if isinstance(r, Route)]
        assert len(routes) >= 5
        for route in routes:
            for method in sorted(route.methods or ()):
                covered = [s for s in SAMPLES if s[0] == method and route.path_regex.fullmatch(s[1])]
                assert covered, f"{method} {route.path}: no route class covers it (store/http/access.py)"
        # What the table does not name reaches no route.
        for method, path in (("PATCH", ROOT + "acme/s"), ("GET", "/v1/claude/load"), ("POST", "/v1/sessions"),
                             ("GET", "/v1/sessions/acme/s:fork"), ("POST", "/v1/claude/nonsense"),
                             ("GET", "/admin"), ("POST", "/ui/"), ("PUT", "/ui/index.html")):
            assert route_class(method, path, b"", False) is None, (method, path)
    finally:
        service.close()


def test_a_request_without_a_route_class_reaches_no_route(serve, tokens_path: Path) -> None:
    _, url = serve(tokens_file=tokens_path)
    with httpx.Client(timeout=30) as c:
        assert c.put(url + ROOT + "acme/s", headers=bearer(ACME_W, **TEXT), content=b"x").status_code == 201
        _refused(c.request("PATCH", url + ROOT + "acme/s", headers=bearer(ACME_W, **TEXT), content=b"y"),
                 404, "not-found")
        assert c.get(url + ROOT + "acme/s", params={"offset": "-1"}, headers=bearer(ACME_W)).content == b"x"
        assert c.get(url + "/healthz").status_code == 200  # public: no token


# --- scopes -----------------------------------------------------------------------------------


def test_a_read_only_token_cannot_append_delete_fork_or_redact_on_any_route_family(serve, tokens_path) -> None:
    _, url = serve(tokens_file=tokens_path)
    key = {"projectKey": "p", "sessionId": "11111111-1111-4111-8111-111111111111"}
    with httpx.Client(timeout=30) as c:
        assert c.put(url + ROOT + "acme/notes", headers=bearer(ACME_W, **TEXT), content=b"one").status_code == 201
        _session(c, url, "acme/chat")
        r = c.post(url + "/v1/claude/append", headers=bearer(ACME_W, **JSON),
                   content=json.dumps({"key": key, "entries": [{"type": "user", "uuid": "u1"}]}))
        assert r.status_code == 204, r.text

        read = bearer(ACME_R, **JSON)
        refused = [
            # streams
            ("POST", ROOT + "acme/notes", bearer(ACME_R, **TEXT), b"two"),
            ("PUT", ROOT + "acme/new", bearer(ACME_R, **TEXT), b"x"),
            ("PUT", ROOT + "acme/fork", bearer(ACME_R, **{"stream-forked-from": ROOT + "acme/notes"}), b""),
            ("DELETE", ROOT + "acme/notes", bearer(ACME_R), b""),
            # sessions
            ("POST", "/v1/sessions/acme/chat:fork", read, json.dumps({"entry_id": "e1", "name": "acme/f"}).encode()),
            ("POST", "/v1/sessions/acme/chat:redact", read, json.dumps({"entry_id": "e2", "reason": "x"}).encode()),
            ("PUT", "/v1/sessions/acme/imp:import", read, b""),
            ("POST", ROOT + "acme/chat", read, json.dumps(_entry("e3", "e2", "more")).encode()),
            ("DELETE", ROOT + "acme/chat", bearer(ACME_R), b""),
            # claude
            ("POST", "/v1/claude/append", read,
             json.dumps({"key": key, "entries": [{"type": "user", "uuid": "u2"}]}).encode()),
            ("POST", "/v1/claude/delete", read, json.dumps({"key": key}).encode()),
        ]
        for method, path, headers, body in refused:
            r = c.request(method, url + path, headers=headers, content=body)
            problem = _refused(r, 403, "insufficient-scope")
            assert problem["scope_needed"] == "write", (method, path)
            assert "write" in problem["detail"] and 'scope="write"' in r.headers["www-authenticate"]

        # Nothing changed, and the same token reads every family.
        assert c.get(url + ROOT + "acme/notes", params={"offset": "-1"}, headers=bearer(ACME_R)).content == b"one"
        assert c.head(url + ROOT + "acme/fork", headers=bearer(ACME_W)).status_code == 404
        assert c.head(url + ROOT + "acme/new", headers=bearer(ACME_W)).status_code == 404
        entries = c.get(url + ROOT + "acme/chat", params={"offset": "-1"}, headers=bearer(ACME_R)).json()
        assert [(e["id"], "redacted" in e) for e in entries] == [("e1", False), ("e2", False)]
        listed = c.get(url + "/v1/sessions", headers=bearer(ACME_R)).json()["sessions"]
        assert [s["name"] for s in listed] == ["acme/chat"]
        assert c.get(url + "/v1/sessions/acme/chat:context", headers=bearer(ACME_R)).status_code == 200
        assert c.get(url + "/v1/sessions/acme/chat:export", headers=bearer(ACME_R)).status_code == 200
        r = c.post(url + "/v1/claude/load", headers=read, content=json.dumps({"key": key}))
        assert r.status_code == 200 and [e["uuid"] for e in r.json()["entries"]] == ["u1"]
        # The write token of the same tenant does all of it.
        assert c.post(url + ROOT + "acme/notes", headers=bearer(ACME_W, **TEXT), content=b"two").status_code == 204
        r = c.post(url + "/v1/sessions/acme/chat:redact", headers=bearer(ACME_W, **JSON),
                   content=json.dumps({"entry_id": "e2", "reason": "x"}))
        assert r.status_code == 200
        assert c.delete(url + ROOT + "acme/notes", headers=bearer(ACME_W)).status_code == 204


def test_a_prefix_token_cannot_read_list_or_write_outside_its_prefix(serve, tokens_path) -> None:
    _, url = serve(tokens_file=tokens_path)
    bots = bearer(ACME_BOTS)
    with httpx.Client(timeout=30) as c:
        for name in ("acme/bots/one", "acme/bots/two", "acme/humans/alice", "acme/botsville"):
            _session(c, url, name)
        _session(c, url, "beta/bots/x", BETA_W)
        assert c.put(url + ROOT + "acme/secret", headers=bearer(ACME_W, **TEXT), content=b"s").status_code == 201

        # Inside: read, append, create, fork, follow.
        assert c.put(url + ROOT + "acme/bots/new", headers=bearer(ACME_BOTS, **TEXT), content=b"n").status_code == 201
        assert c.post(url + ROOT + "acme/bots/new", headers=bearer(ACME_BOTS, **TEXT), content=b"m").status_code == 204
        assert c.get(url + ROOT + "acme/bots/new", params={"offset": "-1"}, headers=bots).content == b"nm"
        r = c.post(url + "/v1/sessions/acme/bots/one:fork", headers=bearer(ACME_BOTS, **JSON),
                   content=json.dumps({"entry_id": "e1", "name": "acme/bots/one-b"}))
        assert r.status_code == 201, r.text

        # Outside: nothing, whatever the route.
        outside = [
            ("GET", ROOT + "acme/secret?offset=-1", {}, b""),
            ("GET", ROOT + "acme/secret?offset=-1&live=long-poll", {}, b""),
            ("HEAD", ROOT + "acme/secret", {}, b""),
            ("POST", ROOT + "acme/secret", TEXT, b"x"),
            ("PUT", ROOT + "acme/elsewhere", TEXT, b"x"),
            ("DELETE", ROOT + "acme/secret", {}, b""),
            ("PUT", ROOT + "acme/bots/stolen", {"stream-forked-from": ROOT + "acme/secret"}, b""),
            ("GET", ROOT + "acme/botsville?offset=-1", {}, b""),
            ("GET", ROOT + "beta/bots/x?offset=-1", {}, b""),
            ("GET", "/v1/sessions/acme/humans/alice:context", {}, b""),
            ("GET", "/v1/sessions/acme/humans/alice:export", {}, b""),
            ("POST", "/v1/sessions/acme/bots/one:fork", JSON,
             json.dumps({"entry_id": "e1", "name": "acme/humans/copy"}).encode()),
            ("POST", "/v1/sessions/acme/humans/alice:redact", JSON,
             json.dumps({"entry_id": "e1", "reason": "x"}).encode()),
            ("PUT", "/v1/sessions/acme/humans/imp:import", {}, b""),
        ]
        for method, path, headers, body in outside:
            r = c.request(method, url + path, headers=bearer(ACME_BOTS, **headers), content=body)
            assert r.status_code == 403, (method, path, r.status_code, r.text)
            if method != "HEAD":
                _refused(r, 403, "forbidden")
        # The Claude routes have keys, not names: a prefix token cannot use them at all.
        r = c.post(url + "/v1/claude/load", headers=bearer(ACME_BOTS, **JSON),
                   content=json.dumps({"key": {"projectKey": "p", "sessionId": "s"}}))
        _refused(r, 403, "insufficient-scope")

        # A listing shows only the prefix's sessions, on every page; the tenant's token all.
        names, cursor = [], None
        while True:
            page = c.get(url + "/v1/sessions", params={"limit": "1", **({"after": cursor} if cursor else {})},
                         headers=bots).json()
            names += [s["name"] for s in page["sessions"]]
            cursor = page["next"]
            if cursor is None:
                break
        assert sorted(names) == ["acme/bots/one", "acme/bots/one-b", "acme/bots/two"]
        listed = [s["name"] for s in c.get(url + "/v1/sessions", headers=bearer(ACME_W)).json()["sessions"]]
        assert sorted(listed) == ["acme/bots/one", "acme/bots/one-b", "acme/bots/two", "acme/botsville",
                                  "acme/humans/alice"]
        # Nothing outside changed.
        assert c.get(url + ROOT + "acme/secret", params={"offset": "-1"}, headers=bearer(ACME_W)).content == b"s"
        for name in ("acme/elsewhere", "acme/bots/stolen", "acme/humans/copy", "acme/humans/imp"):
            assert c.head(url + ROOT + name, headers=bearer(ACME_W)).status_code == 404, name
        alice = c.get(url + ROOT + "acme/humans/alice", params={"offset": "-1"}, headers=bearer(ACME_W)).json()
        assert all("redacted" not in e for e in alice)


@pytest.mark.parametrize("tenants, complaint", [
    ({"acme": [{"token": ACME_W, "scope": "admin"}]}, "unknown scope 'admin'"),
    ({"acme": [{"token": ACME_W, "scopes": "read"}]}, "unknown key 'scopes'"),
    ({"acme": [{"token": ACME_W, "sha256": "00" * 32}]}, '"token" or "sha256"'),
    ({"acme": [{"scope": "read"}]}, '"token" or "sha256"'),
    ({"acme": [{"sha256": "zz"}]}, "sha256"),
    ({"acme": [{"token": "short", "scope": "read"}]}, "shorter than 16"),
    ({"acme": [{"token": ACME_W, "prefix": "beta/"}]}, "prefix 'beta/'"),
    ({"acme": [{"token": ACME_W, "prefix": "bots/"}]}, "prefix 'bots/'"),
    ({"acme": [{"token": ACME_W, "prefix": ""}]}, "prefix ''"),
    ({"acme": [ACME_W, {"token": ACME_W, "scope": "read"}]}, "twice"),
    ({"acme": [ACME_W], "beta": [{"token": ACME_W, "scope": "read"}]}, "under tenants"),
    ({"acme": [42]}, "a string or an object"),
])
def test_a_tokens_file_with_an_unknown_key_scope_or_a_bad_entry_is_refused(
    tmp_path: Path, tenants: Any, complaint: str
) -> None:
    path = tmp_path / "tokens.json"
    write_tokens(path, {"tenants": tenants})
    with pytest.raises(InvalidInputError, match=complaint):
        Tokens.load(path)


@pytest.mark.parametrize("data, complaint", [
    ({"tenants": {"acme": [ACME_W]}, "tenant": {}}, "unknown key 'tenant'"),
    ({"tenants": {"acme": [ACME_W]}, "limits": {"beta": {"followers": 1}}}, "no such tenant"),
    ({"tenants": {"acme": [ACME_W]}, "limits": {"acme": {"rps": 1}}}, "unknown limit 'rps'"),
    ({"tenants": {"acme": [ACME_W]}, "limits": {"acme": {"followers": 1.5}}}, "positive integer"),
    ({"tenants": {"acme": [ACME_W]}, "limits": {"acme": {"requests_per_s": 0}}}, "positive number"),
    ({"tenants": {"acme": [ACME_W]}, "limits": {"acme": {"bytes_per_s": True}}}, "positive number"),
    ({"tenants": {"acme": [ACME_W]}, "limits": {"acme": 5}}, "an object of"),
])
def test_a_tokens_file_with_bad_limits_is_refused(tmp_path: Path, data: Any, complaint: str) -> None:
    path = tmp_path / "tokens.json"
    write_tokens(path, data)
    with pytest.raises(InvalidInputError, match=complaint):
        Tokens.load(path)


def test_the_file_forms_and_what_each_grants(tmp_path: Path) -> None:
    import hashlib

    path = tmp_path / "tokens.json"
    digest = hashlib.sha256(BETA_W.encode()).hexdigest()
    write_tokens(path, {"tenants": {"acme": [ACME_W, {"token": ACME_R, "scope": "read"},
                                             {"token": ACME_BOTS, "prefix": "acme/bots/"}],
                                    "beta": [{"sha256": digest, "scope": "read"}, "sha256:" + "ab" * 32],
                                    "*": [{"token": OPS, "prefix": "beta/"}]},
                        "limits": {"acme": {"requests_per_s": 5, "followers": None}}})
    tokens = Tokens.load(path)
    assert tokens.grant_of(f"Bearer {ACME_W}") == Grant("acme", "write", None)
    assert tokens.grant_of(f"Bearer {ACME_R}") == Grant("acme", "read", None)
    assert tokens.grant_of(f"bearer {ACME_BOTS}") == Grant("acme", "write", "acme/bots/")
    assert tokens.grant_of(f"Bearer {BETA_W}") == Grant("beta", "read", None)
    assert tokens.grant_of(f"Bearer {OPS}") == Grant("*", "write", "beta/")
    assert tokens.grant_of("Bearer nobody-0123456789abc") is None and tokens.grant_of(None) is None
    assert Grant("acme", prefix="acme/bots/").may_access("acme/bots/1")
    assert not Grant("acme", prefix="acme/bots/").may_access("acme/other")
    assert Grant("*").may_access("beta/x") and not Grant("*", prefix="beta/").may_access("acme/x")
    assert not Grant("*", prefix="beta/").sees_all and Grant("*").sees_all
    # What each scope may do; admin (no route needs it yet) is the operator's write token's.
    assert refusal(Grant("acme", "read"), Rule(READ)) is None
    assert "write" in (refusal(Grant("acme", "read"), Rule(DELETE)) or "")
    assert refusal(Grant("acme"), Rule(DELETE)) is None
    assert refusal(Grant("*"), Rule(ADMIN)) is None
    for grant in (Grant("acme"), Grant("*", "read"), Grant("*", prefix="beta/")):
        assert refusal(grant, Rule(ADMIN)) is not None, grant
    assert refusal(Grant("acme", prefix="acme/x/"), Rule(READ, named=False)) is not None
    limiter = Limiter(TenantLimits(requests_per_s=1, followers=3))
    assert limiter.limits_of("acme", tokens.limits) == TenantLimits(requests_per_s=5, followers=None)
    assert limiter.limits_of("beta", tokens.limits) == TenantLimits(requests_per_s=1, followers=3)
    assert limiter.limits_of("*", tokens.limits) == TenantLimits()  # the operator: only its own entry


# --- reload -----------------------------------------------------------------------------------


def test_a_removed_token_stops_working_at_the_next_request_and_a_broken_file_keeps_the_old_tokens(
    serve, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="sessionstore.http")
    path = tmp_path / "tokens.json"
    write_tokens(path, {"tenants": {"acme": [ACME_W, ACME_R], "beta": [BETA_W]}})
    _, url = serve(tokens_file=path)
    new_token = "acme-new-0123456789xy"
    with httpx.Client(timeout=30) as c:
        assert c.put(url + ROOT + "acme/s", headers=bearer(ACME_W, **TEXT), content=b"x").status_code == 201

        def status(token: str) -> int:
            return c.get(url + ROOT + "acme/s", params={"offset": "-1"}, headers=bearer(token)).status_code

        assert (status(ACME_R), status(new_token)) == (200, 401)
        # Edited in place: ACME_R removed, a new token added.
        path.write_text(json.dumps({"tenants": {"acme": [ACME_W, new_token], "beta": [BETA_W]}}))
        # The very next request sees the file as it is (no window in which a process that was
        # paused, or merely between two looks, still honours the removed token).
        assert status(ACME_R) == 401, "the removed token still worked after the change"
        assert status(new_token) == 200
        assert status(ACME_W) == 200
        # Replaced by rename: the read token is back, with its scope.
        write_tokens(path, {"tenants": {"acme": [ACME_W, {"token": ACME_R, "scope": "read"}], "beta": [BETA_W]}})
        assert (status(ACME_R), status(new_token)) == (200, 401)
        r = c.post(url + ROOT + "acme/s", headers=bearer(ACME_R, **TEXT), content=b"y")
        _refused(r, 403, "insufficient-scope")

        # A broken file: the tokens in force stay, one error line naming the file and the problem.
        caplog.clear()
        write_tokens(path, '{"tenants": {"acme": [')
        for _ in range(3):  # several requests, each looking at the file
            assert (status(ACME_W), status(ACME_R)) == (200, 200)
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1, errors
        assert str(path) in errors[0] and "tokens in force stay" in errors[0]
        # Another refused file (a bad scope): one more line, still the old tokens.
        write_tokens(path, {"tenants": {"acme": [{"token": ACME_W, "scope": "everything"}]}})
        assert status(ACME_W) == 200
        assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 2
        assert "unknown scope 'everything'" in caplog.records[-1].getMessage()
        # A removed file is refused alike; a good file afterwards is read.
        path.unlink()
        assert status(ACME_R) == 200
        write_tokens(path, {"tenants": {"acme": [ACME_W]}})
        assert status(ACME_R) == 401
        assert status(ACME_W) == 200
        for record in caplog.records:
            assert all(token not in record.getMessage() for token in (ACME_W, ACME_R, BETA_W, new_token))


def test_token_file_poll_reads_a_change_once_and_retries_only_on_the_next_change(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    write_tokens(path, {"tenants": {"acme": [ACME_W]}})
    source = TokenFile(path)
    assert not source.poll()
    write_tokens(path, "not json")
    assert not source.poll() and not source.poll()
    assert source.tokens.tenant_of(f"Bearer {ACME_W}") == "acme"
    write_tokens(path, {"tenants": {"beta": [BETA_W]}})
    assert source.poll()
    assert source.tokens.tenant_of(f"Bearer {ACME_W}") is None
    assert source.tokens.tenant_of(f"Bearer {BETA_W}") == "beta"
    with pytest.raises(InvalidInputError, match="tokens file"):
        write_tokens(path, {"tenants": {"acme": ["short"]}})
        TokenFile(path)  # at start, a refused file stops the service


# --- limits -----------------------------------------------------------------------------------


def test_buckets_on_a_fake_clock() -> None:
    now = [100.0]
    limiter = Limiter(clock=lambda: now[0])
    limits = TenantLimits(requests_per_s=2, bytes_per_s=1000)
    assert limiter.request("acme", limits, has_body=True) is None
    assert limiter.request("acme", limits, has_body=True) is None
    what, wait = limiter.request("acme", limits, has_body=False)  # type: ignore[misc]
    assert "request rate" in what and wait == pytest.approx(0.5)
    now[0] += 0.5
    assert limiter.request("acme", limits, has_body=False) is None
    limiter.body_bytes("acme", limits, 5000)  # a body over a second's worth goes through, in debt
    now[0] += 1.0
    what, wait = limiter.request("acme", limits, has_body=True)  # type: ignore[misc]
    assert "byte rate" in what and wait == pytest.approx(3.0)
    assert limiter.request("acme", limits, has_body=False) is None  # a GET is not held by bytes
    assert limiter.request("beta", limits, has_body=True) is None  # another tenant's buckets
    bucket = Bucket(rate=10, burst=10, now=0)
    bucket.take(25, 0)
    assert bucket.wait(0, 1.0) == pytest.approx(0.5)
    assert bucket.wait(0, 2.0) == 0
    followers = TenantLimits(followers=1)
    assert limiter.follow("acme", followers) and not limiter.follow("acme", followers)
    limiter.unfollow("acme")
    assert limiter.follow("acme", followers) and limiter.followers("acme") == 1


def test_a_tenant_over_its_request_rate_gets_429_while_other_tenants_go_on(serve, tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    write_tokens(path, {"tenants": {"acme": [ACME_W], "beta": [BETA_W], "gamma": ["gamma-token-0123456789"],
                                    "*": [OPS]},
                        "limits": {"gamma": {"requests_per_s": None}}})
    _, url = serve(tokens_file=path, limits=TenantLimits(requests_per_s=2))
    with httpx.Client(timeout=30) as c:
        assert c.put(url + ROOT + "acme/s", headers=bearer(ACME_W, **TEXT), content=b"a").status_code == 201
        assert c.put(url + ROOT + "beta/s", headers=bearer(BETA_W, **TEXT), content=b"b").status_code == 201
        statuses, limited = [], None
        for _ in range(10):
            r = c.post(url + ROOT + "acme/s", headers=bearer(ACME_W, **TEXT), content=b"+")
            statuses.append(r.status_code)
            if r.status_code == 429:
                limited = r
        assert limited is not None and statuses.count(429) >= 5, statuses
        problem = _refused(limited, 429, "rate-limited")
        assert "request rate" in problem["detail"]
        assert limited.headers["retry-after"] == "1"  # a token comes back within half a second
        # Another tenant at the same moment (as limited): its own bucket.
        assert c.get(url + ROOT + "beta/s", params={"offset": "-1"}, headers=bearer(BETA_W)).status_code == 200
        # The operator is not limited by the defaults; a tenant the file frees is not either.
        for _ in range(10):
            assert c.get(url + ROOT + "acme/s", params={"offset": "-1"}, headers=bearer(OPS)).status_code == 200
            assert c.get(url + "/v1/sessions", headers=bearer("gamma-token-0123456789")).status_code == 200
        # Refused appends wrote nothing; after Retry-After the tenant goes on.
        time.sleep(int(limited.headers["retry-after"]))
        body = c.get(url + ROOT + "acme/s", params={"offset": "-1"}, headers=bearer(ACME_W)).content
        assert body == b"a" + b"+" * statuses.count(204)


def test_a_tenant_over_its_byte_rate_gets_429_for_the_next_body(serve, tokens_path: Path) -> None:
    _, url = serve(tokens_file=tokens_path, limits=TenantLimits(bytes_per_s=2000))
    with httpx.Client(timeout=30) as c:
        assert c.put(url + ROOT + "acme/s", headers=bearer(ACME_W, **TEXT), content=b"a").status_code == 201
        assert c.put(url + ROOT + "beta/s", headers=bearer(BETA_W, **TEXT), content=b"b").status_code == 201
        assert c.post(url + ROOT + "acme/s", headers=bearer(ACME_W, **TEXT), content=b"x" * 8000).status_code == 204
        r = c.post(url + ROOT + "acme/s", headers=bearer(ACME_W, **TEXT), content=b"y")
        problem = _refused(r, 429, "rate-limited")
        assert "byte rate" in problem["detail"]
        assert int(r.headers["retry-after"]) in (2, 3)  # about 6,000 bytes of debt at 2,000 a second
        # Reads go on, and another tenant's bodies.
        r = c.get(url + ROOT + "acme/s", params={"offset": "-1"}, headers=bearer(ACME_W))
        assert r.content == b"a" + b"x" * 8000
        assert c.post(url + ROOT + "beta/s", headers=bearer(BETA_W, **TEXT), content=b"z" * 1000).status_code == 204


class _Follower:
    """A live read held open in a thread (an SSE response is waited for until its headers
    came: ``status``); an SSE reader leaves after ``stop``."""

    def __init__(self, url: str, token: str, live: str) -> None:
        self.url, self.token, self.live = url, token, live
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self._got = threading.Event()
        self._response: httpx.Response | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if live == "sse":
            assert self._got.wait(20), "no answer to a live read"

    def result(self, timeout: float) -> int | None:
        self._thread.join(timeout)
        return self.status

    def _run(self) -> None:
        try:
            with httpx.Client(timeout=30) as c, c.stream(
                "GET", self.url, params={"offset": "now", "live": self.live}, headers=bearer(self.token)
            ) as r:
                self.status, self.headers = r.status_code, dict(r.headers)
                self._response = r
                self._got.set()
                if r.status_code == 200 and self.live == "sse":
                    for _ in r.iter_raw():
                        pass
        except (httpx.HTTPError, RuntimeError):
            pass  # closed by stop() (or by the server's shutdown)
        finally:
            self._got.set()

    def stop(self) -> None:
        if self._response is not None:
            self._response.close()
        self._thread.join(10)


def test_a_tenant_over_its_follower_cap_gets_429_for_the_next_follower(serve, tokens_path: Path) -> None:
    _, url = serve(tokens_file=tokens_path, limits=TenantLimits(followers=2), sse_max_s=30, long_poll_s=20)
    limited = []
    with httpx.Client(timeout=30) as c, ExitStack() as stack:
        for name, token in (("acme/s", ACME_W), ("beta/s", BETA_W)):
            assert c.put(url + ROOT + name, headers=bearer(token, **TEXT), content=b"0").status_code == 201
        first = _Follower(url + ROOT + "acme/s", ACME_W, "sse")
        stack.callback(first.stop)
        assert first.status == 200
        second = _Follower(url + ROOT + "acme/s", ACME_R, "long-poll")  # any token of the tenant counts
        time.sleep(0.5)  # the long-poll is waiting at the tail
        for live in ("sse", "long-poll"):
            r = c.get(url + ROOT + "acme/s", params={"offset": "now", "live": live}, headers=bearer(ACME_W))
            limited.append(r.status_code)
            _refused(r, 429, "too-many-followers")
            assert r.headers["retry-after"] == "1"
        # Another tenant follows; a catch-up read of the tenant is no follower.
        other = _Follower(url + ROOT + "beta/s", BETA_W, "sse")
        stack.callback(other.stop)
        assert other.status == 200
        assert c.get(url + ROOT + "acme/s", params={"offset": "-1"}, headers=bearer(ACME_W)).status_code == 200
        # An append wakes the long-poll (it leaves); a new follower is then let in.
        assert c.post(url + ROOT + "acme/s", headers=bearer(ACME_W, **TEXT), content=b"1").status_code == 204
        assert second.result(20) == 200
        r = c.get(url + ROOT + "acme/s", params={"offset": "-1", "live": "long-poll"}, headers=bearer(ACME_W))
        assert (r.status_code, r.content) == (200, b"01")
    assert limited == [429, 429]


# --- the access log, on a real ``sessionstore serve`` ----------------------------------------------


@contextmanager
def serve_process(tmp_path: Path, redis_url: str, redis_prefix: str, *args: str) -> Iterator[tuple[str, Path]]:
    """``sessionstore serve ARGS`` as a process of its own on the test's Redis: (URL, log)."""
    store_args = ["--objects", str(tmp_path / "objects"), "--redis", redis_url, "--redis-prefix", redis_prefix]
    with serve(store_args, tmp_path / "serve.log", cwd=tmp_path, serve_args=args) as server:
        yield server.url, server.log_path


def test_the_access_log_has_a_line_a_request_and_never_a_token_a_body_or_a_query(
    tmp_path: Path, redis_url: str, redis_prefix: str, tokens_path: Path
) -> None:
    secret_body, secret_name, secret_query = b"BODY-CONTENT-7f3a", "acme/NAME-9c2e", "QUERY-4d1b"
    with serve_process(tmp_path, redis_url, redis_prefix, "--tokens", str(tokens_path), "--access-log",
                       "--rate-limit", "1000") as (url, log_path), httpx.Client(timeout=30) as c:
        stream = url + ROOT + secret_name

        def logged() -> list[dict[str, Any]]:
            return [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith('{"time"')]

        before = len(logged())  # the probes that waited for the service
        sent = [
            (c.put(stream, headers=bearer(ACME_W, **TEXT), content=secret_body), "stream.create", "acme"),
            (c.get(stream, params={"offset": "-1", "cursor": secret_query}, headers=bearer(ACME_W)),
             "stream.read", "acme"),
            (c.post(stream, headers=bearer(ACME_R, **TEXT), content=secret_body), "stream.append", "acme"),
            (c.get(stream, params={"offset": "-1"}, headers=bearer("not-a-token-0123456789")), "stream.read", None),
            (c.get(url + "/v1/sessions", headers=bearer(BETA_W)), "sessions.list", "beta"),
            (c.get(url + "/healthz"), "health", None),
            (c.request("PATCH", stream, headers=bearer(ACME_W)), None, None),
        ]
        assert [r.status_code for r, _, _ in sent] == [201, 200, 403, 401, 200, 200, 404]
        lines: list[dict[str, Any]] = []
        deadline = time.monotonic() + 10
        while len(lines) < len(sent) and time.monotonic() < deadline:
            time.sleep(0.1)
            lines = logged()[before:]
        text = log_path.read_text()
    assert len(lines) == len(sent), text
    for line, (r, route, tenant) in zip(lines, sent):
        assert set(line) == {"time", "tenant", "route", "method", "status", "bytes_in", "bytes_out", "ms"}
        assert (line["route"], line["tenant"], line["method"], line["status"]) == (
            route, tenant, r.request.method, r.status_code)
        assert line["bytes_out"] == len(r.content) and line["ms"] >= 0
        assert line["time"].endswith("Z") and line["time"][:2] == "20"
    assert lines[0]["bytes_in"] == len(secret_body) and lines[1]["bytes_in"] == 0
    for secret in (*ALL_TOKENS, "not-a-token-0123456789", secret_body.decode(), secret_name, "NAME-9c2e",
                   secret_query, "Bearer"):
        assert secret not in text, secret


def test_serve_refuses_limits_without_tokens_and_bad_limit_values(tmp_path: Path) -> None:
    for args, complaint in ((["--rate-limit", "5"], "need tokens"), (["--max-followers", "0"], "positive")):
        r = subprocess.run(cli("--objects", str(tmp_path / "o"), "serve", "--port", "1", *args),
                           capture_output=True, text=True, timeout=60, env=server_env(), cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert complaint in r.stderr and "Traceback" not in r.stderr
