"""The Google ADK adapter (``store.adapters.adk``) on real S3 and Redis.

ADK's real agent loop (``google.adk.runners.Runner`` driving an ``LlmAgent``) runs on the
service; the only stand-in is the model: ``ScriptedLlm`` subclasses ADK's own ``BaseLlm`` and
answers each request with a canned ``LlmResponse`` (a function call for a user message, which
ADK executes and answers with the tool's response; then text), so every turn is a user event,
a function-call event, a function-response event carrying ``user:``/``app:``/session/``temp:``
state deltas, and a final text event with the agent's ``output_key`` delta. No network, no
API key.

The contract cases of ADK's own session-service tests (tests/unittests/sessions/
test_session_service.py in google/adk-python, the ones every backend registered in its
``_conformance.py`` must pass, plus the database service's stale-writer cases) are ported to
run against the adapter; the rest is what a shared, multi-process service must add: two
processes running the agent on one session at once (the stale one gets ADK's own
``StaleSessionError``, retries after a reload, nothing is lost or merged), a third resuming,
listing through the index, bad input, unknown outcomes and a writer dying between an event
and its shared-scope deltas.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing as mp
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import (
    SessionNotFoundError as AdkSessionNotFoundError,
)
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.models import BaseLlm, LlmRequest, LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.runners import Runner
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
)
from google.adk.tools import ToolContext
from google.adk.tools.tool_confirmation import ToolConfirmation
from google.genai import types

from store.adapters.adk import (
    EVENT_TYPE,
    INDEX_TYPE,
    STALE_SESSION_MESSAGE,
    STATE_TYPE,
    SessionStoreSessionService,
)
from store.aio import AsyncSessionStore
from store.errors import (
    BackendUnavailableError,
    IndeterminateError,
    InvalidEntryError,
    InvalidInputError,
)
from store.retry import RetryPolicy
from harness.pausing import Pause

APP = "counter_app"


# --- the scripted model, the tool, the agent ---------------------------------------------------


class ScriptedLlm(BaseLlm):
    """ADK's model interface with canned answers: a user message gets a call of ``count``
    with the message's text, a function response gets a text answer quoting it."""

    model: str = "scripted"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        last = llm_request.contents[-1]
        responses = [p.function_response for p in last.parts or [] if p.function_response]
        if responses:
            text = f"counted {responses[-1].response}"
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))
            return
        word = "".join(p.text or "" for p in last.parts or [])
        call = types.FunctionCall(name="count", args={"word": word})
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(function_call=call)]))


def count(word: str, tool_context: ToolContext) -> dict[str, Any]:
    """Counts the words seen by this user and app."""
    n = int(tool_context.state.get("user:count", 0)) + 1
    tool_context.state["user:count"] = n
    tool_context.state["app:total"] = int(tool_context.state.get("app:total", 0)) + 1
    tool_context.state["last_word"] = word
    tool_context.state["temp:scratch"] = word  # never stored
    return {"n": n, "word": word}


def make_agent() -> LlmAgent:
    return LlmAgent(name="counter", model=ScriptedLlm(), tools=[count], output_key="reply")


def make_runner(service: BaseSessionService, plugins: list[BasePlugin] | None = None) -> Runner:
    return Runner(app=App(name=APP, root_agent=make_agent(), plugins=plugins or []),
                  session_service=service)


