"""The ``sessionstore`` command through its real entry point.

Most tests call ``store.cli.main(argv)`` in-process with stdout/stderr captured (fast: no
interpreter start per call); where separate processes are the point (follow in one terminal,
append in another; the embedded default shared by several processes; no traceback on stderr)
they run ``python -m store.cli``. Every test runs against the real servers of the fixtures:
the S3 server over HTTP and a redis-server, each test on its own bucket and key prefix.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pi_samples import pi_fixtures

from store import SessionStore
from store.cli import main
from store.cli.common import Exit
from store.backends.embedded import EmbeddedRedis
from store.backends.files import FileObjectStore
from store.formats.layout import LAYOUT_SPREAD, Layout
from store.model.js_json import dumps_js
from store.pi.scan import read_pi_file

FIXTURES = pi_fixtures()
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


CLI = Callable[..., Result]


@pytest.fixture
def backend_args(s3_url: str, redis_url: str, redis_prefix: str) -> list[str]:
    return ["--objects", s3_url, "--redis", redis_url, "--redis-prefix", redis_prefix]


@pytest.fixture
def cli(backend_args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> CLI:
    """``cli("ls", "--json", stdin=b"...")`` -> Result, in-process on the test's servers."""

    def run(*args: str, stdin: bytes = b"", backends: bool = True) -> Result:
        capsys.readouterr()
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        code = main([*(backend_args if backends else []), *args])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONSTORE_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def run_cli(*args: str, cwd: Path | None = None, stdin: bytes = b"", timeout: float = 60) -> Result:
    proc = subprocess.run([sys.executable, "-m", "store.cli", *args], input=stdin, capture_output=True,
                          cwd=cwd, env=subprocess_env(), timeout=timeout)
    return Result(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def jsonl(*entries: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in entries)


def msg(eid: str, parent: str | None, role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent, "timestamp": "2026-01-02T03:04:05.000Z",
            "message": {"role": role, "content": [{"type": "text", "text": text}], "timestamp": 1767323045000}}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def new_session(cli: CLI, name: str = "demo") -> str:
    res = cli("create", "--name", name, "--json")
    assert res.code == 0, res.err
    sid: str = res.json()["session"]
    return sid


# --- usage -------------------------------------------------------------------------------------


def test_help_and_usage_errors(cli: CLI) -> None:
    res = cli("--help", backends=False)
    assert res.code == 0 and "exit codes:" in res.out
    res = cli(backends=False)
    assert res.code == Exit.USAGE
    res = cli("frobnicate", backends=False)
    assert res.code == Exit.USAGE and "invalid choice" in one_line(res.err)
    res = cli("append")
    assert res.code == Exit.USAGE and "required" in one_line(res.err)
    res = cli("follow", "x", "--count", "many")
    assert res.code == Exit.USAGE


def test_version(cli: CLI) -> None:
    res = cli("--version", backends=False)
    assert res.code == 0 and res.out.startswith("sessionstore ") and res.out.split()[1][0].isdigit()


BAD_REDIS_URLS = ["http://x", "redis://host:notaport/0", "redis://localhost:6379/abc", "redis://h:70000/0",
                  "redis://:6379/0", "unix://", "redis://h:1/0?socket_timeout=abc", "localhost:6379"]
BAD_OBJECT_URLS = ["ftp://x", "s3://", "s3://b?endpoint=notaurl", "s3://b?endpoint=http://h:99999",
                   "s3://b?connect_timeout=x", "s3://b?region=a%20b"]


def test_a_bad_url_is_a_usage_error_in_one_line(cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    for url in BAD_REDIS_URLS:
        res = cli("--redis", url, "ls", backends=False)
        assert res.code == Exit.USAGE, (url, res)
        assert one_line(res.err).startswith(f"sessionstore: bad Redis URL {url!r} (from --redis): "), res.err
    for url in BAD_OBJECT_URLS:
        res = cli("--objects", url, "--redis", "redis://127.0.0.1:1/0", "ls", backends=False)
        assert res.code == Exit.USAGE, (url, res)
        assert one_line(res.err).startswith(f"sessionstore: bad object store URL {url!r} (from --objects): "), res.err
    # From the environment: named as such.
    monkeypatch.setenv("SESSIONSTORE_REDIS_URL", "http://x")
    res = cli("ls", backends=False)
    assert res.code == Exit.USAGE and "(from SESSIONSTORE_REDIS_URL)" in one_line(res.err)
    # The installed entry point, as the issue has it: no "internal error", exit 2.
    res = run_cli("--redis", "http://x", "ls")
    assert res.code == Exit.USAGE and "internal error" not in one_line(res.err)


# --- create, append, ls, info, show, context -----------------------------------------------------


def test_create_append_list_show_context(cli: CLI) -> None:
    sid = new_session(cli, "refactor greet()")
    res = cli("append", sid, "--json", stdin=jsonl(msg("u1", None, "user", "hello"), msg("a1", "u1", "assistant", "hi!")))
    assert res.code == 0, res.err
    assert res.json() == {"session": sid, "seq": 2, "last": "a1", "count": 2}
    # Strict append: refused with exit 4 when the tail is not the expected one.
    res = cli("append", sid, "--expect-tail", "u1", stdin=jsonl(msg("u2", "a1", "user", "again")))
    assert res.code == Exit.CONFLICT
    assert "expected tail 'u1'" in one_line(res.err)
    res = cli("append", sid, "--expect-tail", "a1", stdin=jsonl(msg("u2", "a1", "user", "again")))
    assert res.code == 0 and "segment 3" in res.out
    # A branch off u1, and an entry with id, parentId and timestamp filled in (chained to the tail).
    assert cli("append", sid, stdin=jsonl(msg("b1", "u1", "user", "other idea"))).code == 0
    label = {"type": "label", "targetId": "u1", "label": "start"}
    res = cli("append", sid, "--json", stdin=jsonl(label))
    assert res.code == 0, res.err
    label_id = res.json()["last"]

    rows = cli("ls", "--json").json()
    assert [(r["session"], r["name"], r["entries"]) for r in rows] == [(sid, "refactor greet()", 6)]
    listing = cli("ls").out.splitlines()
    assert listing[0].split() == ["SESSION", "ENTRIES", "UPDATED", "NAME"]
    assert sid in listing[1] and "refactor greet()" in listing[1]

    info = cli("info", sid, "--json").json()
    assert info["entries"] == 6 and info["leaf"] == label_id and info["seq"] == 5 and info["labels"] == 1

    shown = cli("show", sid)
    assert shown.code == 0
    lines = shown.out.splitlines()
    assert lines[0].startswith(f"session {sid}") and "'refactor greet()'" in lines[0]
    text = "\n".join(lines)
    assert "[start]" in text  # the label on u1
    assert "├─" in text and "└─" in text  # u1 has two children: a1 and b1
    leaf_line = next(line for line in lines if "◀ leaf" in line)
    assert label_id in leaf_line
    tree = cli("show", sid, "--json").json()
    assert tree["leaf"] == label_id and tree["tree"][0]["entry"]["type"] == "session_info"

    context = cli("context", sid).json()
    assert [m["role"] for m in context["messages"]] == ["user", "user"]  # the leaf's path: u1, b1
    context = cli("context", sid, "--leaf", "u2", "--compact").json()
    assert [m["content"][0]["text"] for m in context["messages"]] == ["hello", "hi!", "again"]


def test_expect_empty_info_times_and_show_names(cli: CLI, make_store: Callable[..., SessionStore]) -> None:
    sid = cli("create", "--json").json()["session"]  # no name: no entry yet
    assert cli("append", sid, "--expect-empty", stdin=jsonl(msg("u1", None, "user", "first"))).code == 0
    res = cli("append", sid, "--expect-empty", stdin=jsonl(msg("u2", "u1", "user", "second")))
    assert res.code == Exit.CONFLICT
    line = one_line(res.err)
    assert "--expect-empty" in line and "--expect-tail" in line and "'u1'" in line  # names the real tail
    assert "expected tail ''" not in line
    # pi's context compaction and the store's compaction are told apart.
    mgr = make_store().open_session(sid)
    mgr.append_compaction("summary of the start", "u1", 1234)
    assert cli("compact", sid, "--grace", "0").code == 0
    assert cli("append", sid, stdin=jsonl({"type": "message", "message": {"role": "user", "content": "after"}})).code == 0
    header = cli("show", sid).out.splitlines()[0]
    assert "1 context compaction" in header and "stored as 1 segment after manifest 1" in header, header
    assert "compaction(s)" not in header and "compactions +" not in header
    info = cli("info", sid, "--json").json()
    assert info["manifest"] == 1 and info["segments_after_manifest"] == 1 and info["context_compactions"] == 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", info["created_at"]), info
    assert isinstance(info["created_at_ms"], int)
    text = cli("info", sid).out
    assert f"created at                 {info['created_at']}" in text and str(info["created_at_ms"]) not in text
    rows = cli("ls", "--json").json()
    assert rows[0]["created_at"] == info["created_at"] and rows[0]["updated_at"].endswith("Z")
    assert "1 segments after manifest 1" in cli("verify", sid).out


def test_append_at_a_terminal_says_it_reads_stdin(cli: CLI, backend_args: list[str]) -> None:
    import pty

    sid = new_session(cli)
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "store.cli", *backend_args, "append", sid], stdin=slave,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env())
        os.close(slave)
        slave = -1
        os.write(master, jsonl(msg("t1", None, "user", "typed")))
        os.write(master, b"\x04")  # Ctrl-D at the start of a line: end of input
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert proc.returncode == 0, err
    assert "reading entries from the terminal" in err.decode() and "Ctrl-D" in err.decode()
    assert "appended 1 entry" in out.decode()
    # Not at a terminal: no hint.
    res = cli("append", sid, stdin=jsonl(msg("t2", "t1", "user", "piped")))
    assert res.code == 0 and res.err == ""


