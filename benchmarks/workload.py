"""The entries the benchmarks write: pi-shaped, about 1 KB each, fully deterministic.

A session alternates user and assistant ``message`` entries, each the child of the one before
(a single linear branch, as an agent writes), so ``build_context`` walks every entry.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import orjson

#: Target size of one encoded entry, in bytes (the issue's "~1 KB").
ENTRY_BYTES = 1024

_BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
_USAGE = {
    "input": 1200,
    "output": 350,
    "cacheRead": 0,
    "cacheWrite": 0,
    "totalTokens": 1550,
    "cost": {"input": 0.0036, "output": 0.00525, "cacheRead": 0, "cacheWrite": 0, "total": 0.00885},
}
_WORDS = (
    "the session store appends immutable segments and resumes by reading them back in order "
    "while redis keeps the tail pointer and the id index for idempotent retries "
).split()


def _iso(ms: int) -> str:
    when = datetime.fromtimestamp(ms / 1000, timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _text(n: int, seed: int) -> str:
    words: list[str] = []
    size = 0
    i = seed
    while size < n:
        w = _WORDS[i % len(_WORDS)]
        words.append(w)
        size += len(w) + 1
        i += 7
    return " ".join(words)[:n]


def _skeleton(eid: str, parent: str | None, i: int) -> dict[str, Any]:
    ms = _BASE_MS + i * 1500
    if i % 2 == 0:
        message: dict[str, Any] = {"role": "user", "content": "", "timestamp": ms}
    else:
        message = {
            "role": "assistant",
            "content": [{"type": "text", "text": ""}],
            "api": "anthropic-messages",
            "provider": "anthropic",
            "model": "claude-sonnet-4-5",
            "usage": _USAGE,
            "stopReason": "stop",
            "timestamp": ms,
        }
    return {"type": "message", "id": eid, "parentId": parent, "timestamp": _iso(ms), "message": message}


_OVERHEAD: dict[tuple[int, int, int], int] = {}


def make_entry(eid: str, parent: str | None, i: int, size: int = ENTRY_BYTES) -> dict[str, Any]:
    """Entry number ``i`` of a session: encoded, it is ``size`` bytes (for ids of one length)."""
    entry = _skeleton(eid, parent, i)
    key = (i % 2, len(eid), len(parent) if parent is not None else -1)
    overhead = _OVERHEAD.get(key)
    if overhead is None:
        overhead = len(orjson.dumps(entry))
        _OVERHEAD[key] = overhead
    text = _text(max(16, size - overhead), i)
    if i % 2 == 0:
        entry["message"]["content"] = text
    else:
        entry["message"]["content"][0]["text"] = text
    return entry


def entry_id(tag: str, i: int) -> str:
    """A session-unique id: 16 characters, like the store's own SessionManager mints."""
    return f"{tag}{i:0{16 - len(tag)}d}"


def chain(tag: str, start: int, count: int, parent: str | None, size: int = ENTRY_BYTES) -> list[dict[str, Any]]:
    """``count`` entries numbered from ``start``, each the child of the previous one."""
    out: list[dict[str, Any]] = []
    for i in range(start, start + count):
        eid = entry_id(tag, i)
        out.append(make_entry(eid, parent, i, size))
        parent = eid
    return out


def encode(entries: list[dict[str, Any]]) -> bytes:
    """The JSONL bytes of ``entries`` exactly as a segment holds them."""
    return b"".join(orjson.dumps(e) + b"\n" for e in entries)


def session_entries(tag: str, n: int) -> list[dict[str, Any]]:
    return chain(tag, 0, n, None)
