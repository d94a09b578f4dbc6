"""``SessionManager``: pi's writer API (snake_case) over the store's append protocol.

A manager holds a snapshot of the session and its own leaf. Every append goes through
``SessionStore.append_session_entries``; its ``parentId`` is the manager's leaf, so when
another writer (another process, another machine) appended meanwhile, this manager's entries
still land on its own leaf: a sibling branch, never an overwrite. With ``strict=True`` each
append instead requires that the session's tail is still the last entry this manager saw
(``ConflictError`` otherwise; ``refresh()`` and decide).

Appends made inside ``with manager.batch():`` are committed together as one atomic segment
when the block exits (nothing is written if it raises).

A redaction (``redact_entries``) is pi's kind of append too: entries chained after the tail,
each hiding another's content.

Ids minted here carry 64 random bits (16 hex characters): pi's 8-hex ids collide across a
fleet, while pi itself reads any string id.
"""

from __future__ import annotations

import contextlib
import secrets
from typing import TYPE_CHECKING, Any, Iterator

from store.clock import iso_now
from store.errors import ConflictError, ContentionError, EntryNotFoundError, InvalidInputError
from store.formats.layout import check_session_id
from store.model.js import js_trim
from store.model.rules import REDACTION_TYPE
from store.model.session import Session, TreeNode
from store.formats.records import EMPTY_TAIL, AppendResult

if TYPE_CHECKING:
    from store.protocol.api import Sessions
    from store.protocol.handles import SessionAppends


def new_entry_id(taken: Any = ()) -> str:
    while True:
        eid = secrets.token_hex(8)
        if eid not in taken:
            return eid


def redact_entries(store: Sessions, session_id: str, entry_ids: list[str], reason: str) -> AppendResult:
    """``SessionStore.redact_entries``: one batch of redactions of ``entry_ids``, chained
    after the session's tail (the same entries as that many single redactions in a row),
    one read and one append, strict on the tail (a redaction hangs off the entry it was
    computed from; a conflict recomputes it, ``max_rounds`` times at most). Nothing is
    appended if any target is unknown or is a redaction."""
    if not isinstance(reason, str):
        raise InvalidInputError("reason must be a string")
    if not entry_ids or not all(isinstance(e, str) for e in entry_ids):
        raise InvalidInputError("name at least one entry id to redact")
    sid = check_session_id(session_id)
    data = store.read_session(sid)
    by_id = {e["id"]: e for e in data.all_entries}
    for entry_id in entry_ids:
        target = by_id.get(entry_id)
        if target is None:
            raise EntryNotFoundError(sid, entry_id)
        if target.get("type") == REDACTION_TYPE:
            raise InvalidInputError("a redaction cannot be redacted")
    taken = set(by_id)
    batch: list[dict[str, Any]] = []
    for entry_id in entry_ids:
        rid = new_entry_id(taken)
        taken.add(rid)
        batch.append({"type": REDACTION_TYPE, "id": rid, "parentId": None, "timestamp": iso_now(),
                      "targetId": entry_id, "reason": reason})
    tail = data.last_entry_id or None
    for _ in range(store.options.max_rounds):
        parent = tail
        for entry in batch:
            entry["parentId"] = parent
            parent = entry["id"]
        try:
            return store.append_session_entries(sid, batch, tail or EMPTY_TAIL)
        except ConflictError as exc:
            tail = exc.actual_tail_entry_id or None
    raise ContentionError(f"session {sid!r}: redaction lost every round to other writers")


