"""The HTTP service under load (part of ``--only http``, or alone as ``--only http-load``):
issue #37's scenario. Counted and timed, against no floor: correctness is counted (nothing
lost, nothing twice, every follower sees every message once, in order), and the service's
responsiveness (``/healthz``), its append latency and its memory are reported.

The stack, on this run's S3 and Redis:

- two ``sessionstore serve`` processes (``tests/harness/serve_process.py``: the command as an
  operator runs it) behind HAProxy (``tests/harness/haproxy.py``: round robin, request by
  request; the one the protocol's conformance test runs behind);
- client processes, one per role (``benchmarks/scenarios/http_load_clients.py``: asyncio and
  ``httpx.AsyncClient``), all through the balancer:

  * **writers**: ``http_load_writers`` idempotent producers (``Producer-Id``, epoch 0, seq 0,
    1, ...) on ``http_load_streams`` JSON streams, each one ~100-byte message every
    ``http_load_append_interval_s`` for ``http_load_duration_s``; a failed append is re-sent
    with the same ``(id, epoch, seq)``;
  * **followers**: ``http_load_followers`` live readers of those streams from offset -1,
    half ``live=sse`` (one process), half ``live=long-poll`` (another), each checking that it
    sees every writer's messages once and in order, until the stream's final tail;
  * **readers**: ``http_load_readers`` clients reading a binary stream of
    ``http_load_binary_bytes`` (appended in pieces of ``http_load_binary_piece``) whole from
    offset -1, again and again for the duration, each read checked against its SHA-256;
  * **prober**: ``GET /healthz`` every ``http_load_probe_interval_s`` through the balancer
    and directly on each server.

  The writers, followers and readers run at niceness ``http_load_clients_nice`` (10; ``nice
  -n``), the prober, the serve processes, the balancer, S3 and Redis at their own: on one
  machine the clients compete with the stack for its cores, which clients on other machines
  (as in production, and as the target assumes) would not, and the prober's own wait for a
  core would count in every latency it measures. The clients still get every core the stack
  leaves; what they managed is counted (appends made, slots missed, reads) and their CPU
  reported. ``--clients-nice 0`` runs them at the stack's priority.

Judged afterwards: every stream read back whole; each writer's acknowledged appends are
there exactly once and in its order (``lost``, ``duplicated``, ``out_of_order``); each
follower's sequence is the stream's (same count and digest). RSS (``VmRSS``) of each serve
process at start-up, before the clients start (warm: it has served the binary stream once,
so its bounded cache of immutable segments holds it, before and after), its peak, and
``http_load_settle_s`` after every client left. And the CPU each process of the stack used
during the load (``/proc/PID/stat``), so a reader can tell the service's limits from the
clients' or the balancer's.

Targets (reported, never asserted as timing in a test): ``/healthz`` p99 through the balancer
under 100 ms; nothing lost or duplicated; every follower complete; each serve process's RSS
after the clients left within 20% of its start.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson

from benchmarks.backends import REPO_ROOT, _harness
from benchmarks.context import Context
from benchmarks.results import fmt_ms
from benchmarks.stats import summarize

ROOT = "/v1/stream/"
HEALTHZ_P99_TARGET_MS = 100.0
RSS_TARGET = 1.2
ROLES = ("writers", "sse", "long-poll", "readers", "prober")


def expected_figures(params: dict[str, Any]) -> list[str]:
    """The figures every run of this scenario produces."""
    names = [f"http.load.{k}" for k in (
        "writers", "followers", "readers", "streams", "duration_s",
        "appends", "appends_per_s", "append.p50_ms", "append.p99_ms", "append.max_ms",
        "append.service_p99_ms", "append.retries", "append.missed_slots",
        "lost", "duplicated", "out_of_order", "unacknowledged",
        "followers_complete", "followers_incomplete",
        "follower.sse.lag_p50_ms", "follower.sse.lag_p99_ms",
        "follower.long_poll.lag_p50_ms", "follower.long_poll.lag_p99_ms",
        "reader.reads", "reader.bad_reads", "reader.read_p50_ms", "reader.read_p99_ms", "reader.mb_per_s",
        "healthz.p50_ms", "healthz.p99_ms", "healthz.max_ms", "healthz.probes", "healthz.failures",
        "healthz.direct.p50_ms", "healthz.direct.p99_ms", "healthz.direct.max_ms",
        "rss_boot_mb", "rss_start_mb", "rss_peak_mb", "rss_after_mb", "rss_after_over_start", "rss_after_over_boot",
        "client_errors", "balancer_errors",
        "cpu.serve_cores", "cpu.balancer_cores", "cpu.clients_cores",
    )]
    return names


#: The service's environment, as docker-compose.yml runs it (tests/test_compose.py checks that
#: they agree): two malloc arenas instead of one a thread (docs/operations.md, "Memory").
SERVE_ENV = {"MALLOC_ARENA_MAX": "2"}


def run(ctx: Context) -> None:
    b, R, p = ctx.backend, ctx.results, ctx.params
    if not b.redis_url:
        raise RuntimeError("the HTTP load scenario needs S3 and a Redis server shared by two processes: the "
                           "moto default, --seaweedfs, or --objects URL --redis URL, not --embedded")
    harness = _harness()  # noqa: F841 (puts tests/ on the path for the harness modules)
    from harness.haproxy import HaproxyBalancer  # raises, saying how to install it, without haproxy
    from harness.serve_process import serve

    import httpx

    names = [f"load-{ctx.run_id}/s{k}" for k in range(p.http_load_streams)]
    blob_name = f"load-{ctx.run_id}/blob"
    blob = random.Random(p.seed + 370).randbytes(p.http_load_binary_bytes)
    store_args = ["--objects", b.objects_url, "--redis", b.redis_url, "--redis-prefix", b.redis_prefix]
    details: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sessionstore-load-") as tmp, ExitStack() as stack:
        servers = [stack.enter_context(serve(store_args, Path(tmp) / f"serve-{i}.log", cwd=Path(tmp), env=SERVE_ENV))
                   for i in range(2)]
        balancer = stack.enter_context(HaproxyBalancer([s.url for s in servers]))
        serve_pids = {f"serve-{i}": s.process.pid for i, s in enumerate(servers)}
        rss_boot = {name: _rss(pid) for name, pid in serve_pids.items()}
        ctx.log(f"http load: 2 serve processes ({', '.join(str(x) for x in serve_pids.values())}) "
                f"behind HAProxy at {balancer.url}")
        # The clients start importing while the streams are made.
        clients = _start_clients(ctx, balancer.url, [s.url for s in servers], names, blob_name, blob)
        stack.callback(_kill_all, clients)
        with httpx.Client(base_url=balancer.url, timeout=60.0) as http:
            for name in names:
                _check(http.put(ROOT + name, headers={"content-type": "application/json"}), (201,), f"create {name}")
            _check(http.put(ROOT + blob_name, headers={"content-type": "application/octet-stream"}), (201,),
                   "create the binary stream")
            piece = p.http_load_binary_piece
            for i in range(0, len(blob), piece):
                _check(http.post(ROOT + blob_name, content=blob[i : i + piece],
                                 headers={"content-type": "application/octet-stream"}), (204,), "append to the binary stream")
            # The baseline is a warm process: one that has served the binary stream once (its
            # segments are then in the process's cache of immutable segments, bounded, and kept
            # by design), so that "after" against it measures what the clients left behind.
            for s in servers:
                got = _read_bytes(http, s.url + ROOT + blob_name)
                if got != blob:
                    raise RuntimeError(f"http load: the binary stream read back has {len(got)} bytes, not what was written")
        for c in clients.values():
            c.wait_ready()
        time.sleep(1.0)  # the setup's garbage settles before the baseline
        pids = dict(serve_pids)
        pids["balancer"] = balancer.pid
        pids.update(b.pids)
        pids.update({f"client {role}": c.proc.pid for role, c in clients.items()})
        rss_start = {name: _rss(pid) for name, pid in serve_pids.items()}
        sampler = _RssSampler(serve_pids).start()
        cpu0 = {name: _cpu_s(pid) for name, pid in pids.items()}
        t0 = time.monotonic()
        ctx.log(f"http load: {p.http_load_writers} writers on {len(names)} streams, {p.http_load_followers} "
                f"followers (half SSE, half long-poll), {p.http_load_readers} readers of "
                f"{len(blob) / 2**20:.0f} MiB, {p.http_load_duration_s:g} s")
        for role in ("prober", "sse", "long-poll", "readers"):
            clients[role].send({"cmd": "go"})
        time.sleep(min(2.0, p.http_load_duration_s / 4))  # the followers are connected
        clients["writers"].send({"cmd": "go"})
        results: dict[str, dict[str, Any]] = {}
        results["writers"] = clients["writers"].result(timeout=p.http_load_duration_s + 120)
        _check_alive(servers)
        tails = {}
        with httpx.Client(base_url=servers[0].url, timeout=60.0) as http:
            for name in names:
                tails[name] = _check(http.head(ROOT + name), (200,), f"HEAD {name}").headers["stream-next-offset"]
        for role in ("sse", "long-poll"):
            clients[role].send({"cmd": "tails", "tails": tails})
        for role in ("sse", "long-poll", "readers"):
            results[role] = clients[role].result(timeout=p.http_load_drain_s + 120)
        load_s = time.monotonic() - t0
        _check_alive(servers)
        clients["prober"].send({"cmd": "stop"})
        results["prober"] = clients["prober"].result(timeout=60)
        # The clients have exited: each said what it used.
        cpu = {name: _cpu_s(pid) - cpu0[name] for name, pid in pids.items() if not name.startswith("client ")}
        for role in ROLES:
            cpu[f"client {role}"] = results[role]["cpu_s"]
        peak = sampler.stop()
        time.sleep(p.http_load_settle_s)  # every client has left: what the processes give back
        rss_after = {name: _rss(pid) for name, pid in serve_pids.items()}
        counts, balancer_errors = balancer.stats()
        # What the streams hold, read whole through one server (the other serves the same).
        with httpx.Client(base_url=servers[1].url, timeout=60.0) as http:
            held = {name: _read_all(http, ROOT + name) for name in names}
    details.update(_judge(ctx, held, results, tails))
    details["counts_per_server"] = counts
    details["clients_nice"] = {role: results[role]["nice"] for role in results}
    details["balancer_error_samples"] = balancer_errors[:10]
    details["load_s"] = load_s
    details["pids"] = pids
    details["cpu_s"] = cpu
    details["cpu_cores"] = {name: s / load_s for name, s in cpu.items()}
    details["rss_mb"] = {name: {"boot": rss_boot[name] / 2**20, "start": rss_start[name] / 2**20, "peak": peak[name] / 2**20,
                                "after": rss_after[name] / 2**20} for name in serve_pids}
    details["client_error_samples"] = {role: results[role]["error_samples"] for role in ROLES if results[role]["errors"]}
    _figures(ctx, results, details, len(names), balancer_errors, load_s, len(blob))
    R.details["http_load"] = details


# --- judging -----------------------------------------------------------------------------------


def _judge(ctx: Context, held: dict[str, list[Any]], results: dict[str, dict[str, Any]],
           tails: dict[str, str]) -> dict[str, Any]:
    """Each writer's acknowledged appends against what the streams hold, and each follower's
    sequence against its stream's."""
    acked: dict[str, int] = results["writers"]["acked"]
    lost = duplicated = out_of_order = unacknowledged = 0
    expected: dict[str, tuple[int, str]] = {}
    for name, messages in held.items():
        seen: dict[int, list[int]] = {}
        digest = hashlib.sha256()
        for m in messages:
            seen.setdefault(m["w"], []).append(m["s"])
            digest.update(f"{m['w']}:{m['s']}\n".encode())
        expected[name] = (len(messages), digest.hexdigest())
        for w, seqs in seen.items():
            n = acked.get(f"w{w}", 0)
            duplicated += len(seqs) - len(set(seqs))
            out_of_order += sum(1 for a, b in zip(seqs, seqs[1:]) if b <= a)
            unacknowledged += len({s for s in seqs if s >= n})
    for pid, n in acked.items():
        w = int(pid[1:])
        have = {m["s"] for m in held[_stream_of(w, list(held))] if m["w"] == w}
        lost += sum(1 for s in range(n) if s not in have)
    complete = incomplete = 0
    problems: list[str] = []
    for role in ("sse", "long-poll"):
        for i, f in enumerate(results[role]["followers"]):
            want = expected[f["stream"]]
            if (f["count"], f["digest"]) == want and f["duplicates"] == 0 and f["gaps"] == 0 and f["at_tail"]:
                complete += 1
            else:
                incomplete += 1
                if len(problems) < 10:
                    problems.append(f"{role} follower {i} of {f['stream']}: {f['count']} messages "
                                    f"(the stream holds {want[0]}), {f['duplicates']} twice, {f['gaps']} gaps, "
                                    f"{'at' if f['at_tail'] else 'not at'} the tail")
    for problem in problems:
        ctx.results.notes.append(f"http load: {problem}")
    return {"lost": lost, "duplicated": duplicated, "out_of_order": out_of_order, "unacknowledged": unacknowledged,
            "followers_complete": complete, "followers_incomplete": incomplete, "follower_problems": problems,
            "messages": {name: n for name, (n, _) in expected.items()}, "tails": tails}


