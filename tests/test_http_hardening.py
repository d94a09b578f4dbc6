"""The HTTP service against a hostile client (issue #35): Host and Origin, what listing
cursors reveal, shared caches, body limits on every route, stalled and dropped connections,
oversized numbers, token configurations, imports, and what a dropped client logs.

Where the defect is the server's (timeouts, connection limits, Host), the service runs as a
real ``sessionstore serve`` process and is spoken to over real sockets; elsewhere it is
uvicorn in a thread of this process (``harness.asgi_server``), as in test_http_service.py.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness.serve_process import cli, serve, server_env

from store import SessionStore
from store.errors import InvalidInputError
from store.http.auth import Tokens

pytestmark = pytest.mark.timeout(300)

ROOT = "/v1/stream/"
ACME_TOKEN, BETA_TOKEN, OPS_TOKEN = "acme-token-0123456789", "beta-token-0123456789", "ops-token-0123456789"
TOKENS = Tokens.parse_env(f"acme:{ACME_TOKEN},beta:{BETA_TOKEN},*:{OPS_TOKEN}")
ACME = {"authorization": f"Bearer {ACME_TOKEN}"}
BETA = {"authorization": f"Bearer {BETA_TOKEN}"}
JSON = {"content-type": "application/json"}


@contextmanager
def serve_process(tmp_path: Path, redis_url: str, redis_prefix: str, *args: str,
                  env: dict[str, str] | None = None) -> Iterator[str]:
    """``sessionstore serve ARGS`` as a process of its own (a directory store, the test's
    Redis) on a free loopback port; yields its base URL once /healthz answers."""
    store_args = ["--objects", str(tmp_path / "objects"), "--redis", redis_url, "--redis-prefix", redis_prefix]
    with serve(store_args, tmp_path / "serve.log", cwd=tmp_path, serve_args=args, env=env) as server:
        yield server.url


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed ``sock`` (reading what it sent meanwhile), or None if
    it was still open after ``seconds``."""
    start = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - start < seconds:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return time.monotonic() - start
        if not data:
            return time.monotonic() - start
    return None


def _entry(eid: str, parent: str | None, text: str) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent, "timestamp": "2026-11-24T10:00:00.000Z",
            "message": {"role": "user", "content": text}}


# --- 9: Host, Origin, CORS --------------------------------------------------------------------


