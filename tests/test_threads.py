"""``store.threads.WarmThreadPool``: a caller that runs one job at a time keeps one thread, and
otherwise the contract of ``concurrent.futures.ThreadPoolExecutor`` (bounded parallelism,
jobs waiting in order, cancellation, shutdown)."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import CancelledError, ThreadPoolExecutor, wait

import pytest

from store.threads import WarmThreadPool

WAIT_S = 30.0


def _sequential_threads(pool: ThreadPoolExecutor | WarmThreadPool, jobs: int) -> set[int]:
    """The threads that ran ``jobs`` jobs from an event loop, each awaited before the next is
    sent (an agent's turns)."""

    async def main() -> set[int]:
        loop = asyncio.get_running_loop()
        return {await loop.run_in_executor(pool, threading.get_ident) for _ in range(jobs)}

    return asyncio.run(main())


def test_one_job_at_a_time_keeps_one_warm_thread() -> None:
    pool = WarmThreadPool(8, thread_name_prefix="t")
    try:
        assert len(_sequential_threads(pool, 5000)) == 1
        assert pool.threads == 1
    finally:
        pool.shutdown()


def test_the_job_goes_to_the_thread_that_went_idle_last() -> None:
    pool = WarmThreadPool(3)
    try:
        gate = threading.Event()
        started = threading.Barrier(4)

        def hold() -> int:
            started.wait(WAIT_S)
            gate.wait(WAIT_S)
            return threading.get_ident()

        futures = [pool.submit(hold) for _ in range(3)]
        started.wait(WAIT_S)
        gate.set()
        idents = [f.result(WAIT_S) for f in futures]
        assert len(set(idents)) == 3
        # All three are idle again (a thread counts as idle before its result is out).
        assert len({pool.submit(threading.get_ident).result(WAIT_S) for _ in range(200)}) == 1
    finally:
        pool.shutdown()


def test_at_most_max_workers_run_and_the_rest_wait_in_order() -> None:
    pool = WarmThreadPool(3)
    lock = threading.Lock()
    running = peak = 0
    order: list[int] = []

    def job(i: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            order.append(i)  # started
        time.sleep(0.01)
        with lock:
            running -= 1
        return i * i

    try:
        futures = [pool.submit(job, i) for i in range(30)]
        assert [f.result(WAIT_S) for f in futures] == [i * i for i in range(30)]
        assert peak == 3
        assert pool.threads == 3
        # Waiting jobs start in the order they were submitted (the first three at once).
        assert sorted(order[:3]) == [0, 1, 2] and order[3:] == list(range(3, 30))
    finally:
        pool.shutdown()


def test_max_workers_jobs_run_at_once() -> None:
    pool = WarmThreadPool(5)
    barrier = threading.Barrier(5)
    try:
        futures = [pool.submit(barrier.wait, WAIT_S) for _ in range(5)]
        assert sorted(f.result(WAIT_S) for f in futures) == [0, 1, 2, 3, 4]
    finally:
        pool.shutdown()


def test_errors_reach_the_caller_and_the_thread_goes_on() -> None:
    pool = WarmThreadPool(1)

    class Stop(BaseException):
        pass

    def fail(exc: BaseException) -> None:
        raise exc

    try:
        with pytest.raises(ValueError, match="bad"):
            pool.submit(fail, ValueError("bad")).result(WAIT_S)
        with pytest.raises(Stop):
            pool.submit(fail, Stop()).result(WAIT_S)
        assert pool.submit(lambda a, *, b: a + b, 2, b=3).result(WAIT_S) == 5
        assert pool.threads == 1
    finally:
        pool.shutdown()


def test_a_job_cancelled_while_waiting_never_runs() -> None:
    pool = WarmThreadPool(1)
    gate = threading.Event()
    ran: list[int] = []
    try:
        first = pool.submit(gate.wait, WAIT_S)
        second = pool.submit(ran.append, 2)
        third = pool.submit(ran.append, 3)
        assert second.cancel()
        gate.set()
        assert first.result(WAIT_S) is True
        assert third.result(WAIT_S) is None
        with pytest.raises(CancelledError):
            second.result(0)
        assert ran == [3]
    finally:
        pool.shutdown()


def test_shutdown_lets_running_and_waiting_jobs_finish_then_refuses_new_ones() -> None:
    pool = WarmThreadPool(2)
    done: list[int] = []

    def job(i: int) -> None:
        time.sleep(0.02)
        done.append(i)

    futures = [pool.submit(job, i) for i in range(6)]
    pool.shutdown(wait=True)
    assert sorted(done) == list(range(6))
    assert all(f.done() and f.exception() is None for f in futures)
    with pytest.raises(RuntimeError, match="shutdown"):
        pool.submit(job, 7)


def test_shutdown_cancel_futures_cancels_the_waiting_jobs() -> None:
    pool = WarmThreadPool(1)
    gate = threading.Event()
    running = pool.submit(gate.wait, WAIT_S)
    waiting = [pool.submit(time.sleep, 0) for _ in range(3)]
    closer = threading.Thread(target=pool.shutdown, kwargs={"wait": True, "cancel_futures": True})
    closer.start()
    time.sleep(0.05)
    assert closer.is_alive()  # waits for the running job
    gate.set()
    closer.join(WAIT_S)
    assert not closer.is_alive()
    assert running.result(0) is True
    assert all(f.cancelled() for f in waiting)


def test_shutdown_from_inside_a_job_does_not_wait_for_itself() -> None:
    pool = WarmThreadPool(2)
    future = pool.submit(pool.shutdown, wait=True)
    assert future.result(WAIT_S) is None
    with pytest.raises(RuntimeError):
        pool.submit(time.sleep, 0)


def _named(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix + "_")]


def test_idle_threads_end_at_shutdown() -> None:
    pool = WarmThreadPool(4, thread_name_prefix="t-idle")
    futures = [pool.submit(time.sleep, 0.05) for _ in range(4)]
    wait(futures, WAIT_S)
    threads = _named("t-idle")
    assert len(threads) == 4
    pool.shutdown(wait=True)
    assert not [t for t in threads if t.is_alive()]


def test_jobs_still_running_at_interpreter_exit_finish() -> None:
    code = (
        "import time, sys\n"
        "from store.threads import WarmThreadPool\n"
        "pool = WarmThreadPool(2)\n"
        "pool.submit(time.sleep, 0)\n"  # an idle thread: must not hold up the exit
        "def job():\n"
        "    time.sleep(0.3)\n"
        "    print('finished', flush=True)\n"
        "pool.submit(job)\n"
        "print('exiting', flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=WAIT_S)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["exiting", "finished"]


def test_bad_max_workers_is_refused() -> None:
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(ValueError):
            WarmThreadPool(bad)  # type: ignore[arg-type]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork: POSIX only")
def test_a_forked_child_runs_its_jobs_on_threads_of_its_own() -> None:
    pool = WarmThreadPool(2)
    try:
        parent = pool.submit(threading.get_ident).result(WAIT_S)  # an idle thread, forked away
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, and exit without running the parent's cleanup
            ok = 1
            try:
                got = [pool.submit(os.getpid).result(10) for _ in range(3)]  # not a hang
                ok = 0 if got == [os.getpid()] * 3 else 2
            except BaseException:  # noqa: BLE001 - a hang (TimeoutError) or anything: say so
                ok = 1
            os.write(write, bytes([ok]))
            os._exit(0)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        assert os.read(read, 1) == b"\x00"
        os.close(read)
        assert os.waitstatus_to_exitcode(status) == 0
        assert pool.submit(threading.get_ident).result(WAIT_S) == parent  # the parent's own goes on
    finally:
        pool.shutdown()


def test_a_pool_dropped_without_shutdown_lets_its_threads_end() -> None:
    pool = WarmThreadPool(3, thread_name_prefix="t-dropped")
    gate = threading.Event()
    futures = [pool.submit(gate.wait, WAIT_S) for _ in range(3)]  # three threads started
    gate.set()
    wait(futures, WAIT_S)
    threads = _named("t-dropped")
    assert len(threads) == 3
    del pool, futures
    gc.collect()
    for thread in threads:
        thread.join(WAIT_S)
    assert not [t for t in threads if t.is_alive()]
