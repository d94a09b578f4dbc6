"""The log backend (``store/log_objects.py``): the object-store contract, and what only a log
has: records cut short, torn ends, seals, rewrites and removals, across threads, processes
and pauses."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from store.log_objects import LogObjectStore
from store.object_store import ObjectStore
from store.testing import ObjectStoreContract


class TestLogObjectStore(ObjectStoreContract):
    @pytest.fixture
    def objects(self, tmp_path: Path) -> Iterator[ObjectStore]:
        store = LogObjectStore(tmp_path / "objects")
        yield store
        store.close()


class TestLogObjectStoreRewritingAlways(ObjectStoreContract):
    """The contract with every delete rewriting its log (no size threshold): each contract
    test then also runs through seals, successors and removals."""

    @pytest.fixture
    def objects(self, tmp_path: Path) -> Iterator[ObjectStore]:
        store = LogObjectStore(tmp_path / "objects", rewrite_min=0)
        yield store
        store.close()


class TestLogObjectStoreNamedTemporaries(ObjectStoreContract):
    """Where the filesystem has no ``O_TMPFILE``: new logs are written to a named temporary
    file beside them and linked from there."""

    @pytest.fixture
    def objects(self, tmp_path: Path) -> Iterator[ObjectStore]:
        store = LogObjectStore(tmp_path / "objects", rewrite_min=0)
        store._unnamed = False
        yield store
        store.close()