def _stream_of(writer: int, names: list[str]) -> str:
    return names[writer % len(names)]


def _figures(ctx: Context, results: dict[str, dict[str, Any]], d: dict[str, Any], streams: int,
             balancer_errors: list[str], load_s: float, blob_bytes: int) -> None:
    R, p = ctx.results, ctx.params
    w = results["writers"]
    pre = "http.load"
    R.fig(f"{pre}.writers", p.http_load_writers)
    R.fig(f"{pre}.followers", p.http_load_followers)
    R.fig(f"{pre}.readers", p.http_load_readers)
    R.fig(f"{pre}.streams", streams)
    R.fig(f"{pre}.duration_s", p.http_load_duration_s, "s")
    appends = sum(w["acked"].values())
    lat, svc = summarize(w["latency_s"]), summarize(w["service_s"])
    R.fig(f"{pre}.appends", appends)
    R.fig(f"{pre}.appends_per_s", appends / w["wall_s"], "/s")
    R.fig(f"{pre}.append.p50_ms", lat["p50"], "ms")
    R.fig(f"{pre}.append.p99_ms", lat["p99"], "ms")
    R.fig(f"{pre}.append.max_ms", lat["max"], "ms")
    R.fig(f"{pre}.append.service_p99_ms", svc["p99"], "ms")
    R.fig(f"{pre}.append.retries", w["retries"])
    R.fig(f"{pre}.append.missed_slots", w["missed_slots"])
    for k in ("lost", "duplicated", "out_of_order", "unacknowledged", "followers_complete", "followers_incomplete"):
        R.fig(f"{pre}.{k}", d[k])
    lags = {}
    for role in ("sse", "long-poll"):
        lags[role] = summarize(results[role]["lag_s"])
        key = role.replace("-", "_")
        R.fig(f"{pre}.follower.{key}.lag_p50_ms", lags[role]["p50"], "ms")
        R.fig(f"{pre}.follower.{key}.lag_p99_ms", lags[role]["p99"], "ms")
    rd = results["readers"]
    reads = summarize(rd["read_s"])
    R.fig(f"{pre}.reader.reads", len(rd["read_s"]))
    R.fig(f"{pre}.reader.bad_reads", rd["bad_reads"])
    R.fig(f"{pre}.reader.read_p50_ms", reads["p50"], "ms")
    R.fig(f"{pre}.reader.read_p99_ms", reads["p99"], "ms")
    R.fig(f"{pre}.reader.mb_per_s", rd["bytes"] / 2**20 / rd["wall_s"], "MiB/s")
    pr = results["prober"]
    via = summarize(pr["healthz_s"]["balancer"])
    direct_samples = [x for name, xs in pr["healthz_s"].items() if name != "balancer" for x in xs]
    direct = summarize(direct_samples)
    R.fig(f"{pre}.healthz.p50_ms", via["p50"], "ms")
    R.fig(f"{pre}.healthz.p99_ms", via["p99"], "ms")
    R.fig(f"{pre}.healthz.max_ms", via["max"], "ms")
    R.fig(f"{pre}.healthz.probes", via["n"])
    R.fig(f"{pre}.healthz.failures", sum(pr["failures"].values()))
    R.fig(f"{pre}.healthz.direct.p50_ms", direct["p50"], "ms")
    R.fig(f"{pre}.healthz.direct.p99_ms", direct["p99"], "ms")
    R.fig(f"{pre}.healthz.direct.max_ms", direct["max"], "ms")
    rss = d["rss_mb"]
    worst = max(rss, key=lambda n: rss[n]["after"] / rss[n]["start"])
    R.fig(f"{pre}.rss_start_mb", rss[worst]["start"], "MiB")
    R.fig(f"{pre}.rss_peak_mb", max(v["peak"] for v in rss.values()), "MiB")
    R.fig(f"{pre}.rss_after_mb", rss[worst]["after"], "MiB")
    R.fig(f"{pre}.rss_after_over_start", rss[worst]["after"] / rss[worst]["start"], "x")
    R.fig(f"{pre}.rss_boot_mb", max(v["boot"] for v in rss.values()), "MiB")
    R.fig(f"{pre}.rss_after_over_boot", max(v["after"] / v["boot"] for v in rss.values()), "x")
    R.fig(f"{pre}.client_errors", sum(results[r]["errors"] for r in ROLES))
    R.fig(f"{pre}.balancer_errors", len(balancer_errors))
    cores = d["cpu_cores"]
    R.fig(f"{pre}.cpu.serve_cores", sum(v for k, v in cores.items() if k.startswith("serve-")), "cores")
    R.fig(f"{pre}.cpu.balancer_cores", cores.get("balancer", float("nan")), "cores")
    R.fig(f"{pre}.cpu.clients_cores", sum(v for k, v in cores.items() if k.startswith("client ")), "cores")
    d["healthz_ms"] = {name: summarize(xs) for name, xs in pr["healthz_s"].items()}
    d["append_ms"], d["append_service_ms"], d["read_ms"] = lat, svc, reads
    d["lag_ms"] = lags
    d["follower_requests"] = {role: sum(f["requests"] for f in results[role]["followers"]) for role in ("sse", "long-poll")}

    def row(case: str, value: str, target: Any = None) -> None:
        R.row("http load (2 processes)", case, value, "", "", target=target)

    row(f"{p.http_load_writers} producers on {streams} streams, {p.http_load_duration_s:g} s: appends "
        f"(retried; slots missed), p50 / p99 from the slot",
        f"{appends:,} ({w['retries']}; {w['missed_slots']}), {fmt_ms(lat['p50'])} / {fmt_ms(lat['p99'])}")
    row("acknowledged appends lost / stored twice / out of order", f"{d['lost']} / {d['duplicated']} / {d['out_of_order']}",
        R.target("http load: nothing lost", f"{pre}.lost", "<=", 0, unit=""))
    R.target("http load: nothing stored twice", f"{pre}.duplicated", "<=", 0, unit="")
    n_f = p.http_load_followers
    row(f"{n_f} followers (half SSE, half long-poll) that saw every message once, in order",
        f"{d['followers_complete']} of {n_f}; lag p99 SSE {fmt_ms(lags['sse']['p99'])}, "
        f"long-poll {fmt_ms(lags['long-poll']['p99'])}",
        R.target("http load: every follower complete", f"{pre}.followers_incomplete", "<=", 0, unit=""))
    row(f"{p.http_load_readers} readers of a {blob_bytes / 2**20:.0f} MiB binary stream: whole reads, p50 / p99",
        f"{len(rd['read_s'])} ({rd['bad_reads']} wrong), {fmt_ms(reads['p50'])} / {fmt_ms(reads['p99'])}, "
        f"{rd['bytes'] / 2**20 / rd['wall_s']:.0f} MiB/s")
    row("/healthz through the balancer: p50 / p99 / max", f"{fmt_ms(via['p50'])} / {fmt_ms(via['p99'])} / "
        f"{fmt_ms(via['max'])} ({via['n']} probes)",
        R.target("http load: /healthz p99 through the balancer", f"{pre}.healthz.p99_ms", "<=",
                 HEALTHZ_P99_TARGET_MS, unit=" ms"))
    row("/healthz on each server directly: p50 / p99 / max",
        f"{fmt_ms(direct['p50'])} / {fmt_ms(direct['p99'])} / {fmt_ms(direct['max'])}")
    row("serve RSS: boot / start (warm) / peak / after the clients left (worst process)",
        f"{rss[worst]['boot']:.0f} / {rss[worst]['start']:.0f} / {max(v['peak'] for v in rss.values()):.0f} / "
        f"{rss[worst]['after']:.0f} MiB",
        R.target("http load: RSS back after the clients left", f"{pre}.rss_after_over_start", "<=", RSS_TARGET, unit="x"))
    row(f"CPU during the load (cores; the clients at nice {p.http_load_clients_nice}): serve x2 / balancer / "
        f"clients / S3 / Redis",
        f"{R.figures[f'{pre}.cpu.serve_cores']:.2f} / {R.figures[f'{pre}.cpu.balancer_cores']:.2f} / "
        f"{R.figures[f'{pre}.cpu.clients_cores']:.2f} / {_cores(cores, 's3 ('):s} / {_cores(cores, 'redis'):s}")