class SessionManager:
    def __init__(self, store: SessionAppends, session_id: str, *, strict: bool = False) -> None:
        self.store = store
        self.session_id = session_id
        self.strict = strict
        self._pending: list[dict[str, Any]] | None = None
        self.last_result: AppendResult | None = None
        self.refresh()

    # --- state -------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Re-read the session; the leaf moves to the session's leaf (its last entry)."""
        session = self.store.load_session(self.session_id)
        self._header = session.header
        self._entries: list[dict[str, Any]] = list(session.entries)
        self._ids: set[str] = {e["id"] for e in self._entries}
        self._session: Session | None = session
        self._tail: str = session.leaf_id or ""
        self._leaf: str | None = session.leaf_id

    @property
    def session(self) -> Session:
        if self._session is None:
            # Loaded from the store or validated on append: no need to check them again.
            self._session = Session(self._header, self._entries, validated=True)
        return self._session

    def get_leaf_id(self) -> str | None:
        return self._leaf

    def get_leaf_entry(self) -> dict[str, Any] | None:
        return None if self._leaf is None else self.session.get_entry(self._leaf)

    def get_entry(self, entry_id: str) -> dict[str, Any] | None:
        return self.session.get_entry(entry_id)

    def get_entries(self) -> tuple[dict[str, Any], ...]:
        return self.session.entries

    def get_children(self, parent_id: str | None) -> list[dict[str, Any]]:
        return self.session.get_children(parent_id)

    def get_branch(self, from_id: str | None = None) -> list[dict[str, Any]]:
        start = self._leaf if from_id is None else from_id
        return [] if start is None else self.session.get_branch(start)

    def get_tree(self) -> list[TreeNode]:
        return self.session.get_tree()

    def get_label(self, entry_id: str) -> Any:
        return self.session.get_label(entry_id)

    def get_session_name(self) -> str | None:
        return self.session.name

    def get_header(self) -> dict[str, Any]:
        return dict(self._header)

    def build_session_context(self) -> dict[str, Any]:
        if self._leaf is None:
            return {"messages": [], "thinkingLevel": "off", "model": None}
        return self.session.build_context(self._leaf)

    # --- navigation (nothing is written, as in pi) -------------------------------------------

    def branch(self, entry_id: str) -> None:
        if self.session.get_entry(entry_id) is None:
            raise EntryNotFoundError(self.session_id, entry_id)
        self._leaf = entry_id

    def reset_leaf(self) -> None:
        self._leaf = None

    # --- appends -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def batch(self) -> Iterator["SessionManager"]:
        """Group the appends of the block into one atomic segment."""
        if self._pending is not None:
            raise InvalidInputError("batches do not nest")
        self._pending = []
        saved_leaf = self._leaf
        try:
            yield self
        except BaseException:
            self._pending = None
            self._leaf = saved_leaf
            raise
        pending, self._pending = self._pending, None
        if pending:
            try:
                self._commit(pending)
            except BaseException:
                self._leaf = saved_leaf
                raise

    def _append(self, fields_before_id: dict[str, Any], fields_after: dict[str, Any], etype: str) -> str:
        eid = new_entry_id(self._ids)
        entry: dict[str, Any] = {"type": etype}
        entry.update(fields_before_id)
        entry["id"] = eid
        entry["parentId"] = self._leaf
        entry["timestamp"] = iso_now()
        entry.update((k, v) for k, v in fields_after.items() if v is not None)
        self._ids.add(eid)  # reserved now so a batch never mints the same id twice
        if self._pending is not None:
            self._pending.append(entry)
            self._leaf = eid
            return eid
        self._commit([entry])
        return eid

    def _commit(self, entries: list[dict[str, Any]]) -> None:
        expected = (self._tail or EMPTY_TAIL) if self.strict else None
        result = self.store.append_session_entries(self.session_id, entries, expected)
        self.last_result = result
        self._entries.extend(entries)
        self._session = None
        self._tail = entries[-1]["id"]
        self._leaf = entries[-1]["id"]

    def append_message(self, message: dict[str, Any]) -> str:
        if not isinstance(message, dict):
            raise InvalidInputError("message must be an object")
        return self._append({}, {"message": message}, "message")

    def append_thinking_level_change(self, thinking_level: str) -> str:
        return self._append({}, {"thinkingLevel": thinking_level}, "thinking_level_change")

    def append_model_change(self, provider: str, model_id: str) -> str:
        return self._append({}, {"provider": provider, "modelId": model_id}, "model_change")

    def append_compaction(
        self,
        summary: str,
        first_kept_entry_id: str,
        tokens_before: int,
        details: Any = None,
        from_hook: bool | None = None,
    ) -> str:
        return self._append(
            {},
            {
                "summary": summary,
                "firstKeptEntryId": first_kept_entry_id,
                "tokensBefore": tokens_before,
                "details": details,
                "fromHook": from_hook,
            },
            "compaction",
        )

    def append_custom_entry(self, custom_type: str, data: Any = None) -> str:
        before: dict[str, Any] = {"customType": custom_type}
        if data is not None:
            before["data"] = data
        return self._append(before, {}, "custom")

    def append_custom_message_entry(
        self, custom_type: str, content: Any, display: bool, details: Any = None
    ) -> str:
        before: dict[str, Any] = {"customType": custom_type, "content": content, "display": display}
        if details is not None:
            before["details"] = details
        return self._append(before, {}, "custom_message")

    def append_label_change(self, target_id: str, label: str | None) -> str:
        if self.session.get_entry(target_id) is None and not any(
            e["id"] == target_id for e in self._pending or ()
        ):
            raise EntryNotFoundError(self.session_id, target_id)
        return self._append({}, {"targetId": target_id, "label": label}, "label")

    def append_session_info(self, name: str) -> str:
        return self._append({}, {"name": js_trim(name)}, "session_info")

    def branch_with_summary(
        self,
        branch_from_id: str | None,
        summary: str,
        details: Any = None,
        from_hook: bool | None = None,
    ) -> str:
        if branch_from_id is not None and self.session.get_entry(branch_from_id) is None:
            raise EntryNotFoundError(self.session_id, branch_from_id)
        self._leaf = branch_from_id
        return self._append(
            {},
            {
                "fromId": branch_from_id if branch_from_id is not None else "root",
                "summary": summary,
                "details": details,
                "fromHook": from_hook,
            },
            "branch_summary",
        )

    def __repr__(self) -> str:
        return f"SessionManager({self.session_id!r}, leaf={self._leaf!r}, strict={self.strict})"
