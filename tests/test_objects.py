"""One contract for every ObjectStore; each backend's test class subclasses it.

The S3 classes run against every S3 backend of the session over real HTTP (moto's
ThreadedMotoServer and SeaweedFS, or MinIO / AWS when SESSIONSTORE_TEST_S3_URL is set).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Mapping

import pytest

from store.errors import (
    ConditionalWritesUnsupportedError,
    InvalidInputError,
    ObjectExistsError,
)
from store.objects import (
    FileObjectStore,
    MemoryObjectStore,
    ObjectStore,
    S3ObjectStore,
    parse_s3_url,
    s3_prefix_of,
)
from store.testing import TRICKY, ObjectStoreContract, check_tricky_listing


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
