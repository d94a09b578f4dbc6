"""The ``ObjectStore`` contract, importable: a backend written outside this repository proves
itself by subclassing ``ObjectStoreContract`` in its own pytest suite (as zarr ships
``zarr.testing.store``) and providing two fixtures, ``objects`` (a fresh store) and
``prefix`` (a fresh key prefix)::

    import pytest
    from store.backends.testing import ObjectStoreContract

    class TestMyStore(ObjectStoreContract):
        @pytest.fixture
        def objects(self):
            yield MyStore(...)

Every backend of this repository is held to it in ``tests/test_objects.py``. Needs pytest.
"""

from __future__ import annotations

import threading
import time
from typing import Iterator

import pytest

from store.errors import (
    InvalidKeyError,
    ObjectExistsError,
    ObjectNotFoundError,
)
from store.backends.objects import ObjectStore

#: Names where directory order and byte order part: '-' and '.' sort below '/', so on AWS
#: ``a-x/h`` and ``a.y/h`` come before ``a/...``, while a store that keeps a directory tree and
#: lists it depth first (SeaweedFS) would put ``a/...`` first.
TRICKY = ["s/a/h", "s/a-x/h", "s/a.y/h", "s/a=z/h", "s/a_w/h", "s/a0/h", "s/A/h",
          "s/a/b/c", "s/a/b-c", "s/a/b.d", "s/a/bc", "s/a/b0/x", "s/a-x/h-1"]


def check_tricky_listing(objects: ObjectStore, prefix: str) -> None:
    """``list`` (with and without ``start_after``) and ``list_dirs`` over the TRICKY keys."""
    keys = sorted(f"{prefix}{n}" for n in TRICKY)
    assert [i.key for i in objects.list(f"{prefix}s/")] == keys
    assert [i.key for i in objects.list(f"{prefix}s/a")] == [k for k in keys if k.startswith(f"{prefix}s/a")]
    assert [i.key for i in objects.list(f"{prefix}s/a/b")] == [k for k in keys if k.startswith(f"{prefix}s/a/b")]
    for after in ["s/a", "s/a/", "s/a/b", "s/a/b-c", "s/a/b/", "s/a/bc", "s/a-x", "s/a-x/h",
                  "s/a.y/h", "s/a/h", "s/A/h", "s/a0", "s/", "s/zzz", "r"]:
        got = [i.key for i in objects.list(f"{prefix}s/", start_after=f"{prefix}{after}")]
        assert got == [k for k in keys if k > f"{prefix}{after}"], after
    assert sorted(objects.list_dirs(f"{prefix}s/")) == ["A", "a", "a-x", "a.y", "a0", "a=z", "a_w"]
    assert list(objects.list_dirs(f"{prefix}s/a/")) == ["b", "b0"]


