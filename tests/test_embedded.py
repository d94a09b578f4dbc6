"""The embedded default's redis-server: one per directory, found by a lock its own process
holds, never doubled (not even after the directory is removed and created again), stopped by
``sessionstore embedded stop``, and announced by whoever started it.

Through the real entry points: ``python -m store.cli`` in a directory of the test's own, and
``SessionStore.from_url(file://...)`` in a child process.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import Result, jsonl, msg, run_cli, subprocess_env
from test_multiprocess import six_writers_keep_every_promise

from store import SessionStore
from store.backends.embedded import EmbeddedRedis, current_boot_id

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")


def _state(pid: int) -> str | None:
    """The process's state letter, None once it is gone (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    state = stat[stat.rfind(")") + 2 :].split()[0]
    return None if state in ("Z", "X") else state


def servers_of(directory: Path) -> list[int]:
    """Live redis-server processes started for ``directory`` (by the socket in their title),
    whether or not the directory still exists."""
    needle = str(EmbeddedRedis(directory / ".redis").socket).encode()  # a long path's is hashed
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        if b"redis-server" in cmdline and needle in cmdline and _state(int(name)) is not None:
            found.append(int(name))
    return sorted(found)


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "proj"
    home.mkdir()
    yield home
    for pid in servers_of(home / ".sessionstore"):  # whatever a failed test left behind
        os.kill(pid, signal.SIGKILL)


def cli_in(home: Path, *args: str, stdin: bytes = b"") -> Result:
    return run_cli(*args, cwd=home, stdin=stdin)


def test_the_command_that_starts_the_server_says_so_and_stop_stops_it(home: Path) -> None:
    store_dir = home / ".sessionstore"
    embedded = EmbeddedRedis(store_dir / ".redis")
    first = cli_in(home, "create", "s1")
    assert first.code == 0, first.err
    (pid,) = servers_of(store_dir)
    assert embedded.pid() == pid and embedded.held() and embedded.running()
    note = first.err.strip()
    assert note == (f"sessionstore: started the embedded redis-server of {store_dir} (pid {pid}); it keeps running "
                    f"for the next commands and processes: `sessionstore --objects {store_dir} embedded stop` stops it")
    second = cli_in(home, "ls")
    assert second.code == 0 and second.err == ""  # it did not start anything: nothing to say
    status = cli_in(home, "embedded", "status", "--json")
    assert '"running": true' in status.out and f'"pid": {pid}' in status.out
    stop = cli_in(home, "embedded", "stop")
    assert stop.code == 0 and f"(pid {pid})" in stop.out
    assert servers_of(store_dir) == [] and not embedded.held() and embedded.pid() is None
    assert "no embedded redis-server running" in cli_in(home, "embedded", "stop").out


@pytest.mark.parametrize("path", ["short", "long"])
def test_removing_the_directory_never_leaves_two_servers(home: Path, path: str) -> None:
    """``long``: a path past the unix socket's limit puts the socket outside the directory
    (hashed, in the temporary directory), where it outlives the directory's removal."""
    if path == "long":
        home = home / ("d" * 100)
        home.mkdir()
    store_dir = home / ".sessionstore"
    try:
        assert cli_in(home, "create", "before").code == 0
        (old,) = servers_of(store_dir)
        shutil.rmtree(store_dir)  # the server's socket, lock and AOF go with it; the process stays
        assert servers_of(store_dir) == [old]
        res = cli_in(home, "create", "after")
        assert res.code == 0, res.err
        assert "its directory was removed" in res.err
        (new,) = servers_of(store_dir)
        assert new != old and _state(old) is None
        assert EmbeddedRedis(store_dir / ".redis").pid() == new
        ls = cli_in(home, "ls", "--json")
        assert '"after"' in ls.out and '"before"' not in ls.out
        assert cli_in(home, "embedded", "stop").code == 0
        assert servers_of(store_dir) == []
    finally:
        for pid in servers_of(store_dir):  # what a failure left behind (outside the fixture's home)
            os.kill(pid, signal.SIGKILL)


def test_the_lock_cannot_go_stale(home: Path) -> None:
    """A server killed hard leaves its pid file behind; the lock goes with the process, so the
    next command starts one server, and a pid file naming some other live process is never
    taken for the server."""
    store_dir = home / ".sessionstore"
    embedded = EmbeddedRedis(store_dir / ".redis")
    assert cli_in(home, "create", "s1").code == 0
    (pid,) = servers_of(store_dir)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while (_state(pid) is not None or embedded.held()) and time.monotonic() < deadline:
        time.sleep(0.05)  # (a child redis-server forked, e.g. to rewrite its AOF, ends with it)
    assert not embedded.held() and embedded.pid() is None
    (store_dir / ".redis" / "redis.pid").write_text(str(os.getpid()))  # a live process, not a server
    assert embedded.pid() is None
    res = cli_in(home, "info", "s1")
    assert res.code == 0, res.err
    (again,) = servers_of(store_dir)
    assert again != pid and embedded.pid() == again
    embedded.stop()
    assert servers_of(store_dir) == []


