"""The embedded default maintains itself: a process that writes to a local store also
compacts and collects it (``store/lifecycle/maintenance.py``, ``compactor/maintenance.py``), with
nothing else started, and ``compact=False`` turns that off.

Through the real entry points: library scripts in child processes that open the store as the
README's quickstart does (``SessionStore.from_url(file://...)``, no Redis URL), then a check
of what they left in the directory, read through the object-store seam with every GET counted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Callable

import pytest
from test_cli import msg, subprocess_env

from compactor import Compactor, CompactorOptions, Worker, WorkerOptions
from coordination.redis import Coordinator
from store import InvalidInputError, SessionStore, StoreOptions
from store.backends.embedded import EmbeddedRedis
from store.backends.object_store import ObjectInfo, StoredObject
from store.backends.objects import ObjectStore, object_store_from_url

pytestmark = pytest.mark.timeout(300)

THREAD = "sessionstore-maintenance"


class CountingObjects(ObjectStore):
    """The real local object store, with its GETs recorded (a seam wrapper, not a mock)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__()
        self.inner = inner
        self.gets: list[str] = []

    def put_if_absent(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> None:
        self.inner.put_if_absent(key, data, metadata)

    def get(self, key: str) -> StoredObject:
        self.gets.append(key)
        return self.inner.get(key)

    def head(self, key: str) -> ObjectInfo | None:
        return self.inner.head(key)

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        return self.inner.list(prefix, start_after)

    def list_dirs(self, prefix: str) -> Iterator[str]:
        return self.inner.list_dirs(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def delete_if_unchanged(self, key: str, seen: StoredObject) -> bool:
        return self.inner.delete_if_unchanged(key, seen)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def directory(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "sessions"
    yield directory
    EmbeddedRedis(directory / ".redis").stop()


def inspect(directory: Path) -> tuple[SessionStore, CountingObjects]:
    """A store on what the scripts left, that never compacts (nothing changes under the
    check) and reads every segment from the objects (no recent-segments cache)."""
    objects = CountingObjects(object_store_from_url(directory.as_uri()))
    coord = Coordinator.from_url(EmbeddedRedis(directory / ".redis").ensure_running())
    return SessionStore(objects, coord, options=StoreOptions(compact=False, recent_cache_bytes=0)), objects


# A user's script: the README's quickstart, then appends. argv: directory, session id,
# count, "compact=False" or "".
WRITER = """
import sys, threading
from pathlib import Path
from store import SessionStore

directory, sid, count, extra = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
options = {"compact": False} if extra == "compact=False" else {}
store = SessionStore.from_url(Path(directory).absolute().as_uri(), **options)
if extra != "no-create":
    store.create_session(sid, cwd="/repo")
parent = None
for i in range(count):
    entry = {"type": "message", "id": f"e{i}", "parentId": parent, "timestamp": "2026-11-22T10:00:00.000Z",
             "message": {"role": "user", "content": "x" * 200, "timestamp": 1795341600000}}
    store.append_session_entries(sid, [entry])
    parent = entry["id"]
maintained = any(t.name == "sessionstore-maintenance" for t in threading.enumerate())
print("maintained" if maintained else "not maintained", flush=True)
store.close()
"""


def wait_for_manifest(store: SessionStore, sid: str, timeout: float = 60) -> None:
    inc = store.get_header(sid).incarnation
    deadline = time.monotonic() + timeout
    while store.manifests.latest(sid, inc) is None:
        assert time.monotonic() < deadline, f"{sid} was never compacted"
        time.sleep(0.1)


def run_script(script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          env=subprocess_env(), timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_the_compactor_is_the_registered_maintainer() -> None:
    """The store finds the compactor's worker through the entry point (pyproject.toml). If
    this fails, the installed package metadata predates it: ``pip install -e .``."""
    from compactor.maintenance import maintain
    from store.lifecycle.maintenance import find_maintainer

    assert find_maintainer() is maintain


@pytest.mark.long
def test_a_script_that_appends_2000_times_leaves_its_session_compacted(directory: Path) -> None:
    """The issue's case: 2,000 appends to one local session by a script that opens the store
    as the quickstart does and exits. It leaves a manifest and bases, and a resume reads a
    handful of objects (bases, and the segments of less than one threshold after them)
    instead of 2,000 segments."""
    proc = run_script(WRITER, str(directory), "long", "2000", "")
    assert proc.stdout.splitlines() == ["maintained"]
    # Only the embedded server's note on stderr: the maintenance logged no warning.
    assert "WARNING" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    store, objects = inspect(directory)
    try:
        inc = store.get_header("long").incarnation
        manifest = store.manifests.latest("long", inc)
        assert manifest is not None, "no manifest: the session was never compacted"
        threshold = store.options.compact_after_segments
        # The last job may still be queued at exit (taken by the next process): a few
        # thresholds at most behind, on a loaded machine.
        assert manifest.through_seq > 2000 - 4 * threshold
        assert 1 <= len(manifest.bases) <= 8  # runs of bases: log2(2000 / 64) + 2 at most
        objects.gets.clear()
        entries = store.load_session_entries("long")
        assert [e["id"] for e in entries] == [f"e{i}" for i in range(2000)]
        segments = [k for k in objects.gets if "/seg/" in k]
        bases = [k for k in objects.gets if "/base/" in k]
        assert len(bases) == len(manifest.bases)
        assert len(segments) <= 4 * threshold + 1, len(segments)  # the tail after the manifest
        assert len(objects.gets) < 4 * threshold + 12, objects.gets  # 2,002 uncompacted
        print(f"resume: {len(objects.gets)} GETs ({len(bases)} bases, {len(segments)} segments), "
              f"manifest through {manifest.through_seq}")
    finally:
        store.close()


def test_compact_false_leaves_the_store_to_a_worker_and_the_next_process_compacts_it(directory: Path) -> None:
    """``compact=False``: no maintenance thread, no manifest, the job queued for a worker.
    The next process that writes to the directory with the default takes that job: a job
    is never lost with the process that queued it."""
    proc = run_script(WRITER, str(directory), "quiet", "200", "compact=False")
    assert proc.stdout.splitlines() == ["not maintained"]
    store, _ = inspect(directory)
    try:
        inc = store.get_header("quiet").incarnation
        assert store.manifests.latest("quiet", inc) is None
        assert store.coord.client.xlen(store.coord.keys.jobs) == 1  # queued, nobody took it
    finally:
        store.close()

    opened = SessionStore.from_url(directory.as_uri())  # the default: maintains itself
    try:
        opened.create_session("other")
        opened.append_session_entries("other", [msg("o1", None, "user", "a write elsewhere")])
        wait_for_manifest(opened, "quiet")
        assert [e["id"] for e in opened.load_session_entries("quiet")] == [f"e{i}" for i in range(200)]
    finally:
        opened.close()


def test_two_processes_on_one_directory_both_compacting_lose_nothing(directory: Path) -> None:
    """Two writer processes at once, each maintaining the directory: the same jobs queue, one
    consumer group, the manifest create as the arbiter. Each writes a session of its own and
    both write a shared one; every acknowledged entry reads back once, in each writer's order,
    every session is compacted, by the two processes' own workers."""
    SessionStore.from_url(directory.as_uri(), compact=False).close()  # the server, started once
    shared = """
import os, sys
from pathlib import Path
from store import SessionStore, SessionExistsError

directory, me = sys.argv[1], sys.argv[2]
store = SessionStore.from_url(Path(directory).absolute().as_uri())
for sid in (me, "shared"):
    try:
        store.create_session(sid)
    except SessionExistsError:
        pass
print(os.getpid(), flush=True)
parents = {me: None, "shared": None}
for i in range(500):
    for sid in (me, "shared"):
        entry = {"type": "message", "id": f"{me}-{i}", "parentId": parents[sid], "timestamp": "2026-11-22T10:00:00.000Z",
                 "message": {"role": "user", "content": "y" * 200, "timestamp": 1795341600000}}
        store.append_session_entries(sid, [entry])
        parents[sid] = entry["id"]
store.close()
"""
    procs = [subprocess.Popen([sys.executable, "-c", shared, str(directory), name], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=subprocess_env()) for name in ("a", "b")]
    pids = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        pids.append(out.split()[0])
    store, _ = inspect(directory)
    try:
        workers: set[str] = set()
        for sid in ("a", "b", "shared"):
            entries = [e["id"] for e in store.load_session_entries(sid)]
            for me in ("a", "b"):
                mine = [e for e in entries if e.startswith(f"{me}-")]
                assert mine == ([f"{me}-{i}" for i in range(500)] if sid in (me, "shared") else [])
            assert len(entries) == len(set(entries))
            assert store.manifests.latest(sid, store.get_header(sid).incarnation) is not None, sid
            workers.update(record.worker for record in Compactor(store).history(sid))
        # Compacted by these processes' own workers (no other worker ran). Which of the two
        # takes a job is the consumer group's choice: on a loaded machine one of them can take
        # every job, so "both compacted some" would be a scheduling figure, not a guarantee.
        assert workers and all(any(f"-{pid}-" in w for pid in pids) for w in workers), (pids, workers)
    finally:
        store.close()


def test_close_stops_the_maintenance_at_once_and_leaves_the_group(directory: Path) -> None:
    """The first append starts the maintenance (a store only read starts nothing). Idle, it
    waits on the stop event, not in a blocked read: ``close()`` returns at once, the thread
    is gone, and its worker has left (no heartbeat)."""
    store = SessionStore.from_url(directory.as_uri())
    coord = Coordinator.from_url(EmbeddedRedis(directory / ".redis").ensure_running())
    try:
        assert store.options.compact is True
        store.create_session("c")
        store.list_sessions()
        assert not [t for t in threading.enumerate() if t.name == THREAD]
        store.append_session_entries("c", [msg("m1", None, "user", "hi")])
        (thread,) = [t for t in threading.enumerate() if t.name == THREAD]
        deadline = time.monotonic() + 30
        while not coord.client.hlen(coord.keys.workers):  # it heartbeats as a worker does
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(3)  # idle long enough for its wait to reach its longest
        started = time.monotonic()
        store.close()
        assert time.monotonic() - started < 1.0
        assert not thread.is_alive()
        assert coord.client.hlen(coord.keys.workers) == 0
    finally:
        store.close()
        coord.close()


def test_a_process_killed_while_compacting_loses_nothing_and_the_next_finishes(directory: Path) -> None:
    """The maintenance dies with its process in the middle of a compaction (its bases
    written, its manifest not): every acknowledged append reads back, and the next process
    that writes compacts the session."""
    killer = """
import os, signal, sys
from pathlib import Path
from store import SessionStore

def hook(point, ctx):
    if point == "compact.after_base":
        Path(sys.argv[2]).touch()  # a file, not stdout: a line of its own whatever the other thread writes
        os.kill(os.getpid(), signal.SIGKILL)

store = SessionStore.from_url(Path(sys.argv[1]).absolute().as_uri(), fault_hook=hook)
store.create_session("k")
parent = None
for i in range(1000):
    entry = {"type": "message", "id": f"e{i}", "parentId": parent, "timestamp": "2026-11-22T10:00:00.000Z",
             "message": {"role": "user", "content": "z", "timestamp": 1795341600000}}
    store.append_session_entries("k", [entry])
    sys.stdout.write(entry["id"] + "\\n")
    sys.stdout.flush()
    parent = entry["id"]
"""
    marker = directory.parent / "killed"
    proc = subprocess.run([sys.executable, "-c", killer, str(directory), str(marker)], capture_output=True,
                          text=True, env=subprocess_env(), timeout=240)
    assert proc.returncode == -9, proc.stderr
    assert marker.exists()  # killed by its maintenance, between its bases and its manifest
    acked = proc.stdout.split()
    assert len(acked) >= 64
    store, _ = inspect(directory)
    try:
        inc = store.get_header("k").incarnation
        assert store.manifests.latest("k", inc) is None  # it died before its manifest
        stored = [e["id"] for e in store.load_session_entries("k")]
        # Every acknowledged append; and perhaps the one in flight when the process died.
        assert stored[: len(acked)] == acked and len(stored) - len(acked) <= 1
    finally:
        store.close()

    store = SessionStore.from_url(directory.as_uri())  # the next process: maintains itself
    try:
        parent = stored[-1]
        for i in range(100):  # the dead worker's job was taken: these queue the next one
            store.append_session_entries("k", [msg(f"n{i}", parent, "user", "again")])
            parent = f"n{i}"
        wait_for_manifest(store, "k")
        ids = [e["id"] for e in store.load_session_entries("k")]
        assert ids == stored + [f"n{i}" for i in range(100)]
    finally:
        store.close()


def test_a_bad_compact_option_is_refused_and_starts_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "sessions"
    with pytest.raises(InvalidInputError, match="compact"):
        SessionStore.from_url(directory.as_uri(), compact="yes")
    assert not (directory / ".redis").exists()
    assert not [t for t in threading.enumerate() if t.name == THREAD]


def test_compact_true_maintains_any_store(make_store: Callable[..., SessionStore]) -> None:
    """The option is the store's, not the embedded default's alone: an S3 store and Redis
    built with ``compact=True`` compact themselves the same way."""
    store = make_store(compact=True, compact_after_segments=8)
    store.create_session("s3")
    parent = None
    for i in range(20):
        store.append_session_entries("s3", [msg(f"m{i}", parent, "user", "hi")])
        parent = f"m{i}"
    wait_for_manifest(store, "s3")
    assert [e["id"] for e in store.load_session_entries("s3")] == [f"m{i}" for i in range(20)]


def test_a_warm_stop_leaves_a_backlog_pending_after_one_compaction(
    make_store: Callable[..., SessionStore],
) -> None:
    """A job with more segments than one compaction merges runs several; a stop during it
    waits for the compaction in hand only (``close()`` must not wait for a whole backlog),
    and the job stays pending for the next worker instead of being acknowledged half done."""
    store = make_store(compact_after_segments=1000)
    store.create_session("backlog")
    parent = None
    for i in range(6):
        store.append_session_entries("backlog", [msg(f"m{i}", parent, "user", "hi")])
        parent = f"m{i}"
    assert store.coord.enqueue_compaction("backlog", reason="test")
    stop = threading.Event()

    def hook(point: str, ctx: dict[str, object]) -> None:
        if point == "compact.after_manifest":
            stop.set()  # close() arrives during the first of three compactions

    compactor = Compactor(store, CompactorOptions(max_segments=2), fault_hook=hook)
    worker = Worker(compactor, WorkerOptions(block_ms=10, idle_max_ms=100, gc_poll_ms=0, gc_interval_ms=0,
                                             retention_poll_ms=0), stop=stop)
    assert worker.run() == 0
    manifest = store.manifests.latest("backlog", store.get_header("backlog").incarnation)
    assert manifest is not None and manifest.generation == 1 and manifest.through_seq == 2
    assert worker.queue.pending() == 1  # not acknowledged: the next worker carries on
    assert [e["id"] for e in store.load_session_entries("backlog")] == [f"m{i}" for i in range(6)]


def test_a_script_that_never_closes_its_store_exits_and_its_maintenance_stops_warm(directory: Path) -> None:
    """No ``close()``: the interpreter still exits (the thread is a daemon), and at exit the
    maintenance is stopped as ``close()`` would (``atexit``): its worker leaves the group
    instead of being cut off, having compacted while the program ran."""
    script = """
import sys, time
from pathlib import Path
from store import SessionStore

store = SessionStore.from_url(Path(sys.argv[1]).absolute().as_uri())
store.create_session("open")
parent = None
for i in range(200):
    entry = {"type": "message", "id": f"e{i}", "parentId": parent, "timestamp": "2026-11-22T10:00:00.000Z",
             "message": {"role": "user", "content": "x", "timestamp": 1795341600000}}
    store.append_session_entries("open", [entry])
    parent = entry["id"]
time.sleep(3)  # the program does something else; then it ends without closing the store
"""
    run_script(script, str(directory), timeout=120)
    store, _ = inspect(directory)
    try:
        assert store.manifests.latest("open", store.get_header("open").incarnation) is not None
        assert store.coord.client.hlen(store.coord.keys.workers) == 0  # it left: stopped warm
        assert [e["id"] for e in store.load_session_entries("open")] == [f"e{i}" for i in range(200)]
    finally:
        store.close()
