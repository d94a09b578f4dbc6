"""The append protocol's Redis calls (``store/protocol/append.py``, ``store/protocol/tail.py``): CHECK and
COMMIT with their waits for a turn, the release of a claim, the tail and its rebuild
(INSTALL), and what compaction and GC tell Redis of retired segments. Each is one script of
``coordination/scripts.py`` on the session's own slot.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import orjson
import redis

from coordination.client import RedisClient, redis_call
from coordination.formats import (
    CheckResult,
    CommitResult,
    Offering,
    SummaryDelta,
    TailState,
    _b,
    _commit_result,
    _s,
)
from store.errors import BackendError, BackendUnavailableError

log = logging.getLogger("sessionstore.coordination")

#: A writer waiting for the claim with no connection to spare for a blocking wait polls.
_POLL_S = 0.005


class AppendCalls(RedisClient):
    """The append protocol's calls of the coordinator."""

    def check(
        self,
        sid: str,
        inc: str,
        ids: Sequence[str],
        hashes: Sequence[str],
        external_parents: Sequence[tuple[str, str]],
        expected_tail: str | None,
        *,
        nonce: str = "",
        claim_ms: int = 0,
        wait_s: float = 0.0,
        compacted: Sequence[str | int] = (),
        offer: bytes | None = None,
        offering: Offering | None = None,
        take: tuple[int, int] | None = None,
        keep_claim: bool = False,
    ) -> CheckResult:
        """CHECK (scripts.CHECK). ``wait_s``: the writer ``nonce`` waits in the session's
        queue; first wait up to that long for the claim to be handed to it, then CHECK.
        ``compacted``: what the writer's copy of the compacted ids says of the batch
        (``store.protocol.id_index.Lookup.args``; empty: it has none). REINDEX (``seq`` = Redis's
        ``iseq``) asks for a copy that reaches further.

        Group commit (docs/design.md, "Group commit"): ``offer``, with ``wait_s``, is the
        segment body the waiting writer offers to ride in the next claim holder's segment
        (set, with its lease, before the wait), and ``offering`` what became of it: whether
        another writer may hold it; ``take`` = (riders, bytes) lets an OK take
        that many waiters' offers (``CheckResult.riders``); ``keep_claim``: a refusal keeps
        the caller's claim and place (the check of a combined batch)."""
        args: list[Any] = [inc, "0" if expected_tail is None else "1", expected_tail or "", len(ids)]
        args.extend(ids)
        args.extend(hashes)
        args.append(len(external_parents))
        for eid, parent in external_parents:
            args.append(eid)
            args.append(parent)
        args.append(nonce)
        args.append(claim_ms if nonce else 0)
        riders, budget = take if take is not None else (0, 0)
        args.extend((riders, budget, "1" if keep_claim else "0"))
        args.extend(compacted)
        keys = [self.keys.tail(sid), self.keys.ids(sid), self.keys.claim(sid)]
        if nonce:
            keys += [self.keys.queue(sid), self.keys.queue_leases(sid), self.keys.turn(sid, nonce)]
        if wait_s > 0 and nonce:
            if offer is not None and claim_ms > 0:
                offer = inc.encode() + b"\n" + offer
            res = self._wait_then_check(
                keys, args, wait_s, offer=offer, offer_ms=claim_ms, offering=offering
            )
        else:
            res = self._call(lambda: self._check(keys=keys, args=args))
        code = _s(res[0])
        if code == "OK":
            offering = offering if offering is not None and offering.sent else None
            if offering is not None and (len(res) < 4 or not int(res[3])):
                offering.out = True  # our offer was gone: another writer may hold our batch
            if offering is not None:
                offering.sent = False
            taken = tuple((_s(res[i]), _b(res[i + 1])) for i in range(4, len(res) - 1, 2))
            return CheckResult(code, seq=int(res[1]), last=_s(res[2]), riders=taken)
        if code == "BUSY":
            return CheckResult(code, seq=int(res[1]), wait_ms=max(0, int(res[2])), ticket=int(res[3]))
        if code == "DUPLICATE":
            return CheckResult(code, seq=int(res[1]))
        if code == "COLLISION":
            return CheckResult(code, entry_id=_s(res[1]), detail=_s(res[2]))
        if code == "CONFLICT":
            return CheckResult(code, last=_s(res[1]), seq=int(res[2]))
        if code == "UNKNOWN_PARENT":
            return CheckResult(code, entry_id=_s(res[1]), parent_id=_s(res[2]))
        if code == "INCARNATION":
            return CheckResult(code, inc=_s(res[1]))
        if code == "REINDEX":
            return CheckResult(code, seq=int(res[1]))
        return CheckResult(code)

    def commit(
        self,
        sid: str,
        inc: str,
        from_seq: int,
        ids: Sequence[str],
        hashes: Sequence[str],
        **options: Any,
    ) -> CommitResult:
        """COMMIT segment from_seq+1 (its options: ``_commit_call``).

        ``own``: the caller PUT this segment itself. When the slot is taken already the reply
        is then ALREADY only if the batch committed there is the caller's, and ZOMBIE if the
        caller re-created a slot that compaction had retired (see scripts.COMMIT).

        ``summary``: what the batch changes in the listing's summary (``store/protocol/listing.py``),
        moved along in the same script when the summary is in step with the tail.

        ``cache``: the segment as the recent-segments cache keeps it (``recent_value``), taken
        while at most ``cache_cap`` bytes are pending compaction.

        ``state_ttl_ms``: the id index and the cache expire this long after the session's
        last commit (0: never); the next append after that rebuilds them (scripts.COMMIT).

        ``riders``: nonces of the waiters whose batches are in this segment (group commit);
        with OK each is woken with "done", its wake-up living ``wake_ms``."""
        keys, args = self._commit_call(sid, inc, from_seq, ids, hashes, **options)
        return _commit_result(self._call(lambda: self._commit(keys=keys, args=args)))

    def _commit_call(
        self,
        sid: str,
        inc: str,
        from_seq: int,
        ids: Sequence[str],
        hashes: Sequence[str],
        *,
        size: int = 0,
        notify: dict[str, Any] | None = None,
        own: bool = False,
        summary: SummaryDelta | None = None,
        cache: bytes | None = None,
        cache_cap: int = 0,
        state_ttl_ms: int = 0,
        riders: Sequence[str] = (),
        wake_ms: int = 0,
    ) -> tuple[list[Any], list[Any]]:
        new_seq = from_seq + 1
        args: list[Any] = [inc, from_seq, ids[-1], len(ids)]
        tag = f"{new_seq}:"
        for eid, h in zip(ids, hashes):
            args.append(eid)
            args.append(tag + h)
        payload = {"session": sid, "seq": new_seq, "last": ids[-1], "count": len(ids)}
        if notify:
            payload.update(notify)
        args.append(self.keys.changes(sid))
        args.append(orjson.dumps(payload))
        args.append(size)
        args.append("1" if own else "0")
        keys = [
            self.keys.tail(sid), self.keys.ids(sid), self.keys.job_pending(sid),
            self.keys.summary(sid), self.keys.recent(sid),
            # fair appends: COMMIT hands the next slot's claim to the first waiter
            self.keys.claim(sid), self.keys.queue(sid), self.keys.queue_leases(sid),
        ]
        args.extend(summary.args() if summary is not None else ("", "", ""))
        caching = cache is not None and cache_cap > 0
        args.extend((cache, cache_cap) if caching else ("", 0))
        args.append(max(0, int(state_ttl_ms)))
        args.append("1" if self.sharded_pubsub() else "0")
        if riders:
            args.append(len(riders))
            args.extend(riders)
            args.append(max(1, int(wake_ms)))
        return keys, args

    def wake(self, sid: str, nonces: Sequence[str], why: str, ttl_ms: int) -> None:
        """Wake waiters blocked on their turn lists (group commit: "back", their batches go
        back to them; "done", committed). Best effort: a waiter not woken wakes at the end
        of its wait, and its CHECK decides."""
        if not nonces:
            return
        def call() -> None:
            pipe = self.client.pipeline(transaction=False)
            for nonce in nonces:
                turn = self.keys.turn(sid, nonce)
                pipe.rpush(turn, why)
                pipe.pexpire(turn, max(1, int(ttl_ms)))
            pipe.execute()
        try:
            self._call(call, retry=False)
        except BackendError as exc:
            log.info("riders of %s not woken (%s): they wake at the end of their wait", sid, exc)

    def _wait_then_check(
        self, keys: list[str], args: list[Any], wait_s: float, *,
        offer: bytes | None = None, offer_ms: int = 0, offering: Offering | None = None,
    ) -> Any:
        """BLPOP on the writer's wake-up list (keys[5]), then CHECK: pipelined on one
        connection, so Redis runs the CHECK the moment the claim is handed over, and the
        writer wakes once, with the answer. Without a connection to spare for blocking, a
        short sleep instead; a failed wait is followed by a plain CHECK (with the retry
        policy), which meets whatever went wrong.

        ``offer``: set first (in the same round trip) as the waiter's offer to ride in the
        next claim holder's segment (group commit), living ``offer_ms``."""
        if not self._blocking.acquire(blocking=False):
            time.sleep(min(wait_s, _POLL_S) * random.uniform(0.5, 1.5))
            return self._call(lambda: self._check(keys=keys, args=args))
        timeout = max(0.001, min(wait_s, self._block_cap_s))  # BLPOP 0 would block for good
        offer_key = keys[5] + ":offer" if offer is not None else None
        offering = offering if offer_key is not None else None
        was_sent = offering is not None and offering.sent
        if offering is not None:
            offering.sent = True
        try:
            if self.cluster:
                # redis-py's cluster pipeline refuses EVALSHA: wait, then CHECK below.
                if offer_key is not None and offer is not None:
                    value = offer
                    prev = redis_call(lambda: self.client.set(offer_key, value, px=max(1, offer_ms), get=True))
                    if offering is not None:
                        offering.refreshed(was_sent, prev)
                redis_call(lambda: self.client.blpop([keys[5]], timeout=timeout))
            else:
                res, prev = redis_call(lambda: self._blpop_check(keys, args, timeout, offer_key, offer, offer_ms))
                if offering is not None:
                    offering.refreshed(was_sent, prev)
                return res
        except BackendError as exc:
            log.debug("waiting for the claim: %s", exc)
        finally:
            self._blocking.release()
        return self._call(lambda: self._check(keys=keys, args=args))

    def _blpop_check(
        self, keys: list[str], args: list[Any], timeout: float,
        offer_key: str | None = None, offer: bytes | None = None, offer_ms: int = 0,
    ) -> tuple[Any, Any]:
        """(CHECK's reply, the offer the SET replaced when ``offer_key`` is given)."""
        pipe = self.client.pipeline(transaction=False)
        if offer_key is not None and offer is not None:
            pipe.set(offer_key, offer, px=max(1, offer_ms), get=True)
        pipe.blpop([keys[5]], timeout=timeout)
        pipe.evalsha(self._check.sha, len(keys), *keys, *args)
        replies = pipe.execute(raise_on_error=False)
        prev = replies[0] if offer_key is not None else None
        res = replies[-1]
        if isinstance(res, redis.exceptions.NoScriptError):
            return self._check(keys=keys, args=args), prev  # loads the script, runs it once
        if isinstance(res, Exception):
            raise res
        return res, prev

    def release(self, sid: str, nonce: str) -> bool:
        """The writer ``nonce`` gives up its append: out of the queue, and a claim it holds
        goes to the first waiter (scripts.RELEASE). True when its offer to ride (group
        commit) was still there, now withdrawn: no other writer holds its batch."""
        keys = [self.keys.claim(sid), self.keys.queue(sid), self.keys.queue_leases(sid)]
        return bool(int(self._call(lambda: self._release(keys=keys, args=[nonce]), retry=False)))

    def compacted(
        self, sid: str, inc: str, segments: int, size: int, through_seq: int = 0, generation: int = 0
    ) -> None:
        """Subtract what a new manifest merged from the session's pending counters, record
        its ``through_seq`` as retired and its ``generation`` as the newest, and drop the
        ids it compacted from the id index (scripts.COMPACTED)."""
        args = [inc, segments, size, through_seq, generation]
        keys = [self.keys.tail(sid), self.keys.recent(sid), self.keys.ids(sid)]
        self._call(lambda: self._compacted(keys=keys, args=args))

    def retired(self, sid: str, inc: str, through_seq: int) -> bool:
        """Fence segment slots 1..through_seq before GC deletes them (scripts.RETIRED).
        False when Redis holds no state of that incarnation (nothing to fence)."""
        return bool(
            self._call(
                lambda: self._retired(
                    keys=[self.keys.tail(sid), self.keys.recent(sid)], args=[inc, through_seq]
                )
            )
        )

    def retired_through(self, sid: str, inc: str) -> int | None:
        """The last segment slot a manifest of ``inc`` retired (``cseq``), as Redis knows it;
        None when Redis holds no state of that incarnation. A read: fences nothing."""
        got = self._call(lambda: self.client.hmget(self.keys.tail(sid), ["inc", "cseq"]))
        if got[0] is None or _s(got[0]) != inc:
            return None
        return int(_s(got[1])) if got[1] is not None else 0

    def position(self, sid: str, inc: str, entry_id: str) -> tuple[str, int]:
        """Where Redis's index puts a committed entry of ``inc`` (scripts.POSITION):
        ("AT", its segment), ("COMPACTED", iseq) or ("UNKNOWN", -1)."""
        got = self._call(
            lambda: self._position(keys=[self.keys.tail(sid), self.keys.ids(sid)], args=[inc, entry_id])
        )
        code = _s(got[0])
        return code, int(got[1]) if len(got) > 1 else -1

    def tail(self, sid: str, *, recent: bool = False) -> TailState | None:
        """The session's state; ``recent``: with the recent-segments cache, in the same round
        trip (a pipeline: both keys are in the session's slot)."""
        fields = ("inc", "seq", "last", "count", "nids", "cseq", "mgen")
        cached: dict[bytes, bytes] = {}
        if recent:

            def both() -> list[Any]:
                pipe = self.client.pipeline(transaction=False)
                pipe.hmget(self.keys.tail(sid), *fields)
                pipe.hgetall(self.keys.recent(sid))
                return pipe.execute()

            raw, cached = self._call(both)
        else:
            raw = self._call(lambda: self.client.hmget(self.keys.tail(sid), *fields))
        if raw[0] is None:
            return None
        return TailState(
            inc=_s(raw[0]),
            seq=int(raw[1] or 0),
            last=_s(raw[2] or b""),
            count=int(raw[3] or 0),
            nids=int(raw[4] or 0),
            cseq=int(raw[5] or 0),
            mgen=int(raw[6] or 0),
            recent={int(k): v for k, v in cached.items()} if cached else None,
        )

    def install(
        self,
        sid: str,
        inc: str,
        *,
        seq: int,
        last: str,
        count: int,
        ids: Iterable[tuple[str, int, str]],
        pending_segments: int = 0,
        pending_bytes: int = 0,
        cseq: int = 0,
        read_at_ms: int = 0,
        max_age_ms: int = 0,
        mgen: int = 0,
        state_ttl_ms: int = 0,
        compacted: tuple[int, int] = (0, -1),
    ) -> str:
        """Install state rebuilt from the object store (``ids``: (id, seq, hash)).

        ``compacted``: (how many of the session's ids are left out of ``ids`` because they
        are compacted, iseq: the segment through which they are; -1: none). ``count`` stays
        the number of all entries; Redis keeps ``nids`` = len(ids) + that number.

        ``read_at_ms``: the client's clock before the rebuild's first read; a rebuild older
        than ``max_age_ms`` by Redis's clock is refused with "STALE" (see scripts.INSTALL), a
        rebuild of a deleted incarnation with "DELETED". Otherwise "INSTALLED" or "KEPT".
        ``state_ttl_ms``: the installed id index expires this long after unless a commit
        renews it (0: never; see ``commit``)."""
        items = list(ids)
        fence = (cseq, read_at_ms, max_age_ms, mgen, max(0, int(state_ttl_ms)))
        pending = (pending_segments, pending_bytes)
        for _ in range(3):
            code = self._install_once(
                sid, inc, seq=seq, last=last, count=count, ids=items, pending=pending, fence=fence,
                compacted=compacted,
            )
            if code != "LOST":
                return code
        raise BackendUnavailableError(f"Redis kept losing the rebuilt state of session {sid!r}")

    def _install_once(
        self,
        sid: str,
        inc: str,
        *,
        seq: int,
        last: str,
        count: int,
        ids: list[tuple[str, int, str]],
        pending: tuple[int, int],
        fence: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0),
        compacted: tuple[int, int] = (0, -1),
    ) -> str:
        scratch = self.keys.ids_building(sid, uuid.uuid4().hex)
        nids = 0
        pipe_items: list[Any] = []

        def flush() -> None:
            if pipe_items:
                items = list(pipe_items)
                self._call(lambda: self.client.hset(scratch, items=items))
                pipe_items.clear()

        for eid, seq_of, h in ids:
            pipe_items.extend((eid, f"{seq_of}:{h}"))
            nids += 1
            if len(pipe_items) >= 2000:
                flush()
        flush()
        if nids:
            self._call(lambda: self.client.expire(scratch, 600))
        keys = [
            self.keys.tail(sid), self.keys.ids(sid), scratch, self.keys.deleted(sid),
            self.keys.recent(sid),
        ]
        res = self._call(
            lambda: self._install(
                keys=keys,
                args=[inc, seq, last, count, nids + compacted[0], *pending, *fence, *compacted],
            )
        )
        return _s(res[0])


__all__ = ["AppendCalls"]