def _cores(cores: dict[str, float], part: str) -> str:
    found = [v for k, v in cores.items() if part in k]
    return f"{sum(found):.2f}" if found else "-"


# --- the client processes ----------------------------------------------------------------------


class _Client:
    """One client process (``http_load_clients.py ROLE SPEC``): commands in on stdin, its
    result out on stdout."""

    def __init__(self, role: str, spec: dict[str, Any], nice: int = 0) -> None:
        self.role = role
        env = {**os.environ}
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if x)
        # nice(1) execs the client at that niceness, all its threads with it.
        prefix = ["nice", "-n", str(nice)] if nice else []
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "benchmarks.scenarios.http_load_clients", role, json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=str(REPO_ROOT), env=env, text=True,
        )

    def _line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        if not box or not box[0].strip():
            raise RuntimeError(f"http load: the {self.role} client process said nothing within {timeout:.0f} s "
                               f"(exit code {self.proc.poll()}; its stderr is above)")
        out: dict[str, Any] = json.loads(box[0])
        return out

    def wait_ready(self) -> None:
        if not self._line(60).get("ready"):
            raise RuntimeError(f"http load: the {self.role} client did not start")

    def send(self, cmd: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def result(self, timeout: float) -> dict[str, Any]:
        out = self._line(timeout)
        self.proc.wait(timeout=30)
        return out


def _start_clients(ctx: Context, url: str, direct: list[str], names: list[str], blob_name: str,
                   blob: bytes) -> dict[str, _Client]:
    p = ctx.params
    half = p.http_load_followers // 2
    follow = {"url": url, "streams": names, "drain_s": p.http_load_drain_s}
    specs: dict[str, dict[str, Any]] = {
        "writers": {"url": url, "streams": names, "writers": p.http_load_writers, "seed": p.seed + 371,
                    "interval_s": p.http_load_append_interval_s, "duration_s": p.http_load_duration_s,
                    "pad_bytes": 40},
        "sse": {**follow, "followers": half},
        "long-poll": {**follow, "followers": p.http_load_followers - half},
        "readers": {"url": url, "stream": blob_name, "readers": p.http_load_readers, "bytes": len(blob),
                    "sha256": hashlib.sha256(blob).hexdigest(), "duration_s": p.http_load_duration_s},
        "prober": {"targets": {"balancer": url, **{f"serve-{i}": u for i, u in enumerate(direct)}},
                   "interval_s": p.http_load_probe_interval_s},
    }
    # The prober measures the stack: it runs at the stack's priority, the load below it.
    return {role: _Client(role, spec, 0 if role == "prober" else p.http_load_clients_nice)
            for role, spec in specs.items()}


def _kill_all(clients: dict[str, _Client]) -> None:
    for c in clients.values():
        if c.proc.poll() is None:
            c.proc.kill()
            c.proc.wait()


# --- the processes' memory and CPU ---------------------------------------------------------------


def _rss(pid: int) -> int:
    """Resident set of ``pid`` in bytes (``VmRSS``)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (nan once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / _TICKS


class _RssSampler:
    """The peak ``VmRSS`` of each process, sampled every 0.2 s."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.peak = {name: 0 for name in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> _RssSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._sample()

    def _sample(self) -> None:
        for name, pid in self.pids.items():
            try:
                self.peak[name] = max(self.peak[name], _rss(pid))
            except (OSError, RuntimeError):  # it exited: the scenario says so (_check_alive)
                pass

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        self._sample()
        return self.peak


# --- HTTP helpers ------------------------------------------------------------------------------


def _read_all(http: Any, path: str) -> list[Any]:
    out: list[Any] = []
    offset = "-1"
    while True:
        r = _check(http.get(path, params={"offset": offset}), (200,), f"GET {path}")
        out += orjson.loads(r.content)
        offset = r.headers["stream-next-offset"]
        if r.headers.get("stream-up-to-date") == "true":
            return out


def _check_alive(servers: list[Any]) -> None:
    for i, s in enumerate(servers):
        if s.process.poll() is not None:
            raise RuntimeError(f"http load: serve-{i} exited with {s.process.returncode} under load:\n{s.log(4000)}")


def _read_bytes(http: Any, url: str) -> bytes:
    out: list[bytes] = []
    offset = "-1"
    while True:
        r = _check(http.get(url, params={"offset": offset}), (200,), f"GET {url}")
        out.append(r.content)
        offset = r.headers["stream-next-offset"]
        if r.headers.get("stream-up-to-date") == "true":
            return b"".join(out)


def _check(r: Any, statuses: tuple[int, ...], what: str) -> Any:
    if r.status_code not in statuses:
        raise RuntimeError(f"http load: {what}: HTTP {r.status_code} (expected {statuses}): {r.text[:300]}")
    return r


__all__ = ["expected_figures", "run"]
