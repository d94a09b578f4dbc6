"""The HTTP service (``--only http``; not in the default run: it needs the ``http`` extra and
httpx, which ``pip install -e '.[test]'`` has): the Durable Streams protocol over HTTP against
the library it wraps, and against the protocol's Node reference server.

Three sides, on one machine:

- **library** (the floor): ``Streams`` (``store/streams.py``) called in this process, on this
  run's backend.
- **HTTP**: ``StreamService`` (``store/http/app.py``) served by uvicorn in a child process of
  its own, as ``sessionstore serve`` runs it (so that its Python work and the client's do not
  share one GIL), on the same backend, through one ``httpx.Client`` with keep-alive.
- **reference**: ``@durable-streams/server`` from ``tests/ds-node`` (``start-reference.mjs``),
  in memory in one Node process. Not a like-for-like store (it keeps nothing durable, talks
  to no S3 and no Redis): a floor for what the protocol itself costs over HTTP here. Reported
  "not available" when ``tests/ds-node`` has not been installed (``.ci/run`` installs it).

Appends: single 100-byte ``text/plain`` appends, open loop as in the append scenario: every
round runs one append per side, in a random order, on a fixed schedule (about a third of the
capacity measured at warm-up), latency counted from the slot's intended start.

Catch-up read: a JSON stream of 10,000 small objects (appended in batches of 100), read from
offset -1 following ``Stream-Next-Offset`` until ``Stream-Up-To-Date: true``, the HTTP client
parsing each body into values as the library returns them. The library and the HTTP service
read the same stream (the library's stream ``<name>`` is the service's ``/v1/stream/<name>``);
the reference holds the same messages. Phases ABBA (library, HTTP, reference, then reference,
HTTP, library); then again after the compactor merged the stream's segments (when there is a
compactor), where the store reads one base object instead of a segment per append, so what
HTTP adds shows more.

Both HTTP clients send ``Accept-Encoding: identity`` (the reference server gzips large
responses otherwise, the service does not compress), so both move the same bytes. Every
response is checked (status, headers, content) and every side's messages are compared with
what was written: a broken HTTP path fails the run instead of producing a figure.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson

from benchmarks.backends import REPO_ROOT, TESTS_DIR, Backend
from benchmarks.context import Context
from benchmarks.results import fmt_ms, fmt_ratio
from benchmarks.stats import median, open_loop, percentile, ratio_ci, summarize

REFERENCE_DIR = TESTS_DIR / "ds-node"
NOT_AVAILABLE = "not available (run .ci/run once)"
ROOT = "/v1/stream/"
_TEXT = {"content-type": "text/plain"}
_JSON = {"content-type": "application/json"}


def expected_figures(params: dict[str, Any], compaction: bool) -> list[str]:
    """The figures every run of this scenario produces (the reference's only when it ran;
    the compacted read's when the compactor is there)."""
    n = params["http_read_messages"]
    names = [f"http.append.{side}.{k}" for side in ("library", "http") for k in ("p50_ms", "p99_ms", "service_p50_ms")]
    names += [f"http.append.{k}" for k in ("ratio_p50", "ratio_p50_ci_lo", "ratio_p50_ci_hi", "ratio_p99", "bytes")]
    for state in ("uncompacted", "compacted") if compaction else ("uncompacted",):
        names += [f"http.read.{n}.{state}.{k}" for k in (
            "library_ms", "http_ms", "ratio", "http_requests", "library_calls", "bytes",
        )]
    return names


def run(ctx: Context) -> None:
    try:
        import httpx
    except ImportError as exc:
        raise RuntimeError(f"--only http needs httpx, starlette and uvicorn: pip install -e '.[test]' ({exc})") from None
    from store.streams import Streams

    b, R = ctx.backend, ctx.results
    details: dict[str, Any] = {"versions": _versions()}
    streams = Streams(b.store())
    service = _Service(b).start()
    reference: _Reference | None = None
    clients: list[Any] = []

    def client(url: str) -> Any:
        c = httpx.Client(base_url=url, timeout=30.0, headers={"accept-encoding": "identity"})
        clients.append(c)
        return c

    try:
        reference, ref_status = _Reference.start()
        if reference is None:
            R.notes.append(f"http: the reference server is {ref_status}")
            ctx.log(f"http: reference server {ref_status}")
        else:
            details["versions"].update(reference.versions)
        details["reference"] = ref_status
        sides: dict[str, Any] = {"http": client(service.url)}
        if reference is not None:
            sides["reference"] = client(reference.url)
        ctx.log(f"http: service at {service.url} (pid {service.pid})"
                + (f", reference at {reference.url} (pid {reference.pid})" if reference else ""))
        details["append"] = _appends(ctx, streams, sides, ref_status)
        details["read"] = _read(ctx, streams, sides, ref_status)
    finally:
        for c in clients:
            c.close()
        if reference is not None:
            reference.stop()
        service.stop()
    R.details["http"] = details


# --- appends -------------------------------------------------------------------------------------


def _appends(ctx: Context, streams: Any, clients: dict[str, Any], ref_status: str) -> dict[str, Any]:
    p, R = ctx.params, ctx.results
    warm_n, rounds, size = p.http_append_warmup, p.http_appends, p.http_body_bytes
    total = warm_n + rounds
    # A stream named <name> is at /v1/stream/<name> (and is the library's stream <name>).
    names = {side: f"bench-append-{side}-{ctx.run_id}" for side in ("library", *clients)}
    bodies = {side: [_body(side, i, size) for i in range(total)] for side in names}

    streams.create(names["library"], content_type="text/plain")
    for side, c in clients.items():
        _check(c.put(ROOT + names[side], headers=_TEXT), (201,), f"{side}: create")

    def library_op(i: int) -> None:
        streams.append(names["library"], [bodies["library"][i]], content_type="text/plain")

    def http_op(side: str) -> Callable[[int], None]:
        c, path, data = clients[side], ROOT + names[side], bodies[side]

        def op(i: int) -> None:
            r = c.post(path, content=data[i], headers=_TEXT)
            if r.status_code != 204 or "stream-next-offset" not in r.headers:
                _check(r, (204,), f"{side}: append")
                raise RuntimeError(f"{side}: an append answered without Stream-Next-Offset")

        return op

    ops: dict[str, Callable[[int], None]] = {"library": library_op}
    ops.update({side: http_op(side) for side in clients})

    # Warm-up, closed loop, each side alone: connections, caches, and the schedule's interval.
    warm: dict[str, list[float]] = {}
    for side, op in ops.items():
        warm[side] = []
        for i in range(warm_n):
            t0 = time.perf_counter()
            op(i)
            warm[side].append(time.perf_counter() - t0)
    interval = p.open_loop_slack * sum(median(w) for w in warm.values()) / len(warm)
    ctx.log(f"http appends: {rounds} rounds x {len(ops)} sides, open loop every {interval * 1000:.1f} ms")
    def after_warmup(op: Callable[[int], None]) -> Callable[[int], None]:
        return lambda r: op(warm_n + r)

    res = open_loop({side: after_warmup(op) for side, op in ops.items()}, rounds, interval, seed=p.seed + 80)

    # What each side holds is what was sent, in order (the library reads the service's stream
    # directly: both are on this run's backend).
    _expect(_library_text(streams, names["library"]), bodies["library"], "library appends")
    _expect(_library_text(streams, names["http"]), bodies["http"], "HTTP appends, read back by the library")
    if "reference" in clients:
        got, _, _ = _http_read(clients["reference"], ROOT + names["reference"], json_values=False)
        _expect(got, bodies["reference"], "reference appends")

    stats = {side: summarize(res.latency[side]) for side in ops}
    for side in ops:
        pre = f"http.append.{side}"
        R.fig(f"{pre}.p50_ms", stats[side]["p50"], "ms")
        R.fig(f"{pre}.p99_ms", stats[side]["p99"], "ms")
        R.fig(f"{pre}.service_p50_ms", percentile(sorted(res.service[side]), 50) * 1000, "ms")
    R.fig("http.append.bytes", size, "bytes")
    lib, web = stats["library"], stats["http"]
    ratio = web["p50"] / lib["p50"]
    ci = ratio_ci(res.latency["http"], res.latency["library"], 50)
    R.fig("http.append.ratio_p50", ratio, "x")
    R.fig("http.append.ratio_p50_ci_lo", ci[0], "x")
    R.fig("http.append.ratio_p50_ci_hi", ci[1], "x")
    R.fig("http.append.ratio_p99", web["p99"] / lib["p99"], "x")
    slots = len(ops) * rounds
    R.fig("http.append.late_start_fraction", res.late_starts / slots)
    if res.late_starts > 0.2 * slots:
        R.notes.append(f"http appends: {res.late_starts} of {slots} slots started late: the machine was "
                       "slower than at calibration and the open-loop queue built up")
    scenario = "http append (open loop)"
    case = f"{size} B text/plain: p50 / p99"
    R.row(scenario, f"{case}, HTTP vs library", _p50_p99(web), _p50_p99(lib), f"p50 {fmt_ratio(ratio, ci)}")
    if "reference" in stats:
        ref = stats["reference"]
        vs = web["p50"] / ref["p50"]
        ci_ref = ratio_ci(res.latency["http"], res.latency["reference"], 50)
        R.fig("http.append.http_vs_reference_p50", vs, "x")
        R.fig("http.append.http_vs_reference_p99", web["p99"] / ref["p99"], "x")
        R.row(scenario, f"{case}, HTTP vs reference server (in memory)", _p50_p99(web), _p50_p99(ref),
              f"p50 {fmt_ratio(vs, ci_ref)}")
    else:
        R.row(scenario, f"{case}, HTTP vs reference server (in memory)", _p50_p99(web), ref_status, "-")
    ctx.log("http appends p50: " + ", ".join(f"{side} {stats[side]['p50']:.2f} ms" for side in ops))
    return {
        "latency_ms": stats,
        "service_ms": {side: summarize(res.service[side]) for side in ops},
        "warmup_ms": {side: summarize(w) for side, w in warm.items()},
        "interval_ms": interval * 1000,
        "late_starts": res.late_starts,
        "slots": slots,
        "rounds": rounds,
        "warmup_appends": warm_n,
    }


def _body(side: str, i: int, size: int) -> bytes:
    head = f"{side}-{i:06d}-".encode()
    return (head + b"x" * size)[:size]


def _library_text(streams: Any, path: str) -> bytes:
    from store.streams import START

    out: list[bytes] = []
    offset = START
    while True:
        res = streams.read(path, offset)
        out += res.messages
        offset = res.next_offset
        if res.up_to_date:
            return b"".join(out)


def _p50_p99(s: dict[str, float]) -> str:
    return f"{fmt_ms(s['p50'])} / {fmt_ms(s['p99'])}"


# --- catch-up read -------------------------------------------------------------------------------


def _read(ctx: Context, streams: Any, clients: dict[str, Any], ref_status: str) -> dict[str, Any]:
    from benchmarks.scenarios import compaction
    from store.streams import START

    p = ctx.params
    n, batch = p.http_read_messages, p.http_read_batch
    values = [{"i": i, "role": "user" if i % 2 == 0 else "assistant", "text": f"message {i} of the stream"}
              for i in range(n)]
    batches = [values[i : i + batch] for i in range(0, n, batch)]
    # One stream on the backend, read by the library and by the service; the same messages on
    # the reference server.
    name = f"bench-read-{ctx.run_id}"
    url = ROOT + name
    t0 = time.perf_counter()
    streams.create(name, content_type="application/json")
    for chunk in batches:
        streams.append(name, chunk, content_type="application/json")
    setup_s = time.perf_counter() - t0
    if "reference" in clients:
        ref = clients["reference"]
        _check(ref.put(url, headers=_JSON), (201,), "reference: create")
        for chunk in batches:
            _check(ref.post(url, content=orjson.dumps(chunk), headers=_JSON), (204,), "reference: append")
    ctx.log(f"http read: {n} messages in {len(batches)} appends ({setup_s:.1f} s on the backend)")

    def library_read() -> tuple[list[Any], int, int]:
        out: list[Any] = []
        offset, calls = START, 0
        while True:
            res = streams.read(name, offset)
            calls += 1
            out += res.messages
            offset = res.next_offset
            if res.up_to_date:
                return out, calls, 0

    readers: dict[str, Callable[[], tuple[list[Any], int, int]]] = {"library": library_read}
    def http_read(c: Any) -> Callable[[], tuple[list[Any], int, int]]:
        return lambda: _http_read(c, url, json_values=True)

    for side, c in clients.items():
        readers[side] = http_read(c)

    details: dict[str, Any] = {"messages": n, "batch": batch, "setup_s": setup_s}
    details["uncompacted"] = _read_phases(ctx, "uncompacted", readers, values, len(batches), ref_status)
    api = compaction.find()
    if api.available and api.compact is not None:
        # The same stream after the compactor merged its segments: the reads the store does
        # are one base object instead of one segment each, so what HTTP adds shows more.
        api.compact(streams.store, streams.store.layout.stream_id(name))
        details["compacted"] = _read_phases(ctx, "compacted", readers, values, len(batches), ref_status)
    else:
        ctx.results.notes.append(f"http: compacted read not measured: {api.reason}")
    return details


def _read_phases(ctx: Context, state: str, readers: dict[str, Callable[[], tuple[list[Any], int, int]]],
                 values: list[Any], appends: int, ref_status: str) -> dict[str, Any]:
    """Every side reads the whole stream ``http_read_reps`` times, phases ABBA."""
    p, R = ctx.params, ctx.results
    n, reps = len(values), p.http_read_reps
    # One untimed read each: warms caches and connections, and checks every message.
    counts: dict[str, tuple[int, int]] = {}
    for side, read in readers.items():
        got, calls, nbytes = read()
        _expect(got, values, f"{side} catch-up read ({state})")
        counts[side] = (calls, nbytes)
    times: dict[str, list[float]] = {side: [] for side in readers}
    order = list(readers)
    ctx.log(f"http read, {state}: {reps} reads per side, ABBA")
    for k in range(reps):
        for side in order if k % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            got, _, _ = readers[side]()
            times[side].append(time.perf_counter() - t0)
            if len(got) != n:
                raise RuntimeError(f"{side} catch-up read ({state}): {len(got)} messages, not {n}")

    ms = {side: median(t) * 1000 for side, t in times.items()}
    pre = f"http.read.{n}.{state}"
    R.fig(f"{pre}.library_ms", ms["library"], "ms")
    R.fig(f"{pre}.http_ms", ms["http"], "ms")
    R.fig(f"{pre}.ratio", ms["http"] / ms["library"], "x")
    R.fig(f"{pre}.library_calls", counts["library"][0], "calls")
    R.fig(f"{pre}.http_requests", counts["http"][0], "requests")
    R.fig(f"{pre}.bytes", counts["http"][1], "bytes")
    scenario = "http catch-up read"
    case = f"{n:,} JSON messages, {state} ({appends} appends)"
    R.row(scenario, f"{case}, HTTP vs library", f"{fmt_ms(ms['http'])} ({counts['http'][0]} GET)",
          f"{fmt_ms(ms['library'])} ({counts['library'][0]} read)", fmt_ratio(ms["http"] / ms["library"]))
    if "reference" in ms:
        R.fig(f"{pre}.reference_ms", ms["reference"], "ms")
        R.fig(f"{pre}.reference_requests", counts["reference"][0], "requests")
        R.fig(f"{pre}.http_vs_reference", ms["http"] / ms["reference"], "x")
        R.row(scenario, f"{case}, HTTP vs reference server (in memory)", f"{fmt_ms(ms['http'])}",
              f"{fmt_ms(ms['reference'])} ({counts['reference'][0]} GET)", fmt_ratio(ms["http"] / ms["reference"]))
    else:
        R.row(scenario, f"{case}, HTTP vs reference server (in memory)", fmt_ms(ms["http"]), ref_status, "-")
    ctx.log(f"http read, {state}: " + ", ".join(f"{side} {v:.0f} ms" for side, v in ms.items()))
    return {
        "times_ms": {side: [t * 1000 for t in ts] for side, ts in times.items()},
        "median_ms": ms,
        "requests": {side: c[0] for side, c in counts.items()},
        "bytes": {side: c[1] for side, c in counts.items()},
    }


def _http_read(client: Any, path: str, *, json_values: bool) -> tuple[Any, int, int]:
    """A catch-up read from -1, following Stream-Next-Offset until up to date: the messages
    (JSON values, or the bytes), the number of GETs, the bytes of the bodies."""
    values: list[Any] = []
    chunks: list[bytes] = []
    offset, requests, nbytes = "-1", 0, 0
    while True:
        r = client.get(path, params={"offset": offset})
        requests += 1
        _check(r, (200,), f"GET {path}")
        body = r.content
        nbytes += len(body)
        if json_values:
            values += orjson.loads(body)
        else:
            chunks.append(body)
        nxt = r.headers.get("stream-next-offset")
        if nxt is None:
            raise RuntimeError(f"GET {path}: no Stream-Next-Offset")
        if r.headers.get("stream-up-to-date") == "true":
            return (values if json_values else b"".join(chunks)), requests, nbytes
        if nxt == offset:
            raise RuntimeError(f"GET {path}: Stream-Next-Offset did not move from {offset}")
        offset = nxt


def _check(r: Any, statuses: tuple[int, ...], what: str) -> Any:
    if r.status_code not in statuses:
        raise RuntimeError(f"{what}: HTTP {r.status_code} (expected {statuses}): {r.text[:300]}")
    return r


def _expect(got: Any, want: Any, what: str) -> None:
    if isinstance(want, list) and want and isinstance(want[0], bytes):
        want = b"".join(want)
    if got != want:
        size = len(got) if hasattr(got, "__len__") else "?"
        raise RuntimeError(f"{what}: the stream does not hold what was written ({size} against {len(want)})")


# --- the service, in a child process of its own ----------------------------------------------------


class _Service:
    """``StreamService`` on a store built like ``Backend.store()``, behind uvicorn (default
    options, as ``sessionstore serve`` runs it) in a child process; stops when its stdin closes."""

    def __init__(self, backend: Backend) -> None:
        self.spec = {
            "objects_url": backend.objects_url,
            "redis_url": backend.redis_url,
            "redis_prefix": backend.redis_prefix,
        }
        self.env = backend.worker_spec().env
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> _Service:
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from benchmarks.scenarios.http import _serve; _serve()", json.dumps(self.spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=str(REPO_ROOT), env=env, text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"the HTTP service did not start (got {line!r}; its stderr is above)")
        self.url = f"http://127.0.0.1:{int(line)}"
        import httpx

        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(self.url + "/healthz", timeout=2.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the HTTP service did not answer /healthz")
            time.sleep(0.05)

    def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self.proc = None


def _serve() -> None:
    """Child process: the service on a pre-bound loopback socket; prints its port, serves
    until stdin closes."""
    import uvicorn

    from store.core import SessionStore
    from store.http.app import StreamService

    spec = json.loads(sys.argv[1])
    store = SessionStore.from_url(spec["objects_url"], spec["redis_url"], redis_prefix=spec["redis_prefix"])
    service = StreamService(store)
    # IPPROTO_TCP named explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says
    # TCP, and without it every response with a body waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    config = uvicorn.Config(service.app, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)

    def watch_stdin() -> None:
        sys.stdin.read()
        server.should_exit = True

    threading.Thread(target=watch_stdin, daemon=True).start()
    print(sock.getsockname()[1], flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        store.close()


# --- the reference server ------------------------------------------------------------------------


class _Reference:
    """``tests/ds-node/start-reference.mjs`` on a port of its choosing."""

    def __init__(self, proc: subprocess.Popen[str], url: str, versions: dict[str, str], log: Any) -> None:
        self.proc = proc
        self.url = url
        self.versions = versions
        self._log = log

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def start(cls) -> tuple[_Reference | None, str]:
        """(server, "running ...") or (None, why not)."""
        script = REFERENCE_DIR / "start-reference.mjs"
        package = REFERENCE_DIR / "node_modules" / "@durable-streams" / "server" / "package.json"
        if not script.is_file() or not package.is_file():
            return None, NOT_AVAILABLE
        node = shutil.which("node")
        if node is None:
            return None, "not available (no node on PATH)"
        versions = {"@durable-streams/server": str(json.loads(package.read_text()).get("version", "?"))}
        try:
            versions["node"] = subprocess.run([node, "--version"], capture_output=True, text=True,
                                              timeout=10, check=False).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
        log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by stop())
        env = {**os.environ, "PORT": "0", "HOST": "127.0.0.1", "LONG_POLL_TIMEOUT": "500"}
        try:
            proc = subprocess.Popen([node, str(script)], cwd=str(REFERENCE_DIR), env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=log, text=True)
        except OSError as exc:
            log.close()
            return None, f"failed to start ({exc})"
        lines: queue.Queue[str] = queue.Queue()

        def drain() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line)
            lines.put("")

        threading.Thread(target=drain, daemon=True).start()
        try:
            line = lines.get(timeout=30)
        except queue.Empty:
            line = ""
        if not line.startswith("ref server on "):
            ref = cls(proc, "", versions, log)
            why = ref._stderr()
            ref.stop()
            why = " ".join((line.strip() or why or "no output").split())[:200]
            return None, f"failed to start ({why})"
        url = line.split()[3]
        return cls(proc, url, versions, log), f"{url} (@durable-streams/server {versions['@durable-streams/server']})"

    def _stderr(self) -> str:
        self._log.seek(0)
        text: str = self._log.read()
        return text[-300:].strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _versions() -> dict[str, str]:
    from importlib import metadata

    out: dict[str, str] = {}
    for pkg in ("starlette", "uvicorn", "httpx", "h11", "httptools", "uvloop"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


__all__ = ["expected_figures", "run"]
