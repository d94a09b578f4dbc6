"""sessionstore: a multi-writer session store for AI agents over object storage and Redis."""

from store.core import SessionData, SessionHandle, SessionStore
from store.errors import *  # noqa: F401,F403 - the error tree is part of the public API
from store.records import (
    EMPTY_TAIL,
    AppendResult,
    ForkPoint,
    Header,
    SessionInfo,
    StoreOptions,
    TailInfo,
)

__all__ = [
    "SessionStore",
    "SessionHandle",
    "SessionData",
    "AppendResult",
    "TailInfo",
    "SessionInfo",
    "StoreOptions",
    "Header",
    "ForkPoint",
    "EMPTY_TAIL",
]
