"""Erasure requests: remove a subject's data from every object and every Redis value, report
what was removed, and prove it is gone.

Two ways to erase, and one way to check:

- :func:`erase_sessions`: whole sessions. The store's delete (``SessionStore.delete_session``):
  the header first, then every Redis key of the session, then every object of its
  incarnation; then what is left of its other incarnations (each fenced first, so that a
  life of the same id being created meanwhile is never touched: store/protocol/incarnations.py). With encryption at rest, the session's data keys are destroyed too
  (crypto-shredding), so a copy of an object kept elsewhere (a backup, a noncurrent version)
  is ciphertext nobody can read.
- :func:`erase_matching`: the entries that mention a subject (a name, an e-mail address, a
  canary), in some sessions or all of them, leaving the rest of each session whole. Each
  matching entry is redacted (readers see a tombstone from that moment: id, parent, type and
  timestamp, so the tree stays whole), then the session is purged at once
  (``compactor.purge.purge_now``): compacted so that its bases hold the tombstones, and every
  object that still holds the content deleted without waiting for the grace period. A
  redaction drops the listing's summary in Redis (it may quote the session's first message)
  and compaction drops the recent-segments cache of what it merged, so no Redis value holds
  the content either.
- :func:`scan_for`: a byte scan of every object of the store (raw GETs, every key under the
  store's root prefix) and of every Redis key under its prefix (every value of every type), for the needle. ``sessionstore verify
  --canary TEXT`` runs it: the proof an erasure request asks for.

What an erasure covers is what was committed before it started. A writer paused before the
erasure that carries on afterwards may still append a batch that mentions the subject (its
client sent it): run the scan after the erasure, and erase again if it finds anything. A
session header (its ``cwd`` and pi header) is immutable: an entry match there is reported,
and only erasing the whole session removes it. What this cannot reach: copies outside the
store (backups, noncurrent object versions, Redis's AOF/RDB files until they are rewritten)
-- docs/lifecycle.md, "Erasure", has the operator's runbook.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from compactor.purge import purge_now
from store.protocol import incarnations
from store.errors import InvalidInputError, ObjectNotFoundError, SessionNotFoundError, SessionTrashedError
from store.formats.layout import check_session_id
from store.protocol.read import Reader

if TYPE_CHECKING:
    from compactor.compact import Compactor
    from store.protocol.context import StoreContext
    from store.core import SessionStore

log = logging.getLogger("sessionstore.compactor.erasure")

#: The reason recorded in the redactions an erasure appends.
ERASURE_REASON = "erasure request"


@dataclass(frozen=True, slots=True)
class Erased:
    """What an erasure did to one session."""

    session_id: str
    #: "deleted" (the whole session), "redacted" (matching entries), "unchanged" (nothing
    #: matched), or with ``dry_run`` what would be done ("would delete", "would redact").
    action: str
    #: Ids of the entries redacted (``erase_matching``).
    entries: tuple[str, ...] = ()
    #: Objects deleted: every object of the session, or those the purge removed.
    objects_deleted: int = 0
    #: Redis keys of the session dropped (``erase_sessions``).
    redis_keys_dropped: int = 0
    #: The session's data keys were destroyed (encryption at rest).
    keys_destroyed: bool = False
    #: What the erasure could not do, in words (e.g. the header holds the text).
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session_id, "action": self.action, "entries": list(self.entries),
            "objects_deleted": self.objects_deleted, "redis_keys_dropped": self.redis_keys_dropped,
            "keys_destroyed": self.keys_destroyed, "notes": list(self.notes),
        }


@dataclass(frozen=True, slots=True)
class Hit:
    """Where a scan found the needle."""

    #: "object" or "redis".
    where: str
    #: The object's key (under the store's prefix) or the Redis key.
    key: str
    #: For a Redis hash or sorted set, the field; for a list or stream, the position.
    part: str = ""


@dataclass(frozen=True, slots=True)
class ScanReport:
    hits: tuple[Hit, ...]
    objects_scanned: int
    redis_keys_scanned: int
    #: Objects that vanished between the listing and their GET (deleted meanwhile).
    vanished: int = 0
    notes: tuple[str, ...] = field(default=())

    @property
    def clean(self) -> bool:
        return not self.hits


def erase_sessions(store: SessionStore, session_ids: Iterable[str], *, dry_run: bool = False) -> list[Erased]:
    """Delete whole sessions, reporting the objects and Redis keys removed (and their data
    keys, when they are encrypted). A session that does not exist is reported unchanged."""
    sids = [check_session_id(s) for s in session_ids]
    if not sids:
        raise InvalidInputError("name the sessions to erase")
    ctx = store.ctx
    out: list[Erased] = []
    for sid in sids:
        objects = _session_objects(ctx, sid)
        redis_keys = _session_redis_keys(ctx, sid)
        try:
            header = store.get_header(sid)
        except SessionNotFoundError:
            note = ("no such session; leftovers removed" if objects else "no such session",)
            if objects and not dry_run:
                _remove_other_lives(ctx, sid, objects, None)
            out.append(Erased(sid, "unchanged" if not objects else ("would delete" if dry_run else "deleted"),
                              objects_deleted=0 if dry_run else len(objects), notes=note))
            continue
        if dry_run:
            out.append(Erased(sid, "would delete", objects_deleted=len(objects),
                              redis_keys_dropped=len(redis_keys)))
            continue
        destroyed = _destroy_keys(store, sid)
        store.delete_session(sid)  # the header, then this life's objects
        _remove_other_lives(ctx, sid, objects, header.incarnation)
        out.append(Erased(sid, "deleted", objects_deleted=len(objects),
                          redis_keys_dropped=len(redis_keys), keys_destroyed=destroyed))
        log.info("erased session", extra={"session_id": sid, "objects": len(objects)})
    return out


def erase_matching(
    compactor: Compactor,
    needle: str,
    session_ids: Iterable[str] | None = None,
    *,
    dry_run: bool = False,
) -> list[Erased]:
    """Redact every entry of the sessions (default: every session of the store) with
    ``needle`` in any of its strings (keys included), then purge each changed session at
    once. Entries of a fork's inherited path belong to its source, which is erased as a
    session of its own."""
    if not isinstance(needle, str) or len(needle) < 3:
        raise InvalidInputError("the text to erase must be a string of at least 3 characters")
    store = compactor.store
    if session_ids is not None:
        sids = [check_session_id(s) for s in session_ids]
    else:
        from store.protocol.listing import SessionFilter

        # Every session, those in the trash included: they are in storage until purged.
        sids = [i.session_id for i in store.iter_sessions(page_size=1000, filters=SessionFilter(trashed=None))]
    out: list[Erased] = []
    for sid in sids:
        trashed = False
        try:
            data = store.read_session(sid)
        except SessionTrashedError:
            # Hidden from readers, still in storage until its purge: it must be erased too.
            # Nothing may be appended to it (a redaction neither), so it goes whole.
            trashed = True
            data = Reader(compactor.ctx).read_session(sid)
        except SessionNotFoundError:
            out.append(Erased(sid, "unchanged", notes=("no such session",)))
            continue
        if trashed:
            if _mentions(data.header.pi_header, needle) or any(_mentions(e, needle) for e in data.entries):
                erased = erase_sessions(store, [sid], dry_run=dry_run)[0]
                note = "in the trash: erased whole (nothing can be appended there, a redaction neither)"
                out.append(Erased(sid, erased.action, objects_deleted=erased.objects_deleted,
                                  redis_keys_dropped=erased.redis_keys_dropped,
                                  keys_destroyed=erased.keys_destroyed, notes=(note,)))
            else:
                out.append(Erased(sid, "unchanged", notes=("in the trash",)))
            continue
        notes: list[str] = []
        header = data.header
        if _mentions(header.pi_header, needle) or _mentions(header.config, needle):
            notes.append("the session's header holds the text: only erasing the whole session removes it")
        from store.model.rules import REDACTION_TYPE

        redacted = {str(e.get("targetId")) for e in data.entries if e.get("type") == REDACTION_TYPE}
        matching = [
            str(e["id"]) for e in data.entries
            if e.get("type") != REDACTION_TYPE and str(e["id"]) not in redacted and _mentions(e, needle)
        ]
        if any(e.get("type") == REDACTION_TYPE and _mentions(e, needle) for e in data.entries):
            notes.append("a redaction entry holds the text (its reason): only erasing the whole session removes it")
        if not matching:
            # Redacted already (an earlier request that was not purged): purge now.
            pending = [e for e in data.entries if str(e["id"]) in redacted]
            if pending and not dry_run and _stored_anywhere(compactor.ctx, sid, needle):
                purged = purge_now(compactor, sid)
                out.append(Erased(sid, "redacted", objects_deleted=len(purged.deleted), notes=tuple(notes)))
            else:
                out.append(Erased(sid, "unchanged", notes=tuple(notes)))
            continue
        if dry_run:
            out.append(Erased(sid, "would redact", entries=tuple(matching), notes=tuple(notes)))
            continue
        last_seq = store.redact_entries(sid, matching, ERASURE_REASON).seq
        purged = purge_now(compactor, sid, through_seq=last_seq)
        out.append(Erased(sid, "redacted", entries=tuple(matching),
                          objects_deleted=len(purged.deleted), notes=tuple(notes)))
        log.info("erased entries", extra={"session_id": sid, "entries": len(matching),
                                          "objects": len(purged.deleted)})
    return out


def scan_for(store: SessionStore, needle: str | bytes, *, parallel: int = 8) -> ScanReport:
    """Every object of the store and every Redis key under its prefix, searched for
    ``needle`` (as UTF-8 bytes, and as JSON escapes it to when it holds non-ASCII text)."""
    forms = _forms(needle)
    ctx = store.ctx
    # The store's own keys: under its root prefix (a bucket may hold other stores too).
    root = ctx.layout.prefix
    objects = ctx.options.retry.call(lambda: [i.key for i in ctx.objects.list(root)])
    hits: list[Hit] = []
    vanished = 0

    def look(key: str) -> tuple[str, bool | None]:
        try:
            data = ctx.options.retry.call(lambda: ctx.objects.get(key)).data
        except ObjectNotFoundError:
            return key, None
        return key, any(f in data for f in forms) or any(f in key.encode() for f in forms)

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        for key, found in pool.map(look, objects):
            if found is None:
                vanished += 1
            elif found:
                hits.append(Hit("object", key))
    redis_keys = 0
    client = ctx.coord.client
    for key, part, value in _redis_values(client, f"{ctx.coord.keys.prefix}:*"):
        redis_keys += part == ""
        if any(f in value for f in forms):
            hits.append(Hit("redis", key.decode("utf-8", "replace"), part))
    return ScanReport(tuple(hits), len(objects), redis_keys, vanished)


# --- helpers ------------------------------------------------------------------------------


def _mentions(value: Any, needle: str) -> bool:
    if isinstance(value, str):
        return needle in value
    if isinstance(value, dict):
        return any(_mentions(k, needle) or _mentions(v, needle) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_mentions(v, needle) for v in value)
    return False


def _forms(needle: str | bytes) -> tuple[bytes, ...]:
    if isinstance(needle, bytes):
        return (needle,)
    if not isinstance(needle, str) or not needle:
        raise InvalidInputError("the text to scan for must be a non-empty string")
    import orjson

    raw = needle.encode("utf-8")
    escaped = orjson.dumps(needle)[1:-1]
    ascii_escaped = needle.encode("ascii", "backslashreplace")
    return tuple(dict.fromkeys((raw, escaped, ascii_escaped)))


def _session_objects(ctx: StoreContext, sid: str) -> list[str]:
    prefix = ctx.layout.session_prefix(sid)
    return ctx.options.retry.call(lambda: [i.key for i in ctx.objects.list(prefix)])


def _remove_other_lives(ctx: StoreContext, sid: str, objects: list[str], current: str | None) -> None:
    """Leftovers of the session's other incarnations (an earlier life whose delete was
    interrupted, a create that was withdrawn). One without a header may be a life being
    created right now: each is fenced first, and one whose header appeared meanwhile is left
    alone (store/protocol/incarnations.py)."""
    by_inc: dict[str, list[str]] = {}
    for key in objects:
        parsed = ctx.layout.parse(key)
        if parsed is not None and parsed.incarnation is not None and parsed.incarnation != current:
            by_inc.setdefault(parsed.incarnation, []).append(key)
    removable = incarnations.fence(ctx, sid, by_inc)
    incarnations.remove(ctx, sid, {inc: by_inc[inc] for inc in removable})


def _session_redis_keys(ctx: StoreContext, sid: str) -> list[bytes]:
    try:
        return list(ctx.coord.client.scan_iter(match=f"{ctx.coord.keys.prefix}:{{{sid}}}:*", count=1000))
    except Exception as exc:  # noqa: BLE001 - a report figure only: the delete itself decides
        log.warning("Redis keys of %s not counted (%s)", sid, exc)
        return []


def _destroy_keys(store: SessionStore, sid: str) -> bool:
    """Destroy the session's data keys when it is encrypted (crypto-shredding)."""
    shred = getattr(store, "shred_keys", None)
    if shred is None:
        return False
    return bool(shred(sid))


