"""Object names. The only place that knows how keys are spelled.

::

    <prefix>sessions/<sid>/header.json                          created once (If-None-Match: *)
    <prefix>sessions/<sid>/<inc>/seg/<seq:016d>.jsonl           the seq-th committed append batch
    <prefix>sessions/<sid>/<inc>/manifest/<gen:016d>.json       compaction manifest
    <prefix>sessions/<sid>/<inc>/base/<unique>.jsonl            compacted base

``inc`` is the session's incarnation: a random id minted when the header is created. A session
that is deleted and created again under the same id gets a new incarnation and so a fresh,
empty namespace. A writer that still holds the old header can only ever write below the old
incarnation, where nobody reads: it can never leave a segment inside the new session (see
docs/design.md, "Incarnations").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from store.errors import InvalidSessionIdError

SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SEQ_WIDTH = 16


def check_session_id(session_id: object) -> str:
    if not isinstance(session_id, str):
        raise InvalidSessionIdError(session_id, "not a string")
    if not SESSION_ID_RE.match(session_id):
        raise InvalidSessionIdError(
            session_id, "must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
        )
    if ".." in session_id:
        raise InvalidSessionIdError(session_id, "must not contain '..'")
    return session_id


@dataclass(frozen=True, slots=True)
class ParsedKey:
    """What a key under ``sessions/`` names (``Layout.parse``)."""

    session_id: str
    #: None for the header.
    incarnation: str | None
    #: "header", "segment", "manifest", "base", or "other" (a name the store never writes).
    kind: str
    #: The segment's seq or the manifest's generation; a base's generation.
    number: int | None = None
    #: A base's start time (ms), from its name.
    started_ms: int | None = None


_KIND_OF = {"seg": ("segment", ".jsonl"), "manifest": ("manifest", ".json"), "base": ("base", ".jsonl")}


class Layout:
    def __init__(self, prefix: str = "") -> None:
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        self.prefix = prefix

    @property
    def sessions_prefix(self) -> str:
        return f"{self.prefix}sessions/"

    def session_prefix(self, sid: str) -> str:
        return f"{self.prefix}sessions/{sid}/"

    def header(self, sid: str) -> str:
        return f"{self.prefix}sessions/{sid}/header.json"

    def incarnation_prefix(self, sid: str, inc: str) -> str:
        return f"{self.prefix}sessions/{sid}/{inc}/"

    def segment_prefix(self, sid: str, inc: str) -> str:
        return f"{self.prefix}sessions/{sid}/{inc}/seg/"

    def segment(self, sid: str, inc: str, seq: int) -> str:
        return f"{self.prefix}sessions/{sid}/{inc}/seg/{seq:0{SEQ_WIDTH}d}.jsonl"

    def manifest_prefix(self, sid: str, inc: str) -> str:
        return f"{self.prefix}sessions/{sid}/{inc}/manifest/"

    def manifest(self, sid: str, inc: str, gen: int) -> str:
        return f"{self.prefix}sessions/{sid}/{inc}/manifest/{gen:0{SEQ_WIDTH}d}.json"

    def base(self, sid: str, inc: str, unique: str) -> str:
        return f"{self.prefix}sessions/{sid}/{inc}/base/{unique}.jsonl"

    def stream_refs_prefix(self, sid: str, inc: str) -> str:
        """Where the forks of a stream's incarnation register (``store/streams.py``): one
        empty object a fork, which keeps the source's data while the fork reads it."""
        return f"{self.prefix}streams/refs/{sid}/{inc}/"

    def stream_ref(self, sid: str, inc: str, fork_sid: str) -> str:
        return f"{self.prefix}streams/refs/{sid}/{inc}/{fork_sid}"

    @property
    def probe_prefix(self) -> str:
        return f"{self.prefix}_probe/"

    @staticmethod
    def base_stem(generation: int, started_ms: int, token: str) -> str:
        """The unique part of the bases one compaction attempt writes for ``generation``;
        each base is ``<stem>-<part:05d>``. GC reads the generation and the start back."""
        return f"{generation:0{SEQ_WIDTH}d}-{started_ms}-{token}"

    @staticmethod
    def seq_of(key: str) -> int:
        """The number in a segment or manifest key."""
        name = key.rsplit("/", 1)[-1]
        return int(name.split(".", 1)[0])

    def parse(self, key: str) -> ParsedKey | None:
        """The session, incarnation, kind and number a key names; None outside ``sessions/``."""
        root = self.sessions_prefix
        if not key.startswith(root):
            return None
        sid, sep, rest = key[len(root) :].partition("/")
        if not sep or not sid:
            return None
        if rest == "header.json":
            return ParsedKey(sid, None, "header")
        inc, sep, sub = rest.partition("/")
        kind_dir, sep2, name = sub.partition("/")
        if not sep or not sep2 or "/" in name or kind_dir not in _KIND_OF:
            return ParsedKey(sid, inc or None, "other")
        kind, suffix = _KIND_OF[kind_dir]
        if not name.endswith(suffix):
            return ParsedKey(sid, inc, "other")
        stem = name[: -len(suffix)]
        if kind == "base":
            parts = stem.split("-")
            if len(parts) == 4 and parts[0].isdigit() and parts[1].isdigit():
                return ParsedKey(sid, inc, kind, int(parts[0]), int(parts[1]))
            return ParsedKey(sid, inc, kind)
        if not stem.isdigit():
            return ParsedKey(sid, inc, "other")
        return ParsedKey(sid, inc, kind, int(stem))
