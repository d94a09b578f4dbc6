"""uvicorn as ``sessionstore serve`` runs it: with a bound on connections and on the time a
client may keep one without a request under way.

uvicorn closes an idle keep-alive connection after ``timeout_keep_alive``, but any byte resets
that timer, and nothing bounds how long a request's headers may take, nor how many
connections are open: a client that opens connections and sends a byte of headers now and
then holds them all. Three guards, on uvicorn's own HTTP protocol (the class ``--http``
selects, given to ``uvicorn.Config(http=...)``):

- ``header_timeout_s``: from a connection's start, and from the first byte of each later
  request, the client has that long to complete the request's headers (the app is then
  called); otherwise the connection is closed. Dripping bytes does not extend it. A request
  under way is not timed here: its body is timed by the app (``store/http/guard.py``, 408),
  and its answer may take as long as a long-poll or an SSE response does.
- ``idle_timeout_s``: a keep-alive connection may stay silent that long after an answer
  (no byte of a next request); then it is closed.
- ``max_connections``: a connection beyond it is closed at once (a client sees a reset or
  an empty answer, and may retry); those open are unaffected.

All hold whether the client pauses, drips bytes or dies: the timers run on the server's
clock, and the count is of the server's own open connections.

Why the idle timeout is long (60 s by default, as a load balancer's is) and separate from the
header timeout: a client keeps an idle connection for a few seconds (undici, node's fetch: 4 s
on a timer of coarse grain; httpx: 5 s) and then sends its next request on it without
waiting. A server that closes an idle connection first races that request, which then fails
("other side closed") and, being a POST, is not retried: the protocol's conformance suite met
it as a lost 10 MiB POST, with uvicorn's 5 s and again with 10 s when the machine was busy
enough to delay the client's own timer. An idle connection costs a socket, and their number
is bounded by ``max_connections``; a client that starts a request and stalls still has only
``header_timeout_s``.
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
DEFAULT_IDLE_TIMEOUT_S = 60.0
DEFAULT_MAX_CONNECTIONS = 1000


@dataclass(frozen=True, slots=True)
class ServerLimits:
    #: Seconds a connection may go without a request under way (see the module docstring).
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    #: Seconds a keep-alive connection may stay silent after an answer.
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    #: Most connections open at once.
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    def __post_init__(self) -> None:
        if not self.header_timeout_s > 0:
            raise ValueError("header_timeout_s must be positive")
        if not self.idle_timeout_s > 0:
            raise ValueError("idle_timeout_s must be positive")
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")


def guarded_protocol(limits: ServerLimits) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class with the guards of the module docstring."""
    # What uvicorn's http="auto" picks: httptools if installed, else h11 (one interface).
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    base: Any = AutoHTTPProtocol

    class Guarded(base):  # type: ignore[misc, valid-type]
        _idle_timer: asyncio.TimerHandle | None = None
        #: Silent since an answer: the next byte starts a request's header timeout.
        _idle: bool = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                log.info("a connection over the limit of %d closed", limits.max_connections)
                transport.close()
                return
            self._arm(limits.header_timeout_s)

        def data_received(self, data: bytes) -> None:
            if self._idle:
                self._idle = False
                self._arm(limits.header_timeout_s)
            super().data_received(data)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._idle = True
            self._arm(limits.idle_timeout_s)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
            super().connection_lost(exc)

        def _arm(self, delay: float) -> None:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
            self._idle_timer = self.loop.call_later(delay, self._expired)

        def _expired(self) -> None:
            self._idle_timer = None
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                return  # a request under way: timed by the app; re-armed when it ends
            if not self.transport.is_closing():
                if self._idle:
                    log.info("a keep-alive connection silent for %ss closed", limits.idle_timeout_s)
                else:
                    log.info("a connection without a complete request for %ss closed", limits.header_timeout_s)
                self.transport.close()

    return Guarded


def server_config(app: Any, *, host: str, port: int, limits: ServerLimits, **options: Any) -> uvicorn.Config:
    """The uvicorn configuration ``sessionstore serve`` runs ``app`` with (``options``: more
    of ``uvicorn.Config``'s)."""
    options.setdefault("log_level", "warning")
    options.setdefault("access_log", False)
    # uvicorn's own keep-alive timer, past ours: ours closes (and says why) first.
    options.setdefault("timeout_keep_alive", math.ceil(limits.idle_timeout_s) + 1)
    return uvicorn.Config(app, host=host, port=port, http=guarded_protocol(limits), **options)


__all__ = ["DEFAULT_HEADER_TIMEOUT_S", "DEFAULT_IDLE_TIMEOUT_S", "DEFAULT_MAX_CONNECTIONS", "ServerLimits", "guarded_protocol",
           "server_config"]