def test_concurrent_appends_without_parent_chain(cli: CLI, backend_args: list[str]) -> None:
    """Entries without parentId go onto the tail: several `append`s at once land one after
    another (each retried onto the tail the others left), never as siblings."""
    sid = cli("create", "--json").json()["session"]
    assert cli("append", sid, stdin=jsonl(msg("root", None, "user", "start"))).code == 0
    procs = [subprocess.Popen([sys.executable, "-m", "store.cli", *backend_args, "append", sid],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env())
             for _ in range(4)]
    for i, p in enumerate(procs):
        p.stdin.write(jsonl({"type": "message", "id": f"c{i}", "message": {"role": "user", "content": f"{i}"}}))
        p.stdin.close()
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read() if p.stderr else ""
    entries = [e for e in json.loads(cli("show", sid, "--json").out)["tree"]]
    assert len(entries) == 1  # one root
    ordered = cli_entries(cli, sid)
    assert len(ordered) == 5
    assert [e["parentId"] for e in ordered[1:]] == [e["id"] for e in ordered[:-1]]
    assert "1 branch" in cli("show", sid).out.splitlines()[0]


def cli_entries(cli: CLI, sid: str) -> list[dict[str, Any]]:
    res = cli("export", sid)
    assert res.code == 0, res.err
    return [json.loads(line) for line in res.out.splitlines()[1:]]


