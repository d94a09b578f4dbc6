"""Side by side: each framework's own default session backend and its sessionstore adapter
on the same workload (``python -m benchmarks --only peers``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse


def embedded_stopper(objects_url: str, redis_url: str | None) -> Callable[[], None]:
    """Stop, at the end, an embedded redis-server that this run starts (and only that)."""
    parsed = urlparse(objects_url)
    if redis_url is not None or parsed.scheme != "file":
        return lambda: None
    from store.backends.embedded import EmbeddedRedis

    embedded = EmbeddedRedis(Path(unquote(parsed.path)) / ".redis")
    if embedded.running():
        return lambda: None  # someone else's: leave it

    def stop() -> None:
        if embedded.running():
            embedded.stop()

    return stop