def user_text(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


async def run_turn(runner: Runner, user_id: str, session_id: str, text: str) -> list[Event]:
    return [e async for e in runner.run_async(user_id=user_id, session_id=session_id,
                                               new_message=user_text(text))]


def function_responses(events: list[Event]) -> list[dict[str, Any]]:
    return [
        dict(p.function_response.response or {})
        for e in events
        for p in (e.content.parts if e.content else None) or []
        if p.function_response
    ]


# --- stores ------------------------------------------------------------------------------------


class Urls:
    def __init__(self, s3_url: str, redis_url: str, redis_prefix: str) -> None:
        self.s3_url, self.redis_url, self.redis_prefix = s3_url, redis_url, redis_prefix

    async def store(self, **options: Any) -> AsyncSessionStore:
        return await AsyncSessionStore.open(self.s3_url, self.redis_url, redis_prefix=self.redis_prefix,
                                            **options)

    async def service(self, **options: Any) -> SessionStoreSessionService:
        return SessionStoreSessionService(await self.store(**options), owns_store=True)

    def run(self, body: Callable[[SessionStoreSessionService], Awaitable[None]]) -> None:
        async def main() -> None:
            async with await self.service() as service:
                await body(service)

        asyncio.run(main())


@pytest.fixture
def urls(s3_url: str, redis_url: str, redis_prefix: str) -> Urls:
    return Urls(s3_url, redis_url, redis_prefix)


def forkserver() -> Any:
    """Worker processes forked from a server that has ADK and the store imported once."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["google.adk.runners", "google.adk.agents", "store.aio",
                                "store.adapters.adk"])
    return ctx


# --- ADK's real loop on the adapter ------------------------------------------------------------


def test_runner_turns_are_stored_and_resumed_by_a_fresh_service(urls: Urls) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id="ann", state={"mood": "calm"})
        runner = make_runner(service)
        first = await run_turn(runner, "ann", session.id, "hello")
        second = await run_turn(runner, "ann", session.id, "world")
        assert function_responses(first) == [{"n": 1, "word": "hello"}]
        assert function_responses(second) == [{"n": 2, "word": "world"}]

        # A fresh service over a fresh store (another process, in effect) resumes it.
        async with await urls.service() as other:
            got = await other.get_session(app_name=APP, user_id="ann", session_id=session.id)
            assert got is not None
            # user, function call, function response, text; twice.
            assert [e.author for e in got.events] == ["user", "counter", "counter", "counter"] * 2
            assert got.state == {
                "mood": "calm", "last_word": "world", "reply": "counted {'n': 2, 'word': 'world'}",
                "user:count": 2, "app:total": 2,
            }
            assert all("temp:scratch" not in e.actions.state_delta for e in got.events)
            stored = await other.get_session(app_name=APP, user_id="ann", session_id=session.id)
            assert stored == got
            third = await run_turn(make_runner(other), "ann", session.id, "again")
            assert function_responses(third) == [{"n": 3, "word": "again"}]

        # Another session of the same user shares user: and app: state, not session state.
        s2 = await service.create_session(app_name=APP, user_id="ann")
        assert s2.state == {"user:count": 3, "app:total": 3}
        await run_turn(runner, "ann", s2.id, "more")
        s3 = await service.create_session(app_name=APP, user_id="bob")
        assert s3.state == {"app:total": 4}
        assert await service.get_user_state(app_name=APP, user_id="ann") == {"count": 4}

        # What the store holds: one custom entry per event, the delta inside the event.
        entries = await service.store.load_session_entries(
            service.store_session_id(APP, "ann", session.id))
        assert [e["customType"] for e in entries] == [EVENT_TYPE] * 12
        assert [e["id"] for e in entries] == [f"ev:{e.id}" for e in
                                              (await service.get_session(app_name=APP, user_id="ann",
                                                                         session_id=session.id)).events]
        assert entries[0]["parentId"] is None
        assert all(b["parentId"] == a["id"] for a, b in itertools.pairwise(entries))

    urls.run(body)


# --- two processes on one session ----------------------------------------------------------------


class BarrierPlugin(BasePlugin):
    """Holds the first user message until every writer has loaded the session (ADK calls
    ``on_user_message_callback`` after the Runner's ``get_session``, before it appends)."""

    def __init__(self, barrier: Any) -> None:
        super().__init__(name="barrier")
        self.barrier = barrier
        self.used = False

    async def on_user_message_callback(self, *, invocation_context: Any, user_message: Any) -> None:
        if not self.used:
            self.used = True
            self.barrier.wait(60)


class RecordingService(SessionStoreSessionService):
    """The adapter, logging each ``append_event`` outcome (the acknowledgement history)."""

    def __init__(self, store: AsyncSessionStore, log: Any, wid: int) -> None:
        super().__init__(store, owns_store=True)
        self.log, self.wid = log, wid

    async def append_event(self, session: Any, event: Event) -> Event:
        try:
            result = await super().append_event(session, event)
        except Exception as exc:
            self._write({"refused": event.id, "error": type(exc).__name__, "message": str(exc)})
            raise
        if not event.partial:
            self._write({"ack": event.id})
        return result

    def _write(self, record: dict[str, Any]) -> None:
        self.log.write(json.dumps({"wid": self.wid, **record}) + "\n")
        self.log.flush()


def _writer(s3_url: str, redis_url: str, redis_prefix: str, session_id: str, wid: int,
            turns: int, barrier: Any, log_path: str) -> None:
    with open(log_path, "a") as log:
        asyncio.run(_writer_main(Urls(s3_url, redis_url, redis_prefix), session_id, wid, turns,
                                 barrier, log))


async def _writer_main(urls: Urls, session_id: str, wid: int, turns: int, barrier: Any,
                       log: Any) -> None:
    rng = random.Random(wid)
    async with RecordingService(await urls.store(), log, wid) as service:
        runner = make_runner(service, [BarrierPlugin(barrier)])
        for turn in range(turns):
            for _ in range(50):
                try:
                    await run_turn(runner, "u", session_id, f"w{wid}t{turn}")
                    break
                except StaleSessionError as exc:
                    # Another process appended since this Runner loaded the session: the
                    # next run loads it again.
                    log.write(json.dumps({"wid": wid, "stale_turn": turn, "message": str(exc)}) + "\n")
                    await asyncio.sleep(rng.uniform(0, 0.05))
            else:
                raise AssertionError(f"writer {wid}: turn {turn} lost 50 rounds")


def _resumer(s3_url: str, redis_url: str, redis_prefix: str, session_id: str, go: Any,
             out_path: str) -> None:
    go.wait(180)  # started with the writers (its start-up overlaps theirs), runs after them

    async def main() -> dict[str, Any]:
        async with await Urls(s3_url, redis_url, redis_prefix).service() as service:
            before = await service.get_session(app_name=APP, user_id="u", session_id=session_id)
            assert before is not None
            await run_turn(make_runner(service), "u", session_id, "resumed")
            after = await service.get_session(app_name=APP, user_id="u", session_id=session_id)
            assert after is not None
            return {
                "events": [e.model_dump(mode="json", exclude_none=True) for e in before.events],
                "state": before.state,
                "after_events": [e.id for e in after.events],
                "after_state": after.state,
            }

    Path(out_path).write_text(json.dumps(asyncio.run(main())))


@pytest.mark.timeout(240)
def test_two_processes_on_one_session_stale_writer_retries_nothing_merged(
    urls: Urls, tmp_path: Path
) -> None:
    async def create() -> str:
        async with await urls.service() as service:
            return (await service.create_session(app_name=APP, user_id="u", state={"k": "v"})).id

    session_id = asyncio.run(create())
    ctx = forkserver()
    barrier = ctx.Barrier(2)
    turns = 2
    logs = [tmp_path / f"w{i}.jsonl" for i in range(2)]
    procs = [
        ctx.Process(target=_writer, args=(urls.s3_url, urls.redis_url, urls.redis_prefix, session_id,
                                          i, turns, barrier, str(logs[i])))
        for i in range(2)
    ]
    go = ctx.Event()
    out = tmp_path / "resumer.json"
    resumer = ctx.Process(target=_resumer, args=(urls.s3_url, urls.redis_url, urls.redis_prefix,
                                                 session_id, go, str(out)))
    for p in [*procs, resumer]:
        p.start()
    for p in procs:
        p.join(180)
        assert p.exitcode == 0
    go.set()
    records = [json.loads(line) for path in logs for line in path.read_text().splitlines()]

    # Both loaded the same session before either appended: one of them was refused with
    # ADK's own error and message, and its run was retried after a reload.
    stale = [r for r in records if "stale_turn" in r]
    assert stale and all(r["message"] == STALE_SESSION_MESSAGE for r in stale)
    refused = [r for r in records if "refused" in r]
    assert refused and {r["error"] for r in refused} == {"StaleSessionError"}

    resumer.join(120)
    assert resumer.exitcode == 0
    seen = json.loads(out.read_text())
    stored_ids = [e["id"] for e in seen["events"]]

    # Every acknowledged event is stored exactly once, in each writer's own order; no refused
    # event is.
    assert len(stored_ids) == len(set(stored_ids))
    for wid in range(2):
        acked = [r["ack"] for r in records if r["wid"] == wid and "ack" in r]
        assert acked and [i for i in stored_ids if i in set(acked)] == acked
    acked_all = {r["ack"] for r in records if "ack" in r}
    assert set(stored_ids) == acked_all
    assert not {r["refused"] for r in refused} & set(stored_ids)
    # Every writer's every turn got through (a turn refused halfway keeps what was committed
    # before the refusal: its retry calls the tool again).
    words = [r["word"] for r in function_responses([Event.model_validate(e) for e in seen["events"]])]
    assert set(words) == {f"w{w}t{t}" for w in range(2) for t in range(turns)}
    # Nothing merged silently: every counted call saw all the calls committed before it, so the
    # folded user: and app: counters are exactly the number of committed tool calls.
    responses = function_responses([Event.model_validate(e) for e in seen["events"]])
    assert [r["n"] for r in responses] == list(range(1, len(responses) + 1))
    assert seen["state"]["user:count"] == seen["state"]["app:total"] == len(responses)
    assert seen["state"]["last_word"] == responses[-1]["word"]
    assert seen["state"]["k"] == "v"
    # The third process resumed the conversation after every event.
    assert seen["after_events"][: len(stored_ids)] == stored_ids
    assert len(seen["after_events"]) == len(stored_ids) + 4
    assert seen["after_state"]["user:count"] == len(responses) + 1
    assert seen["after_state"]["last_word"] == "resumed"


# --- the stale-writer rule in one process ------------------------------------------------------


def test_stale_session_object_is_refused_and_nothing_is_written(urls: Urls) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        a = await service.create_session(app_name=APP, user_id="u", session_id="s")
        b = await service.get_session(app_name=APP, user_id="u", session_id="s")
        assert b is not None
        await service.append_event(a, Event(author="user", actions=EventActions(state_delta={"x": 1})))
        sid = service.store_session_id(APP, "u", "s")
        before = await service.store.load_session_entries(sid)
        with pytest.raises(StaleSessionError, match="modified in storage") as info:
            await service.append_event(b, Event(author="user", actions=EventActions(state_delta={"x": 2})))
        assert isinstance(info.value, ValueError)
        assert await service.store.load_session_entries(sid) == before
        assert b.events == [] and "x" not in b.state  # the stale object is left as it was
        # Reloaded, the same writer appends after the other's event.
        b = await service.get_session(app_name=APP, user_id="u", session_id="s")
        await service.append_event(b, Event(author="user", actions=EventActions(state_delta={"x": 2})))
        got = await service.get_session(app_name=APP, user_id="u", session_id="s")
        assert got.state == {"x": 2} and len(got.events) == 2
        # A filtered read still knows the real tail: appending after it is not stale.
        c = await service.get_session(app_name=APP, user_id="u", session_id="s",
                                      config=GetSessionConfig(num_recent_events=0))
        assert c.events == []
        await service.append_event(c, Event(author="user"))
        # Tasks sharing one session object are serialised, not refused.
        await asyncio.gather(*(service.append_event(c, Event(author="user")) for _ in range(3)))
        got = await service.get_session(app_name=APP, user_id="u", session_id="s")
        assert len(got.events) == 6

    urls.run(body)


# --- ported: ADK's session-service contract (tests/unittests/sessions/test_session_service.py) --


def test_create_get_session(urls: Urls) -> None:
    """test_get_empty_session, test_create_get_session."""

    async def body(service: SessionStoreSessionService) -> None:
        assert not await service.get_session(app_name="my_app", user_id="test_user", session_id="123")
        state = {"key": "value"}
        session = await service.create_session(app_name="my_app", user_id="test_user", state=state)
        assert session.app_name == "my_app" and session.user_id == "test_user"
        assert session.id
        assert session.state == state
        assert session.last_update_time <= time.time()
        got = await service.get_session(app_name="my_app", user_id="test_user", session_id=session.id)
        assert got == session
        await service.delete_session(app_name="my_app", user_id="test_user", session_id=session.id)
        assert await service.get_session(app_name="my_app", user_id="test_user",
                                         session_id=session.id) is None

    urls.run(body)


def test_create_and_list_sessions(urls: Urls) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        session_ids = ["session" + str(i) for i in range(5)]
        for session_id in session_ids:
            await service.create_session(app_name="my_app", user_id="test_user", session_id=session_id,
                                         state={"key": "value" + session_id})
        sessions = (await service.list_sessions(app_name="my_app", user_id="test_user")).sessions
        assert {s.id for s in sessions} == set(session_ids) and len(sessions) == 5
        for session in sessions:
            assert session.state == {"key": "value" + session.id}
            assert session.events == []

    urls.run(body)


def test_list_sessions_ordered_by_last_update_time(urls: Urls) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        for session_id in ("a", "b", "c"):
            await service.create_session(app_name="my_app", user_id="test_user", session_id=session_id)
        session_a = await service.get_session(app_name="my_app", user_id="test_user", session_id="a")
        await asyncio.sleep(0.01)
        await service.append_event(session=session_a, event=Event(invocation_id="invocation", author="user"))
        listed = await service.list_sessions(app_name="my_app", user_id="test_user")
        assert [s.id for s in listed.sessions] == ["b", "c", "a"]

    urls.run(body)


def test_list_sessions_all_users(urls: Urls) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        await service.create_session(app_name="my_app", user_id="user1", session_id="session1a",
                                     state={"key": "value1a"})
        await service.create_session(app_name="my_app", user_id="user1", session_id="session1b",
                                     state={"key": "value1b"})
        await service.create_session(app_name="my_app", user_id="user2", session_id="session2a",
                                     state={"key": "value2a"})
        s1 = {s.id: s for s in (await service.list_sessions(app_name="my_app", user_id="user1")).sessions}
        assert set(s1) == {"session1a", "session1b"}
        assert s1["session1a"].state == {"key": "value1a"}
        assert s1["session1b"].state == {"key": "value1b"}
        s2 = (await service.list_sessions(app_name="my_app", user_id="user2")).sessions
        assert [s.id for s in s2] == ["session2a"] and s2[0].state == {"key": "value2a"}
        every = {s.id: s for s in (await service.list_sessions(app_name="my_app", user_id=None)).sessions}
        assert {k: v.state["key"] for k, v in every.items()} == {
            "session1a": "value1a", "session1b": "value1b", "session2a": "value2a"}
        assert (await service.list_sessions(app_name="unknown_app")).sessions == []
        assert (await service.list_sessions(app_name="my_app", user_id="nobody")).sessions == []

    urls.run(body)


def test_app_user_and_session_state_scopes(urls: Urls) -> None:
    """test_app_state_is_shared_by_all_users_of_app,
    test_user_state_is_shared_only_by_user_sessions, test_session_state_is_not_shared."""

    async def body(service: SessionStoreSessionService) -> None:
        session1 = await service.create_session(app_name="my_app", user_id="u1", session_id="s1",
                                                state={"app:k1": "v1"})
        event = Event(invocation_id="inv1", author="user", actions=EventActions(state_delta={"app:k2": "v2"}))
        await service.append_event(session=session1, event=event)
        session2 = await service.create_session(app_name="my_app", user_id="u2", session_id="s2")
        assert session2.state == {"app:k1": "v1", "app:k2": "v2"}
        got = await service.get_session(app_name="my_app", user_id="u1", session_id="s1")
        assert got.state.get("app:k1") == "v1" and got.state.get("app:k2") == "v2"

        session1 = await service.create_session(app_name="user_app", user_id="u1", session_id="s1",
                                                state={"user:k1": "v1"})
        event = Event(invocation_id="inv1", author="user", actions=EventActions(state_delta={"user:k2": "v2"}))
        await service.append_event(session=session1, event=event)
        session1b = await service.create_session(app_name="user_app", user_id="u1", session_id="s1b")
        assert session1b.state == {"user:k1": "v1", "user:k2": "v2"}
        session2 = await service.create_session(app_name="user_app", user_id="u2", session_id="s2")
        assert session2.state == {}

        session1 = await service.create_session(app_name="session_app", user_id="u1", session_id="s1",
                                                state={"sk1": "v1"})
        event = Event(invocation_id="inv1", author="user", actions=EventActions(state_delta={"sk2": "v2"}))
        await service.append_event(session=session1, event=event)
        got = await service.get_session(app_name="session_app", user_id="u1", session_id="s1")
        assert got.state.get("sk1") == "v1" and got.state.get("sk2") == "v2"
        session1b = await service.create_session(app_name="session_app", user_id="u1", session_id="s1b")
        assert session1b.state == {}

    urls.run(body)


def test_state_delta_values_replace_store_null_and_keep_types(urls: Urls) -> None:
    """test_dict_valued_state_delta_replaces_stored_value, test_none_valued_state_delta_is_
    stored_not_dropped, test_boolean_state_survives_unrelated_state_delta,
    test_app_state_dict_valued_delta_replaces_stored_value,
    test_user_state_none_valued_delta_is_stored_not_dropped."""

    async def body(service: SessionStoreSessionService) -> None:
        session = await service.create_session(
            app_name="my_app", user_id="u1", session_id="s1",
            state={"profile": {"name": "ada", "role": "admin"}, "flag": True, "off": False,
                   "app:cfg": {"name": "ada", "role": "admin"}, "user:pref": "dark_mode"})
        event = Event(invocation_id="inv1", author="user", actions=EventActions(state_delta={
            "profile": {"name": "bob"}, "flag": None, "new_flag": True,
            "app:cfg": {"name": "bob"}, "user:pref": None}))
        await service.append_event(session=session, event=event)
        reloaded = await service.get_session(app_name="my_app", user_id="u1", session_id="s1")
        for state in (reloaded.state, session.state):
            assert state["profile"] == {"name": "bob"}
            assert "flag" in state and state["flag"] is None
            assert state["new_flag"] is True and state["off"] is False
            assert state["app:cfg"] == {"name": "bob"}
            assert "user:pref" in state and state["user:pref"] is None
        other = await service.create_session(app_name="my_app", user_id="u2", session_id="s2")
        assert other.state == {"app:cfg": {"name": "bob"}}
        same_user = await service.create_session(app_name="my_app", user_id="u1", session_id="s3")
        assert same_user.state == {"app:cfg": {"name": "bob"}, "user:pref": None}

    urls.run(body)


def test_temp_state_and_partial_events_are_not_persisted(urls: Urls) -> None:
    """test_temp_state_is_not_persisted_in_state_or_events,
    test_temp_state_visible_across_sequential_events, test_partial_events_are_not_persisted."""

    async def body(service: SessionStoreSessionService) -> None:
        partial = await service.create_session(app_name="my_app", user_id="user")
        await service.append_event(partial, Event(author="user", partial=True))
        assert len(partial.events) == 0
        got = await service.get_session(app_name="my_app", user_id="user", session_id=partial.id)
        assert len(got.events) == 0
        session = await service.create_session(app_name="my_app", user_id="u1", session_id="s1")
        event = Event(invocation_id="inv1", author="user",
                      actions=EventActions(state_delta={"temp:k1": "v1", "sk": "v2"}))
        await service.append_event(session=session, event=event)
        # test_temp_state_visible_across_sequential_events: the same object sees it.
        assert session.state.get("temp:k1") == "v1" and session.state.get("sk") == "v2"
        assert "temp:k1" not in event.actions.state_delta
        assert event.actions.state_delta.get("sk") == "v2"
        got = await service.get_session(app_name="my_app", user_id="u1", session_id="s1")
        assert got.state == {"sk": "v2"}
        assert got.events[0].actions.state_delta == {"sk": "v2"}

    urls.run(body)


def test_get_session_respects_user_id(urls: Urls) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        session1 = await service.create_session(app_name="my_app", user_id="u1", session_id="s1")
        await service.append_event(session1, Event(invocation_id="inv1", author="user"))
        await service.create_session(app_name="my_app", user_id="u2", session_id="s1")
        got = await service.get_session(app_name="my_app", user_id="u2", session_id="s1")
        assert got.user_id == "u2" and len(got.events) == 0
        # test_delete_session_sync_removes_only_the_targeted_users_session
        await service.delete_session(app_name="my_app", user_id="u1", session_id="s1")
        assert await service.get_session(app_name="my_app", user_id="u1", session_id="s1") is None
        assert await service.get_session(app_name="my_app", user_id="u2", session_id="s1") is not None
        # test_delete_session_sync_unknown_session_is_a_noop
        await service.delete_session(app_name="my_app", user_id="u2", session_id="unknown")
        await service.delete_session(app_name="unknown_app", user_id="u2", session_id="s1")
        assert await service.get_session(app_name="my_app", user_id="u2", session_id="s1") is not None

    urls.run(body)


def test_create_session_with_existing_id_raises_error(urls: Urls) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        await service.create_session(app_name="my_app", user_id="test_user", session_id="existing_session",
                                     state={"keep": "original"})
        with pytest.raises(AlreadyExistsError):
            await service.create_session(app_name="my_app", user_id="test_user",
                                         session_id="existing_session")
        # test_create_session_with_padded_duplicate_id_raises_error
        with pytest.raises(AlreadyExistsError):
            await service.create_session(app_name="my_app", user_id="test_user",
                                         session_id="  existing_session  ", state={"keep": "clobbered"})
        got = await service.get_session(app_name="my_app", user_id="test_user", session_id="existing_session")
        assert got.state["keep"] == "original"
        listed = await service.list_sessions(app_name="my_app", user_id="test_user")
        assert [s.id for s in listed.sessions] == ["existing_session"]
        # test_create_session_with_blank_id_generates_one
        blank = await service.create_session(app_name="my_app", user_id="test_user", session_id="   ")
        assert blank.id.strip()

    urls.run(body)


def test_padded_session_id_reads_and_deletes(urls: Urls) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        created = await service.create_session(app_name="my_app", user_id="test_user",
                                               session_id="order-42\n", state={"cart": "book"})
        assert created.id == "order-42"
        got = await service.get_session(app_name="my_app", user_id="test_user", session_id="order-42\n")
        assert got is not None and got.id == "order-42" and got.state["cart"] == "book"
        await service.delete_session(app_name="my_app", user_id="test_user", session_id="order-42\n")
        assert await service.get_session(app_name="my_app", user_id="test_user", session_id="order-42") is None

    urls.run(body)


def test_append_event_bytes_and_complete_events_round_trip(urls: Urls) -> None:
    """test_append_event_bytes, test_append_event_complete,
    test_append_event_with_requested_tool_confirmations."""

    async def body(service: SessionStoreSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="user")
        content = types.Content(role="user", parts=[
            types.Part.from_bytes(data=b"test_image_data", mime_type="image/png")])
        grounding = types.GroundingMetadata(search_entry_point=types.SearchEntryPoint(sdk_blob=b"blob"))
        await service.append_event(session, Event(invocation_id="invocation", author="user",
                                                  content=content, grounding_metadata=grounding))
        assert session.events[0].content == content
        got = await service.get_session(app_name="my_app", user_id="user", session_id=session.id)
        assert len(got.events) == 1
        assert got.events[0].content == content and got.events[0].grounding_metadata == grounding

        event = Event(
            invocation_id="invocation", author="user",
            content=types.Content(role="user", parts=[types.Part(text="test_text")]),
            turn_complete=True, partial=False,
            actions=EventActions(artifact_delta={"file": 0}, transfer_to_agent="agent", escalate=True,
                                 requested_tool_confirmations={"tool_call_1": ToolConfirmation(
                                     hint="dynamic hint", confirmed=False,
                                     payload={"collection_name": "photos", "resource_id": "album_1"})}),
            long_running_tool_ids={"tool1"}, error_code="error_code", error_message="error_message",
            interrupted=True,
            grounding_metadata=types.GroundingMetadata(web_search_queries=["query1"]),
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=1, candidates_token_count=1, total_token_count=2),
            citation_metadata=types.CitationMetadata(),
            custom_metadata={"custom_key": "custom_value"},
            timestamp=1700000000.123,
            input_transcription=types.Transcription(text="input transcription", finished=True),
            output_transcription=types.Transcription(text="output transcription", finished=True),
        )
        await service.append_event(session=session, event=event)
        got = await service.get_session(app_name="my_app", user_id="user", session_id=session.id)
        assert got == session
        tc = got.events[-1].actions.requested_tool_confirmations["tool_call_1"]
        assert tc.hint == "dynamic hint" and not tc.confirmed
        assert tc.payload == {"collection_name": "photos", "resource_id": "album_1"}

    urls.run(body)


def test_append_event_with_non_serializable_state_delta(urls: Urls) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="user")
        event = Event(invocation_id="invocation", author="user",
                      actions=EventActions(state_delta={"callback": lambda: 1, "ok": 2,
                                                        "nan": float("nan")}))
        await service.append_event(session=session, event=event)
        got = await service.get_session(app_name="my_app", user_id="user", session_id=session.id)
        assert len(got.events) == 1
        assert got.state["ok"] == 2
        assert isinstance(got.state["callback"], str)
        assert got.state["nan"] is None  # JSON has no NaN: stored as null, as pydantic writes it

    urls.run(body)


