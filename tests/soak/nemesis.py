"""The process table and the nemesis of a soak run.

The nemesis runs in the orchestrator's main thread, a tick every 50 ms. Each tick it runs the
undo actions that are due (SIGCONT, a restart, healing the S3 proxy, starting Redis again),
watches the children (one that stopped itself at a protocol point gets resumed later, one that
exited unexpectedly is restarted), and when the next fault is due injects it. Faults come from
a bag holding every enabled kind once, shuffled with the run's seed and refilled when empty, so
every kind comes up once per round; a kind that cannot run now (Redis is already down, no
compactor is running, ...) waits for a later tick. Faults of different resources overlap: a
writer may be paused while Redis is down and S3 refuses connections.

Every fault is recorded with ``time.monotonic()`` at its start (``t0``) and when it was undone
(``t1``), the same clock the writers and readers log with.
"""

from __future__ import annotations

import heapq
import itertools
import json
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from random import Random
from typing import Any, Callable, IO

from tests.soak.config import FAULT_KINDS, SoakConfig
from tests.soak.servers import REPO, Redis, S3Endpoint, child_env

ROLES = ("writer", "reader", "compactor")


@dataclass
class Child:
    role: str
    index: int
    restarts: int = 0
    popen: subprocess.Popen[bytes] | None = None
    #: running, paused (by the nemesis), self-paused (at a protocol point), killed (by the
    #: nemesis, restart pending), exited (on its own, restart pending), done
    state: str = "down"
    log: IO[bytes] | None = None

    @property
    def name(self) -> str:
        return f"{self.role[0]}{self.index}.{self.restarts}"

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def signal(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            try:
                self.popen.send_signal(sig)
            except ProcessLookupError:
                pass

    def stopped(self) -> bool:
        """The kernel's view: is the process in the stopped state (SIGSTOP)?"""
        if self.popen is None or self.popen.poll() is not None:
            return False
        try:
            stat = Path(f"/proc/{self.popen.pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[-1].split()[0] in ("T", "t")


class Fleet:
    """Writers, readers and compactors: start, restart, stop."""

    def __init__(self, cfg: SoakConfig, config_path: Path) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.workdir = Path(cfg.workdir)
        self.children: list[Child] = (
            [Child("writer", i) for i in range(cfg.writers)]
            + [Child("reader", i) for i in range(cfg.readers)]
            + [Child("compactor", i) for i in range(cfg.compactors)]
        )
        self.exits: list[dict[str, Any]] = []

    def of(self, role: str, state: str | None = "running") -> list[Child]:
        return [c for c in self.children if c.role == role and (state is None or c.state == state)]

    def _command(self, c: Child) -> list[str]:
        if c.role == "compactor":
            cfg = self.cfg
            return [
                sys.executable, "-m", "compactor", "work", "--objects", cfg.objects_url,
                "--redis", cfg.redis_url, "--redis-prefix", cfg.redis_prefix,
                "--name", f"soak-{c.name}", "--grace", str(cfg.grace_s),
                "--gc-interval", str(cfg.gc_interval_ms / 1000), "--claim-idle", "3",
                "--max-segments", str(cfg.max_segments),
                "--block", "0.5", "--heartbeat", "1",
            ]
        return [sys.executable, "-m", "tests.soak.roles", c.role, "--config", str(self.config_path),
                "--index", str(c.index), "--restart", str(c.restarts)]

    def spawn(self, c: Child) -> None:
        if c.log is not None:
            c.log.close()
        suffix = "log" if c.role == "compactor" else "err"
        c.log = open(self.workdir / f"{c.role}-{c.name}.{suffix}", "ab")
        c.popen = subprocess.Popen(self._command(c), cwd=REPO, env=child_env(), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=c.log)
        c.state = "running"

    def respawn(self, c: Child) -> None:
        c.restarts += 1
        self.spawn(c)

    def start_all(self) -> None:
        for c in self.children:
            self.spawn(c)

    def close_logs(self) -> None:
        for c in self.children:
            if c.log is not None:
                c.log.close()
                c.log = None


@dataclass(order=True)
class _Pending:
    at: float
    seq: int
    action: Callable[[], None] = field(compare=False)


class Nemesis:
    def __init__(self, cfg: SoakConfig, fleet: Fleet, redis: Redis, s3: S3Endpoint, rng: Random) -> None:
        self.cfg = cfg
        self.fleet = fleet
        self.redis = redis
        self.s3 = s3
        self.rng = rng
        kinds = cfg.faults or [
            k for k in FAULT_KINDS
            if (k != "s3-restart" or s3.keeps_data)
            and not (k.endswith("-reader") and cfg.readers == 0)
            and not (k.endswith("-compactor") and cfg.compactors == 0)
        ]
        if kinds == ["none"]:
            kinds = []
        unknown = set(kinds) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds: {sorted(unknown)}")
        if "s3-restart" in kinds and not s3.keeps_data:
            raise ValueError("s3-restart needs a backend that keeps its data (seaweedfs)")
        self.kinds = list(kinds)
        self.bag: list[str] = []
        self.pending: list[_Pending] = []
        self._seq = itertools.count()
        self.faults: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.redis_busy = False
        self.s3_busy = False
        self.next_fault = 0.0
        self._restarting: threading.Thread | None = None

    # --- bookkeeping -------------------------------------------------------------------------

    def _record(self, kind: str, target: str, now: float, **detail: Any) -> dict[str, Any]:
        rec = {"kind": kind, "target": target, "t0": now, "t1": None, **detail}
        self.faults.append(rec)
        return rec

    def _later(self, delay: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.pending, _Pending(time.monotonic() + delay, next(self._seq), action))

    def _pause_s(self) -> float:
        g = self.cfg.grace_s
        return self.rng.uniform(g + self.cfg.pause_min_extra_s, 3 * g + self.cfg.pause_max_extra_s)

    def _long_pause_s(self) -> float:
        """A claim (2 s), a compaction, a grace period and a GC pass, with room to spare."""
        g = self.cfg.grace_s
        return self.rng.uniform(2 * g + 4.0, 4 * g + 6.0)

    def _last_pause_point(self, c: Child) -> str | None:
        """The protocol point a writer stopped itself at (the last line of its log)."""
        try:
            with open(Path(self.cfg.workdir) / f"writer-{c.name}.jsonl", "rb") as fh:
                fh.seek(0, 2)
                fh.seek(max(0, fh.tell() - 4096))
                lines = fh.read().splitlines()
        except OSError:
            return None
        for line in reversed(lines):
            if b'"ev":"pause"' in line:
                try:
                    return str(json.loads(line)["point"])
                except (ValueError, KeyError):
                    return None
        return None

    # --- the loop ----------------------------------------------------------------------------

    def start(self, now: float) -> None:
        self.next_fault = now + self.rng.expovariate(1 / self.cfg.fault_interval_s)

    def tick(self, *, faults: bool = True) -> None:
        now = time.monotonic()
        while self.pending and self.pending[0].at <= now:
            self._run(heapq.heappop(self.pending).action)
        self._watch(now, restart=faults)
        if faults and now >= self.next_fault:
            if self._inject(now):
                self.next_fault = now + self.rng.expovariate(1 / self.cfg.fault_interval_s)

    def heal_all(self) -> None:
        """Undo everything now: resume what is paused, bring Redis and S3 back."""
        self.wait_restarts()
        while self.pending:
            self._run(heapq.heappop(self.pending).action)
        for c in self.fleet.children:
            if c.state in ("paused", "self-paused"):
                c.signal(signal.SIGCONT)
                c.state = "running"

    def _run(self, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as exc:  # the nemesis must outlive its own failures
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def _watch(self, now: float, *, restart: bool) -> None:
        for c in self.fleet.children:
            if c.popen is None:
                continue
            code = c.popen.poll()
            if code is not None and c.state in ("running", "paused", "self-paused"):
                over = (c.role == "writer" and now > self.cfg.deadline) or not restart
                self.fleet.exits.append({"child": c.name, "code": code, "t": now, "expected": over})
                if over:
                    c.state = "done"
                else:
                    c.state = "exited"
                    self._later(1.0, lambda c=c: self._respawn(c))
            elif c.role == "writer" and c.state == "running" and c.stopped():
                # A writer stopped itself at a protocol point: resume it after a pause longer
                # than the grace period, like any other. Between its CHECK and its PUT, long
                # enough for the others to outlive its claim on the next segment number, fill
                # that number, compact past it and let GC delete it.
                c.state = "self-paused"
                point = self._last_pause_point(c)
                rec = self._record("aimed-pause", c.name, now, point=point)
                d = self._long_pause_s() if point == "append.before_put" else self._pause_s()
                self._later(d, lambda c=c, rec=rec: self._resume(c, rec))

    def _respawn(self, c: Child) -> None:
        if c.state in ("killed", "exited"):
            self.fleet.respawn(c)

    def _resume(self, c: Child, rec: dict[str, Any]) -> None:
        c.signal(signal.SIGCONT)
        if c.state in ("paused", "self-paused"):
            c.state = "running"
        rec["t1"] = time.monotonic()

    # --- faults ------------------------------------------------------------------------------

    def _inject(self, now: float) -> bool:
        if not self.kinds:
            return False
        if not self.bag:
            self.bag = list(self.kinds)
            self.rng.shuffle(self.bag)
        for i, kind in enumerate(self.bag):
            try:
                done = getattr(self, "_f_" + kind.replace("-", "_"))(now)
            except Exception as exc:
                self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
                done = True  # do not retry a fault that fails to inject
            if done:
                del self.bag[i]
                return True
        if len(self.bag) < 2 * len(self.kinds):
            # Nothing left in this round can run now (say, every writer is paused): start the
            # next round early; the kinds that waited stay first in line.
            more = list(self.kinds)
            self.rng.shuffle(more)
            self.bag.extend(more)
        return False

    def _pick(self, role: str, *, keep_one: bool) -> Child | None:
        running = self.fleet.of(role)
        if not running or (keep_one and len(running) < 2 and len(self.fleet.of(role, None)) > 1):
            return None
        return self.rng.choice(running)

    def _kill(self, role: str, now: float) -> bool:
        c = self._pick(role, keep_one=False)  # it is back within 1.5 s
        if c is None:
            return False
        self._record(f"kill-{role}", c.name, now, t1=now)
        c.signal(signal.SIGKILL)
        assert c.popen is not None
        c.popen.wait()
        c.state = "killed"
        self._later(self.rng.uniform(0.2, 1.5), lambda: self._respawn(c))
        return True

    def _pause(self, role: str, now: float) -> bool:
        c = self._pick(role, keep_one=role == "writer")
        if c is None:
            return False
        rec = self._record(f"pause-{role}", c.name, now)
        c.signal(signal.SIGSTOP)
        c.state = "paused"
        self._later(self._pause_s(), lambda: self._resume(c, rec))
        return True

    def _f_kill_writer(self, now: float) -> bool:
        return self._kill("writer", now)

    def _f_kill_compactor(self, now: float) -> bool:
        return self._kill("compactor", now)

    def _f_pause_writer(self, now: float) -> bool:
        return self._pause("writer", now)

    def _f_pause_compactor(self, now: float) -> bool:
        return self._pause("compactor", now)

    def _f_pause_reader(self, now: float) -> bool:
        return self._pause("reader", now)

    def _f_redis_kill(self, now: float) -> bool:
        if self.redis_busy:
            return False
        self.redis_busy = True
        down = self.rng.uniform(0.0, 1.0)
        rec = self._record("redis-kill", "redis", now, down_s=round(down, 3))
        self.redis.server.kill()

        def back() -> None:
            self.redis.server.start()  # same port, nothing in it
            rec["t1"] = time.monotonic()
            self.redis_busy = False

        self._later(down, back)
        return True

    def _f_redis_flushall(self, now: float) -> bool:
        if self.redis_busy:
            return False
        self.redis.flushall()
        self._record("redis-flushall", "redis", now, t1=time.monotonic())
        return True

    def _f_redis_script_flush(self, now: float) -> bool:
        if self.redis_busy:
            return False
        self.redis.script_flush()
        self._record("redis-script-flush", "redis", now, t1=time.monotonic())
        return True

    def _f_redis_pause(self, now: float) -> bool:
        if self.redis_busy:
            return False
        self.redis_busy = True
        d = self.rng.uniform(0.2, 3.0)  # beyond the clients' 2 s socket timeout now and then
        rec = self._record("redis-pause", "redis", now, pause_s=round(d, 3))
        self.redis.server.pause()

        def back() -> None:
            self.redis.server.resume()
            rec["t1"] = time.monotonic()
            self.redis_busy = False

        self._later(d, back)
        return True

    def _f_s3_drop(self, now: float) -> bool:
        if self.s3_busy:
            return False
        n = self.rng.randint(1, 4)
        self.s3.drop_responses(n)
        self._record("s3-drop", "s3", now, t1=now, responses=n)
        return True

    def _s3_outage(self, kind: str, now: float, begin: Callable[[], None], end: Callable[[], None]) -> bool:
        if self.s3_busy:
            return False
        self.s3_busy = True
        d = self.rng.uniform(0.5, 4.0)
        rec = self._record(kind, "s3", now, outage_s=round(d, 3))
        begin()

        def back() -> None:
            end()
            rec["t1"] = time.monotonic()
            self.s3_busy = False

        self._later(d, back)
        return True

    def _f_s3_down(self, now: float) -> bool:
        return self._s3_outage("s3-down", now, self.s3.go_down, self.s3.come_up)

    def _f_s3_blackhole(self, now: float) -> bool:
        return self._s3_outage("s3-blackhole", now, self.s3.blackhole, self.s3.heal)

    def _f_s3_restart(self, now: float) -> bool:
        if self.s3_busy:
            return False
        self.s3_busy = True
        rec = self._record("s3-restart", "s3", now)

        def restart() -> None:  # a start takes seconds: the nemesis goes on meanwhile
            try:
                self.s3.restart_server()
            except Exception as exc:
                self.errors.append(f"s3-restart: {type(exc).__name__}: {exc}")
            rec["t1"] = time.monotonic()
            self.s3_busy = False

        self._restarting = threading.Thread(target=restart, name="soak-s3-restart", daemon=True)
        self._restarting.start()
        return True

    def wait_restarts(self) -> None:
        if self._restarting is not None:
            self._restarting.join(120)
