"""Export, then import of the same session: accepted, and nothing changes.

The store keeps what an append gave it (``1.0``, ``-0.0``, ``2**64``); an export writes what
``JSON.stringify`` writes (``1``, ``0``, ``18446744073709552000``), and an import reads the
file as ``JSON.parse`` does. The import must see the same entries there, as it must for a
redacted entry (exported as a tombstone) and for a fork (exported with the path it inherits).
"""

from __future__ import annotations

from typing import Any

import pytest

from compactor import Compactor, CompactorOptions
from compactor.purge import purge_now
from store import SessionStore
from store.pi_import import ImportConflictError, import_pi_file


def _message(entry_id: str, parent: str | None, **message: Any) -> dict[str, Any]:
    return {"type": "message", "id": entry_id, "parentId": parent, "timestamp": "2026-11-22T10:00:00.000Z",
            "message": {"role": "assistant", "content": "hi", "timestamp": 1795341600000, **message}}


#: Values a Python caller appends that JavaScript holds (and so an export writes) otherwise.
PYTHON_NUMBERS = [
    _message("a1", None, usage={"cost": {"input": 0.0, "output": 1.0, "total": 1.0}}),  # as the demo writes
    _message("a2", "a1", usage={"cost": -0.0, "big": 2**64 - 1, "huge": 2.0**70, "tiny": 1.5e-6, "wide": 1e21}),
    _message("a3", "a2", details={"10": "ten", "2": "two", "b": [1.0, {"x": 3.0}]}),  # JS puts "2" first
    _message("a4", "a3", content="cut \ud83d inside an emoji"),  # a lone surrogate
]


def _snapshot(store: SessionStore, sid: str) -> tuple[Any, ...]:
    return (store.get_tail(sid), store.load_session_entries(sid), sorted(i.key for i in store.objects.list(store.layout.prefix)))


def _assert_round_trip_changes_nothing(store: SessionStore, sid: str) -> None:
    before = _snapshot(store, sid)
    text = store.export_pi_session(sid)
    result = import_pi_file(store, text)
    assert (result.session_id, result.status, result.appended) == (sid, "unchanged", 0)
    assert _snapshot(store, sid) == before
    assert store.export_pi_session(sid) == text


def test_export_then_import_of_python_numbers_is_accepted_and_changes_nothing(store: SessionStore) -> None:
    sid = store.create_session(cwd="/repo").session_id
    store.append_session_entries(sid, PYTHON_NUMBERS)
    _assert_round_trip_changes_nothing(store, sid)


def test_export_then_import_of_a_redacted_session_changes_nothing_before_and_after_the_purge(
    store: SessionStore,
) -> None:
    sid = store.create_session(cwd="/repo").session_id
    store.append_session_entries(sid, [_message("r1", None, content="token"), _message("r2", "r1")])
    store.redact(sid, "r1", "leaked a token")
    _assert_round_trip_changes_nothing(store, sid)  # the content still stored, hidden
    purge_now(Compactor(store, CompactorOptions(worker="test")), sid, alone=True)
    _assert_round_trip_changes_nothing(store, sid)  # the stored entry is a tombstone now


def test_export_then_import_of_a_fork_changes_nothing_and_a_longer_file_extends_it(store: SessionStore) -> None:
    sid = store.create_session(cwd="/repo").session_id
    store.append_session_entries(sid, PYTHON_NUMBERS[:3])
    fork = store.branch_from_entry(sid, "a2").session_id
    _assert_round_trip_changes_nothing(store, fork)  # the inherited path only
    store.append_session_entries(fork, [_message("f1", "a2", usage={"cost": 2.0})])
    _assert_round_trip_changes_nothing(store, fork)
    # pi wrote on in the exported file: the rest goes to the fork, after its own entries.
    longer = store.export_pi_session(fork) + '{"type":"label","id":"f2","parentId":"f1","timestamp":"t","targetId":"f1","label":"x"}\n'
    result = import_pi_file(store, longer)
    assert (result.session_id, result.status, result.appended) == (fork, "extended", 1)
    assert [e["id"] for e in store.read_session(fork).entries] == ["f1", "f2"]
    assert [e["id"] for e in store.load_session_entries(sid)] == ["a1", "a2", "a3"]


@pytest.mark.parametrize(
    ("position", "edit"),
    [
        (1, lambda e: e["message"]["usage"]["cost"].update(output=2)),  # 1.0 in the store, 2 in the file
        (2, lambda e: e["message"].update(content="other")),
        (1, lambda e: e.update(type="redacted", redacted={"reason": "r", "redactionId": "x", "type": "message"})),
    ],
    ids=["another-number", "other-content", "a-tombstone-of-an-entry-not-redacted"],
)
def test_an_export_edited_is_still_refused_and_nothing_is_written(store: SessionStore, position: int, edit: Any) -> None:
    import json

    sid = store.create_session(cwd="/repo").session_id
    store.append_session_entries(sid, PYTHON_NUMBERS[:3])
    before = _snapshot(store, sid)
    lines = store.export_pi_session(sid).splitlines()
    entry = json.loads(lines[position])
    edit(entry)
    lines[position] = json.dumps(entry)
    with pytest.raises(ImportConflictError, match=f"line {position + 1}"):
        import_pi_file(store, "\n".join(lines) + "\n")
    assert _snapshot(store, sid) == before
