"""Fixtures that build SessionStores on the test's servers (imported by conftest.py)."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest

from store import SessionStore


@pytest.fixture
def make_store(s3_url: str, redis_url: str, redis_prefix: str) -> Iterator[Callable[..., SessionStore]]:
    """``make_store(**options)``: a SessionStore on the test's bucket and Redis; all closed after."""
    stores: list[SessionStore] = []

    def make(**options: Any) -> SessionStore:
        options.setdefault("redis_prefix", redis_prefix)
        store = SessionStore.from_url(s3_url, redis_url, **options)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def store(make_store: Callable[..., SessionStore]) -> SessionStore:
    return make_store()


@pytest.fixture
def serve(make_store: Callable[..., SessionStore]) -> Iterator[Callable[..., tuple[Any, str]]]:
    """``serve(store_options=None, **service_options)`` -> (service, base url): a
    ``StreamService`` on a store of the test's servers, behind uvicorn; all stopped after."""
    from harness.asgi_server import AsgiServer
    from store.http.app import StreamService

    servers: list[AsgiServer] = []

    def make(store_options: dict[str, Any] | None = None, **options: Any) -> tuple[StreamService, str]:
        service = StreamService(make_store(**(store_options or {})), **options)
        server = AsgiServer(service.app).start()
        servers.append(server)
        return service, server.url

    yield make
    for server in servers:
        server.stop()
