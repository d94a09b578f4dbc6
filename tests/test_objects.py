"""One contract for every ObjectStore; each backend's test class subclasses it.

The S3 classes run against every S3 backend of the session over real HTTP
(moto's S3 server and SeaweedFS, or MinIO / AWS when SESSIONSTORE_TEST_S3_URL is set).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Mapping

import pytest

from store.errors import (
    ConditionalWritesUnsupportedError,
    InvalidInputError,
    InvalidKeyError,
    BackendRefusedError,
    ObjectExistsError,
    ObjectNotFoundError,
    UnsupportedFormatError,
)
from store.backends.objects import (
    FileObjectStore,
    MemoryObjectStore,
    ObjectStore,
    S3ObjectStore,
    StoredObject,
    object_store_from_url,
    parse_s3_url,
    s3_prefix_of,
)
from store.backends.testing import TRICKY, ObjectStoreContract, check_tricky_listing

from harness.pausing import InThread, Pause


class TestMemoryObjectStore(ObjectStoreContract):
    @pytest.fixture
    def objects(self) -> Iterator[ObjectStore]:
        yield MemoryObjectStore()


class TestFileObjectStore(ObjectStoreContract):
    @pytest.fixture
    def objects(self, tmp_path: Path) -> Iterator[ObjectStore]:
        yield FileObjectStore(tmp_path / "objects")

    def test_symlink_inside_tree_cannot_redirect_writes(self, tmp_path: Path) -> None:
        root = tmp_path / "objects"
        store = FileObjectStore(root)
        outside = tmp_path / "outside"
        outside.mkdir()
        (root / "sessions").mkdir()
        os.symlink(outside, root / "sessions" / "evil")
        with pytest.raises(InvalidInputError):
            store.put_if_absent("sessions/evil/header.json", b"x")
        assert list(outside.iterdir()) == []

    def test_file_symlink_is_refused(self, tmp_path: Path) -> None:
        root = tmp_path / "objects"
        store = FileObjectStore(root)
        target = tmp_path / "secret"
        target.write_text("secret")
        os.symlink(target, root / "link")
        with pytest.raises(InvalidInputError):
            store.get("link")

    def test_no_temporary_files_left_behind(self, tmp_path: Path) -> None:
        store = FileObjectStore(tmp_path / "objects")
        store.put_if_absent("a/b", b"1")
        with pytest.raises(ObjectExistsError):
            store.put_if_absent("a/b", b"2")
        assert list((tmp_path / "objects" / ".tmp").iterdir()) == []

    def test_racing_processes_have_one_winner(self, tmp_path: Path) -> None:
        import multiprocessing as mp

        root = tmp_path / "objects"
        FileObjectStore(root)
        ctx = mp.get_context("spawn")
        queue: "mp.Queue[str]" = ctx.Queue()
        procs = [ctx.Process(target=_race_file_put, args=(str(root), i, queue)) for i in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        results = sorted(queue.get(timeout=5) for _ in procs)
        assert sum(r.startswith("won") for r in results) == 1, results


class TestFileObjectStoreNamedTemporaries(ObjectStoreContract):
    """The same contract where the filesystem has no unnamed files (no ``O_TMPFILE``): the
    object is written to a named temporary file in ``.tmp/`` and linked from there."""

    @pytest.fixture
    def objects(self, tmp_path: Path) -> Iterator[ObjectStore]:
        store = FileObjectStore(tmp_path / "objects")
        store._unnamed = False
        yield store


def _files_below(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("key", ["../escape", "a/../../escape", "/etc/passwd", "a\x00b", "a/b\n", "a//b"])
def test_file_store_refuses_unsafe_keys_for_every_operation(tmp_path: Path, key: str) -> None:
    root = tmp_path / "objects"
    store = FileObjectStore(root)
    for op in (lambda: store.put_if_absent(key, b"x"), lambda: store.get(key),
               lambda: store.head(key), lambda: store.delete(key)):
        with pytest.raises(InvalidKeyError):
            op()
    assert _files_below(tmp_path) == []
    assert sorted(p.name for p in root.iterdir()) == [".tmp"]


# --- crash-atomicity of the create protocol: a fault point between its steps ----------------

_KEY = "sessions/s1/inc1/seg/000000000001.jsonl"
_BIG = bytes(range(256)) * (3 << 12)  # 3 MiB, several extents: a torn write would show


def _crash_at(root: str, point: str, unnamed: bool) -> None:
    """A process that dies (no cleanup, no flush: ``os._exit``) at ``point`` of a create."""

    def die(reached: str, ctx: dict[str, object]) -> None:
        if reached == point:
            os._exit(17)

    store = FileObjectStore(root, fault_hook=die)
    store._unnamed = unnamed
    store.put_if_absent(_KEY, _BIG, {"nonce": "crashed"})
    os._exit(0)  # the crash point was never reached


def _read_in_process(root: str, key: str, queue: "object") -> None:
    try:
        obj = FileObjectStore(root).get(key)
        queue.put((obj.data, dict(obj.metadata)))  # type: ignore[attr-defined]
    except ObjectNotFoundError:
        queue.put(None)  # type: ignore[attr-defined]


def _read_elsewhere(root: Path, key: str) -> tuple[bytes, dict[str, str]] | None:
    """What another process reads at ``key``."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_read_in_process, args=(str(root), key, queue))
    proc.start()
    try:
        return queue.get(timeout=60)  # type: ignore[no-any-return]
    finally:
        proc.join(30)


