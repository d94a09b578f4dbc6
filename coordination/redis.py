"""The coordinator: Redis as cache and arbiter of the tail, never the only copy of anything.

This module is the one boundary where redis-py exceptions become ``store.errors``: a timeout
or a lost connection is ``BackendUnavailableError`` (the caller's retry policy decides), a
server refusal is ``BackendRefusedError``.
"""

from __future__ import annotations

import logging
import random
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import orjson
import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from coordination import scripts
from coordination.keys import Keys
from store.errors import BackendError, BackendRefusedError, BackendUnavailableError
from store.retry import DEFAULT_RETRY, RetryPolicy

log = logging.getLogger("sessionstore.coordination")

T = TypeVar("T")

#: A writer waiting for the claim with no connection to spare for a blocking wait polls.
_POLL_S = 0.005


@dataclass(frozen=True, slots=True)
class TailState:
    inc: str
    seq: int
    last: str
    count: int
    nids: int
    #: Segments 1..cseq are retired by a manifest Redis was told of (GC may delete them).
    cseq: int = 0
    #: The generation of the newest manifest Redis was told of (0: none). A hint.
    mgen: int = 0
    #: The recent-segments cache (seq -> cached value), when asked for: ``recent_value``.
    recent: Mapping[int, bytes] | None = field(default=None, compare=False)


def recent_value(inc: str, checksum: str, schema: int, body: bytes) -> bytes:
    """How the recent-segments cache keeps a segment: its incarnation, sha256 and schema on
    a first line, then its bytes. A reader trusts a value only if both match."""
    return f"{inc} {checksum} {schema}\n".encode() + body


def parse_recent(value: bytes, inc: str) -> tuple[str, int, bytes] | None:
    """(sha256, schema, body) of a cached segment of incarnation ``inc``; None otherwise."""
    head, sep, body = value.partition(b"\n")
    parts = head.split(b" ")
    if not sep or len(parts) != 3 or parts[0].decode("ascii", "replace") != inc:
        return None
    try:
        return parts[1].decode("ascii"), int(parts[2]), body
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class CheckResult:
    code: str  # OK BUSY DUPLICATE COLLISION CONFLICT UNKNOWN_PARENT HYDRATE INCARNATION REINDEX
    seq: int = 0
    last: str = ""
    entry_id: str = ""
    parent_id: str = ""
    detail: str = ""
    inc: str = ""
    #: BUSY: how long the other writer's claim still runs.
    wait_ms: int = 0
    #: BUSY: the caller's ticket in the session's queue of waiting writers (first come,
    #: first served; 0 when there is no queue).
    ticket: int = 0
    #: OK with ``take``: (nonce, segment body) of each waiter whose batch CHECK took to ride
    #: in the caller's segment (group commit), in queue order.
    riders: tuple[tuple[str, bytes], ...] = ()


@dataclass(slots=True)
class Offering:
    """A waiting writer's offer of its batch to ride in another writer's segment (group
    commit), as far as it can tell: ``sent`` while one is set in Redis, ``out`` once it may
    have been taken (found gone: taken, or lapsed while the writer was paused, which it
    cannot tell apart). A writer whose batch may be out cannot say "nothing was written"."""

    sent: bool = False
    out: bool = False

    def refreshed(self, was_sent: bool, prev: Any) -> None:
        """The value a refresh of the offer replaced: none, after one was set, means it went."""
        if was_sent and (prev is None or isinstance(prev, Exception)):
            self.out = True


@dataclass(frozen=True, slots=True)
class CommitResult:
    code: str  # OK ALREADY ZOMBIE RETIRED BEHIND HYDRATE INCARNATION
    seq: int = 0
    inc: str = ""
    #: Segments and bytes committed since the latest manifest (OK only).
    pending_segments: int = 0
    pending_bytes: int = 0
    #: A compaction job for the session is queued already (OK only).
    job_queued: bool = False


