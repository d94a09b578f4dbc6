"""The child processes of a soak run: ``python -m tests.soak.roles ROLE --config PATH ...``.

* ``writer``: appends batches of 1-3 entries to random sessions until the deadline, half of
  them with ``expected_tail_entry_id`` (the tail it just read). A batch whose outcome is
  unknown (``IndeterminateError``, ``BackendUnavailableError``, anything not a refusal) is
  re-sent unchanged until the outcome is known. Every attempt is logged as an ``invoke``
  and its ``ok`` / ``fail`` / ``indeterminate`` with ``time.monotonic()`` (one clock for
  every process on the machine). Now and then a writer stops itself with SIGSTOP at a point
  of the append protocol (``StoreOptions.fault_hook``): the nemesis resumes it later.
* ``reader``: reads random sessions (``read_session``) until the stop file appears and logs
  what each read returned (ids in order) and when it started and ended.
* ``final``: once everything else has stopped, a fresh process reads every session, notes the
  segments still present below the latest manifest, then runs a GC pass with the grace period
  long over and reads again (a GC must never change what a reader sees).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

import orjson

from store import SessionStore
from store.errors import (
    InvalidInputError,
    ObjectNotFoundError,
    SessionStoreError,
    WriteRefusedError,
)
from tests.soak.config import AIMED_POINTS, SoakConfig

#: Re-sends of one batch that failed with something other than a transient backend error
#: (a corrupt object, say) before the writer gives up on it and leaves it indeterminate.
_MAX_ODD_RESENDS = 20


def _now() -> float:
    return time.monotonic()


class EventLog:
    """One JSON object a line, unbuffered: each line is one write(2) on an O_APPEND file, so a
    SIGKILL leaves at most the line being written incomplete (the loader skips it)."""

    def __init__(self, path: Path) -> None:
        self._fh = open(path, "ab", buffering=0)

    def emit(self, **event: Any) -> None:
        self._fh.write(orjson.dumps(event) + b"\n")

    def close(self) -> None:
        self._fh.close()


def _open_store(cfg: SoakConfig, stop: Callable[[], bool], **options: Any) -> SessionStore | None:
    """The store, once S3 answers its start-up probe (it may be down when we start)."""
    while not stop():
        try:
            return SessionStore.from_url(cfg.objects_url, cfg.redis_url, redis_prefix=cfg.redis_prefix, **options)
        except SessionStoreError:
            time.sleep(0.2)
    return None


def _entry(eid: str, parent: str | None, pad: int) -> dict[str, Any]:
    return {
        "type": "message",
        "id": eid,
        "parentId": parent,
        "timestamp": "2026-11-22T10:00:00.000Z",
        "message": {"role": "assistant", "content": [{"type": "text", "text": f"soak {eid} " + "x" * pad}]},
    }


# --- writer ----------------------------------------------------------------------------------


class AimedPauses:
    """The writer's own SIGSTOP at a protocol point, about every ``interval`` seconds."""

    def __init__(self, cfg: SoakConfig, rng: random.Random, log: EventLog, proc: str) -> None:
        self.cfg = cfg
        self.rng = rng
        self.log = log
        self.proc = proc
        self.op = ""
        self.point: str | None = None
        self.at = float("inf")
        self._arm()

    def _arm(self) -> None:
        if self.cfg.aimed_interval_s <= 0:
            return
        self.at = _now() + self.rng.expovariate(1 / self.cfg.aimed_interval_s)
        # The point that matters most (between the CHECK and the segment PUT) twice as often.
        self.point = self.rng.choice(AIMED_POINTS[:1] * 2 + AIMED_POINTS[1:])

    def hook(self, point: str, ctx: dict[str, Any]) -> None:
        now = _now()
        if point != self.point or now < self.at or now > self.cfg.deadline - 1.0:
            return
        self.log.emit(ev="pause", proc=self.proc, op=self.op, point=point,
                      session=ctx.get("session_id"), seq=ctx.get("seq"), t=now)
        self._arm()
        os.kill(os.getpid(), signal.SIGSTOP)  # the nemesis sends SIGCONT


