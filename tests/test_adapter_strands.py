"""Strands Agents' ``SessionRepository`` on the store (``store/adapters/strands/``).

Real servers (S3 on moto and SeaweedFS, a real redis-server), the real ``strands.Agent`` loop
driven by a scripted ``strands.models.Model``, real processes. The repository cases ported
from Strands' own tests (tests/strands/session/test_file_session_manager.py and
test_repository_session_manager.py in strands-agents/sdk-python) are marked "ported".
"""

from __future__ import annotations

import copy
import itertools
import json
import multiprocessing as mp
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from strands import Agent, tool
from strands.agent.conversation_manager import (
    NullConversationManager,
    SlidingWindowConversationManager,
    SummarizingConversationManager,
)
from strands.models import Model
from strands.multiagent import Swarm
from strands.session import RepositorySessionManager
from strands.types.exceptions import EventLoopException, SessionException
from strands.types.session import Session, SessionAgent, SessionMessage, SessionType

from store import SessionStore
from store.adapters.strands import (
    MESSAGE_TYPE,
    InvalidStrandsRecordError,
    NotFoundInSessionError,
    SessionExistsInStoreError,
    SessionNotFoundInStoreError,
    SessionStoreRepository,
    SessionStoreSessionManager,
)
from store.errors import (
    InvalidInputError,
    InvalidSessionIdError,
    SessionExistsError,
    SessionNotFoundError,
)

# --- a scripted model: the framework's own Model interface, canned answers ---------------------


class ScriptedModel(Model):
    """Answers each call with the next scripted turn and records the messages it was given.

    A turn is a list of content blocks (``{"text": ...}`` or ``{"toolUse": {...}}``), or
    ``{"redact": user_text, "text": answer}`` (a guardrail: the user's message is redacted).
    ``before[i]`` is called before turn ``i`` is streamed (to interleave another writer).
    """

    def __init__(self, turns: list[Any], before: dict[int, Callable[[], None]] | None = None) -> None:
        self.turns = list(turns)
        self.before = dict(before or {})
        self.seen: list[list[dict[str, Any]]] = []

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> Any:
        return {}

    async def structured_output(self, output_model: Any, prompt: Any, system_prompt: Any = None, **kwargs: Any) -> Any:
        raise NotImplementedError
        yield  # an async generator, as the interface says

    async def stream(self, messages: Any, tool_specs: Any = None, system_prompt: Any = None, **kwargs: Any) -> Any:
        index = len(self.seen)
        self.seen.append(copy.deepcopy(messages))
        if index in self.before:
            self.before[index]()
        turn = self.turns[index]
        stop = "end_turn"
        yield {"messageStart": {"role": "assistant"}}
        if isinstance(turn, dict):  # a guardrail intervened
            yield {"redactContent": {"redactUserContentMessage": turn["redact"]}}
            turn, stop = [{"text": turn["text"]}], "guardrail_intervened"
        for block in turn:
            if "text" in block:
                yield {"contentBlockStart": {"start": {}}}
                yield {"contentBlockDelta": {"delta": {"text": block["text"]}}}
                yield {"contentBlockStop": {}}
            else:
                use = block["toolUse"]
                stop = "tool_use"
                yield {"contentBlockStart": {"start": {"toolUse": {"name": use["name"], "toolUseId": use["toolUseId"]}}}}
                yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(use["input"])}}}}
                yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": stop}}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def measure() -> dict[str, Any]:
    """A sensor that reads NaN."""
    return {"status": "success", "content": [{"json": {"value": float("nan")}}]}


def tool_turn(tag: str, a: int, b: int) -> list[list[dict[str, Any]]]:
    """The model's two answers of one prompt that uses the add tool."""
    use = {"toolUse": {"name": "add", "toolUseId": f"{tag}-use", "input": {"a": a, "b": b}}}
    return [[{"text": f"{tag}: adding"}, use], [{"text": f"{tag}: {a + b}"}]]


