"""The coordinator: Redis as cache and arbiter of the tail, never the only copy of anything.

One object, :class:`Coordinator`, built from one part per concern, each a module of its own:

- ``coordination/client.py``: the connection, and the one boundary where redis-py's
  exceptions become ``store.errors``;
- ``coordination/appends.py``: CHECK, COMMIT, the tail and its rebuild (the append protocol);
- ``coordination/summaries.py``: the listing's summaries, a session's last access, ``forget``;
- ``coordination/schedules.py``: GC's and retention's schedules and sweeps, the compaction
  job queue;
- ``coordination/notifications.py``: the pub/sub channels;
- ``coordination/formats.py``: the values Redis holds and the scripts' replies;
- ``coordination/scripts.py`` (the Lua) and ``coordination/keys.py`` (the key names).
"""

from __future__ import annotations

from coordination.appends import AppendCalls
from coordination.client import RedisClient, redis_call, translate_redis_error
from coordination.formats import (
    CheckResult,
    CommitResult,
    Offering,
    SummaryDelta,
    TailState,
    parse_recent,
    parse_version,
    recent_value,
)
from coordination.notifications import AllChanges, NotificationCalls, ShardChanges, ShardEvent, Subscription
from coordination.schedules import ScheduleCalls
from coordination.summaries import SummaryCalls


class Coordinator(AppendCalls, SummaryCalls, ScheduleCalls, NotificationCalls, RedisClient):
    """Per-session tail, id index, summary and notifications; the maintenance schedules and
    the compaction queue."""


__all__ = [
    "AllChanges",
    "CheckResult",
    "CommitResult",
    "Coordinator",
    "Offering",
    "RedisClient",
    "ShardChanges",
    "ShardEvent",
    "Subscription",
    "SummaryDelta",
    "TailState",
    "parse_recent",
    "parse_version",
    "recent_value",
    "redis_call",
    "translate_redis_error",
]
