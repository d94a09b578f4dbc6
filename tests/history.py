"""A history checker: every operation a test's writers made, against what the store holds.

Each writer logs one record per append: the batch's ids, the expected tail if any, and the
outcome (``ok`` with the seq, ``conflict``, ``indeterminate``, or another error). The checker
then reads every session back and asserts the store's promises:

- every acknowledged batch is present exactly once, contiguous, as the segment it was
  acknowledged with;
- no entry of a refused batch is visible;
- a batch appended with an expected tail sits right after that entry;
- an indeterminate batch is present whole or not at all;
- segment numbers run 1..n without a gap, and each batch lies whole in the segment it was
  acknowledged with (group commit puts several batches in one segment).
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
    except SessionStoreError as exc:
        judge(op, exc)
    return op


async def attempt_async(store: Any, sid: str, batch: list[dict[str, Any]], expected: str | None) -> Op:
    """``attempt`` through an ``AsyncSessionStore``."""
    op = Op(sid, [e["id"] for e in batch], expected, "ok")
    try:
        op.seq = (await store.append_session_entries(sid, batch, expected)).seq
    except SessionStoreError as exc:
        judge(op, exc)
    return op


def judge(op: Op, exc: SessionStoreError) -> None:
    """Record a refused or unknown outcome on ``op``."""
    if isinstance(exc, ConflictError):
        op.outcome = "conflict"
        op.actual_tail = exc.actual_tail_entry_id
    elif isinstance(exc, IndeterminateError):
        op.outcome = "indeterminate"
    else:
        op.outcome = f"error:{type(exc).__name__}:{exc}"


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
        # Segments: numbered without a gap.
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


# --- Timed histories: the nemesis soak (tests/soak) -------------------------------------------
#
# A soak's writers log every attempt of every batch with the time it began and ended
# (time.monotonic(), one clock for every process on a Linux machine):
#
#   {"ev": "invoke", "op", "proc", "session", "ids", "expected", "attempt", "t"}
#   {"ev": "ok", "op", "seq", "t"} | {"ev": "fail", "op", "error", "actual", "t"}
#   {"ev": "indeterminate", "op", "error", "t"}    (the writer re-sends the same batch)
#
# and its readers every read: {"proc", "session", "t0", "t1", "ids" | "error"}. The checker
# below judges every operation against a final read of every session, and every read against
# the operations, the final read and the other reads.

#: What breaks a promise of the store. Operations against the final read:
OP_VIOLATIONS = {
    "lost": "acknowledged batch missing from the final read",
    "duplicated": "an id twice in a read",
    "refused-visible": "a batch the store refused is visible",
    "stale-tail-accepted": "acknowledged with an expected tail, but it does not follow that entry",
    "torn": "a batch partly visible, or not contiguous",
    "misplaced": "acknowledged as segment n, stored in another",
    "phantom": "an entry no writer ever sent",
    "unknown-parent": "UnknownParentError for a parent the store had acknowledged or named as the tail",
    "id-collision": "IdCollisionError for a re-sent batch or unique ids",
    "conflict-without-expected": "ConflictError for an append without an expected tail",
    "write-failed": "an append failed with a corruption or a missing session",
    "foreign-exception": "an exception outside the store's error tree",
    "final-read-failed": "the final read of a session failed",
    "gc-changed-read": "a GC pass after the run changed what a reader sees",
}
#: Reads against the operations, the final read and each other:
READ_VIOLATIONS = {
    "read-missing-acked": "a read that began after an append's acknowledgement lacks it",
    "read-not-prefix": "a read that is not a prefix of the final read (order, or an entry that vanished)",
    "read-vanished": "a read lacks an entry that a read which ended before it began had seen",
    "read-refused-visible": "a read shows a batch the store refused",
    "read-torn": "a read shows part of a batch",
    "read-failed": "a read failed with a corruption or a missing session",
}
VIOLATION_KINDS = tuple(OP_VIOLATIONS) + tuple(READ_VIOLATIONS)

#: Errors that only mean "a backend was unreachable": allowed under faults.
TRANSIENT_ERRORS = ("BackendUnavailableError", "IndeterminateError")


@dataclass
class TimedOp:
    op: str
    proc: str
    session: str
    ids: list[str]
    expected: str | None
    t_invoke: float
    attempts: int = 0
    #: ok, fail (refused: a definite answer) or indeterminate (never resolved: the writer was
    #: killed, or the run ended first).
    outcome: str = "indeterminate"
    error: str | None = None
    actual: str | None = None
    seq: int = 0
    t_done: float | None = None
    #: Attempts that ended with an unknown outcome before the last one.
    unknown_attempts: int = 0
    errors: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    #: Protocol points the writer stopped itself at during this operation.
    pauses: list[str] = field(default_factory=list)


@dataclass
class TimedRead:
    proc: str
    session: str
    t0: float
    t1: float
    ids: list[str] | None
    error: str | None = None
    foreign: bool = False


def _jsonl(path: Any) -> Iterable[dict[str, Any]]:
    with open(path, "rb") as fh:
        for line in fh:
            if line.endswith(b"\n") and line.strip():  # a line cut by SIGKILL is skipped
                yield orjson.loads(line)


def load_timed_ops(paths: Iterable[Any]) -> tuple[list[TimedOp], list[dict[str, Any]]]:
    """The operations of writer logs, and the other events (start, stop, pause) as read."""
    ops: dict[str, TimedOp] = {}
    other: list[dict[str, Any]] = []
    for path in paths:
        for ev in _jsonl(path):
            kind = ev.get("ev")
            if kind == "invoke":
                op = ops.get(ev["op"])
                if op is None:
                    op = ops[ev["op"]] = TimedOp(ev["op"], ev["proc"], ev["session"], ev["ids"],
                                                 ev["expected"], ev["t"])
                op.attempts += 1
                op.outcome = "indeterminate"  # until this attempt ends
            elif kind in ("ok", "fail", "indeterminate"):
                op = ops[ev["op"]]
                if kind == "ok":
                    op.outcome, op.seq, op.t_done = "ok", int(ev["seq"]), ev["t"]
                elif kind == "fail":
                    op.outcome, op.error, op.actual, op.t_done = "fail", ev["error"], ev.get("actual"), ev["t"]
                    op.errors.append(ev["error"])
                else:
                    op.unknown_attempts += 1
                    op.error = ev["error"]
                    op.errors.append(ev["error"])
                    if ev.get("foreign"):
                        op.foreign.append(f"{ev['error']}: {ev.get('msg', '')}")
            else:
                if kind == "pause" and ev.get("op") in ops:
                    ops[ev["op"]].pauses.append(ev["point"])
                other.append(ev)
    return list(ops.values()), other


def load_timed_reads(paths: Iterable[Any]) -> list[TimedRead]:
    return [
        TimedRead(r["proc"], r["session"], r["t0"], r["t1"], r.get("ids"),
                  r.get("error") and f"{r['error']}: {r.get('msg', '')}", bool(r.get("foreign")))
        for path in paths
        for r in _jsonl(path)
    ]


@dataclass
class SoakVerdict:
    operations: int = 0
    acknowledged: int = 0
    conflicts: int = 0
    #: Refusals other than conflicts, by error class (ContentionError is allowed).
    refused: dict[str, int] = field(default_factory=dict)
    #: Operations never resolved, and how many of them the final read shows committed.
    indeterminate: int = 0
    indeterminate_committed: int = 0
    #: Operations that had at least one attempt with an unknown outcome (and were re-sent).
    resent: int = 0
    #: ... of which resolved to ok / fail.
    resent_resolved: int = 0
    attempt_errors: dict[str, int] = field(default_factory=dict)
    entries_final: int = 0
    reads: int = 0
    read_errors: dict[str, int] = field(default_factory=dict)
    violations: dict[str, int] = field(default_factory=lambda: {k: 0 for k in VIOLATION_KINDS})
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, kind: str, detail: str, count: int = 1) -> None:
        assert kind in VIOLATION_KINDS, kind
        self.violations[kind] += count
        ex = self.examples.setdefault(kind, [])
        if len(ex) < 5:
            ex.append(detail)

    @property
    def broken(self) -> int:
        return sum(self.violations.values())

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


def _count(d: dict[str, int], key: str) -> None:
    d[key] = d.get(key, 0) + 1


def check_timed_history(
    ops: list[TimedOp], reads: list[TimedRead], final: dict[str, dict[str, Any]]
) -> SoakVerdict:
    """Judge every operation and every read. ``final`` maps each session to its final read:
    ``{"ids": [...], "seqs": [...], "after_gc_ids": [...], "below_manifest": {seq: ids}}``, with
    ``"error"`` when the read failed (``"ids"`` may then come from another way of reading)."""
    v = SoakVerdict()
    by_session: dict[str, list[TimedOp]] = defaultdict(list)
    batch_of: dict[str, TimedOp] = {}
    for op in ops:
        by_session[op.session].append(op)
        for eid in op.ids:
            batch_of[eid] = op
    # --- operations --------------------------------------------------------------------------
    for op in ops:
        v.operations += 1
        for err in op.errors:
            _count(v.attempt_errors, err)
        if op.unknown_attempts:
            v.resent += 1
            if op.outcome != "indeterminate":
                v.resent_resolved += 1
        for text in op.foreign:
            v.add("foreign-exception", f"{op.op}: {text}")
        if op.outcome == "ok":
            v.acknowledged += 1
        elif op.outcome == "fail":
            if op.error == "ConflictError":
                v.conflicts += 1
                if op.expected is None:
                    v.add("conflict-without-expected", f"{op.op} ({op.session})")
            else:
                _count(v.refused, str(op.error))
                if op.error == "UnknownParentError":
                    v.add("unknown-parent", f"{op.op} ({op.session}) ids {op.ids}")
                elif op.error == "IdCollisionError":
                    v.add("id-collision", f"{op.op} ({op.session}) ids {op.ids}")
                elif op.error != "ContentionError":
                    v.add("write-failed", f"{op.op}: refused with {op.error}")
        else:
            v.indeterminate += 1
        for err in op.errors:
            if err in ("CorruptObjectError", "SessionNotFoundError"):
                v.add("write-failed", f"{op.op}: {err}")
                break
    # --- the final read ----------------------------------------------------------------------
    final_ids: dict[str, list[str] | None] = {}
    for sid in sorted(set(final) | set(by_session)):
        rec = final.get(sid, {"error": "no final read"})
        if rec.get("error"):
            diag = rec.get("diagnosis")
            v.add("final-read-failed", f"{sid}: {rec['error']}" + (f"; state: {diag}" if diag else ""))
        if rec.get("ids") is None:
            final_ids[sid] = None
            continue
        ids: list[str] = rec["ids"]
        final_ids[sid] = ids
        v.entries_final += len(ids)
        if "after_gc_ids" in rec and rec["after_gc_ids"] != ids:
            v.add("gc-changed-read", f"{sid}: {len(ids)} entries before GC, {len(rec['after_gc_ids'])} after")
        pos: dict[str, int] = {}
        for i, eid in enumerate(ids):
            if eid in pos:
                v.add("duplicated", f"{sid}: final read holds {eid} at {pos[eid]} and {i}")
            pos[eid] = i
            if eid not in batch_of:
                v.add("phantom", f"{sid}: {eid} at {i}")
        seqs = rec.get("seqs") or []
        below: dict[str, list[str]] = rec.get("below_manifest") or {}
        for op in by_session.get(sid, []):
            present = [eid in pos for eid in op.ids]
            whole = all(present)
            if any(present) and not whole:
                v.add("torn", f"{sid}: {op.op} ({op.outcome}) {sum(present)} of {len(op.ids)} visible")
                continue
            if whole:
                start = pos[op.ids[0]]
                if ids[start : start + len(op.ids)] != op.ids:
                    v.add("torn", f"{sid}: {op.op} not contiguous")
                    continue
            if op.outcome == "ok":
                if not whole:
                    where = [n for n, seg_ids in below.items() if op.ids[0] in seg_ids]
                    paused = f", the writer stopped at {op.pauses}" if op.pauses else ""
                    v.add("lost", f"{sid}: {op.op} acknowledged as seg {op.seq} at t={op.t_done:.3f} "
                                  f"after {op.attempts} attempt(s){paused}; "
                                  + (f"its segment {where[0]} lies below the latest manifest" if where
                                     else "no segment holds it any more"))
                    continue
                if seqs and any(seqs[pos[eid]] != op.seq for eid in op.ids):
                    v.add("misplaced", f"{sid}: {op.op} acknowledged as seg {op.seq}, stored as {seqs[pos[op.ids[0]]]}")
                if op.expected is not None:
                    start = pos[op.ids[0]]
                    before = ids[start - 1] if start > 0 else ""
                    if before != op.expected:
                        v.add("stale-tail-accepted",
                              f"{sid}: {op.op} expected tail {op.expected!r}, follows {before!r}")
            elif op.outcome == "fail":
                if whole:
                    v.add("refused-visible", f"{sid}: {op.op} refused with {op.error} after "
                                             f"{op.attempts} attempt(s), visible at {pos[op.ids[0]]}")
            elif whole:
                v.indeterminate_committed += 1
    # --- reads -------------------------------------------------------------------------------
    reads_by_session: dict[str, list[TimedRead]] = defaultdict(list)
    for r in reads:
        reads_by_session[r.session].append(r)
    for sid, session_reads in reads_by_session.items():
        acked = sorted((op for op in by_session.get(sid, []) if op.outcome == "ok"), key=lambda o: o.t_done or 0)
        refused_ids = {eid for op in by_session.get(sid, []) if op.outcome == "fail" for eid in op.ids}
        fin = final_ids.get(sid)
        by_end = sorted((r for r in session_reads if r.ids is not None), key=lambda r: r.t1)
        seen: set[str] = set()
        end_i = 0
        must: list[str] = []
        ack_i = 0
        for r in sorted(session_reads, key=lambda r: r.t0):
            v.reads += 1
            if r.ids is None:
                name = (r.error or "?").split(":", 1)[0]
                _count(v.read_errors, name)
                if r.foreign:
                    v.add("foreign-exception", f"read {r.proc} {sid}: {r.error}")
                elif name not in TRANSIENT_ERRORS:
                    v.add("read-failed", f"{r.proc} {sid} at t={r.t0:.3f}: {r.error}")
                continue
            rids = r.ids
            rset = set(rids)
            where = f"{r.proc} {sid} t={r.t0:.3f}..{r.t1:.3f} ({len(rids)} entries)"
            if len(rset) != len(rids):
                v.add("duplicated", f"read {where}")
            if rset & refused_ids:
                bad = sorted(rset & refused_ids)[:3]
                v.add("read-refused-visible", f"{where}: {bad}")
            torn = _torn_batches(rids, batch_of)
            if torn:
                v.add("read-torn", f"{where}: {torn[:3]}")
            if fin is not None and rids != fin[: len(rids)]:
                k = next((i for i, (a, b) in enumerate(zip(rids, fin)) if a != b), min(len(rids), len(fin)))
                v.add("read-not-prefix", f"{where}: differs from the final read at {k}: "
                                         f"{rids[k] if k < len(rids) else None!r} vs {fin[k] if k < len(fin) else None!r}")
            while ack_i < len(acked) and (acked[ack_i].t_done or 0) < r.t0:
                must.extend(acked[ack_i].ids)
                ack_i += 1
            missing = [eid for eid in must if eid not in rset]
            if missing:
                ops_missing = sorted({batch_of[e].op for e in missing})
                v.add("read-missing-acked", f"{where}: lacks {ops_missing[:3]} ({len(ops_missing)} batches)")
            while end_i < len(by_end) and by_end[end_i].t1 < r.t0:
                seen.update(by_end[end_i].ids or ())
                end_i += 1
            gone = seen - rset
            if gone:
                v.add("read-vanished", f"{where}: lacks {sorted(gone)[:3]} seen by an earlier read")
    return v


def _torn_batches(ids: list[str], batch_of: dict[str, TimedOp]) -> list[str]:
    """Batches of which a read shows only a part, or not in one piece."""
    torn = []
    i = 0
    while i < len(ids):
        op = batch_of.get(ids[i])
        if op is None:
            i += 1
            continue
        if ids[i : i + len(op.ids)] != op.ids:
            torn.append(op.op)
            i += 1
        else:
            i += len(op.ids)
    return torn


def first_ack_after(ops: list[TimedOp], moments: Iterable[float]) -> list[float | None]:
    """For each moment (e.g. Redis coming back empty), the seconds until the first
    acknowledgement of an append after it (None: none came)."""
    done = sorted(op.t_done for op in ops if op.outcome == "ok" and op.t_done is not None)
    import bisect

    out: list[float | None] = []
    for t in moments:
        i = bisect.bisect_left(done, t)
        out.append(done[i] - t if i < len(done) else None)
    return out
