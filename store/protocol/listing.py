"""Listing sessions, page by page, without reading any session's content.

A page is one LIST of the object store's session directories (``StartAfter`` = the cursor,
``MaxKeys`` = the limit) and one Redis round trip (a pipeline) that reads each listed
session's tail (``inc``, ``seq``, ``count``) and its *summary* hash: what a session picker
shows. Requests grow with pages, not sessions, and no key is global: each summary lives in
its session's hash slot.

The summary (``Keys.summary``) holds the header's fields (created, kind, cwd, fork of, a
stream's path) and what the entries say (the name: pi's last ``session_info``; the first
user message, cut to ``PREVIEW_CHARS``; the bytes of the session's own entries; when it was
last updated), accounted through segment ``seq``:

- created with the session (``SessionStore.create_session``), at segment 0;
- moved along by COMMIT, in the same script as the tail (``scripts.COMMIT``): the writer
  computes from its batch what changes (``batch_delta``), and only a summary accounted
  through the segment before moves on, so commit order decides the name and the first
  message exactly as pi's reading does;
- rebuilt from the object store (``summary_fields``) by every hydration of the tail, and by
  a listing that finds it missing, behind the tail, or marked by a delete
  (``scripts.SUMMARY`` installs it only if the tail is at the segment it was read through).

A summary is trusted when it names the tail's incarnation at the tail's segment. Any other
session of the page is read (header GET and a rebuild): correct, one session's read slower.
docs/design.md ("Listing") argues exact-once paging and the cases above.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coordination.redis import SummaryDelta
from store.formats.entries import encode_json
from store.errors import (
    BackendError,
    InvalidInputError,
    ObjectNotFoundError,
    SessionNotFoundError,
)
from store.formats.layout import Layout, check_session_id
from store.formats.markers import MARKER_TYPE
from store.model.rules import REDACTION_TYPE
from store.backends.object_store import ObjectStore
from store.formats.records import Header, SessionInfo

if TYPE_CHECKING:
    from store.protocol.context import StoreContext
    from store.protocol.read import SessionData

log = logging.getLogger("sessionstore")

#: The longest first user message a listing shows (characters; longer ones end in "…").
PREVIEW_CHARS = 200
DEFAULT_PAGE = 100
#: One LIST page of S3 (its MaxKeys cap).
MAX_PAGE = 1000


class InvalidCursorError(InvalidInputError):
    """A listing cursor that no listing returned (not a session id)."""


@dataclass(frozen=True, slots=True)
class SessionFilter:
    """Which sessions a page keeps (applied to each page: a filtered page may hold fewer
    sessions than the limit, even none, while its cursor still moves on)."""

    #: The session's cwd equals this.
    cwd: str | None = None
    #: The session's cwd starts with this.
    cwd_prefix: str | None = None
    #: "pi" or "stream".
    kind: str | None = None
    #: Updated (or, never updated, created) at or after this time (epoch ms).
    updated_since_ms: int | None = None
    #: The name contains this (case-insensitive).
    name_contains: str | None = None
    #: Sessions in the trash: left out (False, the default), only them (True), or both (None).
    trashed: bool | None = False

    def __post_init__(self) -> None:
        for field_name in ("cwd", "cwd_prefix", "kind", "name_contains"):
            value = getattr(self, field_name)
            if value is not None and not isinstance(value, str):
                raise InvalidInputError(f"filter {field_name} must be a string")
        since = self.updated_since_ms
        if since is not None and (isinstance(since, bool) or not isinstance(since, int)):
            raise InvalidInputError("filter updated_since_ms must be an integer (epoch ms)")

    def keeps(self, info: SessionInfo) -> bool:
        if self.cwd is not None and info.cwd != self.cwd:
            return False
        if self.cwd_prefix is not None and not (info.cwd or "").startswith(self.cwd_prefix):
            return False
        if self.kind is not None and info.kind != self.kind:
            return False
        since = self.updated_since_ms
        if since is not None and (info.updated_at_ms or info.created_at_ms) < since:
            return False
        if self.trashed is not None and (info.trash_purge_after_ms is not None) != self.trashed:
            return False
        name = self.name_contains
        return name is None or name.casefold() in (info.name or "").casefold()


NO_FILTER = SessionFilter()


@dataclass(frozen=True, slots=True)
class SessionPage:
    items: list[SessionInfo]
    #: Pass as ``cursor`` for the next page; None when this was the last one.
    next_cursor: str | None


def check_limit(limit: object) -> int:
    if limit is None:
        return DEFAULT_PAGE
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidInputError(f"limit must be an integer in 1..{MAX_PAGE}, not {limit!r}")
    return limit


def check_cursor(cursor: object) -> str | None:
    if cursor is None:
        return None
    try:
        return check_session_id(cursor)
    except InvalidInputError:
        raise InvalidCursorError(f"not a listing cursor: {cursor!r}") from None


# --- what entries say ------------------------------------------------------------------------


def preview(text: str) -> str:
    """A message as a listing shows it: whitespace collapsed, at most ``PREVIEW_CHARS``.

    Every append of a user message computes it, so a long message is not collapsed whole:
    a head of it is, and when that gives more than ``PREVIEW_CHARS`` characters the answer
    is the same as the whole text's (collapsing a head gives a prefix of collapsing the
    whole, up to the head's trailing space, which ``strip`` drops)."""
    # ``str.split()`` splits at exactly the characters ``\s`` matches (``str.isspace``) and
    # drops them at both ends: the regular expression's substitution and strip, ~10x faster.
    head = text[: 4 * PREVIEW_CHARS]
    flat = " ".join(head.split())
    if len(head) < len(text) and len(flat) <= PREVIEW_CHARS:
        flat = " ".join(text.split())  # mostly whitespace: the whole text decides
    return flat if len(flat) <= PREVIEW_CHARS else flat[: PREVIEW_CHARS - 1] + "…"


