"""The run's picture: resume time and append cost against session size (matplotlib, optional)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def _series(figures: dict[str, float], sizes: list[int], pattern: str) -> tuple[list[int], list[float]]:
    xs: list[int] = []
    ys: list[float] = []
    for n in sizes:
        v = figures.get(pattern.format(n=n))
        if v is not None and not math.isnan(v) and v > 0:
            xs.append(n)
            ys.append(v)
    return xs, ys


def draw(data: dict[str, Any], path: Path) -> str | None:
    """Write the PNG; returns None, or why there is no plot (matplotlib missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'sessionstore[bench]')"
    figures: dict[str, float] = data["figures"]
    params = data["meta"]["params"]
    resume_sizes = sorted(int(n) for n in params["resume_sizes"])
    curve_sizes = sorted(set(resume_sizes) | {int(n) for n in params["curve_small_sizes"]})

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    styles = {
        "store, uncompacted": ("resume.{n}.uncompacted.store_ms", "tab:blue", "o-"),
        "store, compacted": ("resume.{n}.compacted.store_ms", "tab:cyan", "s-"),
        "floor (GET + parse)": ("resume.{n}.uncompacted.floor_ms", "black", "^--"),
        "naive JSON blob (+ context)": ("curve.{n}.naive_resume_ms", "tab:red", "x-"),
        "local file, pi (+ context)": ("local.{n}.resume_ms", "tab:green", "d:"),
    }
    for label, (pattern, color, fmt) in styles.items():
        sizes = curve_sizes if pattern.startswith("curve") else resume_sizes
        xs, ys = _series(figures, sizes, pattern)
        if xs:
            ax1.plot(xs, ys, fmt, color=color, label=label)
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.set_xlabel("session size (entries of ~1 KB)")
    ax1.set_ylabel("resume time, median (ms)")
    ax1.set_title("Resume: load + build_context")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)

    styles2 = {
        "store append": ("curve.{n}.store_append_ms", "tab:blue", "o-"),
        "floor (PUT + 1 Redis RTT)": ("curve.{n}.floor_ms", "black", "^--"),
        "naive JSON blob append": ("curve.{n}.naive_append_ms", "tab:red", "x-"),
    }
    for label, (pattern, color, fmt) in styles2.items():
        xs, ys = _series(figures, curve_sizes, pattern)
        if xs:
            ax2.plot(xs, ys, fmt, color=color, label=label)
    local = figures.get("local.append.p50_ms")
    if local and curve_sizes:
        ax2.plot([curve_sizes[0], curve_sizes[-1]], [local, local], ":", color="tab:green", label="local file append, pi (no fsync)")
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("session size before the append (entries)")
    ax2.set_ylabel("append of 1 entry, median (ms)")
    ax2.set_title("Append cost: O(1) segments vs O(n) rewrite")
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=8)

    meta = data["meta"]
    fig.suptitle(
        f"sessionstore {meta.get('git', '')} on {meta.get('backend', {}).get('kind', '?')}, "
        f"{meta['machine'].get('cpu_count', '?')} cores, {meta.get('started_at', '')}",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
