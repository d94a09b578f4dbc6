"""The LangGraph checkpoint saver (``store.adapters.langgraph``) on real S3 and Redis.

LangGraph's own conformance suite (``langgraph-checkpoint-conformance``, pinned) runs with
``validate()`` against the saver on the suite's S3 backend and on the embedded default, and
every base and extended capability must be detected and passed. A real ``StateGraph`` (no
model: its nodes are plain functions) runs in separate processes on one thread, is resumed by
a third, time-travelled and updated from another; two processes continuing one thread from
one checkpoint at once never fork it, whichever wins; a writer paused between its check and
its write is refused when it resumes.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import operator
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES, BASE_CAPABILITIES
from langgraph.graph import END, START, StateGraph

from store import SessionStore
from store.adapters.langgraph import (
    BLOB_TYPE,
    CHECKPOINT_TYPE,
    CheckpointForkError,
    SessionStoreSaver,
)
from store.backends.embedded import EmbeddedRedis
from store.errors import ConflictError, InvalidInputError, SessionExistsError
from harness.pausing import InThread, Pause

THREAD = {"configurable": {"thread_id": "thread-1"}}


@pytest.fixture(scope="module")
def embedded_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The embedded default's directory (its redis-server stopped after the module)."""
    root = tmp_path_factory.mktemp("langgraph-embedded")
    yield root
    EmbeddedRedis(root / ".redis").stop()


# --- the graph: no model, plain nodes ------------------------------------------------------------


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def build_graph(saver: SessionStoreSaver) -> Any:
    graph = StateGraph(State)
    graph.add_node("a", lambda state: {"log": [state["log"][-1] + ":a"]})
    graph.add_node("b", lambda state: {"log": [state["log"][-1] + ":b"]})
    graph.add_edge(START, "a")
    graph.add_edge("a", "b")
    graph.add_edge("b", END)
    return graph.compile(checkpointer=saver)


def continuing_children(saver: SessionStoreSaver, config: dict[str, Any]) -> dict[str, list[str]]:
    """checkpoint id -> its input/loop children, over the thread's whole history."""
    children: dict[str, list[str]] = {}
    for tup in saver.list(config):
        if tup.parent_config and tup.metadata["source"] in ("input", "loop"):
            children.setdefault(tup.parent_config["configurable"]["checkpoint_id"], []).append(
                tup.config["configurable"]["checkpoint_id"])
    return children


# --- LangGraph's conformance suite ---------------------------------------------------------------


async def _conformance(store: SessionStore) -> None:
    n = itertools.count()

    @checkpointer_test(name="SessionStoreSaver")
    async def saver() -> AsyncGenerator[SessionStoreSaver, None]:
        # A fresh namespace per capability: the suite reuses thread ids across them.
        yield SessionStoreSaver(store, namespace=f"c{next(n)}")

    report = await validate(saver)
    assert report.conformance_level() == "FULL", report.to_dict()
    assert set(report.results) == {c.value for c in ALL_CAPABILITIES}
    for name, result in report.results.items():
        assert result.detected and result.passed is True, (name, result)
        assert result.tests_failed == 0 and result.tests_skipped == 0 and result.tests_passed > 0, (name, result)
    base = sum(report.results[c.value].tests_passed for c in BASE_CAPABILITIES)
    extended = sum(r.tests_passed for r in report.results.values()) - base
    assert (base, extended) == (58, 23)  # every case of 0.0.2


@pytest.mark.every_backend
def test_conformance_on_s3_and_redis(s3_url: str, redis_url: str, redis_prefix: str) -> None:
    store = SessionStore.from_url(s3_url, redis_url, redis_prefix=redis_prefix)
    try:
        asyncio.run(_conformance(store))
    finally:
        store.close()


def test_conformance_on_the_embedded_default(embedded_dir: Path) -> None:
    store = SessionStore.from_url((embedded_dir / "conformance").as_uri())
    try:
        asyncio.run(_conformance(store))
    finally:
        store.close()


# --- a real graph, several processes ------------------------------------------------------------


def _turn(s3_url: str, redis_url: str, redis_prefix: str, word: str, conn: Any) -> None:
    with SessionStoreSaver.from_url(s3_url, redis_url, redis_prefix=redis_prefix) as saver:
        conn.send(build_graph(saver).invoke({"log": [word]}, THREAD)["log"])
    conn.close()


def _in_process(target: Any, *args: Any) -> Any:
    ctx = mp.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(*args, send))
    proc.start()
    send.close()
    value = receive.recv()
    proc.join(60)
    assert proc.exitcode == 0
    return value