def test_session_last_update_time_updates_on_event(urls: Urls) -> None:
    """test_session_last_update_time_updates_on_event,
    test_append_event_allows_markerless_current_session."""

    async def body(service: SessionStoreSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="user")
        original = session.last_update_time
        event = Event(invocation_id="invocation", author="user", timestamp=original + 10)
        await service.append_event(session=session, event=event)
        assert session.last_update_time == pytest.approx(original + 10, abs=1e-6)
        refreshed = await service.get_session(app_name="my_app", user_id="user", session_id=session.id)
        assert refreshed.last_update_time == pytest.approx(original + 10, abs=1e-6)
        assert refreshed.last_update_time > original
        # A session object without the revision marker (built elsewhere) but current.
        session._storage_update_marker = None
        session.last_update_time -= 0.0001
        await service.append_event(session, Event(invocation_id="inv2", author="user",
                                                  timestamp=original + 20))
        got = await service.get_session(app_name="my_app", user_id="user", session_id=session.id)
        assert [e.invocation_id for e in got.events] == ["invocation", "inv2"]

    urls.run(body)


def test_append_event_to_deleted_session_raises_session_not_found(urls: Urls) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="user")
        await service.delete_session(app_name="my_app", user_id="user", session_id=session.id)
        with pytest.raises(AdkSessionNotFoundError):
            await service.append_event(session, Event(invocation_id="inv1", author="user"))
        # Created again under the same id: the old object is stale, not merged into the new one.
        again = await service.create_session(app_name="my_app", user_id="user", session_id=session.id)
        await service.append_event(again, Event(invocation_id="inv1", author="user"))
        with pytest.raises(StaleSessionError):
            await service.append_event(session, Event(invocation_id="inv2", author="user"))
        listed = await service.list_sessions(app_name="my_app", user_id="user")
        assert [s.id for s in listed.sessions] == [session.id]
        # Still empty when deleted and created again: the new life is another session too.
        empty = await service.create_session(app_name="my_app", user_id="user", session_id="e")
        await service.delete_session(app_name="my_app", user_id="user", session_id="e")
        await service.create_session(app_name="my_app", user_id="user", session_id="e")
        with pytest.raises(StaleSessionError):
            await service.append_event(empty, Event(invocation_id="inv1", author="user"))
        got = await service.get_session(app_name="my_app", user_id="user", session_id="e")
        assert got.events == []

    urls.run(body)