@dataclass(frozen=True, slots=True)
class SummaryDelta:
    """What one committed batch changes in the listing's summary (scripts.COMMIT)."""

    #: The batch names the session (its last ``session_info``): the name, "" for none.
    name: str | None = None
    #: The batch's first user message, as the listing shows it ("" for none).
    first: str = ""
    #: The batch holds a redaction: drop the summary (a listing rebuilds it).
    reset: bool = False

    def args(self) -> list[str | bytes]:
        if self.reset:
            return ["!", "", ""]
        if self.name is None:
            return ["-", "", _text(self.first)]
        return ["=", _text(self.name), _text(self.first)]


def _text(value: str) -> bytes:
    """Text as Redis keeps it: UTF-8, a lone surrogate (JavaScript strings may hold one, and
    pi's entries are JavaScript's) passed through as ``_read_text`` reads it back."""
    return value.encode("utf-8", "surrogatepass")


def _read_text(value: Any) -> str:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else str(value)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _b(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")


def _cluster_flag(url: str) -> tuple[str, bool]:
    """``redis://host:port/0?cluster=true`` (or ``redis+cluster://``) selects Redis Cluster."""
    from urllib.parse import parse_qsl, urlencode, urlparse, urlunparse

    parsed = urlparse(url)
    if "cluster" not in parsed.query and not parsed.scheme.endswith("+cluster"):
        return url, False  # untouched: urlunparse would mangle unix:///path
    scheme = parsed.scheme
    cluster = False
    if scheme.endswith("+cluster"):
        scheme, cluster = scheme[: -len("+cluster")], True
    query = []
    for key, value in parse_qsl(parsed.query):
        if key == "cluster":
            cluster = cluster or value.lower() in ("1", "true", "yes")
        else:
            query.append((key, value))
    return urlunparse(parsed._replace(scheme=scheme, query=urlencode(query))), cluster


def translate_redis_error(exc: Exception) -> Exception:
    if isinstance(exc, (redis.exceptions.TimeoutError, redis.exceptions.ConnectionError)):
        return BackendUnavailableError(f"Redis unavailable: {exc}")
    if isinstance(exc, redis.exceptions.ResponseError):
        msg = str(exc)
        if msg.startswith(("BUSY", "LOADING", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN", "READONLY")):
            return BackendUnavailableError(f"Redis busy: {msg}")
        return BackendRefusedError(f"Redis refused: {msg}")
    if isinstance(exc, redis.exceptions.RedisError):
        return BackendUnavailableError(f"Redis error: {exc}")
    if isinstance(exc, redis.exceptions.RedisClusterException):
        return BackendRefusedError(f"Redis Cluster refused: {exc}")
    return exc


def redis_call(fn: Callable[[], T]) -> T:
    """Run one redis-py call; its exceptions become ``store.errors`` (the one boundary)."""
    try:
        return fn()
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        raise translate_redis_error(exc) from exc


def _commit_result(res: Any) -> CommitResult:
    code = _s(res[0])
    if code == "INCARNATION":
        return CommitResult(code, inc=_s(res[1]))
    if code == "HYDRATE":
        return CommitResult(code)
    if code == "OK":
        return CommitResult(
            code,
            seq=int(res[1]),
            pending_segments=int(res[2]),
            pending_bytes=int(res[3]),
            job_queued=bool(int(res[4])),
        )
    return CommitResult(code, seq=int(res[1]))


class Coordinator:
    """Per-session tail, id index, summary and notifications; the compaction queue."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str = "ss",
        retry: RetryPolicy = DEFAULT_RETRY,
        socket_timeout: float | None = None,
        max_blocking: int | None = None,
    ) -> None:
        self.client = client
        self.cluster = isinstance(client, redis.cluster.RedisCluster)
        self.keys = Keys(prefix)
        self.retry = retry
        # A writer waiting for its turn blocks on a connection of the client's pool: at most
        # a quarter of the pool waits at once (the others poll), so waiters never starve the
        # commands that would hand them their turn. A wait ends before the socket timeout.
        pool = getattr(client, "connection_pool", None)
        if socket_timeout is None and pool is not None:
            socket_timeout = pool.connection_kwargs.get("socket_timeout")
        self._block_cap_s = 0.5 * socket_timeout if socket_timeout else 1.0
        if max_blocking is None:
            max_blocking = max(1, int(getattr(pool, "max_connections", 100)) // 4) if pool else 25
        self._blocking = threading.BoundedSemaphore(max_blocking)
        self._check = client.register_script(scripts.CHECK)
        self._commit = client.register_script(scripts.COMMIT)
        self._install = client.register_script(scripts.INSTALL)
        self._forget = client.register_script(scripts.FORGET)
        self._compacted = client.register_script(scripts.COMPACTED)
        self._retired = client.register_script(scripts.RETIRED)
        self._summary = client.register_script(scripts.SUMMARY)
        self._deleting = client.register_script(scripts.DELETING)
        self._release = client.register_script(scripts.RELEASE)
        self._gc_claim = client.register_script(scripts.GC_CLAIM)
        self._gc_done = client.register_script(scripts.GC_DONE)
        self._sweep_lease = client.register_script(scripts.SWEEP_LEASE)
        self._sweep_progress = client.register_script(scripts.SWEEP_PROGRESS)
        self._sharded: bool | None = None

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "ss",
        socket_timeout: float = 2.0,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> Coordinator:
        # redis-py's own retries are off: one policy (ours) decides, and it only retries
        # what is safe to resend. Every script is idempotent regardless.
        url, cluster = _cluster_flag(url)
        client: Any
        if cluster:
            # Every per-session key is hash-tagged {sid}: each script touches one slot.
            client = redis.cluster.RedisCluster.from_url(
                url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_timeout,
                retry=Retry(NoBackoff(), 0),
            )
        else:
            client = redis.Redis.from_url(
                url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_timeout,
                retry=Retry(NoBackoff(), 0),
                health_check_interval=30,
            )
        return cls(client, prefix=prefix, retry=retry, socket_timeout=socket_timeout)

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:  # pragma: no cover - closing a dead pool
            pass

    def _call(self, fn: Callable[[], T], *, retry: bool = True) -> T:
        return self.retry.call(lambda: redis_call(fn)) if retry else redis_call(fn)

    # --- append protocol ---------------------------------------------------------------------

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
        (``store.id_index.Lookup.args``; empty: it has none). REINDEX (``seq`` = Redis's
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

        ``summary``: what the batch changes in the listing's summary (``store/listing.py``),
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
            redis_call(call)
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

    # --- the listing's summaries (store/listing.py) -------------------------------------------

    def install_summary(self, sid: str, inc: str, seq: int, fields: dict[str, str | int]) -> str:
        """Install a summary computed from the object store through segment ``seq`` (see
        scripts.SUMMARY): "INSTALLED", "KEPT", or "MOVED" (Redis's tail is elsewhere)."""
        args: list[Any] = [inc, seq]
        for name, value in fields.items():
            args.append(name)
            args.append(_text(value) if isinstance(value, str) else value)
        keys = [self.keys.tail(sid), self.keys.summary(sid)]
        return _s(self._call(lambda: self._summary(keys=keys, args=args)))

    def mark_deleting(self, sid: str, inc: str) -> bool:
        """Mark the summary of ``inc`` as being deleted (scripts.DELETING)."""
        return bool(self._call(lambda: self._deleting(keys=[self.keys.summary(sid)], args=[inc])))

    def summaries(self, sids: Sequence[str]) -> list[tuple[list[Any], dict[str, str]]]:
        """For each session: its tail's ``inc``, ``seq``, ``count`` and its summary hash, in
        one round trip (a pipeline; on Redis Cluster one per node holding a page's slots).
        Read-only, so a resend after a timeout is safe."""
        if not sids:
            return []

        def go() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for sid in sids:
                pipe.hmget(self.keys.tail(sid), "inc", "seq", "count")
                pipe.hgetall(self.keys.summary(sid))
            return cast(list[Any], pipe.execute())

        raw = self._call(go)
        out: list[tuple[list[Any], dict[str, str]]] = []
        for i in range(len(sids)):
            tail = [None if v is None else _s(v) for v in raw[2 * i]]
            summary = {_s(k): _read_text(v) for k, v in (raw[2 * i + 1] or {}).items()}
            out.append((tail, summary))
        return out

    def forget(self, sid: str, inc: str = "*", *, deleted_for_ms: int = 0) -> bool:
        """Drop the session's state (of ``inc`` only, unless "*"). ``deleted_for_ms``: also
        record for that long that ``inc`` was deleted, so that no rebuild of it is installed
        (a delete passes its rebuild age limit here)."""
        keys = [
            self.keys.tail(sid),
            self.keys.ids(sid),
            self.keys.job_pending(sid),
            self.keys.claim(sid),
            self.keys.deleted(sid),
            self.keys.access(sid),
            self.keys.summary(sid),
            self.keys.recent(sid),
        ]
        return bool(self._call(lambda: self._forget(keys=keys, args=[inc, deleted_for_ms])))

    # --- GC marks and jobs (other slots: never inside a per-session script) ------------------

    def gc_first_seen(self, sid: str, inc: str, now_ms: int) -> int | None:
        """When GC first saw objects of incarnation ``inc`` of a session without a header
        (marked now if never). Losing the mark only delays a deletion."""
        key, field = self.keys.gc_seen, f"{sid}/{inc}"

        def mark() -> object:
            self.client.hsetnx(key, field, now_ms)
            return self.client.hget(key, field)

        seen = self._call(mark, retry=False)
        return int(seen) if isinstance(seen, (bytes, str, int)) else None

    def gc_forget_seen(self, sid: str, incs: Sequence[str]) -> None:
        fields = [f"{sid}/{inc}" for inc in incs]
        if fields:
            self._call(lambda: self.client.hdel(self.keys.gc_seen, *fields), retry=False)

    # --- the GC schedule and sweep (compactor/schedule.py) ----------------------------------

    def gc_schedule(self, sid: str, due_ms: int) -> None:
        """GC of ``sid`` is due at ``due_ms`` (an earlier entry of the session stays)."""
        key = self.keys.gc_due(self.keys.gc_bucket(sid))
        self._call(lambda: self.client.zadd(key, {sid: due_ms}, lt=True))

    def gc_claim(self, bucket: int, now_ms: int, lease_ms: int, limit: int) -> tuple[int, list[str]]:
        """Sessions of ``bucket`` whose GC is due, leased to the caller until the deadline
        returned (scripts.GC_CLAIM)."""
        keys = [self.keys.gc_due(bucket), self.keys.gc_leased(bucket)]
        got = self._call(lambda: self._gc_claim(keys=keys, args=[now_ms, lease_ms, limit]), retry=False)
        return int(_s(got[0])), [_s(m) for m in got[1:]]

    def gc_done(self, sid: str, deadline_ms: int, again_ms: int | None = None) -> bool:
        """Give back the lease on ``sid`` (due again at ``again_ms`` if given)."""
        bucket = self.keys.gc_bucket(sid)
        keys = [self.keys.gc_due(bucket), self.keys.gc_leased(bucket)]
        args = [sid, deadline_ms, "" if again_ms is None else again_ms]
        return bool(self._call(lambda: self._gc_done(keys=keys, args=args)))

    def gc_scheduled(self, sid: str) -> tuple[int | None, int | None]:
        """(due ms, lease deadline ms) of ``sid`` in the schedule (operators, tests)."""
        bucket = self.keys.gc_bucket(sid)
        due = self._call(lambda: self.client.zscore(self.keys.gc_due(bucket), sid))
        leased = self._call(lambda: self.client.zscore(self.keys.gc_leased(bucket), sid))
        return (None if due is None else int(due)), (None if leased is None else int(leased))

    def sweep_lease(
        self, worker: str, now_ms: int, lease_ms: int, period_ms: int, *, key: str | None = None
    ) -> tuple[str, int | None] | None:
        """Take or extend the sweep's lease: (cursor, ms the last sweep finished), or None
        when another worker holds it or no sweep is due (scripts.SWEEP_LEASE). ``key``:
        another sweep's hash (the retention runner's) instead of GC's."""
        args = [worker, now_ms, lease_ms, period_ms]
        keys = [key or self.keys.gc_sweep]
        got = self._call(lambda: self._sweep_lease(keys=keys, args=args), retry=False)
        if not got or int(got[0]) != 1:
            return None
        done = _s(got[2])
        return _s(got[1]), (int(done) if done else None)

    def sweep_progress(
        self, worker: str, cursor: str, now_ms: int, lease_ms: int, *, done: bool = False,
        key: str | None = None,
    ) -> bool:
        """Record the sweep's cursor and extend the lease (or record its end and give the
        lease up); False when the lease is another worker's (scripts.SWEEP_PROGRESS)."""
        args = [worker, cursor, now_ms if done else "", now_ms, lease_ms]
        keys = [key or self.keys.gc_sweep]
        return bool(self._call(lambda: self._sweep_progress(keys=keys, args=args)))

    # --- retention (compactor/retention.py): when, never whether -------------------------------

    def retention_schedule(self, sid: str, due_ms: int, *, earlier_only: bool = False) -> None:
        """Look at ``sid``'s retention at ``due_ms`` (``earlier_only``: keep an earlier entry)."""
        key = self.keys.retention_due
        self._call(lambda: self.client.zadd(key, {sid: due_ms}, lt=earlier_only))

    def retention_unschedule(self, sid: str) -> None:
        key = self.keys.retention_due
        self._call(lambda: self.client.zrem(key, sid))

    def retention_due(self, now_ms: int, limit: int) -> list[str]:
        """Up to ``limit`` sessions whose entry is due at ``now_ms``, earliest first."""
        key = self.keys.retention_due
        got = self._call(lambda: self.client.zrangebyscore(key, "-inf", now_ms, start=0, num=limit))
        return [_s(m) for m in got]

    def retention_scheduled(self, sid: str) -> int | None:
        key = self.keys.retention_due
        got = self._call(lambda: self.client.zscore(key, sid))
        return None if got is None else int(got)

    def retention_swept(self) -> int | None:
        """When the retention runner's last sweep began (None: never, or Redis forgot)."""
        key = self.keys.retention_run
        got = self._call(lambda: self.client.hget(key, "swept"))
        return None if got is None else int(got)

    def retention_mark_swept(self, now_ms: int) -> None:
        key = self.keys.retention_run
        self._call(lambda: self.client.hset(key, "swept", now_ms))

    def retention_count(self, event: str, n: int = 1) -> None:
        key = self.keys.retention_stats
        self._call(lambda: self.client.hincrby(key, event, n))

    def retention_stats(self) -> dict[str, int]:
        key = self.keys.retention_stats
        got = self._call(lambda: self.client.hgetall(key))
        return {_s(k): int(v) for k, v in (got or {}).items()}

    def enqueue_compaction(self, sid: str, *, reason: str, ttl_s: int = 3600) -> bool:
        """Queue one job for the session unless one is already pending."""

        def go() -> bool:
            if not self.client.set(self.keys.job_pending(sid), reason, nx=True, ex=ttl_s):
                return False
            self.client.xadd(self.keys.jobs, {"session": sid, "reason": reason})
            return True

        return self._call(go, retry=False)

    def sharded_pubsub(self) -> bool:
        """Whether change notifications use sharded pub/sub (SPUBLISH / SSUBSCRIBE).

        True when every server runs Redis >= 7.0 (on a cluster, every node: the lowest
        version decides). On Redis 6.2 notifications use PUBLISH and SUBSCRIBE / PSUBSCRIBE.
        Asked once per Coordinator (INFO server). A server that refuses INFO (an ACL) gets
        PUBLISH, which every version has; an unreachable one is asked again next time."""
        if self._sharded is None:
            try:
                versions = self._call(self._server_versions)
            except BackendRefusedError as exc:
                log.warning("cannot read the Redis version (%s): notifications use PUBLISH", exc)
                versions = []
            self._sharded = bool(versions) and min(versions) >= (7, 0)
        return self._sharded

    def _server_versions(self) -> list[tuple[int, ...]]:
        if self.cluster:
            cluster: Any = self.client
            infos = [cluster.get_redis_connection(node).info("server") for node in cluster.get_nodes()]
        else:
            infos = [self.client.info("server")]
        return [parse_version(str(info.get("redis_version", "0"))) for info in infos]

    def subscribe(self, sid: str) -> Subscription:
        """The session's change notifications (one per committed segment). Errors of the
        channel arrive as ``store.errors`` like every other Redis error. SSUBSCRIBE when
        :meth:`sharded_pubsub` (on a cluster, to the node that owns the session's slot),
        else SUBSCRIBE."""
        sharded = self.sharded_pubsub()
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        channel = self.keys.changes(sid)
        self._call(lambda: pubsub.ssubscribe(channel) if sharded else pubsub.subscribe(channel))
        return Subscription(pubsub, sharded=sharded)

    def subscribe_all(self) -> AllChanges:
        """Change notifications of every session, on one connection (a server's waiters
        share it): a pattern subscription, for Redis 6.2 (PUBLISH). There are no sharded
        pattern subscriptions: with :meth:`sharded_pubsub`, use :meth:`subscribe_shards`."""
        pubsub = self.client.pubsub()  # type: ignore[no-untyped-call]
        self._call(lambda: pubsub.psubscribe(self.keys.changes_pattern()))
        return AllChanges(pubsub, self.keys)

    def subscribe_shards(self, *, refresh: bool = False) -> ShardChanges:
        """Sharded subscriptions to chosen sessions (see :class:`ShardChanges`). ``refresh``:
        on a cluster, reload which node owns which slot first (after a lost connection)."""
        if refresh and self.cluster:
            cluster: Any = self.client
            self._call(cluster.nodes_manager.initialize, retry=False)
        return ShardChanges(self.client, self.keys, self.cluster)

    def touch_access(self, sid: str, inc: str, when_ms: int) -> None:
        """Record that incarnation ``inc`` of ``sid`` was read or written at ``when_ms``."""
        self._call(lambda: self.client.set(self.keys.access(sid), f"{inc}:{when_ms}"))

    def last_access(self, sid: str, inc: str) -> int | None:
        """When incarnation ``inc`` of ``sid`` was last read or written, if Redis knows."""
        raw = self._call(lambda: self.client.get(self.keys.access(sid)))
        if raw is None:
            return None
        got_inc, _, ms = _s(raw).rpartition(":")
        if got_inc != inc:
            return None
        try:
            return int(ms)
        except ValueError:
            return None

    def purge(self) -> int:
        """Delete every key under this coordinator's prefix (tests, demos, benchmarks: never
        the store's own path). Returns how many were deleted."""

        def go() -> int:
            deleted = 0
            batch: list[Any] = []
            for key in self.client.scan_iter(match=f"{self.keys.prefix}:*", count=1000):
                batch.append(key)
                if len(batch) >= 500:
                    deleted += self._unlink(batch)
                    batch.clear()
            return deleted + (self._unlink(batch) if batch else 0)

        return self._call(go, retry=False)

    def _unlink(self, keys: list[Any]) -> int:
        if self.cluster:  # keys of several slots cannot go in one command there
            return sum(int(self.client.unlink(k)) for k in keys)
        return int(self.client.unlink(*keys))

    def ping(self) -> bool:
        return bool(self._call(self.client.ping))


def parse_version(text: str) -> tuple[int, ...]:
    """``"7.0.15"`` -> (7, 0, 15); what is not a number counts as 0."""
    return tuple(int(p) if p.isdigit() else 0 for p in text.split(".")[:3])


def _drain(pubsub: Any, timeout: float, kinds: tuple[str, ...], *, sharded: bool = False) -> list[dict[str, Any]]:
    """The messages of the types ``kinds`` waiting on ``pubsub``, blocking up to ``timeout``
    s for the first; redis-py's errors as the store's. ``sharded``: read with
    ``get_sharded_message`` (a cluster's pub/sub keeps one connection per node for SSUBSCRIBE;
    on a standalone client it is ``get_message``)."""
    out: list[dict[str, Any]] = []
    get = pubsub.get_sharded_message if sharded else pubsub.get_message

    def drain() -> None:
        msg = get(timeout=max(0.0, timeout))
        while msg is not None:
            if msg.get("type") in kinds:
                out.append(msg)
            msg = get(timeout=0)

    try:
        redis_call(drain)
    except OSError as exc:
        raise BackendUnavailableError(f"notification channel lost: {exc}") from exc
    return out


class Subscription:
    """Change notifications of one session, with redis-py's errors translated.

    Notifications only say *when* to look (a lost one delays a follower by its poll
    interval, never loses an entry): what to read is always read from the object store.
    """

    def __init__(self, pubsub: Any, *, sharded: bool = False) -> None:
        self._pubsub = pubsub
        self._sharded = sharded

    def wait(self, timeout: float) -> int | None:
        """Block up to ``timeout`` s for notifications. Returns the highest segment number
        announced (0 for a notification without one), or None if none came."""
        best: int | None = None
        kinds = ("smessage",) if self._sharded else ("message",)
        for msg in _drain(self._pubsub, timeout, kinds, sharded=self._sharded):
            try:
                seq = int(orjson.loads(msg["data"]).get("seq", 0))
            except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError):
                seq = 0
            best = seq if best is None else max(best, seq)
        return best

    def close(self) -> None:
        try:
            self._pubsub.close()
        except Exception:  # noqa: BLE001 - closing a broken connection may fail any way
            pass

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AllChanges:
    """Change notifications of every session on one pub/sub connection: :meth:`wait` returns
    the session ids announced. Like :class:`Subscription`, only says when to look.

    :attr:`live` turns True when the server confirms the pattern subscription: from then on
    every notification published reaches this connection (until it is lost)."""

    def __init__(self, pubsub: Any, keys: Keys) -> None:
        self._pubsub = pubsub
        self._keys = keys
        self.live = False

    def wait(self, timeout: float) -> list[str]:
        sids: list[str] = []
        for msg in _drain(self._pubsub, timeout, ("pmessage", "psubscribe")):
            if msg["type"] == "psubscribe":
                self.live = True
                continue
            sid = self._keys.session_of_channel(_s(msg.get("channel", "")))
            if sid is not None:
                sids.append(sid)
        return sids

    def close(self) -> None:
        try:
            self._pubsub.close()
        except Exception:  # noqa: BLE001 - closing a broken connection may fail any way
            pass


@dataclass(frozen=True, slots=True)
class ShardEvent:
    """What :meth:`ShardChanges.wait` saw: ``kind`` "message" (a session's notification) or
    "live" (the server confirmed the subscription to the session's channel)."""

    kind: str
    sid: str


class ShardChanges:
    """Sharded subscriptions (SSUBSCRIBE) to the channels of chosen sessions, on one
    connection per node that owns one of them (a standalone server: one connection).

    Not thread-safe: one thread subscribes, unsubscribes and waits. A subscription is live
    once the server confirms it (a "live" event); every notification published after that
    reaches this connection until the connection is lost. A lost connection, a refused
    command (MOVED after a slot migrated) or a subscription the server dropped on its own (the
    slot moved away) raises ``BackendUnavailableError``/``BackendRefusedError``: close this
    and make a new one (``Coordinator.subscribe_shards(refresh=True)``)."""

    def __init__(self, client: Any, keys: Keys, cluster: bool) -> None:
        self._client = client
        self._keys = keys
        self._cluster = cluster
        #: node name ("" standalone) -> its pub/sub connection
        self._pubsubs: dict[str, Any] = {}
        #: session -> the node it is subscribed on
        self._where: dict[str, str] = {}
        #: SUNSUBSCRIBEs sent and not yet confirmed, by session
        self._leaving: dict[str, int] = {}

    def _node(self, channel: str) -> str:
        if not self._cluster:
            return ""
        return str(self._client.get_node_from_key(channel).name)

    def _pubsub(self, name: str) -> Any:
        pubsub = self._pubsubs.get(name)
        if pubsub is None:
            if self._cluster:
                node = self._client.get_node(node_name=name)
                pubsub = self._client.get_redis_connection(node).pubsub()
            else:
                pubsub = self._client.pubsub()
            self._pubsubs[name] = pubsub
        return pubsub

    def subscribe(self, sid: str) -> None:
        """Send SSUBSCRIBE for ``sid``'s channel; live when :meth:`wait` says so."""

        def go() -> None:
            channel = self._keys.changes(sid)
            name = self._node(channel)
            self._pubsub(name).ssubscribe(channel)
            self._where[sid] = name

        self._io(go)

    def unsubscribe(self, sid: str) -> None:
        name = self._where.pop(sid, None)
        if name is None or name not in self._pubsubs:
            return
        self._leaving[sid] = self._leaving.get(sid, 0) + 1
        self._io(lambda: self._pubsubs[name].sunsubscribe(self._keys.changes(sid)))

    def subscribed(self) -> set[str]:
        return set(self._where)

    def wait(self, timeout: float, wake: socket.socket | None = None) -> list[ShardEvent]:
        """Events waiting on any node's connection, blocking up to ``timeout`` s for the
        first, or until ``wake`` (a socket another thread writes to) is readable."""
        events = self._read()
        if events:
            return events
        socks: list[Any] = [wake] if wake is not None else []
        for pubsub in self._pubsubs.values():
            sock = getattr(pubsub.connection, "_sock", None) if pubsub.connection else None
            if sock is not None and pubsub.subscribed:
                socks.append(sock)
        try:
            select.select(socks, [], [], max(0.0, timeout)) if socks else _sleep(timeout)
        except (OSError, ValueError) as exc:  # a socket closed under us
            raise BackendUnavailableError(f"notification channel lost: {exc}") from exc
        return self._read()

    def _read(self) -> list[ShardEvent]:
        out: list[ShardEvent] = []

        def read() -> None:
            for name, pubsub in list(self._pubsubs.items()):
                if pubsub.connection is None:
                    continue
                msg = pubsub.get_message(timeout=0)
                while msg is not None:
                    self._handle(name, msg, out)
                    msg = pubsub.get_message(timeout=0)

        self._io(read)
        return out

    def _handle(self, name: str, msg: dict[str, Any], out: list[ShardEvent]) -> None:
        kind = msg.get("type")
        if kind not in ("smessage", "ssubscribe", "sunsubscribe"):
            return  # pong
        sid = self._keys.session_of_channel(_s(msg.get("channel", "")))
        if sid is None:
            return
        if kind == "smessage":
            out.append(ShardEvent("message", sid))
        elif kind == "ssubscribe":
            out.append(ShardEvent("live", sid))
        elif self._leaving.get(sid, 0) > 0:  # our SUNSUBSCRIBE, confirmed
            self._leaving[sid] -= 1
            if not self._leaving[sid]:
                del self._leaving[sid]
        else:  # the server dropped it: the slot moved to another node
            raise BackendUnavailableError(f"the subscription to {sid} was dropped by {name or 'Redis'}")

    def _io(self, fn: Callable[[], None]) -> None:
        try:
            redis_call(fn)
        except OSError as exc:
            raise BackendUnavailableError(f"notification channel lost: {exc}") from exc

    def close(self) -> None:
        for pubsub in self._pubsubs.values():
            try:
                pubsub.close()
            except Exception:  # noqa: BLE001 - closing a broken connection may fail any way
                pass
        self._pubsubs.clear()
        self._where.clear()
        self._leaving.clear()


def _sleep(timeout: float) -> None:
    time.sleep(max(0.0, timeout))
