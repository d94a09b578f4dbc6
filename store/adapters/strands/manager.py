"""``SessionStoreSessionManager``: Strands' ``RepositorySessionManager`` on
:class:`~store.adapters.strands.repository.SessionStoreRepository`, a drop-in for its
``S3SessionManager`` and ``FileSessionManager``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from strands.session.repository_session_manager import RepositorySessionManager

from store.core import SessionStore
from store.adapters.strands.records import (
    DEFAULT_DIR,
    ENV_OBJECTS,
    ENV_REDIS,
    SessionExistsInStoreError,
)
from store.adapters.strands.repository import SessionStoreRepository, _store_id


class SessionStoreSessionManager(RepositorySessionManager, SessionStoreRepository):
    """A Strands session manager on the store: usable wherever ``S3SessionManager`` is.

    Like ``FileSessionManager`` and ``S3SessionManager`` it is its own repository (so
    ``manager.list_messages(...)`` works too). The store: ``store`` (a ``store.SessionStore``
    or an ``AsyncSessionStore``, shared, not closed here), or one made from ``objects_url`` /
    ``redis_url`` (``store_options`` as for ``SessionStore.from_url``; closed by
    :meth:`close`). With neither: ``SESSIONSTORE_OBJECTS_URL`` / ``SESSIONSTORE_REDIS_URL``,
    else the embedded default in ``./.sessionstore`` (as the CLI).

    The session is created if it does not exist; a process that loses that race to another
    one uses the session the other created.
    """

    def __init__(
        self,
        session_id: str,
        store: Any = None,
        *,
        objects_url: str | None = None,
        redis_url: str | None = None,
        store_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        _store_id(session_id)  # before any store is made or anything written
        owns = store is None
        if store is None:
            objects_url = objects_url or os.environ.get(ENV_OBJECTS) or Path(DEFAULT_DIR).absolute().as_uri()
            redis_url = redis_url or os.environ.get(ENV_REDIS) or None
            store = SessionStore.from_url(objects_url, redis_url, **dict(store_options or {}))
        elif objects_url is not None or redis_url is not None or store_options:
            raise TypeError("give either store or objects_url/redis_url/store_options, not both")
        try:
            SessionStoreRepository.__init__(self, store, owns_store=owns)
            try:
                RepositorySessionManager.__init__(self, session_id=session_id, session_repository=self, **kwargs)
            except SessionExistsInStoreError:
                # Another process created it between our read and our create: use it.
                RepositorySessionManager.__init__(self, session_id=session_id, session_repository=self, **kwargs)
        except BaseException:
            if owns:
                store.close()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