def user_text(entry: dict[str, Any]) -> str | None:
    """The text of a pi user message entry (None for any other entry)."""
    if entry.get("type") != "message":
        return None
    message = entry.get("message")
    if not isinstance(message, dict) or message.get("role") != "user":
        return None
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [b.get("text") for b in content if isinstance(b, dict) and b.get("type") == "text"]
        return " ".join(p for p in parts if isinstance(p, str))
    return None


def _name_of(entry: dict[str, Any]) -> str:
    """The name a ``session_info`` entry sets ("" for none: pi trims, and an empty one
    clears it)."""
    from store.model.js import js_trim

    raw = entry.get("name")
    return js_trim(raw) if isinstance(raw, str) else ""


#: A redaction, or the trash's marker (in, out): the next listing rebuilds the summary.
#: (A tuple: an imported entry's type may be any JSON value, a list too.)
_RESETS = (REDACTION_TYPE, MARKER_TYPE)


def batch_delta(kind: str, entries: Iterable[dict[str, Any]]) -> SummaryDelta:
    """What a batch, committed after everything before it, changes in the summary."""
    if kind != "pi":
        return SummaryDelta()
    batch = list(entries)
    if any(e.get("type") in _RESETS for e in batch):
        return SummaryDelta(reset=True)
    name, first = _name_and_first(batch)
    return SummaryDelta(name=name, first=first)


def summary_delta(header: Header, entries: Iterable[dict[str, Any]]) -> SummaryDelta:
    """``batch_delta`` for a session with this header. An encrypted session's summary holds
    nothing its entries say (no name, no first message): Redis holds no plaintext of it
    (docs/encryption.md)."""
    if header.encryption:
        return SummaryDelta()
    return batch_delta(header.kind, entries)


def summary_fields(header: Header, data: SessionData, updated_ms: int) -> dict[str, str | int]:
    """The summary of a session read from the object store (everything but inc and seq)."""
    fields = header_fields(header)
    fields["bytes"] = sum(len(encode_json(e)) + 1 for e in data.entries)
    fields["updated"] = updated_ms
    from store.formats.markers import trash_mark

    mark = trash_mark(data.last_entry_id)
    if mark is not None:
        fields["trash"] = mark.purge_after_ms
    if header.kind == "pi" and not header.encryption:  # see summary_delta
        entries = data.all_entries
        if any(e.get("type") == REDACTION_TYPE for e in entries):
            from store.model.session import Session

            entries = list(Session({}, entries, validated=True).entries)  # tombstones
        name, first = _name_and_first(entries)
        if name:
            fields["name"] = name
        if first:
            fields["first"] = first
    return fields


