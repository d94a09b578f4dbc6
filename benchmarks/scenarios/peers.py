"""Side by side with the frameworks' own session backends (``--only peers``; not in the
default run: it needs the adapters' extras, ``pip install -e '.[test]'`` has them all).

Each module of ``benchmarks/peers/`` runs one framework's default backend (files under a
temporary directory, as a user would start) and its sessionstore adapter (on this run's
backend) through the framework's own API, on the same workload: append latency, resume of 1k
and 10k items, and items lost with 2 and 4 writer processes on one session; LangGraph's
(``langgraph.py``) are checkpoint savers: put, latest checkpoint, list, copy, bytes, and two
processes racing on one checkpoint. The figures are named
``peers.<framework>.<backend>.<metric>``; a figure a backend cannot produce (a method it does
not have, a package not installed) is a row with no value and a ``note``, shown in the table
and never recorded as a number. ``--peers NAMES`` runs a subset of the frameworks.
"""

from __future__ import annotations

import importlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.context import Context

FRAMEWORKS = ("openai_agents", "adk", "strands", "claude_agent_sdk", "langgraph")


def run(ctx: Context) -> None:
    b, R = ctx.backend, ctx.results
    quick = ctx.params.profile == "smoke"
    rows: list[dict[str, Any]] = []
    for name in ctx.params.peers or FRAMEWORKS:
        module = importlib.import_module(f"benchmarks.peers.{name}")
        work = Path(tempfile.mkdtemp(prefix=f"ssbench-peers-{name}-"))
        try:
            ctx.log(f"peers: {name}")
            rows += module.run(b.objects_url, b.redis_url, work, quick=quick)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    for row in rows:
        if row["value"] is None:
            continue  # not measurable on that backend: the note goes to the table
        figure = f"peers.{row['framework']}.{row['backend']}.{row['metric']}"
        R.fig(figure, row["value"], row.get("unit", ""))
    R.details["peers"] = rows
    # One table row per (framework, metric): the adapter against the framework's default.
    by_key: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_key.setdefault((row["framework"], row["metric"]), {})[row["backend"]] = row
    for (framework, metric), sides in sorted(by_key.items()):
        ours = [r for k, r in sorted(sides.items()) if k.startswith("sessionstore")]
        theirs = [r for k, r in sorted(sides.items()) if not k.startswith("sessionstore")]
        for mine in ours or [None]:
            for other in theirs or [None]:
                variant = mine["backend"].removeprefix("sessionstore") if mine else ""
                R.row(
                    "peers",
                    f"{framework} {metric}{variant.replace('+', ' ')}"
                    + (f" vs {other['backend']}" if other else ""),
                    _fmt(mine),
                    _fmt(other),
                    _ratio(mine, other),
                )


def _fmt(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    if row["value"] is None:
        return str(row.get("note") or "not available")
    value, unit = row["value"], row.get("unit", "")
    text = f"{value:.0f}" if float(value).is_integer() else f"{value:.3g}"
    return f"{text} {unit}".strip()


def _ratio(ours: dict[str, Any] | None, other: dict[str, Any] | None) -> str:
    if ours is None or other is None or not other["value"] or ours["value"] is None:
        return "-"
    if any(word in ours["metric"] for word in ("lost", "dup", "extra", "errors", "stale", "race")):
        return "-"  # counts, not costs
    return f"{ours['value'] / other['value']:.2f}x"
