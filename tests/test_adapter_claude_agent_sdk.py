"""The Claude Agent SDK's ``SessionStore`` on the store (``store.adapters.claude_agent_sdk``).

Against real servers only: the SDK's own conformance suite on S3 + Redis (moto and SeaweedFS)
and on the embedded default; the SDK's store-backed functions (import, list, info, messages,
subagents, fork, rename, tag, delete) on a transcript in Claude Code's on-disk format, checked
against the SDK's own disk readers of the same files; four writer processes on one transcript
re-sending batches as after lost responses; a resume (the SDK's ``materialize_resume_session``)
in another process; the SDK's real agent loop (``query``: the bundled Claude Code CLI, talking to
a scripted model served on loopback) mirroring a turn into the store and resuming it on a
"machine" with an empty config directory; the cost of a cold load before and after compaction.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing as mp
import random
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from claude_agent_sdk import (
    ClaudeAgentOptions,
    MirrorErrorMessage,
    ResultMessage,
    delete_session_via_store,
    fold_session_summary,
    fork_session_via_store,
    get_session_info,
    get_session_info_from_store,
    get_session_messages,
    get_session_messages_from_store,
    get_subagent_messages,
    get_subagent_messages_from_store,
    import_session_to_store,
    list_sessions,
    list_sessions_from_store,
    list_subagents,
    list_subagents_from_store,
    project_key_for_directory,
    query,
    rename_session_via_store,
    tag_session_via_store,
)
from claude_agent_sdk._internal.session_resume import materialize_resume_session
from claude_agent_sdk.testing import run_session_store_conformance

from compactor import Compactor, CompactorOptions
from store import SessionStore
from store.adapters.claude_agent_sdk import (
    ENTRY_TYPE,
    ClaudeSessionStore,
    export_claude_projects,
    import_claude_projects,
)
from store.aio import AsyncSessionStore
from store.backends.embedded import EmbeddedRedis
from harness.pausing import InThread, Pause
from harness.s3_server import ServerRequests
from test_group_commit import offers
from test_fair_appends import wait_for

FIXTURE = Path(__file__).parent / "fixtures" / "claude" / "projects" / "-work-demo"
SID = "8f14e45f-ceea-467a-9af0-7a1a0bc1e9d2"
AGENT = "a1b2c3d4e5f6a7b8c"


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def embedded_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The embedded default's directory (its redis-server stopped after the module)."""
    root = tmp_path_factory.mktemp("claude-embedded")
    yield root
    EmbeddedRedis(root / ".redis").stop()


# --- the SDK's conformance suite --------------------------------------------------------------


async def _conformance(store: AsyncSessionStore) -> None:
    # A fresh namespace per contract: the suite reuses key names across its 14 contracts.
    n = itertools.count()
    await run_session_store_conformance(lambda: ClaudeSessionStore(store, namespace=f"c{next(n)}"))


def test_conformance_on_s3_and_redis(s3_url: str, redis_url: str, redis_prefix: str) -> None:
    async def run() -> None:
        async with await AsyncSessionStore.open(s3_url, redis_url, redis_prefix=redis_prefix) as store:
            await _conformance(store)

    asyncio.run(run())


def test_conformance_on_the_embedded_default(embedded_dir: Path) -> None:
    async def run() -> None:
        async with await AsyncSessionStore.open(embedded_dir.as_uri()) as store:
            await _conformance(store)

    asyncio.run(run())


# --- dedup and ordering rules ------------------------------------------------------------------


