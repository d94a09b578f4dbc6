"""One demo worker: a process that plays agents on whatever session it is handed.

Each job names a session; the worker opens it by id (as another machine would: nothing is
shared but the object store and Redis), continues from its leaf with a scripted turn (a user
message, an assistant message with ``toolCall`` blocks, the ``toolResult`` messages, a final
answer, all in pi's shapes) and reports back. Every append goes through ``RecordingStore``,
which logs the batch's ids, its expected tail and its outcome, so that the main process can
check afterwards that the store kept every promise (``store.demo.check``).
"""

from __future__ import annotations

import os
import random
import signal
import time
import traceback
from collections.abc import Sequence
from typing import IO, Any

import orjson

from store.clock import now_ms as _ms
from store.errors import ConflictError, IndeterminateError, SessionStoreError

#: Scripted tasks: (user prompt, [(tool, arguments, result text)], final answer).
TASKS: list[tuple[str, list[tuple[str, dict[str, Any], str]], str]] = [
    ("List the files in the repository.",
     [("bash", {"command": "ls -la"}, "total 24\n-rw-r--r-- README.md\n-rw-r--r-- app.py\n-rw-r--r-- test_app.py\n")],
     "Three files: README.md, app.py and its tests."),
    ("What does app.py do?",
     [("read", {"path": "app.py"}, "def greet(name):\n    return f'hello {name}'\n")],
     "app.py defines greet(name), which returns a greeting."),
    ("Run the tests.",
     [("bash", {"command": "python -m pytest -q"}, "4 passed in 0.03s\n")],
     "All 4 tests pass."),
    ("Fix the typo in the README.",
     [("read", {"path": "README.md"}, "# Helo app\n"),
      ("edit", {"path": "README.md", "oldText": "Helo", "newText": "Hello"}, "Applied 1 edit to README.md")],
     "Fixed: the title now reads 'Hello app'."),
    ("Are there any TODOs left?",
     [("grep", {"pattern": "TODO", "path": "."}, "app.py:7: # TODO: handle empty names\n")],
     "One: app.py line 7 should handle empty names."),
    ("Handle empty names in greet().",
     [("edit", {"path": "app.py", "oldText": "return f'hello {name}'",
                "newText": "return f'hello {name or \"stranger\"}'"}, "Applied 1 edit to app.py"),
      ("bash", {"command": "python -m pytest -q"}, "5 passed in 0.03s\n")],
     "greet('') now says 'hello stranger'; the tests pass."),
    ("Show the last commits.",
     [("bash", {"command": "git log --oneline -3"}, "4f2a1c9 greet: empty names\n9d0e7b2 README typo\n1a2b3c4 first\n")],
     "The last three commits are the empty-name fix, the README typo and the first commit."),
]

MODEL = {"api": "anthropic-messages", "provider": "anthropic", "model": "claude-sonnet-4-5"}




def _usage(rng: random.Random) -> dict[str, Any]:
    inp, outp = rng.randint(800, 4000), rng.randint(40, 400)
    return {"input": inp, "output": outp, "cacheRead": 0, "cacheWrite": 0, "totalTokens": inp + outp,
            "cost": {"input": 0.0, "output": 0.0, "cacheRead": 0.0, "cacheWrite": 0.0, "total": 0.0}}