_CRASHES = [
    (unnamed, point) for unnamed in (True, False) for point in ("file.put.before_link", "file.put.linked")
]


@pytest.mark.parametrize(
    ("unnamed", "point"), _CRASHES,
    ids=[f"{'unnamed' if u else 'named-temporary'}-{p}" for u, p in _CRASHES],
)
def test_a_crash_between_the_steps_of_a_create_leaves_nothing_or_everything(
    tmp_path: Path, point: str, unnamed: bool
) -> None:
    root = tmp_path / "objects"
    FileObjectStore(root)
    proc = mp.get_context("spawn").Process(target=_crash_at, args=(str(root), point, unnamed))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 17, "the writer did not reach the fault point"
    store = FileObjectStore(root)
    if point == "file.put.before_link":
        # Written and synced, not linked: no object, and its name is free.
        with pytest.raises(ObjectNotFoundError):
            store.get(_KEY)
        assert store.head(_KEY) is None
        assert list(store.list("sessions/")) == []
        store.put_if_absent(_KEY, b"after", {"nonce": "next"})
        assert store.get(_KEY).data == b"after"
    else:
        # Linked: the whole object, to this process and to any other.
        obj = store.get(_KEY)
        assert obj.data == _BIG and obj.metadata == {"nonce": "crashed"}
        assert _read_elsewhere(root, _KEY) == (_BIG, {"nonce": "crashed"})
        with pytest.raises(ObjectExistsError):
            store.put_if_absent(_KEY, b"again", {"nonce": "next"})
    # At most a stray temporary file of the dead writer, only in .tmp/ (named mode).
    stray = [f for f in _files_below(root) if f != _KEY]
    assert all(f.startswith(".tmp/") for f in stray), stray
    assert stray == [] if unnamed else len(stray) <= 1


@pytest.mark.parametrize("unnamed", [True, False], ids=["unnamed", "named-temporary"])
def test_a_create_paused_before_its_link_survives_its_directory_being_removed(
    tmp_path: Path, unnamed: bool
) -> None:
    """The writer walked (created) the key's directory and wrote the object, then paused;
    meanwhile the session was deleted (its directories pruned) and written again by another
    process. Resumed, the create lands in the directory that exists now (never in the removed
    one), is seen whole by another process once acknowledged, and dates from its link, not
    from the write before the pause."""
    root = tmp_path / "objects"
    pause = Pause("file.put.before_link")
    writer = FileObjectStore(root, fault_hook=pause)
    writer._unnamed = unnamed
    other = FileObjectStore(root)
    sibling = "sessions/s1/inc1/seg/000000000002.jsonl"
    other.put_if_absent(sibling, b"s")

    put = InThread(lambda: writer.put_if_absent(_KEY, _BIG, {"nonce": "paused"}))
    pause.wait_paused()
    assert _read_elsewhere(root, _KEY) is None  # written, not yet an object
    os.utime(pause.seen[-1][1]["fd"], ns=(0, 0))  # its bytes look written long ago
    other.delete(sibling)  # the last object: the directories are pruned
    assert not (root / "sessions").exists()
    other.put_if_absent("sessions/s1/inc2/header.json", b"h")  # created again meanwhile
    before_ms = int(time.time() * 1000)
    pause.release()
    put.result()

    assert [p for p, _ in pause.seen].count("file.put.before_link") == 2  # walked again
    assert _read_elsewhere(root, _KEY) == (_BIG, {"nonce": "paused"})
    obj = other.get(_KEY)
    assert obj.data == _BIG
    assert obj.last_modified_ms is not None and obj.last_modified_ms >= before_ms - 1000
    assert sorted(i.key for i in other.list("sessions/")) == [_KEY, "sessions/s1/inc2/header.json"]


