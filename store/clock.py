"""Wall-clock helpers, once: epoch milliseconds and ISO-8601 UTC with milliseconds.

Time decides nothing in the append or read protocols. It matters to GC's grace period
and to the age limit of a rebuild (docs/design.md, "Pauses"), where clocks of different
machines are compared and must agree to well within those bounds.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone


def now_ms() -> int:
    return int(time.time() * 1000)


def iso_ms(ms: int) -> str:
    """``2026-11-22T10:00:00.000Z``: the form pi writes its timestamps in."""
    return (
        datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def iso_now() -> str:
    return iso_ms(now_ms())