def _stored_anywhere(ctx: StoreContext, sid: str, needle: str) -> bool:
    forms = _forms(needle)
    for key in _session_objects(ctx, sid):
        try:
            data = ctx.objects.get(key).data
        except ObjectNotFoundError:
            continue
        if any(f in data for f in forms):
            return True
    return False


def _redis_values(client: Any, match: str) -> Iterator[tuple[bytes, str, bytes]]:
    """(key, "", key name) for each key, then (key, part, bytes) for each value in it."""
    for key in client.scan_iter(match=match, count=1000):
        yield key, "", key
        kind = client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        if kind == "string":
            value = client.get(key)
            if value is not None:
                yield key, "value", value
        elif kind == "hash":
            for f, v in client.hscan_iter(key, count=1000):
                yield key, f.decode("utf-8", "replace"), f + b"\x00" + v
        elif kind == "list":
            for i, v in enumerate(client.lrange(key, 0, -1)):
                yield key, str(i), v
        elif kind == "set":
            for v in client.sscan_iter(key, count=1000):
                yield key, "member", v
        elif kind == "zset":
            for v, _score in client.zscan_iter(key, count=1000):
                yield key, "member", v
        elif kind == "stream":
            for msg_id, fields in client.xrange(key, "-", "+"):
                for f, v in fields.items():
                    yield key, msg_id.decode(), f + b"\x00" + v


__all__ = ["ERASURE_REASON", "Erased", "Hit", "ScanReport", "erase_matching", "erase_sessions", "scan_for"]
