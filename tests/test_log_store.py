"""The store's own suites again, on the log backend (the embedded default's object store) with
the real Redis server of the session: every test of the modules below whose fixtures are the
store's (``make_store``, ``store``, ``s3_url``), not a particular S3 server's. ``s3_url`` is
overridden here with a fresh local directory, which a new store opens as a log store."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable

import pytest
import test_compactor
import test_multiprocess
import test_pauses
import test_store
from _pytest.fixtures import FixtureFunctionDefinition

from store import SessionStore
from store.log_objects import LogObjectStore
from store.objects import object_store_from_url

#: Fixtures that name an S3 server, its bucket or faults injected into it: such tests stay in
#: their own module, run against every S3 backend.
_S3_ONLY = {"s3_location", "s3_server", "s3_proxy", "moto_server", "seaweed_server", "s3_backend",
            "seaweed_bucket", "s3_client", "blackhole"}

#: Tests whose premise is an S3 round trip's cost, with why.
_NOT_HERE = {
    "test_rebuild_paused_past_a_compaction_is_refused":
        "every round of the rebuild must take longer than 1 ms; from a local log the second does not",
}

_borrowed = 0
for _module in (test_store, test_pauses, test_compactor, test_multiprocess):
    for _name, _obj in vars(_module).items():
        if isinstance(_obj, FixtureFunctionDefinition) and _name not in ("s3_url", "make_store"):
            globals().setdefault(_name, _obj)  # the module's own fixtures (a clock, ...)
        elif _name.startswith("test_") and inspect.isfunction(_obj) and _obj.__module__ == _module.__name__:
            if _name not in _NOT_HERE and not _S3_ONLY & set(inspect.signature(_obj).parameters):
                globals()[f"{_name}__{_module.__name__}"] = _obj
                _borrowed += 1


@pytest.fixture
def s3_url(tmp_path: Path) -> str:
    """The objects URL of the store under test: a new local directory (the log backend)."""
    return (tmp_path / "objects").as_uri()


@pytest.fixture(params=[False, True], ids=["commit-after-flush", "commit-during-flush"])
def make_store(
    request: pytest.FixtureRequest, make_store: Callable[..., SessionStore]
) -> Callable[..., SessionStore]:
    """The borrowed tests' ``make_store(**options)``, each test run twice: COMMIT sent after
    the segment's flush (any Redis but the embedded default's) and during it (the embedded
    default's: docs/design.md, "Committing during the flush")."""

    def make(**options: Any) -> SessionStore:
        options.setdefault("commit_during_flush", request.param)
        return make_store(**options)

    return make


def test_the_borrowed_suites_are_here_and_on_the_log_backend(s3_url: str) -> None:
    assert _borrowed >= 40, _borrowed
    assert isinstance(object_store_from_url(s3_url), LogObjectStore)
