"""The OpenAI Agents SDK adapter (``store.adapters.openai_agents``) on real S3 and Redis.

The SDK's real agent loop (``Runner.run`` / ``Runner.run_streamed``) drives the session; the
only stand-in is the model: ``ScriptedModel`` implements the SDK's own ``Model`` interface and
returns canned responses (text messages, and function-tool calls that the SDK executes and
answers with tool results), recording the input the Runner sent it. No network, no API key.

The cases of the SDK's own session tests (tests/memory/test_session.py in
openai/openai-agents-python, written for ``SQLiteSession``) are ported to run against the
adapter; the rest is what a shared, multi-process session must add: processes conversing on
one session at once, a third process resuming, concurrent pops, bad input, unknown outcomes.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    ModelResponse,
    RunConfig,
    Runner,
    Session,
    SessionSettings,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from agents.models.interface import Model
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
)

from harness.s3_server import ServerRequests
from store.adapters.openai_agents import (
    CLEAR_TYPE,
    ITEM_TYPE,
    POP_TYPE,
    InvalidItemError,
    SessionStoreSession,
    store_session_id,
)
from store.aio import AsyncSessionStore
from store.errors import (
    BatchTooLargeError,
    IndeterminateError,
    InvalidInputError,
)

set_tracing_disabled(True)  # no trace export (it would want an API key)


# --- the scripted model ------------------------------------------------------------------------


def text_message(text: str, msg_id: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=msg_id,
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(text=text, type="output_text", annotations=[])],
    )


def tool_call(call_id: str, key: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=f"fc-{call_id}",
        call_id=call_id,
        type="function_call",
        name="lookup",
        arguments=json.dumps({"key": key}),
    )


@function_tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


class ScriptedModel(Model):
    """The SDK's ``Model`` interface with canned outputs, one list of output items per call."""

    def __init__(self, outputs: list[list[Any]] | None = None) -> None:
        self.outputs = list(outputs or [])
        self.inputs: list[list[dict[str, Any]]] = []

    def script(self, *outputs: list[Any]) -> None:
        self.outputs.extend(outputs)

    def _next(self, input: str | list[Any]) -> list[Any]:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        self.inputs.append(json.loads(json.dumps(items)))
        if not self.outputs:
            raise AssertionError("the scripted model has no response left")
        return self.outputs.pop(0)

    @property
    def last_input(self) -> list[dict[str, Any]]:
        return self.inputs[-1]

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any,
                           tools: Any, output_schema: Any, handoffs: Any, tracing: Any, *,
                           previous_response_id: Any, conversation_id: Any, prompt: Any,
                           ) -> ModelResponse:
        return ModelResponse(output=self._next(input), usage=Usage(), response_id=None)

    async def stream_response(self, system_instructions: Any, input: Any, model_settings: Any,
                              tools: Any, output_schema: Any, handoffs: Any, tracing: Any, *,
                              previous_response_id: Any = None, conversation_id: Any = None,
                              prompt: Any = None) -> AsyncIterator[Any]:
        output = self._next(input)
        for index, item in enumerate(output):
            yield ResponseOutputItemDoneEvent(
                type="response.output_item.done", item=item, output_index=index, sequence_number=index
            )
        response = Response(
            id="resp-scripted", created_at=0, model="scripted", object="response", output=output,
            tool_choice="auto", tools=[], parallel_tool_calls=False,
        )
        yield ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=len(output)
        )


def turn_script(tag: str, turn: int) -> list[list[Any]]:
    """One turn: a tool call (the SDK runs ``lookup``), then the final text answer."""
    return [[tool_call(f"{tag}-call-{turn}", f"{tag}-key-{turn}")],
            [text_message(f"{tag} answer {turn}", f"{tag}-msg-{turn}")]]