def test_uuid_dedup_resent_batches_and_uuidless_entries(embedded_dir: Path) -> None:
    key = {"project_key": "-repo", "session_id": "dedup"}

    async def run() -> None:
        async with await ClaudeSessionStore.open(embedded_dir.as_uri(), namespace="dedup") as cc:
            a = {"type": "user", "uuid": "a", "n": 1}
            b = {"type": "assistant", "uuid": "b", "n": 2}
            title = {"type": "custom-title", "customTitle": "T"}  # no uuid
            batch = [a, title, b]
            await cc.append(key, batch)
            await cc.append(key, batch)  # re-sent after a "lost response": nothing twice
            assert await cc.load(key) == [a, title, b]
            c = {"type": "user", "uuid": "c", "n": 3}
            await cc.append(key, [b, c, {**a, "n": 99}])  # mixed: only c is new
            assert await cc.load(key) == [a, title, b, c]
            # Without any uuid in the batch, entries are appended as sent, every time.
            mode = {"type": "mode", "mode": "plan"}
            await cc.append(key, [mode])
            await cc.append(key, [mode])
            assert await cc.load(key) == [a, title, b, c, mode, mode]
            # A uuid twice in one batch: the first copy is kept.
            await cc.append(key, [{"type": "user", "uuid": "d", "v": 1}, {"type": "user", "uuid": "d", "v": 2}])
            assert (await cc.load(key))[-1] == {"type": "user", "uuid": "d", "v": 1}
            # Entries come back deep-equal, odd JSON included.
            odd = {"type": "x", "uuid": "e", "nested": {"k": [1, 2.5, None, True, "ü\u2028"]}, "big": 2**53 + 1}
            await cc.append(key, [odd])
            assert (await cc.load(key))[-1] == odd
            summaries = await cc.list_session_summaries("-repo")
            assert [s["data"] for s in summaries] == [
                fold_session_summary(None, key, await cc.load(key))["data"]  # type: ignore[arg-type]
            ]

    asyncio.run(run())


# --- the SDK's store-backed functions on a Claude Code transcript ----------------------------


