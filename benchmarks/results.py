"""Every figure of a run, its targets, and the machine it ran on.

``Results.figures`` is flat (``"append.b1.store.p50_ms": 12.3``) so that a reader, a plot and
the smoke test can all find a figure by name; ``Results.details`` keeps the structured data
(full summaries, per-phase rates, request counts) behind it.
"""

from __future__ import annotations

import math
import os
import platform
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.backends import REPO_ROOT


@dataclass
class Target:
    name: str
    figure: str  # the ratio figure the target is about
    limit: float
    op: str  # "<=" or ">="
    value: float = math.nan
    note: str = ""
    #: How the limit is written in the table ("x" for a ratio, " ms" for a time, "" for a count).
    unit: str = "x"

    @property
    def met(self) -> bool | None:
        if self.value is None or math.isnan(self.value):
            return None
        return self.value <= self.limit if self.op == "<=" else self.value >= self.limit

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "figure": self.figure,
            "limit": self.limit,
            "op": self.op,
            "value": _clean(self.value),
            "met": self.met,
            "note": self.note,
        }


@dataclass
class Row:
    """One line of the printed table."""

    scenario: str
    case: str
    store: str
    floor: str
    ratio: str
    target: str = ""
    met: str = ""


@dataclass
class Results:
    figures: dict[str, float] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def fig(self, name: str, value: float, unit: str = "") -> float:
        self.figures[name] = float(value)
        if unit:
            self.units[name] = unit
        return float(value)

    def target(self, name: str, figure: str, op: str, limit: float, note: str = "", unit: str = "x") -> Target:
        t = Target(name, figure, limit, op, self.figures.get(figure, math.nan), note, unit)
        self.targets.append(t)
        return t

    def row(self, *cells: str, target: Target | None = None) -> None:
        scenario, case, store, floor, ratio = cells
        met = ""
        tgt = ""
        if target is not None:
            tgt = f"{target.op} {target.limit:g}{target.unit}"
            met = {True: "met", False: "NOT met", None: "n/a"}[target.met]
        self.rows.append(Row(scenario, case, store, floor, ratio, tgt, met))


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_implementation() + " " + platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal"):
                    info["mem_total_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
                    break
    except OSError:
        pass
    return info


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return rev + ("+dirty" if dirty else "") if rev else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def to_json(results: Results, meta: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = _clean(
        {
            "meta": meta,
            "figures": results.figures,
            "units": results.units,
            "targets": [t.to_json() for t in results.targets],
            "table": [r.__dict__ for r in results.rows],
            "notes": results.notes,
            "timings_s": results.timings,
            "details": results.details,
        }
    )
    return data


def table_markdown(results: Results) -> str:
    header = ["scenario", "case", "store", "floor (same run)", "store / floor", "target", ""]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results.rows:
        lines.append(f"| {r.scenario} | {r.case} | {r.store} | {r.floor} | {r.ratio} | {r.target} | {r.met} |")
    return "\n".join(lines)


def table_text(results: Results) -> str:
    header = ("scenario", "case", "store", "floor", "store/floor", "target", "")
    rows = [header] + [(r.scenario, r.case, r.store, r.floor, r.ratio, r.target, r.met) for r in results.rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    out = []
    for k, row in enumerate(rows):
        out.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def fmt_ms(x: float) -> str:
    if x is None or math.isnan(x):
        return "-"
    if x >= 1000:
        return f"{x / 1000:.2f} s"
    if x >= 100:
        return f"{x:.0f} ms"
    if x >= 10:
        return f"{x:.1f} ms"
    return f"{x:.2f} ms"


def fmt_ratio(x: float, ci: tuple[float, float] | None = None) -> str:
    if x is None or math.isnan(x):
        return "-"
    if ci and not any(math.isnan(c) for c in ci):
        return f"{x:.2f}x [{ci[0]:.2f}-{ci[1]:.2f}]"
    return f"{x:.2f}x"


def fmt_rate(x: float, unit: str = "/s") -> str:
    if x is None or math.isnan(x):
        return "-"
    return f"{x:,.0f}{unit}" if x >= 100 else f"{x:.1f}{unit}"


def write_files(out_dir: Path, run_id: str, data: dict[str, Any], markdown: str) -> dict[str, Path]:
    import orjson

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{run_id}.json", "latest_json": out_dir / "latest.json", "md": out_dir / "latest.md"}
    blob = orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    paths["json"].write_bytes(blob)
    paths["latest_json"].write_bytes(blob)
    paths["md"].write_text(markdown + "\n")
    return paths