def test_append_event_to_stale_session(urls: Urls) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        now = time.time()
        original = await service.create_session(app_name="my_app", user_id="user")
        await service.append_event(original, Event(invocation_id="inv1", author="user", timestamp=now + 1,
                                                   actions=EventActions(state_delta={"sk1": "v1"})))
        updated = await service.get_session(app_name="my_app", user_id="user", session_id=original.id)
        await service.append_event(updated, Event(invocation_id="inv2", author="user", timestamp=now + 2,
                                                  actions=EventActions(state_delta={"sk2": "v2"})))
        assert original.last_update_time < updated.last_update_time
        assert len(original.events) == 1 and "sk2" not in original.state
        with pytest.raises(StaleSessionError, match="modified in storage"):
            await service.append_event(original, Event(invocation_id="inv3", author="user",
                                                        timestamp=now + 3,
                                                        actions=EventActions(state_delta={"sk3": "v3"})))
        final = await service.get_session(app_name="my_app", user_id="user", session_id=original.id)
        assert len(final.events) == 2
        assert final.state.get("sk1") == "v1" and final.state.get("sk2") == "v2"
        assert final.state.get("sk3") is None
        assert [e.invocation_id for e in final.events] == ["inv1", "inv2"]

    urls.run(body)


def test_append_event_concurrent_stale_sessions_reject_stale_writer(urls: Urls) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="user")
        iterations = 4
        for i in range(iterations):
            latest = await service.get_session(app_name="my_app", user_id="user", session_id=session.id)
            stale_1, stale_2 = latest.model_copy(deep=True), latest.model_copy(deep=True)
            base = latest.last_update_time + 10.0
            event_1 = Event(invocation_id=f"inv{i}-1", author="user", timestamp=base + 1.0,
                            actions=EventActions(state_delta={f"sk{i}-1": f"v{i}-1"}))
            event_2 = Event(invocation_id=f"inv{i}-2", author="user", timestamp=base + 2.0,
                            actions=EventActions(state_delta={f"sk{i}-2": f"v{i}-2"}))
            results = await asyncio.gather(service.append_event(stale_1, event_1),
                                           service.append_event(stale_2, event_2),
                                           return_exceptions=True)
            errors = [r for r in results if isinstance(r, Exception)]
            assert len(errors) == 1 and isinstance(errors[0], StaleSessionError)
            assert "modified in storage" in str(errors[0])
        final = await service.get_session(app_name="my_app", user_id="user", session_id=session.id)
        for i in range(iterations):
            values = {final.state.get(f"sk{i}-1"), final.state.get(f"sk{i}-2")}
            assert values & {f"v{i}-1", f"v{i}-2"} and None in values
        assert len(final.events) == iterations

    urls.run(body)


