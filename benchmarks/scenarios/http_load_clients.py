"""The clients of the HTTP load scenario (``benchmarks/scenarios/http_load.py``), one process
per role, each one asyncio event loop with ``httpx.AsyncClient``:

    python -m benchmarks.scenarios.http_load_clients ROLE SPEC_JSON

Roles: ``writers``, ``sse`` and ``long-poll`` (followers), ``readers``, ``prober``. A role
prints ``{"ready": true}`` once imported and set up, then waits for commands on stdin, one
JSON object a line:

- ``{"cmd": "go"}``: start. Writers and readers stop by themselves ``duration_s`` later.
- ``{"cmd": "tails", "tails": {stream: offset}}`` (followers): the streams' final tails, read
  after every writer finished; a follower stops once it has read up to its stream's tail.
- ``{"cmd": "stop"}`` (prober): stop probing.

At the end a role prints one JSON object (its result) on stdout and exits. Every response is
checked; what a role could not do is counted in ``errors`` (with the first few in
``error_samples``), never hidden.

Messages of the load streams are JSON objects ``{"w": writer, "s": seq, "t": wall time of
the send, "pad": ...}``; a follower's ``digest`` is the SHA-256 of ``"w:s\\n"`` for every
message in the order it received them, so the scenario compares it with the stream's own.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import random
import sys
import threading
import time
from typing import Any

import httpx
import orjson

ROOT = "/v1/stream/"
JSON_TYPE = {"content-type": "application/json"}
#: No pool limit (each client of a role is a concurrent request), generous keep-alive.
LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=30)
#: Live reads wait up to the long-poll timeout, SSE keep-alives come every 15 s.
TIMEOUT = httpx.Timeout(connect=10.0, read=60.0, write=30.0, pool=None)
#: How long a writer keeps re-sending one append that fails before it gives up on it.
RETRY_FOR_S = 30.0


class Role:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.errors = 0
        self.error_samples: list[str] = []
        self.commands: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 10:
            self.error_samples.append(what[:300])

    async def command(self, name: str) -> dict[str, Any]:
        while True:
            cmd = await self.commands.get()
            if cmd.get("cmd") == name:
                return cmd

    def client(self, base: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=base, limits=LIMITS, timeout=TIMEOUT,
                                 headers={"accept-encoding": "identity"})


# --- writers ---------------------------------------------------------------------------------


async def writers(role: Role) -> dict[str, Any]:
    """``writers`` idempotent producers, writer ``i`` on stream ``i % len(streams)``, each
    appending one message every ``interval_s`` (its first slot at a random point of the first
    interval) until ``duration_s`` is over. Latency counts from the slot's intended start (a
    stall is paid by the appends queued behind it); the slots a writer had not reached when
    the time was up are counted in ``missed_slots``, not made. A failed append (no answer, a 5xx) is re-sent with the same
    ``(id, epoch, seq)``: the service stores it once whatever happened to the first."""
    spec = role.spec
    streams: list[str] = spec["streams"]
    interval: float = spec["interval_s"]
    pad = "x" * spec["pad_bytes"]
    latency: list[float] = []
    service: list[float] = []
    acked: dict[str, int] = {}
    retries = 0
    late = 0
    missed = 0
    async with role.client(spec["url"]) as client:
        await role.command("go")
        t0 = time.monotonic()
        end = t0 + spec["duration_s"]
        rng = random.Random(spec["seed"])

        async def writer(i: int) -> None:
            nonlocal retries, late, missed
            path = ROOT + streams[i % len(streams)]
            pid = f"w{i}"
            slot = t0 + rng.uniform(0, interval)
            seq = 0
            while slot < end:
                now = time.monotonic()
                if now >= end:
                    missed += math.ceil((end - slot) / interval)
                    return
                if now < slot:
                    await asyncio.sleep(slot - now)
                elif now - slot > interval:
                    late += 1
                headers = {**JSON_TYPE, "producer-id": pid, "producer-epoch": "0", "producer-seq": str(seq)}
                body = orjson.dumps({"w": i, "s": seq, "t": time.time(), "pad": pad})
                give_up = time.monotonic() + RETRY_FOR_S
                while True:
                    sent = time.monotonic()
                    try:
                        r = await client.post(path, content=body, headers=headers)
                    except httpx.HTTPError as exc:
                        r, why = None, repr(exc)
                    else:
                        why = f"HTTP {r.status_code}: {r.text[:200]}"
                    if r is not None and r.status_code in (200, 204):
                        done = time.monotonic()
                        latency.append(done - slot)
                        service.append(done - sent)
                        break
                    if (r is not None and r.status_code < 500) or time.monotonic() > give_up:
                        role.error(f"{pid} seq {seq}: {why}")  # a refusal: a bug, never re-sent
                        return
                    retries += 1
                    await asyncio.sleep(0.05)
                acked[pid] = seq + 1
                seq += 1
                slot += interval

        await asyncio.gather(*(writer(i) for i in range(spec["writers"])))
        wall = time.monotonic() - t0
    return {"acked": acked, "latency_s": latency, "service_s": service, "retries": retries,
            "late_slots": late, "missed_slots": missed, "wall_s": wall}


# --- followers -------------------------------------------------------------------------------


class Follower:
    """One live reader of one stream from offset -1: what it saw, checked as it goes."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.offset = "-1"
        self.cursor: str | None = None
        self.count = 0
        self.digest = hashlib.sha256()
        self.last: dict[int, int] = {}
        self.duplicates = 0
        self.gaps = 0
        self.lag: list[float] = []
        self.requests = 0

    def take(self, messages: list[Any], now: float) -> None:
        for m in messages:
            w, s = m["w"], m["s"]
            before = self.last.get(w, -1)
            if s <= before:
                self.duplicates += 1
            elif s != before + 1:
                self.gaps += 1
            self.last[w] = max(before, s)
            self.count += 1
            self.digest.update(f"{w}:{s}\n".encode())
            self.lag.append(now - m["t"])