def _resume(s3_url: str, redis_url: str, redis_prefix: str, conn: Any) -> None:
    with SessionStoreSaver.from_url(s3_url, redis_url, redis_prefix=redis_prefix) as saver:
        graph = build_graph(saver)
        state = graph.get_state(THREAD)
        history = [(h.metadata["source"], h.metadata["step"]) for h in graph.get_state_history(THREAD)]
        conn.send((state.values, history, graph.invoke({"log": ["third"]}, THREAD)["log"]))
    conn.close()


def test_a_graph_run_by_two_processes_and_resumed_by_a_third(
    s3_url: str, redis_url: str, redis_prefix: str
) -> None:
    first = _in_process(_turn, s3_url, redis_url, redis_prefix, "one")
    assert first == ["one", "one:a", "one:a:b"]
    second = _in_process(_turn, s3_url, redis_url, redis_prefix, "two")
    assert second == first + ["two", "two:a", "two:a:b"]
    values, history, after = _in_process(_resume, s3_url, redis_url, redis_prefix)
    assert values == {"log": second}
    assert history == [("loop", 6), ("loop", 5), ("loop", 4), ("input", 3),
                       ("loop", 2), ("loop", 1), ("loop", 0), ("input", -1)]
    assert after == second + ["third", "third:a", "third:a:b"]


def _branch(s3_url: str, redis_url: str, redis_prefix: str, conn: Any) -> None:
    """From another process: update_state on the first run's end, and a replay of its start."""
    with SessionStoreSaver.from_url(s3_url, redis_url, redis_prefix=redis_prefix) as saver:
        graph = build_graph(saver)
        history = list(graph.get_state_history(THREAD))
        first_end = next(h for h in history if h.metadata["step"] == 2)
        updated = graph.update_state(first_end.config, {"log": ["edited"]})
        start = history[-1]  # the first input checkpoint
        replayed = graph.invoke(None, start.config)["log"]
        conn.send((first_end.config, updated, start.config, replayed))
    conn.close()


def test_time_travel_and_update_state_from_another_process_are_branches(
    s3_url: str, redis_url: str, redis_prefix: str
) -> None:
    _in_process(_turn, s3_url, redis_url, redis_prefix, "one")
    _in_process(_turn, s3_url, redis_url, redis_prefix, "two")
    first_end, updated, start, replayed = _in_process(_branch, s3_url, redis_url, redis_prefix)
    assert replayed == ["one", "one:a", "one:a:b"]
    with SessionStoreSaver.from_url(s3_url, redis_url, redis_prefix=redis_prefix) as saver:
        graph = build_graph(saver)
        edited = graph.get_state(updated)
        assert edited.values["log"][-1] == "edited" and edited.metadata["source"] == "update"
        assert edited.parent_config["configurable"]["checkpoint_id"] == first_end["configurable"]["checkpoint_id"]
        # The replay is a fork of the start, and the newest branch is the thread's head.
        head = graph.get_state(THREAD)
        assert head.values["log"] == replayed
        sources = {}
        for tup in saver.list(THREAD):
            if tup.parent_config and tup.parent_config["configurable"]["checkpoint_id"] == start["configurable"]["checkpoint_id"]:
                sources.setdefault(tup.metadata["source"], 0)
                sources[tup.metadata["source"]] += 1
        assert sources == {"loop": 1, "fork": 1}  # the original run's step 0, the replay's fork
        # The first run's end has two children: the second run's input and the update.
        kids = [t.metadata["source"] for t in saver.list(THREAD)
                if t.parent_config and t.parent_config["configurable"]["checkpoint_id"] == first_end["configurable"]["checkpoint_id"]]
        assert sorted(kids) == ["input", "update"]
        assert all(len(v) == 1 for v in continuing_children(saver, THREAD).values())
        # Continuing from a checkpoint that has a child is refused: not a silent fork.
        with pytest.raises(CheckpointForkError) as refused:
            graph.invoke({"log": ["stale"]}, first_end)
        assert isinstance(refused.value, ConflictError)
        assert graph.get_state(THREAD).values["log"] == replayed


# --- two processes continuing one checkpoint at once ---------------------------------------------

ROUNDS = 20  # the done-when


