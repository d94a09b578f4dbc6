"""What the store's satellites see of ``SessionStore``: its public methods, as protocols.

``store/core.py`` builds ``SessionStore`` from the protocol objects and offers what the
satellites add (a pi ``SessionManager``, pi's import, the trash, forks' handles). Those
satellites are typed against the protocols below, not the class, so their imports point one
way: the facade imports them, they import this module, and this module imports neither.
``SessionStore`` satisfies each protocol structurally (``store.protocol.handles.SessionAppends`` is
the narrower one a handle and pi's ``SessionManager`` use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from store.protocol.handles import SessionAppends, SessionHandle

if TYPE_CHECKING:
    from store.formats.entries import PreparedBatch
    from store.protocol.read import Reader, SessionData
    from store.formats.records import AppendResult, ForkPoint, Header, StoreOptions


class Sessions(SessionAppends, Protocol):
    """The store's public API as pi's import uses it."""

    #: The store's options (batch limits, retry policy).
    options: StoreOptions
    #: The read path (``store/protocol/read.py``).
    reader: Reader

    def get_header(self, session_id: str) -> Header: ...

    def read_session(self, session_id: str) -> SessionData: ...

    def create_session(
        self,
        session_id: str | None = None,
        *,
        cwd: str | None = None,
        pi_header: dict[str, Any] | None = None,
        fork: ForkPoint | None = None,
        kind: str = "pi",
        config: dict[str, Any] | None = None,
        retention: Any = None,
    ) -> SessionHandle: ...

    def append_prepared(
        self,
        session_id: str,
        batch: PreparedBatch,
        expected_tail_entry_id: str | None = None,
        *,
        incarnation: str | None = None,
        alone: bool = False,
    ) -> AppendResult: ...

    def delete_session(self, session_id: str, *, incarnation: str | None = None) -> None: ...


__all__ = ["Sessions"]
