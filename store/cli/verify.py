"""``sessionstore verify``: check what is in the bucket against the store's invariants.

Reads raw objects (not through ``read_session``, which stops at the first problem) so that one
pass reports every fault of a session:

- the header parses and names its session;
- segments after the latest manifest are numbered through_seq+1, +2, ... without a gap
  (invariant 1), and each one decodes (checksum, strict JSONL, ids);
- the latest manifest is consistent: ``seq_counts`` covers 1..through_seq, its bases exist,
  match their sha256 and hold the number of entries the manifest counts;
- entry ids are unique (a fork's inherited path included), there is no parent cycle, and pi
  could open the session;
- a fork's source still exists, in the incarnation it was forked from, with the fork point;
- Redis's tail is not ahead of the object store (invariant 4) and agrees with it when level.

Entries whose parent is not in the session are *warnings*: pi keeps them as roots and the
store accepts them when importing a pi file (append refuses them, so in a session written
only through append they point at a lost segment, which the gap check reports as a fault).
``--strict`` makes warnings fail too.

Faults are reported, never repaired. A session that changes under the check (compaction
retired an object between the listing and the read) is checked again, a few times.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from store.formats.segments import contiguous, decode_base_object, decode_segment_object
from store.errors import (
    BackendError,
    CorruptObjectError,
    InvalidInputError,
    ObjectNotFoundError,
    SessionNotFoundError,
    SessionStoreError,
)
from store.formats.layout import check_session_id
from store.protocol.listing import all_session_ids
from store.model.context import branch_path
from store.model.session import Session

if TYPE_CHECKING:
    from coordination.redis import TailState
    from store.core import SessionStore
    from store.protocol.manifest import Manifest
    from store.formats.records import Header

_ATTEMPTS = 3
_SHOW = 5


@dataclass(slots=True)
class SessionCheck:
    session_id: str
    entries: int = 0
    #: Segments after the latest manifest.
    segments: int = 0
    #: Generation of the latest manifest (0: never compacted).
    generation: int = 0
    fork_of: str | None = None
    faults: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.faults

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        return out


class _Changed(Exception):
    """An object listed a moment ago is gone: compaction moved on. Check again."""


def verify_session(store: SessionStore, session_id: str) -> SessionCheck:
    """Check one session. ``SessionNotFoundError`` if it has no header and no objects."""
    sid = check_session_id(session_id)
    for attempt in range(_ATTEMPTS):
        try:
            return _verify_once(store, sid)
        except _Changed as exc:
            if attempt == _ATTEMPTS - 1:
                check = SessionCheck(sid)
                check.faults.append(f"objects kept disappearing while checking ({exc}): is a GC running with a tiny grace period?")
                return check
    raise AssertionError("unreachable")  # pragma: no cover


def verify_store(
    store: SessionStore, session_ids: list[str] | None = None, *, concurrency: int = 8
) -> list[SessionCheck]:
    """Check the given sessions, or every session directory in the bucket."""
    if session_ids is None:
        session_ids = store.options.retry.call(lambda: all_session_ids(store.objects, store.layout))
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        return list(pool.map(lambda sid: verify_session(store, sid), session_ids))


def _get(store: SessionStore, key: str) -> Any:
    try:
        return store.options.retry.call(lambda: store.objects.get(key))
    except ObjectNotFoundError:
        raise _Changed(key) from None


def _verify_once(store: SessionStore, sid: str) -> SessionCheck:
    check = SessionCheck(sid)
    # Redis first: its tail only grows, so every segment it knows of is in the listing below.
    redis_state: Any = None
    redis_error = ""
    try:
        redis_state = store.coord.tail(sid)
    except BackendError as exc:
        redis_error = str(exc)
    session_prefix = store.layout.session_prefix(sid)
    listed = store.options.retry.call(lambda: [i.key for i in store.objects.list(session_prefix)])
    header = _check_header(store, sid, listed, check)
    if header is None:
        return check
    segments, manifests = _sort_listing(store, sid, header.incarnation, listed, check)
    latest, base_entries = _check_manifests(store, sid, header.incarnation, manifests, check)
    live, true_seq, entries = _check_segments(store, header, latest, segments, base_entries, check)
    inherited = _check_fork(store, header, check)
    _check_entries(header, inherited, entries, check)
    _check_redis(redis_state, redis_error, header, live, true_seq, entries, check)
    return check


def _check_header(store: SessionStore, sid: str, listed: list[str], check: SessionCheck) -> Header | None:
    """The session's header, or None when there is none to check against (said in ``check``).
    ``SessionNotFoundError`` if there is no header and no object either."""
    try:
        return store.get_header(sid)
    except SessionNotFoundError:
        if not listed:
            raise
        check.warnings.append(
            f"{len(listed)} objects but no header: an interrupted delete (the compactor's GC removes them)"
        )
        return None
    except CorruptObjectError as exc:
        check.faults.append(str(exc))
        return None


def _sort_listing(
    store: SessionStore, sid: str, inc: str, listed: list[str], check: SessionCheck
) -> tuple[dict[int, str], dict[int, str]]:
    """The listed segments and manifests of the incarnation, by number; objects of earlier
    incarnations and unexpected objects are warnings."""
    layout = store.layout
    session_prefix = layout.session_prefix(sid)
    header_key = layout.header(sid)
    inc_prefix = layout.incarnation_prefix(sid, inc)
    others = {
        k[len(session_prefix) :].split("/", 1)[0]
        for k in listed
        if k != header_key and not k.startswith(inc_prefix)
    }
    if others:
        check.warnings.append(
            f"objects of {len(others)} earlier incarnation(s) remain (the compactor's GC removes them)"
        )

    segments: dict[int, str] = {}
    manifests: dict[int, str] = {}
    for key in listed:
        if not key.startswith(inc_prefix):
            continue
        parsed = layout.parse(key)
        if parsed is not None and parsed.kind == "segment" and parsed.number is not None:
            segments[parsed.number] = key
        elif parsed is not None and parsed.kind == "manifest" and parsed.number is not None:
            manifests[parsed.number] = key
        elif parsed is not None and parsed.kind == "withdrawn":
            # A fence GC wrote as this incarnation got its header (store/protocol/incarnations.py):
            # harmless, and never removed while the incarnation lives.
            continue
        elif parsed is None or parsed.kind not in ("base", "key"):
            check.warnings.append(f"unexpected object {key!r}")
    return segments, manifests


def _check_manifests(
    store: SessionStore, sid: str, inc: str, manifests: dict[int, str], check: SessionCheck
) -> tuple[Manifest | None, list[dict[str, Any]]]:
    """Every listed manifest parses and names its generation; the latest one is consistent
    (``_check_latest``). Returns the latest manifest (None: never compacted) and its bases'
    entries."""
    try:
        latest = store.latest_manifest(sid, inc)
    except CorruptObjectError as exc:
        check.faults.append(str(exc))
        latest = None
    for gen, key in sorted(manifests.items()):
        if latest is not None and gen == latest.generation:
            continue
        try:
            m = store.manifests.get(sid, inc, gen)
        except CorruptObjectError as exc:
            check.faults.append(str(exc))
            continue
        if m is None:
            continue  # deleted by GC since the listing: it was retired anyway
        if m.generation != gen:
            check.faults.append(f"manifest {key!r} says generation {m.generation}")
    base_entries: list[dict[str, Any]] = []
    if latest is not None:
        base_entries = _check_latest(store, sid, inc, latest, check)
    return latest, base_entries


def _check_latest(
    store: SessionStore, sid: str, inc: str, latest: Manifest, check: SessionCheck
) -> list[dict[str, Any]]:
    """The latest manifest: ``seq_counts`` covers 1..through_seq, it names its session and
    incarnation, its bases exist, decode and hold the entries it counts. Returns them."""
    base_entries: list[dict[str, Any]] = []
    check.generation = latest.generation
    mkey = store.layout.manifest(sid, inc, latest.generation)
    raw = latest.raw
    if len(latest.seq_counts) != latest.through_seq:
        check.faults.append(
            f"manifest {mkey!r}: seq_counts has {len(latest.seq_counts)} entries for "
            f"through_seq {latest.through_seq}"
        )
    for name, want in (("session_id", sid), ("incarnation", inc)):
        if name in raw and raw[name] != want:
            check.faults.append(f"manifest {mkey!r} names {name} {raw[name]!r}")
    for base in latest.bases:
        bkey = str(base.get("key", ""))
        try:
            obj = store.options.retry.call(functools.partial(store.objects.get, bkey))
        except ObjectNotFoundError:
            check.faults.append(f"manifest {mkey!r} names base {bkey!r}, which does not exist")
            continue
        try:
            got = decode_base_object(obj, base, store.keys.open)
        except CorruptObjectError as exc:
            check.faults.append(str(exc))
            continue
        if isinstance(base.get("entries"), int) and base["entries"] != len(got):
            check.faults.append(
                f"base {bkey!r} holds {len(got)} entries, the manifest says {base['entries']}"
            )
        base_entries.extend(got)
    if not check.faults and len(base_entries) != sum(latest.seq_counts):
        check.faults.append(
            f"bases of {mkey!r} hold {len(base_entries)} entries, its seq_counts add up to "
            f"{sum(latest.seq_counts)}"
        )
    return base_entries


def _check_segments(
    store: SessionStore,
    header: Header,
    latest: Manifest | None,
    segments: dict[int, str],
    base_entries: list[dict[str, Any]],
    check: SessionCheck,
) -> tuple[list[int], int, list[dict[str, Any]]]:
    """Segments after the manifest: numbered without a gap, each one decodes. Returns their
    numbers, the true tail (the last segment before a gap) and the session's own entries
    (the bases' first)."""
    first = latest.through_seq + 1 if latest else 1
    live = sorted(s for s in segments if s >= first)
    run = len(contiguous(live, first))
    if run != len(live):
        have = set(live)
        missing = [n for n in range(first, live[-1] + 1) if n not in have]
        shown = ", ".join(str(n) for n in missing[:_SHOW]) + (" ..." if len(missing) > _SHOW else "")
        check.faults.append(
            f"segment gap: {len(missing)} missing between {first} and {live[-1]} ({shown}); "
            "readers stop at the gap"
        )
    true_seq = first - 1 + run
    entries: list[dict[str, Any]] = list(base_entries)
    for s in live:
        obj = _get(store, segments[s])
        try:
            entries.extend(decode_segment_object(obj, header.schema, store.keys.open))
        except CorruptObjectError as exc:
            check.faults.append(str(exc))
    check.segments = len(live)
    return live, true_seq, entries


def _check_fork(store: SessionStore, header: Header, check: SessionCheck) -> list[dict[str, Any]]:
    """A fork's source exists, in the incarnation it was forked from, with the fork point.
    Returns the inherited path (empty for a session that is not a fork)."""
    inherited: list[dict[str, Any]] = []
    if header.fork is None:
        return inherited
    fork = header.fork
    check.fork_of = fork.session_id
    try:
        src_header = store.get_header(fork.session_id)
        if src_header.incarnation != fork.incarnation:
            check.faults.append(
                f"fork source {fork.session_id!r} was deleted (it has another incarnation now)"
            )
        else:
            src = store.read_session(fork.session_id)
            by_id = {str(e["id"]): e for e in src.all_entries}
            inherited = [dict(e) for e in branch_path(by_id, fork.entry_id)]
            if not inherited:
                check.faults.append(
                    f"fork point {fork.entry_id!r} is not in the source {fork.session_id!r}"
                )
    except SessionNotFoundError:
        check.faults.append(f"fork source {fork.session_id!r} does not exist")
    except SessionStoreError as exc:
        check.faults.append(f"fork source {fork.session_id!r} unreadable: {exc}")
    return inherited


def _check_entries(
    header: Header, inherited: list[dict[str, Any]], entries: list[dict[str, Any]], check: SessionCheck
) -> None:
    """Ids unique (the inherited path included), parents present (else a warning), and pi
    could open the session."""
    seen: set[str] = set()
    dups: list[str] = []
    for e in inherited + entries:
        eid = str(e.get("id"))
        if eid in seen:
            dups.append(eid)
        seen.add(eid)
    if dups:
        check.faults.append(f"{len(dups)} duplicate entry ids: {', '.join(dups[:_SHOW])}")
    orphans = [
        str(e.get("id"))
        for e in entries
        if isinstance(e.get("parentId"), str) and e["parentId"] and e["parentId"] not in seen
    ]
    if orphans:
        check.warnings.append(
            f"{len(orphans)} entries whose parent is not in the session (pi shows them as roots): "
            + ", ".join(orphans[:_SHOW])
        )
    if not dups:
        try:
            Session(header.pi_header, inherited + entries)
        except InvalidInputError as exc:
            check.faults.append(f"pi could not open the session: {exc}")
    check.entries = len(inherited) + len(entries)


def _check_redis(
    redis_state: TailState | None,
    redis_error: str,
    header: Header,
    live: list[int],
    true_seq: int,
    entries: list[dict[str, Any]],
    check: SessionCheck,
) -> None:
    """Redis's tail is not ahead of the object store (invariant 4) and agrees with it when
    level."""
    inc = header.incarnation
    if redis_error:
        check.warnings.append(f"Redis not compared: {redis_error}")
    elif redis_state is not None and redis_state.inc == inc and (not live or live[-1] == true_seq):
        if redis_state.seq > true_seq:
            check.faults.append(
                f"Redis's tail (segment {redis_state.seq}) is ahead of the object store "
                f"(segment {true_seq})"
            )
        elif redis_state.seq == true_seq and not check.faults:
            last = str(entries[-1]["id"]) if entries else (header.fork.entry_id if header.fork else "")
            if redis_state.last != last or redis_state.count != check.entries:
                check.faults.append(
                    f"Redis's tail (last {redis_state.last!r}, {redis_state.count} entries) disagrees "
                    f"with the object store (last {last!r}, {check.entries} entries) at segment {true_seq}"
                )