def test_processes_starting_at_once_share_one_server(home: Path) -> None:
    store_dir = home / ".sessionstore"
    assert cli_in(home, "create", "shared").code == 0
    assert cli_in(home, "embedded", "stop").code == 0
    procs = [subprocess.Popen([sys.executable, "-m", "store.cli", "append", "shared"], cwd=home,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=subprocess_env())
             for _ in range(4)]
    errs = []
    for i, p in enumerate(procs):
        _, err = p.communicate(jsonl(msg(f"p{i}", None, "user", f"from {i}")), timeout=120)
        assert p.returncode == 0, err
        errs.append(err.decode())
    assert len(servers_of(store_dir)) == 1
    assert sum("started the embedded redis-server" in e for e in errs) == 1  # one started it, and said so
    EmbeddedRedis(store_dir / ".redis").stop()


def test_a_library_store_that_started_the_server_says_so_on_close(tmp_path: Path) -> None:
    directory = tmp_path / "sessions"
    script = (
        "import sys\n"
        "from store import SessionStore\n"
        f"store = SessionStore.from_url({directory.as_uri()!r})\n"
        "store.create_session(sys.argv[1])\n"
        "print('open', flush=True)\n"
        "store.close()\n"
    )
    embedded = EmbeddedRedis(directory / ".redis")
    try:
        first = subprocess.run([sys.executable, "-c", script, "a"], capture_output=True, text=True,
                               env=subprocess_env(), timeout=60)
        assert first.returncode == 0, first.stderr
        pid = embedded.pid()
        assert pid is not None
        assert f"started the embedded redis-server of {directory} (pid {pid}); it keeps running" in first.stderr
        assert "embedded stop" in first.stderr
        second = subprocess.run([sys.executable, "-c", script, "b"], capture_output=True, text=True,
                                env=subprocess_env(), timeout=60)
        assert second.returncode == 0 and second.stderr == "", second.stderr
    finally:
        embedded.stop()
    assert not embedded.held()


def test_a_reboot_empties_the_servers_state_and_nothing_else_does(tmp_path: Path) -> None:
    """The server's state survives a stop and a start in one boot of the machine (and a
    SIGKILL: the page cache keeps its append-only file), and is dropped at the first start
    after a reboot, simulated by a ``boot_id`` of another boot in its directory (what a
    directory written before a reboot holds). The store rebuilds from the objects: a
    session written before reads back whole, and appends go on after it."""
    directory = tmp_path / "sessions"
    embedded = EmbeddedRedis(directory / ".redis")
    store = SessionStore.from_url(directory.as_uri())
    try:
        sid = store.create_session(cwd="/r").session_id
        store.append_session_entries(sid, [msg("m1", None, "user", "one")])
        store.coord.client.set("marker", "kept")
        store.coord.client.execute_command("BGREWRITEAOF")  # a snapshot of it in the AOF, too
        _wait_aof(store)

        embedded.stop()
        embedded.ensure_running()
        assert store.coord.client.get("marker") == b"kept"  # same boot: kept

        pid = embedded.pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        _wait_gone(pid)
        embedded.ensure_running()
        assert store.coord.client.get("marker") == b"kept"  # killed, same boot: kept

        embedded.stop()
        (directory / ".redis" / "boot_id").write_text("00000000-another-boot\n")
        embedded.ensure_running()
        assert store.coord.client.get("marker") is None  # another boot's: dropped
        assert store.coord.tail(sid) is None
        assert [e["id"] for e in store.load_session_entries(sid)] == ["m1"]
        assert store.append_session_entries(sid, [msg("m2", "m1", "assistant", "two")]).seq == 2
        assert (directory / ".redis" / "boot_id").read_text().strip() == current_boot_id()
    finally:
        store.close()
        embedded.stop()


def _wait_aof(store: SessionStore) -> None:
    deadline = time.monotonic() + 10
    while store.coord.client.info("persistence")["aof_rewrite_in_progress"]:
        assert time.monotonic() < deadline, "AOF rewrite did not finish"
        time.sleep(0.05)


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while _state(pid) is not None:
        assert time.monotonic() < deadline, f"redis-server {pid} did not exit"
        time.sleep(0.05)


@pytest.mark.timeout(600)
def test_six_writer_processes_on_the_embedded_default_keep_every_promise(tmp_path: Path) -> None:
    """The embedded default as users run it (a local directory, no Redis URL: the file
    backend, group commit): six writer processes on three sessions, half
    of their appends expecting a tail, judged by the history checker (nothing acknowledged
    lost or doubled, conflicts truthful), and every session read back whole."""
    directory = tmp_path / "sessions"
    url = directory.as_uri()
    store = SessionStore.from_url(url, redis_prefix="mp")
    embedded = EmbeddedRedis(directory / ".redis")
    try:
        six_writers_keep_every_promise(store, url, None, "mp", tmp_path, 100)
    finally:
        store.close()
        embedded.stop()
