"""Two ``sessionstore serve`` processes behind HAProxy (``harness.haproxy``, Debian's
``haproxy``), as the load benchmark runs them and an operator deploys them: every request of
a kept-alive client connection goes to the next process, live reads stream through it, and
what one process acknowledges the other serves.

Without ``haproxy`` the tests skip, except under ``CI`` (set, not false or 0), where they
fail: ``.ci/run`` installs it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness.haproxy import HaproxyBalancer, require_haproxy
from harness.serve_process import ServeProcess, serve

ROOT = "/v1/stream/"


@pytest.fixture
def balanced(s3_url: str, redis_url: str, redis_prefix: str, tmp_path: Path) -> Iterator[tuple[HaproxyBalancer, list[ServeProcess]]]:
    require_haproxy()
    args = ["--objects", s3_url, "--redis", redis_url, "--redis-prefix", redis_prefix]
    with serve(args, tmp_path / "a.log", cwd=tmp_path) as a, serve(args, tmp_path / "b.log", cwd=tmp_path) as b:
        with HaproxyBalancer([a.url, b.url]) as lb:
            yield lb, [a, b]


def test_each_request_goes_to_the_next_process_and_both_serve_one_stream(
    balanced: tuple[HaproxyBalancer, list[ServeProcess]],
) -> None:
    lb, _ = balanced
    json = {"content-type": "application/json"}
    with httpx.Client(base_url=lb.url, timeout=30) as c:  # one kept-alive connection
        assert c.put(ROOT + "lb/s", headers=json).status_code == 201
        for i in range(6):
            assert c.post(ROOT + "lb/s", headers=json, content=f'{{"n": {i}}}').status_code == 204
        got = c.get(ROOT + "lb/s", params={"offset": "-1"})
        assert got.status_code == 200 and got.json() == [{"n": i} for i in range(6)]
    counts, errors = lb.stats()
    assert errors == []
    assert sum(counts) == 8 and min(counts) == 4, counts  # alternated, request by request


def test_a_live_reader_through_it_sees_an_append_made_through_it(
    balanced: tuple[HaproxyBalancer, list[ServeProcess]],
) -> None:
    lb, _ = balanced
    json = {"content-type": "application/json"}
    with httpx.Client(base_url=lb.url, timeout=30) as c:
        assert c.put(ROOT + "lb/live", headers=json).status_code == 201
        tail = c.head(ROOT + "lb/live").headers["stream-next-offset"]

        def later() -> None:
            time.sleep(0.5)
            with httpx.Client(base_url=lb.url, timeout=30) as other:
                other.post(ROOT + "lb/live", headers=json, content=b'{"late": true}')

        writer = threading.Thread(target=later)
        writer.start()
        events = []
        with c.stream("GET", ROOT + "lb/live", params={"offset": tail, "live": "sse"}) as sse:
            assert sse.status_code == 200
            for line in sse.iter_lines():
                events.append(line)
                if line.startswith("data:") and "late" in line:
                    break
        writer.join()
        polled = c.get(ROOT + "lb/live", params={"offset": tail, "live": "long-poll"})
        assert polled.status_code == 200 and polled.json() == [{"late": True}]
    assert "event: data" in events
