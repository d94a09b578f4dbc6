"""Pausing a process at a point of a protocol, in tests: a clock that moves only when told,
a fault hook that stops the calling thread until released, and a thread whose result (or
exception) the test collects."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class FakeClock:
    """Epoch ms that moves only when told to; starts at the real time (headers carry real
    creation times, which GC compares with this clock)."""

    def __init__(self) -> None:
        self.ms = int(time.time() * 1000)
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return self.ms

    def advance(self, ms: int) -> None:
        with self._lock:
            self.ms += ms


class Pause:
    """A fault hook that stops the calling thread at one point until released."""

    def __init__(self, point: str, when: Callable[[dict[str, Any]], bool] = lambda ctx: True) -> None:
        self.point = point
        self.when = when
        self.reached = threading.Event()
        self.go = threading.Event()
        self.fired = False
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, point: str, ctx: dict[str, Any]) -> None:
        self.seen.append((point, dict(ctx)))
        if point == self.point and not self.fired and self.when(ctx):
            self.fired = True
            self.reached.set()
            assert self.go.wait(120), "never released"

    def wait_paused(self) -> None:
        assert self.reached.wait(60), f"never reached {self.point}"

    def release(self) -> None:
        self.go.set()


class InThread:
    """Run ``fn`` in a thread; ``result()`` returns its value or raises its exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                self._error = exc

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def waiting(self, seconds: float) -> bool:
        """Still running after ``seconds`` (blocked, as a test expects of it)."""
        self._thread.join(seconds)
        return self._thread.is_alive()

    def result(self, timeout: float = 120) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the paused operation never finished"
        if self._error is not None:
            raise self._error
        return self._value


__all__ = ["FakeClock", "InThread", "Pause"]
