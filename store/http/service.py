"""What the route groups (``sessions.py``, ``claude.py``) need of the service that mounts them.

``StreamService`` (``app.py``) builds the route groups and hands itself to them; the groups
see it only through this protocol, so the imports point one way: ``app`` imports the groups,
the groups import this module, and nothing here imports ``app``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from starlette.requests import Request

    from store.core import SessionStore
    from store.http.auth import Grant
    from store.http.notify import Notifier
    from store.streams import Streams

T = TypeVar("T")


class RouteService(Protocol):
    """The service as a route group sees it."""

    #: The store every route reads and writes.
    store: SessionStore
    #: The stream view of the same store (stream names, headers).
    streams: Streams
    #: Wakes long polls and SSE readers of a session after a write.
    notifier: Notifier

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the service's threads (the store is synchronous)."""
        ...

    def tenant_of(self, request: Request) -> str | None:
        """The request's tenant (None when no tokens are configured); 401 without a known token."""
        ...

    def grant_of(self, request: Request) -> Grant | None:
        """What the request's token grants (None when no tokens are configured); 401 without one."""
        ...

    def authorize_name(self, request: Request, name: str) -> None:
        """401 without a known token, 403 for a name the token does not reach."""
        ...

    async def read_body(self, request: Request) -> bytes:
        """The whole body, within the service's one size limit (413 beyond it)."""
        ...