def test_a_create_into_a_directory_swapped_for_a_symlink_is_refused(tmp_path: Path) -> None:
    """A directory replaced by a symlink while a create is paused: the create walks again
    (the directory it opened is gone) and refuses the symlink; nothing lands outside."""
    root = tmp_path / "objects"
    outside = tmp_path / "outside"
    outside.mkdir()
    pause = Pause("file.put.before_link")
    writer = FileObjectStore(root, fault_hook=pause)
    put = InThread(lambda: writer.put_if_absent("s/d/k", b"x"))
    pause.wait_paused()
    shutil.rmtree(root / "s" / "d")
    os.symlink(outside, root / "s" / "d")
    pause.release()
    with pytest.raises(InvalidInputError):
        put.result()
    assert list(outside.iterdir()) == []


def _race_file_put(root: str, i: int, queue: "object") -> None:
    store = FileObjectStore(root)
    try:
        store.put_if_absent("race/key", str(i).encode())
        queue.put(f"won {i}")  # type: ignore[attr-defined]
    except ObjectExistsError:
        queue.put(f"lost {i}")  # type: ignore[attr-defined]


class S3Paging:
    """Listing in pages of a few keys: directories and objects across page boundaries."""

    @pytest.mark.parametrize("page", [1, 2, 3])
    def test_list_in_small_pages(self, objects: S3ObjectStore, prefix: str, page: int) -> None:
        for name in TRICKY:
            objects.put_if_absent(f"{prefix}{name}", name.encode())
        objects._page_size = page
        check_tricky_listing(objects, prefix)


@pytest.mark.empty_prefix
class TestS3ObjectStore(S3Paging, ObjectStoreContract):
    @pytest.fixture
    def objects(self, s3_url: str) -> Iterator[ObjectStore]:
        store = S3ObjectStore(parse_s3_url(s3_url))
        yield store
        store.close()

    @pytest.fixture
    def prefix(self, s3_url: str) -> str:
        return s3_prefix_of(s3_url)

    def test_listing_mode_follows_the_server(self, objects: S3ObjectStore, prefix: str, s3_backend: str) -> None:
        """SeaweedFS is listed directory by directory (see S3ObjectStore.list), others flat."""
        assert objects._tree_listing is None
        objects.put_if_absent(f"{prefix}k", b"1")
        assert [i.key for i in objects.list(prefix)] == [f"{prefix}k"]
        assert objects._tree_listing is (s3_backend == "seaweedfs")

    def test_missing_bucket_is_refused_not_created(self, s3_location: Any) -> None:
        from store.errors import BackendRefusedError

        missing = S3ObjectStore(parse_s3_url(
            f"s3://no-such-bucket-{uuid.uuid4().hex[:12]}/p?endpoint={s3_location.endpoint_url}&region={s3_location.region}"
        ))
        try:
            for attempt in (lambda: missing.put_if_absent("p/k", b"1"), lambda: missing.get("p/k"),
                            lambda: list(missing.list("p/")), lambda: list(missing.list_dirs("p/")),
                            lambda: missing.delete("p/k"), lambda: missing.delete_many(["p/k"])):
                with pytest.raises(BackendRefusedError, match="bucket does not exist"):
                    attempt()
            assert missing.head("p/k") is None  # HEAD has no body: S3 cannot say which is missing
        finally:
            missing.close()


@pytest.mark.empty_prefix
class TestS3TreeListing(S3Paging, ObjectStoreContract):
    """The directory-by-directory listing SeaweedFS needs, on every backend: it must read
    the same keys in the same order as S3's own listing (moto's is AWS's byte order)."""

    @pytest.fixture
    def objects(self, s3_url: str) -> Iterator[ObjectStore]:
        store = S3ObjectStore(replace(parse_s3_url(s3_url), listing="tree"))
        yield store
        store.close()

    @pytest.fixture
    def prefix(self, s3_url: str) -> str:
        return s3_prefix_of(s3_url)

    # Only the listing part of the contract: the rest does not depend on the listing mode.
    # Paging past 1,000 keys in this mode runs in TestS3ObjectStore[seaweedfs] already.
    for _name in list(vars(ObjectStoreContract)):
        if _name.startswith("test_") and ("list" not in _name or "thousand" in _name):
            locals()[_name] = None
    del _name


