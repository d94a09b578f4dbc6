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
