"""``sessionstore serve`` processes SIGKILLed under load: the workload of tests/test_http_kills.py
and of the benchmarks' ``kills`` scenario (issue #41: "A killed service process wedges a stream").

* :class:`ServeSlot`: one service process on a fixed loopback port, killed and restarted there.
  Run as a script, this module is that process: the service ``sessionstore serve`` runs
  (``StreamService`` under uvicorn) on a store whose ``fault_hook`` stops the request that
  first reaches ``--die-at POINT`` in an append to ``--die-in SESSION`` (the process serves
  the others), writes ``--stopped-file`` and waits for the SIGKILL (``append.after_put``: the
  segment is PUT, Redis never hears of it). ``sessionstore serve`` itself has no such switch.
* :class:`Nemesis`: kills one process at a time at random moments and restarts it a moment
  later; a life armed with an :class:`Arm` is killed where it stopped, after the other
  processes' readers have read (they meet what it wrote and cache it).
* :class:`Workload`: the clients, each in a thread with its own ``httpx.Client``: idempotent
  producers (``Producer-Id``, epoch 0, seq 0, 1, ...) on one JSON stream, each append to a
  process of its choice and, when it fails (a connection error, a 5xx), the same ``(id,
  epoch, seq)`` again to the other one; a long-poll follower of that stream; a producer alone
  on a second stream (the arms stop its appends: no other append of that stream is then in
  flight to roll the stopped one's segment forward); on one pi session, a writer with
  ``If-Match`` on the tail entry it knows and one without; optionally a Claude Agent SDK
  transcript writer (``/v1/claude/append``, re-sending the same uuids).
* :func:`judge`: what was acknowledged against what the streams, the session (tests/history.py)
  and the transcript hold, and how long each writer waited after each fault.

Every time is ``time.monotonic()``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

#: The append's fault points (store/protocol/append.py) that every append on S3 passes.
APPEND_POINTS: tuple[str, ...] = ("append.before_check", "append.before_put", "append.after_put", "append.after_commit")

STREAM_ROOT = "/v1/stream/"
JSON = {"content-type": "application/json"}


# --- the service process ---------------------------------------------------------------------


def _serve_main(argv: Sequence[str]) -> None:
    """The process a :class:`ServeSlot` runs: ``sessionstore serve``'s service and options,
    plus a fault hook that SIGKILLs this process at ``--die-at``."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--objects", required=True)
    ap.add_argument("--redis", required=True)
    ap.add_argument("--redis-prefix", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--long-poll-timeout", type=float, default=1.0)
    ap.add_argument("--die-at", default="", help="a fault point of the append")
    ap.add_argument("--die-in", default="", help="only in this stream's (or session's) appends")
    ap.add_argument("--stopped-file", default="", help="written when it stops at the point")
    args = ap.parse_args(argv)

    import logging

    import uvicorn

    from store import SessionStore
    from store.http.app import StreamService
    from store.http.server import ServerLimits, server_config

    reached = threading.Lock()

    def die(point: str, ctx: dict[str, Any]) -> None:
        """Stop here (only this request: the others go on), say so, and wait for the SIGKILL;
        die by itself if none comes."""
        if point != args.die_at or (args.die_in and ctx.get("session_id") != die_in_sid):
            return
        if not reached.acquire(blocking=False):
            return
        Path(args.stopped_file).write_text(f"{point} {ctx}")
        time.sleep(30)
        os.kill(os.getpid(), signal.SIGKILL)

    store = SessionStore.from_url(args.objects, args.redis, redis_prefix=args.redis_prefix,
                                  fault_hook=die if args.die_at else None)
    # The session the stream is kept under (keyed by the store's record).
    die_in_sid = store.layout.stream_id(args.die_in) if args.die_in else ""
    service = StreamService(store, long_poll_s=args.long_poll_timeout)
    logging.basicConfig(level=logging.WARNING)
    # The uvicorn configuration of ``sessionstore serve`` (store/cli/serve.py), default limits.
    uvicorn.Server(server_config(service.app, host="127.0.0.1", port=args.port, limits=ServerLimits(),
                                 timeout_graceful_shutdown=2)).run()


@dataclass(frozen=True)
class Arm:
    """Where a life of a process stops to be killed: a fault point of the appends to one
    stream or session (by its name), named ``label`` in reports."""

    point: str
    stream: str
    label: str


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServeSlot:
    """One service process at a fixed ``url``: started, SIGKILLed, started again there."""

    def __init__(self, name: str, store_args: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._args = store_args
        self._log_dir = log_dir
        self.process: subprocess.Popen[bytes] | None = None
        self.lives = 0
        #: Where this life stops, to be SIGKILLed there (None: nowhere).
        self.armed: Arm | None = None
        self.stopped_file = log_dir / f"{name}.stopped"

    def stopped(self) -> bool:
        """Whether this life has stopped at the point it was armed with."""
        return self.armed is not None and self.stopped_file.exists()

    def start(self, arm: Arm | None = None, timeout: float = 60.0) -> None:
        """Start a new life (stopping at ``arm``'s point), back once ``/healthz`` answers 200."""
        import httpx

        self.lives += 1
        self.armed = arm
        self.stopped_file.unlink(missing_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        command = [sys.executable, str(Path(__file__).resolve()),
                   "--objects", self._args["objects"], "--redis", self._args["redis"],
                   "--redis-prefix", self._args["redis_prefix"], "--port", str(self.port),
                   "--long-poll-timeout", self._args.get("long_poll_timeout", "1")]
        if arm is not None:
            command += ["--die-at", arm.point, "--die-in", arm.stream, "--stopped-file", str(self.stopped_file)]
        deadline = time.monotonic() + timeout
        while True:
            with open(self._log_dir / f"{self.name}.{self.lives}.log", "wb") as log:
                self.process = subprocess.Popen(command, cwd=self._log_dir, env=env, stdin=subprocess.DEVNULL,
                                                stdout=log, stderr=subprocess.STDOUT)
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    break
                try:
                    if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
            if self.process.poll() is None or time.monotonic() >= deadline:
                self.kill()
                raise RuntimeError(f"{self.name} not healthy after {timeout}s:\n{self.log()}")
            # Exited while starting: the port may be held a moment longer; try again there.
            time.sleep(0.2)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.alive():
            assert self.process is not None
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        path = self._log_dir / f"{self.name}.{self.lives}.log"
        return path.read_text(errors="replace")[-5000:] if path.exists() else ""


# --- faults ----------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str  # "kill" (SIGKILL at a random moment), an Arm's label, or "exit" (died by itself)
    slot: str
    t0: float  # the process died (or was seen dead)
    t1: float = 0.0  # its next life answered /healthz


class Nemesis:
    """One process down at a time. While every process is up and none is armed, a SIGKILL at a
    random moment (every ``interval`` seconds, uniform); a dead process is restarted ``down_s``
    later, armed with the next of ``arms`` while any is left. An armed
    life stops at its point (the request that reached it waits there; the process serves the
    others); the nemesis then lets ``meanwhile`` read through the other processes (their
    readers meet whatever the stopped one wrote: after ``append.after_put`` a segment Redis has
    not heard of) and SIGKILLs it. ``run(until)`` returns once ``until`` has passed and every
    arm has been used, with every process up and unarmed."""

    def __init__(self, slots: Sequence[ServeSlot], rng: random.Random, arms: Sequence[Arm] = (),
                 interval: tuple[float, float] = (1.5, 2.5), down_s: float = 1.0, armed_timeout_s: float = 20.0,
                 meanwhile: Callable[[Sequence[ServeSlot]], None] = lambda _: None,
                 log: Callable[[str], None] = lambda _: None) -> None:
        self.slots = list(slots)
        self.rng = rng
        self.arms = list(arms)
        self.interval = interval
        self.down_s = down_s
        self.armed_timeout_s = armed_timeout_s
        self.meanwhile = meanwhile
        self.faults: list[Fault] = []
        #: Arms whose life never reached its point (it was killed at random instead).
        self.unreached: list[str] = []
        self._log = log

    @property
    def last_end(self) -> float:
        return max((f.t1 for f in self.faults), default=0.0)

    def run(self, until: float) -> None:
        next_kill = time.monotonic() + self.rng.uniform(*self.interval)
        armed_since = 0.0
        while True:
            now = time.monotonic()
            down = [s for s in self.slots if not s.alive()]
            armed = [s for s in self.slots if s.armed is not None]
            if not down and not armed and not self.arms and now >= until:
                return
            if down:
                slot = down[0]
                fault = self.faults[-1] if self.faults and self.faults[-1].t1 == 0.0 else None
                if fault is None or fault.slot != slot.name:  # it died on its own
                    fault = Fault("exit", slot.name, now)
                    self.faults.append(fault)
                time.sleep(max(0.0, fault.t0 + self.down_s - time.monotonic()))
                arm = self.arms.pop(0) if self.arms else None
                slot.start(arm)
                fault.t1 = armed_since = time.monotonic()
                self._log(f"{fault.slot}: {fault.kind}, down {fault.t1 - fault.t0:.1f}s"
                          + (f"; next life stops at {arm.label}" if arm else ""))
                next_kill = fault.t1 + self.rng.uniform(*self.interval)
            elif armed and armed[0].stopped():
                slot = armed[0]
                assert slot.armed is not None
                self.meanwhile([s for s in self.slots if s is not slot])
                self._kill(slot, slot.armed.label)
            elif armed and now - armed_since > self.armed_timeout_s:
                assert armed[0].armed is not None
                self.unreached.append(armed[0].armed.label)
                self._kill(armed[0], "kill")
            elif not armed and now >= next_kill and (now < until or self.arms):
                # (Arms left and none armed: the first kill, whose restart takes the first.)
                self._kill(self.rng.choice(self.slots), "kill")
            else:
                time.sleep(0.02)

    def _kill(self, slot: ServeSlot, kind: str) -> None:
        slot.armed = None
        slot.kill()
        self.faults.append(Fault(kind, slot.name, time.monotonic()))


# --- the clients -----------------------------------------------------------------------------


@dataclass
class Client:
    """One client's record: when each of its appends was acknowledged, and what went wrong."""

    name: str
    acks: list[float] = field(default_factory=list)
    attempts: int = 0
    retries: int = 0  # failed attempts re-sent (connection errors, 5xx)
    errors: list[str] = field(default_factory=list)  # answers that are bugs (a 409 gap, ...)
    #: When an answer decided an append's fate (acknowledged, or refused: a 412).
    decided: list[float] = field(default_factory=list)
    #: (start, end, process, status or "conn") of its last requests, for a failure's message.
    recent: list[tuple[float, float, int, str]] = field(default_factory=list)

    def note(self, t0: float, slot: int, status: str) -> None:
        self.recent.append((t0, time.monotonic(), slot, status))
        if len(self.recent) > 400:
            del self.recent[:200]



class Workload:
    """The clients on ``slots``: start() them, stop() them, then judge(). One JSON stream
    (``stream``) with ``producers`` producers and a follower, one pi session (``session``) with
    an ``If-Match`` writer and a plain one, and with ``claude`` a Claude transcript writer."""

    def __init__(self, slots: Sequence[ServeSlot], rng: random.Random, *, producers: int = 3,
                 claude: bool = False, pace_s: float = 0.1, name: str = "kills") -> None:
        self.slots = list(slots)
        self.rng = rng
        self.pace_s = pace_s
        self.stream = f"{name}/stream"
        #: A stream of one producer: when a process stops inside its append, no other append
        #: of it is in flight anywhere (one would roll the stopped one's segment forward).
        self.lone = f"{name}/lone"
        self.session = f"{name}/session"
        self.claude_key = {"projectKey": name, "sessionId": "transcript"}
        self.stop_event = threading.Event()
        self.producers = [Client(f"p{i}") for i in range(producers)] + [Client("lone")]
        self.stream_of = {p.name: self.lone if p.name == "lone" else self.stream for p in self.producers}
        self.pending: dict[str, int] = {}  # a producer's seq not acknowledged when it stopped
        self.session_writers = [Client("if-match"), Client("plain")]
        self.session_ops: list[Any] = []  # history.Op of every session append
        self.claude = Client("claude") if claude else None
        self.claude_sent: list[str] = []  # uuids acknowledged, in order
        self.claude_pending: list[str] = []
        self.follower = Client("follower")
        self.followed: list[Any] = []
        self._follow_target: str | None = None
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._follower_thread = threading.Thread()

    def arms(self, points: Sequence[str] = APPEND_POINTS) -> list[Arm]:
        """Each point in the lone stream's appends, then ``append.after_put`` in the session's."""
        return [Arm(p, self.lone, f"{p.split('.')[-1]}@stream") for p in points] + [
            Arm("append.after_put", self.session, "after_put@session")]

    def read_through(self, slots: Sequence[ServeSlot]) -> None:
        """A reader's GET at the tail (``offset=now``: the stream's state, probed past Redis's
        tail) of each stream and the session through each of ``slots``."""
        import httpx

        for slot in slots:
            for name in (self.stream, self.lone, self.session):
                try:
                    httpx.get(slot.url + STREAM_ROOT + name, params={"offset": "now"}, timeout=15)
                except httpx.TransportError:
                    pass

    @property
    def writers(self) -> list[Client]:
        return self.producers + self.session_writers + ([self.claude] if self.claude else [])

    def setup(self) -> None:
        import httpx

        url = self.slots[0].url + STREAM_ROOT
        for stream in (self.stream, self.lone):
            r = httpx.put(url + stream, headers=JSON, timeout=30)
            assert r.status_code == 201, r.text
        r = httpx.put(url + self.session, headers={**JSON, "stream-kind": "session"}, timeout=30)
        assert r.status_code == 201, r.text

    def start(self) -> None:
        targets: list[Callable[[], None]] = [lambda c=c: self._produce(c) for c in self.producers]
        targets += [lambda: self._session_writer(self.session_writers[0], True),
                    lambda: self._session_writer(self.session_writers[1], False)]
        if self.claude:
            targets.append(self._claude_writer)
        self._threads = [threading.Thread(target=t, daemon=True) for t in targets]
        self._follower_thread = threading.Thread(target=self._follow, daemon=True)
        for t in [*self._threads, self._follower_thread]:
            t.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the writers, then let the follower catch up with the stream's final tail."""
        self.stop_event.set()
        for t in self._threads:
            t.join(timeout)
        try:
            self._follow_target = self._read_all()[1]
        except (AssertionError, OSError, ImportError) as exc:
            self.follower.errors.append(f"the stream could not be read to its end: {exc!r}")
            self._follow_target = "unreadable"
        self._follower_thread.join(timeout)
        if self._follower_thread.is_alive():
            self.follower.errors.append(f"never reached the final tail {self._follow_target}")

    # -- each client's loop --

    def _post(self, me: Client, c: Any, slot: int, path: str, body: Any, headers: dict[str, str]) -> Any:
        """One POST; None for a connection error (the process died under it)."""
        import httpx

        t0 = time.monotonic()
        me.attempts += 1
        try:
            r = c.post(self.slots[slot].url + path, content=json.dumps(body), headers=headers)
        except httpx.TransportError as exc:
            me.note(t0, slot, type(exc).__name__)
            return None
        me.note(t0, slot, f"{r.status_code}" + (f" {r.text[:80]}" if r.status_code >= 300 else ""))
        if r.status_code < 500:
            me.decided.append(time.monotonic())
        return r

    def _produce(self, me: Client) -> None:
        import httpx

        slot = self.rng.randrange(len(self.slots))
        seq = 0
        with httpx.Client(timeout=15) as c:
            while not self.stop_event.is_set():
                headers = {**JSON, "producer-id": me.name, "producer-epoch": "0", "producer-seq": str(seq)}
                r = self._post(me, c, slot, STREAM_ROOT + self.stream_of[me.name], [{"p": me.name, "s": seq}],
                               headers)
                if r is not None and r.status_code in (200, 204):
                    me.acks.append(time.monotonic())
                    seq += 1
                    slot = self.rng.randrange(len(self.slots))  # the next append to a process of its choice
                    time.sleep(self.pace_s)
                elif r is None or r.status_code >= 500:
                    me.retries += 1  # the same (id, epoch, seq) to the other process
                    slot = (slot + 1) % len(self.slots)
                    time.sleep(0.05)
                else:
                    me.errors.append(f"seq {seq}: {r.status_code} {r.text[:200]}")
                    time.sleep(0.2)
        self.pending[me.name] = seq

    def _session_writer(self, me: Client, if_match: bool) -> None:
        """Two-entry batches on the session: ``If-Match`` on the tail entry it knows (a 412
        tells it the actual one), or none (parented on its own last entry). A batch whose answer
        was lost is sent again, the same ids, until an answer says what became of it."""
        import httpx

        from history import Op
        from store.streams import Offset

        sid = self.session  # the stream's name: judge() checks the session it is kept under
        tag = "m" if if_match else "u"
        tail, mine = "", None
        slot = self.rng.randrange(len(self.slots))
        i = 0
        with httpx.Client(timeout=15) as c:
            while not self.stop_event.is_set():
                ids = [f"{tag}{i}a", f"{tag}{i}b"]
                parent = (tail or None) if if_match else mine
                batch = [_entry(ids[0], parent), _entry(ids[1], ids[0])]
                headers = {**JSON, "if-match": f'"{tail}"'} if if_match else JSON
                while True:
                    op = Op(sid, ids, tail if if_match else None, "ok")
                    r = self._post(me, c, slot, STREAM_ROOT + self.session, batch, headers)
                    if r is not None and r.status_code == 204:
                        op.seq = Offset.parse(r.headers["stream-next-offset"]).vseq
                        me.acks.append(time.monotonic())
                        tail = mine = ids[-1]
                    elif r is not None and r.status_code == 412:
                        op.outcome, op.actual_tail = "conflict", r.headers["session-tail-entry-id"]
                        tail = op.actual_tail
                    elif r is None or r.status_code >= 500:
                        op.outcome = "indeterminate"
                        me.retries += 1
                        slot = (slot + 1) % len(self.slots)
                    else:
                        op.outcome = f"error:{r.status_code}:{r.text[:200]}"
                        me.errors.append(op.outcome)
                    with self._lock:
                        self.session_ops.append(op)
                    if op.outcome != "indeterminate" or self.stop_event.is_set():
                        break
                    time.sleep(0.05)
                i += 1
                slot = self.rng.randrange(len(self.slots))
                # The plain writer now and then, not flat out: otherwise the If-Match writer, a
                # round trip behind it every time, would conflict every time (as any CAS loop).
                time.sleep(self.pace_s if if_match else self.rng.uniform(0.1, 0.6))

    def _claude_writer(self) -> None:
        """Claude Agent SDK transcript appends of one entry each; a failed one is sent again
        with the same uuid (the adapter stores a uuid once however often it is sent)."""
        import httpx

        me = self.claude
        assert me is not None
        slot = self.rng.randrange(len(self.slots))
        i = 0
        with httpx.Client(timeout=15) as c:
            while not self.stop_event.is_set():
                uid = f"c{i}"
                body = {"key": self.claude_key, "entries": [{"type": "user", "uuid": uid, "n": i}]}
                r = self._post(me, c, slot, "/v1/claude/append", body, JSON)
                if r is not None and r.status_code == 204:
                    me.acks.append(time.monotonic())
                    self.claude_sent.append(uid)
                    i += 1
                    slot = self.rng.randrange(len(self.slots))
                    time.sleep(self.pace_s)
                elif r is None or r.status_code >= 500:
                    me.retries += 1
                    slot = (slot + 1) % len(self.slots)
                    time.sleep(0.05)
                else:
                    me.errors.append(f"{uid}: {r.status_code} {r.text[:200]}")
                    time.sleep(0.2)
        self.claude_pending = [f"c{i}"]  # sent, perhaps stored, never acknowledged

    def _follow(self) -> None:
        """Long-polls from the start, through either process, until it has the final tail."""
        import httpx

        me = self.follower
        slot = 0
        offset = "-1"
        with httpx.Client(timeout=15) as c:
            while not (self._follow_target is not None and offset == self._follow_target):
                try:
                    r = c.get(self.slots[slot].url + STREAM_ROOT + self.stream,
                              params={"offset": offset, "live": "long-poll"})
                except httpx.TransportError:
                    r = None
                me.attempts += 1
                if r is not None and r.status_code in (200, 204):
                    if r.status_code == 200:
                        self.followed.extend(r.json())
                        me.acks.append(time.monotonic())
                    offset = r.headers.get("stream-next-offset", offset)
                elif r is None or r.status_code >= 500:
                    me.retries += 1
                    slot = (slot + 1) % len(self.slots)
                    time.sleep(0.05)
                else:
                    me.errors.append(f"offset {offset}: {r.status_code} {r.text[:200]}")
                    time.sleep(0.2)

    def _read_all(self, stream: str = "") -> tuple[list[Any], str]:
        """The whole stream through a live process, and its tail offset."""
        import httpx

        out: list[Any] = []
        offset = "-1"
        with httpx.Client(timeout=120) as c:
            for _ in range(10_000):
                slot = next((s for s in self.slots if s.alive()), self.slots[0])
                try:
                    r = c.get(slot.url + STREAM_ROOT + (stream or self.stream), params={"offset": offset})
                except httpx.HTTPError as exc:
                    raise AssertionError(f"GET {stream or self.stream} at {offset} through {slot.name}: {exc!r}")
                assert r.status_code == 200, r.text
                out.extend(r.json())
                offset = r.headers["stream-next-offset"]
                if r.headers.get("stream-up-to-date") == "true":
                    return out, offset
        raise AssertionError("the stream never said it was up to date")


def _entry(eid: str, parent: str | None) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent, "timestamp": "2026-11-28T00:00:00.000Z",
            "message": {"role": "user", "content": eid}}


# --- the verdict -----------------------------------------------------------------------------


@dataclass
class Verdict:
    problems: list[str]
    figures: dict[str, float]


def progress(c: Client) -> list[float]:
    """When a writer's appends were answered for good. The If-Match writer's progress is an
    answer that decides (a 412 too): a writer without If-Match may outpace it for long."""
    return c.decided if c.name == "if-match" else c.acks


def wait_for_progress(work: Workload, since: float, within_s: float) -> None:
    """Returns once every writer has progressed after ``since`` (the last fault's end), or
    ``within_s`` after it: ``judge`` says which writer did not, and how long it took."""
    deadline = since + within_s
    while time.monotonic() < deadline and not all(any(t > since for t in progress(c)) for c in work.writers):
        time.sleep(0.1)


def judge(work: Workload, nemesis: Nemesis, store: Any, *, progress_within_s: float = 5.0) -> Verdict:
    """Acknowledged appends lost, duplicated or out of order; the follower against the stream;
    the session's history (tests/history.py); the Claude transcript; and, for each fault, how
    long after it ended each writer's next acknowledgement came."""
    from history import check_history

    problems: list[str] = []
    try:
        messages, _ = work._read_all()
        lone, _ = work._read_all(work.lone)
    except (AssertionError, OSError) as exc:
        problems.append(f"the streams could not be read: {exc!r}")
        messages = lone = []
    lost = duplicated = 0
    for p in work.producers:
        seqs = [m["s"] for m in (lone if p.name == "lone" else messages) if m.get("p") == p.name]
        acked = len(p.acks)
        dup = len(seqs) - len(set(seqs))
        duplicated += dup
        missing = sorted(set(range(acked)) - set(seqs))
        lost += len(missing)
        if dup:
            problems.append(f"{p.name}: {dup} message(s) stored twice")
        if missing:
            problems.append(f"{p.name}: acknowledged seqs {missing[:10]} lost")
        if seqs != sorted(set(seqs)):
            problems.append(f"{p.name}: stored out of order: {seqs[:30]}")
        allowed = set(range(acked)) | {work.pending.get(p.name, acked)}
        if set(seqs) - allowed:
            problems.append(f"{p.name}: seqs nobody sent: {sorted(set(seqs) - allowed)[:10]}")
    strangers = [m for m in messages if m.get("p") not in {p.name for p in work.producers}]
    strangers += [m for m in lone if m.get("p") != "lone"]
    if strangers:
        problems.append(f"messages nobody sent: {strangers[:5]}")
    if work.followed != messages:
        problems.append(f"the follower saw {len(work.followed)} messages, the stream holds {len(messages)}; "
                        f"first difference at {_first_difference(work.followed, messages)}")
    sid = store.layout.stream_id(work.session)
    report = check_history(store, [dataclasses.replace(op, session=sid) for op in work.session_ops])
    problems += [f"session: {p}" for p in report.problems + report.errors]
    if work.claude is not None:
        loaded = _claude_load(work)
        uuids = [e["uuid"] for e in loaded]
        if len(uuids) != len(set(uuids)):
            problems.append("claude: a uuid stored twice")
            duplicated += len(uuids) - len(set(uuids))
        if uuids[: len(work.claude_sent)] != work.claude_sent or set(uuids) - set(work.claude_sent) - set(work.claude_pending):
            problems.append(f"claude: stored {uuids[:20]}..., acknowledged {work.claude_sent[:20]}...")
            lost += len(set(work.claude_sent) - set(uuids))
    for c in work.writers + [work.follower]:
        problems += [f"{c.name}: {e}" for e in c.errors[:5]]
    # Progress after the last fault, and recovery after each.
    end = nemesis.last_end
    for c in work.writers:
        after = [t for t in progress(c) if t > end]
        if not after or after[0] - end > progress_within_s:
            waited = f"{after[0] - end:.1f}s" if after else "never"
            requests = [f"+{a - end:.2f}..+{b - end:.2f}s {s}: {st}" for a, b, s, st in c.recent if b > end - 3]
            problems.append(f"{c.name}: no acknowledged append within {progress_within_s}s of the last "
                            f"fault's end (next one: {waited}); its requests from 3 s before: {requests[:40]}")
    recovery = []
    for f in nemesis.faults:
        for c in work.writers:
            nxt = next((t for t in progress(c) if t > f.t1), None)
            recovery.append((nxt if nxt is not None else time.monotonic()) - f.t1)
    stalls = [_longest_gap(progress(c)) for c in work.writers]
    crashed = [f for f in nemesis.faults if f.kind == "exit"]
    if crashed:
        problems.append(f"a process exited by itself: {crashed}")
    if nemesis.unreached:
        problems.append(f"armed points never reached: {nemesis.unreached}")
    kinds: dict[str, float] = {}
    for f in nemesis.faults:
        kinds[f"faults.{f.kind}"] = kinds.get(f"faults.{f.kind}", 0) + 1
    figures = {
        "appends_acknowledged": float(sum(len(c.acks) for c in work.writers)),
        "stream_appends_acknowledged": float(sum(len(p.acks) for p in work.producers)),
        "session_appends_acknowledged": float(sum(len(c.acks) for c in work.session_writers)),
        "session_conflicts": float(report.conflicts),
        "claude_appends_acknowledged": float(len(work.claude.acks) if work.claude else 0),
        "retries": float(sum(c.retries for c in work.writers)),
        "kills": float(len(nemesis.faults)),
        **kinds,
        "lost": float(lost),
        "duplicated": float(duplicated),
        "follower_messages": float(len(work.followed)),
        "recovery_max_s": max(recovery, default=0.0),
        "recovery_p99_s": _nearest_rank(recovery, 0.99),
        "recovery_p50_s": _nearest_rank(recovery, 0.50),
        "longest_stall_s": max(stalls, default=0.0),
        **{f"longest_stall_s.{c.name}": _longest_gap(progress(c)) for c in work.writers},
        "last_fault_to_progress_s": max(
            ((next((t for t in progress(c) if t > end), time.monotonic()) - end) for c in work.writers), default=0.0),
        "problems": float(len(problems)),
    }
    return Verdict(problems, figures)


def _claude_load(work: Workload) -> list[dict[str, Any]]:
    import httpx

    slot = next((s for s in work.slots if s.alive()), work.slots[0])
    r = httpx.post(slot.url + "/v1/claude/load", content=json.dumps({"key": work.claude_key}), headers=JSON,
                   timeout=30)
    assert r.status_code == 200, r.text
    return list(r.json()["entries"] or [])


def _longest_gap(times: list[float]) -> float:
    return max((b - a for a, b in zip(times, times[1:])), default=0.0)


def _nearest_rank(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.999999) - 1))]


def _first_difference(a: list[Any], b: list[Any]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@contextmanager
def started(slots: Sequence[ServeSlot]) -> Iterator[Sequence[ServeSlot]]:
    """Every slot started; every one stopped afterwards, whatever happened."""
    try:
        for s in slots:
            s.start()
        yield slots
    finally:
        for s in slots:
            s.stop()


if __name__ == "__main__":
    _serve_main(sys.argv[1:])