def _name_and_first(entries: Iterable[dict[str, Any]]) -> tuple[str | None, str]:
    """The name the entries set last (None if none sets one; "" if the last clears it) and
    their first non-empty user message, as a preview ("" for none)."""
    name: str | None = None
    first = ""
    for entry in entries:
        if entry.get("type") == "session_info":
            name = _name_of(entry)
        elif not first:
            text = user_text(entry)
            if text is not None:
                first = preview(text)
    return name, first


def header_fields(header: Header) -> dict[str, str | int]:
    """The summary of a session just created (segment 0; a fork's inherited path is added
    by the first rebuild)."""
    fields: dict[str, str | int] = {"created": header.created_at_ms, "kind": header.kind}
    cwd = header.pi_header.get("cwd")
    if isinstance(cwd, str):
        fields["cwd"] = cwd
    fork = fork_of(header)
    if fork:
        fields["fork"] = fork
    if header.fork is not None:
        fields["fork_entry"] = header.fork.entry_id
    path = header.config.get("path")
    if isinstance(path, str):
        fields["path"] = path
    fields["bytes"] = 0
    fields["updated"] = header.created_at_ms
    return fields


def fork_of(header: Header) -> str | None:
    """The session this one was forked from: a session's fork point, or a stream's."""
    if header.fork is not None:
        return header.fork.session_id
    fork = header.config.get("fork")
    if isinstance(fork, dict) and isinstance(fork.get("sid"), str):
        return str(fork["sid"])
    return None


def last_update_ms(ctx: StoreContext, header: Header, data: SessionData) -> int:
    """When the session's last segment was created, by the object store's clock (one GET);
    after compaction retired it, when the manifest that merged it was; the header's time for
    a session without segments."""
    sid, inc = header.session_id, header.incarnation
    through = data.manifest.through_seq if data.manifest else 0
    if data.seq > through:
        try:
            obj = ctx.options.retry.call(lambda: ctx.objects.get(ctx.layout.segment(sid, inc, data.seq)))
            if obj.last_modified_ms is not None:
                return obj.last_modified_ms
        except ObjectNotFoundError:
            pass  # retired meanwhile: the manifest's time below
    if data.manifest is not None and data.manifest.created_ms is not None:
        return data.manifest.created_ms
    return header.created_at_ms


def info_of(sid: str, tail: list[Any], summary: dict[str, str]) -> SessionInfo | None:
    """The listing's row from Redis, or None when the summary cannot be trusted (missing,
    of another incarnation or segment than the tail, or marked by a delete)."""
    inc, seq, count = tail
    if inc is None or summary.get("inc") != inc or summary.get("seq") != seq or "deleting" in summary:
        return None
    try:
        return SessionInfo(
            session_id=sid,
            created_at_ms=int(summary["created"]),
            cwd=summary.get("cwd"),
            fork_of=summary.get("fork"),
            updated_at_ms=int(summary["updated"]),
            name=summary.get("name"),
            kind=summary.get("kind", "pi"),
            entry_count=int(count or 0),
            bytes=int(summary.get("bytes", 0)),
            first_message=summary.get("first"),
            path=summary.get("path"),
            fork_entry_id=summary.get("fork_entry"),
            trash_purge_after_ms=int(summary["trash"]) if "trash" in summary else None,
            incarnation=inc,
        )
    except (KeyError, ValueError):
        return None  # a summary that lost fields: rebuilt


def info_from_fields(
    sid: str, fields: dict[str, str | int], count: int, incarnation: str | None = None
) -> SessionInfo:
    return SessionInfo(
        session_id=sid,
        created_at_ms=int(fields["created"]),
        cwd=_opt(fields.get("cwd")),
        fork_of=_opt(fields.get("fork")),
        updated_at_ms=int(fields["updated"]),
        name=_opt(fields.get("name")),
        kind=str(fields.get("kind", "pi")),
        entry_count=count,
        bytes=int(fields.get("bytes", 0)),
        first_message=_opt(fields.get("first")),
        path=_opt(fields.get("path")),
        fork_entry_id=_opt(fields.get("fork_entry")),
        trash_purge_after_ms=int(fields["trash"]) if "trash" in fields else None,
        incarnation=incarnation,
    )