def _racer(s3_url: str, redis_url: str, redis_prefix: str, me: int, barrier: Any, conn: Any) -> None:
    outcomes = []
    with SessionStoreSaver.from_url(s3_url, redis_url, redis_prefix=redis_prefix) as saver:
        graph = build_graph(saver)
        for r in range(ROUNDS):
            barrier.wait(60)
            head = graph.get_state(THREAD).config  # both read the same head...
            barrier.wait(60)  # ...and continue from it at the same moment
            try:
                outcomes.append(("ok", graph.invoke({"log": [f"p{me}r{r}"]}, head)["log"]))
            except CheckpointForkError as exc:
                outcomes.append(("refused", exc.parent_id))
    conn.send(outcomes)
    conn.close()


@pytest.mark.every_backend
@pytest.mark.long
def test_two_processes_continuing_one_checkpoint_at_once_never_fork_it(
    s3_url: str, redis_url: str, redis_prefix: str
) -> None:
    _in_process(_turn, s3_url, redis_url, redis_prefix, "start")
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
    procs = [ctx.Process(target=_racer, args=(s3_url, redis_url, redis_prefix, i, barrier, pipes[i][1]))
             for i in range(2)]
    for p in procs:
        p.start()
    results = [receive.recv() for receive, _ in pipes]
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with SessionStoreSaver.from_url(s3_url, redis_url, redis_prefix=redis_prefix) as saver:
        head = build_graph(saver).get_state(THREAD).values["log"]
        for r in range(ROUNDS):
            outcomes = [results[0][r], results[1][r]]
            assert sorted(o[0] for o in outcomes) == ["ok", "refused"], outcomes
            [won] = [o[1] for o in outcomes if o[0] == "ok"]
            assert head[: len(won)] == won  # the winner's run is in the thread, at its head then
        assert len(head) == 3 * (ROUNDS + 1)
        assert all(len(v) == 1 for v in continuing_children(saver, THREAD).values())


def test_a_writer_paused_between_its_check_and_its_write_is_refused(
    s3_url: str, redis_url: str, redis_prefix: str
) -> None:
    """The check and the write are one compare-and-set: a writer paused after the store's
    CHECK (before its PUT) while another continues the same checkpoint loses when it resumes."""
    pause = Pause("append.before_put")
    options = {"redis_prefix": redis_prefix, "claim_ms": 0}
    with SessionStoreSaver.from_url(s3_url, redis_url, **options) as other:
        graph = build_graph(other)
        graph.invoke({"log": ["start"]}, THREAD)
        head = graph.get_state(THREAD).config
        with SessionStoreSaver.from_url(s3_url, redis_url, fault_hook=pause, **options) as paused:
            slow = InThread(lambda: build_graph(paused).invoke({"log": ["slow"]}, head))
            pause.wait_paused()
            assert graph.invoke({"log": ["fast"]}, head)["log"][-1] == "fast:a:b"
            pause.release()
            with pytest.raises(CheckpointForkError):
                slow.result()
        assert graph.get_state(THREAD).values["log"][-3:] == ["fast", "fast:a", "fast:a:b"]
        assert all(len(v) == 1 for v in continuing_children(other, THREAD).values())


# --- what is stored ------------------------------------------------------------------------------


def test_a_channel_value_is_stored_once_per_version(embedded_dir: Path) -> None:
    """A big channel written once and a small one written every step: the big value is one
    blob, whatever the number of checkpoints after it."""

    class Big(TypedDict):
        doc: str
        n: int

    graph_def = StateGraph(Big)
    graph_def.add_node("step", lambda s: {"n": s["n"] + 1})
    graph_def.add_edge(START, "step")
    graph_def.add_edge("step", END)
    doc = "x" * 100_000
    with SessionStoreSaver.from_url((embedded_dir / "once").as_uri()) as saver:
        graph = graph_def.compile(checkpointer=saver)
        graph.invoke({"doc": doc, "n": 0}, THREAD)
        for _ in range(9):
            graph.invoke({"n": graph.get_state(THREAD).values["n"]}, THREAD)
        assert graph.get_state(THREAD).values == {"doc": doc, "n": 10}
        entries = saver.store.load_session_entries(saver.thread_session_id("thread-1"))
        blobs = [e for e in entries if e.get("customType") == BLOB_TYPE]
        assert sum(1 for b in blobs if b["data"]["channel"] == "doc") == 1
        assert sum(1 for e in entries if e.get("customType") == CHECKPOINT_TYPE) == 30
        # Every entry continues the one before it: the session is one path.
        assert [e["parentId"] for e in entries[1:]] == [e["id"] for e in entries[:-1]]