def test_resending_a_hand_written_batch_after_an_unknown_outcome(cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exit 7, then the documented retry: the same file again. Entries with ids but without
    timestamp or parentId must come out the same, or the store sees other content."""
    from store.core import SessionStore as Store
    from store.errors import IndeterminateError

    sid = new_session(cli)
    batch = jsonl({"type": "message", "id": "h1", "message": {"role": "user", "content": "one"}},
                  {"type": "message", "id": "h2", "message": {"role": "assistant", "content": "two"}})
    real = Store.append_session_entries

    def landed_but_lost(self: Any, *args: Any, **kwargs: Any) -> Any:
        real(self, *args, **kwargs)  # the batch lands; its answer is lost
        raise IndeterminateError("segment: outcome unknown; re-sending the same batch is safe")

    monkeypatch.setattr(Store, "append_session_entries", landed_but_lost)
    res = cli("append", sid, stdin=batch)
    assert res.code == Exit.INDETERMINATE, res
    monkeypatch.setattr(Store, "append_session_entries", real)
    first = [e for e in cli_entries(cli, sid) if e["id"] in ("h1", "h2")]
    time.sleep(0.01)  # a new "now" would differ
    res = cli("append", sid, "--json", stdin=batch)
    assert res.code == 0, res.err
    assert res.json()["last"] == "h2" and res.json()["seq"] == 2  # the original result
    assert [e for e in cli_entries(cli, sid) if e["id"] in ("h1", "h2")] == first  # once, unchanged
    assert first[1]["parentId"] == "h1" and first[0]["timestamp"] == first[1]["timestamp"]

    # The other outcome: nothing landed. The re-send appends it then.
    def lost(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise IndeterminateError("segment: outcome unknown; re-sending the same batch is safe")

    more = jsonl({"type": "message", "id": "h3", "message": {"role": "user", "content": "three"}})
    monkeypatch.setattr(Store, "append_session_entries", lost)
    assert cli("append", sid, stdin=more).code == Exit.INDETERMINATE
    monkeypatch.setattr(Store, "append_session_entries", real)
    res = cli("append", sid, "--json", stdin=more)
    assert res.code == 0 and res.json()["seq"] == 3
    assert cli_entries(cli, sid)[-1]["parentId"] == "h2"


def test_errors_are_one_line_with_their_own_exit_code(cli: CLI, s3_location: Any, redis_url: str, redis_prefix: str) -> None:
    sid = new_session(cli)
    # not found
    for args in (["show", "nosuch"], ["info", "nosuch"], ["export", "nosuch"], ["follow", "nosuch", "--timeout", "0"],
                 ["context", sid, "--leaf", "nope"], ["fork", sid, "nope"], ["redact", sid, "nope", "--reason", "x"]):
        res = cli(*args)
        assert res.code == Exit.NOT_FOUND, (args, res)
        assert "not found" in one_line(res.err)
    # invalid input
    assert cli("append", sid, stdin=b"{not json\n").code == Exit.USAGE
    assert cli("append", sid, stdin=b"").code == Exit.USAGE
    assert cli("append", sid, stdin=jsonl({"type": "message", "id": 5, "parentId": None})).code == Exit.USAGE
    assert cli("show", "../etc").code == Exit.USAGE
    assert cli("append", sid, "/no/such/file.jsonl").code == Exit.NOT_FOUND
    # conflicts: a session that exists, an id reused with other content, an unknown parent
    res = cli("create", sid)
    assert res.code == Exit.CONFLICT and "already exists" in one_line(res.err)
    assert cli("append", sid, stdin=jsonl(msg("e1", None, "user", "one"))).code == 0
    assert cli("append", sid, stdin=jsonl(msg("e1", None, "user", "two"))).code == Exit.CONFLICT
    assert cli("append", sid, stdin=jsonl(msg("e2", "ghost", "user", "x"))).code == Exit.CONFLICT
    assert cli("export", sid, "other").code == Exit.USAGE  # several sessions need -o DIR
    # bad URLs
    assert cli("--objects", "ftp://x", "ls", backends=False).code == Exit.USAGE
    # Redis down: reads fall back to the object store, a write cannot be checked
    down = f"redis://127.0.0.1:{closed_port()}/0"
    res = cli("--objects", s3_location.url, "--redis", down, "--redis-prefix", redis_prefix,
              "append", sid, stdin=jsonl(msg("e3", "e1", "user", "x")), backends=False)
    assert res.code == Exit.UNAVAILABLE and "Redis unavailable" in one_line(res.err)
    # S3 down
    dead = f"s3://{s3_location.bucket}/p?endpoint=http://127.0.0.1:{closed_port()}&region=us-east-1"
    res = cli("--objects", dead, "--redis", redis_url, "ls", backends=False)
    assert res.code == Exit.UNAVAILABLE
    # S3 refuses: no such bucket
    missing = f"s3://no-such-bucket-{os.getpid()}?endpoint={s3_location.endpoint_url}&region=us-east-1"
    res = cli("--objects", missing, "--redis", redis_url, "ls", backends=False)
    assert res.code == Exit.REFUSED and "bucket" in one_line(res.err)


def test_server_down_prints_no_traceback_from_the_installed_entry_point(s3_url: str, redis_prefix: str) -> None:
    down = f"redis://127.0.0.1:{closed_port()}/0"
    # A one-shot command asks Redis first, and stops at once when it does not answer.
    for command in (("create", "s1"), ("append", "s1")):
        res = run_cli("--objects", s3_url, "--redis", down, "--redis-prefix", redis_prefix, *command,
                      stdin=jsonl(msg("x", None, "user", "x")))
        assert res.code == Exit.UNAVAILABLE
        assert one_line(res.err).startswith(f"sessionstore: Redis at {down} does not answer")


# --- fork, export, redact, delete ---------------------------------------------------------------


def test_fork_export_redact_delete(cli: CLI, tmp_path: Path) -> None:
    sid = new_session(cli, "source")
    entries = [msg("u1", None, "user", "what is 2+2"), msg("a1", "u1", "assistant", "4"),
               msg("u2", "a1", "user", "my password is hunter2-CANARY"), msg("a2", "u2", "assistant", "noted")]
    assert cli("append", sid, stdin=jsonl(*entries)).code == 0

    fork = cli("fork", sid, "a1", "--name", "the fork", "--json").json()
    assert fork["source"] == sid and fork["entry"] == "a1"
    fid = fork["session"]
    assert cli("append", fid, stdin=jsonl(msg("f1", "a1", "user", "and 3+3?"))).code == 0
    shown = cli("show", fid).out
    assert f"fork of {sid} at a1" in shown.splitlines()[0]
    out_file = tmp_path / "fork.jsonl"
    res = cli("export", fid, "-o", str(out_file), "--json")
    assert res.code == 0 and res.json()[0]["path"] == str(out_file)
    exported = read_pi_file(out_file)
    assert exported.header is not None and exported.header["parentSession"] == sid
    # The fork materialised: the source's path root..a1, then its own entries (its name, f1).
    ids = [e["id"] for e in exported.entries]
    assert len(ids) == 4 and ids[:2] == ["u1", "a1"] and ids[-1] == "f1"
    assert exported.entries[2]["type"] == "session_info" and exported.entries[2]["name"] == "the fork"
    # fork from the leaf when no entry is named
    leaf_fork = cli("fork", sid, "--json").json()
    assert leaf_fork["entry"] == "a2"

    res = cli("redact", sid, "u2", "--reason", "password", "--json")
    assert res.code == 0, res.err
    assert "CANARY" not in cli("context", sid, "--leaf", "a2").out
    assert "CANARY" not in cli("export", sid).out
    assert "CANARY" not in cli("show", sid, "--json").out
    assert "[redacted message: password]" in cli("show", sid).out
    assert cli("redact", sid, res.json()["redaction"], "--reason", "x").code == Exit.USAGE

    assert cli("delete", fid).code == Exit.USAGE  # needs --yes
    assert cli("delete", fid, "--yes").code == 0
    assert cli("show", fid).code == Exit.NOT_FOUND


# --- import / export round trip ------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    return bool(dumps_js(a) == dumps_js(b))


def _pi_file(path: Path, sid: str, stamp: str, text: str) -> Path:
    header = {"type": "session", "version": 3, "id": sid, "timestamp": stamp, "cwd": "/w"}
    path.write_bytes(jsonl(header, msg(f"{stamp[-6:-4]}x", None, "user", text)))
    return path


def test_import_a_pi_directory_and_export_it_back(cli: CLI, tmp_path: Path) -> None:
    pi_dir = tmp_path / "sessions" / "--home-user-project--"
    pi_dir.mkdir(parents=True)
    names = sorted(p.name for p in FIXTURES.iterdir() if (p / "session.jsonl").exists())
    assert len(names) >= 60, f"pi fixtures not found at {FIXTURES}"
    for name in names:
        shutil.copy(FIXTURES / name / "session.jsonl", pi_dir / f"{name}.jsonl")

    # Several fixtures share one session id: --new-ids gives each file a session of its own.
    res = cli("import", str(tmp_path / "sessions"), "--new-ids", "--json")
    report = res.json()
    files = {Path(f["path"]).stem: f for f in report["files"]}
    assert set(files) == set(names)
    imported = {n: f for n, f in files.items() if f["ok"]}
    refused = {n: f for n, f in files.items() if not f["ok"]}
    assert report["imported"] == len(imported) and report["refused"] == len(refused)
    # The files pi cannot open are refused, each reported on its own; the others all land.
    assert not files["empty_file"]["ok"] and not files["cycle_parent_loop"]["ok"]
    assert len(imported) >= 45 and res.code == Exit.FAILED
    for f in refused.values():
        assert f["error"] and f["exit_code"] == Exit.USAGE

    out_dir = tmp_path / "exported"
    res = cli("export", "--all", "-o", str(out_dir), "--json")
    assert res.code == 0, res.err
    paths = {row["session"]: Path(row["path"]) for row in res.json()}
    assert set(paths) == {f["session"] for f in imported.values()}
    for name, f in imported.items():
        back = read_pi_file(paths[f["session"]]).to_session()
        want = read_pi_file(pi_dir / f"{name}.jsonl").to_session()
        header = dict(want.header)
        assert back.header == header, name
        assert _same(list(back.entries), list(want.entries)), name
        assert back.leaf_id == want.leaf_id, name
        assert _same(back.build_context(), want.build_context()), name
        assert f["entries"] == len(want.entries), name

    # By header id: importing a file again changes nothing; a different file under an id
    # that is taken is refused (per file: the others still land).
    res = cli("import", str(pi_dir / "tool_calls.jsonl"), "--json")
    sid = res.json()["files"][0]["session"]
    assert res.code == 0 and sid == read_pi_file(pi_dir / "tool_calls.jsonl").header["id"]
    again = cli("import", str(pi_dir / "tool_calls.jsonl"), "--json").json()
    first = res.json()["files"][0]
    assert again["files"][0] == {**first, "status": "unchanged", "appended": 0}
    assert first["status"] == "created" and first["appended"] == first["entries"]
    one = _pi_file(tmp_path / "one.jsonl", "same-id", "2026-01-01T00:00:01.000Z", "first")
    two = _pi_file(tmp_path / "two.jsonl", "same-id", "2026-01-01T00:00:02.000Z", "second")
    res = cli("import", str(one), str(two), "--jobs", "1")
    assert res.code == Exit.FAILED
    assert f"refused {two}: session 'same-id' already exists with other content" in res.out
    assert "imported 1 of 2 files" in res.out
    assert "first" in cli("context", "same-id").out
    # One file from stdin, with an explicit id; a single refused file exits with its class.
    res = cli("import", "-", "--id", "from-stdin", stdin=(pi_dir / "tool_calls.jsonl").read_bytes())
    assert res.code == 0 and "as from-stdin" in res.out
    assert cli("import", str(two)).code == Exit.CONFLICT
    assert cli("import", str(pi_dir / "empty_file.jsonl")).code == Exit.USAGE
    assert cli("import", str(tmp_path / "nope")).code == Exit.NOT_FOUND


# --- follow ---------------------------------------------------------------------------------------


def _start_follow(backend_args: list[str], sid: str, *extra: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "store.cli", *backend_args, "follow", sid, "-n", "0", "--json", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env(),
    )
    assert proc.stderr is not None
    line = proc.stderr.readline().decode()  # printed once subscribed and caught up
    assert line.startswith(f"following {sid}"), line
    return proc


def test_follow_in_one_terminal_shows_appends_from_another(cli: CLI, backend_args: list[str]) -> None:
    sid = new_session(cli)
    assert cli("append", sid, stdin=jsonl(msg("old", None, "user", "before"))).code == 0
    follower = _start_follow(backend_args, sid, "--count", "3", "--timeout", "60")
    try:
        first = subprocess.run([sys.executable, "-m", "store.cli", *backend_args, "append", sid],
                               input=jsonl(msg("n1", "old", "user", "one"), msg("n2", "n1", "assistant", "two")),
                               capture_output=True, env=subprocess_env(), timeout=60)
        assert first.returncode == 0, first.stderr
        second = subprocess.run([sys.executable, "-m", "store.cli", *backend_args, "append", sid],
                                input=jsonl(msg("n3", "n2", "user", "three")),
                                capture_output=True, env=subprocess_env(), timeout=60)
        assert second.returncode == 0, second.stderr
        out, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, err
    assert [json.loads(line)["id"] for line in out.decode().splitlines()] == ["n1", "n2", "n3"]


def test_follow_does_not_need_the_notification(cli: CLI, backend_args: list[str], make_store: Callable[..., SessionStore]) -> None:
    """A writer that dies between its segment and its commit sends no notification; follow
    finds the segment on its periodic read."""
    sid = new_session(cli)

    class WriterDied(Exception):
        pass

    def die_after_put(point: str, ctx: dict[str, Any]) -> None:
        if point == "append.after_put":
            raise WriterDied()

    follower = _start_follow(backend_args, sid, "--count", "1", "--timeout", "60", "--poll", "0.3")
    try:
        crashing = make_store(fault_hook=die_after_put)
        with pytest.raises(WriterDied):
            crashing.append_session_entries(sid, [msg("silent", None, "user", "no notification")])
        out, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, err
    assert [json.loads(line)["id"] for line in out.decode().splitlines()] == ["silent"]
    # The last lines before following, then nothing new: --timeout ends it with exit 0.
    res = cli("follow", sid, "-n", "5", "--timeout", "0.5", "--poll", "0.1")
    assert res.code == 0 and "no notification" in res.out


# --- compact, gc, verify ---------------------------------------------------------------------


def _grow(store: SessionStore, sid: str, n: int) -> None:
    parent = None
    for i in range(n):
        store.append_session_entries(sid, [msg(f"{sid}-{i}", parent, "user", f"entry {i}")])
        parent = f"{sid}-{i}"


def test_compact_gc_and_verify(cli: CLI, make_store: Callable[..., SessionStore]) -> None:
    store = make_store()
    for sid in ("c1", "c2"):
        store.create_session(sid)
        _grow(store, sid, 6)
    before = cli("context", "c1", "--compact").out
    res = cli("compact", "c1", "--grace", "0", "--json")
    assert res.code == 0, res.err
    (result,) = res.json()
    assert result["outcome"] == "compacted" and result["segments_merged"] == [1, 6] and result["entries"] == 6
    assert "nothing to compact" in cli("compact", "c1").out
    # No session named: every session, like gc and verify (--all says the same).
    res = cli("compact", "--grace", "0")
    lines = sorted(res.out.splitlines())
    assert res.code == 0 and len(lines) == 2, res
    assert lines[0] == "c1: nothing to compact (manifest 1)" and lines[1].startswith("c2: segments 1-6 -> manifest 1 ")
    assert cli("compact", "c1", "--all").code == Exit.USAGE
    assert cli("compact", "--all", "--grace", "0").code == 0
    gc = cli("gc", "--grace", "0", "--json").json()
    assert gc["by_kind"].get("segment") == 12 and gc["errors"] == []
    assert cli("context", "c1", "--compact").out == before
    res = cli("verify", "--json")
    assert res.code == 0, res.out
    report = res.json()
    assert report["ok"] and report["sessions"] == 2
    assert {r["session_id"]: r["generation"] for r in report["results"]} == {"c1": 1, "c2": 1}
    assert cli("verify", "nosuch").code == Exit.NOT_FOUND


def _holders(store: SessionStore, sid: str, needle: bytes) -> list[str]:
    return [i.key for i in store.objects.list(store.layout.session_prefix(sid)) if needle in store.objects.get(i.key).data]


def test_redacted_bytes_stay_until_purged(
    cli: CLI, make_store: Callable[..., SessionStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the bytes of a redacted entry leave storage: not at redact, not at compact, not at
    `gc --grace 0` (the compaction recorded its own grace); at once with --purge-now (which
    waits out the rebuild age limit, shortened here)."""
    monkeypatch.setenv("SESSIONSTORE_REBUILD_MAX_AGE_MS", "200")
    store = make_store()
    sid = new_session(cli, "erasure")
    canary = b"hunter2-CANARY"
    entries = [msg("s1", None, "user", "hello"), msg("s2", "s1", "user", f"password {canary.decode()}"),
               msg("s3", "s2", "assistant", "noted")]
    assert cli("append", sid, stdin=jsonl(*entries)).code == 0
    res = cli("redact", sid, "s2", "--reason", "password")
    assert res.code == 0 and "hidden from every reader now" in res.out and "--purge-now" in res.out
    assert "purges" not in res.out
    assert _holders(store, sid, canary)
    res = cli("compact", sid)
    assert res.code == 0 and "1 redacted entries written as tombstones" in res.out and "go at gc after" in res.out
    assert _holders(store, sid, canary)
    gc = cli("gc", "--grace", "0")
    assert gc.code == 0 and "compact --purge-now" in gc.out
    assert _holders(store, sid, canary)  # the manifest's own grace (600 s) still runs
    context = cli("context", sid, "--compact").out
    res = cli("compact", sid, "--purge-now", "--json")
    assert res.code == 0, res.err
    purged = res.json()[-1]
    assert purged["outcome"] == "purged" and purged["deleted"]["segment"] == 3
    assert _holders(store, sid, canary) == []
    assert cli("context", sid, "--compact").out == context
    assert cli("verify", sid).code == 0

    # redact --purge-now: hidden and gone in one command, whatever the compactor did before.
    secret = b"api-key-CANARY-2"
    assert cli("append", sid, stdin=jsonl(msg("s4", "s3", "user", secret.decode()))).code == 0
    res = cli("redact", sid, "s4", "--reason", "key", "--purge-now", "--json")
    assert res.code == 0, res.err
    assert res.json()["purged"] is True and res.json()["manifest"] == 2
    assert _holders(store, sid, secret) == [] and _holders(store, sid, canary) == []
    assert store.load_session(sid).get_entry("s4")["redacted"]["reason"] == "key"


def test_a_reader_of_the_old_manifest_restarts_when_purge_deletes_under_it(
    cli: CLI, make_store: Callable[..., SessionStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The purge (a CLI call) waits out the rebuild age limit, shortened for it; the reader keeps
    # the default, so it restarts because of what the purge deleted, not because of its age.
    monkeypatch.setenv("SESSIONSTORE_REBUILD_MAX_AGE_MS", "500")
    store = make_store()
    sid = new_session(cli)
    assert cli("append", sid, stdin=jsonl(msg("r1", None, "user", "one"), msg("r2", "r1", "user", "two-CANARY"))).code == 0
    assert cli("append", sid, stdin=jsonl(msg("r3", "r2", "user", "three"))).code == 0
    assert cli("compact", sid).code == 0  # manifest 1
    assert cli("redact", sid, "r2", "--reason", "x").code == 0
    want = make_store().load_session_entries(sid)
    reader = make_store()
    get = reader.objects.get
    purged: list[int] = []
    lock = threading.Lock()

    def get_then_purge(key: str) -> Any:
        # The reader has chosen manifest 1; before its first base or segment arrives, the
        # purge compacts to manifest 2 and deletes everything manifest 1 named.
        with lock:
            if not purged and ("/base/" in key or "/seg/" in key):
                purged.append(cli("compact", sid, "--purge-now").code)
        return get(key)

    reader.objects.get = get_then_purge  # type: ignore[method-assign]
    got = reader.load_session_entries(sid)
    assert purged == [0]
    assert got == want  # a restart from manifest 2, never a partial or stale answer
    assert _holders(store, sid, b"CANARY") == []


def test_verify_reports_corrupt_and_missing_objects(cli: CLI, make_store: Callable[..., SessionStore], s3_location: Any) -> None:
    store = make_store()
    for sid in ("good", "bad", "gap"):
        store.create_session(sid)
        _grow(store, sid, 4)
    layout = store.layout
    client = s3_location.client()
    bad_key = layout.segment("bad", store.get_header("bad").incarnation, 2)
    # Overwritten behind the store's back (a plain PUT, no If-None-Match): bytes and checksum differ.
    client.put_object(Bucket=s3_location.bucket, Key=bad_key, Body=b'{"id": "x", "truncated\n',
                      Metadata={"sha256": "0" * 64})
    gap_key = layout.segment("gap", store.get_header("gap").incarnation, 3)
    client.delete_object(Bucket=s3_location.bucket, Key=gap_key)

    res = cli("verify", "--json")
    assert res.code == Exit.FAILED
    results = {r["session_id"]: r for r in res.json()["results"]}
    assert results["good"]["ok"]
    assert any(bad_key in f for f in results["bad"]["faults"])
    assert any("segment gap" in f for f in results["gap"]["faults"])
    text = cli("verify", "bad", "good")
    assert text.code == Exit.FAILED and "FAULT bad" in text.out and "ok    good" in text.out
    # Readers refuse the corrupt object with its own exit code (once Redis's recent-segments
    # cache, which holds the segment as its writer committed it, no longer has it).
    store.coord.client.delete(store.coord.keys.recent("bad"))
    res = cli("show", "bad")
    assert res.code == Exit.CORRUPT and bad_key in one_line(res.err)


# --- doctor ---------------------------------------------------------------------------------------


def test_doctor(cli: CLI, s3_location: Any, redis_prefix: str) -> None:
    res = cli("doctor", "--json")
    report = res.json()
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["objects: conditional writes"]["status"] == "ok"
    assert checks["objects: permissions"]["status"] == "ok"
    assert checks["objects: clock skew"]["status"] in ("ok", "warn")
    assert checks["objects: layout"]["status"] == "ok" and "spread" in checks["objects: layout"]["detail"]
    assert checks["redis: version"]["status"] == "ok"
    assert checks["redis: permissions"]["status"] == "ok"
    assert checks["redis: eviction"]["status"] in ("ok", "warn")
    # The test Redis runs without persistence: a warning, which --strict turns into a failure.
    assert checks["redis: persistence"]["status"] == "warn"
    assert res.code == 0 and report["ok"]
    assert cli("doctor", "--strict").code == Exit.FAILED
    # A dead Redis fails its checks; the object store's are still made.
    down = f"redis://127.0.0.1:{closed_port()}/0"
    res = cli("--objects", s3_location.url, "--redis", down, "--redis-prefix", redis_prefix, "doctor", backends=False)
    assert res.code == Exit.FAILED
    assert "FAIL  redis: version" in res.out and "OK    objects: conditional writes" in res.out


# --- the embedded default ------------------------------------------------------------------------


def test_embedded_default_shared_by_several_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No configuration: ./.sessionstore/ and one redis-server that every process shares."""
    home = tmp_path / "proj"
    home.mkdir()
    for name in ("SESSIONSTORE_OBJECTS_URL", "SESSIONSTORE_REDIS_URL", "SESSIONSTORE_REDIS_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(home)
    embedded = EmbeddedRedis(home / ".sessionstore" / ".redis")

    def here(*args: str) -> Result:
        capsys.readouterr()
        code = main(list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    try:
        res = run_cli("create", "shared", "--name", "embedded", cwd=home)
        assert res.code == 0, res.err
        # A new store: the spread layout (store/formats/layout.py spells the key).
        assert FileObjectStore(home / ".sessionstore").head(Layout("", LAYOUT_SPREAD).header("shared")) is not None
        assert embedded.running()
        # Four processes append at once (no --expect-tail: each lands, as a root here).
        procs = [subprocess.Popen([sys.executable, "-m", "store.cli", "append", "shared"], cwd=home,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=subprocess_env())
                 for _ in range(4)]
        for i, p in enumerate(procs):
            _, err = p.communicate(jsonl(msg(f"p{i}", None, "user", f"from process {i}")), timeout=60)
            assert p.returncode == 0, err
        rows = here("ls", "--json").json()
        assert [(r["session"], r["name"], r["entries"]) for r in rows] == [("shared", "embedded", 5)]
        assert here("verify").code == 0
        status = here("embedded", "status", "--json").json()
        assert status["running"] and status["pid"] == embedded.pid()
        stop = here("embedded", "stop")
        assert stop.code == 0 and "stopped" in stop.out
        assert not embedded.running() and embedded.pid() is None
        # The data outlives the server (its AOF sits beside the objects); the next command
        # starts it again.
        res = here("context", "shared", "--compact")
        assert res.code == 0 and "from process 3" in res.out
        # --objects with a plain directory is the same store.
        monkeypatch.chdir(tmp_path)
        assert here("--objects", str(home / ".sessionstore"), "info", "shared").code == 0
        # The embedded Redis only exists beside a local directory.
        assert here("--objects", "s3://b?endpoint=http://127.0.0.1:1", "embedded", "status").code == Exit.USAGE
    finally:
        embedded.stop()
    assert not embedded.running()


def test_embedded_server_loading_is_not_given_a_twin(tmp_path: Path) -> None:
    """A redis-server of the directory that is alive (pidfile) but not answering yet must be
    waited for, never replaced by a second server on the same AOF."""
    embedded = EmbeddedRedis(tmp_path / ".redis")
    try:
        url = embedded.ensure_running()
        pid = embedded.pid()
        assert pid is not None
        os.kill(pid, 19)  # SIGSTOP: alive, silent
        try:
            with pytest.raises(Exception) as info:
                embedded.ensure_running(timeout=1.0)
            assert f"pid {pid}" in str(info.value)
        finally:
            os.kill(pid, 18)  # SIGCONT
        assert embedded.ensure_running() == url and embedded.pid() == pid
    finally:
        embedded.stop()


def test_verify_reports_a_redis_tail_ahead_of_the_object_store(
    cli: CLI, make_store: Callable[..., SessionStore]
) -> None:
    """Invariant 4: Redis's tail is never ahead of the object store. verify compares them."""
    store = make_store()
    store.create_session("ahead")
    _grow(store, "ahead", 3)
    assert cli("verify", "ahead").code == 0
    store.coord.client.hset(store.coord.keys.tail("ahead"), "seq", 9)
    res = cli("verify", "ahead", "--json")
    assert res.code == Exit.FAILED
    (result,) = res.json()["results"]
    assert any("ahead of the object store" in f for f in result["faults"])


CLAUDE_PROJECTS = Path(__file__).resolve().parent / "fixtures" / "claude" / "projects"


def _claude_files(root: Path) -> dict[str, list[Any]]:
    return {
        str(p.relative_to(root)): [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        for p in sorted(root.rglob("*.jsonl"))
    }


def test_claude_code_transcripts_in_and_back_out(cli: CLI, tmp_path: Path) -> None:
    source = _claude_files(CLAUDE_PROJECTS)
    assert any("subagents" in name for name in source), f"Claude fixtures not found at {CLAUDE_PROJECTS}"
    first = cli("claude-import", str(CLAUDE_PROJECTS), "--json")
    assert first.code == 0, first.err
    keys = first.json()
    assert {k["project_key"] for k in keys} == {"-work-demo"}
    assert any("subpath" in k for k in keys)
    # Importing the same tree again stores nothing twice.
    again = cli("claude-import", str(CLAUDE_PROJECTS))
    assert again.code == 0 and "imported 1 transcript of 1 project" in again.err
    out_dir = tmp_path / "out"
    exported = cli("claude-export", "-o", str(out_dir), "--json", "--", "-work-demo")
    assert exported.code == 0, exported.err
    assert _claude_files(out_dir) == source
    # Without project keys: every project in the store.
    everything = cli("claude-export", "-o", str(tmp_path / "all"))
    assert everything.code == 0, everything.err
    assert _claude_files(tmp_path / "all") == source
    # Bad input: a clear error, an exit code of its own, nothing written.
    missing = cli("claude-import", str(tmp_path / "nowhere"))
    assert missing.code == 3 and "not a directory" in missing.err
    (tmp_path / "file").write_text("x")
    assert cli("claude-export", "-o", str(tmp_path / "file"), "--", "-work-demo").code == 2
    assert cli("claude-export", "-o", str(tmp_path / "o2"), "..").code == 2
    assert not (tmp_path / "o2").exists()