async def _sse(role: Role, client: httpx.AsyncClient, f: Follower) -> None:
    """SSE from the follower's offset; messages are taken when the ``control`` event after
    them names the offset they end at (a response cut between the two is read again from the
    last offset taken: nothing twice, nothing missed). Reconnects when a response ends."""
    path = ROOT + f.stream
    while True:
        params = {"offset": f.offset, "live": "sse"}
        if f.cursor:
            params["cursor"] = f.cursor
        pending: list[Any] = []
        try:
            f.requests += 1
            async with client.stream("GET", path, params=params) as r:
                if r.status_code != 200:
                    role.error(f"SSE {f.stream}: HTTP {r.status_code}")
                    await asyncio.sleep(0.2)
                    continue
                event, data = "", []
                async for line in r.aiter_lines():
                    if line == "":
                        if event == "data":
                            pending += orjson.loads("\n".join(data))
                        elif event == "control":
                            ctrl = orjson.loads("\n".join(data))
                            f.take(pending, time.time())
                            pending = []
                            f.offset = ctrl["streamNextOffset"]
                            f.cursor = ctrl.get("streamCursor", f.cursor)
                        event, data = "", []
                    elif line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].removeprefix(" "))
        except httpx.HTTPError as exc:
            role.error(f"SSE {f.stream}: {exc!r}")
            await asyncio.sleep(0.2)


async def _long_poll(role: Role, client: httpx.AsyncClient, f: Follower) -> None:
    path = ROOT + f.stream
    while True:
        params = {"offset": f.offset, "live": "long-poll"}
        if f.cursor:
            params["cursor"] = f.cursor
        try:
            f.requests += 1
            r = await client.get(path, params=params)
        except httpx.HTTPError as exc:
            role.error(f"long-poll {f.stream}: {exc!r}")
            await asyncio.sleep(0.2)
            continue
        if r.status_code not in (200, 204):
            role.error(f"long-poll {f.stream}: HTTP {r.status_code}: {r.text[:200]}")
            await asyncio.sleep(0.2)
            continue
        if r.status_code == 200:
            f.take(orjson.loads(r.content), time.time())
        f.offset = r.headers["stream-next-offset"]
        f.cursor = r.headers.get("stream-cursor", f.cursor)


async def followers(role: Role) -> dict[str, Any]:
    """``followers`` live readers (``mode``: ``sse`` or ``long-poll``), follower ``j`` on
    stream ``j % len(streams)``, from -1 until the final tail the scenario sends."""
    spec = role.spec
    streams: list[str] = spec["streams"]
    follow = _sse if spec["mode"] == "sse" else _long_poll
    fs = [Follower(streams[j % len(streams)]) for j in range(spec["followers"])]
    async with role.client(spec["url"]) as client:
        await role.command("go")
        t0 = time.monotonic()
        tasks = [asyncio.ensure_future(follow(role, client, f)) for f in fs]
        tails: dict[str, str] = (await role.command("tails"))["tails"]
        deadline = time.monotonic() + spec["drain_s"]
        while time.monotonic() < deadline and any(f.offset != tails[f.stream] for f in fs):
            await asyncio.sleep(0.05)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        wall = time.monotonic() - t0
    lag = [x for f in fs for x in f.lag]
    return {
        "followers": [{"stream": f.stream, "count": f.count, "digest": f.digest.hexdigest(),
                       "duplicates": f.duplicates, "gaps": f.gaps, "at_tail": f.offset == tails[f.stream],
                       "requests": f.requests} for f in fs],
        "lag_s": lag,
        "wall_s": wall,
    }


