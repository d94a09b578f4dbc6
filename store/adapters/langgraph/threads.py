"""The thread sessions of one saver: their folds, their compare-and-set appends, the run index.

``SessionStoreSaver`` (``saver.py``) says what LangGraph means; this module is how it reaches
the store. Each thread's fold (``records.ThreadFold``) is kept per process (``cached``
threads, least recently used dropped) and brought up to date by reading only the segments it
lacks. :meth:`Threads.append` is the one write path: read what is new, build the batch from
the fold (the build may refuse), and append it with ``expected_tail_entry_id`` = the tail it
was built from, chained to it; a lost compare-and-set (another writer appended, the thread
was deleted) reads and builds again. So a batch lands right after exactly what it was
checked against, whatever pauses: a writer that pauses between its check and its write
finds the tail moved when it resumes (at CHECK, at its PUT, or at COMMIT as a zombie) and
checks again.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from store import EMPTY_TAIL, AppendResult, Retention, SessionFilter, SessionStore
from store.adapters.langgraph.records import (
    DROP_TYPE,
    HEADER_KEY,
    ThreadFold,
    custom,
    digest_id,
    run_entry,
)
from store.adapters.names import session_id_for
from store.clock import iso_now
from store.errors import (
    ConflictError,
    ContentionError,
    IdCollisionError,
    IndeterminateError,
    InvalidInputError,
    SessionExistsError,
    SessionNotFoundError,
)

#: Rounds of compare-and-set lost to other writers before ``ContentionError``.
CAS_ROUNDS = 64
_LOCK_STRIPES = 64


class Threads:
    """The store sessions of one saver's threads (``namespace``), in ``store``."""

    def __init__(self, store: SessionStore, namespace: str, *, ttl_ms: int | None, cached: int) -> None:
        self.store = store
        self.namespace = namespace
        self.ttl_ms = ttl_ms
        #: The cwd of every thread session (``list(None)`` lists the sessions that have it).
        self.cwd = f"langgraph:{namespace}"
        self._cached = cached
        self._folds: OrderedDict[str, ThreadFold] = OrderedDict()
        self._folds_lock = threading.Lock()
        self._locks = [threading.RLock() for _ in range(_LOCK_STRIPES)]
        self._runs_sid = session_id_for("langgraph", "runs", namespace=namespace)
        self._runs_written: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._runs_lock = threading.Lock()
        self._runs_fold: tuple[str | None, int, dict[str, set[str]]] = (None, 0, {})

    def session_id(self, thread_id: object) -> str:
        return session_id_for("langgraph", "thread", thread_key(thread_id), namespace=self.namespace)

    def every_thread(self) -> Iterator[str]:
        """The session id of every thread of the namespace (a walk over the store's listing)."""
        for info in self.store.iter_sessions(filters=SessionFilter(cwd=self.cwd)):
            yield info.session_id


    def lock(self, sid: str) -> threading.RLock:
        # Writes of this process to one thread go one at a time (they would only refuse each
        # other); other processes are ordered by the store's compare-and-set.
        return self._locks[hash(sid) % _LOCK_STRIPES]  # type: ignore[return-value]

    def refresh(self, sid: str, *, probe: bool = True) -> ThreadFold | None:
        """The thread's fold, brought up to date by reading only the segments it lacks; None
        when the thread has no store session (or it is in the trash). Under the sid's lock.
        ``probe=False`` for a write: up to Redis's tail only, no GET past it (the write's
        compare-and-set meets a segment Redis has not heard of, and the write reads again)."""
        with self._folds_lock:
            fold = self._folds.get(sid)
        try:
            changes = self.store.read_since(
                sid, incarnation=fold.incarnation if fold else None, after_seq=fold.seq if fold else 0,
                probe=probe,
            )
        except SessionNotFoundError:
            self.forget(sid)
            return None
        if fold is None or changes.whole:
            fold = ThreadFold(changes.header.incarnation)
            named = (changes.header.pi_header or {}).get(HEADER_KEY) or {}
            fold.thread_id = named.get("thread")
            fold.named = bool(fold.thread_id)
        fold.apply(changes.entries)
        fold.seq = changes.seq
        with self._folds_lock:
            self._folds[sid] = fold
            self._folds.move_to_end(sid)
            while len(self._folds) > self._cached:
                self._folds.popitem(last=False)
        return fold

    def forget(self, sid: str) -> None:
        with self._folds_lock:
            self._folds.pop(sid, None)

    def append(
        self, sid: str, thread_id: str, build: Callable[[ThreadFold], list[dict[str, Any]]], *,
        create: bool = True,
    ) -> None:
        """Read what is new, ``build`` the batch from it (which may refuse), and append it
        after exactly the tail it was built from; a lost compare-and-set starts over."""
        with self.lock(sid):
            for _ in range(CAS_ROUNDS):
                fold = self.refresh(sid, probe=False)
                if fold is None:
                    if not create:
                        return
                    self.create(sid, thread_id)
                    continue
                entries = build(fold)
                if not entries:
                    return
                parent: str | None = fold.last or None
                for entry in entries:
                    entry["parentId"] = parent
                    parent = entry["id"]
                try:
                    result = self.send(sid, entries, fold.last or EMPTY_TAIL)
                except (ConflictError, IdCollisionError, SessionNotFoundError):
                    continue  # moved (or deleted) meanwhile: read again, check again
                if result.seq == fold.seq + 1 and result.segment_entries == len(entries):
                    fold.apply(entries)  # the segment is this batch alone: the fold is current
                    fold.seq = result.seq
                return
        raise ContentionError(f"thread session {sid!r}: {CAS_ROUNDS} rounds lost to other writers")

    def send(self, sid: str, entries: list[dict[str, Any]], expected: str | None) -> AppendResult:
        """One batch; an unknown outcome is answered by sending the same batch again."""
        for attempt in range(6):
            try:
                return self.store.append_session_entries(sid, entries, expected)
            except IndeterminateError:
                if attempt == 5:
                    raise
                time.sleep(min(0.05 * 2**attempt, 1.0) * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    def create(self, sid: str, thread_id: str, *, cwd: str | None = None) -> None:
        pi_header = {"type": "session", "version": 3, "id": sid, "timestamp": iso_now(),
                     "cwd": cwd or self.cwd, HEADER_KEY: {"thread": thread_id, "namespace": self.namespace}}
        retention = sliding(self.ttl_ms) if self.ttl_ms is not None and cwd is None else None
        with contextlib.suppress(SessionExistsError):
            self.store.create_session(sid, cwd=cwd or self.cwd, pi_header=pi_header, retention=retention)

    def drop(self, thread_id: str, which: Callable[[ThreadFold], list[str]]) -> None:
        def build(fold: ThreadFold) -> list[dict[str, Any]]:
            dropped = which(fold)
            return [custom(DROP_TYPE, digest_id("d", dropped), {"entries": dropped})] if dropped else []

        self.append(self.session_id(thread_id), thread_key(thread_id), build, create=False)

    # --- the run index -----------------------------------------------------------------------

    def record_run(self, run_id: str, thread_id: str) -> None:
        """Name the thread in the run index before the run's first checkpoint in it, so a
        writer that dies in between leaves an extra name, never a missing one."""
        key = (run_id, thread_id)
        with self._runs_lock:
            if key in self._runs_written:
                return
        entry = run_entry(run_id, thread_id)
        for _ in range(2):
            try:
                self.send(self._runs_sid, [entry], None)
                break
            except IdCollisionError:
                break  # named before, by another writer (the record differs by its timestamp)
            except SessionNotFoundError:
                self.create(self._runs_sid, "", cwd=f"langgraph-runs:{self.namespace}")
        with self._runs_lock:
            self._runs_written[key] = None
            while len(self._runs_written) > 4096:
                self._runs_written.popitem(last=False)

    def threads_of(self, runs: set[str]) -> set[str]:
        with self._runs_lock:
            incarnation, seq, index = self._runs_fold
            try:
                changes = self.store.read_since(self._runs_sid, incarnation=incarnation, after_seq=seq)
            except SessionNotFoundError:
                return set()
            if changes.whole:
                index = {}
            for entry in changes.entries:
                data = entry.get("data") or {}
                if isinstance(data.get("run"), str) and isinstance(data.get("thread"), str):
                    index.setdefault(data["run"], set()).add(data["thread"])
            self._runs_fold = (changes.header.incarnation, changes.seq, index)
            return set().union(*(index.get(run, set()) for run in runs))


def thread_key(thread_id: object) -> str:
    if thread_id is None or thread_id == "":
        raise InvalidInputError("a LangGraph config needs configurable.thread_id")
    return str(thread_id)


def sliding(ttl_ms: int) -> Retention:
    return Retention.sliding(ttl_ms)


__all__ = ["CAS_ROUNDS", "Threads", "sliding", "thread_key"]
