"""``sessionstore demo``: a fleet of scripted agents on shared sessions, then proof.

Worker processes (multiprocessing, spawn: nothing shared but the store) play agents. Every
turn of a session goes to a different worker than the turn before, which opens the session
by id and continues from its leaf, as a resumed agent on another machine would. Some turns
are played by two workers at once on the same leaf: with plain handles both land (sibling
branches); with strict handles one gets ``ConflictError``, re-reads and continues after the
winner. Some sessions branch with a summary, some are forked; one tool result leaks a token
and is redacted; a compactor worker (``python -m compactor work``) merges segments alongside.
At the end every invariant is checked over everything that was written (``store.demo.check``),
a summary is printed and one session's tree is drawn. Exit code 0 only if all checks pass.

By default it runs on the embedded default in a new temporary directory, removed at the end
with its redis-server (``--keep`` keeps both to explore). With ``--objects`` / ``--redis``
(or the environment) it runs there, under a prefix of its own (``demo-<run>``).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse, urlunparse

from store.cli.common import (
    ENV_OBJECTS,
    ENV_REDIS,
    CliError,
    Exit,
    dump_json,
    err,
    human_bytes,
    objects_url_of,
    out,
)
from store.cli.render import StatusLine, draw_tree
from store.demo.options import DemoSize, size_from
from store.errors import SessionStoreError

if TYPE_CHECKING:
    from store.cli.commands import Ctx
    from store.core import SessionStore

#: Writers queue a compaction job after this many segments (the store's default is 64): the
#: demo's sessions are short, and compaction should visibly happen while they grow.
COMPACT_AFTER_SEGMENTS = 8
#: The compactor's grace period in the demo: long enough for any read of these small
#: sessions, short enough that GC deletes merged segments while the demo runs.
COMPACTOR_GRACE_S = 3.0
#: A worker that has not finished a job for this long is taken as hung (a turn takes well
#: under a second).
STALL_S = 120.0


@dataclass
class Location:
    objects_url: str
    redis_url: str | None
    redis_prefix: str
    description: str
    #: Directories to remove at the end (unless --keep).
    remove_dirs: list[Path] = field(default_factory=list)
    #: The embedded redis-server to stop at the end (unless --keep).
    embedded_dir: Path | None = None
    #: External backends: delete the run's objects and keys at the end (unless --keep).
    external: bool = False


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


def _run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def _location(args: argparse.Namespace, ctx: Ctx, run: str) -> Location:
    user_objects = getattr(args, "objects", None) or os.environ.get(ENV_OBJECTS)
    user_redis = getattr(args, "redis", None) or os.environ.get(ENV_REDIS)
    prefix = ctx.config.redis_prefix
    if args.dir:
        directory = Path(args.dir).expanduser().absolute()
        if directory.exists() and any(p for p in directory.iterdir() if p.name != ".redis"):
            raise CliError(f"{directory} is not empty: the demo needs a directory of its own", Exit.USAGE)
        directory.mkdir(parents=True, exist_ok=True)
        return Location(directory.as_uri(), None, prefix, f"embedded store in {directory}",
                        embedded_dir=directory / ".redis")
    if not user_objects and not user_redis:
        directory = Path(tempfile.mkdtemp(prefix="sessionstore-demo-"))
        return Location(directory.as_uri(), None, prefix, f"embedded store in {directory}",
                        remove_dirs=[directory], embedded_dir=directory / ".redis")
    # Explicit backends: a namespace of the run's own, so that repeated demos never mix.
    base = objects_url_of(user_objects or ctx.config.objects_url)
    parsed = urlparse(base)
    redis_prefix = f"{prefix}-demo-{run}"
    if parsed.scheme == "s3":
        path = "/".join(p for p in (parsed.path.strip("/"), f"demo-{run}") if p)
        url = urlunparse(parsed._replace(path="/" + path))
        return Location(url, user_redis, redis_prefix, f"{url} and {user_redis or 'the embedded Redis'}",
                        external=True)
    if parsed.scheme == "file":
        directory = Path(ctx.config.local_dir or ".") / f"demo-{run}"
        directory.mkdir(parents=True, exist_ok=True)
        return Location(directory.as_uri(), user_redis, redis_prefix,
                        f"{directory} and {user_redis or 'its embedded Redis'}",
                        remove_dirs=[directory], embedded_dir=None if user_redis else directory / ".redis",
                        external=bool(user_redis))
    raise CliError(f"the demo runs on s3:// or file:// stores, not {base!r}", Exit.USAGE)


# --- the plan ------------------------------------------------------------------------------------


def _session_steps(i: int, turns: int, secret: str) -> list[dict[str, Any]]:
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


def _fork_steps(turns: int) -> list[dict[str, Any]]:
    return [{"kind": "turn", "turn": t, "strict": False, "batch": t % 2 == 0, "label": t == 0}
            for t in range(max(1, turns // 2))]


# --- the run -------------------------------------------------------------------------------------


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
        self.compactor_log: Any = None

    def store_options(self) -> dict[str, Any]:
        return {"redis_prefix": self.loc.redis_prefix, "compact_after_segments": COMPACT_AFTER_SEGMENTS}

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
            msg = self._get(min(0.5, deadline - time.monotonic()))
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

    def _get(self, timeout: float) -> dict[str, Any] | None:
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

    def stop(self) -> None:
        """Ask every worker to finish, wait, then stop the compactor. Idempotent."""
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
        self.inboxes.clear()
        self.procs.clear()
        self.stop_compactor()

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
        self.compactor = None
        if self.compactor_log is not None:
            self.compactor_log.close()
            self.compactor_log = None


def _count_compactions(store: SessionStore, sessions: list[str]) -> int:
    total = 0
    for sid in sessions:
        try:
            header = store.get_header(sid)
            manifest = store.latest_manifest(sid, header.incarnation)
        except Exception:
            continue  # a progress figure, never a failure
        total += manifest.generation if manifest else 0
    return total


def _schedule(store: SessionStore, fleet: Fleet, plans: dict[str, Plan], stats: Stats,
              status: StatusLine, size: DemoSize) -> float:
    """Hand the steps of every session to the workers until done. Returns the seconds spent."""
    from store.core import uuid7

    started = time.monotonic()
    job_ids = 0
    jobs: dict[int, tuple[str, dict[str, Any]]] = {}
    last_count = 0.0
    last_heard = time.monotonic()
    capped = False

    def progress(force: bool = False) -> None:
        elapsed = time.monotonic() - started
        rate = stats.appends / elapsed if elapsed > 0 else 0.0
        status.update(
            f"demo {elapsed:5.1f}s · turns {stats.turns_done}/{stats.turns_total} · appends {stats.appends} "
            f"({rate:.0f}/s) · conflicts {stats.conflicts} · forks {len(stats.forks)} · "
            f"compactions {stats.compactions} · sessions {len(plans)}" + (" · time's up, finishing" if capped else ""),
            force=force,
        )

    while True:
        elapsed = time.monotonic() - started
        capped = size.seconds > 0 and elapsed >= size.seconds
        # Double turns first: while one waits for two idle workers, nothing else is handed
        # out, so that workers drain and the race happens now rather than at the very end.
        ready = [p for p in plans.values()
                 if not p.in_flight and p.index < len(p.steps)
                 and not (capped and not p.steps[p.index].get("required"))]
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
                workers = fleet.idle(plan.last_workers, 2)
                if len(workers) < 2:
                    plan.index -= 1
                    reserving = True
                    continue
                job["start_at"] = time.time() + 0.3
                stats.double_turns += 1
            else:
                workers = fleet.pick(plan.last_workers)
            if plan.last_workers and not (set(workers) & plan.last_workers):
                stats.handoffs += 1
            for w in workers:
                job_ids += 1
                sent = dict(job, id=job_ids)
                jobs[job_ids] = (plan.session, sent)
                plan.in_flight += 1
                fleet.send(w, sent)
            plan.last_workers = set(workers)
        if not jobs:
            break
        if time.monotonic() - last_count >= 2.0:
            last_count = time.monotonic()
            stats.compactions = _count_compactions(store, list(plans))
        progress()
        msg = fleet._get(0.2)
        if msg is None:
            dead = fleet.dead_workers()
            if dead:
                stats.errors.append(f"worker(s) {dead} died with jobs in flight")
                break
            if time.monotonic() - last_heard > STALL_S:
                stats.errors.append(f"no worker finished a job for {STALL_S:.0f} s: stopped waiting")
                break
            continue
        last_heard = time.monotonic()
        if msg["kind"] == "ready":
            continue
        if msg["kind"] == "crashed":
            stats.errors.append(f"worker {msg['worker']} crashed: {msg['error']}")
            break
        if msg["kind"] == "done":
            sid, job = jobs.pop(msg["job"])
            fleet.outstanding[msg["worker"]] -= 1
            plan = plans[sid]
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
                steps = _fork_steps(size.turns)
                plans[fork["session"]] = Plan(fork["session"], steps, fork_of=sid,
                                              last_workers={msg["worker"]})
                stats.turns_total += len(steps)
    elapsed = time.monotonic() - started
    failure = fleet.compactor_failure()
    if failure:
        stats.errors.append(failure)
    stats.compactions = _count_compactions(store, list(plans))
    progress(force=True)
    status.done()
    return elapsed


def _purge(store: SessionStore, sid: str, secret: str) -> bool:
    """Delete the redacted text from storage now, as an operator answering an erasure
    request does (``sessionstore redact --purge-now``): compact, then delete every object the
    new manifest does not reach (``compactor.purge``). ``check_redaction`` then looks for the
    secret in every object. False if the purge could not run.
    """
    from compactor import Compactor, CompactorOptions
    from compactor.purge import purge_now

    try:
        purge_now(Compactor(store, CompactorOptions(worker="demo-final")), sid)
    except SessionStoreError as exc:
        err(f"sessionstore demo: purge failed ({exc})")
        return False
    return True


def _pick_tree_session(store: SessionStore, sessions: list[str]) -> str | None:
    best: tuple[int, str] | None = None
    for sid in sessions:
        try:
            s = store.load_session(sid)
        except Exception:
            continue
        leaves = sum(1 for e in s.entries if not s.get_children(e["id"]))
        types = {e.get("type") for e in s.entries}
        score = (3 * leaves + len(s.labels) + 2 * ("branch_summary" in types)
                 + 2 * ("compaction" in types) + 2 * bool(s.redacted_ids))
        if best is None or score > best[0]:
            best = (score, sid)
    return best[1] if best else None


def _bytes_in_store(store: SessionStore) -> tuple[int, int]:
    total = count = 0
    for info in store.objects.list(store.layout.sessions_prefix):
        total += info.size
        count += 1
    return total, count


def run_demo(args: argparse.Namespace, ctx: Ctx) -> dict[str, Any]:
    """Run the demo; returns the JSON report (``report["ok"]`` is the verdict)."""
    from store.core import SessionStore, uuid7
    from store.demo.agent import RecordingStore
    from store.demo.check import (
        Verification,
        check_forks,
        check_history,
        check_redaction,
        check_store,
        load_ops,
    )

    size = size_from(args)
    run = _run_id()
    loc = _location(args, ctx, run)
    log_dir = Path(tempfile.mkdtemp(prefix="sessionstore-demo-logs-"))
    status = StatusLine(sys.stderr)
    t0 = time.monotonic()
    err(f"sessionstore demo: {size.workers} workers, {size.sessions} sessions x {size.turns} turns "
        f"on {loc.description}")
    store: SessionStore | None = None
    fleet: Fleet | None = None
    report: dict[str, Any] = {"ok": False}
    try:
        store = SessionStore.from_url(loc.objects_url, loc.redis_url, redis_prefix=loc.redis_prefix,
                                      compact_after_segments=COMPACT_AFTER_SEGMENTS)
        secret = f"dtk_{uuid.uuid4().hex}"
        plans: dict[str, Plan] = {}
        stats = Stats()
        # Workers take a few seconds to start (a fresh interpreter each): start them first.
        fleet = Fleet(loc, size, args, log_dir)
        fleet.start()
        with open(log_dir / "main.jsonl", "ab") as main_log:
            main_rec = RecordingStore(store, main_log)
            from store.manager import SessionManager

            for i in range(size.sessions):
                sid = uuid7()
                store.create_session(sid, cwd=f"/home/agent/project-{i + 1}")
                SessionManager(main_rec, sid).append_session_info(f"project {i + 1}")  # type: ignore[arg-type]
                steps = _session_steps(i, size.turns, secret)
                plans[sid] = Plan(sid, steps)
                stats.turns_total += sum(1 for s in steps if s["kind"] == "turn")
            fleet.wait_ready()
            write_s = _schedule(store, fleet, plans, stats, status, size)
            fleet.stop()
        sessions = list(plans)
        # Purge the leaked token from storage now, not after the compactor's grace period:
        # every worker has stopped, so no reader can be holding a retired object.
        purged = False
        if stats.redaction is not None:
            err("purging the redacted text from storage ...")
            purged = _purge(store, stats.redaction["session"], secret)
        stats.compactions = _count_compactions(store, sessions)
        err("verifying everything that was written ...")
        verification = Verification()
        ops = load_ops(sorted(log_dir.glob("*.jsonl")))
        check_history(store, ops, verification)
        check_store(store, verification)
        check_forks(store, stats.forks, verification)
        check_redaction(store, secret, sessions, stats.redaction["session"] if stats.redaction else None,
                        verification, purged=purged)
        verification.add("workers", stats.errors)
        entries = 0
        branches = 0
        for sid in sessions:
            s = store.load_session(sid)
            entries += len(s)
            branches += sum(1 for e in s.entries if not s.get_children(e["id"]))
        total_bytes, objects = _bytes_in_store(store)
        tree_sid = _pick_tree_session(store, sessions)
        summary = {
            "workers": size.workers,
            "sessions": len(sessions),
            "forks": len(stats.forks),
            "entries": entries,
            "branches": branches,
            "turns": stats.turns_done,
            "turns_planned": stats.turns_total,
            "jobs": stats.jobs,
            "handoffs": stats.handoffs,
            "double_turns": stats.double_turns,
            "appends": verification.acknowledged,
            "appends_per_second": round(verification.acknowledged / write_s, 1) if write_s else 0.0,
            "conflicts_handled": verification.conflicts,
            "branch_summaries": stats.branch_summaries,
            "context_compactions": stats.context_compactions,
            "compactions": stats.compactions,
            "redactions": 1 if stats.redaction else 0,
            "bytes": total_bytes,
            "objects": objects,
            "write_seconds": round(write_s, 2),
            "seconds": round(time.monotonic() - t0, 2),
        }
        report = {
            "ok": verification.ok,
            "verification": verification.to_json(),
            "summary": summary,
            "store": {"objects": loc.objects_url, "redis": loc.redis_url or "embedded",
                      "redis_prefix": loc.redis_prefix, "kept": bool(args.keep)},
            "tree_session": tree_sid,
        }
        if not ctx.json:
            _print_report(store, report, tree_sid)
        return report
    finally:
        if fleet is not None:
            fleet.stop()
        if store is not None:
            if not args.keep and loc.external:
                _cleanup_external(store, loc)
            if not args.keep:
                # Before the store closes: a store that started the embedded server says on
                # close that it leaves it running, which would not be true here.
                _stop_embedded(loc)
            store.close()
        _cleanup_local(loc, log_dir, keep=bool(args.keep))
        report.setdefault("summary", {})


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else (many or one + 's')}"


def _print_report(store: SessionStore, report: dict[str, Any], tree_sid: str | None) -> None:
    s = report["summary"]
    v = report["verification"]
    out()
    out(f"sessions     {s['sessions']} ({s['sessions'] - s['forks']} shared, {_n(s['forks'], 'fork')}), "
        f"{s['entries']} entries, {s['branches']} branch tips")
    out(f"turns        {s['turns']} of {s['turns_planned']} planned, by {s['workers']} workers; "
        f"{s['handoffs']} handed to another worker, {s['double_turns']} played by two workers at once")
    out(f"appends      {s['appends']} acknowledged in {s['write_seconds']} s ({s['appends_per_second']}/s); "
        f"{_n(s['conflicts_handled'], 'conflict')} refused and retried after a refresh")
    out(f"compactions  {_n(s['compactions'], 'manifest')} (compactor worker alongside), "
        f"{_n(s['branch_summaries'], 'branch summary', 'branch summaries')}, "
        f"{_n(s['context_compactions'], 'context compaction')}, {_n(s['redactions'], 'redaction')}")
    out(f"storage      {human_bytes(s['bytes'])} in {s['objects']} objects")
    checks = ", ".join(f"{name} {'ok' if ok else 'FAILED'}" for name, ok in v["checks"].items())
    verdict = "PASSED" if v["ok"] else "FAILED"
    out(f"verification {verdict}: {checks}")
    for p in v["problems"][:20]:
        out(f"  problem: {p}")
    if len(v["problems"]) > 20:
        out(f"  ... and {len(v['problems']) - 20} more")
    if tree_sid:
        from store.cli.commands import describe_session
        from store.model.session import Session

        data = store.read_session(tree_sid)
        session = Session(data.header.pi_header, data.all_entries)
        out()
        out(describe_session(tree_sid, session, data))
        for line in draw_tree(session, stream=sys.stdout):
            out(line)
    out()
    out(f"done in {s['seconds']} s")
    if report["store"]["kept"]:
        objects = report["store"]["objects"]
        flags = f"--objects {objects}"
        if report["store"]["redis"] != "embedded":
            flags += f" --redis {report['store']['redis']}"
        if report["store"]["redis_prefix"] != "ss":
            flags += f" --redis-prefix {report['store']['redis_prefix']}"
        out(f"kept: explore with `sessionstore {flags} ls`")


def _cleanup_external(store: SessionStore, loc: Location) -> None:
    """Remove the run's objects and Redis keys from shared backends."""
    try:
        keys = [i.key for i in store.objects.list(store.layout.prefix)] if store.layout.prefix else []
        if keys:
            store.objects.delete_many(keys)
        store.coord.purge()
    except Exception as exc:  # cleanup must not turn a passed demo into a failure
        err(f"sessionstore demo: could not remove the run's data ({exc})")


def _stop_embedded(loc: Location) -> None:
    if loc.embedded_dir is not None:
        from store.embedded import EmbeddedRedis

        try:
            EmbeddedRedis(loc.embedded_dir).stop()
        except Exception as exc:
            err(f"sessionstore demo: could not stop the embedded redis-server ({exc})")


def _cleanup_local(loc: Location, log_dir: Path, *, keep: bool) -> None:
    if keep:
        err(f"kept the demo's logs in {log_dir}")
        return
    _stop_embedded(loc)
    for d in loc.remove_dirs:
        shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(log_dir, ignore_errors=True)


def run_demo_command(args: argparse.Namespace, ctx: Ctx) -> int:
    report = run_demo(args, ctx)
    if ctx.json:
        out(dump_json(report))
    return Exit.OK if report.get("ok") else Exit.FAILED
