"""Retention: per-session TTLs, the trash, restore and purge (docs/lifecycle.md).

Nothing here deletes silently. A session whose TTL (or a store-wide policy, run by the
compactor worker: ``compactor/retention.py``) expires goes to the *trash* first: hidden from
reads, listings and appends, listed by ``sessionstore trash ls``, restorable until a grace
period has passed; only then is it *purged* with the delete protocol
(``SessionStore.delete_session``).

**The trash is in the session's own log.** Trashing appends one *marker* entry (type
``retention``, a sessionstore extension that pi ignores, like a label) whose id says the
state: ``sessionstore.trash.<purge after ms>.<random>``; a restore appends
``sessionstore.restore.<random>`` after it, a purge ``sessionstore.purge.<random>``. Each
marker is an ordinary append with an expected tail, so the append protocol's compare-and-set
(the PUT of slot n+1 with If-None-Match) arbitrates every race, whatever pauses:

- *trash vs. an append*: the trash names the tail its decision read. An append committed
  after that decision moved the tail, so the trash is a ``ConflictError`` and nothing is
  trashed on stale information (the runner decides again, and the session is not idle).
- *an append vs. the trash*: the appender refuses to append after a trash or purge marker
  (``SessionTrashedError``: CHECK returns the tail's last id). A writer whose CHECK came
  before the marker and whose PUT after finds its slot taken by the marker, rolls it forward,
  checks again and is refused. An append is never acknowledged into a trashed session, so a
  purge never loses an acknowledged append.
- *restore vs. purge*: both name the trash marker as the expected tail; exactly one of them
  takes the slot after it. A purge deletes only after its own marker was committed; a restore
  that lost is ``NotInTrashError`` (or ``SessionNotFoundError`` once the purge finished).

**Settings** are versioned objects ``retention/<dir>/<inc>/<version>.json``, each created once
with If-None-Match (the object store has no overwrite): the highest version is the setting.
Keyed by incarnation, so a session deleted and created again starts without one. Redis only
schedules when to look (``coordination.Coordinator.retention_schedule``); the records and the
log decide.

**Forks** register with their source before their header exists and check afterwards that
the source is not in the trash; a purge lists the registrations after the trash marker and
keeps a source that any live fork reads. The registrations of pi forks and stream forks are
one registry, with one argument for why no live fork is missed (``store/protocol/forks.py``).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from store.clock import iso_ms, now_ms
from store.formats.entries import prepare_batch
from store.errors import (
    BackendError,
    ConflictError,
    InvalidRetentionError,
    NotInTrashError,
    ObjectExistsError,
    ObjectNotFoundError,
    SessionHasForksError,
    SessionNotFoundError,
    SessionTrashedError,
)
from store.protocol.forks import ForkRegistry
from store.formats.layout import marker_token
from store.formats.markers import (
    _PURGE,
    _RESTORE,
    _TRASH,
    MARKER_TYPE,
    TrashMark,
    refuse_if_trashed,
    trash_mark,
)
from store.backends.object_store import StoredObject
from store.formats.records import ForkPoint

if TYPE_CHECKING:
    from store.protocol.api import Sessions
    from store.protocol.append import Appender
    from store.protocol.context import StoreContext
    from store.protocol.read import Reader, SessionData

log = logging.getLogger("sessionstore.retention")

DAY_MS = 24 * 60 * 60 * 1000
#: How long a trashed session stays restorable by default.
DEFAULT_GRACE_MS = 7 * DAY_MS


# --- the values ------------------------------------------------------------------------------


def _ms(name: str, value: Any, *, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRetentionError(f"{name} must be an integer number of milliseconds, not {value!r}")
    if value <= 0:
        raise InvalidRetentionError(f"{name} must be positive, not {value}")
    return value


@dataclass(frozen=True, slots=True)
class Retention:
    """A session's own retention (overrides the store-wide policy for that session).

    - ``Retention.sliding(ttl_ms)``: expires ``ttl_ms`` after its last activity (an append, a
      restore; reads do not count) and not before ``ttl_ms`` after it was set;
    - ``Retention.absolute(expires_at_ms)``: expires at that time (a restore after it keeps
      the session until another setting);
    - ``Retention.keep()``: never expires, whatever the store-wide policy.
    """

    ttl_ms: int | None = None
    expires_at_ms: int | None = None
    #: When the setting was made (the writer's clock), set by ``set_retention``.
    set_at_ms: int = 0

    def __post_init__(self) -> None:
        _ms("ttl_ms", self.ttl_ms)
        _ms("expires_at_ms", self.expires_at_ms)
        if self.ttl_ms is not None and self.expires_at_ms is not None:
            raise InvalidRetentionError("a retention is a TTL or an expiry time, not both")
        if isinstance(self.set_at_ms, bool) or not isinstance(self.set_at_ms, int) or self.set_at_ms < 0:
            raise InvalidRetentionError(f"set_at_ms must be epoch ms, not {self.set_at_ms!r}")

    @classmethod
    def sliding(cls, ttl_ms: int) -> Retention:
        return cls(ttl_ms=_ms("ttl_ms", ttl_ms, allow_none=False))

    @classmethod
    def absolute(cls, expires_at_ms: int) -> Retention:
        return cls(expires_at_ms=_ms("expires_at_ms", expires_at_ms, allow_none=False))

    @classmethod
    def keep(cls) -> Retention:
        return cls()

    @property
    def mode(self) -> str:
        return "sliding" if self.ttl_ms is not None else "absolute" if self.expires_at_ms is not None else "keep"

    def to_json(self) -> bytes:
        return orjson.dumps({"mode": self.mode, "ttl_ms": self.ttl_ms,
                             "expires_at_ms": self.expires_at_ms, "set_at_ms": self.set_at_ms})

    @classmethod
    def from_json(cls, data: bytes) -> Retention:
        d = orjson.loads(data)
        return cls(ttl_ms=d.get("ttl_ms"), expires_at_ms=d.get("expires_at_ms"), set_at_ms=int(d.get("set_at_ms", 0)))


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """The store-wide policy the compactor worker runs (``compactor/retention.py``)."""

    #: Trash sessions without a setting of their own that are idle this long (None: never).
    idle_ms: int | None = None
    #: How long a trashed session stays restorable before it is purged.
    grace_ms: int = DEFAULT_GRACE_MS
    #: A source held by live forks is looked at again after this long.
    fork_recheck_ms: int = 60 * 60 * 1000

    def __post_init__(self) -> None:
        _ms("idle_ms", self.idle_ms)
        if isinstance(self.grace_ms, bool) or not isinstance(self.grace_ms, int) or self.grace_ms < 0:
            raise InvalidRetentionError(f"grace_ms must be >= 0 ms, not {self.grace_ms!r}")
        _ms("fork_recheck_ms", self.fork_recheck_ms, allow_none=False)


@dataclass(frozen=True, slots=True)
class SessionView:
    """One session as the policy judges it, from one read of the object store: everything
    here is of the same instant (the tail ``last_entry_id`` at segment ``seq``)."""

    session_id: str
    incarnation: str
    kind: str
    seq: int
    last_entry_id: str
    #: When the last segment was created (object store's clock; a later compaction's time
    #: after it was merged, which only makes the session look younger).
    activity_ms: int
    #: When the session was last restored from the trash (0: never).
    restored_ms: int
    trash: TrashMark | None
    fork: ForkPoint | None
    retention: Retention | None


@dataclass(frozen=True, slots=True)
class Decision:
    """What the policy would do with one session now."""

    session_id: str
    #: "trash", "purge", "hold" (a purge waiting for forks), "wait" (due later) or "keep".
    action: str
    #: When to look again (None: never, unless a setting or activity changes).
    next_ms: int | None
    reason: str
    view: SessionView | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class TrashItem:
    session_id: str
    incarnation: str
    purge_after_ms: int
    purging: bool
    trashed_at_ms: int
    reason: str
    #: Live forks that keep it from being purged.
    forks: tuple[str, ...] = ()


def _marker(kind: str, parent: str | None, now: int, **extra: Any) -> dict[str, Any]:
    prefix = {"trash": _TRASH, "purge": _PURGE, "restore": _RESTORE}[kind]
    stamp = f"{extra['purge_after_ms']}." if "purge_after_ms" in extra else ""
    return {"type": MARKER_TYPE, "id": f"{prefix}{stamp}{uuid.uuid4().hex[:12]}",
            "parentId": parent or None, "timestamp": iso_ms(now), "action": kind, "at": now, **extra}


# --- the protocol ----------------------------------------------------------------------------


class RetentionStore:
    """Settings, trash, restore, purge and fork registrations of one ``SessionStore``."""

    def __init__(self, ctx: StoreContext, reader: Reader, appender: Appender, sessions: Sessions) -> None:
        """``sessions``: the store's public API, for what a retention step does as a user
        would (the true tail, a delete)."""
        self.ctx = ctx
        self.reader = reader
        self.appender = appender
        self.sessions = sessions
        self.layout = ctx.layout
        self.objects = ctx.objects
        self.retry = ctx.options.retry
        self.forks = ForkRegistry(ctx.layout, ctx.objects, ctx.options.retry, ctx.headers)

    # --- settings ------------------------------------------------------------------------

    def records_of(self, sid: str, inc: str) -> list[str]:
        """The keys of an incarnation's retention records (one LIST)."""
        return self._records(sid, inc)

    def _records(self, sid: str, inc: str) -> list[str]:
        prefix = self.layout.retention_records_prefix(sid, inc)
        return self.retry.call(lambda: [i.key for i in self.objects.list(prefix) if i.key.endswith(".json")])

    def get(self, sid: str, inc: str) -> Retention | None:
        """The session's own setting (None: the store-wide policy applies)."""
        for _ in range(3):
            keys = self._records(sid, inc)
            if not keys:
                return None
            try:
                obj = self._get(keys[-1])
            except ObjectNotFoundError:
                continue  # replaced by a newer version meanwhile: list again
            return Retention.from_json(obj.data)
        return None

    def put(self, sid: str, inc: str, retention: Retention, *, now: int | None = None) -> Retention:
        """Record a new setting: version n+1, created once. Two setters racing both land, in
        some order (the higher version is the setting); older versions are removed after."""
        if not isinstance(retention, Retention):
            raise InvalidRetentionError(f"retention must be a Retention, not {type(retention).__name__}")
        stamped = Retention(retention.ttl_ms, retention.expires_at_ms, now if now is not None else now_ms())
        for _ in range(10):
            keys = self._records(sid, inc)
            version = (self.layout.seq_of(keys[-1]) if keys else 0) + 1
            key = self.layout.retention_record(sid, inc, version)
            try:
                self._create(key, stamped.to_json())
            except ObjectExistsError:
                continue
            old = [k for k in keys if k != key]
            if old:
                try:
                    self._delete(old)
                except BackendError as exc:
                    log.info("old retention records of %s left (%s)", sid, exc)
            self._schedule(sid, self._first_look(stamped))
            return stamped
        raise ConflictError(sid, None, None, 0)

    def _get(self, key: str) -> StoredObject:
        return self.retry.call(lambda: self.objects.get(key))

    def _create(self, key: str, data: bytes) -> None:
        self.retry.call(lambda: self.objects.put_if_absent(key, data))

    def _delete(self, keys: list[str]) -> None:
        self.retry.call(lambda: self.objects.delete_many(keys))

    @staticmethod
    def _first_look(r: Retention) -> int | None:
        if r.ttl_ms is not None:
            return r.set_at_ms + r.ttl_ms
        return r.expires_at_ms

    def _schedule(self, sid: str, due: int | None, *, earlier_only: bool = False) -> None:
        if due is None:
            return
        try:
            self.ctx.coord.retention_schedule(sid, due, earlier_only=earlier_only)
        except BackendError as exc:
            log.warning("retention of %s not scheduled (%s): the runner's sweep finds it", sid, exc)

    # --- reading a session as the policy sees it ------------------------------------------

    def view(self, sid: str) -> tuple[SessionView, SessionData]:
        """The session's tail, last activity and setting, of one instant (one read)."""
        from store.protocol.listing import last_update_ms

        header = self.ctx.headers.read(sid)
        data = self.reader.read(sid, header, use_hint=True)
        activity = last_update_ms(self.ctx, header, data)
        restored = 0
        for entry in reversed(data.entries):
            if entry.get("type") == MARKER_TYPE and str(entry.get("id", "")).startswith(_RESTORE):
                restored = int(entry.get("at") or 0)
                break
        last = data.last_entry_id
        view = SessionView(sid, header.incarnation, header.kind, data.seq, last, activity, restored,
                           trash_mark(last), header.fork, self.get(sid, header.incarnation))
        return view, data

    def decide(self, view: SessionView, policy: RetentionPolicy, now: int) -> Decision:
        """Pure: what ``policy`` does with the session at ``now``."""
        sid = view.session_id
        if view.trash is not None:
            if view.trash.purging:
                return Decision(sid, "purge", now, "purge under way", view)
            if view.trash.purge_after_ms <= now:
                return Decision(sid, "purge", now, "grace period over", view)
            return Decision(sid, "wait", view.trash.purge_after_ms, "in the trash", view)
        if view.kind != "pi":
            return Decision(sid, "keep", None, f"a {view.kind} has its own TTL", view)
        r = view.retention
        if r is not None:
            if r.ttl_ms is not None:
                due = max(view.activity_ms, r.set_at_ms) + r.ttl_ms
                why = f"idle {r.ttl_ms} ms (its TTL)"
            elif r.expires_at_ms is not None:
                if r.expires_at_ms <= view.restored_ms:
                    return Decision(sid, "keep", None, "restored after its expiry", view)
                due, why = r.expires_at_ms, f"expired at {iso_ms(r.expires_at_ms)}"
            else:
                return Decision(sid, "keep", None, "kept (its setting)", view)
        elif policy.idle_ms is not None:
            due, why = view.activity_ms + policy.idle_ms, f"idle {policy.idle_ms} ms (store policy)"
        else:
            return Decision(sid, "keep", None, "no TTL, no policy", view)
        if due <= now:
            return Decision(sid, "trash", None, why, view)
        return Decision(sid, "wait", due, why, view)

    # --- trash -------------------------------------------------------------------------------

    def trash(self, view: SessionView, *, reason: str, grace_ms: int, now: int) -> TrashMark:
        """Move the session to the trash, unless it changed since ``view`` was read.

        The index entry goes first (a hint ``trash ls`` checks against the log), then the
        marker, appended with the tail the decision read as the expected tail and the
        incarnation it read: an append (or a delete and re-create) since the decision is a
        ``ConflictError`` (or ``SessionNotFoundError``) and nothing is trashed."""
        sid, inc = view.session_id, view.incarnation
        purge_after = now + grace_ms
        marker = _marker("trash", view.last_entry_id, now, purge_after_ms=purge_after, reason=reason)
        # This trash event's own entry (named by its marker): no other event's restore or
        # failed trash drops it.
        index = self.layout.trash_entry(sid, inc, marker["id"])
        self._put_index(index, {"reason": reason, "at": now, "purge_after_ms": purge_after})
        self.ctx.fault("retention.before_trash", session_id=sid)
        from store.formats.records import EMPTY_TAIL

        try:
            self.appender.append(sid, prepare_batch([marker]), view.last_entry_id or EMPTY_TAIL,
                                  incarnation=inc)
        except (ConflictError, SessionNotFoundError):
            self._drop_index_unless_trashed(sid, index, marker["id"])
            raise
        self._put_index(index, {"reason": reason, "at": now, "purge_after_ms": purge_after})
        self._schedule(sid, purge_after)
        self._count("trashed")
        log.info("trashed", extra={"session_id": sid, "reason": reason, "purge_after_ms": purge_after})
        return TrashMark(purge_after)

    def _put_index(self, key: str, body: dict[str, Any]) -> None:
        try:
            self.retry.call(lambda: self.objects.put_if_absent(key, orjson.dumps(body)))
        except ObjectExistsError:
            pass

    def _drop_index_unless_trashed(self, sid: str, index: str, marker_id: str) -> None:
        """Drop the entry of a trash event whose marker was refused, unless the marker is in
        the log after all (only this event's entry: another event's is its own)."""
        try:
            last = self.sessions.get_tail(sid).last_entry_id
        except SessionNotFoundError:
            last = ""
        if last != marker_id:
            self.retry.call(lambda: self.objects.delete(index))

    def trash_entries(self, sid: str, inc: str) -> list[str]:
        """The trash index entries of the incarnation, of every trash event (one LIST)."""
        prefix = self.layout.trash_entries_prefix(sid, inc)
        return self.retry.call(lambda: [i.key for i in self.objects.list(prefix)])

    def _count(self, event: str) -> None:
        try:
            self.ctx.coord.retention_count(event)
        except BackendError:
            pass  # a metric, never a reason to fail

    # --- restore -----------------------------------------------------------------------------

    def restore(self, sid: str, *, now: int | None = None) -> None:
        """Take the session out of the trash, every entry as it was. Appends a restore marker
        whose expected tail is the trash marker: a purge that began first wins (its marker
        took that slot; ``SessionTrashedError`` with ``purging``, or ``SessionNotFoundError``
        once it finished), and a purge that comes later finds the tail moved and purges
        nothing."""
        now = now_ms() if now is None else now
        header = self.ctx.headers.read(sid)
        tail = self.sessions.get_tail(sid)
        mark = trash_mark(tail.last_entry_id)
        if mark is None:
            raise NotInTrashError(sid)
        if mark.purging:
            raise SessionTrashedError(sid, mark.purge_after_ms, purging=True)
        self.ctx.fault("retention.before_restore", session_id=sid)
        marker = _marker("restore", tail.last_entry_id, now)
        try:
            self.appender.append(sid, prepare_batch([marker]), tail.last_entry_id, incarnation=header.incarnation)
        except ConflictError as exc:
            later = trash_mark(exc.actual_tail_entry_id or "")
            if later is not None and later.purging:
                raise SessionTrashedError(sid, later.purge_after_ms, purging=True) from None
            raise NotInTrashError(sid, "restored or purged meanwhile") from None
        self.ctx.fault("retention.restored", session_id=sid)
        # The entry of the trash event restored (the marker at the tail), and one written
        # before entries were named by their event: never the entry of a later event, which
        # a restore paused here would otherwise drop when the session is trashed again.
        entries = [
            self.layout.trash_entry(sid, header.incarnation, tail.last_entry_id),
            self.layout.trash_entry(sid, header.incarnation),
        ]
        try:
            self.retry.call(lambda: self.objects.delete_many(entries))
        except BackendError as exc:
            log.info("trash index entry of %s left for the runner (%s)", sid, exc)
        self._schedule(sid, now)  # the runner computes its next deadline
        self._count("restored")
        log.info("restored", extra={"session_id": sid})

    # --- purge -------------------------------------------------------------------------------

    def purge(self, view: SessionView, *, now: int, force: bool = False) -> None:
        """Delete a trashed session for good: after its grace period (``force``: before),
        never while a live fork reads it (``SessionHasForksError``).

        The purge marker takes the slot after the trash marker (expected tail), so a restore
        and a purge never both succeed; only after the marker is committed does the delete
        begin. A purge that stops after its marker leaves the session *purging*: it cannot be
        restored, and the next run deletes it."""
        sid, inc = view.session_id, view.incarnation
        mark = view.trash
        if mark is None:
            raise NotInTrashError(sid)
        if not mark.purging:
            if mark.purge_after_ms > now and not force:
                raise SessionTrashedError(sid, mark.purge_after_ms)
            forks = self.live_forks(sid, inc)
            if forks:
                raise SessionHasForksError(sid, forks)
            self.ctx.fault("retention.before_purge", session_id=sid)
            marker = _marker("purge", view.last_entry_id, now, purge_after_ms=mark.purge_after_ms)
            self.appender.append(sid, prepare_batch([marker]), view.last_entry_id, incarnation=inc)
        self.ctx.fault("retention.purge_marked", session_id=sid)
        try:
            self.sessions.delete_session(sid, incarnation=inc)
        except SessionNotFoundError:
            pass  # another purge finished it (and the id may live again: not ours to delete)
        self.ctx.fault("retention.purged_session", session_id=sid)
        keys = self.trash_entries(sid, inc)
        keys += self._records(sid, inc)
        keys += [reg.key for reg in self.forks.registrations(sid, inc)]
        if view.fork is not None:
            # Its own registration only (its token): the id may have been forked again from
            # the same source since this purge read the view.
            keys += self.forks.own_keys(view.fork.session_id, view.fork.incarnation, sid, view.fork.ref)
        self.retry.call(lambda: self.objects.delete_many(keys))
        try:
            self.ctx.coord.retention_unschedule(sid)
        except BackendError:
            pass
        self._count("purged")
        log.info("purged", extra={"session_id": sid})

    # --- forks -------------------------------------------------------------------------------

    def register_fork(self, fork: ForkPoint, fork_sid: str) -> str:
        """Register a pi fork with its source (``ForkRegistry.register``): its key."""
        return self.forks.register(fork.session_id, fork.incarnation, fork_sid, fork.ref)[0]

    def check_fork_source(self, fork: ForkPoint) -> None:
        """After the fork's header exists: its source must still be of the fork point's
        incarnation and not in the trash (the caller undoes the fork otherwise)."""
        src = self.ctx.headers.read(fork.session_id)
        if src.incarnation != fork.incarnation:
            raise SessionNotFoundError(fork.session_id)
        self.ctx.headers.forget(fork.session_id)  # get_tail below must not use a stale copy
        refuse_if_trashed(fork.session_id, self.sessions.get_tail(fork.session_id).last_entry_id)

    def live_forks(self, sid: str, inc: str) -> list[str]:
        """Forks of (``sid``, ``inc``), pi or stream, whose header exists and names that fork
        point (``ForkRegistry.live``). Called after the trash marker is committed: a pi fork
        checks its source *after* its header exists (``check_fork_source``) and undoes itself
        if the source is in the trash, so none that lives on is missed (``store/protocol/forks.py``)."""
        return self.forks.live(sid, inc)

    # --- the trash ---------------------------------------------------------------------------

    def list_trash(self) -> list[TrashItem]:
        """Every session in the trash: the index, each entry checked against the session's
        log (an entry whose session is not trashed, or of an earlier trash event, is left
        out; one item a session)."""
        found: dict[tuple[str, str], TrashItem] = {}
        prefix = self.layout.trash_prefix
        for info in self.retry.call(lambda: list(self.objects.list(prefix))):
            parsed = self.layout.parse_beside(info.key, prefix)
            if parsed is None or parsed[2]:
                continue
            inc, _, token = parsed[1].partition(".")
            item = self.trash_item(parsed[0], inc, info.key, token)
            if item is not None:
                seen = found.get((item.session_id, inc))
                if seen is None or item.trashed_at_ms > seen.trashed_at_ms:
                    found[item.session_id, inc] = item
        return list(found.values())

    def trash_item(self, sid: str, inc: str, key: str, token: str = "") -> TrashItem | None:
        """The item of index entry ``key`` (of the trash event ``token``; "" for an entry
        written before events had their own), None unless the session's log says it is in
        the trash by that event. (A purge in progress has its own marker at the tail: its
        event is not known there, and ``list_trash`` keeps the newest entry.)"""
        try:
            header = self.ctx.headers.read(sid)
            if header.incarnation != inc:
                return None
            self.ctx.headers.forget(sid)
            last = self.sessions.get_tail(sid).last_entry_id
        except SessionNotFoundError:
            return None
        mark = trash_mark(last)
        if mark is None or (token and not mark.purging and marker_token(last) != token):
            return None
        meta: dict[str, Any] = {}
        try:
            meta = orjson.loads(self.objects.get(key).data)
        except (ObjectNotFoundError, orjson.JSONDecodeError):
            pass
        return TrashItem(sid, inc, mark.purge_after_ms, mark.purging, int(meta.get("at", 0)),
                         str(meta.get("reason", "")), tuple(self.live_forks(sid, inc)))


__all__ = [
    "DEFAULT_GRACE_MS",
    "MARKER_TYPE",
    "Decision",
    "Retention",
    "RetentionPolicy",
    "RetentionStore",
    "SessionView",
    "TrashItem",
    "TrashMark",
    "trash_mark",
]
