"""``SessionHandle``: what ``create_session``, a fork and an import return."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence

from store.formats.records import AppendResult, Header, TailInfo

if TYPE_CHECKING:
    from store.model.session import Session


class SessionAppends(Protocol):
    """Appends and reads of one session's entries (a ``SessionHandle``, a ``SessionManager``)."""

    def append_session_entries(
        self,
        session_id: str,
        entries: Sequence[dict[str, Any]],
        expected_tail_entry_id: str | None = None,
        *,
        incarnation: str | None = None,
        alone: bool = False,
    ) -> AppendResult: ...

    def load_session_entries(self, session_id: str) -> list[dict[str, Any]]: ...

    def load_session(self, session_id: str) -> Session: ...

    def get_tail(self, session_id: str) -> TailInfo: ...


class SessionHandle:
    """A session created or opened through the store (see ``store.manager`` for pi's API)."""

    def __init__(self, store: SessionAppends, header: Header) -> None:
        self.store = store
        self.header = header

    @property
    def session_id(self) -> str:
        return self.header.session_id

    def append(
        self, entries: Sequence[dict[str, Any]], expected_tail_entry_id: str | None = None
    ) -> AppendResult:
        return self.store.append_session_entries(self.session_id, entries, expected_tail_entry_id)

    def load_entries(self) -> list[dict[str, Any]]:
        return self.store.load_session_entries(self.session_id)

    def tail(self) -> TailInfo:
        return self.store.get_tail(self.session_id)

    def __repr__(self) -> str:
        return f"SessionHandle({self.session_id!r})"


__all__ = ["SessionAppends", "SessionHandle"]