def writer(cfg: SoakConfig, index: int, restart: int) -> int:
    proc = f"w{index}.{restart}"
    log = EventLog(Path(cfg.workdir) / f"writer-{proc}.jsonl")
    rng = random.Random(f"{cfg.seed}/writer/{index}/{restart}")
    aimed = AimedPauses(cfg, random.Random(f"{cfg.seed}/aimed/{index}/{restart}"), log, proc)
    log.emit(ev="start", proc=proc, pid=os.getpid(), t=_now())
    store = _open_store(cfg, lambda: _now() > cfg.deadline, compact_after_segments=cfg.compact_after,
                        fault_hook=aimed.hook)
    if store is None:
        return 0
    last: dict[str, str | None] = {sid: None for sid in cfg.session_ids}
    opno = 0
    while _now() < cfg.deadline:
        opno += 1
        sid = rng.choice(cfg.session_ids)
        expected: str | None = None
        parent = last[sid]
        if rng.random() < 0.5:
            try:
                expected = store.get_tail(sid).last_entry_id
            except SessionStoreError:
                time.sleep(0.05)
                continue  # nothing was written: not an operation
            parent = expected or None
        ids = [f"{proc}-{opno}-{k}" for k in range(rng.randint(1, 3))]
        pads = [rng.choice((0, 0, 40, 400)) for _ in ids]
        batch = [_entry(ids[0], parent, pads[0])] + [
            _entry(ids[k], ids[k - 1], pads[k]) for k in range(1, len(ids))
        ]
        op = f"{proc}-{opno}"
        aimed.op = op
        if _resolve(cfg, store, log, proc, op, sid, batch, ids, expected):
            last[sid] = ids[-1]
    store.close()
    log.emit(ev="stop", proc=proc, t=_now())
    log.close()
    return 0


def _resolve(
    cfg: SoakConfig, store: SessionStore, log: EventLog, proc: str, op: str, sid: str,
    batch: list[dict[str, Any]], ids: list[str], expected: str | None,
) -> bool:
    """Append one batch, re-sending it until its outcome is known. True if acknowledged."""
    attempt = 0
    odd = 0
    while True:
        attempt += 1
        log.emit(ev="invoke", proc=proc, op=op, session=sid, ids=ids, expected=expected,
                 attempt=attempt, t=_now())
        try:
            res = store.append_session_entries(sid, batch, expected)
        except WriteRefusedError as exc:  # conflict, collision, unknown parent, contention
            log.emit(ev="fail", proc=proc, op=op, error=type(exc).__name__, msg=str(exc)[:300],
                     actual=getattr(exc, "actual_tail_entry_id", None), t=_now())
            return False
        except InvalidInputError as exc:  # a bug of the soak's own: nothing was written
            log.emit(ev="fail", proc=proc, op=op, error=type(exc).__name__, msg=str(exc)[:300], t=_now())
            return False
        except SessionStoreError as exc:
            transient = exc.__class__.__name__ in ("IndeterminateError", "BackendUnavailableError")
            log.emit(ev="indeterminate", proc=proc, op=op, error=type(exc).__name__,
                     msg=str(exc)[:300], t=_now())
            odd += 0 if transient else 1
        except Exception as exc:  # not in the store's error tree: a broken promise of its own
            log.emit(ev="indeterminate", proc=proc, op=op, error=type(exc).__name__,
                     msg=str(exc)[:300], foreign=True, t=_now())
            odd += 1
        else:
            log.emit(ev="ok", proc=proc, op=op, seq=res.seq, t=_now())
            return True
        if _now() > cfg.deadline + cfg.resolve_s or odd > _MAX_ODD_RESENDS:
            return False  # left indeterminate
        time.sleep(0.05 + 0.1 * min(attempt, 5) * random.random())


# --- reader ----------------------------------------------------------------------------------


def reader(cfg: SoakConfig, index: int, restart: int) -> int:
    proc = f"r{index}.{restart}"
    log = EventLog(Path(cfg.workdir) / f"reader-{proc}.jsonl")
    rng = random.Random(f"{cfg.seed}/reader/{index}/{restart}")
    stop = cfg.stop_file.exists
    store = _open_store(cfg, stop)
    if store is None:
        return 0
    while not stop():
        sid = rng.choice(cfg.session_ids)
        record: dict[str, Any] = {"proc": proc, "session": sid}
        t0 = _now()
        try:
            data = store.read_session(sid)
            record["ids"] = [e["id"] for e in data.entries]
            record["seq"] = data.seq
        except SessionStoreError as exc:
            record["error"] = type(exc).__name__
            record["msg"] = str(exc)[:300]
        except Exception as exc:  # not in the store's error tree
            record["error"] = type(exc).__name__
            record["msg"] = str(exc)[:300]
            record["foreign"] = True
        record["t0"] = t0
        record["t1"] = _now()
        log.emit(**record)
        if cfg.pace_s > 0:
            time.sleep(rng.uniform(0, 2 * cfg.pace_s))
    store.close()
    log.close()
    return 0


# --- final -----------------------------------------------------------------------------------


def _retry(fn: Callable[[], Any], seconds: float = 60.0) -> Any:
    deadline = _now() + seconds
    while True:
        try:
            return fn()
        except SessionStoreError as exc:
            if _now() > deadline or exc.__class__.__name__ not in ("BackendUnavailableError", "IndeterminateError"):
                raise
            time.sleep(0.5)


