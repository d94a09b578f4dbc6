"""pi sessions through the store: import, load, export, writer handles, forks, redaction.

The pure model is checked against pi's own output in test_pi_fixtures.py; here every fixture
goes through the store (segments on the S3 server, Redis) and must come back meaning exactly
what the parsed file means, and exports must be read by pi itself the same way.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest
from pi_samples import pi_expected, pi_fixtures, pi_scenarios

from compactor import migrate_session
from store import SessionStore
from store.errors import (
    ConflictError,
    EntryNotFoundError,
    InvalidEntryError,
    InvalidInputError,
    SessionExistsError,
    SessionNotFoundError,
    SessionStoreError,
)
from store.model.js_json import dumps_js
from store.model.session import Session
from store.pi.scan import read_pi_file

FIXTURES = pi_fixtures()
SCENARIOS = pi_scenarios()
PI_NODE = Path(__file__).resolve().parent / "pi-node"
_expected = pi_expected


def _flat_tree(session: Session) -> list[tuple[str, list[str], Any]]:
    out = []
    stack = list(reversed(session.get_tree()))
    while stack:
        node = stack.pop()
        out.append((node.entry["id"], [c.entry["id"] for c in node.children], node.label))
        stack.extend(reversed(node.children))
    return out


def js(value: Any) -> bytes:
    """Compare as JavaScript would: 2**64 as a double and as pi's rounded digits are one value."""
    return dumps_js(value)


def assert_same_session(got: Session, want: Session, alternates: list[str]) -> None:
    assert [js(e) for e in got.entries] == [js(e) for e in want.entries]
    assert got.leaf_id == want.leaf_id
    assert [e["id"] for e in got.get_branch()] == [e["id"] for e in want.get_branch()]
    assert _flat_tree(got) == _flat_tree(want)
    assert got.labels == want.labels
    assert js(got.label_map) == js(want.label_map)
    assert got.name == want.name
    assert js(got.build_context()) == js(want.build_context())
    for target in alternates:
        assert js(got.build_context(target)) == js(want.build_context(target))


def test_fixtures_present() -> None:
    assert len(SCENARIOS) >= 62, f"pi fixtures missing from {FIXTURES}"


@pytest.mark.parametrize("name", SCENARIOS)
def test_import_then_load_means_what_pi_means(store: SessionStore, name: str) -> None:
    path = FIXTURES / name / "session.jsonl"
    expected = _expected(name)
    try:
        parsed = read_pi_file(path)
        want = parsed.to_session()
    except InvalidEntryError as exc:
        # Refused by the model (documented in docs/pi-format.md): the store refuses it too,
        # with the same error, and writes nothing.
        with pytest.raises(InvalidEntryError):
            store.import_pi_session(path, session_id="imp")
        assert list(store.iter_sessions()) == []
        assert expected["category"] in ("pathological", "handwritten"), exc
        return
    handle = store.import_pi_session(path, session_id="imp")
    got = store.load_session(handle.session_id)
    alternates = [a["target"] for a in expected.get("alternates", []) if a.get("target") in got]
    assert_same_session(got, want, alternates)
    if not expected.get("idsGeneratedOnOpen"):
        assert [e["id"] for e in got.entries] == [e["id"] for e in expected["entries"]]
        assert got.leaf_id == expected["leafId"]
        assert js(got.build_context()) == js(expected["context"])
    # Export, re-parse: the same session again.
    text = store.export_pi_session("imp")
    assert_same_session(read_pi_file(text.encode()).to_session(), want, alternates)


def test_import_is_idempotent(store: SessionStore) -> None:
    path = FIXTURES / "random_tree_small" / "session.jsonl"
    store.import_pi_session(path, session_id="twice")
    first = store.load_session_entries("twice")
    tail = store.get_tail("twice")
    store.import_pi_session(path, session_id="twice")
    assert store.load_session_entries("twice") == first
    assert store.get_tail("twice") == tail
    # v1 files mint ids: deterministically, so a re-import is idempotent too.
    v1 = FIXTURES / "legacy_v1_basic" / "session.jsonl"
    store.import_pi_session(v1, session_id="v1")
    store.import_pi_session(v1, session_id="v1")
    assert len(store.load_session_entries("v1")) == _expected("legacy_v1_basic")["entryCount"]
    # A different file under the same id is refused.
    with pytest.raises(SessionExistsError):
        store.import_pi_session(FIXTURES / "linear_basic" / "session.jsonl", session_id="v1")


