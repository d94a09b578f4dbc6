"""``WarmThreadPool``: the thread pool the asyncio API, the HTTP service and the Claude Agent
SDK store run the synchronous store on.

It is ``concurrent.futures.ThreadPoolExecutor`` with one difference that matters for latency:
a job goes to the thread that went idle *last*, and a thread counts as idle *before* the
caller hears of its result. ``ThreadPoolExecutor`` hands a job to whichever of its threads
the shared queue wakes, and marks a thread idle only after the result is out: a caller that
awaits each append before sending the next (an agent's turn) finds no idle thread now and
then, so the pool grows, and from then on consecutive jobs take turns on threads that have
slept longest, each one cold (its stack, its CPU's caches, often the other core). Here a
caller that runs one job at a time keeps one warm thread, and the others stay asleep;
measured on the embedded default's append through ``AsyncSessionStore``, 0.03-0.07 ms of
0.6 ms (docs/performance.md, "A warm thread").

Everything else is ``ThreadPoolExecutor``'s contract: at most ``max_workers`` jobs run at
once, the rest wait in order of submission; a future cancelled before its job starts never
runs it; ``shutdown(wait=True)`` lets the running and the waiting jobs finish (unless
``cancel_futures``) and joins the threads; a job submitted after it is refused
(``RuntimeError``); at interpreter exit the jobs still running finish first. And, which
``ThreadPoolExecutor`` is not, it is usable in a child made by ``fork``: the child's jobs
start threads of its own.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, Literal, TypeVar

T = TypeVar("T")

_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]

_live: weakref.WeakSet[_Pool] = weakref.WeakSet()
_exiting = False


class _Worker:
    __slots__ = ("job", "wake")

    def __init__(self, job: _Job) -> None:
        self.wake = threading.Lock()
        self.wake.acquire()  # released by whoever hands this thread its next job
        self.job: _Job | None = job


class WarmThreadPool(Executor):
    """A thread pool whose next job goes to the thread that went idle last (module doc).

    Its threads hold the pool's state, never the pool itself: a pool dropped without
    ``shutdown`` is collected, and its threads then end as at ``shutdown(wait=False)`` (as
    ``ThreadPoolExecutor``'s do), so an unclosed store does not keep threads for ever."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "sessionstore") -> None:
        if not isinstance(max_workers, int) or isinstance(max_workers, bool) or max_workers < 1:
            raise ValueError("max_workers must be a positive integer")
        self._pool = _Pool(max_workers, thread_name_prefix)
        weakref.finalize(self, self._pool.shutdown, False)

    @property
    def threads(self) -> int:
        """How many threads the pool has started (they are kept until shutdown)."""
        return len(self._pool._threads)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return self._pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait, cancel_futures=cancel_futures)


class _Pool:
    """The state and the threads of a ``WarmThreadPool``."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        self._max = max_workers
        self._prefix = thread_name_prefix
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []  # a stack: the last one to go idle is woken first
        self._waiting: deque[_Job] = deque()
        self._threads: list[threading.Thread] = []
        self._numbers = itertools.count()
        self._shutdown = False
        _live.add(self)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        job: _Job = (future, fn, args, kwargs)
        with self._lock:
            if self._shutdown or _exiting:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._idle:
                worker = self._idle.pop()
                worker.job = job
                worker.wake.release()
            elif len(self._threads) < self._max:
                worker = _Worker(job)
                thread = threading.Thread(
                    target=self._serve, args=(worker,), daemon=True,
                    name=f"{self._prefix}_{next(self._numbers)}",
                )
                thread.start()  # raises (RuntimeError) when no thread can be started
                self._threads.append(thread)
            else:
                self._waiting.append(job)
        return future

    def _serve(self, worker: _Worker) -> None:
        job = worker.job
        worker.job = None
        while job is not None:
            after = self._run(worker, job)
            if isinstance(after, tuple):
                job = after
            elif after == "asleep":
                job = None  # not kept alive (its arguments, its result) while asleep
                worker.wake.acquire()
                job, worker.job = worker.job, None  # None: woken by shutdown
            else:
                return

    def _run(self, worker: _Worker, job: _Job) -> _Job | Literal["asleep", "exit"]:
        """``job`` run (unless cancelled); then ``_after``, before the caller hears of it."""
        future, fn, args, kwargs = job
        if not future.set_running_or_notify_cancel():
            return self._after(worker)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - the caller's, as in the stdlib pool
            after = self._after(worker)
            future.set_exception(exc)
        else:
            after = self._after(worker)
            future.set_result(result)
        return after

    def _after(self, worker: _Worker) -> _Job | Literal["asleep", "exit"]:
        """What ``worker`` does once its job is done: the next waiting job; "exit" when the
        pool is shut down and nothing waits; else "asleep": it is idle (the next ``submit``
        may hand it a job from now on) and sleeps once its caller has the result."""
        with self._lock:
            if self._waiting:
                return self._waiting.popleft()
            if self._shutdown:
                return "exit"
            self._idle.append(worker)
        return "asleep"

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while self._waiting:
                    self._waiting.popleft()[0].cancel()
            idle, self._idle = self._idle, []
            threads = list(self._threads)
        for worker in idle:
            worker.job = None
            worker.wake.release()
        if wait:
            me = threading.current_thread()
            for thread in threads:
                if thread is not me:  # shut down from one of its own jobs: not itself
                    thread.join()


def _at_exit() -> None:
    """As ``ThreadPoolExecutor`` does at interpreter exit: no new jobs, and the ones running
    or waiting finish before the interpreter goes."""
    global _exiting
    _exiting = True
    for pool in list(_live):
        pool.shutdown(wait=True)


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's threads: each pool forgets them (and the jobs
    they were to run, which are the parent's), so that the child's jobs start threads of its
    own instead of waiting for threads that do not exist."""
    for pool in list(_live):
        pool._lock = threading.Lock()
        pool._idle = []
        pool._waiting = deque()
        pool._threads = []


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

_register = getattr(threading, "_register_atexit", None)
if _register is not None:  # CPython 3.9+: runs before the interpreter joins its threads
    _register(_at_exit)


__all__ = ["WarmThreadPool"]