def _ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 5, 7, 8] -> "1-3,5,7-8"."""
    out: list[str] = []
    for n in sorted(numbers):
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == n - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        elif out and "-" not in out[-1] and int(out[-1]) == n - 1:
            out[-1] = f"{out[-1]}-{n}"
        else:
            out.append(str(n))
    return ",".join(out)


def _diagnose(store: SessionStore, sid: str) -> dict[str, Any]:
    """What Redis and the object store hold for a session, for the report."""
    from store.formats.layout import Layout

    out: dict[str, Any] = {}
    try:
        header = _retry(lambda: store.get_header(sid))
        inc = header.incarnation
        tail = store.coord.tail(sid)
        out["redis_tail"] = None if tail is None else {"seq": tail.seq, "last": tail.last,
                                                         "same_incarnation": tail.inc == inc}
        keys = _retry(lambda: [i.key for i in store.objects.list(store.layout.incarnation_prefix(sid, inc))])
        segs = [Layout.seq_of(k) for k in keys if "/seg/" in k]
        gens = [Layout.seq_of(k) for k in keys if "/manifest/" in k]
        out["segments"] = _ranges(segs)
        out["manifests"] = _ranges(gens)
        out["bases"] = sum(1 for k in keys if "/base/" in k)
        latest = _retry(lambda: store.latest_manifest(sid, inc))
        out["latest_manifest"] = None if latest is None else {"generation": latest.generation,
                                                              "through_seq": latest.through_seq}
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def _read_without_redis(store: SessionStore, sid: str) -> Any:
    """The session as the object store holds it, without Redis's tail hint (a LIST instead)."""
    header = store.get_header(sid)
    reader = getattr(store, "reader", None)
    if reader is not None:
        return reader.read(sid, header, use_hint=False)
    return store._read(sid, header, use_hint=False)  # type: ignore[attr-defined]


def final(cfg: SoakConfig) -> int:
    from compactor import Compactor, CompactorOptions
    from store.formats.entries import decode_segment
    from store.formats.layout import Layout

    store = _open_store(cfg, lambda: False)
    assert store is not None
    out: dict[str, Any] = {}
    for sid in cfg.session_ids:
        rec: dict[str, Any] = {}
        out[sid] = rec
        rec["diagnosis"] = _diagnose(store, sid)
        try:
            t0 = _now()
            try:
                data = _retry(lambda: store.read_session(sid))
            except Exception as exc:
                rec["error"] = f"{type(exc).__name__}: {exc}"[:500]
                # What the object store holds, read without Redis's hint: the operations are
                # still judged against it.
                data = _read_without_redis(store, sid)
                rec["read_without_redis"] = True
            rec.update(ids=[e["id"] for e in data.entries], seqs=data.seqs, seq=data.seq,
                       through_seq=data.manifest.through_seq if data.manifest else 0,
                       generation=data.manifest.generation if data.manifest else 0, t0=t0, t1=_now())
            # Segments still present at or below the manifest: retired ones awaiting GC, or
            # ones written into a slot the manifest had already retired (nobody reads those).
            inc = data.header.incarnation
            keys = _retry(lambda: list(store.iter_segment_keys(sid, inc)))
            below: dict[int, list[str]] = {}
            for key in keys:
                n = Layout.seq_of(key)
                if n <= rec["through_seq"]:
                    try:
                        obj = _retry(lambda: store.objects.get(key))
                    except ObjectNotFoundError:
                        continue
                    entries = decode_segment(key, obj.data, obj.metadata.get("sha256"))
                    below[n] = [e["id"] for e in entries]
            rec["below_manifest"] = {str(k): v for k, v in sorted(below.items())}
            if "error" in rec:
                continue
            # GC with the grace period long over, then read again: nothing may change.
            later = int(time.time() * 1000) + 3_600_000
            gc = Compactor(store, CompactorOptions(grace_ms=0, worker="soak-final"), now=lambda: later)
            rec["gc_deleted"] = len(_retry(lambda: gc.gc_session(sid)).deleted)
            again = _retry(lambda: store.read_session(sid))
            rec["after_gc_ids"] = [e["id"] for e in again.entries]
        except Exception as exc:
            rec.setdefault("error", f"{type(exc).__name__}: {exc}"[:500])
    Path(cfg.workdir, "final.json").write_bytes(orjson.dumps(out))
    store.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.soak.roles")
    p.add_argument("role", choices=("writer", "reader", "final"))
    p.add_argument("--config", required=True)
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--restart", type=int, default=0)
    args = p.parse_args(argv)
    cfg = SoakConfig.load(args.config)
    if args.role == "writer":
        return writer(cfg, args.index, args.restart)
    if args.role == "reader":
        return reader(cfg, args.index, args.restart)
    return final(cfg)


if __name__ == "__main__":
    sys.exit(main())