def test_get_session_with_config(urls: Urls) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        n = 5
        base = int(time.time())
        session = await service.create_session(app_name="my_app", user_id="user")
        for i in range(1, n + 1):
            await service.append_event(session, Event(author="user", timestamp=base + i))

        async def get(config: GetSessionConfig | None = None) -> list[Event]:
            got = await service.get_session(app_name="my_app", user_id="user", session_id=session.id,
                                            config=config)
            return got.events

        assert len(await get()) == n
        assert not await get(GetSessionConfig(num_recent_events=0))
        events = await get(GetSessionConfig(num_recent_events=3))
        assert len(events) == 3 and events[0].timestamp == base + n - 3 + 1
        events = await get(GetSessionConfig(after_timestamp=base + 4))
        assert len(events) == n - 4 + 1 and events[0].timestamp == base + 4
        assert not await get(GetSessionConfig(after_timestamp=base + n * 10))
        events = await get(GetSessionConfig(after_timestamp=base + 4, num_recent_events=3))
        assert len(events) == n - 4 + 1
        # The state is the whole session's whatever the filter.
        with pytest.raises(ValueError):
            GetSessionConfig(num_recent_events=-1)

    urls.run(body)


def test_events_keep_exact_epochs_and_commit_order(urls: Urls) -> None:
    """test_get_session_keeps_exact_epoch_across_a_repeated_local_hour; and tied timestamps
    (test_get_session_orders_tied_timestamps_by_id): the store keeps the commit order, which
    is the append order, so ties never shuffle."""

    async def body(service: SessionStoreSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="user")
        epochs = [1730613600.0, 1730615400.0]
        for epoch in epochs:
            await service.append_event(session, Event(author="user", timestamp=epoch))
        for event_id in ["event_z", "event_a", "event_m"]:
            await service.append_event(session, Event(author="user", id=event_id, timestamp=100.0))
        got = await service.get_session(app_name="my_app", user_id="user", session_id=session.id)
        assert [e.timestamp for e in got.events][:2] == epochs
        assert [e.id for e in got.events][2:] == ["event_z", "event_a", "event_m"]
        # An event id already in the session is refused (the database's primary key does too).
        with pytest.raises(AlreadyExistsError):
            await service.append_event(got, Event(author="other", id="event_a"))

    urls.run(body)


