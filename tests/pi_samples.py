"""Realistic pi conversation content for the tests that need large generated files."""

from __future__ import annotations

import random
from typing import Any

WORDS = ["session", "agent", "tool", "result", "branch", "leaf", "pi", "store", "é", "λ", "\u2028"]


def conversation_message(rng: random.Random, n: int) -> dict[str, Any]:
    """The n-th message of a user/assistant exchange, 0.5 to 4 KB of text, pi's shapes."""
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(100, 600)))
    if n % 2:
        return {"role": "user", "content": text, "timestamp": 1740823200000 + n}
    return {
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "provider": "anthropic",
        "model": "claude",
        "stopReason": "stop",
        "usage": {"input": n, "output": 5, "cost": {"input": 0.0003, "total": 0.00105}},
        "timestamp": 1740823200000 + n,
    }
