"""A history checker: every operation a test's writers made, against what the store holds.

Each writer logs one record per append: the batch's ids, the expected tail if any, and the
outcome (``ok`` with the seq, ``conflict``, ``indeterminate``, or another error). The checker
then reads every session back and asserts the store's promises:

- every acknowledged batch is present exactly once, contiguous, as the segment it was
  acknowledged with;
- no entry of a refused batch is visible;
- a batch appended with an expected tail sits right after that entry;
- an indeterminate batch is present whole or not at all;
- segment numbers run 1..n without a gap, and each segment is exactly one batch.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

import orjson

from store import SessionStore
from store.errors import ConflictError, IndeterminateError, SessionStoreError


@dataclass
class Op:
    session: str
    ids: list[str]
    expected: str | None
    outcome: str  # ok, conflict, indeterminate, error:<Class>
    seq: int = 0
    actual_tail: str | None = None

    def to_json(self) -> bytes:
        return orjson.dumps(self.__dict__)

    @classmethod
    def from_json(cls, line: bytes) -> "Op":
        return cls(**orjson.loads(line))


def attempt(
    store: SessionStore, sid: str, batch: list[dict[str, Any]], expected: str | None
) -> Op:
    """Append one batch and record how it ended, in the form check_history reads."""
    op = Op(sid, [e["id"] for e in batch], expected, "ok")
    try:
        op.seq = store.append_session_entries(sid, batch, expected).seq
    except ConflictError as exc:
        op.outcome = "conflict"
        op.actual_tail = exc.actual_tail_entry_id
    except IndeterminateError:
        op.outcome = "indeterminate"
    except SessionStoreError as exc:
        op.outcome = f"error:{type(exc).__name__}:{exc}"
    return op


@dataclass
class Report:
    acknowledged: int = 0
    conflicts: int = 0
    indeterminate: int = 0
    errors: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def check_history(store: SessionStore, ops: Iterable[Op]) -> Report:
    report = Report()
    by_session: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        by_session[op.session].append(op)
    for sid, session_ops in by_session.items():
        data = store.read_session(sid)
        entries = data.entries
        ids = [e["id"] for e in entries]
        position: dict[str, int] = {}
        for i, eid in enumerate(ids):
            if eid in position:
                report.problems.append(f"{sid}: id {eid} appears twice")
            position[eid] = i
        seqs_by_id = dict(zip(ids, data.seqs))
        # Segments: contiguous, one batch each.
        header = data.header
        keys = list(store.iter_segment_keys(sid, header.incarnation))
        numbers = [int(k.rsplit("/", 1)[-1].split(".")[0]) for k in keys]
        if data.manifest is None and numbers != list(range(1, len(numbers) + 1)):
            report.problems.append(f"{sid}: segment numbers have a gap: {numbers[:20]}...")
        for op in session_ops:
            present = [eid in position for eid in op.ids]
            if op.outcome == "ok":
                report.acknowledged += 1
                if not all(present):
                    report.problems.append(f"{sid}: acknowledged batch {op.ids} lost")
                    continue
                start = position[op.ids[0]]
                if ids[start : start + len(op.ids)] != op.ids:
                    report.problems.append(f"{sid}: acknowledged batch {op.ids} not contiguous")
                if any(seqs_by_id[eid] != op.seq for eid in op.ids):
                    report.problems.append(f"{sid}: batch {op.ids} acknowledged as seq {op.seq}, stored elsewhere")
                if op.expected is not None:
                    before = ids[start - 1] if start > 0 else ""
                    if before != op.expected:
                        report.problems.append(
                            f"{sid}: batch {op.ids} expected tail {op.expected!r} but follows {before!r}"
                        )
            elif op.outcome == "indeterminate":
                report.indeterminate += 1
                if any(present) and not all(present):
                    report.problems.append(f"{sid}: indeterminate batch {op.ids} half visible")
            else:
                if op.outcome == "conflict":
                    report.conflicts += 1
                    if op.expected is None:
                        report.problems.append(f"{sid}: conflict without an expected tail: {op.ids}")
                else:
                    report.errors.append(op.outcome)
                if any(present):
                    report.problems.append(f"{sid}: refused batch {op.ids} ({op.outcome}) is visible")
        acked_ids = {eid for op in session_ops if op.outcome in ("ok", "indeterminate") for eid in op.ids}
        stray = [eid for eid in ids if eid not in acked_ids and not eid.startswith("seed")]
        if stray:
            report.problems.append(f"{sid}: entries nobody wrote: {stray[:5]}")
    return report


def load_ops(paths: Iterable[Any]) -> list[Op]:
    ops: list[Op] = []
    for path in paths:
        with open(path, "rb") as fh:
            ops.extend(Op.from_json(line) for line in fh if line.strip())
    return ops