def test_get_user_state(urls: Urls) -> None:
    """The get_user_state cases: empty, written via append_event, isolated between users and
    apps, available before a session is created, the latest write wins."""

    async def body(service: SessionStoreSessionService) -> None:
        assert await service.get_user_state(app_name="my_app", user_id="u1") == {}
        session = await service.create_session(app_name="my_app", user_id="u1")
        await service.append_event(session, Event(author="system", actions=EventActions(
            state_delta={"user:profile": {"name": "Alice"}, "session_key": 1, "user:counter": 1})))
        await service.append_event(session, Event(author="system", actions=EventActions(
            state_delta={"user:counter": 2})))
        assert await service.get_user_state(app_name="my_app", user_id="u1") == {
            "profile": {"name": "Alice"}, "counter": 2}
        assert await service.get_user_state(app_name="my_app", user_id="u2") == {}
        assert await service.get_user_state(app_name="other_app", user_id="u1") == {}

    urls.run(body)


# --- listing through the index -----------------------------------------------------------------


def test_listing_reads_the_index_not_the_store(urls: Urls) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        for i in range(3):
            s = await service.create_session(app_name="app", user_id="carol", session_id=f"c{i}")
            await service.append_event(s, Event(author="user", timestamp=1000.0 - i))
        await service.create_session(app_name="app", user_id="dave", session_id="d0")
        await service.create_session(app_name="other", user_id="carol", session_id="x")
        await service.delete_session(app_name="app", user_id="carol", session_id="c1")

        def no_scan(*a: Any, **k: Any) -> Any:
            raise AssertionError("list_sessions scanned the whole store")

        service.store.sync.list_sessions = no_scan  # type: ignore[method-assign]
        listed = await service.list_sessions(app_name="app", user_id="carol")
        # least recently updated first
        assert [s.id for s in listed.sessions] == ["c2", "c0"]
        assert [s.last_update_time for s in listed.sessions] == [998.0, 1000.0]
        every = await service.list_sessions(app_name="app")
        assert sorted((s.user_id, s.id) for s in every.sessions) == [
            ("carol", "c0"), ("carol", "c2"), ("dave", "d0")]
        # The index: created before each session existed, deleted after it was gone.
        index = await service.store.load_session_entries(service.ids.index("app", "carol"))
        ops = [(e["data"]["op"], e["data"]["sessionId"]) for e in index if e["customType"] == INDEX_TYPE]
        assert ops == [("created", "c0"), ("created", "c1"), ("created", "c2"), ("deleted", "c1")]

    urls.run(body)


# --- bad input -----------------------------------------------------------------------------------


