"""A Hypothesis state machine: the store against a plain in-memory model.

Random sequences of creates, appends (with and without an expected tail), re-sends, id
collisions, unknown parents, Redis losing everything, deletes and re-creates; after every step
the store must agree with a list-of-batches model.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from store import EMPTY_TAIL, AppendResult, SessionStore
from store.errors import ConflictError, IdCollisionError, SessionExistsError, UnknownParentError
from store.backends.objects import object_store_from_url
from coordination.redis import Coordinator

SESSIONS = ["m1", "m2"]


class StoreMachine(RuleBasedStateMachine):
    objects_url: str = ""
    redis_url: str = ""
    redis_prefix: str = ""

    @initialize()
    def setup(self) -> None:
        coord = Coordinator.from_url(self.redis_url, prefix=self.redis_prefix)
        coord.client.flushdb()
        self.store = SessionStore(object_store_from_url("memory://"), coord)
        self.model: dict[str, list[list[dict[str, Any]]]] = {}
        self.results: dict[str, list[AppendResult]] = {}
        self.counter = 0

    def teardown(self) -> None:
        self.store.close()

    def _ids(self, sid: str) -> list[str]:
        return [e["id"] for batch in self.model.get(sid, []) for e in batch]

    def _new_id(self) -> str:
        self.counter += 1
        return f"e{self.counter}"

    @rule(sid=st.sampled_from(SESSIONS))
    def create(self, sid: str) -> None:
        if sid in self.model:
            with pytest.raises(SessionExistsError):
                self.store.create_session(sid)
        else:
            self.store.create_session(sid)
            self.model[sid] = []
            self.results[sid] = []

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data(), size=st.integers(1, 4), strict=st.booleans(), stale=st.booleans())
    def append(self, data: st.DataObject, size: int, strict: bool, stale: bool) -> None:
        sid = data.draw(st.sampled_from(sorted(self.model)))
        ids = self._ids(sid)
        parent = data.draw(st.sampled_from([None, *ids])) if ids else None
        batch = []
        for _ in range(size):
            eid = self._new_id()
            batch.append({"type": "message", "id": eid, "parentId": parent, "message": {"n": self.counter}})
            parent = eid
        tail = ids[-1] if ids else EMPTY_TAIL
        expected = None
        if strict:
            expected = "not-the-tail" if stale else tail
        if strict and stale:
            with pytest.raises(ConflictError) as err:
                self.store.append_session_entries(sid, batch, expected)
            assert (err.value.actual_tail_entry_id or "") == (tail or "")
            return
        res = self.store.append_session_entries(sid, batch, expected)
        self.model[sid].append(batch)
        self.results[sid].append(res)
        assert res.seq == len(self.model[sid])
        assert (res.last_appended_entry_id, res.appended_count) == (batch[-1]["id"], len(batch))

    @precondition(lambda self: any(self.model.values()))
    @rule(data=st.data())
    def resend(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(s for s, b in self.model.items() if b)))
        i = data.draw(st.integers(0, len(self.model[sid]) - 1))
        assert self.store.append_session_entries(sid, self.model[sid][i]) == self.results[sid][i]

    @precondition(lambda self: any(self.model.values()))
    @rule(data=st.data())
    def collide(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(s for s, b in self.model.items() if b)))
        victim = data.draw(st.sampled_from(self._ids(sid)))
        with pytest.raises(IdCollisionError):
            self.store.append_session_entries(sid, [{"type": "message", "id": victim, "parentId": None, "message": {"other": 1}}])

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def unknown_parent(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.model)))
        with pytest.raises(UnknownParentError):
            self.store.append_session_entries(sid, [{"type": "m", "id": self._new_id(), "parentId": "ghost"}])

    @rule()
    def redis_forgets(self) -> None:
        self.store.coord.client.flushdb()

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.model)))
        self.store.delete_session(sid)
        del self.model[sid]
        del self.results[sid]

    @invariant()
    def store_matches_model(self) -> None:
        if not hasattr(self, "store"):
            return
        for sid, batches in self.model.items():
            assert self.store.load_session_entries(sid) == [e for b in batches for e in b]
            tail = self.store.get_tail(sid)
            assert tail.seq == len(batches)
            assert tail.last_entry_id == (batches[-1][-1]["id"] if batches else "")
        assert {s.session_id for s in self.store.iter_sessions()} == set(self.model)


def test_store_against_model(redis_url: str, redis_prefix: str) -> None:
    StoreMachine.redis_url = redis_url
    StoreMachine.redis_prefix = redis_prefix
    run_state_machine_as_test(
        StoreMachine,
        settings=settings(
            max_examples=40,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