def test_copy_thread_is_a_fork_and_both_threads_go_on(embedded_dir: Path) -> None:
    with SessionStoreSaver.from_url((embedded_dir / "copy").as_uri()) as saver:
        graph = build_graph(saver)
        graph.invoke({"log": ["one"]}, THREAD)
        saver.copy_thread("thread-1", "copy")
        copy = {"configurable": {"thread_id": "copy"}}
        assert saver.store.get_header(saver.thread_session_id("copy")).fork is not None
        assert graph.invoke({"log": ["c"]}, copy)["log"] == ["one", "one:a", "one:a:b", "c", "c:a", "c:a:b"]
        assert graph.invoke({"log": ["o"]}, THREAD)["log"][-1] == "o:a:b"
        assert graph.get_state(copy).values["log"][-1] == "c:a:b"
        assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {"thread-1", "copy"}
        with pytest.raises(SessionExistsError):
            saver.copy_thread("thread-1", "copy")


def _checkpoints(saver: SessionStoreSaver, thread_id: str, n: int) -> Iterator[tuple[Any, ...]]:
    """The ``put`` arguments of ``n`` checkpoints, each a ``loop`` child of the one before."""
    from langgraph.checkpoint.base import copy_checkpoint, empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6

    config: dict[str, Any] = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    prev: Any = None
    for step in range(n):
        checkpoint = empty_checkpoint() if prev is None else copy_checkpoint(prev)
        checkpoint["id"] = str(uuid6(clock_seq=step))
        version = saver.get_next_version(checkpoint["channel_versions"].get("step"), None)
        checkpoint["channel_versions"]["step"] = version
        checkpoint["channel_values"]["step"] = step
        yield config, checkpoint, {"source": "input" if step == 0 else "loop", "step": step, "parents": {}}, {
            "step": version}
        prev = checkpoint
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint["id"]}}


@pytest.mark.every_backend
def test_a_warm_put_is_one_put_and_copy_thread_costs_what_a_short_thread_does(
    make_store: Any,
) -> None:
    """The writer that wrote a thread's last checkpoint puts the next one with one object
    request (its segment's PUT; Redis's tail, CHECK and COMMIT besides); and a cold
    ``copy_thread`` of a thread of 300 checkpoints costs exactly the object requests of one
    of 3: the source's tail and a fork (docs/adapters.md, "Costs")."""
    saver = SessionStoreSaver(make_store(), namespace="cost")
    puts: list[int] = []
    for k, args in enumerate(_checkpoints(saver, "long", 300)):
        before = saver.store.objects.requests["put"], sum(saver.store.objects.requests.values())
        saver.put(*args)
        if k >= 2:  # the thread and the run index exist, this saver wrote the last checkpoint
            after = saver.store.objects.requests["put"], sum(saver.store.objects.requests.values())
            puts.append(after[1] - before[1])
            assert after[0] - before[0] == 1
    assert set(puts) == {1}
    for args in _checkpoints(saver, "short", 3):
        saver.put(*args)

    def copy_requests(source: str, target: str) -> dict[str, int]:
        cold = SessionStoreSaver(make_store(), namespace="cost")
        cold.store.create_session("warm-" + target)  # the backend's probe is not the copy's
        cold.store.objects.requests.clear()
        cold.copy_thread(source, target)
        return {op: n for op, n in cold.store.objects.requests.items() if n}

    want = {"get": 3, "head": 2, "put": 2}  # get_tail's HEAD past the tail, then the fork
    assert copy_requests("long", "long-copy") == want
    assert copy_requests("short", "short-copy") == want
    latest = saver.get_tuple({"configurable": {"thread_id": "long-copy", "checkpoint_ns": ""}})
    assert latest is not None and latest.checkpoint["channel_values"]["step"] == 299
    assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {
        "long", "short", "long-copy", "short-copy"}


def test_bad_input_is_refused_and_writes_nothing(embedded_dir: Path) -> None:
    with SessionStoreSaver.from_url((embedded_dir / "bad").as_uri()) as saver:
        with pytest.raises(InvalidInputError):
            saver.get_tuple({"configurable": {}})
        with pytest.raises(InvalidInputError):
            saver.put_writes({"configurable": {"thread_id": "t"}}, [("ch", 1)], "task")
        with pytest.raises(InvalidInputError):
            saver.prune(["t"], strategy="everything")
        with pytest.raises(InvalidInputError):
            SessionStoreSaver(saver.store, ttl_ms=-1)
        with pytest.raises(InvalidInputError):
            SessionStoreSaver(object())
        assert list(saver.list(None)) == []