def test_without_tokens_only_loopback_hosts_and_allowed_origins_get_through(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    """DNS rebinding (a foreign Host) and cross-site writes (a foreign Origin) are refused and
    change nothing; no answer carries a wildcard Allow-Origin; loopback names, configured hosts
    and configured origins work."""
    with serve_process(tmp_path, redis_url, redis_prefix, "--allowed-host", "box.lan",
                       "--cors-origin", "https://app.example") as url, httpx.Client(timeout=10) as c:
        port = _port(url)
        stream = url + ROOT + "local/notes"
        assert c.put(stream, headers={"content-type": "text/plain"}, content=b"secret").status_code == 201

        evil = {"host": "attacker.test", "origin": "https://evil.example"}
        r = c.get(stream, params={"offset": "-1"}, headers=evil)
        assert (r.status_code, r.json()["code"]) == (403, "host-not-allowed")
        assert b"secret" not in r.content
        assert r.headers.get("access-control-allow-origin") is None
        r = c.post(stream, headers={**evil, "content-type": "text/plain"}, content=b"injected")
        assert r.status_code == 403
        for host in ("attacker.test:%d" % port, "127.0.0.2", "localhost.attacker.test", "[::2]"):
            assert c.get(stream, params={"offset": "-1"}, headers={"host": host}).status_code == 403, host

        for host in (f"127.0.0.1:{port}", "localhost", f"LOCALHOST:{port}", f"[::1]:{port}", "box.lan:8443"):
            r = c.get(stream, params={"offset": "-1"}, headers={"host": host})
            assert (r.status_code, r.content) == (200, b"secret"), host

        # A page of another origin, through a loopback Host: may read nothing (no CORS header
        # for it) and change nothing.
        r = c.get(stream, params={"offset": "-1"}, headers={"origin": "https://evil.example"})
        assert r.status_code == 200 and r.headers.get("access-control-allow-origin") is None
        for method in ("POST", "PUT", "DELETE"):
            r = c.request(method, stream, headers={"origin": "https://evil.example", "content-type": "text/plain"},
                          content=b"injected" if method == "POST" else b"")
            assert (r.status_code, r.json()["code"]) == (403, "origin-not-allowed"), method
        r = c.post(url + "/v1/sessions/local/notes:redact", headers={"origin": "null"},
                   content=b'{"entry_id": "x", "reason": "y"}')
        assert r.status_code == 403
        assert c.get(stream, params={"offset": "-1"}).content == b"secret"

        # The allowed origin: CORS headers for it, and it may write.
        app = {"origin": "https://app.example"}
        r = c.options(stream, headers={**app, "access-control-request-method": "POST"})
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        assert "Origin" in r.headers["vary"]
        r = c.post(stream, headers={**app, "content-type": "text/plain"}, content=b"+app")
        assert r.status_code == 204 and r.headers["access-control-allow-origin"] == "https://app.example"
        assert c.get(stream, params={"offset": "-1"}).content == b"secret+app"


def test_without_tokens_a_foreign_host_is_refused(serve) -> None:
    """DNS rebinding: a page of attacker.test, its name re-pointed at 127.0.0.1."""
    _, url = serve()
    with httpx.Client(timeout=10) as c:
        stream = url + ROOT + "local/notes"
        assert c.put(stream, headers={"content-type": "text/plain"}, content=b"secret").status_code == 201
        r = c.get(stream, params={"offset": "-1"}, headers={"host": "attacker.test"})
        assert r.status_code == 403 and b"secret" not in r.content
        r = c.post(stream, headers={"host": "attacker.test", "content-type": "text/plain"}, content=b"x")
        assert r.status_code == 403
        assert c.get(stream, params={"offset": "-1"}).content == b"secret"


def test_cors_is_closed_by_default(serve) -> None:
    _, url = serve()
    with httpx.Client(timeout=10) as c:
        r = c.options(url + ROOT + "x", headers={"origin": "https://evil.example",
                                                 "access-control-request-method": "GET"})
        assert r.headers.get("access-control-allow-origin") is None
        assert "if-none-match" in r.headers["access-control-allow-headers"].lower()
        r = c.get(url + "/healthz", headers={"origin": "https://evil.example"})
        assert r.status_code == 200 and r.headers.get("access-control-allow-origin") is None


# --- 10: listing cursors -------------------------------------------------------------------


def _walk(c: httpx.Client, url: str, headers: dict[str, str], limit: int) -> tuple[list[str], list[str]]:
    """Every page of the listing: (names in order, the next cursors in order)."""
    names: list[str] = []
    cursors: list[str] = []
    after = None
    for _ in range(1000):
        params = {"limit": str(limit), **({"after": after} if after else {})}
        r = c.get(url + "/v1/sessions", params=params, headers=headers)
        assert r.status_code == 200, r.text
        page = r.json()
        names += [s["name"] for s in page["sessions"]]
        after = page["next"]
        if after is None:
            return names, cursors
        cursors.append(after)
    raise AssertionError("the listing never ended")


def test_a_tenants_listing_cursor_reveals_nothing_of_other_tenants(serve) -> None:
    """A tenant pages through each of its sessions exactly once, and its cursors are the
    same whatever other tenants store between its sessions: they carry nothing of theirs."""
    service, url = serve(tokens=TOKENS)
    ops = {"authorization": f"Bearer {OPS_TOKEN}"}
    with httpx.Client(timeout=30) as c:
        def make(name: str, auth: dict[str, str]) -> None:
            r = c.put(url + ROOT + name, headers={**auth, **JSON, "stream-kind": "session"},
                      content=json.dumps([_entry("e1", None, name)]))
            assert r.status_code == 201, r.text

        own = [f"acme/chat-{i}" for i in range(5)]
        for name in own:
            make(name, ACME)
        alone = {limit: _walk(c, url, ACME, limit) for limit in (1, 2, 3)}
        for names, _ in alone.values():
            assert sorted(names) == own and len(names) == len(own)

        foreign = [f"beta/chat-{i}" for i in range(25)]
        for name in foreign:
            make(name, BETA)
        plain = [service.store.create_session(cwd="/w").session_id for _ in range(5)]  # Python API, no tenant
        for limit, (names, cursors) in alone.items():
            assert _walk(c, url, ACME, limit) == (names, cursors), limit
        secrets = [service.store.layout.stream_id(n) for n in foreign] + foreign + plain
        every_cursor = [cur for limit in (1, 2, 3, 7) for cur in _walk(c, url, ACME, limit)[1]]
        every_cursor += _walk(c, url, BETA, 2)[1]
        for cursor in every_cursor:
            assert not any(s in cursor for s in secrets)
        # The operator still sees everything, each once.
        names, _ = _walk(c, url, ops, 4)
        assert sorted(names) == sorted(own + foreign + plain)
        r = c.get(url + "/v1/sessions", params={"after": "not-a-cursor"}, headers=ACME)
        assert (r.status_code, r.json()["code"]) == (400, "bad-request")


# --- 11: shared caches ----------------------------------------------------------------------


def test_with_tokens_catch_up_reads_are_private_to_shared_caches(serve) -> None:
    _, url = serve(tokens=TOKENS, max_read=8)
    with httpx.Client(timeout=10) as c:
        stream = url + ROOT + "acme/log"
        assert c.put(stream, headers={**ACME, "content-type": "text/plain"}).status_code == 201
        for part in (b"0123456789", b"abcdefghij"):
            assert c.post(stream, headers={**ACME, "content-type": "text/plain"}, content=part).status_code == 204
        r = c.get(stream, params={"offset": "-1"}, headers=ACME)
        assert r.status_code == 200 and r.headers.get("stream-up-to-date") is None
        cache = r.headers["cache-control"]
        assert "private" in cache and "public" not in cache
        assert "authorization" in r.headers["vary"].lower()
        r2 = c.get(stream, params={"offset": "-1"}, headers={**ACME, "if-none-match": r.headers["etag"]})
        assert r2.status_code == 304 and "private" in r2.headers["cache-control"]


# --- 12: one body limit ---------------------------------------------------------------------


def test_every_route_refuses_a_body_over_the_limit_and_stores_nothing(serve) -> None:
    _, url = serve(tokens=TOKENS, max_body=4096)
    big_text = "x" * 6000
    key = {"projectKey": "p", "sessionId": "11111111-1111-4111-8111-111111111111"}
    with httpx.Client(timeout=30) as c:
        r = c.put(url + ROOT + "acme/s", headers={**ACME, **JSON, "stream-kind": "session"},
                  content=json.dumps([_entry("e1", None, "hi")]))
        assert r.status_code == 201
        cases = [
            ("/v1/claude/append", {"key": key, "entries": [{"type": "user", "uuid": "u1", "text": big_text}]}),
            ("/v1/claude/load", {"key": key, "pad": big_text}),
            ("/v1/sessions/acme/s:fork", {"entry_id": "e1", "name": "acme/f", "pad": big_text}),
            ("/v1/sessions/acme/s:redact", {"entry_id": "e1", "reason": big_text}),
        ]
        for path, body in cases:
            r = c.post(url + path, headers={**ACME, **JSON}, content=json.dumps(body))
            assert r.status_code == 413, (path, r.status_code, r.text[:200])
            assert r.json()["code"] == "too-large", path
        r = c.put(url + "/v1/sessions/acme/imp:import", headers=ACME, content=b"{}\n" * 2000)
        assert r.status_code == 413
        # Nothing was stored.
        r = c.post(url + "/v1/claude/load", headers={**ACME, **JSON}, content=json.dumps({"key": key}))
        assert r.status_code in (200, 501)
        if r.status_code == 200:
            assert r.json() == {"entries": None}
        assert c.head(url + ROOT + "acme/f", headers=ACME).status_code == 404
        entries = c.get(url + ROOT + "acme/s", params={"offset": "-1"}, headers=ACME).json()
        assert entries == [_entry("e1", None, "hi")]


# --- 13: stalled connections, connection limit -------------------------------------------------


def test_stalled_headers_and_bodies_are_cut_off_within_the_timeouts(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    with serve_process(tmp_path, redis_url, redis_prefix, "--header-timeout", "1",
                       "--idle-timeout", "1", "--body-timeout", "1") as url:
        port = _port(url)
        silent = socket.create_connection(("127.0.0.1", port))
        partial = socket.create_connection(("127.0.0.1", port))
        partial.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        dripping = socket.create_connection(("127.0.0.1", port))
        dripping.sendall(b"GET /healthz HTTP/1.1\r\n")
        body = socket.create_connection(("127.0.0.1", port))
        body.sendall(b"POST /v1/stream/x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
                     b"Content-Length: 100\r\n\r\n0123456789")
        start = time.monotonic()
        for _ in range(6):  # a header line every 0.3 s: still cut off at 1 s
            time.sleep(0.3)
            try:
                dripping.sendall(b"X-Drip: 1\r\n")
            except OSError:
                break
        for name, sock in (("silent", silent), ("partial headers", partial), ("dripping", dripping)):
            waited = _closed_within(sock, 5)
            assert waited is not None, f"{name}: still open"
            assert time.monotonic() - start < 4, name
            sock.close()
        body.settimeout(5)
        answer = b""
        while chunk := body.recv(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"body-timeout" in answer
        body.close()
        # A keep-alive connection that stays idle after its answer is closed too.
        idle = socket.create_connection(("127.0.0.1", port))
        idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert _closed_within(idle, 3) is not None
        idle.close()
        assert httpx.get(url + "/healthz").status_code == 200
        with pytest.raises(httpx.HTTPError):  # nothing was created by the stalled POST
            httpx.head(url + ROOT + "x").raise_for_status()


def test_an_idle_keep_alive_connection_has_the_idle_timeout_and_a_started_request_the_header_timeout(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    """After an answer, a connection may stay silent for ``--idle-timeout`` (longer than a
    client keeps it, so that the server never closes one a client is reusing); the first byte
    of its next request starts that request's ``--header-timeout``, which dripping does not
    extend."""
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with serve_process(tmp_path, redis_url, redis_prefix, "--header-timeout", "1",
                       "--idle-timeout", "4") as url:
        port = _port(url)
        kept = socket.create_connection(("127.0.0.1", port))
        kept.settimeout(5)
        kept.sendall(request)
        assert _response(kept).startswith(b"HTTP/1.1 200")
        time.sleep(2.5)  # past the header timeout, within the idle one
        kept.sendall(request)
        assert _response(kept).startswith(b"HTTP/1.1 200")
        answered = time.monotonic()
        waited = _closed_within(kept, 8)
        assert waited is not None, "an idle connection outlived --idle-timeout"
        assert 3.5 < time.monotonic() - answered < 6
        kept.close()

        started = socket.create_connection(("127.0.0.1", port))
        started.settimeout(5)
        started.sendall(request)
        assert _response(started).startswith(b"HTTP/1.1 200")
        time.sleep(0.5)
        started.sendall(b"GET /healthz HTTP/1.1\r\n")
        first_byte = time.monotonic()
        for _ in range(3):  # a header line every 0.3 s: still cut off 1 s after the first byte
            time.sleep(0.3)
            try:
                started.sendall(b"X-Drip: 1\r\n")
            except OSError:
                break
        assert _closed_within(started, 5) is not None
        assert time.monotonic() - first_byte < 2.5
        started.close()


def _response(sock: socket.socket) -> bytes:
    """One whole response (head and ``content-length`` body) read from ``sock``: a response may
    arrive in several segments, and what one ``recv`` leaves is the next response's start."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed in the body after {body!r}"
        body += chunk
    assert len(body) == length, "more than one response"
    return head + b"\r\n\r\n" + body


def test_the_serve_commands_help_gives_the_servers_own_defaults() -> None:
    """``sessionstore serve --help`` gives its guards' defaults without importing the http
    extra, so the CLI keeps a copy of them: the copy is the servers' own."""
    from store.cli import serve as serve_cli
    from store.http import guard, server

    assert serve_cli.DEFAULT_HEADER_TIMEOUT_S == server.DEFAULT_HEADER_TIMEOUT_S
    assert serve_cli.DEFAULT_IDLE_TIMEOUT_S == server.DEFAULT_IDLE_TIMEOUT_S
    assert serve_cli.DEFAULT_MAX_CONNECTIONS == server.DEFAULT_MAX_CONNECTIONS
    assert serve_cli.DEFAULT_BODY_TIMEOUT_S == guard.DEFAULT_BODY_TIMEOUT_S


def test_by_default_a_connection_with_unfinished_headers_is_closed(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    """``sessionstore serve`` without options: the default header timeout (10 s) holds, and
    an idle keep-alive connection outlives the 5 s that clients keep theirs (the server
    closing one first races a client's next request on it; the idle timeout is 60 s)."""
    with serve_process(tmp_path, redis_url, redis_prefix) as url:
        port = _port(url)
        sock = socket.create_connection(("127.0.0.1", port))
        opened = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        kept = socket.create_connection(("127.0.0.1", port))
        kept.settimeout(5)
        request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        kept.sendall(request)
        assert _response(kept).startswith(b"HTTP/1.1 200")
        time.sleep(6.5)
        kept.sendall(request)
        assert _response(kept).startswith(b"HTTP/1.1 200")
        kept.close()
        assert _closed_within(sock, 16) is not None
        sock.close()
        assert 9 < time.monotonic() - opened < 14


def test_connections_over_the_limit_are_closed_and_the_rest_keep_working(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    with serve_process(tmp_path, redis_url, redis_prefix, "--max-connections", "4",
                       "--header-timeout", "30") as url:
        port = _port(url)
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        time.sleep(0.3)
        extra = socket.create_connection(("127.0.0.1", port))
        assert _closed_within(extra, 3) is not None
        extra.close()
        held.pop().close()
        time.sleep(0.3)
        assert httpx.get(url + "/healthz", timeout=5).status_code == 200
        for sock in held:  # the held ones are still open
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)
            sock.close()


# --- 14: numbers ----------------------------------------------------------------------------


def test_oversized_numbers_in_headers_and_query_are_400_and_change_nothing(serve) -> None:
    _, url = serve(tokens=TOKENS)
    with httpx.Client(timeout=30) as c:
        src = url + ROOT + "acme/src"
        assert c.put(src, headers={**ACME, "content-type": "text/plain"}, content=b"abc").status_code == 201
        for digits in (30, 5000):
            n = "9" * digits
            cases = [
                ("cursor", dict(method="GET", url=src, params={"offset": "-1", "live": "long-poll", "cursor": n},
                                headers=ACME)),
                ("Stream-TTL", dict(method="PUT", url=url + ROOT + "acme/ttl",
                                    headers={**ACME, "content-type": "text/plain", "stream-ttl": n})),
                ("Producer-Epoch", dict(method="POST", url=src, content=b"x", headers={
                    **ACME, "content-type": "text/plain", "producer-id": "p", "producer-epoch": n,
                    "producer-seq": "0"})),
                ("Producer-Seq", dict(method="POST", url=src, content=b"x", headers={
                    **ACME, "content-type": "text/plain", "producer-id": "p", "producer-epoch": "0",
                    "producer-seq": n})),
                ("Stream-Fork-Sub-Offset", dict(method="PUT", url=url + ROOT + "acme/fork", headers={
                    **ACME, "stream-forked-from": ROOT + "acme/src", "stream-fork-sub-offset": n})),
                ("limit", dict(method="GET", url=url + "/v1/sessions", params={"limit": n}, headers=ACME)),
                ("updated_since", dict(method="GET", url=url + "/v1/sessions", params={"updated_since": n},
                                       headers=ACME)),
                ("offset", dict(method="GET", url=src, params={"offset": f"{n}_{n}"}, headers=ACME)),
            ]
            for what, request in cases:
                r = c.request(**request)
                assert r.status_code == 400, (what, digits, r.status_code, r.text[:300])
                assert r.headers["content-type"] == "application/problem+json", what
                if what not in ("offset",):
                    assert what.split("-")[-1].lower() in r.json()["detail"].lower(), (what, r.json())
        for name in ("acme/ttl", "acme/fork"):
            assert c.head(url + ROOT + name, headers=ACME).status_code == 404
        assert c.get(src, params={"offset": "-1"}, headers=ACME).content == b"abc"


# --- 15: tokens -----------------------------------------------------------------------------


@pytest.mark.parametrize("env, complaint", [
    (f"acme:{ACME_TOKEN},beta:{ACME_TOKEN}", "under tenants"),
    (f"acme:{ACME_TOKEN},acme:{ACME_TOKEN}", "twice"),
    ("acme:short", "shorter than 16"),
    ("acme:x", "shorter than 16"),
    (f"B :{ACME_TOKEN}", "tenant 'B '"),
    (f"acme: {ACME_TOKEN}", "whitespace"),
    (f"acme{ACME_TOKEN}", "tenant:token"),
    (f":{ACME_TOKEN}", "tenant:token"),
    (f"a/b:{ACME_TOKEN}", "tenant 'a/b'"),
])
def test_a_token_configuration_that_cannot_mean_what_it_says_is_refused(env: str, complaint: str) -> None:
    with pytest.raises(InvalidInputError, match=complaint):
        Tokens.parse_env(env)


def test_tokens_file_is_checked_as_strictly(tmp_path: Path) -> None:
    def load(tenants: Any) -> Tokens:
        path = tmp_path / "tokens.json"
        path.write_text(json.dumps({"tenants": tenants}))
        return Tokens.load(path)

    for tenants, complaint in [
        ({"acme": [ACME_TOKEN], "beta": [ACME_TOKEN]}, "under tenants"),
        ({"acme": ["tiny"]}, "shorter than 16"),
        ({"acme": [f" {ACME_TOKEN} "]}, "whitespace"),
        ({"acme ": [ACME_TOKEN]}, "tenant 'acme '"),
        ({"acme": []}, "list of tokens"),
        ({"acme": ["sha256:00"]}, "sha256"),
    ]:
        with pytest.raises(InvalidInputError, match=complaint):
            load(tenants)
    # Whitespace around env items (not inside them) is fine, and both ways give the same tokens.
    tokens = Tokens.parse_env(f" acme:{ACME_TOKEN} , beta:{BETA_TOKEN} ,")
    assert tokens.tenant_of(f"Bearer {ACME_TOKEN}") == "acme"
    assert tokens.tenant_of(f"Bearer  {BETA_TOKEN} ") == "beta"
    assert load({"acme": [ACME_TOKEN]}).tenant_of(f"Bearer {ACME_TOKEN}") == "acme"


@pytest.mark.parametrize("how", ["env", "file"])
def test_serve_exits_2_on_a_bad_token_configuration(tmp_path: Path, how: str) -> None:
    env = {**server_env()}
    args = ["--objects", str(tmp_path / "o"), "serve", "--host", "127.0.0.1", "--port", "1"]
    if how == "env":
        env["SESSIONSTORE_TOKENS"] = f"acme:{ACME_TOKEN},beta:{ACME_TOKEN}"
    else:
        (tmp_path / "t.json").write_text(json.dumps({"tenants": {"acme": ["short"]}}))
        args += ["--tokens", str(tmp_path / "t.json")]
    r = subprocess.run(cli(*args), capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "token" in r.stderr and "Traceback" not in r.stderr


# --- 16: imports ----------------------------------------------------------------------------


def test_a_session_imported_over_http_is_listed_for_its_tenant(serve) -> None:
    _, url = serve(tokens=TOKENS)
    header = {"type": "session", "version": 3, "id": "imported-1", "timestamp": "2026-11-24T10:00:00.000Z",
              "cwd": "/work/repo"}
    pi_file = "".join(json.dumps(x) + "\n" for x in (header, _entry("m1", None, "hello"),
                                                      _entry("m2", "m1", "again")))
    with httpx.Client(timeout=30) as c:
        r = c.put(url + "/v1/sessions/acme/imported:import", headers=ACME, content=pi_file.encode())
        assert r.status_code == 201, r.text
        listed = c.get(url + "/v1/sessions", headers=ACME).json()["sessions"]
        assert [(s["name"], s["entries"], s["cwd"]) for s in listed] == [("acme/imported", 2, "/work/repo")]
        assert c.get(url + "/v1/sessions", headers=BETA).json()["sessions"] == []
        # Importing it again changes nothing; a refused file leaves nothing behind.
        assert c.put(url + "/v1/sessions/acme/imported:import", headers=ACME,
                     content=pi_file.encode()).status_code == 201
        bad = pi_file + json.dumps({"type": "message", "id": "m3", "parentId": "m2"}) + "\n"
        r = c.put(url + "/v1/sessions/acme/bad:import", headers=ACME, content=bad.encode())
        assert r.status_code == 400, r.text
        assert [s["name"] for s in c.get(url + "/v1/sessions", headers=ACME).json()["sessions"]] == ["acme/imported"]
        assert c.head(url + ROOT + "acme/bad", headers=ACME).status_code == 404
        entries = c.get(url + ROOT + "acme/imported", params={"offset": "-1"}, headers=ACME).json()
        assert [e["id"] for e in entries] == ["m1", "m2"]


# --- 17: a client gone mid-body -------------------------------------------------------------


def test_a_client_gone_mid_body_logs_one_line_without_a_traceback(
    serve, caplog: pytest.LogCaptureFixture
) -> None:
    _, url = serve()
    caplog.set_level(logging.INFO)
    uvicorn_errors = logging.getLogger("uvicorn.error")  # it does not propagate to the root
    uvicorn_errors.addHandler(caplog.handler)
    port = _port(url)
    with httpx.Client(timeout=10) as c:
        assert c.put(url + ROOT + "gone", headers={"content-type": "text/plain"}).status_code == 201
    for method, route in (("POST", ROOT + "gone"), ("POST", "/v1/claude/append"),
                          ("PUT", "/v1/sessions/gone-too:import")):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(f"{method} {route} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
                     f"Content-Length: 100000\r\n\r\n".encode() + b"x" * 1000)
        time.sleep(0.2)
        sock.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        gone = [r for r in caplog.records if r.name == "sessionstore.http" and "left after" in r.getMessage()]
        if len(gone) == 3:
            break
        time.sleep(0.1)
    uvicorn_errors.removeHandler(caplog.handler)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    assert len(gone) == 3 and all(r.levelno == logging.INFO and r.exc_info is None for r in gone)
    with httpx.Client(timeout=10) as c:
        assert c.get(url + ROOT + "gone", params={"offset": "-1"}).content == b""
