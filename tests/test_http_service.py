"""The HTTP service (``store/http/``) over real HTTP on real S3 and Redis: what the Durable
Streams conformance suite (tests/test_http_conformance.py) cannot see: two servers and two
clients on one stream, a reader cut off and reconnected, a producer paused past the
compactor's grace period, tenants, and every bad input writing nothing."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from harness.pausing import FakeClock, InThread, Pause

from compactor import Compactor, CompactorOptions
from store import SessionStore
from store.http.auth import Tokens
from store.streams import Offset

pytestmark = pytest.mark.timeout(300)

ROOT = "/v1/stream/"


def read_all(client: httpx.Client, url: str, offset: str = "-1") -> tuple[bytes, str]:
    """Every byte from ``offset``, following Stream-Next-Offset until up to date."""
    out = b""
    while True:
        r = client.get(url, params={"offset": offset})
        assert r.status_code == 200, r.text
        out += r.content
        offset = r.headers["stream-next-offset"]
        if r.headers.get("stream-up-to-date") == "true":
            return out, offset


# --- bad input -------------------------------------------------------------------------------


TOKENS = Tokens.parse_env("acme:tok-acme-0123456789,beta:tok-beta-0123456789")
ACME = {"authorization": "Bearer tok-acme-0123456789"}


def _cases(json_url: str, text_url: str, beta_url: str) -> list[tuple[str, dict[str, Any], int, str]]:
    """(what, request, status, problem code)."""
    return [
        ("malformed JSON", dict(method="POST", url=json_url, content=b"{nope",
                                headers={**ACME, "content-type": "application/json"}), 400, "invalid-json"),
        ("empty body", dict(method="POST", url=text_url, content=b"",
                            headers={**ACME, "content-type": "text/plain"}), 400, "empty-body"),
        ("empty JSON array", dict(method="POST", url=json_url, content=b"[]",
                                  headers={**ACME, "content-type": "application/json"}), 400, "empty-body"),
        ("oversized body", dict(method="POST", url=text_url, content=b"x" * 5000,
                                headers={**ACME, "content-type": "text/plain"}), 413, "too-large"),
        ("too many messages", dict(method="POST", url=json_url, content=b"[" + b",".join([b"1"] * 11) + b"]",
                                   headers={**ACME, "content-type": "application/json"}), 413, "too-large"),
        ("bad offset", dict(method="GET", url=text_url, params={"offset": "12,3"}, headers=ACME), 400,
         "invalid-offset"),
        ("offset with a newline", dict(method="GET", url=text_url, params={"offset": "0_0\n"}, headers=ACME),
         400, "invalid-offset"),
        ("unknown stream", dict(method="POST", url=text_url + "-nope", content=b"x",
                                headers={**ACME, "content-type": "text/plain"}), 404, "stream-not-found"),
        ("wrong content type", dict(method="POST", url=text_url, content=b"x",
                                    headers={**ACME, "content-type": "application/octet-stream"}), 409,
         "content-type-mismatch"),
        ("no content type", dict(method="POST", url=text_url, content=b"x", headers=ACME), 400, "bad-request"),
        ("wrong tenant (read)", dict(method="GET", url=beta_url, headers=ACME), 403, "forbidden"),
        ("wrong tenant (append)", dict(method="POST", url=beta_url, content=b"x",
                                       headers={**ACME, "content-type": "text/plain"}), 403, "forbidden"),
        ("wrong tenant (fork from)", dict(method="PUT", url=text_url + "-fork",
                                          headers={**ACME, "stream-forked-from": ROOT + "beta/text"}),
         403, "forbidden"),
        ("missing token", dict(method="GET", url=text_url), 401, "unauthorized"),
        ("unknown token", dict(method="GET", url=text_url, headers={"authorization": "Bearer nope"}), 401,
         "unauthorized"),
        ("producer headers incomplete", dict(method="POST", url=text_url, content=b"x",
                                             headers={**ACME, "content-type": "text/plain", "producer-id": "p"}),
         400, "bad-request"),
        ("producer seq not a number", dict(method="POST", url=text_url, content=b"x",
                                           headers={**ACME, "content-type": "text/plain", "producer-id": "p",
                                                    "producer-epoch": "0", "producer-seq": "1e3"}), 400,
         "bad-request"),
        ("If-Match not the tail", dict(method="POST", url=text_url, content=b"x",
                                       headers={**ACME, "content-type": "text/plain",
                                                "if-match": '"0000000000000000_0000000000000000"'}), 412,
         "tail-mismatch"),
        ("If-Match not an offset", dict(method="POST", url=text_url, content=b"x",
                                        headers={**ACME, "content-type": "text/plain", "if-match": '"x"'}), 400,
         "invalid-offset"),
        ("If-Match not quoted", dict(method="POST", url=text_url, content=b"x",
                                     headers={**ACME, "content-type": "text/plain", "if-match": "x"}), 400,
         "bad-request"),
        ("TTL and Expires-At", dict(method="PUT", url=text_url + "-ttl",
                                    headers={**ACME, "stream-ttl": "60",
                                             "stream-expires-at": "2030-01-01T00:00:00Z"}), 400, "bad-request"),
        ("fork offset beyond the tail", dict(method="PUT", url=text_url + "-fork2",
                                             headers={**ACME, "stream-forked-from": ROOT + "acme/text",
                                                      "stream-fork-offset": "9999999999999999_9999999999999999"}),
         400, "invalid-offset"),
    ]


def test_every_bad_input_gets_its_status_and_problem_and_writes_nothing(serve) -> None:
    service, base = serve(tokens=TOKENS, max_body=4096, max_messages=10)
    json_url, text_url, beta_url = (base + ROOT + p for p in ("acme/json", "acme/text", "beta/text"))
    beta = {"authorization": "Bearer tok-beta-0123456789"}
    with httpx.Client(timeout=30) as c:
        assert c.put(json_url, headers={**ACME, "content-type": "application/json"}, content=b'[{"a":1}]').status_code == 201
        assert c.put(text_url, headers={**ACME, "content-type": "text/plain"}, content=b"hello").status_code == 201
        assert c.put(beta_url, headers={**beta, "content-type": "text/plain"}, content=b"beta's").status_code == 201

        def snapshot() -> list[tuple[bytes, str]]:
            return [read_all(c.__class__(headers=h, timeout=30), u)
                    for u, h in ((json_url, ACME), (text_url, ACME), (beta_url, beta))]

        before = snapshot()
        cases = _cases(json_url, text_url, beta_url)
        assert len(cases) > 15
        for what, request, status, code in cases:
            r = c.request(**request)
            assert r.status_code == status, (what, r.status_code, r.text)
            assert r.headers["content-type"] == "application/problem+json", what
            problem = r.json()
            assert problem["status"] == status and problem["code"] == code, (what, problem)
            assert problem["detail"], what
            assert r.headers["x-content-type-options"] == "nosniff", what
            assert snapshot() == before, f"{what} changed a stream"
        for path in ("acme/text-nope", "acme/text-fork", "acme/text-ttl", "acme/text-fork2"):
            assert c.head(base + ROOT + path, headers=ACME).status_code == 404, path


def test_without_tokens_the_service_refuses_to_listen_beyond_loopback(tmp_path) -> None:
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "store.cli", "--objects", str(tmp_path / "o"), "serve", "--host", "0.0.0.0",
         "--port", "1"],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "SESSIONSTORE_TOKENS": ""},
    )
    assert r.returncode != 0
    assert "loopback only" in r.stderr


# --- two servers, two clients ------------------------------------------------------------------


def test_two_servers_two_clients_lose_nothing_and_order_one_way(serve) -> None:
    """Without If-Match: every acknowledged append is read back exactly once, where its
    Stream-Next-Offset says, through either server."""
    _, a = serve()
    _, b = serve()
    path = ROOT + "shared"
    with httpx.Client(timeout=30) as c:
        assert c.put(a + path, headers={"content-type": "text/plain"}).status_code == 201
    acked: list[tuple[str, bytes]] = []
    lock = threading.Lock()

    def client(name: str) -> None:
        with httpx.Client(timeout=30) as c:
            for i in range(25):
                body = f"<{name}{i}>".encode()
                r = c.post((a if i % 2 else b) + path, content=body, headers={"content-type": "text/plain"})
                assert r.status_code == 204, r.text
                with lock:
                    acked.append((r.headers["stream-next-offset"], body))

    threads = [threading.Thread(target=client, args=(n,)) for n in ("x", "y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(acked) == 50
    offsets = [o for o, _ in acked]
    assert len(set(offsets)) == 50, "two appends were given the same position"
    expected = b"".join(body for _, body in sorted(acked))
    with httpx.Client(timeout=30) as c:
        for server in (a, b):
            data, tail = read_all(c, server + path)
            assert data == expected
            assert tail == max(offsets)


def test_two_servers_two_clients_with_if_match_form_one_chain(serve) -> None:
    """With If-Match: an append succeeds only on the tail it names, so the successful
    appends form one chain (each names the previous one's offset) and the losers get 412
    with the actual tail, having written nothing."""
    _, a = serve()
    _, b = serve()
    path = ROOT + "cas"
    with httpx.Client(timeout=30) as c:
        assert c.put(a + path, headers={"content-type": "text/plain"}).status_code == 201
    wins: list[tuple[str, str, bytes]] = []
    refused = [0]
    lock = threading.Lock()

    def client(name: str, server: str) -> None:
        with httpx.Client(timeout=30) as c:
            tail = c.head(server + path).headers["stream-next-offset"]
            done = 0
            while done < 15:
                body = f"<{name}{done}>".encode()
                r = c.post(server + path, content=body,
                           headers={"content-type": "text/plain", "if-match": f'"{tail}"'})
                if r.status_code == 412:
                    assert r.headers["content-type"] == "application/problem+json"
                    tail = r.headers["stream-next-offset"]
                    with lock:
                        refused[0] += 1
                    continue
                assert r.status_code == 204, r.text
                with lock:
                    wins.append((tail, r.headers["stream-next-offset"], body))
                tail = r.headers["stream-next-offset"]
                done += 1

    threads = [threading.Thread(target=client, args=a_) for a_ in (("x", a), ("y", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    chain = sorted(wins, key=lambda w: w[1])
    assert chain[0][0] == str(Offset(0, 0))
    for prev, cur in zip(chain, chain[1:]):
        assert cur[0] == prev[1], "an append was accepted on a tail that had moved"
    with httpx.Client(timeout=30) as c:
        data, _ = read_all(c, b + path)
    assert data == b"".join(w[2] for w in chain)
    assert len(chain) == 30


# --- a reader cut off and reconnected ---------------------------------------------------------


def _sse_events(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    event, data = "", []
    for line in lines:
        if line == "":
            if event:
                yield event, "\n".join(data)
            event, data = "", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:])


def test_sse_reader_killed_and_reconnected_misses_nothing_and_repeats_nothing(serve) -> None:
    _, a = serve()
    _, b = serve(sse_max_s=5.0)
    path = ROOT + "follow"
    n = 120
    with httpx.Client(timeout=30) as c:
        assert c.put(a + path, headers={"content-type": "application/json"}).status_code == 201

    def writer() -> None:
        with httpx.Client(timeout=30) as c:
            for i in range(n):
                r = c.post(a + path, content=json.dumps({"i": i}).encode(),
                           headers={"content-type": "application/json"})
                assert r.status_code == 204

    w = InThread(writer)
    got: list[int] = []
    offset = "-1"
    cuts = 0
    while len(got) < n:
        # Read a few events, then drop the connection without a word (a killed reader), and
        # come back from the last offset a control event confirmed.
        with httpx.Client(timeout=30) as c, c.stream("GET", b + path, params={"offset": offset, "live": "sse"}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"] == "text/event-stream"
            pending: list[int] = []
            seen = 0
            for event, data in _sse_events(r.iter_lines()):
                if event == "data":
                    pending = [m["i"] for m in json.loads(data)]
                elif event == "control":
                    ctrl = json.loads(data)
                    got.extend(pending)
                    pending = []
                    offset = ctrl["streamNextOffset"]
                    seen += 1
                    if seen >= 7 or len(got) >= n:
                        break
        cuts += 1
    w.result()
    assert got == list(range(n)), "a message was missed or repeated across reconnects"
    assert cuts > 3


# --- a producer paused past the compactor's grace period --------------------------------------


def test_producer_paused_past_compaction_grace_is_fenced_and_nothing_it_sent_shows(serve, make_store) -> None:
    """A server paused inside a producer's append (its checks passed, its segment not yet
    written) while the producer's newer epoch writes and compaction retires and deletes the
    slot it is about to fill: when it carries on, its segment is refused as a zombie, its
    checks run again against the new tail, and the client gets 403 with the current epoch."""
    path = ROOT + "fenced"
    sid = "fenced"  # a name that is a session id is its own stream id
    pause = Pause("append.before_put", when=lambda ctx: ctx.get("session_id") == sid and ctx.get("seq") == 3)
    zombie_service, z = serve(store_options={"fault_hook": pause})
    _, b = serve()
    hdr = {"content-type": "text/plain", "producer-id": "writer-1"}
    with httpx.Client(timeout=60) as c:
        assert c.put(b + path, headers={"content-type": "text/plain"}).status_code == 201
        for seq in (0, 1):
            r = c.post(b + path, content=f"e0s{seq};".encode(),
                       headers={**hdr, "producer-epoch": "0", "producer-seq": str(seq)})
            assert r.status_code == 200, r.text
        # The old epoch's next append: checked against tail seq 2, then paused before its PUT.
        stale = InThread(lambda: httpx.post(z + path, content=b"ZOMBIE;", timeout=120,
                                            headers={**hdr, "producer-epoch": "0", "producer-seq": "2"}))
        pause.wait_paused()
        # A newer epoch takes over through the other server: segment 3.
        r = c.post(b + path, content=b"e1s0;", headers={**hdr, "producer-epoch": "1", "producer-seq": "0"})
        assert r.status_code == 200, r.text
        # Compaction retires segments 1..3 and GC, past the grace period, deletes them: the
        # slot the paused writer is about to PUT is free again.
        clock = FakeClock()
        compactor = Compactor(make_store(), CompactorOptions(grace_ms=60_000, worker="t"), now=clock)
        assert compactor.compact_session(sid).outcome == "compacted"
        clock.advance(60_001)
        compactor.gc_session(sid)
        store = zombie_service.store
        inc = store.get_header(sid).incarnation
        assert store.objects.head(store.layout.segment(sid, inc, 3)) is None
        pause.release()
        r = stale.result()
        assert r.status_code == 403, r.text
        assert r.headers["producer-epoch"] == "1"
        assert r.headers["content-type"] == "application/problem+json"
        # Refused at its COMMIT: a zombie, or RETIRED when the slot's ids are compacted out
        # of Redis (its next CHECK then told it apart from a committed batch).
        assert any(p in ("append.zombie", "append.retired_slot") for p, _ in pause.seen), \
            "the paused PUT was not refused as a zombie"
        for server in (b, z):
            data, _ = read_all(c, server + path)
            assert data == b"e0s0;e0s1;e1s0;"
        # ...and the epoch-0 producer stays fenced.
        r = c.post(b + path, content=b"late;", headers={**hdr, "producer-epoch": "0", "producer-seq": "3"})
        assert r.status_code == 403


# --- binary and JSON through the wire -----------------------------------------------------------


def test_binary_is_byte_exact_and_sse_sends_it_as_base64(serve) -> None:
    _, a = serve()
    path = ROOT + "bin"
    blob = bytes(range(256)) * 4
    with httpx.Client(timeout=30) as c:
        assert c.put(a + path, headers={"content-type": "application/octet-stream"}, content=blob).status_code == 201
        assert read_all(c, a + path)[0] == blob
        with c.stream("GET", a + path, params={"offset": "-1", "live": "sse"}) as r:
            assert r.headers["stream-sse-data-encoding"] == "base64"
            for event, data in _sse_events(r.iter_lines()):
                if event == "data":
                    assert base64.b64decode(data) == blob
                    break


def test_a_binary_catch_up_of_small_and_large_messages_is_exact_with_its_length(serve) -> None:
    """A binary read goes out in pieces (small messages joined, large ones as they are):
    the body is every message in order, and its Content-Length says so."""
    _, a = serve()
    path = ROOT + "bin-pieces"
    small = [bytes([i % 256]) * 100 for i in range(3000)]  # 300 KB of 100-byte messages
    large = bytes(range(256)) * 1200  # one message larger than a piece
    octet = {"content-type": "application/octet-stream"}
    with httpx.Client(timeout=30) as c:
        assert c.put(a + path, headers=octet).status_code == 201
        for i in range(0, 3000, 500):
            assert c.post(a + path, headers=octet, content=b"".join(small[i : i + 500])).status_code == 204
        assert c.post(a + path, headers=octet, content=large).status_code == 204
        for m in small[:5]:
            assert c.post(a + path, headers=octet, content=m).status_code == 204
        got = c.get(a + path, params={"offset": "-1"})
        want = b"".join(small) + large + b"".join(small[:5])
        assert got.status_code == 200 and got.content == want
        assert got.headers["content-length"] == str(len(want))


# --- sessions over the same protocol -------------------------------------------------------------


def _entry(eid: str, parent: str | None, text: str = "hi") -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent, "timestamp": "2026-11-24T00:00:00.000Z",
            "message": {"role": "user", "content": text}}


def test_a_session_is_a_stream_with_entry_ids_as_its_idempotency_key(serve) -> None:
    _, a = serve()
    _, b = serve()
    url_a, url_b = a + ROOT + "s1", b + ROOT + "s1"
    js = {"content-type": "application/json"}
    with httpx.Client(timeout=30) as c:
        r = c.put(url_a, headers={**js, "stream-kind": "session", "session-cwd": "/work"},
                  content=json.dumps([_entry("e1", None)]))
        assert r.status_code == 201, r.text
        assert c.put(url_b, headers={**js, "stream-kind": "session"}).status_code == 200
        # A plain stream of that name is another thing: refused.
        assert c.put(url_b, headers=js).status_code == 409
        # If-Match names the tail entry: the loser of a race gets 412 and the real tail.
        r = c.post(url_a, headers={**js, "if-match": '"e1"'}, content=json.dumps(_entry("e2", "e1")))
        assert r.status_code == 204, r.text
        first = r.headers["stream-next-offset"]
        r = c.post(url_b, headers={**js, "if-match": '"e1"'}, content=json.dumps(_entry("x2", "e1")))
        assert r.status_code == 412
        assert r.headers["session-tail-entry-id"] == "e2"
        assert r.headers["stream-next-offset"] == first
        # A re-send of the committed batch (an unknown outcome retried) is answered with the
        # original position and writes nothing; the same id with other content is refused.
        r = c.post(url_b, headers=js, content=json.dumps(_entry("e2", "e1")))
        assert (r.status_code, r.headers["stream-next-offset"]) == (204, first)
        r = c.post(url_b, headers=js, content=json.dumps(_entry("e2", "e1", "other")))
        assert (r.status_code, r.json()["code"]) == (409, "id-collision")
        # The session model's rules hold: a message entry without a message is refused.
        r = c.post(url_b, headers=js, content=json.dumps({"type": "message", "id": "bad", "parentId": "e2"}))
        assert r.status_code == 400 and r.json()["code"] == "bad-request"
        r = c.post(url_b, headers={**js, "producer-id": "p", "producer-epoch": "0", "producer-seq": "0"},
                   content=json.dumps(_entry("e3", "e2")))
        assert r.status_code == 400
        # Readers see entries; any Durable Streams reader can follow from an offset.
        r = c.get(url_b, params={"offset": "-1"})
        assert [e["id"] for e in r.json()] == ["e1", "e2"]
        stale = InThread(lambda: httpx.get(url_a, params={"offset": r.headers["stream-next-offset"],
                                                          "live": "long-poll"}, timeout=30))
        c.post(url_b, headers=js, content=json.dumps([_entry("e3", "e2"), _entry("e4", "e3")]))
        woke = stale.result()
        assert woke.status_code in (200, 204)
        if woke.status_code == 200:
            assert [e["id"] for e in woke.json()] == ["e3", "e4"]
        assert [e["id"] for e in c.get(url_a, params={"offset": "-1"}).json()] == ["e1", "e2", "e3", "e4"]


def test_session_extras_list_context_fork_redact_export_import(serve) -> None:
    _, a = serve(tokens=TOKENS)
    js = {"content-type": "application/json"}
    acme, beta = {**ACME, **js}, {"authorization": "Bearer tok-beta-0123456789", **js}
    with httpx.Client(timeout=30) as c:
        for i in range(5):
            entries = [_entry(f"a{i}-1", None, f"question {i}"), _entry(f"a{i}-2", f"a{i}-1", f"more {i}")]
            r = c.put(a + ROOT + f"acme/chat-{i}", headers={**acme, "stream-kind": "session"},
                      content=json.dumps(entries))
            assert r.status_code == 201
        assert c.put(a + ROOT + "beta/chat", headers={**beta, "stream-kind": "session"}).status_code == 201
        assert c.put(a + ROOT + "acme/plain", headers=acme).status_code == 201  # a stream: not listed
        # Pages of two, in a stable order, each session once, only the tenant's own.
        names, cursor = [], None
        while True:
            params = {"limit": "2", **({"after": cursor} if cursor else {})}
            page = c.get(a + "/v1/sessions", params=params, headers=ACME).json()
            assert len(page["sessions"]) <= 2
            names += [s["name"] for s in page["sessions"]]
            for s in page["sessions"]:
                assert s["entries"] == 2 and s["fork_of"] is None and s["created_at_ms"] > 0
            cursor = page["next"]
            if cursor is None:
                break
        assert sorted(names) == [f"acme/chat-{i}" for i in range(5)]
        assert len(names) == 5
        assert [s["name"] for s in c.get(a + "/v1/sessions", headers=beta).json()["sessions"]] == ["beta/chat"]
        assert c.get(a + "/v1/sessions", params={"limit": "0"}, headers=ACME).status_code == 400
        # Context at a leaf.
        ctx = c.get(a + "/v1/sessions/acme/chat-0:context", params={"leaf": "a0-1"}, headers=ACME).json()
        assert [m["content"] for m in ctx["messages"]] == ["question 0"]
        assert c.get(a + "/v1/sessions/beta/chat:context", headers=ACME).status_code == 403
        # Fork from an entry: a new session, nothing copied, listed with its origin.
        r = c.post(a + "/v1/sessions/acme/chat-0:fork", headers=ACME,
                   content=json.dumps({"entry_id": "a0-1", "name": "acme/chat-0-b"}))
        assert r.status_code == 201 and r.headers["location"].endswith("/v1/stream/acme/chat-0-b")
        assert [e["id"] for e in c.get(r.headers["location"], params={"offset": "-1"}, headers=ACME).json()] == ["a0-1"]
        r = c.post(a + "/v1/sessions/acme/chat-0:fork", headers=ACME,
                   content=json.dumps({"entry_id": "a0-1", "name": "beta/stolen"}))
        assert r.status_code == 403
        r = c.post(a + "/v1/sessions/acme/chat-0:fork", headers=ACME,
                   content=json.dumps({"entry_id": "nope", "name": "acme/x"}))
        assert (r.status_code, r.json()["code"]) == (404, "entry-not-found")
        # Redact: every reader sees a tombstone.
        r = c.post(a + "/v1/sessions/acme/chat-1:redact", headers=ACME,
                   content=json.dumps({"entry_id": "a1-2", "reason": "pii"}))
        assert r.status_code == 200
        entries = c.get(a + ROOT + "acme/chat-1", params={"offset": "-1"}, headers=ACME).json()
        assert "message" not in entries[1] and entries[1]["redacted"]["reason"] == "pii"
        # Export as a pi file, import it under another name: the same entries.
        pi_file = c.get(a + "/v1/sessions/acme/chat-2:export", headers=ACME)
        assert pi_file.headers["content-type"] == "application/x-ndjson"
        assert json.loads(pi_file.text.splitlines()[0])["type"] == "session"
        r = c.put(a + "/v1/sessions/acme/copy:import", headers=ACME, content=pi_file.content)
        assert r.status_code == 201, r.text
        copy = c.get(a + ROOT + "acme/copy", params={"offset": "-1"}, headers=ACME).json()
        orig = c.get(a + ROOT + "acme/chat-2", params={"offset": "-1"}, headers=ACME).json()
        assert copy == orig
        assert c.get(a + "/v1/sessions/acme/plain:context", headers=ACME).status_code == 404
        assert c.get(a + "/v1/sessions/acme/chat-0:nonsense", headers=ACME).status_code == 404


def test_a_recreated_stream_never_serves_the_old_incarnation_through_another_server(serve) -> None:
    _, a = serve()
    _, b = serve()
    path = ROOT + "reborn"
    text = {"content-type": "text/plain"}
    with httpx.Client(timeout=30) as c:
        assert c.put(a + path, headers=text, content=b"old life;").status_code == 201
        c.post(a + path, headers=text, content=b"more old;")
        old, old_tail = read_all(c, b + path)  # b now caches the old incarnation
        assert old == b"old life;more old;"
        assert c.delete(a + path).status_code == 204
        assert c.get(b + path).status_code == 404
        assert c.put(a + path, headers=text, content=b"new").status_code == 201
        assert read_all(c, b + path)[0] == b"new"
        # An offset past the new life's tail (the old life was longer) is refused, not read
        # as a position that the new life may reach later.
        r = c.get(b + path, params={"offset": old_tail})
        assert (r.status_code, r.json()["code"]) == (400, "invalid-offset")


def test_two_processes_four_clients_on_one_session_the_history_checker_is_clean(
    s3_url: str, redis_url: str, redis_prefix: str, make_store: Callable[..., SessionStore], tmp_path
) -> None:
    """Two ``sessionstore serve`` processes, four clients appending to one pi session, two of
    them with ``If-Match`` on the tail entry they know: judged by tests/history.py as a library
    writer's history is (every acknowledged batch there once, whole, at the seq it was
    acknowledged with; a 412 writes nothing; an If-Match batch sits right after its tail)."""
    from harness.serve_process import serve as serve_process
    from history import Op, check_history

    args = ["--objects", s3_url, "--redis", redis_url, "--redis-prefix", redis_prefix]
    name = "shared-session"
    js = {"content-type": "application/json"}
    ops: list[Op] = []
    lock = threading.Lock()
    with serve_process(args, tmp_path / "a.log", cwd=tmp_path) as p1, \
            serve_process(args, tmp_path / "b.log", cwd=tmp_path) as p2:
        r = httpx.put(p1.url + ROOT + name, headers={**js, "stream-kind": "session"}, timeout=30)
        assert r.status_code == 201, r.text

        def client(tag: str, server: str, if_match: bool) -> None:
            tail = ""
            mine: str | None = None
            with httpx.Client(timeout=60) as c:
                for i in range(12):
                    ids = [f"{tag}{i}a", f"{tag}{i}b"]
                    parent = (tail or None) if if_match else mine
                    batch = [_entry(ids[0], parent), _entry(ids[1], ids[0])]
                    headers = {**js, "if-match": f'"{tail}"'} if if_match else js
                    op = Op(name, ids,  # a session id: its own stream id
                             tail if if_match else None, "ok")
                    r = c.post(server + ROOT + name, content=json.dumps(batch), headers=headers)
                    if r.status_code == 204:
                        op.seq = Offset.parse(r.headers["stream-next-offset"]).vseq
                        tail = mine = ids[-1]
                    elif r.status_code == 412:
                        op.outcome, op.actual_tail = "conflict", r.headers["session-tail-entry-id"]
                        tail = op.actual_tail
                    elif r.status_code == 503 and r.json()["code"] == "indeterminate":
                        op.outcome = "indeterminate"
                    else:
                        op.outcome = f"error:{r.status_code}:{r.text}"
                    with lock:
                        ops.append(op)

        threads = [threading.Thread(target=client, args=a_) for a_ in
                   (("x", p1.url, True), ("y", p2.url, True), ("u", p1.url, False), ("v", p2.url, False))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    report = check_history(make_store(), ops)
    assert report.problems == [] and report.errors == [], (report.problems, report.errors)
    assert report.acknowledged >= 24  # the two writers without If-Match never conflict
    assert len(ops) == 48


# --- statuses: one table ---------------------------------------------------------------------


def _error_classes() -> list[type[Exception]]:
    import inspect

    import store.errors as errors

    return [c for _, c in inspect.getmembers(errors, inspect.isclass)
            if issubclass(c, errors.SessionStoreError) and c.__module__ == errors.__name__]


def test_errors_carry_no_status_and_every_stream_error_has_its_answer() -> None:
    """Errors say what went wrong; the HTTP status and problem code of each are decided in
    ``store/http/problems.py`` alone, and every stream refusal (and its subclasses' headers)
    has its entry there."""
    from store.errors import StaleEpochError, StreamClosedError, StreamError, TailMismatchError
    from store.http.problems import STATUS, problem_of

    classes = _error_classes()
    assert StreamError in classes
    for cls in classes:
        assert "status" not in vars(cls) and "code" not in vars(cls), cls
    for cls in classes:
        if issubclass(cls, StreamError):
            assert cls in STATUS, cls
    assert problem_of(StreamClosedError("closed", "0000000000000001_0000000000000002")) == (
        409, "stream-closed", "closed",
        {"Stream-Closed": "true", "Stream-Next-Offset": "0000000000000001_0000000000000002"},
    )
    assert problem_of(TailMismatchError("moved", "-1", entry_id="")) == (
        412, "tail-mismatch", "moved", {"Stream-Next-Offset": "-1", "Session-Tail-Entry-Id": ""},
    )
    assert problem_of(StaleEpochError("stale", 3)) == (403, "stale-producer-epoch", "stale", {"Producer-Epoch": "3"})
    assert problem_of(StreamError("no")) == (400, "bad-request", "no", {})
    assert problem_of(ValueError("not ours")) is None
