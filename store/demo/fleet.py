"""The demo's processes: agent workers (multiprocessing, spawn) and a compactor worker
(``python -m compactor work``)."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from store.cli.common import CliError, Exit
from store.demo.location import Location
from store.demo.options import DemoSize

#: Writers queue a compaction job after this many segments (the store's default is 64): the
#: demo's sessions are short, and compaction should visibly happen while they grow.
COMPACT_AFTER_SEGMENTS = 8
#: The compactor's grace period in the demo: long enough for any read of these small
#: sessions, short enough that GC deletes merged segments while the demo runs.
COMPACTOR_GRACE_S = 3.0


class Fleet:
    """Worker processes, the compactor process, and the scheduler that hands turns around."""

    def __init__(self, loc: Location, size: DemoSize, args: argparse.Namespace, log_dir: Path) -> None:
        self.loc = loc
        self.size = size
        self.args = args
        self.log_dir = log_dir
        self.mpctx = mp.get_context("spawn")
        self.outbox: Any = self.mpctx.Queue()
        self.inboxes: list[Any] = []
        self.procs: list[Any] = []
        self.outstanding: list[int] = []
        self.compactor: subprocess.Popen[bytes] | None = None
        #: A process of the fleet survived ``stop`` (then the store is not the caller's alone).
        self.lingering = False
        self.compactor_log: Any = None

    def store_options(self) -> dict[str, Any]:
        # The fleet's compactor is the demo's own process (and its final purge wants no other).
        return {"redis_prefix": self.loc.redis_prefix, "compact_after_segments": COMPACT_AFTER_SEGMENTS,
                "compact": False}

    def start(self) -> None:
        from store.demo.agent import worker_main

        for w in range(self.size.workers):
            inbox = self.mpctx.Queue()
            cfg = {"worker": w, "objects_url": self.loc.objects_url, "redis_url": self.loc.redis_url,
                   "store_options": self.store_options(), "seed": self.args.seed,
                   "log_path": str(self.log_dir / f"worker-{w}.jsonl")}
            proc = self.mpctx.Process(target=worker_main, args=(cfg, inbox, self.outbox),
                                      name=f"demo-worker-{w}", daemon=True)
            proc.start()
            self.inboxes.append(inbox)
            self.procs.append(proc)
            self.outstanding.append(0)
        if not self.args.no_compactor:
            self.start_compactor()

    def start_compactor(self) -> None:
        cmd = [sys.executable, "-m", "compactor", "work", "--objects", self.loc.objects_url,
               "--redis-prefix", self.loc.redis_prefix, "--grace", str(COMPACTOR_GRACE_S),
               "--block", "0.5", "--gc-interval", "0", "--name", "demo-compactor"]
        if self.loc.redis_url:
            cmd += ["--redis", self.loc.redis_url]
        self.compactor_log = open(self.log_dir / "compactor.log", "wb")
        self.compactor = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.compactor_log,
                                          stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120.0) -> None:
        ready = 0
        deadline = time.monotonic() + timeout
        while ready < len(self.procs):
            msg = self.receive(min(0.5, deadline - time.monotonic()))
            if msg is None:
                dead = self.dead_workers()
                if dead:
                    raise CliError(f"demo worker(s) {dead} exited while starting", Exit.FAILED)
                if time.monotonic() >= deadline:
                    raise CliError("demo workers did not start in time", Exit.FAILED)
                continue
            if msg["kind"] == "ready":
                ready += 1
            elif msg["kind"] == "crashed":
                raise CliError(f"demo worker {msg['worker']} failed to start: {msg['error']}", Exit.FAILED)

    def receive(self, timeout: float) -> dict[str, Any] | None:
        import queue

        try:
            msg: dict[str, Any] = self.outbox.get(timeout=max(0.0, timeout))
            return msg
        except queue.Empty:
            return None

    def send(self, worker: int, job: dict[str, Any]) -> None:
        self.outstanding[worker] += 1
        self.inboxes[worker].put(job)

    def pick(self, avoid: set[int], n: int = 1) -> list[int]:
        """The n least busy workers, not among ``avoid`` if possible."""
        order = sorted(range(len(self.procs)), key=lambda w: (w in avoid, self.outstanding[w], w))
        return order[:n]

    def idle(self, avoid: set[int], n: int) -> list[int]:
        """Up to n workers with nothing to do, preferring those not in ``avoid``."""
        free = [w for w in range(len(self.procs)) if self.outstanding[w] == 0]
        return sorted(free, key=lambda w: (w in avoid, w))[:n]

    def dead_workers(self) -> list[int]:
        return [w for w, p in enumerate(self.procs) if not p.is_alive()]

    def stop(self) -> bool:
        """Ask every worker to finish, wait, then stop the compactor. Idempotent. True when
        every process the fleet started has exited (a worker that would not finish is killed;
        False only if one is still there after that)."""
        for inbox in self.inboxes:
            try:
                inbox.put(None)
            except (OSError, ValueError):
                pass
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
            if proc.is_alive():
                self.lingering = True
        self.inboxes.clear()
        self.procs.clear()
        self.stop_compactor()
        return not self.lingering

    def compactor_failure(self) -> str | None:
        """Why the compactor worker is not running any more, if it stopped on its own."""
        if self.compactor is None or self.compactor.poll() is None:
            return None
        tail = ""
        try:
            tail = (self.log_dir / "compactor.log").read_text(errors="replace").strip().splitlines()[-1]
        except (OSError, IndexError):
            pass
        return f"the compactor worker exited with code {self.compactor.returncode}: {tail}"

    def stop_compactor(self) -> None:
        if self.compactor is None:
            return
        if self.compactor.poll() is None:
            # A warm stop: the worker finishes its job, acknowledges it and leaves.
            self.compactor.send_signal(signal.SIGTERM)
            try:
                self.compactor.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.compactor.kill()
                self.compactor.wait(timeout=5)
        if self.compactor.poll() is None:
            self.lingering = True
        self.compactor = None
        if self.compactor_log is not None:
            self.compactor_log.close()
            self.compactor_log = None