class ObjectStoreContract:
    """Behaviour every backend must have. Subclasses provide the ``objects`` fixture and
    ``prefix`` (a fresh key prefix for the test)."""

    @pytest.fixture
    def objects(self) -> Iterator[ObjectStore]:  # pragma: no cover - overridden
        raise NotImplementedError

    @pytest.fixture
    def prefix(self) -> str:
        return ""

    def test_put_then_get_returns_bytes_and_metadata(self, objects: ObjectStore, prefix: str) -> None:
        key = f"{prefix}a/b/c.jsonl"
        objects.put_if_absent(key, b'{"x":1}\n', {"nonce": "n1", "sha256": "abc"})
        obj = objects.get(key)
        assert obj.data == b'{"x":1}\n'
        assert obj.metadata["nonce"] == "n1"
        assert obj.metadata["sha256"] == "abc"

    def test_second_create_is_refused_and_first_kept(self, objects: ObjectStore, prefix: str) -> None:
        key = f"{prefix}seg/0001.jsonl"
        objects.put_if_absent(key, b"first\n", {"nonce": "a"})
        with pytest.raises(ObjectExistsError):
            objects.put_if_absent(key, b"second\n", {"nonce": "b"})
        obj = objects.get(key)
        assert obj.data == b"first\n"
        assert obj.metadata["nonce"] == "a"

    def test_missing_object_is_not_found(self, objects: ObjectStore, prefix: str) -> None:
        with pytest.raises(ObjectNotFoundError):
            objects.get(f"{prefix}nope.json")
        assert objects.head(f"{prefix}nope.json") is None

    def test_head_gives_size_of_data(self, objects: ObjectStore, prefix: str) -> None:
        objects.put_if_absent(f"{prefix}h.bin", b"12345", {"nonce": "x"})
        info = objects.head(f"{prefix}h.bin")
        assert info is not None and info.size == 5

    def test_empty_object(self, objects: ObjectStore, prefix: str) -> None:
        objects.put_if_absent(f"{prefix}empty", b"")
        assert objects.get(f"{prefix}empty").data == b""

    def test_list_is_sorted_and_filtered_by_prefix(self, objects: ObjectStore, prefix: str) -> None:
        for name in ["b/2", "a/1", "b/1", "c", "bb/1"]:
            objects.put_if_absent(f"{prefix}{name}", name.encode())
        assert [i.key for i in objects.list(f"{prefix}b/")] == [f"{prefix}b/1", f"{prefix}b/2"]
        assert [i.key for i in objects.list(f"{prefix}b")] == [
            f"{prefix}b/1",
            f"{prefix}b/2",
            f"{prefix}bb/1",
        ]
        assert [i.key for i in objects.list(f"{prefix}b/", start_after=f"{prefix}b/1")] == [f"{prefix}b/2"]

    def test_list_dirs(self, objects: ObjectStore, prefix: str) -> None:
        for name in ["s/x/header.json", "s/x/i/seg/1", "s/y/header.json", "s/z1/q"]:
            objects.put_if_absent(f"{prefix}{name}", b"1")
        assert list(objects.list_dirs(f"{prefix}s/")) == ["x", "y", "z1"]
        assert list(objects.list_dirs(f"{prefix}nothing/")) == []

    def test_list_is_in_byte_order_across_directories(self, objects: ObjectStore, prefix: str) -> None:
        for name in TRICKY:
            objects.put_if_absent(f"{prefix}{name}", name.encode())
        check_tricky_listing(objects, prefix)

    def test_list_dirs_leaves_out_a_directory_whose_objects_are_gone(self, objects: ObjectStore, prefix: str) -> None:
        for name in ["s/x/1", "s/x/sub/2", "s/y/1", "s/z/1"]:
            objects.put_if_absent(f"{prefix}{name}", b"1")
        objects.delete(f"{prefix}s/x/1")
        objects.delete_many([f"{prefix}s/x/sub/2", f"{prefix}s/z/1"])
        assert list(objects.list_dirs(f"{prefix}s/")) == ["y"]
        assert [i.key for i in objects.list(f"{prefix}s/")] == [f"{prefix}s/y/1"]
        # The names are free again (delete_session relies on it).
        objects.put_if_absent(f"{prefix}s/x/1", b"2")
        assert list(objects.list_dirs(f"{prefix}s/")) == ["x", "y"]

    def test_list_pages_past_one_thousand_keys(self, objects: ObjectStore, prefix: str) -> None:
        keys = [f"{prefix}many/{i:06d}" for i in range(1105)]

        def put(chunk: list[str]) -> None:
            for k in chunk:
                objects.put_if_absent(k, b"")

        threads = [threading.Thread(target=put, args=(keys[i::8],)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        listed = [i.key for i in objects.list(f"{prefix}many/")]
        assert listed == keys
        assert [i.key for i in objects.list(f"{prefix}many/", start_after=keys[1000])] == keys[1001:]

    def test_delete_is_idempotent(self, objects: ObjectStore, prefix: str) -> None:
        objects.put_if_absent(f"{prefix}d", b"1")
        objects.delete(f"{prefix}d")
        objects.delete(f"{prefix}d")
        assert objects.head(f"{prefix}d") is None
        # Deleted means the name can be created again (delete_session relies on it).
        objects.put_if_absent(f"{prefix}d", b"2")
        assert objects.get(f"{prefix}d").data == b"2"

    def test_delete_many(self, objects: ObjectStore, prefix: str) -> None:
        keys = [f"{prefix}dm/{i}" for i in range(5)]
        for k in keys:
            objects.put_if_absent(k, b"1")
        objects.delete_many(keys[:3] + [f"{prefix}dm/absent"])
        assert [i.key for i in objects.list(f"{prefix}dm/")] == keys[3:]

    def test_delete_if_unchanged_deletes_only_the_object_it_saw(self, objects: ObjectStore, prefix: str) -> None:
        """The header's delete: a name deleted and created again after the read (by another
        process, while this one paused) keeps the new object, and so does a resend of a
        delete that had landed."""
        key = f"{prefix}cd/header"
        objects.put_if_absent(key, b"life 1", {"nonce": "1"})
        first = objects.get(key)
        objects.delete(key)
        objects.put_if_absent(key, b"life 2", {"nonce": "2"})
        assert objects.delete_if_unchanged(key, first) is False
        assert objects.get(key).data == b"life 2"
        second = objects.get(key)
        assert objects.delete_if_unchanged(key, second) is True
        assert objects.head(key) is None
        # A resend of the delete that landed, after the name was taken again: refused.
        objects.put_if_absent(key, b"life 3", {"nonce": "3"})
        assert objects.delete_if_unchanged(key, second) is False
        assert objects.get(key).data == b"life 3"
        # Absent: nothing to do, no error.
        assert objects.delete_if_unchanged(f"{prefix}cd/absent", second) is False

    def test_delete_if_unchanged_racing_creates(self, objects: ObjectStore, prefix: str) -> None:
        """Deleters of the one object they read race with creators of the name's next object:
        only the object the deleters saw goes, once, and the creator that won keeps its own."""
        for round_no in range(4):
            _race_deletes_and_creates(objects, f"{prefix}cdr/{round_no}")

    def test_racing_creates_have_exactly_one_winner(self, objects: ObjectStore, prefix: str) -> None:
        for round_no in range(5):
            key = f"{prefix}race/{round_no}"
            winners: list[int] = []
            losers: list[int] = []
            barrier = threading.Barrier(8)

            def attempt(i: int) -> None:
                barrier.wait()
                try:
                    objects.put_if_absent(key, f"{i}".encode(), {"nonce": str(i)})
                    winners.append(i)
                except ObjectExistsError:
                    losers.append(i)

            threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(winners) == 1, winners
            assert len(losers) == 7
            assert objects.get(key).data == str(winners[0]).encode()

    def test_probe_accepts_backend(self, objects: ObjectStore, prefix: str) -> None:
        objects.probe_conditional_writes(f"{prefix}_probe/")
        assert list(objects.list(f"{prefix}_probe/")) == []

    @pytest.mark.parametrize("key", [
        "../x", "a/../b", "a/..", "..", "/abs", "a//b", "", "a/", ".", "a/./b", "a/.hidden",
        "a/b c", "a\\b", "a\x00b", "a\n", "a/b\n", "a\nb", "x" * 256, "/".join(["abc"] * 300),
    ])
    def test_unsafe_keys_are_refused(self, objects: ObjectStore, prefix: str, key: str) -> None:
        """A key outside the syntax is a typed error (``InvalidKeyError``, an
        ``InvalidInputError``), and nothing is written."""
        with pytest.raises(InvalidKeyError):
            objects.put_if_absent(prefix + key if key and not key.startswith("/") else key, b"x")
        assert list(objects.list(prefix)) == []

    def test_request_counter(self, objects: ObjectStore, prefix: str) -> None:
        before = objects.requests["get"]
        objects.put_if_absent(f"{prefix}cnt", b"1")
        objects.get(f"{prefix}cnt")
        objects.get(f"{prefix}cnt")
        assert objects.requests["get"] - before == 2

    def test_flush_keeps_objects_and_changes_nothing(self, objects: ObjectStore, prefix: str) -> None:
        """``flush`` of an object, of a missing key and of a key whose directory does not
        exist changes nothing anyone reads; a bad key is refused before anything is done."""
        objects.put_if_absent(f"{prefix}fl/a", b"kept", {"nonce": "k"})
        objects.flush(f"{prefix}fl/a")
        objects.flush(f"{prefix}fl/missing")
        objects.flush(f"{prefix}nowhere/at/all")
        obj = objects.get(f"{prefix}fl/a")
        assert (obj.data, obj.metadata["nonce"]) == (b"kept", "k")
        assert [i.key for i in objects.list(f"{prefix}fl/")] == [f"{prefix}fl/a"]
        with pytest.raises(ObjectExistsError):
            objects.put_if_absent(f"{prefix}fl/a", b"other")
        with pytest.raises(InvalidKeyError):
            objects.flush("../outside")


__all__ = ["TRICKY", "ObjectStoreContract", "check_tricky_listing"]


def _race_deletes_and_creates(objects: ObjectStore, key: str) -> None:
    objects.put_if_absent(key, b"old")
    seen = objects.get(key)
    barrier = threading.Barrier(6)
    created: list[int] = []
    deleted: list[bool] = []

    def delete() -> None:
        barrier.wait()
        deleted.append(objects.delete_if_unchanged(key, seen))

    def create(i: int) -> None:
        barrier.wait()
        while True:  # until a create lands, or every deleter has answered and one more try
            answered = len(deleted) == 3
            try:
                objects.put_if_absent(key, f"new {i}".encode())
                created.append(i)
                return
            except ObjectExistsError:
                if answered:
                    return
                time.sleep(0.001)

    threads = [threading.Thread(target=delete) for _ in range(3)]
    threads += [threading.Thread(target=create, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Exactly one deleter removed "old"; none removed a new object, so the creator that won
    # keeps its object.
    assert deleted.count(True) == 1, deleted
    assert len(created) == 1, created
    assert objects.get(key).data == f"new {created[0]}".encode()