def _claude_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A Claude config dir holding the fixture under the project key of a work directory."""
    workdir = tmp_path / "work" / "demo"
    workdir.mkdir(parents=True)
    home = tmp_path / "claude-home"
    shutil.copytree(FIXTURE, home / "projects" / project_key_for_directory(workdir))
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(home))
    return home, workdir


def test_store_backed_functions_on_a_claude_code_transcript(
    s3_url: str, redis_url: str, redis_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _home, workdir = _claude_home(tmp_path, monkeypatch)
    d = str(workdir)
    project_key = project_key_for_directory(workdir)
    key = {"project_key": project_key, "session_id": SID}
    disk_main = _jsonl(FIXTURE / f"{SID}.jsonl")
    disk_sub = _jsonl(FIXTURE / SID / "subagents" / f"agent-{AGENT}.jsonl")

    async def run() -> None:
        cc = await ClaudeSessionStore.open(s3_url, redis_url, redis_prefix=redis_prefix)
        async with cc:
            await import_session_to_store(SID, cc, directory=d)
            await import_session_to_store(SID, cc, directory=d, batch_size=3)  # again, cut otherwise
            assert await cc.load(key) == disk_main  # nothing twice, in file order
            sub = await cc.load({**key, "subpath": f"subagents/agent-{AGENT}"})
            assert sub is not None and [e for e in sub if e["type"] != "agent_metadata"] == disk_sub
            assert await cc.list_subkeys(key) == [f"subagents/agent-{AGENT}"]

            # The store path reads what the SDK's disk path reads from the same files.
            [info] = await list_sessions_from_store(cc, directory=d)
            [disk_info] = list_sessions(directory=d)
            for field in ("session_id", "summary", "custom_title", "first_prompt", "git_branch",
                          "cwd", "tag", "created_at"):
                assert getattr(info, field) == getattr(disk_info, field), field
            assert info.summary == "Please fix it that way."  # lastPrompt wins over the summary hint
            single = await get_session_info_from_store(cc, SID, directory=d)
            assert single is not None and single.first_prompt == get_session_info(SID, directory=d).first_prompt
            messages = await get_session_messages_from_store(cc, SID, directory=d)
            assert messages == get_session_messages(SID, directory=d)
            assert [m.type for m in messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]
            assert await list_subagents_from_store(cc, SID, directory=d) == list_subagents(SID, directory=d) == [AGENT]
            sub_messages = await get_subagent_messages_from_store(cc, SID, AGENT, directory=d)
            assert sub_messages == get_subagent_messages(SID, AGENT, directory=d)
            assert len(sub_messages) == 2 and sub_messages[0].parent_tool_use_id == "toolu_01Xyz"

            await rename_session_via_store(cc, SID, "Cache test: fake clock", directory=d)
            await tag_session_via_store(cc, SID, "flaky", directory=d)
            [info] = await list_sessions_from_store(cc, directory=d)
            assert (info.custom_title, info.summary, info.tag) == ("Cache test: fake clock",) * 2 + ("flaky",)
            await tag_session_via_store(cc, SID, None, directory=d)
            assert (await list_sessions_from_store(cc, directory=d))[0].tag is None

            # Fork up to the second assistant message: fresh uuids, the source untouched.
            up_to = disk_main[4]["uuid"]
            fork = await fork_session_via_store(cc, SID, directory=d, up_to_message_id=up_to)
            forked = await cc.load({"project_key": project_key, "session_id": fork.session_id})
            assert forked is not None
            assert [e["forkedFrom"]["messageUuid"] for e in forked if "forkedFrom" in e] == [
                e["uuid"] for e in disk_main[1:5]
            ]
            assert len(await get_session_messages_from_store(cc, fork.session_id, directory=d)) == 4
            listed = await list_sessions_from_store(cc, directory=d)
            assert {i.session_id for i in listed} == {SID, fork.session_id}
            assert {i.custom_title for i in listed} == {"Cache test: fake clock", "Cache test: fake clock (fork)"}

            # Every summary is the fold of its transcript as loaded; mtimes share one clock.
            mtimes = {s["session_id"]: s["mtime"] for s in await cc.list_sessions(project_key)}
            for s in await cc.list_session_summaries(project_key):
                loaded = await cc.load({"project_key": project_key, "session_id": s["session_id"]})
                assert s["data"] == fold_session_summary(None, key, loaded)["data"]  # type: ignore[arg-type]
                assert s["mtime"] == mtimes[s["session_id"]] > 1e12

            await delete_session_via_store(cc, SID, directory=d)
            assert await cc.load(key) is None
            assert await cc.load({**key, "subpath": f"subagents/agent-{AGENT}"}) is None
            assert await cc.list_subkeys(key) == []
            assert [i.session_id for i in await list_sessions_from_store(cc, directory=d)] == [fork.session_id]
            # Imported again after the delete: a new life, listed again.
            await import_session_to_store(SID, cc, directory=d)
            assert await cc.load(key) == disk_main
            assert {s["session_id"] for s in await cc.list_sessions(project_key)} == {SID, fork.session_id}

    asyncio.run(run())


# --- group commit: batches of several writers in one segment --------------------------------


def test_batches_that_share_a_segment_are_all_in_the_summary(make_store: Any) -> None:
    """Two writers queue behind a third that holds the claim on the transcript's next segment;
    the first of them writes both batches as one segment (group commit). The summary must hold
    both batches (a fold of only one writer's batch, taken for the whole segment, lost the
    other's title or last prompt)."""
    key = {"project_key": "-group", "session_id": "shared-segment"}
    seed = ClaudeSessionStore(AsyncSessionStore(make_store()))
    sid = seed.session_id_for(key)
    hold = Pause("append.before_put", lambda c: c.get("session_id") == sid)
    stores = {name: make_store(fault_hook=hook) for name, hook in (("h", hold), ("a", None), ("b", None))}

    def user(u: str) -> dict[str, Any]:
        return {"type": "user", "uuid": u, "timestamp": "2026-11-27T10:00:00.000Z",
                "message": {"role": "user", "content": f"prompt {u}"}}

    batches = {
        "h": [user("h")],
        "a": [user("a"), {"type": "custom-title", "customTitle": "title from a", "uuid": "a-title"}],
        "b": [user("b"), {"type": "last-prompt", "lastPrompt": "last prompt from b"}],
    }

    def writer(name: str) -> InThread:
        async def run() -> None:
            async with ClaudeSessionStore(AsyncSessionStore(stores[name])) as cc:
                await cc.append(key, batches[name])

        return InThread(lambda: asyncio.run(run()))

    async def seed_session() -> None:
        await seed.append(key, [user("first")])
        assert len(await seed.list_session_summaries("-group")) == 1  # a fold to extend

    asyncio.run(seed_session())
    h = writer("h")
    hold.wait_paused()
    a = writer("a")
    wait_for(lambda: len(offers(stores["h"], sid)) == 1, "a queued with its offer")
    b = writer("b")
    wait_for(lambda: len(offers(stores["h"], sid)) == 2, "b queued with its offer")
    hold.release()
    h.result()
    a.result()
    b.result()

    async def check() -> None:
        async with seed:
            loaded = await seed.load(key)
            assert loaded is not None
            [summary] = await seed.list_session_summaries("-group")
            assert summary["data"] == fold_session_summary(None, key, loaded)["data"]  # type: ignore[arg-type]
            assert summary["data"]["custom_title"] == "title from a"
            assert summary["data"]["last_prompt"] == "last prompt from b"

    # The premise: a's and b's batches were committed as one segment.
    data = stores["h"].read_session(sid)
    seq_of = {e["id"]: s for e, s in zip(data.entries, data.seqs)}
    assert seq_of["u.a"] == seq_of["u.b"] != seq_of["u.h"]
    asyncio.run(check())


@pytest.mark.s3_backends("moto", reason="requests are counted in moto's own request log")
def test_an_append_is_one_object_write_counted_at_the_server(
    s3_location: Any, redis_url: str, redis_prefix: str
) -> None:
    """After a transcript's first append (which registers it with the project's index), each
    append is its segment's PUT and nothing else on the object store."""
    key = {"project_key": "-costs", "session_id": "one-write"}

    async def run() -> None:
        cc = await ClaudeSessionStore.open(s3_location.url, redis_url, redis_prefix=redis_prefix)
        async with cc:
            await cc.append(key, [{"type": "user", "uuid": "u0", "message": {"content": "m0"}}])
            for i in range(1, 6):
                with ServerRequests(s3_location.bucket) as seen:
                    await cc.append(key, [{"type": "user", "uuid": f"u{i}", "message": {"content": f"m{i}"}},
                                          {"type": "assistant", "uuid": f"a{i}", "message": {"content": f"r{i}"}}])
                assert (seen.count("PUT"), seen.count()) == (1, 1), seen.lines
            loaded = await cc.load(key)
            assert loaded is not None and len(loaded) == 11
            [summary] = await cc.list_session_summaries("-costs")
            assert summary["data"] == fold_session_summary(None, key, loaded)["data"]  # type: ignore[arg-type]

    asyncio.run(run())


def test_listings_fold_what_load_returns_with_a_writer_paused_before_its_commit(make_store: Any) -> None:
    """A writer paused after its segment's PUT, before Redis hears of it: ``load`` returns
    that batch (the read probes past Redis's tail), and so do both listings, in a process
    that had folded the transcript before and in a fresh one; once the writer goes on, a
    listing shows exactly what load shows again."""
    key = {"project_key": "-paused", "session_id": "paused-writer"}
    seed = ClaudeSessionStore(AsyncSessionStore(make_store()))
    sid = seed.session_id_for(key)
    hold = Pause("append.after_put", lambda c: c.get("session_id") == sid)
    paused_store = make_store(fault_hook=hold)

    def entry(u: str, **more: Any) -> dict[str, Any]:
        return {"type": "user", "uuid": u, "timestamp": "2026-11-27T10:00:00.000Z",
                "message": {"role": "user", "content": f"prompt {u}"}, **more}

    async def first() -> None:
        await seed.append(key, [entry("one")])
        assert len(await seed.list_session_summaries("-paused")) == 1

    asyncio.run(first())

    def writer() -> InThread:
        async def run() -> None:
            async with ClaudeSessionStore(AsyncSessionStore(paused_store)) as cc:
                await cc.append(key, [entry("two"), {"type": "custom-title", "customTitle": "late title",
                                                     "uuid": "title"}])

        return InThread(lambda: asyncio.run(run()))

    async def agree(cc: ClaudeSessionStore) -> dict[str, Any]:
        loaded = await cc.load(key)
        assert loaded is not None
        [summary] = await cc.list_session_summaries("-paused")
        [listed] = await cc.list_sessions("-paused")
        assert summary["data"] == fold_session_summary(None, key, loaded)["data"]  # type: ignore[arg-type]
        assert summary["mtime"] == listed["mtime"]
        return summary

    w = writer()
    hold.wait_paused()
    assert asyncio.run(agree(seed))["data"]["custom_title"] == "late title"
    fresh = ClaudeSessionStore(AsyncSessionStore(make_store()))
    assert asyncio.run(agree(fresh))["data"]["custom_title"] == "late title"
    hold.release()
    w.result()

    async def after() -> None:
        await seed.append(key, [entry("three")])
        async with seed:
            await agree(seed)
        async with fresh:
            await agree(fresh)

    asyncio.run(after())


# --- many writer processes, then a resume elsewhere -------------------------------------------

WRITERS = 4
BATCHES = 15
WP = project_key_for_directory("/srv/fleet")  # "-srv-fleet": the cwd the resume runs in
WKEY = {"project_key": WP, "session_id": "0b9e7d2a-5c4f-4e1a-9d3b-7a6c5e4f3d2b"}


def _batch(wid: int, i: int, rng: random.Random) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for k in range(rng.randint(1, 3)):
        role = "user" if k % 2 == 0 else "assistant"
        out.append({"type": role, "uuid": f"w{wid}-{i}-{k}", "w": wid, "i": i,
                    "timestamp": f"2026-01-10T10:{i:02d}:{k:02d}.000Z",
                    "message": {"role": role, "content": f"writer {wid} batch {i} entry {k}"}})
    if rng.random() < 0.3:
        out.append({"type": "last-prompt", "lastPrompt": f"writer {wid} batch {i}", "w": wid, "i": i})
    if rng.random() < 0.3:
        out.append({"type": "custom-title", "customTitle": f"title {wid}.{i}", "uuid": f"t{wid}-{i}",
                    "w": wid, "i": i})
    return out


def _writer(objects_url: str, redis_url: str, prefix: str, wid: int, out: str) -> None:
    async def run() -> None:
        rng = random.Random(1000 + wid)
        sent: list[list[dict[str, Any]]] = []
        cc = await ClaudeSessionStore.open(objects_url, redis_url, redis_prefix=prefix)
        async with cc:
            for i in range(BATCHES):
                batch = _batch(wid, i, rng)
                await cc.append(WKEY, batch)
                if rng.random() < 0.2:  # the response was lost: the same batch again
                    await cc.append(WKEY, batch)
                if sent and rng.random() < 0.1:  # a late retry of the batch before
                    await cc.append(WKEY, sent[-1])
                sent.append(batch)
                if i % 7 == 0:
                    await cc.append({**WKEY, "subpath": f"subagents/agent-w{wid}"},
                                    [{"type": "user", "uuid": f"s{wid}-{i}", "isSidechain": True}])
        Path(out).write_text(json.dumps(sent))

    asyncio.run(run())


def _resume(objects_url: str, redis_url: str, prefix: str, cwd: str, conn: Any) -> None:
    """In a process of its own: the SDK's resume materialises the session from the store."""

    async def run() -> dict[str, Any]:
        cc = await ClaudeSessionStore.open(objects_url, redis_url, redis_prefix=prefix)
        async with cc:
            options = ClaudeAgentOptions(session_store=cc, resume=WKEY["session_id"], cwd=cwd)
            mat = await materialize_resume_session(options)
            assert mat is not None
            try:
                project = mat.config_dir / "projects" / WP
                files = {
                    str(p.relative_to(project)): _jsonl(p) for p in sorted(project.rglob("*.jsonl"))
                }
            finally:
                await mat.cleanup()
            return files

    conn.send(asyncio.run(run()))
    conn.close()


@pytest.mark.long
def test_four_writer_processes_resend_and_a_resume_elsewhere(
    s3_url: str, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    ctx = mp.get_context("spawn")
    outs = [tmp_path / f"w{i}.json" for i in range(WRITERS)]
    procs = [ctx.Process(target=_writer, args=(s3_url, redis_url, redis_prefix, i, str(outs[i])))
             for i in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
        assert p.exitcode == 0
    sent = [json.loads(o.read_text()) for o in outs]

    async def check() -> list[dict[str, Any]]:
        cc = await ClaudeSessionStore.open(s3_url, redis_url, redis_prefix=redis_prefix)
        async with cc:
            loaded = await cc.load(WKEY)
            assert loaded is not None
            # 0 lost, 0 duplicated: each batch exactly once, uuid-less entries included.
            assert len(loaded) == sum(len(b) for batches in sent for b in batches)
            uuids = [e["uuid"] for e in loaded if "uuid" in e]
            assert len(uuids) == len(set(uuids))
            for wid in range(WRITERS):
                mine = [e for e in loaded if e["w"] == wid]
                # Every writer's order kept, each batch whole and contiguous.
                assert mine == [e for b in sent[wid] for e in b]
                for b in sent[wid]:
                    at = loaded.index(b[0])
                    assert loaded[at : at + len(b)] == b
            # The summary is the fold of the transcript in commit order: no update lost.
            [summary] = await cc.list_session_summaries(WP)
            assert summary["data"] == fold_session_summary(None, WKEY, loaded)["data"]  # type: ignore[arg-type]
            [listed] = await cc.list_sessions(WP)
            assert summary["mtime"] == listed["mtime"]
            assert sorted(await cc.list_subkeys(WKEY)) == [f"subagents/agent-w{w}" for w in range(WRITERS)]
            return loaded

    loaded = asyncio.run(check())
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_resume, args=(s3_url, redis_url, redis_prefix, "/srv/fleet", send))
    proc.start()
    send.close()  # the child's copy stays open: recv() ends with EOFError if the child dies
    files = receive.recv()
    proc.join(60)
    assert proc.exitcode == 0
    assert files[f"{WKEY['session_id']}.jsonl"] == loaded
    subs = {k: v for k, v in files.items() if "subagents" in k}
    assert len(subs) == WRITERS and all(len(v) == len(range(0, BATCHES, 7)) for v in subs.values())


# --- the cost of a cold load --------------------------------------------------------------------


def test_a_cold_load_costs_a_few_requests_after_compaction(
    s3_url: str, redis_url: str, redis_prefix: str
) -> None:
    key = {"project_key": "-long", "session_id": "long"}
    flushes = 100

    async def write() -> None:
        # Without Redis's recent-segments cache, which would serve the uncompacted tail.
        cc = await ClaudeSessionStore.open(s3_url, redis_url, redis_prefix=redis_prefix, recent_cache_bytes=0)
        async with cc:
            for i in range(flushes):
                await cc.append(key, [{"type": "user", "uuid": f"u{i}", "message": {"content": f"m{i}"}},
                                      {"type": "assistant", "uuid": f"a{i}", "message": {"content": f"r{i}"}}])

    async def cold_load() -> tuple[int, dict[str, int]]:
        sync = SessionStore.from_url(s3_url, redis_url, redis_prefix=redis_prefix)
        cc = ClaudeSessionStore(AsyncSessionStore(sync), owns_store=True)
        async with cc:
            sync.objects.requests.clear()
            loaded = await cc.load(key)
            assert loaded is not None
            return len(loaded), dict(sync.objects.requests)

    asyncio.run(write())
    n, before = asyncio.run(cold_load())
    assert n == 2 * flushes
    assert before["get"] > flushes  # one GET per flush: what compaction is for
    compactor_store = SessionStore.from_url(s3_url, redis_url, redis_prefix=redis_prefix)
    try:
        cc = ClaudeSessionStore(AsyncSessionStore(compactor_store))
        res = Compactor(compactor_store, CompactorOptions()).compact_session(cc.session_id_for(key))
        assert res.entries == 2 * flushes
    finally:
        compactor_store.close()
    n, after = asyncio.run(cold_load())
    assert n == 2 * flushes
    # The header, the manifest (named by Redis), one base, the probe after it; no LIST.
    print(f"cold load of {flushes} flushes: before compaction {before}, after {after}")
    assert after["get"] <= 4 and after.get("list", 0) == 0, after


# --- Claude Code's projects directory in and out -------------------------------------------------


def test_import_and_export_claude_projects(embedded_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "projects"
    shutil.copytree(FIXTURE, src / "-work-demo")

    async def run() -> None:
        async with await ClaudeSessionStore.open(embedded_dir.as_uri(), namespace="io") as cc:
            keys = await import_claude_projects(cc, src)
            assert keys == [{"project_key": "-work-demo", "session_id": SID},
                            {"project_key": "-work-demo", "session_id": SID,
                             "subpath": f"subagents/agent-{AGENT}"}]
            before = [await cc.load(k) for k in keys]  # type: ignore[arg-type]
            assert await import_claude_projects(cc, src) == keys  # idempotent
            assert [await cc.load(k) for k in keys] == before  # type: ignore[arg-type]
            out = tmp_path / "out"
            await export_claude_projects(cc, out, ["-work-demo"])
            for path in sorted(p for p in src.rglob("*") if p.is_file()):
                exported = out / path.relative_to(src)
                if path.suffix == ".jsonl":
                    assert _jsonl(exported) == _jsonl(path), path.name
                else:
                    assert json.loads(exported.read_text()) == json.loads(path.read_text())
            assert sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()) == sorted(
                p.relative_to(src) for p in src.rglob("*") if p.is_file()
            )
            # The store holds each line as one custom entry whose data is the line.
            raw = await cc.store.load_session_entries(cc.session_id_for(keys[0]))  # type: ignore[arg-type]
            assert {e["customType"] for e in raw} == {ENTRY_TYPE}

    asyncio.run(run())


# --- the SDK's real agent loop ------------------------------------------------------------------


class ScriptedModel:
    """The Anthropic Messages API on loopback, answering each request with the next canned text
    (streamed as the API streams it). The CLI is pointed at it with ANTHROPIC_BASE_URL: the
    agent loop is the real one, only the model is scripted. No network, no API key."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(404)
                self.end_headers()

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                if "count_tokens" in self.path:
                    return self._json({"input_tokens": 10})
                model.requests.append(body)
                text = model.replies.pop(0) if model.replies else "ok"
                msg = {"id": f"msg_{len(model.requests)}", "type": "message", "role": "assistant",
                       "model": body.get("model", "m"), "content": [{"type": "text", "text": text}],
                       "stop_reason": "end_turn", "stop_sequence": None,
                       "usage": {"input_tokens": 10, "output_tokens": 5}}
                if not body.get("stream"):
                    return self._json(msg)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                start = {**msg, "content": [], "stop_reason": None}
                for name, data in (
                    ("message_start", {"message": start}),
                    ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
                    ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": text}}),
                    ("content_block_stop", {"index": 0}),
                    ("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                       "usage": {"output_tokens": 5}}),
                    ("message_stop", {}),
                ):
                    self.wfile.write(f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode())
                self.wfile.flush()

            def _json(self, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _cli_env(model: ScriptedModel, config_dir: Path) -> dict[str, str]:
    return {"ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": model.url,
            "CLAUDE_CONFIG_DIR": str(config_dir), "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1"}


def test_the_real_agent_loop_mirrors_a_turn_and_resumes_it_elsewhere(
    s3_url: str, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    model = ScriptedModel(["Hello from the scripted model.", "You asked me to say hello."])
    workdir = tmp_path / "repo"
    workdir.mkdir()
    project_key = project_key_for_directory(workdir)

    async def turn(cc: ClaudeSessionStore, prompt: str, config_dir: Path, resume: str | None) -> str:
        options = ClaudeAgentOptions(session_store=cc, cwd=str(workdir), resume=resume, max_turns=1,
                                     model="claude-sonnet-4-5", env=_cli_env(model, config_dir))
        session_id = None
        async for message in query(prompt=prompt, options=options):
            assert not isinstance(message, MirrorErrorMessage), message
            if isinstance(message, ResultMessage):
                assert not message.is_error, message
                session_id = message.session_id
        assert session_id is not None
        return session_id

    async def run() -> None:
        cc = await ClaudeSessionStore.open(s3_url, redis_url, redis_prefix=redis_prefix)
        async with cc:
            first_machine = tmp_path / "machine-1"
            sid = await turn(cc, "Say hello", first_machine, None)
            key = {"project_key": project_key, "session_id": sid}
            local = _jsonl(first_machine / "projects" / project_key / f"{sid}.jsonl")
            stored = await cc.load(key)
            assert stored is not None
            # The mirror carries the transcript lines (the CLI keeps a few bookkeeping lines
            # local): each stored entry is a local line, in the local order.
            it = iter(local)
            assert all(any(e == line for line in it) for e in stored)
            conversation = [e for e in local if e["type"] in ("user", "assistant")]
            assert [e for e in stored if e["type"] in ("user", "assistant")] == conversation
            # Another machine, nothing on its disk: the resume comes from the store.
            second_machine = tmp_path / "machine-2"
            assert await turn(cc, "What did I ask?", second_machine, sid) == sid
            history = model.requests[-1]["messages"]
            assert any(m["role"] == "assistant" and "Hello from the scripted model." in json.dumps(m["content"])
                       for m in history)
            messages = await get_session_messages_from_store(cc, sid, directory=str(workdir))
            texts = [json.dumps(m.message) for m in messages if m.type == "assistant"]
            assert len(texts) == 2 and "You asked me to say hello." in texts[1]
            [info] = await list_sessions_from_store(cc, directory=str(workdir))
            assert (info.session_id, info.first_prompt) == (sid, "Say hello")
            loaded = await cc.load(key)
            [summary] = await cc.list_session_summaries(project_key)
            assert summary["data"] == fold_session_summary(None, key, loaded)["data"]  # type: ignore[arg-type]

    try:
        asyncio.run(run())
    finally:
        model.close()