def test_bad_input_is_refused_with_a_typed_error_and_nothing_changes(urls: Urls) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="u", session_id="s")
        await service.append_event(session, Event(author="user", actions=EventActions(state_delta={"a": 1})))
        sid = service.store_session_id("my_app", "u", "s")
        before = await service.store.load_session_entries(sid)
        store_before = {i.session_id for i in (await service.store.list_sessions()).items}

        for kwargs in (
            {"app_name": None, "user_id": "u"},
            {"app_name": "my_app", "user_id": 7},
            {"app_name": "my_app", "user_id": "u", "session_id": 12},
            {"app_name": "my_app", "user_id": "u", "state": ["not", "a", "dict"]},
        ):
            with pytest.raises(InvalidInputError) as info:
                await service.create_session(**kwargs)
            assert isinstance(info.value, ValueError)
        with pytest.raises(InvalidInputError):
            await service.get_session(app_name="my_app", user_id="u", session_id=None)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError):
            await service.list_sessions(app_name=3)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError):
            await service.delete_session(app_name="my_app", user_id=None, session_id="s")  # type: ignore[arg-type]
        # An event the store cannot hold (its id is over the store's 256 characters).
        marker, events, state = session._storage_update_marker, list(session.events), dict(session.state)
        with pytest.raises(InvalidEntryError) as bad:
            await service.append_event(session, Event(author="user", id="x" * 300,
                                                      actions=EventActions(state_delta={"a": 2})))
        assert isinstance(bad.value, ValueError)
        assert (session._storage_update_marker, session.events, session.state) == (marker, events, state)
        with pytest.raises(pydantic_validation_error()):
            GetSessionConfig(num_recent_events=-1)

        assert await service.store.load_session_entries(sid) == before
        assert {i.session_id for i in (await service.store.list_sessions()).items} == store_before
        # The session goes on as if nothing had been tried.
        await service.append_event(session, Event(author="user", actions=EventActions(state_delta={"a": 3})))
        got = await service.get_session(app_name="my_app", user_id="u", session_id="s")
        assert got.state == {"a": 3} and len(got.events) == 2

    urls.run(body)


def pydantic_validation_error() -> type[Exception]:
    import pydantic

    return pydantic.ValidationError


# --- unknown outcomes, and a writer that dies between an event and its shared deltas ----------------


def test_unknown_outcome_is_resent_and_stored_once(urls: Urls) -> None:
    armed = {"append.after_put"}
    failed: list[str] = []
    target: list[str] = []

    def hook(point: str, info: dict[str, Any]) -> None:
        if target and info.get("session_id") == target[0] and point in armed:
            armed.discard(point)
            failed.append(point)
            raise IndeterminateError(f"injected at {point}")

    async def main() -> None:
        # (claim_ms=0: the re-send need not wait out the advisory claim of the first attempt)
        store = await urls.store(fault_hook=hook, claim_ms=0)
        async with SessionStoreSessionService(store, owns_store=True) as service:
            session = await service.create_session(app_name="my_app", user_id="u", session_id="s")
            target.append(service.store_session_id("my_app", "u", "s"))
            event = Event(author="user", actions=EventActions(state_delta={"k": 1}))
            await service.append_event(session, event)
            assert failed == ["append.after_put"]
            got = await service.get_session(app_name="my_app", user_id="u", session_id="s")
            assert [e.id for e in got.events] == [event.id] and got.state == {"k": 1}
            await service.append_event(got, Event(author="user"))  # the marker is right

    asyncio.run(main())


def test_shared_deltas_of_a_writer_that_died_are_written_by_the_next_reader(urls: Urls) -> None:
    down: set[str] = set()

    def hook(point: str, info: dict[str, Any]) -> None:
        if point == "append.before_put" and info.get("session_id") in down:
            raise BackendUnavailableError("injected: the shared scopes are unreachable")

    async def main() -> None:
        quick = RetryPolicy(attempts=2, initial_wait=0.01, max_wait=0.02)
        store = await urls.store(fault_hook=hook, retry=quick, claim_ms=0)
        async with SessionStoreSessionService(store, owns_store=True) as dying:
            session = await dying.create_session(app_name="my_app", user_id="u", session_id="s")
            down.update({dying.ids.app_state("my_app"), dying.ids.user_state("my_app", "u")})
            event = Event(author="user", actions=EventActions(state_delta={"app:a": 1, "user:b": 2, "c": 3}))
            await dying.append_event(session, event)  # committed; its shared deltas are not
            assert session.state == {"app:a": 1, "user:b": 2, "c": 3}
            async with await urls.service() as other:
                assert await other.get_user_state(app_name="my_app", user_id="u") == {}
                # A reader of the session finds the deltas missing and writes them (once).
                got = await other.get_session(app_name="my_app", user_id="u", session_id="s")
                assert got.state == {"app:a": 1, "user:b": 2, "c": 3}
                assert await other.get_user_state(app_name="my_app", user_id="u") == {"b": 2}
                again = await other.get_session(app_name="my_app", user_id="u", session_id="s")
                assert again == got
                app_entries = await other.store.load_session_entries(other.ids.app_state("my_app"))
                assert [e["customType"] for e in app_entries] == [STATE_TYPE]
            # The dying writer, back, retries what it kept on its next call: a duplicate, stored once.
            down.clear()
            await dying.append_event(session, Event(author="user"))
            user_entries = await dying.store.load_session_entries(dying.ids.user_state("my_app", "u"))
            assert [e["data"]["delta"] for e in user_entries] == [{"b": 2}]

    asyncio.run(main())


def test_service_over_a_sync_store_and_namespaces(urls: Urls) -> None:
    async def main() -> None:
        store = await urls.store()
        try:
            a = SessionStoreSessionService(store.sync, namespace="tenant-a")
            b = SessionStoreSessionService(store, namespace="tenant-b")
            await a.create_session(app_name="app", user_id="u", session_id="s", state={"who": "a"})
            assert await b.get_session(app_name="app", user_id="u", session_id="s") is None
            await b.create_session(app_name="app", user_id="u", session_id="s", state={"who": "b"})
            got = await a.get_session(app_name="app", user_id="u", session_id="s")
            assert got.state == {"who": "a"}
            with pytest.raises(InvalidInputError):
                SessionStoreSessionService(store, namespace="bad/namespace")
            await a.store.close()
        finally:
            await store.close()

    asyncio.run(main())




# --- a writer killed or paused between the event and its shared deltas --------------------------
#
# An event with app:/user: keys is three store appends in order: the event (to its session),
# its app: delta (to the app's scope), its user: delta (to the user's scope). A process may die
# or pause at any point of any of them. Whatever the point, a reader from another process sees
# the event with all of its state or none of it, and each scope holds the event's delta once.

