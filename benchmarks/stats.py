"""Exact percentiles, ratio confidence intervals and an open-loop driver.

Percentiles come from the exact sorted sample (nearest rank), never from an estimate: the
samples are few (hundreds), so keeping them all is cheap and exact. A ratio against its floor
comes with a bootstrap 95% interval, so a reader can tell a real gap from noise.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence


def percentile(sorted_xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted sample (q in 0..100)."""
    if not sorted_xs:
        return math.nan
    rank = max(1, math.ceil(q / 100.0 * len(sorted_xs)))
    return float(sorted_xs[min(rank, len(sorted_xs)) - 1])


def summarize(xs: Sequence[float], scale: float = 1000.0) -> dict[str, float]:
    """n, mean, min, p50, p90, p99, max of ``xs`` (seconds), scaled (default: to ms)."""
    s = sorted(xs)
    if not s:
        return {"n": 0, "mean": math.nan, "min": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan, "max": math.nan}
    return {
        "n": len(s),
        "mean": sum(s) / len(s) * scale,
        "min": s[0] * scale,
        "p50": percentile(s, 50) * scale,
        "p90": percentile(s, 90) * scale,
        "p99": percentile(s, 99) * scale,
        "max": s[-1] * scale,
    }


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    if not s:
        return math.nan
    mid = len(s) // 2
    return float(s[mid]) if len(s) % 2 else (s[mid - 1] + s[mid]) / 2.0


def ratio_ci(
    num: Sequence[float],
    den: Sequence[float],
    q: float = 50.0,
    *,
    resamples: int = 400,
    seed: int = 7,
) -> tuple[float, float]:
    """Bootstrap 95% interval of percentile_q(num) / percentile_q(den)."""
    if len(num) < 2 or len(den) < 2:
        return (math.nan, math.nan)
    rng = random.Random(seed)
    ratios: list[float] = []
    for _ in range(resamples):
        a = sorted(rng.choices(num, k=len(num)))
        b = sorted(rng.choices(den, k=len(den)))
        pb = percentile(b, q)
        if pb > 0:
            ratios.append(percentile(a, q) / pb)
    ratios.sort()
    if not ratios:
        return (math.nan, math.nan)
    return (percentile(ratios, 2.5), percentile(ratios, 97.5))


def sleep_until(deadline: float) -> None:
    """Sleep to a perf_counter deadline; spin the last half millisecond for accuracy."""
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        if left > 0.0015:
            time.sleep(left - 0.001)


@dataclass
class OpenLoopResult:
    #: completion - intended start (what a caller on a fixed schedule experiences)
    latency: dict[str, list[float]] = field(default_factory=dict)
    #: completion - actual start (the request alone)
    service: dict[str, list[float]] = field(default_factory=dict)
    interval: float = 0.0
    late_starts: int = 0


def open_loop(
    ops: dict[str, Callable[[int], object]],
    rounds: int,
    interval: float,
    *,
    seed: int = 1,
) -> OpenLoopResult:
    """Run every op ``rounds`` times on a fixed schedule, interleaved.

    Slot k starts at ``t0 + k * interval`` whatever happened before it, so a stall delays the
    slots behind it and shows up in their latency (no coordinated omission). In each round the
    ops run once each in a random order, so drift and noise hit the store and its floor alike.
    """
    names = list(ops)
    rng = random.Random(seed)
    out = OpenLoopResult(interval=interval)
    for name in names:
        out.latency[name] = []
        out.service[name] = []
    t0 = time.perf_counter() + 0.01
    slot = 0
    for r in range(rounds):
        order = names[:]
        rng.shuffle(order)
        for name in order:
            intended = t0 + slot * interval
            slot += 1
            now = time.perf_counter()
            if now < intended:
                sleep_until(intended)
            else:
                out.late_starts += 1
            start = time.perf_counter()
            ops[name](r)
            end = time.perf_counter()
            out.latency[name].append(end - intended)
            out.service[name].append(end - start)
    return out


def interleaved(
    ops: dict[str, Callable[[int], object]], rounds: int, *, seed: int = 1
) -> dict[str, list[float]]:
    """Closed loop: each op once per round, in a random order; the time of each call."""
    rng = random.Random(seed)
    names = list(ops)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[:]
        rng.shuffle(order)
        for name in order:
            start = time.perf_counter()
            ops[name](r)
            out[name].append(time.perf_counter() - start)
    return out