def test_large_import_is_chunked_into_atomic_batches(make_store: Callable[..., SessionStore]) -> None:
    store = make_store(max_batch_entries=1000)
    store.import_pi_session(FIXTURES / "long_linear_5000" / "session.jsonl", session_id="long")
    assert store.get_tail("long").seq == 5
    assert len(store.load_session_entries("long")) == 5000


def _node_available() -> bool:
    return shutil.which("node") is not None and (PI_NODE / "node_modules" / "@mariozechner").is_dir()


def _install_pi() -> None:
    """pi's reference implementation, from npm, once (CI does it up front in .ci/run)."""
    if shutil.which("npm") is None or _node_available():
        return
    subprocess.run(
        ["npm", "install", "--no-save", "--no-audit", "--no-fund", "--prefix", str(PI_NODE),
         "@mariozechner/pi-coding-agent@0.73.1"],
        capture_output=True, timeout=600, check=False,
    )


def pi_open(files: list[Path]) -> list[dict[str, Any]]:
    _install_pi()
    if not _node_available():
        if os.environ.get("CI"):
            pytest.fail("CI must install node and @mariozechner/pi-coding-agent (see .ci/run)")
        pytest.skip("node or tests/pi-node/node_modules missing (run .ci/run once)")
    out = subprocess.run(
        ["node", "open.mjs", *map(str, files)], cwd=PI_NODE, capture_output=True, check=True, timeout=300
    )
    return json.loads(out.stdout)


def test_exports_are_read_by_pi_itself(store: SessionStore, tmp_path: Path) -> None:
    exported: list[tuple[Path, Session]] = []
    for name in SCENARIOS:
        try:
            read_pi_file(FIXTURES / name / "session.jsonl").to_session()
        except InvalidEntryError:
            continue
        sid = f"x-{len(exported)}"
        store.import_pi_session(FIXTURES / name / "session.jsonl", session_id=sid)
        path = tmp_path / f"{name}.jsonl"
        path.write_text(store.export_pi_session(sid), encoding="utf-8")
        exported.append((path, store.load_session(sid)))
    views = pi_open([p for p, _ in exported])
    assert len(views) == len(exported) >= 45
    for (path, ours), pi in zip(exported, views):
        assert [js(e) for e in pi["entries"]] == [js(e) for e in ours.entries], path.name
        assert pi["leafId"] == ours.leaf_id, path.name
        assert pi["branch"] == [e["id"] for e in ours.get_branch()], path.name
        assert js(pi["context"]) == js(ours.build_context()), path.name
        assert pi["name"] == ours.name, path.name
        assert js(pi["labelMap"]) == js(ours.label_map), path.name


# --- writer handles ----------------------------------------------------------------------------


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text, "timestamp": 1}


def _assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}], "provider": "p",
            "model": "m", "stopReason": "stop", "timestamp": 2}


def test_manager_mirrors_pi(store: SessionStore) -> None:
    store.create_session("m1", cwd="/w")
    mgr = store.open_session("m1")
    mgr.append_model_change("anthropic", "claude")
    mgr.append_thinking_level_change("high")
    q = mgr.append_message(_user("q1"))
    a = mgr.append_message(_assistant("a1"))
    mgr.append_label_change(q, "start")
    mgr.append_session_info("  my session  ")
    assert len(a) == 16 and int(a, 16) >= 0  # 64-bit ids
    ctx = mgr.build_session_context()
    assert [m["content"] for m in ctx["messages"]][0] == "q1"
    assert ctx["thinkingLevel"] == "high"
    assert ctx["model"] == {"provider": "p", "modelId": "m"}
    mgr.branch(q)
    summary = mgr.branch_with_summary(q, "tried something else")
    assert mgr.get_leaf_id() == summary
    mgr.reset_leaf()
    root2 = mgr.append_message(_user("fresh root"))
    assert mgr.get_entry(root2)["parentId"] is None  # type: ignore[index]
    loaded = store.load_session("m1")
    assert loaded.name == "my session"
    assert loaded.get_label(q) == "start"
    assert loaded.leaf_id == root2
    assert list(loaded.entries) == list(mgr.get_entries())
    entry_keys = {e["type"]: list(e) for e in loaded.entries}
    assert entry_keys["model_change"] == ["type", "id", "parentId", "timestamp", "provider", "modelId"]
    assert entry_keys["branch_summary"] == ["type", "id", "parentId", "timestamp", "fromId", "summary"]
    with pytest.raises(EntryNotFoundError):
        mgr.branch("nope")