# --- readers of the large binary stream --------------------------------------------------------


async def readers(role: Role) -> dict[str, Any]:
    """``readers`` clients each reading the whole binary stream from -1 (following
    ``Stream-Next-Offset`` until up to date), again and again until ``duration_s`` is over;
    every read checked against the stream's size and SHA-256."""
    spec = role.spec
    path = ROOT + spec["stream"]
    want_size, want_digest = spec["bytes"], spec["sha256"]
    times: list[float] = []
    requests = 0
    nbytes = 0
    bad = 0
    async with role.client(spec["url"]) as client:
        await role.command("go")
        t0 = time.monotonic()
        end = t0 + spec["duration_s"]

        async def reader() -> None:
            nonlocal requests, nbytes, bad
            while time.monotonic() < end:
                started = time.monotonic()
                digest, size, offset = hashlib.sha256(), 0, "-1"
                try:
                    while True:
                        r = await client.get(path, params={"offset": offset})
                        requests += 1
                        if r.status_code != 200:
                            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
                        digest.update(r.content)
                        size += len(r.content)
                        offset = r.headers["stream-next-offset"]
                        if r.headers.get("stream-up-to-date") == "true":
                            break
                except (httpx.HTTPError, RuntimeError, KeyError) as exc:
                    role.error(f"read of {spec['stream']}: {exc!r}")
                    await asyncio.sleep(0.2)
                    continue
                nbytes += size
                if size != want_size or digest.hexdigest() != want_digest:
                    bad += 1
                    role.error(f"read of {spec['stream']}: {size} bytes, not the {want_size} written")
                    continue
                times.append(time.monotonic() - started)

        await asyncio.gather(*(reader() for _ in range(spec["readers"])))
        wall = time.monotonic() - t0
    return {"read_s": times, "requests": requests, "bytes": nbytes, "bad_reads": bad, "wall_s": wall}


# --- the /healthz prober -----------------------------------------------------------------------


async def prober(role: Role) -> dict[str, Any]:
    """``GET /healthz`` on every target (the balancer and each server), each every
    ``interval_s`` after its previous answer (as a health check does), until ``stop``; one
    keep-alive connection per target."""
    spec = role.spec
    targets: dict[str, str] = spec["targets"]
    samples: dict[str, list[float]] = {name: [] for name in targets}
    failures: dict[str, int] = {name: 0 for name in targets}
    stopping = asyncio.Event()
    await role.command("go")
    t0 = time.monotonic()

    async def probe(name: str, url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(10.0)) as client:
            while not stopping.is_set():
                started = time.monotonic()
                try:
                    r = await client.get("/healthz")
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                took = time.monotonic() - started
                if ok:
                    samples[name].append(took)
                else:
                    failures[name] += 1
                try:
                    await asyncio.wait_for(stopping.wait(), timeout=max(0.0, spec["interval_s"] - took))
                except TimeoutError:
                    pass

    tasks = [asyncio.ensure_future(probe(name, url)) for name, url in targets.items()]
    await role.command("stop")
    stopping.set()
    await asyncio.gather(*tasks)
    return {"healthz_s": samples, "failures": failures, "wall_s": time.monotonic() - t0}


ROLES = {"writers": writers, "sse": followers, "long-poll": followers, "readers": readers, "prober": prober}


async def _main(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    role = Role(spec)
    loop = asyncio.get_running_loop()

    def read_commands() -> None:
        for line in sys.stdin:
            if line.strip():
                loop.call_soon_threadsafe(role.commands.put_nowait, json.loads(line))

    threading.Thread(target=read_commands, daemon=True).start()
    print(json.dumps({"ready": True}), flush=True)
    cpu0 = time.process_time()
    out = await ROLES[name](role)
    out.update(role=name, errors=role.errors, error_samples=role.error_samples,
               cpu_s=time.process_time() - cpu0)
    return out


def main(argv: list[str]) -> None:
    name, spec = argv[0], json.loads(argv[1])
    if name not in ROLES:
        raise SystemExit(f"unknown role {name!r}: one of {', '.join(ROLES)}")
    if name in ("sse", "long-poll"):
        spec["mode"] = name
    result = asyncio.run(_main(name, spec))
    result["nice"] = os.nice(0)  # the niceness this client ran at (the scenario reports it)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
