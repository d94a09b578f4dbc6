"""The demo's verification: everything the workers were told, against what the store holds.

The history (one record per append, from every worker's ``RecordingStore`` log) is checked as
``tests/history.py`` does:

- every acknowledged append is present exactly once, contiguous, in the segment it was
  acknowledged as;
- no entry of a refused (conflicting) append is visible;
- an append made with an expected tail sits right after that entry;
- an indeterminate append is visible whole or not at all;
- no entry is there that nobody wrote;

plus ``verify`` over every session (segments without gaps, objects that parse, manifests and
bases consistent, parents present, Redis not ahead), forks (each reads as its source's path
to the fork point, then its own entries; its export holds the same), every session's export
imported again (accepted, and nothing changes), and the redaction (the
secret is in no load, context or export, and after the final compaction in no object).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from store.cli.verify import verify_store
from store.errors import SessionStoreError
from store.model.context import branch_path

if TYPE_CHECKING:
    from store.core import SessionStore


@dataclass
class Verification:
    #: name -> passed; every check that ran.
    checks: dict[str, bool] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    acknowledged: int = 0
    conflicts: int = 0
    indeterminate: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems and all(self.checks.values())

    def add(self, name: str, problems: list[str]) -> None:
        self.checks[name] = not problems
        self.problems.extend(f"{name}: {p}" for p in problems)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": self.checks, "problems": self.problems,
                "acknowledged_appends": self.acknowledged, "conflicts": self.conflicts,
                "indeterminate": self.indeterminate}


def load_ops(paths: Iterable[Path]) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    for path in paths:
        if path.exists():
            with open(path, "rb") as fh:
                ops.extend(orjson.loads(line) for line in fh if line.strip())
    return ops


def check_history(store: SessionStore, ops: list[dict[str, Any]], result: Verification) -> None:
    problems: list[str] = []
    by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for op in ops:
        by_session[op["session"]].append(op)
    for sid, session_ops in sorted(by_session.items()):
        try:
            data = store.read_session(sid)
        except SessionStoreError as exc:
            problems.append(f"{sid}: unreadable: {exc}")
            continue
        inherited = [str(e["id"]) for e in data.inherited]
        own = [str(e["id"]) for e in data.entries]
        ids = inherited + own
        position: dict[str, int] = {}
        for i, eid in enumerate(ids):
            if eid in position:
                problems.append(f"{sid}: entry {eid} appears twice")
            position[eid] = i
        seq_of = dict(zip(own, data.seqs, strict=True))
        for op in session_ops:
            present = [eid in position for eid in op["ids"]]
            outcome = op["outcome"]
            if outcome == "ok":
                result.acknowledged += 1
                if not all(present):
                    problems.append(f"{sid}: acknowledged append {op['ids']} is lost")
                    continue
                start = position[op["ids"][0]]
                if ids[start : start + len(op["ids"])] != op["ids"]:
                    problems.append(f"{sid}: acknowledged append {op['ids']} is not contiguous")
                if any(seq_of.get(eid) != op["seq"] for eid in op["ids"]):
                    problems.append(f"{sid}: append {op['ids']} acknowledged as segment {op['seq']}, stored elsewhere")
                if op.get("expected") is not None:
                    before = ids[start - 1] if start > 0 else ""
                    if before != op["expected"]:
                        problems.append(f"{sid}: append {op['ids']} expected tail {op['expected']!r} but follows {before!r}")
            elif outcome == "indeterminate":
                result.indeterminate += 1
                if any(present) and not all(present):
                    problems.append(f"{sid}: indeterminate append {op['ids']} is half visible")
            else:
                if outcome == "conflict":
                    result.conflicts += 1
                    if op.get("expected") is None:
                        problems.append(f"{sid}: conflict without an expected tail: {op['ids']}")
                else:
                    problems.append(f"{sid}: append {op['ids']} failed: {outcome}")
                if any(present):
                    problems.append(f"{sid}: refused append {op['ids']} ({outcome}) is visible")
        written = {eid for op in session_ops if op["outcome"] in ("ok", "indeterminate") for eid in op["ids"]}
        stray = [eid for eid in own if eid not in written]
        if stray:
            problems.append(f"{sid}: entries nobody wrote: {stray[:5]}")
    result.add("history", problems)


def check_store(store: SessionStore, result: Verification) -> None:
    problems: list[str] = []
    for c in verify_store(store):
        problems.extend(f"{c.session_id}: {f}" for f in c.faults)
        # The demo writes only through append: even a warning (an orphan entry) is a fault.
        problems.extend(f"{c.session_id}: {w}" for w in c.warnings)
    result.add("verify", problems)


def check_forks(store: SessionStore, forks: list[dict[str, Any]], result: Verification) -> None:
    from store.pi.scan import read_pi_file

    problems: list[str] = []
    for fork in forks:
        sid, source, point = fork["session"], fork["source"], fork["entry"]
        try:
            src = store.read_session(source)
            mine = store.read_session(sid)
            by_id = {str(e["id"]): e for e in src.all_entries}
            want = [str(e["id"]) for e in branch_path(by_id, point)]
            got = [str(e["id"]) for e in mine.inherited]
            if not want or got != want:
                problems.append(f"{sid}: inherits {len(got)} entries, the source's path to {point} has {len(want)}")
            if mine.header.fork is None or mine.header.fork.session_id != source:
                problems.append(f"{sid}: its header does not name {source} as its source")
            exported = read_pi_file(store.export_pi_session(sid).encode())
            if [e["id"] for e in exported.entries] != got + [str(e["id"]) for e in mine.entries]:
                problems.append(f"{sid}: the export does not hold the inherited path and the fork's own entries")
        except SessionStoreError as exc:
            problems.append(f"{sid}: {type(exc).__name__}: {exc}")
    result.add("forks", problems)


def check_round_trip(store: SessionStore, sessions: list[str], result: Verification) -> None:
    """Each session exported, then imported again: the same session (the README's "pi files
    import and export losslessly"), so the import is accepted and changes nothing."""
    from store.pi_import import import_pi_file

    problems: list[str] = []
    for sid in sessions:
        try:
            tail = store.get_tail(sid)
            text = store.export_pi_session(sid)
            imported = import_pi_file(store, text)
            if (imported.session_id, imported.status, imported.appended) != (sid, "unchanged", 0):
                problems.append(f"{sid}: importing its export was {imported.status} into "
                                f"{imported.session_id} ({imported.appended} appended)")
            if store.get_tail(sid) != tail or store.export_pi_session(sid) != text:
                problems.append(f"{sid}: importing its export changed it")
        except SessionStoreError as exc:
            problems.append(f"{sid}: {type(exc).__name__}: {exc}")
    result.add("roundtrip", problems)


def check_redaction(
    store: SessionStore, secret: str, sessions: list[str], redacted_session: str | None,
    result: Verification, *, purged: bool,
) -> None:
    """The secret is in nothing a reader gets; after compaction (``purged``), in no object."""
    problems: list[str] = []
    if redacted_session is None:
        problems.append("the redaction never happened")
    for sid in sessions:
        try:
            session = store.load_session(sid)
            if secret in orjson.dumps(list(session.entries)).decode():
                problems.append(f"{sid}: load_session shows the redacted text")
            leaves = [e["id"] for e in session.entries if not session.get_children(e["id"])]
            for leaf in leaves:
                if secret in orjson.dumps(session.build_context(leaf)).decode():
                    problems.append(f"{sid}: the context at {leaf} holds the redacted text")
            if secret in store.export_pi_session(sid):
                problems.append(f"{sid}: the export holds the redacted text")
        except SessionStoreError as exc:
            problems.append(f"{sid}: {type(exc).__name__}: {exc}")
    if purged and redacted_session is not None:
        if secret in orjson.dumps(store.load_session_entries(redacted_session)).decode():
            problems.append(f"{redacted_session}: the raw entries still hold the redacted text after compaction")
        prefix = store.layout.session_prefix(redacted_session)
        for info in store.objects.list(prefix):
            if secret.encode() in store.objects.get(info.key).data:
                problems.append(f"{info.key} still holds the redacted text after compaction and GC")
    result.add("redaction", problems)
