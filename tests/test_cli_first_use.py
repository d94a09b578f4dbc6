"""What a new user of the command line meets first (issue #35): unix-socket Redis URLs,
mistyped directories, ``python -m compactor`` agreeing with ``sessionstore``, backends that
are down, skipped lines of an import.

Real servers throughout: a redis-server listening on a unix socket, local stores in
temporary directories, the S3 server over HTTP.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_cli import REPO, Result, jsonl, msg, one_line, subprocess_env

from store.cli import main
from store.cli.common import Exit


def cli_in(capsys: pytest.CaptureFixture[str], *args: str) -> Result:
    capsys.readouterr()
    code = main(list(args))
    captured = capsys.readouterr()
    return Result(code, captured.out, captured.err)


def compactor(*args: str, cwd: Path | None = None, timeout: float = 60, **env: str) -> Result:
    proc = subprocess.run([sys.executable, "-m", "compactor", *args], capture_output=True, cwd=cwd or REPO,
                          env=subprocess_env(**env), timeout=timeout)
    return Result(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


# --- unix:// Redis URLs ----------------------------------------------------------------------


@pytest.fixture
def unix_redis(redis_server_factory: Callable[..., Any]) -> Iterator[str]:
    """The path of a unix socket a fresh redis-server listens on (a short path: sun_path
    holds about 100 bytes, more than a pytest tmp_path leaves)."""
    directory = tempfile.mkdtemp(prefix="ss-sock-")
    socket_path = f"{directory}/redis.sock"
    try:
        redis_server_factory(config={"unixsocket": socket_path, "unixsocketperm": "700"})
        yield socket_path
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("query", ["", "?db=0", "?db=3"])
def test_a_unix_socket_redis_url_works_in_every_command(
    unix_redis: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], query: str
) -> None:
    url = f"unix://{unix_redis}{query}"
    base = ("--objects", str(tmp_path / "store"), "--redis", url)

    def ok(*args: str) -> Result:
        res = cli_in(capsys, *base, *args)
        assert res.code == 0, (args, res.err)
        assert "bad Redis URL" not in res.err
        return res

    sid = json.loads(ok("create", "--name", "over a socket", "--json").out)["session"]
    ok("append", sid, str(_write(tmp_path / "e.jsonl", jsonl(msg("m1", None, "user", "hi")))))
    assert [s["session"] for s in json.loads(ok("ls", "--json").out)] == [sid]
    assert json.loads(ok("info", sid, "--json").out)["entries"] == 2  # its name, then m1
    ok("show", sid)
    exported = ok("export", sid).out
    ok("fork", sid, "m1", "--id", "forked")
    ok("compact", sid)
    ok("gc", "--grace", "0")
    ok("verify")
    ok("follow", sid, "--from-start", "--timeout", "0.2")
    assert '"id":"m1"' in exported
    # The compactor's command line takes the same URL.
    res = compactor("compact", sid, "--objects", (tmp_path / "store").as_uri(), "--redis", url)
    assert res.code == 0, res.err
    res = compactor("work", "--burst", "--objects", (tmp_path / "store").as_uri(), "--redis", url)
    assert res.code == 0, res.err
    # And the database it names is the one used: the session's tail is there.
    import redis

    db = int(query.partition("=")[2] or 0)
    client = redis.Redis(unix_socket_path=unix_redis, db=db)
    try:
        assert any(sid.encode() in key for key in client.keys("*"))
    finally:
        client.close()


def test_a_unix_url_without_its_slashes_is_a_usage_error_that_says_how(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    res = cli_in(capsys, "--objects", str(tmp_path), "--redis", "unix:/run/redis.sock", "ls")
    assert res.code == Exit.USAGE
    assert "unix:///run/redis.sock" in one_line(res.err)
    assert not (tmp_path / ".redis").exists()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# --- a local directory that does not exist -------------------------------------------------------


READING = [
    ("ls",), ("info", "s1"), ("show", "s1"), ("context", "s1"), ("export", "s1"), ("export", "--all", "-o", "out"),
    ("follow", "s1", "--timeout", "0.1"), ("verify",), ("compact",), ("gc",),
    ("append", "s1", "-"), ("fork", "s1"), ("redact", "s1", "e1", "--reason", "r"), ("delete", "s1", "--yes"),
    ("claude-export", "s1", "-o", "out"), ("trash", "ls"),
]


@pytest.mark.parametrize("command", READING, ids=[" ".join(c) for c in READING])
def test_a_missing_local_directory_is_an_error_naming_it_not_a_new_store(
    command: tuple[str, ...], tmp_path: Path, redis_url: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    typo = tmp_path / "sesions"
    res = cli_in(capsys, "--objects", str(typo), "--redis", redis_url, *command)
    assert res.code == Exit.NOT_FOUND, res
    assert one_line(res.err) == (f"sessionstore: no store at {typo}: the directory does not exist (mistyped? "
                                 "sessionstore create, import and serve start a new store there)")
    assert not typo.exists() and res.out == ""


def test_commands_that_write_start_a_store_in_a_new_directory(
    tmp_path: Path, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fresh = tmp_path / "new" / "store"
    res = cli_in(capsys, "--objects", str(fresh), "--redis", redis_url, "create", "s1")
    assert res.code == 0, res.err
    res = cli_in(capsys, "--objects", str(fresh), "--redis", redis_url, "ls", "--json")
    assert res.code == 0 and [s["session"] for s in json.loads(res.out)] == ["s1"]
    other = tmp_path / "imported"
    pi = _write(tmp_path / "p.jsonl", jsonl({"type": "session", "version": 3, "id": "p1", "timestamp": "t", "cwd": "/"}))
    res = cli_in(capsys, "--objects", str(other), "--redis", redis_url, "--redis-prefix", "other", "import", str(pi))
    assert res.code == 0, res.err
    assert other.is_dir()


# --- python -m compactor finds the store as sessionstore does -------------------------------------


def test_the_compactor_takes_a_plain_directory_and_the_same_default_as_sessionstore(
    tmp_path: Path, redis_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    prefix = ("--redis", redis_url)
    # sessionstore's default store, ./.sessionstore: the compactor's too.
    assert cli_in(capsys, *prefix, "create", "s1").code == 0
    for n in range(3):
        entry = msg(f"m{n}", f"m{n - 1}" if n else None, "user", "hi")
        res = cli_in(capsys, *prefix, "append", "s1", str(_write(tmp_path / "e.jsonl", jsonl(entry))))
        assert res.code == 0, res.err
    res = compactor("compact", "s1", *prefix, cwd=tmp_path)
    assert res.code == 0, res.err
    assert json.loads(res.out)[0]["segments_merged"] == [1, 3]
    # A plain path, relative or absolute, as sessionstore takes it.
    for objects in (".sessionstore", str(tmp_path / ".sessionstore")):
        res = compactor("history", "s1", "--objects", objects, *prefix, cwd=tmp_path)
        assert res.code == 0, res.err
        assert json.loads(res.out)[0]["generation"] == 1
    # The environment, as sessionstore reads it.
    res = compactor("history", "s1", "--redis", redis_url, cwd=REPO, SESSIONSTORE_OBJECTS_URL=str(tmp_path / ".sessionstore"))
    assert res.code == 0 and json.loads(res.out)[0]["generation"] == 1, res.err


def test_the_compactor_refuses_what_sessionstore_refuses_with_the_same_words_and_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], redis_url: str
) -> None:
    typo = tmp_path / "typo"
    for args, code in [
        (("--objects", str(typo), "--redis", redis_url), Exit.NOT_FOUND),  # no new store at a typo
        (("--objects", "ftp://x", "--redis", redis_url), Exit.USAGE),
        (("--objects", str(tmp_path), "--redis", "unix:/x.sock"), Exit.USAGE),
    ]:
        ours = cli_in(capsys, *args, "gc")
        theirs = compactor("gc", *args)
        assert ours.code == theirs.code == code, (args, ours, theirs)
        assert one_line(theirs.err) == one_line(ours.err).replace("sessionstore: ", "error: ", 1)
    assert not typo.exists()


def test_the_compactors_help_is_plain_text() -> None:
    res = compactor("--help")
    assert res.code == 0
    assert "``" not in res.out and "::" not in res.out, res.out
    assert "default ./.sessionstore" in res.out
    for command in ("work", "gc"):
        res = compactor(command, "--help")
        assert res.code == 0 and "``" not in res.out
        assert "default ./.sessionstore" in " ".join(res.out.split()), res.out


# --- backends that are down ------------------------------------------------------------------------


def test_with_redis_down_a_command_fails_at_once_in_one_line(
    tmp_path: Path, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket
    import time

    store_dir = tmp_path / "store"
    for n in range(15):
        assert cli_in(capsys, "--objects", str(store_dir), "--redis", redis_url, "create", f"s{n}").code == 0
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        down = f"redis://127.0.0.1:{s.getsockname()[1]}/0"
    for command in (("ls",), ("info", "s1"), ("export", "s1"), ("create", "s99")):
        started = time.monotonic()
        res = cli_in(capsys, "--objects", str(store_dir), "--redis", down, *command)
        took = time.monotonic() - started
        assert res.code == Exit.UNAVAILABLE, (command, res)
        assert one_line(res.err).startswith(f"sessionstore: Redis at {down} does not answer ("), res.err
        assert took < 3.0, (command, took)  # was 19 s and 15 warnings for ls, 5-11 s for the others
    # The password of a URL is not printed.
    res = cli_in(capsys, "--objects", str(store_dir), "--redis", down.replace("//", "//:hunter2@"), "ls")
    assert res.code == Exit.UNAVAILABLE and "hunter2" not in res.err and ":***@" in res.err


def test_s3_errors_name_the_bucket_and_endpoint_not_an_internal_key(tmp_path: Path, redis_url: str) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"
    url = f"s3://my-bucket/some/prefix?endpoint={endpoint}&region=us-east-1"
    env = {k: v for k, v in subprocess_env().items() if not k.startswith("AWS_")}
    env["AWS_CONFIG_FILE"] = env["AWS_SHARED_CREDENTIALS_FILE"] = str(tmp_path / "none")
    with_keys = {**env, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    for environment, code, says in ((env, Exit.REFUSED, "credentials missing"),
                                    (with_keys, Exit.UNAVAILABLE, "Could not connect")):
        proc = subprocess.run([sys.executable, "-m", "store.cli", "--objects", url, "--redis", redis_url, "ls"],
                              capture_output=True, env=environment, timeout=120)
        err = proc.stderr.decode()
        assert proc.returncode == code, err
        assert "_probe" not in err and "some/prefix/" not in err, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("sessionstore: ") and says in last
        assert f"bucket 'my-bucket' at {endpoint}" in last, err


def test_serve_without_its_extra_is_a_configuration_error_naming_it(tmp_path: Path) -> None:
    # The extra's absence, as an interpreter without uvicorn sees it: its import fails.
    program = ("import sys; sys.modules['uvicorn'] = None\n"
               "from store.cli import main\n"
               f"sys.exit(main(['--objects', {str(tmp_path)!r}, 'serve', '--port', '0']))")
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, env=subprocess_env(), timeout=60)
    assert proc.returncode == Exit.USAGE, proc
    line = one_line(proc.stderr.decode())
    assert line.startswith("sessionstore: sessionstore serve needs the http extra") and "pip install 'sessionstore[http]'" in line