_SHARED = {"app:a": 1, "user:b": 2, "c": 3}

#: (which append, the store's fault point, whether the event is committed when the writer dies)
_DEATHS = [
    ("session", "append.before_check", False),
    ("session", "append.before_put", False),
    ("session", "append.after_put", True),  # PUT, never COMMITted: readers roll it forward
    ("session", "append.after_commit", True),
    ("app", "append.before_check", True),
    ("app", "append.after_put", True),
    ("user", "append.before_put", True),
    ("user", "append.after_put", True),
    ("user", "append.after_commit", True),
]


def _scope_ids(service: SessionStoreSessionService, session_id: str) -> dict[str, str]:
    return {
        "session": service.ids.session(APP, "u", session_id),
        "app": service.ids.app_state(APP),
        "user": service.ids.user_state(APP, "u"),
    }


def _dies_between_appends(s3_url: str, redis_url: str, redis_prefix: str, session_id: str,
                          target: str, point: str) -> None:
    """Runs in a child process: appends one event with shared deltas and dies by SIGKILL the
    moment its store append to ``target`` reaches ``point``."""
    import os
    import signal

    victim: list[str] = []

    def hook(at: str, info: dict[str, Any]) -> None:
        if at == point and victim and info.get("session_id") == victim[0]:
            os.kill(os.getpid(), signal.SIGKILL)

    async def main() -> None:
        urls = Urls(s3_url, redis_url, redis_prefix)
        async with SessionStoreSessionService(await urls.store(fault_hook=hook), owns_store=True) as service:
            session = await service.get_session(app_name=APP, user_id="u", session_id=session_id)
            assert session is not None
            victim.append(_scope_ids(service, session_id)[target])
            await service.append_event(session, Event(id="dying-event", author="user",
                                                      actions=EventActions(state_delta=_SHARED)))

    asyncio.run(main())
    raise SystemExit(3)  # never reached: the hook killed the process


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("target", "point", "committed"), _DEATHS)
def test_writer_killed_between_the_event_and_its_shared_deltas(
    urls: Urls, target: str, point: str, committed: bool
) -> None:
    async def create() -> str:
        async with await urls.service() as service:
            session = await service.create_session(app_name=APP, user_id="u",
                                                   state={"app:x": 0, "user:y": 0})
            return session.id

    session_id = asyncio.run(create())
    ctx = forkserver()
    proc = ctx.Process(target=_dies_between_appends,
                       args=(urls.s3_url, urls.redis_url, urls.redis_prefix, session_id, target, point))
    proc.start()
    proc.join(120)
    assert proc.exitcode == -9  # killed at the point, not finished

    async def read() -> None:
        # (claim_ms=0: the reader's own append need not wait out the dead writer's claim)
        async with await urls.service(claim_ms=0) as reader:
            got = await reader.get_session(app_name=APP, user_id="u", session_id=session_id)
            assert got is not None
            ids = _scope_ids(reader, session_id)
            base = {"app:x": 0, "user:y": 0}
            if committed:
                assert [e.id for e in got.events] == ["dying-event"]
                assert got.state == {**base, **_SHARED}
            else:
                assert got.events == [] and got.state == base
            # Each scope holds the event's delta exactly once (or not at all), and another
            # session of the user sees the user: key.
            for scope, key in (("app", "a"), ("user", "b")):
                deltas = [e["data"]["delta"] for e in await reader.store.load_session_entries(ids[scope])
                          if e.get("customType") == STATE_TYPE]
                assert [d for d in deltas if key in d] == ([{key: _SHARED[f"{scope}:{key}"]}] if committed else [])
            user_state = await reader.get_user_state(app_name=APP, user_id="u")
            assert user_state == ({"y": 0, "b": 2} if committed else {"y": 0})
            again = await reader.get_session(app_name=APP, user_id="u", session_id=session_id)
            assert again == got
            # The reloaded session is the store's: the next event appends on it.
            nxt = Event(author="user", actions=EventActions(state_delta={"user:b": 7}))
            await reader.append_event(again, nxt)
            final = await reader.get_session(app_name=APP, user_id="u", session_id=session_id)
            assert [e.id for e in final.events][-1] == nxt.id
            assert final.state["user:b"] == 7

    asyncio.run(read())


def test_writer_paused_between_its_shared_deltas_doubles_nothing_and_overwrites_nothing(
    urls: Urls,
) -> None:
    """A writer paused after its event and its app: delta, before its user: delta: a reader
    writes the missing delta; another session then sets the same user: key; the writer,
    resumed, re-sends its delta under the same id (a duplicate): the later value stands."""

    async def main() -> None:
        async with await urls.service() as setup:
            await setup.create_session(app_name=APP, user_id="u", session_id="s1")
            await setup.create_session(app_name=APP, user_id="u", session_id="s2")
            user_sid = setup.ids.user_state(APP, "u")
        pause = Pause("append.before_check", when=lambda info: info.get("session_id") == user_sid)
        async with await urls.service(fault_hook=pause) as writer, await urls.service(claim_ms=0) as other:
            s1 = await writer.get_session(app_name=APP, user_id="u", session_id="s1")
            event = Event(author="user", actions=EventActions(state_delta=_SHARED))
            appending = asyncio.ensure_future(writer.append_event(s1, event))
            await asyncio.to_thread(pause.wait_paused)
            assert not appending.done()
            # The event and its app: delta are in; the user: delta is not yet.
            assert await other.get_user_state(app_name=APP, user_id="u") == {}
            got = await other.get_session(app_name=APP, user_id="u", session_id="s1")
            assert [e.id for e in got.events] == [event.id] and got.state == _SHARED
            assert await other.get_user_state(app_name=APP, user_id="u") == {"b": 2}
            s2 = await other.get_session(app_name=APP, user_id="u", session_id="s2")
            assert s2.state == {"app:a": 1, "user:b": 2}
            await other.append_event(s2, Event(author="user", actions=EventActions(state_delta={"user:b": 5})))
            pause.release()
            await appending
            assert s1.state == _SHARED  # the writer's own object, as ADK updates it
            assert await other.get_user_state(app_name=APP, user_id="u") == {"b": 5}
            user_entries = await other.store.load_session_entries(user_sid)
            assert [e["data"]["delta"] for e in user_entries if e.get("customType") == STATE_TYPE] == [
                {"b": 2}, {"b": 5}
            ]
            s1_again = await other.get_session(app_name=APP, user_id="u", session_id="s1")
            assert s1_again.state == {"app:a": 1, "user:b": 5, "c": 3}

    asyncio.run(main())