def test_manager_batch_is_one_atomic_segment(store: SessionStore) -> None:
    store.create_session("mb")
    mgr = store.open_session("mb")
    with mgr.batch():
        mgr.append_message(_user("q"))
        mgr.append_message(_assistant("a"))
        mgr.append_custom_entry("tool-state", {"k": 1})
    assert store.get_tail("mb").seq == 1
    assert len(store.load_session_entries("mb")) == 3
    with pytest.raises(RuntimeError):
        with mgr.batch():
            mgr.append_message(_user("never"))
            raise RuntimeError("the turn failed")
    assert len(store.load_session_entries("mb")) == 3
    assert mgr.get_leaf_id() == store.load_session("mb").leaf_id


def _handle_writer(objects_url: str, redis_url: str, prefix: str, sid: str, leaf: str, tag: str) -> None:
    store = SessionStore.from_url(objects_url, redis_url, redis_prefix=prefix)
    mgr = store.open_session(sid)
    mgr.branch(leaf)
    for i in range(20):
        mgr.append_message(_user(f"{tag}-q{i}"))
        mgr.append_message(_assistant(f"{tag}-a{i}"))
    store.close()


def test_two_processes_through_handles_make_two_branches(
    s3_url: str, redis_url: str, redis_prefix: str
) -> None:
    store = SessionStore.from_url(s3_url, redis_url, redis_prefix=redis_prefix)
    store.create_session("two")
    mgr = store.open_session("two")
    root = mgr.append_message(_user("root"))
    old = mgr.append_message(_assistant("old leaf"))
    mgr.append_message(_user("newer"))
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_handle_writer, args=(s3_url, redis_url, redis_prefix, "two", old, "A")),
        ctx.Process(target=_handle_writer, args=(s3_url, redis_url, redis_prefix, "two", root, "B")),
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    session = store.load_session("two")
    assert len(session.entries) == 3 + 80
    children_of_old = [e["id"] for e in session.get_children(old)]
    children_of_root = [e["id"] for e in session.get_children(root)]
    assert len(children_of_old) == 2  # "newer" and A's first message
    assert len(children_of_root) == 2  # "old leaf" and B's first message
    for tag in ("A", "B"):
        tip = next(e for e in reversed(session.entries)
                   if e["message"]["role"] == "assistant" and e["message"]["content"][0]["text"] == f"{tag}-a19")
        texts = [m["content"] if isinstance(m["content"], str) else m["content"][0]["text"]
                 for m in session.build_context(tip["id"])["messages"]]
        assert texts[-40:] == [x for i in range(20) for x in (f"{tag}-q{i}", f"{tag}-a{i}")]
    store.close()


def test_strict_handle_refuses_when_another_writer_moved_the_tail(store: SessionStore) -> None:
    store.create_session("st")
    a = store.open_session("st", strict=True)
    b = store.open_session("st", strict=True)
    a.append_message(_user("from a"))
    with pytest.raises(ConflictError):
        b.append_message(_user("from b"))
    assert [e["message"]["content"] for e in store.load_session_entries("st")] == ["from a"]
    b.refresh()
    b.append_message(_user("from b, after refresh"))
    assert len(store.load_session_entries("st")) == 2


# --- forks -------------------------------------------------------------------------------------


