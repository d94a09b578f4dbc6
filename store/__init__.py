"""sessionstore: a multi-writer session store for AI agents over object storage and Redis.

``SessionStore`` and the value types are imported lazily (PEP 562), so that modules the core
itself depends on (``store.errors``, used by ``coordination``) can be imported first without
a cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from store.errors import *  # noqa: F401,F403 - the error tree is part of the public API

if TYPE_CHECKING:
    from store.aio import AsyncSessionHandle, AsyncSessionManager, AsyncSessionStore
    from store.core import SessionData, SessionHandle, SessionStore
    from store.protocol.listing import SessionFilter, SessionPage
    from store.manager import SessionManager
    from store.formats.records import (
        EMPTY_TAIL,
        AppendResult,
        ForkPoint,
        Header,
        SessionInfo,
        StoreOptions,
        TailInfo,
    )
    from store.model.session import Session
    from store.lifecycle.retention import Retention
    from store.metrics import Metrics

_LAZY = {
    "AsyncSessionStore": "store.aio",
    "AsyncSessionHandle": "store.aio",
    "AsyncSessionManager": "store.aio",
    "SessionStore": "store.core",
    "SessionHandle": "store.core",
    "SessionData": "store.core",
    "SessionManager": "store.manager",
    "Session": "store.model.session",
    "AppendResult": "store.formats.records",
    "TailInfo": "store.formats.records",
    "SessionInfo": "store.formats.records",
    "StoreOptions": "store.formats.records",
    "Header": "store.formats.records",
    "ForkPoint": "store.formats.records",
    "EMPTY_TAIL": "store.formats.records",
    "SessionPage": "store.protocol.listing",
    "SessionFilter": "store.protocol.listing",
    "Retention": "store.lifecycle.retention",
    "Metrics": "store.metrics",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'store' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