def turn_items(tag: str, turn: int) -> list[dict[str, Any]]:
    """The items the SDK stores for one ``turn_script`` turn, in order."""
    return [
        {"content": f"{tag} question {turn}", "role": "user"},
        {"arguments": json.dumps({"key": f"{tag}-key-{turn}"}), "call_id": f"{tag}-call-{turn}",
         "name": "lookup", "type": "function_call", "id": f"fc-{tag}-call-{turn}"},
        {"call_id": f"{tag}-call-{turn}", "output": f"value of {tag}-key-{turn}",
         "type": "function_call_output"},
        {"id": f"{tag}-msg-{turn}", "content": [{"annotations": [], "text": f"{tag} answer {turn}",
         "type": "output_text"}], "role": "assistant", "status": "completed", "type": "message"},
    ]


def key(item: dict[str, Any]) -> str:
    return json.dumps(item, sort_keys=True)


async def open_store(s3_url: str, redis_url: str, redis_prefix: str, **options: Any) -> AsyncSessionStore:
    return await AsyncSessionStore.open(s3_url, redis_url, redis_prefix=redis_prefix, **options)


def forkserver() -> Any:
    """Worker processes forked from a server that has the SDK and the store imported once
    (importing the SDK is most of a fresh interpreter's start-up)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["agents", "openai", "store.aio", "store.adapters.openai_agents"])
    return ctx


# --- the SDK's own loop on the adapter ----------------------------------------------------------


def test_runner_conversation_with_tool_calls(s3_url: str, redis_url: str, redis_prefix: str) -> None:
    async def main() -> None:
        async with await open_store(s3_url, redis_url, redis_prefix) as store:
            session = SessionStoreSession("conv-1", store)
            assert isinstance(session, Session)  # the SDK's runtime-checkable protocol
            model = ScriptedModel()
            agent = Agent(name="assistant", model=model, tools=[lookup])

            model.script(*turn_script("t", 0))
            result = await Runner.run(agent, "t question 0", session=session)
            assert result.final_output == "t answer 0"
            # The second model call of the turn saw the tool's result, through the session.
            assert model.last_input == turn_items("t", 0)[:3]

            model.script(*turn_script("t", 1))
            result = await Runner.run(agent, "t question 1", session=session)
            assert result.final_output == "t answer 1"
            # The turn's first model call got the whole history, then the new question.
            assert model.inputs[2] == turn_items("t", 0) + turn_items("t", 1)[:1]

            model.script([text_message("t answer 2", "t-msg-2")])
            streamed = Runner.run_streamed(agent, "t question 2", session=session)
            async for _ in streamed.stream_events():
                pass
            assert streamed.final_output == "t answer 2"
            assert model.last_input == turn_items("t", 0) + turn_items("t", 1) + [
                {"content": "t question 2", "role": "user"}
            ]

            expected = turn_items("t", 0) + turn_items("t", 1) + [
                {"content": "t question 2", "role": "user"},
                {"id": "t-msg-2", "content": [{"annotations": [], "text": "t answer 2",
                 "type": "output_text"}], "role": "assistant", "status": "completed", "type": "message"},
            ]
            assert await session.get_items() == expected

            # In the store: one pi custom entry per item, one chain in pi's tree.
            entries = await store.load_session_entries("conv-1")
            assert [e["data"] for e in entries] == expected
            assert all(e["type"] == "custom" and e["customType"] == ITEM_TYPE for e in entries)
            assert [e["parentId"] for e in entries] == [None] + [e["id"] for e in entries[:-1]]

        # Another store (a process that has never seen the session) reads the same history.
        async with await open_store(s3_url, redis_url, redis_prefix) as other:
            assert await SessionStoreSession("conv-1", other).get_items() == expected

    asyncio.run(main())


# --- the SDK's session tests (tests/memory/test_session.py), ported -----------------------------


def test_sdk_session_cases(s3_url: str, redis_url: str, redis_prefix: str) -> None:
    async def main() -> None:
        async with await open_store(s3_url, redis_url, redis_prefix) as store:
            # test_sqlite_session_memory_direct
            session = SessionStoreSession("direct_test", store)
            items: list[Any] = [{"role": "user", "content": "Hello"},
                                {"role": "assistant", "content": "Hi there!"}]
            await session.add_items(items)
            retrieved = await session.get_items()
            assert [(i["role"], i["content"]) for i in retrieved] == [
                ("user", "Hello"), ("assistant", "Hi there!")]
            await session.clear_session()
            assert await session.get_items() == []

            # test_sqlite_session_memory_pop_item
            session = SessionStoreSession("pop_test", store)
            assert await session.pop_item() is None
            await session.add_items([{"role": "user", "content": "Hello"},
                                     {"role": "assistant", "content": "Hi there!"},
                                     {"role": "user", "content": "How are you?"}])
            assert len(await session.get_items()) == 3
            assert await session.pop_item() == {"role": "user", "content": "How are you?"}
            after = await session.get_items()
            assert len(after) == 2 and after[-1]["content"] == "Hi there!"
            assert await session.pop_item() == {"role": "assistant", "content": "Hi there!"}
            assert await session.pop_item() == {"role": "user", "content": "Hello"}
            assert await session.pop_item() is None
            assert await session.get_items() == []

            # test_session_memory_pop_different_sessions
            s1 = SessionStoreSession("session_1", store)
            s2 = SessionStoreSession("session_2", store)
            await s1.add_items([{"role": "user", "content": "Session 1 message"}])
            await s2.add_items([{"role": "user", "content": "Session 2 message 1"},
                                {"role": "user", "content": "Session 2 message 2"}])
            assert (await s2.pop_item() or {}).get("content") == "Session 2 message 2"
            assert [i["content"] for i in await s1.get_items()] == ["Session 1 message"]
            assert [i["content"] for i in await s2.get_items()] == ["Session 2 message 1"]

            # test_sqlite_session_get_items_with_limit
            session = SessionStoreSession("count_test", store)
            contents = ["Message 1", "Response 1", "Message 2", "Response 2", "Message 3", "Response 3"]
            await session.add_items([{"role": "user" if i % 2 == 0 else "assistant", "content": c}
                                     for i, c in enumerate(contents)])
            assert [i["content"] for i in await session.get_items()] == contents
            assert [i["content"] for i in await session.get_items(limit=2)] == contents[-2:]
            assert [i["content"] for i in await session.get_items(limit=4)] == contents[-4:]
            assert [i["content"] for i in await session.get_items(limit=10)] == contents
            assert await session.get_items(limit=0) == []

            # test_sqlite_session_unicode_content, ..._special_characters_and_sql_injection
            session = SessionStoreSession("unicode_test", store)
            odd = ["こんにちは", "😊👍", "Привет", "O'Reilly", "DROP TABLE sessions;",
                   '"SELECT * FROM users WHERE name = "admin";"', "Robert'); DROP TABLE students;--",
                   "line\nbreak\ttab\\back\u0000nul"]
            await session.add_items([{"role": "user", "content": c} for c in odd])
            assert [i["content"] for i in await session.get_items()] == odd

            # test_sqlite_session_concurrent_access: many writers at once, every item kept
            session = SessionStoreSession("concurrent_test", store)
            others = [SessionStoreSession("concurrent_test", store) for _ in range(4)]
            writers = [session, *others]
            await asyncio.gather(*(writers[i % 5].add_items([{"role": "user", "content": f"Message {i}"}])
                                   for i in range(10)))
            got = [i["content"] for i in await session.get_items()]
            assert sorted(got) == sorted(f"Message {i}" for i in range(10))
            for other in others:
                assert [i["content"] for i in await other.get_items()] == got

            # SessionSettings: default, constructor, used by get_items, overridden by limit
            assert isinstance(session.session_settings, SessionSettings)
            assert session.session_settings.limit is None
            limited = SessionStoreSession("settings_test", store, session_settings=SessionSettings(limit=3))
            assert limited.session_settings is not None and limited.session_settings.limit == 3
            await limited.add_items([{"role": "user", "content": f"Message {i}"} for i in range(5)])
            assert [i["content"] for i in await limited.get_items()] == ["Message 2", "Message 3", "Message 4"]
            assert [i["content"] for i in await limited.get_items(limit=2)] == ["Message 3", "Message 4"]
            as_dict = SessionStoreSession("settings_test", store, session_settings={"limit": 1})
            assert [i["content"] for i in await as_dict.get_items()] == ["Message 4"]

            # clear is a marker ordered with the writes: what comes after it stays
            await limited.clear_session()
            await limited.add_items([{"role": "user", "content": "after clear"}])
            assert await SessionStoreSession("settings_test", store).get_items() == [
                {"role": "user", "content": "after clear"}]
            kinds = [e["customType"] for e in await store.load_session_entries("settings_test")]
            assert kinds == [ITEM_TYPE] * 5 + [CLEAR_TYPE, ITEM_TYPE]
            # clearing a session never written creates nothing; delete() removes it for good
            await SessionStoreSession("never_written", store).clear_session()
            assert "never_written" not in {i.session_id for i in (await store.list_sessions()).items}
            await limited.delete()
            assert await limited.get_items() == []
            await limited.add_items([{"role": "user", "content": "reborn"}])
            assert [i["content"] for i in await limited.get_items(limit=None)] == ["reborn"]

    asyncio.run(main())


def test_sdk_runner_cases(s3_url: str, redis_url: str, redis_prefix: str) -> None:
    async def main() -> None:
        async with await open_store(s3_url, redis_url, redis_prefix) as store:
            model = ScriptedModel()
            agent = Agent(name="test", model=model)

            # test_session_memory_different_sessions_parametrized
            cats, dogs = SessionStoreSession("session_cats", store), SessionStoreSession("session_dogs", store)
            model.script([text_message("I like cats", "m1")])
            assert (await Runner.run(agent, "I like cats", session=cats)).final_output == "I like cats"
            model.script([text_message("I like dogs", "m2")])
            await Runner.run(agent, "I like dogs", session=dogs)
            model.script([text_message("Yes, you mentioned cats", "m3")])
            await Runner.run(agent, "What did I say I like?", session=cats)
            assert model.last_input[0]["content"] == "I like cats"
            assert "dogs" not in json.dumps(model.last_input)
            assert len(model.last_input) == 3

            # test_session_memory_appends_list_input_by_default
            session = SessionStoreSession("test_validation", store)
            history: list[Any] = [{"role": "user", "content": "Earlier message"},
                                  {"role": "assistant", "content": "Saved reply"}]
            await session.add_items(history)
            list_input: list[Any] = [{"role": "user", "content": "Test message"}]
            model.script([text_message("This should run", "m4")])
            await Runner.run(agent, list_input, session=session)
            assert model.last_input == history + list_input

            # test_session_callback_prepared_input
            session = SessionStoreSession("callback_test", store)
            history = [{"role": "user", "content": "Hello there."},
                       {"role": "assistant", "content": "Hi, I'm here to assist you."}]
            await session.add_items(history)

            def only_user(old: list[Any], new: list[Any]) -> list[Any]:
                return [item for item in old if item["role"] == "user"] + new

            new_turn: list[Any] = [{"role": "user", "content": "What your name?"}]
            model.script([text_message("I'm gpt-4o", "m5")])
            await Runner.run(agent, new_turn, session=session,
                             run_config=RunConfig(session_input_callback=only_user))
            assert model.last_input == [history[0], new_turn[0]]

            # test_runner_with_session_settings_override
            session = SessionStoreSession("override_test", store, session_settings=SessionSettings(limit=100))
            await session.add_items([{"role": "user", "content": f"Turn {i}"} for i in range(10)])
            model.script([text_message("Got it", "m6")])
            await Runner.run(agent, "New question", session=session,
                             run_config=RunConfig(session_settings=SessionSettings(limit=2)))
            assert [i["content"] for i in model.last_input] == ["Turn 8", "Turn 9", "New question"]

    asyncio.run(main())


# --- processes sharing one session --------------------------------------------------------------


def _converse(s3_url: str, redis_url: str, redis_prefix: str, sid: str, tag: str, turns: int,
              start: Any, out: str) -> None:
    """A worker process: ``turns`` Runner turns on ``sid``; after each, a snapshot of the
    session. Writes what its model was sent and what it read to ``out``."""

    async def main() -> dict[str, Any]:
        session = await SessionStoreSession.open(sid, s3_url, redis_url, redis_prefix=redis_prefix)
        model = ScriptedModel()
        agent = Agent(name=f"agent-{tag}", model=model, tools=[lookup])
        snapshots = []
        if start is not None:
            start.wait(60)
        try:
            for turn in range(turns):
                model.script(*turn_script(tag, turn))
                result = await Runner.run(agent, f"{tag} question {turn}", session=session)
                assert result.final_output == f"{tag} answer {turn}"
                snapshots.append(await session.get_items())
        finally:
            await session.close()
        return {"inputs": model.inputs, "snapshots": snapshots}

    Path(out).write_text(json.dumps(asyncio.run(main())))


def _resume(s3_url: str, redis_url: str, redis_prefix: str, sid: str, out: str) -> None:
    async def main() -> dict[str, Any]:
        session = await SessionStoreSession.open(sid, s3_url, redis_url, redis_prefix=redis_prefix)
        model = ScriptedModel([[text_message("all read", "resume-msg")]])
        try:
            before = await session.get_items()
            result = await Runner.run(Agent(name="resumer", model=model), "what happened?", session=session)
            assert result.final_output == "all read"
            after = await session.get_items()
        finally:
            await session.close()
        return {"input": model.inputs[0], "before": before, "after": after}

    Path(out).write_text(json.dumps(asyncio.run(main())))


def _join(procs: list[Any]) -> None:
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * len(procs)


def test_two_processes_converse_on_one_session_and_a_third_resumes(
    s3_url: str, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    sid, turns, tags = "shared-conversation", 4, ("alpha", "beta")
    ctx = forkserver()
    start = ctx.Barrier(len(tags))
    outs = {tag: tmp_path / f"{tag}.json" for tag in tags}
    # Neither process creates the session beforehand: both create it on first use, at once.
    procs = [ctx.Process(target=_converse, args=(s3_url, redis_url, redis_prefix, sid, tag, turns,
                                                  start, str(outs[tag]))) for tag in tags]
    for p in procs:
        p.start()
    _join(procs)

    async def read() -> list[dict[str, Any]]:
        async with await open_store(s3_url, redis_url, redis_prefix) as store:
            return await SessionStoreSession(sid, store).get_items()

    final = asyncio.run(read())
    # Every item of both conversations is kept, exactly once...
    assert len(final) == len(tags) * turns * 4
    for tag in tags:
        own = [item for item in final if tag in json.dumps(item)]
        # ... each conversation's items in its own order ...
        assert own == [item for turn in range(turns) for item in turn_items(tag, turn)]
        report = json.loads(outs[tag].read_text())
        # ... and every read either process made is a prefix of the one order: readers agree.
        for snapshot in report["snapshots"]:
            assert snapshot == final[: len(snapshot)]
        # The Runner gave each turn's model call everything the process had said before.
        firsts = report["inputs"][::2]
        for turn, sent in enumerate(firsts):
            seen = {key(item) for item in sent}
            assert all(key(item) in seen for t in range(turn) for item in turn_items(tag, t))
            assert sent[-1] == {"content": f"{tag} question {turn}", "role": "user"}

    # A third process resumes the session: its Runner sends the model the whole history.
    out = tmp_path / "resume.json"
    proc = ctx.Process(target=_resume, args=(s3_url, redis_url, redis_prefix, sid, str(out)))
    proc.start()
    _join([proc])
    resumed = json.loads(out.read_text())
    assert resumed["before"] == final
    assert resumed["input"] == final + [{"content": "what happened?", "role": "user"}]
    assert resumed["after"][: len(final) + 1] == resumed["input"]
    assert len(resumed["after"]) == len(final) + 2


def _popper(s3_url: str, redis_url: str, redis_prefix: str, sid: str, pops: int, start: Any,
            out: str) -> None:
    async def main() -> list[Any]:
        session = await SessionStoreSession.open(sid, s3_url, redis_url, redis_prefix=redis_prefix)
        start.wait(60)
        try:
            return [await session.pop_item() for _ in range(pops)]
        finally:
            await session.close()

    Path(out).write_text(json.dumps(asyncio.run(main())))


def _adder(s3_url: str, redis_url: str, redis_prefix: str, sid: str, count: int, start: Any) -> None:
    async def main() -> None:
        session = await SessionStoreSession.open(sid, s3_url, redis_url, redis_prefix=redis_prefix)
        start.wait(60)
        try:
            for i in range(count):
                await session.add_items([{"role": "user", "content": f"late {i}"}])
        finally:
            await session.close()

    asyncio.run(main())


def test_concurrent_pops_from_processes_return_distinct_items(
    s3_url: str, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    sid, poppers, pops, late = "popped", 3, 6, 6
    early = [{"role": "user", "content": f"early {i}"} for i in range(15)]

    async def setup() -> None:
        async with await open_store(s3_url, redis_url, redis_prefix) as store:
            session = SessionStoreSession(sid, store)
            for i in range(0, len(early), 5):
                await session.add_items(early[i: i + 5])

    asyncio.run(setup())
    ctx = forkserver()
    start = ctx.Barrier(poppers + 1)
    outs = [tmp_path / f"pop{i}.json" for i in range(poppers)]
    procs = [ctx.Process(target=_popper, args=(s3_url, redis_url, redis_prefix, sid, pops, start, str(o)))
             for o in outs]
    procs.append(ctx.Process(target=_adder, args=(s3_url, redis_url, redis_prefix, sid, late, start)))
    for p in procs:
        p.start()
    _join(procs)

    async def read() -> tuple[list[Any], list[dict[str, Any]]]:
        async with await open_store(s3_url, redis_url, redis_prefix) as store:
            return await SessionStoreSession(sid, store).get_items(), await store.load_session_entries(sid)

    remaining, entries = asyncio.run(read())
    popped = [item for o in outs for item in json.loads(o.read_text()) if item is not None]
    added = early + [{"role": "user", "content": f"late {i}"} for i in range(late)]
    # No item popped twice; popped and remaining are disjoint and together are what was added.
    assert len({key(i) for i in popped}) == len(popped)
    assert not {key(i) for i in popped} & {key(i) for i in remaining}
    assert sorted(map(key, popped + remaining)) == sorted(map(key, added))
    # Replaying the commit order: every pop removed the newest item live at that point.
    live: list[str] = []
    for entry in entries:
        if entry["customType"] == ITEM_TYPE:
            live.append(entry["id"])
        elif entry["customType"] == POP_TYPE:
            assert live and entry["data"]["itemId"] == live[-1]
            live.pop()
    assert len([e for e in entries if e["customType"] == POP_TYPE]) == len(popped)


# --- errors -------------------------------------------------------------------------------------


def test_bad_input_is_refused_with_a_typed_error_and_changes_nothing(
    s3_url: str, redis_url: str, redis_prefix: str
) -> None:
    class NotJson:
        pass

    async def main() -> None:
        async with await open_store(s3_url, redis_url, redis_prefix, max_batch_entries=3) as store:
            # Any string the SDK takes is a session id: one that is not a store id maps to
            # a stable store id, the same in every process, and never escapes the prefix.
            odd = SessionStoreSession("user:42/../x", store)
            assert odd.store_session_id == store_session_id("user:42/../x")
            assert odd.store_session_id.startswith("oai-") and "/" not in odd.store_session_id
            assert SessionStoreSession("plain-id", store).store_session_id == "plain-id"
            await odd.add_items([{"role": "user", "content": "odd id"}])
            assert await SessionStoreSession("user:42/../x", store).get_items() == [
                {"role": "user", "content": "odd id"}
            ]
            with pytest.raises(InvalidInputError):
                SessionStoreSession("", store)
            with pytest.raises(InvalidInputError):
                await SessionStoreSession.open(42, "file:///nonexistent")  # type: ignore[arg-type]
            with pytest.raises(InvalidInputError):
                SessionStoreSession("fine", store, session_settings=5)  # type: ignore[arg-type]
            session = SessionStoreSession("errors", store)
            good = [{"role": "user", "content": "kept"}, {"role": "assistant", "content": "also kept"}]
            await session.add_items(good)
            before = await store.load_session_entries("errors")

            bad_calls: list[tuple[Any, int | None]] = [
                ([{"role": "user", "content": "fine"}, "not an item"], 1),
                ([{"role": "user", "content": float("nan")}], 0),
                ([{"role": "user", "content": "fine"}, {"role": "user", "content": NotJson()}], 1),
                ([None], 0),
                ({"role": "user", "content": "a dict, not a list"}, None),
                ("a string", None),
            ]
            for items, index in bad_calls:
                with pytest.raises(InvalidItemError) as info:
                    await session.add_items(items)
                assert isinstance(info.value, InvalidInputError) and info.value.index == index
            with pytest.raises(BatchTooLargeError):  # over the store's batch limit: all or nothing
                await session.add_items([{"role": "user", "content": str(i)} for i in range(4)])

            assert await store.load_session_entries("errors") == before
            assert await session.get_items() == good
            await session.add_items([])  # nothing to add: nothing written
            assert await store.load_session_entries("errors") == before

    asyncio.run(main())


def test_unknown_outcome_is_resent_and_stored_once(s3_url: str, redis_url: str, redis_prefix: str) -> None:
    """The store raises IndeterminateError once after the batch's segment was written (and
    once before, for the pop marker): the adapter re-sends the same batch, which lands once."""
    armed: set[str] = {"append.after_put"}
    failed: list[str] = []

    def hook(point: str, info: dict[str, Any]) -> None:
        if info.get("session_id") == "unknown" and point in armed:
            armed.discard(point)
            failed.append(point)
            raise IndeterminateError(f"injected at {point}")

    async def main() -> None:
        async with await open_store(s3_url, redis_url, redis_prefix, fault_hook=hook, claim_ms=200) as store:
            session = SessionStoreSession("unknown", store)
            items = [{"role": "user", "content": "once"}, {"role": "assistant", "content": "only once"}]
            await session.add_items(items)
            assert failed == ["append.after_put"]
            assert await session.get_items() == items
            armed.add("append.before_put")
            assert await session.pop_item() == items[1]
            assert failed == ["append.after_put", "append.before_put"]
            entries = await store.load_session_entries("unknown")
            assert [e["customType"] for e in entries] == [ITEM_TYPE, ITEM_TYPE, POP_TYPE]
            assert await session.get_items() == items[:1]

    asyncio.run(main())


# --- reads fetch only what is new ---------------------------------------------------------------


def _items(tag: str, start: int, n: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"{tag} {i}"} for i in range(start, start + n)]


@pytest.mark.s3_backends("moto", reason="requests are counted in moto's own request log")
def test_a_turn_reads_only_the_new_item_counted_at_the_server(
    s3_location: Any, redis_url: str, redis_prefix: str
) -> None:
    """``get_items`` at the start of a turn costs one round of requests for what is new since
    this process last read the session (a new session object included), whatever the length
    of the history; ``pop_item`` reads the same way, its compare-and-set unchanged."""
    sid = "long-history"

    async def run() -> None:
        # Without Redis's recent-segments cache: the new segment is fetched from S3.
        reader = await open_store(s3_location.url, redis_url, redis_prefix, recent_cache_bytes=0)
        writer = await open_store(s3_location.url, redis_url, redis_prefix)
        try:
            history: list[dict[str, Any]] = []
            w = SessionStoreSession(sid, writer)
            for start in range(0, 300, 10):
                await w.add_items(_items("old", start, 10))
                history += _items("old", start, 10)
            assert await SessionStoreSession(sid, reader).get_items() == history
            await w.add_items(_items("new", 0, 1))
            history += _items("new", 0, 1)
            with ServerRequests(s3_location.bucket) as seen:
                got = await SessionStoreSession(sid, reader).get_items()  # a fresh object
            assert got == history
            # The new segment and the probe after it, in one parallel round; no LIST.
            assert seen.count() == 2 and seen.count("GET") == 2, "\n".join(l[-120:] for l in seen.lines)
            with ServerRequests(s3_location.bucket) as seen:
                assert await SessionStoreSession(sid, reader).pop_item() == history[-1]
            # Nothing new: the probe; then the pop marker's PUT.
            assert (seen.count("GET"), seen.count("PUT"), seen.count()) == (1, 1, 2), seen.lines
            with ServerRequests(s3_location.bucket) as seen:
                assert await SessionStoreSession(sid, reader).get_items(limit=2) == history[-3:-1]
            assert seen.count() == 1, seen.lines  # its own marker was kept: the probe only
            assert await SessionStoreSession(sid, writer).get_items() == history[:-1]
        finally:
            await reader.close()
            await writer.close()

    asyncio.run(run())


def test_a_reader_that_paused_through_compaction_deletion_and_redaction_reads_right(
    s3_url: str, redis_url: str, redis_prefix: str
) -> None:
    """A process that read the session, then paused while others appended, compacted it (its
    segments deleted), redacted an item, popped, and deleted and re-created the session,
    reads exactly what a fresh process reads at each step."""
    from compactor import Compactor, CompactorOptions
    from harness.pausing import FakeClock

    sid = "paused-reader"

    async def run() -> None:
        reader = await open_store(s3_url, redis_url, redis_prefix)
        other = await open_store(s3_url, redis_url, redis_prefix)

        async def both_read() -> list[Any]:
            fresh = await open_store(s3_url, redis_url, redis_prefix)
            try:
                expected = await SessionStoreSession(sid, fresh).get_items()
            finally:
                await fresh.close()
            assert await SessionStoreSession(sid, reader).get_items() == expected
            return expected

        try:
            o = SessionStoreSession(sid, other)
            for start in range(0, 40, 4):
                await o.add_items(_items("a", start, 4))
            assert len(await both_read()) == 40
            for start in range(40, 60, 4):
                await o.add_items(_items("a", start, 4))
            clock = FakeClock()
            compactor = Compactor(other.sync, CompactorOptions(grace_ms=1000, worker="t"), now=clock)
            assert compactor.compact_session(sid).outcome == "compacted"
            clock.advance(10_000)
            compactor.gc_session(sid)
            inc = (await other.get_header(sid)).incarnation
            assert other.sync.objects.head(other.sync.layout.segment(sid, inc, 12)) is None
            await o.add_items(_items("b", 0, 2))
            assert await both_read() == _items("a", 0, 60) + _items("b", 0, 2)
            # A redaction of an item, then of a pop marker (which brings its item back).
            data = await other.read_session(sid)
            target = next(e["id"] for e in data.entries if (e.get("data") or {}).get("content") == "a 7")
            await other.redact(sid, target, "test")
            assert len(await both_read()) == 61
            assert await o.pop_item() == _items("b", 1, 1)[0]
            data = await other.read_session(sid)
            marker = next(e["id"] for e in data.entries if e.get("customType") == POP_TYPE)
            await other.redact(sid, marker, "test")
            assert (await both_read())[-1] == _items("b", 1, 1)[0]
            await o.clear_session()
            await o.add_items(_items("c", 0, 1))
            assert await both_read() == _items("c", 0, 1)
            # Deleted and made again by another process: the reader starts over.
            await other.delete_session(store_session_id(sid))
            await o.add_items(_items("d", 0, 3))
            assert await both_read() == _items("d", 0, 3)
        finally:
            await reader.close()
            await other.close()

    asyncio.run(run())
