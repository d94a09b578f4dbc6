"""The create, the fork and the delete of a session (``SessionStore.create_session``,
``branch_from_entry``, ``delete_session``).

A create writes the header exactly once (an encrypted incarnation's first data key and a
retention setting before it); a delete removes the header first, then the Redis state, then
its incarnation's objects (docs/design.md, "Delete").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from store.protocol import incarnations
from store.clock import iso_now
from store.errors import (
    BackendError,
    ConditionalWritesUnsupportedError,
    EntryNotFoundError,
    InvalidInputError,
    SessionNotFoundError,
)
from store.protocol.headers import new_header, uuid7
from store.formats.layout import check_session_id, new_ref_token
from store.protocol.listing import header_fields
from store.backends.object_store import StoredObject
from store.formats.records import ForkPoint, Header

if TYPE_CHECKING:
    from store.protocol.api import Sessions
    from store.protocol.context import StoreContext
    from store.protocol.handles import SessionHandle
    from store.protocol.tail import TailKeeper
    from store.lifecycle.retention import Retention, RetentionStore

log = logging.getLogger("sessionstore")


def create_session(
    ctx: StoreContext,
    retention: RetentionStore,
    header: Header,
    setting: Retention | None,
    *,
    again: Callable[[], Header],
) -> Header:
    """Write ``header`` (a new incarnation of a checked session id) exactly once
    (``SessionExistsError``), with its first data key (encrypted stores) and the session's
    own retention ``setting`` recorded before it, so a session that exists always has both.
    ``again``: the header of a fresh incarnation, when an encrypted one must start over.
    Returns the header written."""
    sid = header.session_id
    while True:
        if ctx.keys.enabled:
            header = _create_data_key(ctx, header)
        if setting is not None:
            retention.put(sid, header.incarnation, setting)
        ctx.fault("create.before_header", session_id=sid, incarnation=header.incarnation)
        ctx.headers.create(header)
        # An encrypted incarnation had an object (its data key) before its header: GC, or
        # an erasure, may have decided it was abandoned. The fence first, then the key,
        # in this order (store/protocol/incarnations.py argues why): either says it is being or
        # was removed, and this incarnation is withdrawn (this process's own header) and
        # the session created again. Nothing else under the session precedes a header.
        if not header.encryption or (
            not incarnations.withdrawn(ctx, sid, header.incarnation)
            and ctx.keys.has_record(sid, header.incarnation, 1)
        ):
            break
        log.warning("data key of new session %s collected before its header: created again", sid)
        delete_session(ctx, retention, sid, incarnation=header.incarnation)
        header = again()
    try:
        if header.fork is None:
            # A new session is known to be empty: say so now, or the first append would
            # pay a rebuild from the object store (LISTs and probes) to learn it. Its
            # listing summary too (a fork's, with its inherited path, comes from the
            # first rebuild: its first listing or append).
            ctx.coord.install(sid, header.incarnation, seq=0, last="", count=0, ids=())
            ctx.coord.install_summary(sid, header.incarnation, 0, header_fields(header))
    except BackendError as exc:
        log.warning("Redis not told of new session %s (%s): it rebuilds on first use", sid, exc)
    return header


def _create_data_key(ctx: StoreContext, header: Header) -> Header:
    """The header of an encrypted incarnation, its first data key created first: a header
    that says "encrypted" always has a key. The key record waits for its header as any
    object of a header-less incarnation does, and GC removes it a grace period after it
    first saw it (compactor/gc.py); so the header must follow within that time, or the key
    record could be collected under it. A create that took longer than half of
    ``rebuild_max_age_ms`` (which the GC grace exceeds) starts over with a new incarnation
    instead."""
    from store.formats.crypto import SCHEME

    bound = ctx.options.rebuild_max_age_ms / 2000
    while True:
        started = time.monotonic()
        ctx.keys.create(header.session_id, header.incarnation)
        ctx.fault("create.after_data_key", session_id=header.session_id)
        if time.monotonic() - started <= bound:
            return replace(header, encryption=SCHEME)
        header = new_header(
            header.session_id, cwd=None, pi_header=header.pi_header, fork=header.fork,
            kind=header.kind, config=header.config,
        )


def fork_session(
    ctx: StoreContext,
    retention: RetentionStore,
    sessions: Sessions,
    tails: TailKeeper,
    session_id: str,
    from_entry_id: str,
    new_session_id: str | None,
    *,
    config: dict[str, Any] | None = None,
    pi_header: dict[str, Any] | None = None,
    setting: Retention | None = None,
) -> SessionHandle:
    """Fork (``SessionStore.branch_from_entry``): a new session whose history is the source's
    path root..``from_entry_id``. Nothing is copied: the fork's header points at the source
    (its incarnation, the entry and the segment that holds it), and reading the fork reads
    that path from the source, then the fork's own segments.

    Nothing of the source is read either: the fork point's segment comes from Redis's tail
    and index (``TailKeeper.position``: the source's tail, or any entry Redis indexes, in one
    round trip; a compacted entry from the bases), or from the source's header (a fork of a
    fork at the same point: 0, the end of its inherited path, as ids are unique within a
    session), so a fork costs the same requests
    whatever the source's length. Only an entry they cannot place (Redis without the
    source's state, a segment Redis has not heard of) costs a read of the source, as a
    resume does. The fork point is committed either way: Redis names only committed
    segments, and a read only live ones."""
    sid = check_session_id(session_id)
    if pi_header is not None and not isinstance(pi_header, dict):
        raise InvalidInputError("pi_header must be a dict of the fork's extra header fields")
    header = ctx.headers.get(sid)
    if header.fork is not None and header.fork.entry_id == from_entry_id:
        at: int | None = 0  # the source's own fork point: the end of its inherited path
    else:
        at = tails.position(sid, header, from_entry_id)
    if at is None:
        source = sessions.read_session(sid)
        header = source.header
        for entry, s in zip(source.entries, source.seqs):
            if entry["id"] == from_entry_id:
                at = s
                break
        else:
            if not any(e["id"] == from_entry_id for e in source.inherited):
                raise EntryNotFoundError(sid, from_entry_id)
            at = 0
    new_sid = check_session_id(new_session_id if new_session_id is not None else uuid7())
    src_pi = header.pi_header
    fields = {
        **(pi_header or {}),
        "type": "session",
        "version": 3,
        "id": new_sid,
        "timestamp": iso_now(),
        "cwd": src_pi.get("cwd", ""),
        "parentSession": sid,
    }
    fork = ForkPoint(sid, header.incarnation, from_entry_id, at, new_ref_token())
    ctx.fault("fork.placed", session_id=sid, entry_id=from_entry_id, seq=at)
    if at > 0:
        # The fork's header, durable, names its fork point: the segment that holds it is
        # made durable first (its writer may have paused before its flush; docs/design.md,
        # "Durable before Redis hears of it").
        key = ctx.layout.segment(sid, header.incarnation, at)
        ctx.options.retry.call(lambda: ctx.objects.flush(key))
    # Registered before the header exists, checked after (store/lifecycle/retention.py,
    # ``live_forks``): a purge of the source either sees this fork or this fork sees the
    # source in the trash and undoes itself. The check also finds a source deleted (or
    # deleted and created again) since its header was read above.
    ref = retention.register_fork(fork, new_sid)
    handle = sessions.create_session(new_sid, pi_header=fields, fork=fork, config=config, retention=setting)
    try:
        retention.check_fork_source(fork)
    except SessionNotFoundError:
        sessions.delete_session(new_sid, incarnation=handle.header.incarnation)
        ctx.options.retry.call(lambda: ctx.objects.delete(ref))
        raise
    return handle


def delete_session(
    ctx: StoreContext, retention: RetentionStore, session_id: str, *, incarnation: str | None = None
) -> None:
    """Remove the session: its header, its Redis keys and every object of its incarnation.

    The header goes first: from that moment the session does not exist, and creating it
    again starts a new incarnation with its own key space, so leftovers of an interrupted
    delete (or Redis state that could not be dropped because Redis was down) can never leak
    into the new session. Only this incarnation's objects are deleted, so a delete that
    pauses never removes anything of a new life created meanwhile; leftovers of other
    incarnations are removed by GC. ``incarnation``: delete only that life of the session
    (``SessionNotFoundError`` if the header names another).
    """
    sid = check_session_id(session_id)
    header, header_object = ctx.headers.read_object(sid)
    if incarnation is not None and header.incarnation != incarnation:
        raise SessionNotFoundError(sid)
    try:
        # Listings stop trusting the summary before the header goes (scripts.DELETING).
        ctx.coord.mark_deleting(sid, header.incarnation)
    except BackendError as exc:
        log.warning("listing summary of %s not marked deleted (%s)", sid, exc)
    ctx.fault("delete.before_header", session_id=sid)
    # Only the header read above: by the time this runs (a pause, a resend after a lost
    # answer) the session may have been deleted by another process and created again, and
    # the name is then the new life's header, which an unconditional delete would take
    # with it (its acknowledged data then unreachable, and GC's). Our life's header is
    # gone either way; False changes nothing else here.
    _delete_header(ctx, sid, header_object)
    ctx.headers.forget(sid)
    ctx.fault("delete.after_header", session_id=sid)
    try:
        # Drop the state and remember the ended incarnation long enough that no rebuild
        # which read the header before this delete can be installed (scripts.INSTALL): a
        # writer that passed CHECK before the delete is then told INCARNATION/HYDRATE at
        # its COMMIT and never acknowledged for a segment in the ended incarnation.
        ctx.coord.forget(
            sid, header.incarnation, deleted_for_ms=2 * ctx.options.rebuild_max_age_ms
        )
    except BackendError as exc:
        log.warning("Redis state of deleted session %s not dropped (%s): writers that "
                    "passed their check before the delete verify against the object "
                    "store, and the next incarnation replaces the state", sid, exc)
    # Only this incarnation's objects: once the header is gone the session may be created
    # again at any moment, and a delete that pauses here (or between its LIST and its
    # deletes) must not remove a byte of the next life. Leftovers of other incarnations
    # (an interrupted delete of an earlier life) are GC's (compactor/gc.py).
    prefix = ctx.layout.incarnation_prefix(sid, header.incarnation)
    keys = [i.key for i in ctx.objects.list(prefix)]
    # And what the incarnation has beside the sessions: its retention settings and trash
    # index entries (store/lifecycle/retention.py). Keyed by the incarnation too, so never the next life's.
    try:
        keys += retention.records_of(sid, header.incarnation)
    except BackendError as exc:
        log.warning("retention records of deleted session %s left (%s)", sid, exc)
    try:
        keys += retention.trash_entries(sid, header.incarnation)
    except BackendError as exc:
        log.warning("trash index entries of deleted session %s left (%s)", sid, exc)
    ctx.fault("delete.before_objects", session_id=sid, keys=keys)
    ctx.options.retry.call(lambda: ctx.objects.delete_many(keys))


def _delete_header(ctx: StoreContext, sid: str, seen: StoredObject) -> None:
    key = ctx.layout.header(sid)
    try:
        ctx.options.retry.call(lambda: ctx.objects.delete_if_unchanged(key, seen))
    except ConditionalWritesUnsupportedError:
        # Only with allow_unsafe_backend (the probe refuses such a backend otherwise).
        log.warning("%s has no conditional delete: header of %s deleted unconditionally",
                    type(ctx.objects).__name__, sid)
        ctx.options.retry.call(lambda: ctx.objects.delete(key))


__all__ = ["create_session", "delete_session", "fork_session"]