class LyingObjectStore(MemoryObjectStore):
    """A backend that ignores If-None-Match, as some emulators do."""

    def put_if_absent(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> None:
        try:
            super().put_if_absent(key, data, metadata)
        except ObjectExistsError:
            with self._lock:
                self._objects.pop(key)
            super().put_if_absent(key, data, metadata)


def test_probe_refuses_backend_that_ignores_conditional_writes() -> None:
    with pytest.raises(ConditionalWritesUnsupportedError):
        LyingObjectStore().probe_conditional_writes("_probe/")


class IgnoresDeleteConditions(MemoryObjectStore):
    """A backend that deletes whatever a conditional delete names (If-Match ignored)."""

    def delete_if_unchanged(self, key: str, seen: StoredObject) -> bool:
        with self._lock:
            return self._objects.pop(key, None) is not None


class NoConditionalDeletes(MemoryObjectStore):
    """A backend without conditional deletes at all (the seam's default)."""

    delete_if_unchanged = ObjectStore.delete_if_unchanged


@pytest.mark.parametrize("backend", [IgnoresDeleteConditions, NoConditionalDeletes])
def test_probe_refuses_backend_without_conditional_deletes(backend: type[MemoryObjectStore]) -> None:
    objects = backend()
    with pytest.raises(ConditionalWritesUnsupportedError, match="conditional delete"):
        objects.probe_conditional_writes("_probe/")
    with pytest.raises(ConditionalWritesUnsupportedError):
        objects.verify_conditional_writes("_v/")
    assert list(objects.list("_v/")) == []  # no verdict recorded


def test_a_verdict_of_the_earlier_probe_is_not_taken_for_this_one() -> None:
    """A store whose backend passed the probe before it checked conditional deletes is
    probed again (and refused if its backend ignores them)."""
    import hashlib

    objects = IgnoresDeleteConditions()
    old = hashlib.sha256(objects.identity.encode()).hexdigest()[:16]
    objects.put_if_absent(f"_v/verdict-{old}", b"passed\n")
    with pytest.raises(ConditionalWritesUnsupportedError):
        objects.verify_conditional_writes("_v/")
    fine = MemoryObjectStore()
    fine.verify_conditional_writes("_v/")
    assert len(list(fine.list("_v/"))) == 1
    requests = dict(fine.requests)
    fine.verify_conditional_writes("_v/")  # found: one HEAD, no probe
    assert fine.requests["head"] == requests["head"] + 1 and fine.requests["put"] == requests["put"]


def test_s3_url_parsing() -> None:
    cfg = parse_s3_url("s3://bkt/some/prefix?endpoint=http://localhost:9000&region=eu-west-1&sse=AES256")
    assert cfg.bucket == "bkt"
    assert cfg.prefix == "some/prefix"
    assert cfg.endpoint_url == "http://localhost:9000"
    assert cfg.region == "eu-west-1"
    assert cfg.sse == "AES256"
    assert s3_prefix_of("s3://bkt/some/prefix/") == "some/prefix/"
    with pytest.raises(InvalidInputError):
        parse_s3_url("http://bkt")


# --- the format a local directory records ----------------------------------------------------


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"(dir)" for p in sorted(root.rglob("*"))}


def test_a_new_local_directory_is_the_file_backend_and_says_so(tmp_path: Path) -> None:
    """A ``file://`` URL opens the file backend; a new directory records its format, and a
    second opening (another process) reads the same record."""
    root = tmp_path / "store"
    first = object_store_from_url(root.as_uri())
    assert type(first) is FileObjectStore
    assert (root / ".format").read_text() == "files\n"
    first.put_if_absent("sessions/s1/k", b"x")
    again = object_store_from_url(root.as_uri())
    assert type(again) is FileObjectStore and again.get("sessions/s1/k").data == b"x"
    assert sorted(p.name for p in root.iterdir()) == [".format", ".tmp", "sessions"]


def test_a_directory_of_the_former_log_backend_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    """A directory recorded as the log backend's (``log1``; any other format alike) is not
    read as a file store (its logs would read as no sessions at all): a typed error that
    names it, and nothing in the directory changes."""
    for held in ("log1", "something-else"):
        root = tmp_path / held
        (root / "sessions" / "s1").mkdir(parents=True)
        (root / ".format").write_text(f"{held}\n")
        (root / "sessions" / "s1" / ".log.00000001").write_bytes(b"a log's records")
        before = _tree(root)
        with pytest.raises(UnsupportedFormatError) as caught:
            object_store_from_url(root.as_uri())
        assert isinstance(caught.value, BackendRefusedError)
        assert caught.value.held == held and str(root) in str(caught.value)
        assert _tree(root) == before


def test_a_file_url_takes_no_options(tmp_path: Path) -> None:
    """``?format=`` chose between the two local backends; there is one now: any option is
    bad input, and nothing is made."""
    root = tmp_path / "store"
    for query in ("format=files", "format=log1", "fsync=0", "format="):
        with pytest.raises(InvalidInputError, match="unknown option"):
            object_store_from_url(f"{root.as_uri()}?{query}")
    assert not root.exists()