def test_fork_of_fork_copies_nothing_and_exports(store: SessionStore, tmp_path: Path) -> None:
    store.create_session("src", cwd="/w")
    mgr = store.open_session("src")
    q1 = mgr.append_message(_user("q1"))
    a1 = mgr.append_message(_assistant("a1"))
    mgr.append_message(_user("q2 (not in the fork)"))
    fork = store.branch_from_entry("src", a1, "fork1")
    assert fork.header.pi_header["parentSession"] == "src"
    prefix = store.layout.session_prefix("fork1")
    assert [i.key for i in store.objects.list(prefix)] == [store.layout.header("fork1")]
    assert [e["id"] for e in store.load_session_entries("fork1")] == [q1, a1]
    assert store.get_tail("fork1").last_entry_id == a1
    f1 = store.open_session("fork1")
    q3 = f1.append_message(_user("q3 in fork"))
    a3 = f1.append_message(_assistant("a3 in fork"))
    fork2 = store.branch_from_entry("fork1", q3, "fork2")
    f2 = store.open_session(fork2.session_id)
    f2.append_message(_assistant("a3' in fork of fork"))
    assert [m["content"] if isinstance(m["content"], str) else m["content"][0]["text"]
            for m in store.load_session("fork2").build_context()["messages"]] == [
        "q1", "a1", "q3 in fork", "a3' in fork of fork"]
    # The source kept growing; the fork did not change.
    mgr.append_message(_assistant("a2"))
    assert a3 not in store.load_session("fork2")
    # Parents and uniqueness cover the inherited path.
    with pytest.raises(SessionStoreError):
        store.append_session_entries("fork2", [{"type": "message", "id": q1, "parentId": None, "message": _user("x")}])
    path = tmp_path / "fork2.jsonl"
    path.write_text(store.export_pi_session("fork2"), encoding="utf-8")
    parsed = read_pi_file(path).to_session()
    assert parsed.header["parentSession"] == "fork1"
    assert [e["id"] for e in parsed.entries] == [e["id"] for e in store.load_session("fork2").entries]
    if _node_available():
        (pi,) = pi_open([path])
        assert pi["context"] == store.load_session("fork2").build_context()
    with pytest.raises(EntryNotFoundError):
        store.branch_from_entry("src", "missing")
    with pytest.raises(SessionNotFoundError):
        store.branch_from_entry("nosuch", q1)


# --- lone surrogates ----------------------------------------------------------------------------


def test_lone_surrogates_are_stored_read_back_and_exported_exactly(store: SessionStore) -> None:
    """What JavaScript writes for a string cut inside an emoji round-trips through segments,
    the strict decoder and a compaction, and exports as pi writes it."""
    from compactor import Compactor, CompactorOptions

    store.create_session("sur", cwd="/w")
    mgr = store.open_session("sur")
    q = mgr.append_message(_user("cut: \ud83d"))
    with mgr.batch():
        mgr.append_custom_entry("k", {"\ude00": ["\ud83d", "😀", "\ude00\ud83d"]})
        mgr.append_message(_assistant("fine"))
    entries = store.load_session_entries("sur")
    assert js(entries) == js(list(mgr.get_entries()))
    assert entries[0]["message"]["content"] == "cut: \ud83d"
    assert entries[1]["data"] == {"\ude00": ["\ud83d", "😀", "\ude00\ud83d"]}
    assert '"cut: \\ud83d"' in store.export_pi_session("sur")
    # Re-sending a committed batch finds it (the idempotency hash covers such strings).
    again = store.append_session_entries("sur", [entries[0]])
    assert again.seq == 1 and again.last_appended_entry_id == q
    # A surrogate pair given as two code points would come back as one character: refused.
    with pytest.raises(InvalidEntryError, match="surrogate pair as two code points"):
        mgr.append_message(_user("\ud83d\ude00"))
    # The compactor rewrites segments that hold them (here: to purge a redaction).
    store.redact("sur", entries[2]["id"], "test")
    Compactor(store, CompactorOptions(grace_ms=0)).compact_session("sur")
    assert js(store.load_session_entries("sur")[:2]) == js(entries[:2])


def test_segments_with_surrogate_escapes_decode_strictly() -> None:
    import hashlib

    from store.formats.entries import decode_segment, encode_entries, prepare_batch
    from store.errors import CorruptObjectError

    entry = {"type": "custom", "id": "e1", "parentId": None, "data": {"\ud83d": "a\udfffé"}}
    body = encode_entries([entry])
    assert body == b'{"type":"custom","id":"e1","parentId":null,"data":{"\\ud83d":"a\\udfff\xc3\xa9"}}\n'
    assert prepare_batch([entry]).body == body
    plain = {"type": "custom", "id": "e0", "parentId": None, "data": "x"}
    segment = encode_entries([plain, entry])
    checksum = hashlib.sha256(segment).hexdigest()
    assert decode_segment("k", segment, checksum) == [plain, entry]  # verified bytes
    assert decode_segment("k", segment) == [plain, entry]  # the strict decoder
    # The strict decoder's guarantees hold for such lines too.
    bad = {
        b'{"type":"custom","id":"e1","parentId":null,"data":"\\uD83D"}\n': "not in canonical form",
        b'{"type":"custom","id":"e1","parentId":null,"data":"\xed\xa0\xbd"}\n': "invalid JSON",
        b'{"type":"custom","id":"e1","parentId":null,"data":"\\ud83d","data":"\\ud83d"}\n': "duplicate keys",
        b'{"type":"custom","id":"e1","parentId":null,"data":"\\ud83d","n":NaN}\n': "invalid JSON",
    }
    for data, reason in bad.items():
        with pytest.raises(CorruptObjectError, match=reason):
            decode_segment("k", data)
    # Bytes that match their checksum are parsed without the canonical check, but never
    # when they are not UTF-8 (a raw surrogate is not).
    raw = next(iter(d for d, reason in bad.items() if b"\xed" in d))
    with pytest.raises(CorruptObjectError, match="invalid JSON"):
        decode_segment("k", raw, hashlib.sha256(raw).hexdigest())