def user_message(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": _ms()}


def assistant_message(text: str, calls: Sequence[tuple[str, str, dict[str, Any]]], rng: random.Random) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if text:
        content.append({"type": "text", "text": text})
    for call_id, name, args in calls:
        content.append({"type": "toolCall", "id": call_id, "name": name, "arguments": args})
    return {"role": "assistant", "content": content, **MODEL, "usage": _usage(rng),
            "stopReason": "toolUse" if calls else "stop", "timestamp": _ms()}


def tool_result(call_id: str, name: str, text: str) -> dict[str, Any]:
    return {"role": "toolResult", "toolCallId": call_id, "toolName": name,
            "content": [{"type": "text", "text": text}], "isError": False, "timestamp": _ms()}


class RecordingStore:
    """The store as ``SessionManager`` sees it, logging every append and its outcome.

    One JSON line per append: session, ids, expected tail, outcome (ok / conflict /
    indeterminate / error:<class>) and the acknowledged segment. Written and flushed before
    the outcome is acted on, so a crash loses no acknowledged record.
    """

    def __init__(self, store: Any, log: IO[bytes]) -> None:
        self.store = store
        self.log = log
        self.appends = 0
        self.conflicts = 0

    def record(self, op: dict[str, Any]) -> None:
        self.log.write(orjson.dumps(op) + b"\n")
        self.log.flush()

    def append_session_entries(self, session_id: str, entries: Sequence[dict[str, Any]],
                               expected_tail_entry_id: str | None = None) -> Any:
        op: dict[str, Any] = {"session": session_id, "ids": [e["id"] for e in entries],
                              "expected": expected_tail_entry_id, "outcome": "ok", "seq": 0}
        try:
            result = self.store.append_session_entries(session_id, entries, expected_tail_entry_id)
            op["seq"] = result.seq
            self.appends += 1
            return result
        except ConflictError as exc:
            op["outcome"] = "conflict"
            op["actual_tail"] = exc.actual_tail_entry_id
            self.conflicts += 1
            raise
        except IndeterminateError:
            op["outcome"] = "indeterminate"
            raise
        except SessionStoreError as exc:
            op["outcome"] = f"error:{type(exc).__name__}:{exc}"
            raise
        finally:
            self.record(op)

    def load_session(self, session_id: str) -> Any:
        return self.store.load_session(session_id)


class Agent:
    """Plays scripted turns through pi's SessionManager API."""

    def __init__(self, worker: int, store: Any, recorder: RecordingStore, seed: int) -> None:
        self.worker = worker
        self.store = store
        self.rec = recorder
        self.rng = random.Random(seed * 1000 + worker)

    def manager(self, sid: str, strict: bool) -> Any:
        from store.manager import SessionManager

        # The recorder stands in for the store: the manager only loads and appends.
        return SessionManager(self.rec, sid, strict=strict)  # type: ignore[arg-type]

    # --- one turn ------------------------------------------------------------------------------

    def turn(self, job: dict[str, Any]) -> dict[str, Any]:
        sid = job["session"]
        strict = bool(job.get("strict"))
        mgr = self.manager(sid, strict)
        start_at = job.get("start_at")
        if start_at:
            # A race on purpose: both workers of a double turn opened the session (same
            # leaf) before either writes.
            time.sleep(max(0.0, start_at - time.time()))
        info: dict[str, Any] = {}
        if job.get("branch_summary"):
            # Go back to before the last user message (abandoning that turn) and summarise it.
            branch = mgr.get_branch()
            users = [e for e in branch if e.get("type") == "message" and e["message"].get("role") == "user"]
            target = (users[-1].get("parentId") or users[0]["id"]) if users else mgr.get_leaf_id()
            self._retrying(mgr, lambda: mgr.branch_with_summary(
                target, "Tried a refactor of greet() first; reverted it: the tests relied on the old output."))
            info["branch_summary"] = True
        if job.get("context_compaction"):
            branch = mgr.get_branch()
            keep = next((e["id"] for e in reversed(branch)
                         if e.get("type") == "message" and e["message"].get("role") == "user"), None)
            if keep is not None:
                self._retrying(mgr, lambda: mgr.append_compaction(
                    "The user asked for a tour of the repository, tests were run and a typo was fixed.",
                    keep, self.rng.randint(20_000, 90_000)))
                info["context_compaction"] = True
        task = TASKS[(job["turn"] + self.rng.randint(0, len(TASKS) - 1)) % len(TASKS)]
        prompt, tools, answer = task
        if job.get("secret"):
            # A tool result leaks a token; a later turn (another worker) redacts it.
            prompt, tools, answer = (
                "Check the deploy configuration.",
                [("bash", {"command": "cat .env"}, f"DEPLOY_TOKEN={job['secret']}\nREGION=eu-west-1\n")],
                "The deploy config sets a token and the region eu-west-1.",
            )
        if job.get("batch"):
            # The whole turn as one atomic segment: readers see all of it or none of it.
            def whole() -> None:
                with mgr.batch():
                    self._script(mgr, job, prompt, tools, answer)

            self._retrying(mgr, whole)
        else:
            self._script(mgr, job, prompt, tools, answer, step=lambda fn: self._retrying(mgr, fn))
        return info

    def _script(self, mgr: Any, job: dict[str, Any], prompt: str,
                tools: list[tuple[str, dict[str, Any], str]], answer: str, step: Any = None) -> None:
        do = step or (lambda fn: fn())
        turn = job["turn"]
        user_id = do(lambda: mgr.append_message(user_message(f"{prompt} (turn {turn})")))
        calls = [(f"toolu_{self.rng.getrandbits(48):012x}", name, args) for name, args, _ in tools]
        do(lambda: mgr.append_message(assistant_message("Let me look.", calls, self.rng)))
        for (call_id, name, _), (_, _, text) in zip(calls, tools, strict=True):
            do(lambda c=call_id, n=name, t=text: mgr.append_message(tool_result(c, n, t)))
        do(lambda: mgr.append_message(assistant_message(answer, [], self.rng)))
        if job.get("label") and user_id:
            do(lambda: mgr.append_label_change(user_id, f"turn {turn}"))

    def _retrying(self, mgr: Any, fn: Any) -> Any:
        """Run one step; a strict handle that lost the tail re-reads the session and retries."""
        for _ in range(50):
            try:
                return fn()
            except ConflictError:
                mgr.refresh()
                time.sleep(self.rng.uniform(0, 0.01))
        raise RuntimeError("a strict handle lost the tail 50 times in a row")

    # --- other jobs ----------------------------------------------------------------------------

    def fork(self, job: dict[str, Any]) -> dict[str, Any]:
        sid = job["session"]
        session = self.store.load_session(sid)
        branch = session.get_branch()
        point = next((e["id"] for e in reversed(branch)
                      if e.get("type") == "message" and e["message"].get("role") == "assistant"),
                     session.leaf_id)
        handle = self.store.branch_from_entry(sid, point, job["new_session"])
        mgr = self.manager(handle.session_id, strict=False)
        mgr.append_session_info(f"alternative to {session.name or sid}")
        return {"fork": {"session": handle.session_id, "source": sid, "entry": point}}

    def redact(self, job: dict[str, Any]) -> dict[str, Any]:
        sid = job["session"]
        secret = job["secret"]
        raw = self.store.load_session_entries(sid)
        target = next(e["id"] for e in raw if secret in orjson.dumps(e).decode())
        result = self.store.redact(sid, target, "a deploy token leaked into a tool result")
        # The redaction's own append is strict and retried inside the store; log what it
        # acknowledged (its expected tail is the store's business).
        self.rec.record({"session": sid, "ids": [result.last_appended_entry_id], "expected": None,
                         "outcome": "ok", "seq": result.seq})
        self.rec.appends += 1
        return {"redaction": {"session": sid, "entry": target, "redaction": result.last_appended_entry_id}}


def worker_main(cfg: dict[str, Any], inbox: Any, outbox: Any) -> None:
    """Entry point of a worker process (multiprocessing, spawn)."""
    from store.core import SessionStore

    # Ctrl-C reaches the whole process group: the main process handles it and stops the
    # workers in order; a worker must not die mid-append with a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker = int(cfg["worker"])
    store = None
    try:
        store = SessionStore.from_url(cfg["objects_url"], cfg["redis_url"], **cfg["store_options"])
        with open(cfg["log_path"], "ab") as log:
            rec = RecordingStore(store, log)
            agent = Agent(worker, store, rec, cfg["seed"])
            outbox.put({"kind": "ready", "worker": worker, "pid": os.getpid()})
            while True:
                job = inbox.get()
                if job is None:
                    break
                before_appends, before_conflicts = rec.appends, rec.conflicts
                result: dict[str, Any] = {"kind": "done", "job": job["id"], "worker": worker,
                                          "session": job["session"], "ok": True}
                try:
                    if job["kind"] == "turn":
                        result.update(agent.turn(job))
                    elif job["kind"] == "fork":
                        result.update(agent.fork(job))
                    elif job["kind"] == "redact":
                        result.update(agent.redact(job))
                except Exception as exc:  # reported to the main process, which fails the run
                    result["ok"] = False
                    result["error"] = f"{type(exc).__name__}: {exc}"
                    result["traceback"] = traceback.format_exc()
                result["appends"] = rec.appends - before_appends
                result["conflicts"] = rec.conflicts - before_conflicts
                outbox.put(result)
    except Exception as exc:
        outbox.put({"kind": "crashed", "worker": worker, "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()})
    finally:
        if store is not None:
            store.close()
