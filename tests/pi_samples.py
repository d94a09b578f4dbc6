"""pi test data: the fixture corpus in ``tests/fixtures/pi`` and realistic generated content.

The corpus (see ``tests/fixtures/pi/README.md``) is one folder per scenario: the session file
pi wrote and what pi made of it. Files over 1 MB are stored gzipped (``*.gz``);
:func:`pi_fixtures` gives the corpus as plain files whatever is compressed, so tests simply
read ``pi_fixtures() / name / "session.jsonl"``.
"""

from __future__ import annotations

import atexit
import functools
import gzip
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The corpus as stored in the repository.
PI_FIXTURES_SOURCE = Path(__file__).resolve().parent / "fixtures" / "pi"


@functools.cache
def pi_fixtures() -> Path:
    """The pi fixture corpus as plain files (``$SESSIONSTORE_PI_FIXTURES`` names another one).

    Where the corpus holds gzipped files, this is a temporary copy of it (once per process,
    removed at exit) with those files expanded and every other file linked to the original.
    """
    source = Path(os.environ.get("SESSIONSTORE_PI_FIXTURES") or PI_FIXTURES_SOURCE)
    if not any(source.glob("*/*.gz")):
        return source
    target = Path(tempfile.mkdtemp(prefix="pi-fixtures-"))
    atexit.register(shutil.rmtree, target, ignore_errors=True)
    for path in sorted(source.rglob("*")):
        if path.is_dir():
            continue
        relative = path.relative_to(source)
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as packed, open(target / relative.with_suffix(""), "wb") as out:
                shutil.copyfileobj(packed, out)
        else:
            try:
                os.symlink(path, target / relative)
            except OSError:  # no symlinks here (Windows without the privilege): copy
                shutil.copyfile(path, target / relative)
    return target


def pi_scenarios(keep: Callable[[str], bool] | None = None) -> list[str]:
    """The names of the corpus's scenarios (those ``keep`` accepts), never an empty list.

    Raising here, at collection, turns a missing or emptied corpus into a failed run: a
    parametrized test given an empty list would only be skipped.
    """
    root = pi_fixtures()
    names = sorted(p.name for p in root.iterdir() if (p / "expected.json").is_file()) if root.is_dir() else []
    if keep is not None:
        names = [name for name in names if keep(name)]
    if not names:
        raise RuntimeError(f"no pi fixture scenario{' of that kind' if keep else ''} in {root}")
    return names


@functools.cache
def _expected_text(name: str) -> str:
    return (pi_fixtures() / name / "expected.json").read_text(encoding="utf-8")


def pi_expected(name: str) -> dict[str, Any]:
    """What pi made of scenario ``name`` (its ``expected.json``; a fresh copy each call)."""
    expected: dict[str, Any] = json.loads(_expected_text(name))
    return expected


WORDS = ["session", "agent", "tool", "result", "branch", "leaf", "pi", "store", "é", "λ", "\u2028"]


def conversation_message(rng: random.Random, n: int) -> dict[str, Any]:
    """The n-th message of a user/assistant exchange, 0.5 to 4 KB of text, pi's shapes."""
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(100, 600)))
    if n % 2:
        return {"role": "user", "content": text, "timestamp": 1740823200000 + n}
    return {
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "provider": "anthropic",
        "model": "claude",
        "stopReason": "stop",
        "usage": {"input": n, "output": 5, "cost": {"input": 0.0003, "total": 0.00105}},
        "timestamp": 1740823200000 + n,
    }


def message(eid: str, parent: str | None, text: str = "") -> dict[str, Any]:
    """A pi v3 user message entry, ``eid`` under ``parent``, at a fixed time."""
    return {"type": "message", "id": eid, "parentId": parent, "timestamp": "2026-11-22T10:00:00.000Z",
            "message": {"role": "user", "content": text or f"content of {eid}"}}


def append_chain(store: Any, sid: str, n: int, tag: str = "e", parent: str | None = None) -> list[str]:
    """``n`` appends of one message each to ``sid`` (ids ``tag`` + 0..n-1), each the child of
    the one before (the first of ``parent``); their ids."""
    ids = []
    for i in range(n):
        eid = f"{tag}{i}"
        store.append_session_entries(sid, [message(eid, parent)])
        ids.append(eid)
        parent = eid
    return ids
