"""The demo's script and its scheduler: which turns of which session race, branch, fork or leak
a secret, and the loop that hands each step to a worker other than the one before."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from store.cli.common import err
from store.cli.render import StatusLine
from store.demo.options import DemoSize

if TYPE_CHECKING:
    from store.core import SessionStore
    from store.demo.fleet import Fleet

#: A worker that has not finished a job for this long is taken as hung (a turn takes well
#: under a second).
STALL_S = 120.0


@dataclass
class Plan:
    session: str
    steps: list[dict[str, Any]]
    fork_of: str | None = None
    index: int = 0
    in_flight: int = 0
    last_workers: set[int] = field(default_factory=set)


@dataclass
class Stats:
    turns_done: int = 0
    turns_total: int = 0
    appends: int = 0
    conflicts: int = 0
    jobs: int = 0
    handoffs: int = 0
    double_turns: int = 0
    forks: list[dict[str, Any]] = field(default_factory=list)
    redaction: dict[str, Any] | None = None
    branch_summaries: int = 0
    context_compactions: int = 0
    compactions: int = 0
    errors: list[str] = field(default_factory=list)


# --- the plan ------------------------------------------------------------------------------------


def session_steps(i: int, turns: int, secret: str) -> list[dict[str, Any]]:
    """The scripted life of shared session ``i``: which turns race, branch, fork, leak."""
    steps: list[dict[str, Any]] = []
    for t in range(turns):
        step: dict[str, Any] = {"kind": "turn", "turn": t, "strict": i % 2 == 1, "batch": t % 2 == 1,
                                "label": t % 3 == 2}
        if i == 0 and t == 0:
            step["secret"] = secret
        if t == 2 and i % 2 == 0:
            step["double"] = True  # plain handles: both land, as sibling branches
        if t == 1 and i % 2 == 1:
            step["double"] = True  # strict handles: one conflicts, re-reads, continues
        if t == turns - 1 and t >= 2:
            if i % 3 == 1:
                step["branch_summary"] = True
            elif i % 3 == 0:
                step["context_compaction"] = True
        steps.append(step)
        if i == 0 and t == 0:
            steps.append({"kind": "redact", "secret": secret, "required": True})
        if i % 3 == 2 and t == max(1, turns // 2) - 1:
            steps.append({"kind": "fork"})
    return steps


def fork_steps(turns: int) -> list[dict[str, Any]]:
    return [{"kind": "turn", "turn": t, "strict": False, "batch": t % 2 == 0, "label": t == 0}
            for t in range(max(1, turns // 2))]


# --- the run -------------------------------------------------------------------------------------


def count_compactions(store: SessionStore, sessions: list[str]) -> int:
    total = 0
    for sid in sessions:
        try:
            header = store.get_header(sid)
            manifest = store.latest_manifest(sid, header.incarnation)
        except Exception:
            continue  # a progress figure, never a failure
        total += manifest.generation if manifest else 0
    return total


def schedule(store: SessionStore, fleet: Fleet, plans: dict[str, Plan], stats: Stats,
             status: StatusLine, size: DemoSize) -> float:
    """Hand the steps of every session to the workers until done. Returns the seconds spent."""
    return _Scheduler(store, fleet, plans, stats, status, size).run()


class _Scheduler:
    """One run of ``schedule``: the jobs in flight, and when a worker was last heard from."""

    def __init__(self, store: SessionStore, fleet: Fleet, plans: dict[str, Plan], stats: Stats,
                 status: StatusLine, size: DemoSize) -> None:
        self.store = store
        self.fleet = fleet
        self.plans = plans
        self.stats = stats
        self.status = status
        self.size = size
        self.started = time.monotonic()
        self.job_ids = 0
        self.jobs: dict[int, tuple[str, dict[str, Any]]] = {}
        self.last_count = 0.0
        self.last_heard = time.monotonic()
        self.capped = False

    def run(self) -> float:
        while True:
            elapsed = time.monotonic() - self.started
            self.capped = self.size.seconds > 0 and elapsed >= self.size.seconds
            self.hand_out()
            if not self.jobs:
                break
            if time.monotonic() - self.last_count >= 2.0:
                self.last_count = time.monotonic()
                self.stats.compactions = count_compactions(self.store, list(self.plans))
            self.progress()
            if not self.receive():
                break
        elapsed = time.monotonic() - self.started
        failure = self.fleet.compactor_failure()
        if failure:
            self.stats.errors.append(failure)
        self.stats.compactions = count_compactions(self.store, list(self.plans))
        self.progress(force=True)
        self.status.done()
        return elapsed

    def progress(self, force: bool = False) -> None:
        stats = self.stats
        elapsed = time.monotonic() - self.started
        rate = stats.appends / elapsed if elapsed > 0 else 0.0
        self.status.update(
            f"demo {elapsed:5.1f}s · turns {stats.turns_done}/{stats.turns_total} · appends {stats.appends} "
            f"({rate:.0f}/s) · conflicts {stats.conflicts} · forks {len(stats.forks)} · "
            f"compactions {stats.compactions} · sessions {len(self.plans)}"
            + (" · time's up, finishing" if self.capped else ""),
            force=force,
        )

    def hand_out(self) -> None:
        """Send the next step of every session that has none in flight (once time is up, only
        the required ones)."""
        from store.core import uuid7

        # Double turns first: while one waits for two idle workers, nothing else is handed
        # out, so that workers drain and the race happens now rather than at the very end.
        ready = [p for p in self.plans.values()
                 if not p.in_flight and p.index < len(p.steps)
                 and not (self.capped and not p.steps[p.index].get("required"))]
        ready.sort(key=lambda p: not p.steps[p.index].get("double"))
        reserving = False
        for plan in ready:
            step = plan.steps[plan.index]
            if reserving and not step.get("double"):
                break
            plan.index += 1
            job = dict(step, session=plan.session)
            if job["kind"] == "fork":
                job["new_session"] = uuid7()
            if job.get("double"):
                # A real race needs two idle workers: both open the session (same leaf)
                # before either writes. Otherwise wait for two to be free.
                workers = self.fleet.idle(plan.last_workers, 2)
                if len(workers) < 2:
                    plan.index -= 1
                    reserving = True
                    continue
                job["start_at"] = time.time() + 0.3
                self.stats.double_turns += 1
            else:
                workers = self.fleet.pick(plan.last_workers)
            if plan.last_workers and not (set(workers) & plan.last_workers):
                self.stats.handoffs += 1
            for w in workers:
                self.job_ids += 1
                sent = dict(job, id=self.job_ids)
                self.jobs[self.job_ids] = (plan.session, sent)
                plan.in_flight += 1
                self.fleet.send(w, sent)
            plan.last_workers = set(workers)

    def receive(self) -> bool:
        """Wait a moment for a worker's message and take it in. False: stop scheduling (a
        worker died, crashed or hung)."""
        msg = self.fleet.receive(0.2)
        if msg is None:
            dead = self.fleet.dead_workers()
            if dead:
                self.stats.errors.append(f"worker(s) {dead} died with jobs in flight")
                return False
            if time.monotonic() - self.last_heard > STALL_S:
                self.stats.errors.append(f"no worker finished a job for {STALL_S:.0f} s: stopped waiting")
                return False
            return True
        self.last_heard = time.monotonic()
        if msg["kind"] == "ready":
            return True
        if msg["kind"] == "crashed":
            self.stats.errors.append(f"worker {msg['worker']} crashed: {msg['error']}")
            return False
        if msg["kind"] == "done":
            self.done(msg)
        return True

    def done(self, msg: dict[str, Any]) -> None:
        """A job finished: count what it did; a fork becomes a session with a plan of its own."""
        stats = self.stats
        sid, job = self.jobs.pop(msg["job"])
        self.fleet.outstanding[msg["worker"]] -= 1
        plan = self.plans[sid]
        plan.in_flight -= 1
        stats.jobs += 1
        stats.appends += msg.get("appends", 0)
        stats.conflicts += msg.get("conflicts", 0)
        if not msg["ok"]:
            stats.errors.append(f"worker {msg['worker']}, {job['kind']} on {sid}: {msg['error']}")
            if os.environ.get("SESSIONSTORE_DEBUG"):
                err(msg.get("traceback", ""))
        if job["kind"] == "turn" and plan.in_flight == 0:
            stats.turns_done += 1
        stats.branch_summaries += int(bool(msg.get("branch_summary")))
        stats.context_compactions += int(bool(msg.get("context_compaction")))
        if msg.get("redaction"):
            stats.redaction = msg["redaction"]
        if msg.get("fork"):
            fork = msg["fork"]
            stats.forks.append(fork)
            steps = fork_steps(self.size.turns)
            self.plans[fork["session"]] = Plan(fork["session"], steps, fork_of=sid,
                                               last_workers={msg["worker"]})
            stats.turns_total += len(steps)