def _opt(value: str | int | None) -> str | None:
    return None if value is None else str(value)


# --- pages -----------------------------------------------------------------------------------


def session_page(
    objects: ObjectStore, layout: Layout, cursor: str | None, limit: int
) -> tuple[list[str], bool]:
    """Up to ``limit`` session ids whose directories follow ``cursor``'s (a session id, or
    None for the first page) in the backend's listing order of directory names, and whether
    more may follow. Normally one LIST (``list_dirs_page``).

    In the spread layout the directory names are ``<shard>=<sid>``, so this one LIST walks
    the shards in order, and inside a shard the sessions in order: a page that empties a
    shard continues in the next ones in the same request, up to ``limit``. No per-shard
    request, so no bound on shards a page needs: requests grow with pages only.

    A directory this layout never writes (the other layout's; not the store's) is skipped
    and logged. Should one end a page, the walk goes on past it until a page ends with a
    session or nothing follows (a request more, only then), so that the next page's cursor,
    the last session listed, lies at the end of what this page covered."""
    start = layout.dir_name(cursor) if cursor is not None else None
    sids: list[str] = []
    while True:
        names, more = objects.list_dirs_page(layout.sessions_prefix, start, limit - len(sids))
        foreign = []
        for name in names:
            sid = layout.sid_of_dir(name)
            if sid is None:
                foreign.append(name)
            else:
                sids.append(sid)
        if foreign:
            log.warning("directories not of this store's layout (v%d) skipped: %s",
                        layout.version, foreign[:5])
        if not more or not names or not foreign or names[-1] not in foreign:
            return sids, more and bool(sids)
        start = names[-1]


def all_session_ids(objects: ObjectStore, layout: Layout) -> list[str]:
    """Every session directory of the store (all pages): tools that go through the whole
    store (the CLI's verify, a full GC). Directories of another layout are left out."""
    return [sid for name in objects.list_dirs(layout.sessions_prefix)
            if (sid := layout.sid_of_dir(name)) is not None]


#: What a listing calls for a session whose summary Redis cannot vouch for: its row, read
#: from the object store, with its Redis state and summary rebuilt (``TailKeeper.summarize``).
Summarize = Callable[[str, Header], "SessionInfo | None"]


class Lister:
    def __init__(self, ctx: StoreContext, summarize: Summarize) -> None:
        self.ctx = ctx
        self.summarize = summarize

    def page(self, cursor: str | None, limit: int, filters: SessionFilter) -> SessionPage:
        ctx = self.ctx
        sids, more = ctx.options.retry.call(lambda: session_page(ctx.objects, ctx.layout, cursor, limit))
        try:
            rows = ctx.coord.summaries(sids)
        except BackendError as exc:
            log.warning("Redis unavailable for a listing (%s): reading each session", exc)
            rows = [([None, None, None], {})] * len(sids)
        infos: list[SessionInfo | None] = [info_of(sid, t, s) for sid, (t, s) in zip(sids, rows)]
        missing = [i for i, info in enumerate(infos) if info is None]
        if missing:
            ctx.fault("listing.fallback", sessions=[sids[i] for i in missing])
            for i, info in zip(missing, ctx.pool.map(lambda i: self.rebuild(sids[i]), missing)):
                infos[i] = info
        items = [info for info in infos if info is not None and filters.keeps(info)]
        return SessionPage(items, sids[-1] if more and sids else None)

    def rebuild(self, sid: str) -> SessionInfo | None:
        """A session whose summary Redis cannot vouch for: read it (None if it has no header:
        deleted, or a delete not finished), and rebuild its Redis state and summary."""
        try:
            header = self.ctx.headers.read(sid)
            return self.summarize(sid, header)
        except SessionNotFoundError:
            return None


__all__ = [
    "DEFAULT_PAGE",
    "MAX_PAGE",
    "PREVIEW_CHARS",
    "InvalidCursorError",
    "Lister",
    "SessionFilter",
    "SessionPage",
    "all_session_ids",
    "batch_delta",
    "summary_delta",
    "session_page",
]
