"""uvicorn as ``sessionstore serve`` runs it: with a bound on connections and on the time a
client may keep one without a request under way.

uvicorn closes an idle keep-alive connection after ``timeout_keep_alive``, but any byte resets
that timer, and nothing bounds how long a request's headers may take, nor how many
connections are open: a client that opens connections and sends a byte of headers now and
then holds them all. Two guards, on uvicorn's own HTTP protocol (the class ``--http``
selects, given to ``uvicorn.Config(http=...)``):

- ``header_timeout_s``: from a connection's start, and from the end of each response, the
  client has that long to complete its next request's headers (the app is then called);
  otherwise the connection is closed. A request under way is not timed here: its body is
  timed by the app (``store/http/guard.py``, 408), and its answer may take as long as a
  long-poll or an SSE response does.
- ``max_connections``: a connection beyond it is closed at once (a client sees a reset or
  an empty answer, and may retry); those open are unaffected.

Both hold whether the client pauses, drips bytes or dies: the timer runs on the server's
clock, and the count is of the server's own open connections.

An idle keep-alive connection is closed by the same timer: uvicorn's own keep-alive timeout
is set to it (rounded up), not left at its 5 s. Clients keep idle connections for about that
long (undici, node's fetch: 4 s on a timer of coarse grain; httpx: 5 s), and a server that
closes first races them: a request sent on a connection the server is closing fails ("other
side closed"), which the protocol's conformance suite met as a lost 10 MiB POST.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Any

import uvicorn

log = logging.getLogger("sessionstore.http")

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 1000


@dataclass(frozen=True, slots=True)
class ServerLimits:
    #: Seconds a connection may go without a request under way (see the module docstring).
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    #: Most connections open at once.
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    def __post_init__(self) -> None:
        if not self.header_timeout_s > 0:
            raise ValueError("header_timeout_s must be positive")
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")


def guarded_protocol(limits: ServerLimits) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class with the two guards of the module docstring."""
    # What uvicorn's http="auto" picks: httptools if installed, else h11 (one interface).
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    base: Any = AutoHTTPProtocol

    class Guarded(base):  # type: ignore[misc, valid-type]
        _idle_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                log.info("a connection over the limit of %d closed", limits.max_connections)
                transport.close()
                return
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
            self._idle_timer = self.loop.call_later(limits.header_timeout_s, self._expired)

        def _expired(self) -> None:
            self._idle_timer = None
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                return  # a request under way: timed by the app; re-armed when it ends
            if not self.transport.is_closing():
                log.info("a connection without a complete request for %ss closed", limits.header_timeout_s)
                self.transport.close()

    return Guarded


def server_config(app: Any, *, host: str, port: int, limits: ServerLimits, **options: Any) -> uvicorn.Config:
    """The uvicorn configuration ``sessionstore serve`` runs ``app`` with (``options``: more
    of ``uvicorn.Config``'s)."""
    options.setdefault("log_level", "warning")
    options.setdefault("access_log", False)
    options.setdefault("timeout_keep_alive", math.ceil(limits.header_timeout_s))
    return uvicorn.Config(app, host=host, port=port, http=guarded_protocol(limits), **options)


__all__ = ["DEFAULT_HEADER_TIMEOUT_S", "DEFAULT_MAX_CONNECTIONS", "ServerLimits", "guarded_protocol",
           "server_config"]