def plain(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as a model sees them, without Strands' bookkeeping fields."""
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def texts(message: dict[str, Any]) -> str:
    return " ".join(b["text"] for b in message["content"] if "text" in b)


def check_coherent(messages: list[dict[str, Any]]) -> None:
    """What a model accepts: roles alternate, every toolUse answered by the next message."""
    for prev, cur in itertools.pairwise(messages):
        assert prev["role"] != cur["role"], (prev, cur)
    for i, m in enumerate(messages):
        uses = {b["toolUse"]["toolUseId"] for b in m["content"] if "toolUse" in b}
        if uses:
            results = {b["toolResult"]["toolUseId"] for b in messages[i + 1]["content"] if "toolResult" in b}
            assert results == uses, (m, messages[i + 1])


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture
def urls(s3_url: str, redis_url: str, redis_prefix: str) -> dict[str, Any]:
    """How to build a manager on the test's servers: ``SessionStoreSessionManager(sid, **urls)``."""
    return {"objects_url": s3_url, "redis_url": redis_url, "store_options": {"redis_prefix": redis_prefix}}


@pytest.fixture
def managers(urls: dict[str, Any]) -> Iterator[Callable[[str], SessionStoreSessionManager]]:
    made: list[SessionStoreSessionManager] = []

    def make(session_id: str) -> SessionStoreSessionManager:
        manager = SessionStoreSessionManager(session_id, **urls)
        made.append(manager)
        return manager

    yield make
    for manager in made:
        manager.close()


@pytest.fixture
def repo(store: SessionStore) -> SessionStoreRepository:
    return SessionStoreRepository(store)


@pytest.fixture
def sample_session() -> Session:
    return Session(session_id="test-session", session_type=SessionType.AGENT)


@pytest.fixture
def sample_agent() -> SessionAgent:
    return SessionAgent(agent_id="test-agent", state={"key": "value"},
                        conversation_manager_state=NullConversationManager().get_state())


def user_message(text: str, index: int) -> SessionMessage:
    return SessionMessage.from_message({"role": "user", "content": [{"text": text}]}, index)


# --- the agent loop ------------------------------------------------------------------------------


def test_agent_loop_persists_and_a_new_agent_resumes_it(managers: Callable[[str], SessionStoreSessionManager]) -> None:
    model = ScriptedModel([*tool_turn("one", 2, 3), [{"text": "bye"}]])
    agent = Agent(model=model, tools=[add], session_manager=managers("loop"), callback_handler=None,
                  state={"visits": 1})
    agent("add 2 and 3")
    agent.state.set("visits", 2)
    agent("bye")
    assert [m["role"] for m in agent.messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]

    # Another manager (its own store, as another process would have) restores everything.
    resumed_model = ScriptedModel([[{"text": "welcome back"}]])
    manager = managers("loop")
    resumed = Agent(model=resumed_model, tools=[add], session_manager=manager, callback_handler=None)
    assert plain(resumed.messages) == plain(agent.messages)
    assert resumed.state.get("visits") == 2
    resumed("again")
    assert plain(resumed_model.seen[0]) == plain(agent.messages) + [{"role": "user", "content": [{"text": "again"}]}]

    stored = manager.list_messages("loop", "default")
    assert [m.message_id for m in stored] == list(range(8))
    assert texts(stored[-1].message) == "welcome back"


def _writer(urls: dict[str, Any], sid: str, name: str, turns: int, barrier: Any, out: str) -> None:
    """One writer process: builds its agent on the shared session, then runs ``turns`` prompts
    that each use a tool, and writes down the tracking ids of every message it appended."""
    barrier.wait(timeout=120)
    manager = SessionStoreSessionManager(sid, **urls)  # both create the session at once
    script = [answer for i in range(turns) for answer in tool_turn(f"{name}{i}", i, 10)]
    agent = Agent(model=ScriptedModel(script), tools=[add], session_manager=manager,
                  conversation_manager=NullConversationManager(), callback_handler=None)
    restored = len(agent.messages)
    barrier.wait(timeout=120)
    for i in range(turns):
        agent(f"{name} prompt {i}")
    mine = [m["tracking_id"] for m in agent.messages[restored:]]
    Path(out).write_text(json.dumps(mine))
    manager.close()


@pytest.mark.timeout(240)
def test_two_processes_write_one_session_at_once_and_a_third_resumes_everything(
    urls: dict[str, Any], managers: Callable[[str], SessionStoreSessionManager], tmp_path: Path
) -> None:
    sid, turns = "shared", 3
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    procs = [ctx.Process(target=_writer, args=(urls, sid, name, turns, barrier, str(out)))
             for name, out in zip("ab", outs)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(200)
        assert p.exitcode == 0
    acked = {name: json.loads(out.read_text()) for name, out in zip("ab", outs)}
    assert [len(v) for v in acked.values()] == [4 * turns, 4 * turns]

    # This process resumes: a new agent on the same session gets every message of both.
    model = ScriptedModel([[{"text": "resumed"}]])
    manager = managers(sid)
    agent = Agent(model=model, tools=[add], session_manager=manager,
                  conversation_manager=NullConversationManager(), callback_handler=None)
    ids = [m["tracking_id"] for m in agent.messages]
    assert sorted(ids) == sorted(acked["a"] + acked["b"])  # all kept, none twice
    for mine in acked.values():
        assert [i for i in ids if i in set(mine)] == mine  # each writer's own order
    check_coherent(agent.messages)  # whole turns: nothing for Strands to repair
    agent("and now?")
    assert plain(model.seen[0][:-1]) == plain(agent.messages[:-2])
    assert len(model.seen[0]) == 8 * turns + 1

    stored = manager.list_messages(sid, "default")
    assert [m.message_id for m in stored] == list(range(8 * turns + 2))
    assert [m.message["tracking_id"] for m in stored[:-2]] == ids
    for i, m in enumerate(stored):
        again = manager.read_message(sid, "default", i)
        assert again is not None and again.message == m.message


def test_a_turn_interrupted_by_another_writer_stays_whole(
    managers: Callable[[str], SessionStoreSessionManager],
) -> None:
    """Writer A's tool runs while writer B does a whole turn on the same session and agent:
    the commit order interleaves them, the reading order keeps each turn whole."""
    sid = "interleaved"
    b_model = ScriptedModel([[{"text": "b answer"}]])
    b_holder: dict[str, Agent] = {}

    @tool
    def slow_add(a: int, b: int) -> int:
        """Add, slowly: another writer takes a turn meanwhile."""
        b_holder["agent"]("b prompt")
        return a + b

    a_model = ScriptedModel([[{"toolUse": {"name": "slow_add", "toolUseId": "u1", "input": {"a": 1, "b": 2}}}],
                             [{"text": "a answer 3"}]])
    a_agent = Agent(model=a_model, tools=[slow_add], session_manager=managers(sid), callback_handler=None)
    b_holder["agent"] = Agent(model=b_model, session_manager=managers(sid), callback_handler=None)
    a_agent("a prompt")

    reader = managers(sid)
    store = reader.store
    committed = [e["data"]["message"]["message"] for e in store.load_session_entries(sid)
                 if e.get("customType") == MESSAGE_TYPE]
    assert [texts(m) or "tool" for m in committed] == [
        "a prompt", "tool", "b prompt", "b answer", "tool", "a answer 3"]
    listed = [m.to_message() for m in reader.list_messages(sid, "default")]
    assert [texts(m) or "tool" for m in listed] == [
        "a prompt", "tool", "tool", "a answer 3", "b prompt", "b answer"]
    check_coherent(listed)


def test_guardrail_redaction_hits_the_writers_own_message(
    managers: Callable[[str], SessionStoreSessionManager],
) -> None:
    """A redacts its latest message after B has appended two: B's stay as they are."""
    sid = "redact"
    b_agent = Agent(model=ScriptedModel([[{"text": "b answer"}]]), session_manager=managers(sid),
                    callback_handler=None)
    a_model = ScriptedModel([{"redact": "[redacted]", "text": "blocked"}],
                            before={0: lambda: b_agent("b prompt")})
    a_agent = Agent(model=a_model, session_manager=managers(sid), callback_handler=None)
    a_agent("a secret prompt")

    manager = managers(sid)
    resumed = Agent(model=ScriptedModel([]), session_manager=manager, callback_handler=None)
    assert [texts(m) for m in resumed.messages] == ["[redacted]", "blocked", "b prompt", "b answer"]
    stored = manager.list_messages(sid, "default")
    assert stored[0].redact_message is not None and stored[2].redact_message is None


def test_multi_agent_state_is_persisted_and_read_by_another_manager(
    managers: Callable[[str], SessionStoreSessionManager],
) -> None:
    solo = Agent(name="solo", model=ScriptedModel([[{"text": "swarm answer"}]]), callback_handler=None)
    swarm = Swarm([solo], session_manager=managers("swarm"))
    assert swarm("do it").status.value == "completed"
    state = managers("swarm").read_multi_agent("swarm", swarm.id)
    assert state == json.loads(json.dumps(swarm.serialize_state()))
    assert state["node_history"] == ["solo"]
    # A new swarm on the session is restored from it (initialize_multi_agent's read path,
    # which writes nothing).
    Swarm([Agent(name="solo", model=ScriptedModel([]), callback_handler=None)], session_manager=managers("swarm"))
    assert managers("swarm").read_multi_agent("swarm", swarm.id) == state


# --- bad input: a typed error, nothing written ---------------------------------------------------


def test_bad_input_is_refused_and_nothing_is_written(
    managers: Callable[[str], SessionStoreSessionManager], store: SessionStore, repo: SessionStoreRepository
) -> None:
    with pytest.raises(InvalidSessionIdError):
        managers("bad/id")
    with pytest.raises(ValueError):
        managers("../escape")
    assert list(store.iter_sessions()) == []

    # The real loop: a tool result holding NaN cannot be stored.
    model = ScriptedModel([[{"toolUse": {"name": "measure", "toolUseId": "m1", "input": {}}}], [{"text": "ok"}]])
    agent = Agent(model=model, tools=[measure], session_manager=managers("bad"), callback_handler=None)
    with pytest.raises(EventLoopException) as info:
        agent("measure it")
    assert isinstance(info.value.__cause__, InvalidStrandsRecordError)
    before = store.load_session_entries("bad")
    assert [m.message["role"] for m in repo.list_messages("bad", "default")] == ["user", "assistant"]

    bad = SessionMessage.from_message({"role": "user", "content": [{"json": {"x": float("inf")}}]}, 5)
    with pytest.raises(InvalidStrandsRecordError):
        repo.create_message("bad", "default", bad)
    with pytest.raises(InvalidInputError, match=r"message id must be an integer"):
        repo.create_message("bad", "default", SessionMessage({"role": "user", "content": []}, "7"))  # type: ignore[arg-type]
    with pytest.raises(NotFoundInSessionError):
        repo.update_message("bad", "default", user_message("no such", 99))
    with pytest.raises(NotFoundInSessionError):
        repo.update_agent("bad", SessionAgent(agent_id="nobody", state={}, conversation_manager_state={}))
    with pytest.raises(SessionNotFoundInStoreError):
        repo.create_message("missing", "default", user_message("hi", 0))
    with pytest.raises(InvalidInputError):
        repo.list_messages("bad", "default", offset=-1)
    with pytest.raises(SessionExistsInStoreError) as exists:
        repo.create_session(Session(session_id="bad", session_type=SessionType.AGENT))
    assert isinstance(exists.value, SessionException) and isinstance(exists.value, SessionExistsError)
    assert store.load_session_entries("bad") == before
    assert [s.session_id for s in store.iter_sessions()] == ["bad"]


# --- ported: strands' FileSessionManager / S3SessionManager repository tests -----------------------


def test_create_and_read_session(repo: SessionStoreRepository, sample_session: Session) -> None:  # ported
    repo.create_session(sample_session)
    result = repo.read_session(sample_session.session_id)
    assert result is not None
    assert result.session_id == sample_session.session_id
    assert result.session_type == sample_session.session_type
    assert result.created_at == sample_session.created_at
    assert repo.read_session("nonexistent-session") is None


def test_a_session_made_by_other_tools_reads_as_an_agent_session(repo: SessionStoreRepository, store: SessionStore) -> None:
    store.create_session("from-cli")
    session = repo.read_session("from-cli")
    assert session is not None and session.session_type == SessionType.AGENT
    assert repo.list_messages("from-cli", "default") == []


def test_delete_session(repo: SessionStoreRepository, sample_session: Session) -> None:  # ported
    repo.create_session(sample_session)
    repo.delete_session(sample_session.session_id)
    assert repo.read_session(sample_session.session_id) is None
    with pytest.raises(SessionException, match="does not exist"):
        repo.delete_session("nonexistent-session")
    with pytest.raises(SessionNotFoundError):
        repo.delete_session("nonexistent-session")


def test_create_read_update_agent(repo: SessionStoreRepository, sample_session: Session, sample_agent: SessionAgent) -> None:  # ported
    repo.create_session(sample_session)
    repo.create_agent(sample_session.session_id, sample_agent)
    result = repo.read_agent(sample_session.session_id, sample_agent.agent_id)
    assert result is not None
    assert result.agent_id == sample_agent.agent_id and result.state == sample_agent.state
    assert repo.read_agent(sample_session.session_id, "nonexistent_agent") is None

    created = result.created_at
    updated = SessionAgent(agent_id=sample_agent.agent_id, state={"updated": "value"},
                           conversation_manager_state={})
    # A repository that has not seen the agent yet (another process) may update it too.
    other = SessionStoreRepository(repo.store)
    other.update_agent(sample_session.session_id, updated)
    result = repo.read_agent(sample_session.session_id, sample_agent.agent_id)
    assert result is not None and result.state == {"updated": "value"} and result.created_at == created


def test_update_nonexistent_agent(repo: SessionStoreRepository, sample_session: Session, sample_agent: SessionAgent) -> None:  # ported
    repo.create_session(sample_session)
    with pytest.raises(SessionException):
        repo.update_agent(sample_session.session_id, sample_agent)


def test_messages_create_read_list_update(repo: SessionStoreRepository, sample_session: Session, sample_agent: SessionAgent) -> None:  # ported
    sid, aid = sample_session.session_id, sample_agent.agent_id
    repo.create_session(sample_session)
    repo.create_agent(sid, sample_agent)
    assert repo.list_messages(sid, aid) == []
    assert repo.read_message(sid, aid, 999) is None
    for i in range(10):
        repo.create_message(sid, aid, user_message(f"Message {i}", i))
    assert len(repo.list_messages(sid, aid)) == 10
    assert [texts(m.message) for m in repo.list_messages(sid, aid, limit=3)] == [f"Message {i}" for i in range(3)]
    assert [m.message_id for m in repo.list_messages(sid, aid, offset=5)] == [5, 6, 7, 8, 9]
    assert [m.message_id for m in repo.list_messages(sid, aid, limit=2, offset=8)] == [8, 9]
    one = repo.read_message(sid, aid, 4)
    assert one is not None and texts(one.message) == "Message 4"

    # update by reading position (a SessionMessage made elsewhere) keeps created_at
    changed = SessionMessage({"role": "user", "content": [{"text": "Updated content"}]}, 4)
    repo.update_message(sid, aid, changed)
    again = repo.read_message(sid, aid, 4)
    assert again is not None and texts(again.message) == "Updated content"
    assert again.created_at == one.created_at
    assert len(repo.list_messages(sid, aid)) == 10


def test_a_taken_index_never_overwrites(repo: SessionStoreRepository, store: SessionStore, sample_session: Session) -> None:
    """Two writers both propose index 0: both messages are kept, in commit order."""
    repo.create_session(sample_session)
    other = SessionStoreRepository(store)
    first, second = user_message("from A", 0), user_message("from B", 0)
    repo.create_message("test-session", "agent", first)
    other.create_message("test-session", "agent", second)
    listed = repo.list_messages("test-session", "agent")
    assert [(m.message_id, texts(m.message)) for m in listed] == [(0, "from A"), (1, "from B")]
    # Each writer's later update finds its own message, whatever index it proposed.
    second.redact_message = {"role": "user", "content": [{"text": "B redacted"}]}
    other.update_message("test-session", "agent", second)
    assert [texts(m.to_message()) for m in repo.list_messages("test-session", "agent")] == ["from A", "B redacted"]


@pytest.mark.parametrize("message_id", ["../escape", "not_an_int", None, [], 1.5, True])
def test_invalid_message_id(repo: SessionStoreRepository, message_id: Any) -> None:  # ported
    with pytest.raises(ValueError, match=r"message_id=<.*> \| message id must be an integer"):
        repo.read_message("session1", "agent1", message_id)


@pytest.mark.parametrize("session_id", ["a/../b", "a/b", "", "x" * 200])
def test_invalid_session_id(repo: SessionStoreRepository, session_id: str) -> None:  # ported
    with pytest.raises(ValueError):
        repo.read_session(session_id)
    with pytest.raises(ValueError):
        repo.create_session(Session(session_id=session_id, session_type=SessionType.AGENT))


def test_multi_agent_create_read_update(repo: SessionStoreRepository, sample_session: Session) -> None:  # ported
    class Orchestrator:  # what the repository uses of a MultiAgentBase
        id = "test-multi-agent"

        def __init__(self, state: dict[str, Any]) -> None:
            self.state = state

        def serialize_state(self) -> dict[str, Any]:
            return {"id": self.id, "state": self.state}

    repo.create_session(sample_session)
    assert repo.read_multi_agent("test-session", "test-multi-agent") is None
    with pytest.raises(SessionException):
        repo.update_multi_agent("test-session", Orchestrator({"a": 1}))  # type: ignore[arg-type]
    repo.create_multi_agent("test-session", Orchestrator({"key": "value"}))  # type: ignore[arg-type]
    assert repo.read_multi_agent("test-session", "test-multi-agent") == {"id": "test-multi-agent", "state": {"key": "value"}}
    repo.update_multi_agent("test-session", Orchestrator({"key": "updated"}))  # type: ignore[arg-type]
    assert repo.read_multi_agent("test-session", "test-multi-agent") == {"id": "test-multi-agent", "state": {"key": "updated"}}


# --- ported: strands' RepositorySessionManager tests, on this repository --------------------------


def test_manager_creates_or_uses_the_session(repo: SessionStoreRepository) -> None:  # ported
    assert repo.read_session("test-session") is None
    RepositorySessionManager(session_id="test-session", session_repository=repo)
    session = repo.read_session("test-session")
    assert session is not None and session.session_type == SessionType.AGENT
    manager = RepositorySessionManager(session_id="test-session", session_repository=repo)
    assert manager.session.session_id == "test-session" and manager.session.created_at == session.created_at


def test_agent_ids_are_unique_in_a_manager(repo: SessionStoreRepository) -> None:  # ported
    manager = RepositorySessionManager(session_id="test-session", session_repository=repo)
    Agent(agent_id="custom-agent", session_manager=manager, model=ScriptedModel([]), callback_handler=None)
    assert repo.read_agent("test-session", "custom-agent") is not None
    with pytest.raises(SessionException, match="must be unique"):
        Agent(agent_id="custom-agent", session_manager=manager, model=ScriptedModel([]), callback_handler=None)


def test_initialize_restores_existing_agent(repo: SessionStoreRepository, sample_session: Session) -> None:  # ported
    repo.create_session(sample_session)
    repo.create_agent("test-session", SessionAgent(
        agent_id="existing-agent", state={"key": "value"},
        conversation_manager_state=SlidingWindowConversationManager().get_state(),
        _internal_state={"interrupt_state": {"interrupts": {}, "context": {"test": "init"}, "activated": False}},
    ))
    repo.create_message("test-session", "existing-agent", user_message("Hello", 0))
    manager = RepositorySessionManager(session_id="test-session", session_repository=repo)
    agent = Agent(agent_id="existing-agent", session_manager=manager, model=ScriptedModel([]), callback_handler=None)
    assert agent.state.get("key") == "value"
    assert plain(agent.messages) == [{"role": "user", "content": [{"text": "Hello"}]}]
    assert agent._interrupt_state.context == {"test": "init"}


def test_initialize_restores_with_summarizing_conversation_manager(repo: SessionStoreRepository, sample_session: Session) -> None:  # ported
    repo.create_session(sample_session)
    summarizer = SummarizingConversationManager()
    summarizer.removed_message_count = 1
    summarizer._summary_message = {"role": "assistant", "content": [{"text": "summary"}]}
    repo.create_agent("test-session", SessionAgent(agent_id="existing-agent", state={"key": "value"},
                                                   conversation_manager_state=summarizer.get_state()))
    repo.create_message("test-session", "existing-agent", user_message("Hello", 0))
    repo.create_message("test-session", "existing-agent", user_message("Hello", 1))
    manager = RepositorySessionManager(session_id="test-session", session_repository=repo)
    agent = Agent(agent_id="existing-agent", conversation_manager=SummarizingConversationManager(),
                  session_manager=manager, model=ScriptedModel([]), callback_handler=None)
    assert len(agent.messages) == 2  # the summary, then the message after the removed one
    assert agent.messages[1]["content"][0]["text"] == "Hello"
    assert agent.conversation_manager.removed_message_count == 1


def test_append_message(repo: SessionStoreRepository) -> None:  # ported
    manager = RepositorySessionManager(session_id="test-session", session_repository=repo)
    agent = Agent(agent_id="test-agent", session_manager=manager, model=ScriptedModel([]), callback_handler=None)
    manager.append_message({"role": "user", "content": [{"text": "Hello"}]}, agent)
    messages = repo.list_messages("test-session", "test-agent")
    assert len(messages) == 1 and messages[0].message["content"][0]["text"] == "Hello"


def test_from_inside_a_running_event_loop_on_an_async_store(store: SessionStore, repo: SessionStoreRepository) -> None:
    """invoke_async runs the hooks on the caller's loop: the store is called from inside it.
    The manager takes the AsyncSessionStore of an asyncio application (and uses its .sync)."""
    import asyncio

    from store.aio import AsyncSessionStore

    async def go() -> None:
        async with AsyncSessionStore(store, owns_store=False) as astore:
            agent = Agent(model=ScriptedModel([[{"text": "async answer"}]]),
                          session_manager=SessionStoreSessionManager("async", store=astore), callback_handler=None)
            await agent.invoke_async("hello")
            assert len(await astore.load_session_entries("async")) >= 3  # agent + 2 messages

    asyncio.run(go())
    assert [texts(m.message) for m in repo.list_messages("async", "default")] == ["hello", "async answer"]