# --- redaction ---------------------------------------------------------------------------------


def test_redaction_hides_content_everywhere_a_reader_looks(store: SessionStore) -> None:
    canary = "CANARY-8d1f-secret-token"
    store.create_session("red")
    mgr = store.open_session("red")
    q = mgr.append_message(_user(f"my password is {canary}"))
    mgr.append_message(_assistant("noted"))
    store.redact("red", q, "credential leaked")
    session = store.load_session("red")
    tomb = session.get_entry(q)
    assert tomb is not None and tomb["redacted"]["reason"] == "credential leaked"
    assert tomb["parentId"] is None and tomb["type"] == "message"
    assert canary not in json.dumps(list(session.entries))
    assert canary not in json.dumps(store.load_session_entries("red"))
    assert canary not in json.dumps(session.build_context())
    assert canary not in store.export_pi_session("red")
    assert [m["role"] for m in session.build_context()["messages"]] == ["assistant"]
    with pytest.raises(EntryNotFoundError):
        store.redact("red", "nope", "x")
    with pytest.raises(InvalidInputError):
        store.redact("red", session.leaf_id, "redacting a redaction")  # type: ignore[arg-type]


# --- migration ---------------------------------------------------------------------------------


def test_session_of_an_older_schema_reads_current_and_migrates_forward(store: SessionStore) -> None:
    """Schema 0 stored pi v2 entries (role hookMessage); readers lift them, and
    migrate_session rewrites them forward without overwriting any object."""
    import orjson

    from store.formats.records import Header

    header = Header("old", "inc0", 1, {"type": "session", "version": 2, "id": "old", "timestamp": "t", "cwd": "/"}, schema=0)
    store.objects.put_if_absent(store.layout.header("old"), orjson.dumps(header.to_json()))
    v2 = [
        {"type": "message", "id": "h1", "parentId": None, "timestamp": "2025-01-01T00:00:00.000Z",
         "message": {"role": "hookMessage", "customType": "note", "content": "from a hook", "display": True, "timestamp": 1}},
        {"type": "message", "id": "u1", "parentId": "h1", "timestamp": "2025-01-01T00:00:01.000Z",
         "message": {"role": "user", "content": "hi", "timestamp": 2}},
    ]
    # Written by an old client: no schema in the metadata, so the header's (0) applies.
    store.objects.put_if_absent(store.layout.segment("old", "inc0", 1), b"".join(orjson.dumps(e) + b"\n" for e in v2))
    roles = lambda s: [m["role"] for m in s.build_context()["messages"]]  # noqa: E731
    assert roles(store.load_session("old")) == ["custom", "user"]
    # A current client appends (schema 1 in its metadata): both read as one session.
    store.append_session_entries("old", [{"type": "message", "id": "a1", "parentId": "u1", "message": _assistant("yo")}])
    assert roles(store.load_session("old")) == ["custom", "user", "assistant"]
    before = {i.key: store.objects.get(i.key).data for i in store.objects.list(store.layout.session_prefix("old"))}
    result = migrate_session(store, "old")
    assert result.outcome == "compacted"
    # Nothing overwritten: every object that existed is still there, byte for byte.
    for key, data in before.items():
        assert store.objects.get(key).data == data
    manifest = store.read_session("old").manifest
    assert manifest is not None
    (base,) = manifest.bases
    assert b"hookMessage" not in store.objects.get(base["key"]).data
    assert roles(store.load_session("old")) == ["custom", "user", "assistant"]
    assert [e["id"] for e in store.load_session_entries("old")] == ["h1", "u1", "a1"]
