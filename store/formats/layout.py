"""Object names. The only place that knows how keys are spelled.

Two layouts; a store (bucket and prefix) uses one for ever, recorded in the store
(``<prefix>_layout/record.json``, see :func:`record_key` and ``store/layouts.py``):

::

    v2, "spread" (every new store):
    <prefix>sessions/<h>=<sid>/header.json                      created once (If-None-Match: *)
    <prefix>sessions/<h>=<sid>/<inc>/seg/<seq:016d>.jsonl       the seq-th committed append batch
    <prefix>sessions/<h>=<sid>/<inc>/manifest/<gen:016d>.json   compaction manifest
    <prefix>sessions/<h>=<sid>/<inc>/base/<unique>.jsonl        compacted base
    <prefix>sessions/<h>=<sid>/<inc>/keys/<ver:08d>.json        a wrapped data key (store/protocol/keys.py)
    <prefix>streams/refs/<h>=<sid>/<inc>/<fork sid>=<token>     a stream fork (stores written before one registry)
    <prefix>retention/<h>=<sid>/<inc>/<version:016d>.json       a session's retention setting
    <prefix>trash/<h>=<sid>/<inc>.<token>                       the trash index entry of one trash event
    <prefix>forks/<h>=<sid>/<inc>/<fork sid>=<token>            a fork (pi or stream) of an incarnation

    v1, "flat" (stores written before the layout record existed): the same without ``<h>=``.

``<h>`` is :func:`shard_of` the session id: two hex digits of its blake2b, so the session
directories of a fleet whose ids are time-ordered (UUIDv7) spread evenly over 256 ranges of
the key space instead of crowding at its moving end (docs/design.md, "Object layout"). '='
never occurs in a session id, so a directory name says which layout wrote it.

``inc`` is the session's incarnation: a random id minted when the header is created. A session
that is deleted and created again under the same id gets a new incarnation and so a fresh,
empty namespace. A writer that still holds the old header can only ever write below the old
incarnation, where nobody reads: it can never leave a segment inside the new session (see
docs/design.md, "Incarnations").
"""

from __future__ import annotations

import functools
import hashlib
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from store.errors import InvalidInputError, InvalidSessionIdError

SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SEQ_WIDTH = 16

#: The layouts: v1 ``sessions/<sid>/``, v2 ``sessions/<h>=<sid>/``.
LAYOUT_FLAT = 1
LAYOUT_SPREAD = 2
LAYOUTS = (LAYOUT_FLAT, LAYOUT_SPREAD)
#: Hex digits of the shard: 2 = 256 shards (docs/design.md, "Object layout", why 256).
SHARD_WIDTH = 2
SHARDS = 16**SHARD_WIDTH
_SHARD_SEP = "="
_SPREAD_DIR = re.compile(rf"^([0-9a-f]{{{SHARD_WIDTH}}}){_SHARD_SEP}(.+)$")


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


def ref_name(fork_sid: str, token: str) -> str:
    """A fork's registration with its source: ``<fork sid>=<token>``, the token random per
    fork create (kept in the fork's header), so that each life of a fork id has its own and
    a process that drops one life's (after a pause) never drops another's. Registrations
    written before the token are the bare ``<fork sid>`` (token "")."""
    return f"{fork_sid}={token}" if token else fork_sid


def parse_ref_name(key: str) -> tuple[str, str]:
    """(fork sid, token) of a registration's key or name (``ref_name``); session ids have
    no '='."""
    fork_sid, _, token = key.rsplit("/", 1)[-1].partition("=")
    return fork_sid, token


def marker_token(marker_id: str) -> str:
    """The random part of a trash marker's entry id (``store/formats/markers.py``: its last
    dot-separated part), which names the marker's trash index entry."""
    return marker_id.rsplit(".", 1)[-1]


def new_ref_token() -> str:
    return uuid.uuid4().hex


def is_session_id(name: str) -> bool:
    return bool(SESSION_ID_RE.match(name)) and ".." not in name


@functools.lru_cache(maxsize=4096)
def shard_of(session_id: str) -> str:
    """The session's shard: the first byte of blake2b of its UTF-8 id, in hex. Fixed by the
    format (never Python's ``hash()``, which is salted per process): every process of every
    version must put a session in the same place."""
    digest = hashlib.blake2b(session_id.encode("utf-8"), digest_size=SHARD_WIDTH // 2 or 1).hexdigest()
    return digest[:SHARD_WIDTH]


def stream_session_id(name: str, key: bytes | None = None) -> str:
    """The session id a stream named ``name`` is kept under: the name itself when it is a
    valid session id (so every session is a stream of the same name), else ``ds.`` and a
    128-bit blake2b of it, keyed with the store's ``key`` (``Layout.stream_key``) so that
    nobody without the store's record can tell which name an id stands for. Stores recorded
    before the key existed keep the unkeyed hash (``key=None``) for ever."""
    if is_session_id(name):
        return name
    data = name.encode("utf-8", "surrogatepass")
    return "ds." + hashlib.blake2b(data, digest_size=16, key=key or b"").hexdigest()


def check_layout(version: object) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version not in LAYOUTS:
        raise InvalidInputError(f"layout must be one of {LAYOUTS}, not {version!r}")
    return version


def record_key(prefix: str) -> str:
    """Where a store records its layout (created once, If-None-Match; ``store/layouts.py``)."""
    return f"{_with_slash(prefix)}_layout/record.json"


def _with_slash(prefix: str) -> str:
    return prefix + "/" if prefix and not prefix.endswith("/") else prefix


@dataclass(frozen=True, slots=True)
class ParsedKey:
    """What a key under ``sessions/`` names (``Layout.parse``)."""

    session_id: str
    #: None for the header.
    incarnation: str | None
    #: "header", "segment", "manifest", "base", "key" (a wrapped data key), "withdrawn" (the
    #: fence of an incarnation being removed, ``store/protocol/incarnations.py``), or "other" (a name
    #: the store never writes).
    kind: str
    #: The segment's seq or the manifest's generation; a base's generation; a key's version.
    number: int | None = None
    #: A base's start time (ms), from its name.
    started_ms: int | None = None


_KIND_OF = {
    "seg": ("segment", ".jsonl"),
    "manifest": ("manifest", ".json"),
    "base": ("base", ".jsonl"),
    "keys": ("key", ".json"),
}
#: The name of an incarnation's fence (``Layout.withdrawn``).
WITHDRAWN = "withdrawn.json"
#: Digits of a data key record's version.
KEY_VERSION_WIDTH = 8


class Layout:
    """The keys of one store. Its version (``LAYOUT_FLAT`` or ``LAYOUT_SPREAD``) is given,
    or decided by ``decide`` (``store/layouts.py``: the store's record) on the first key
    asked for, once: every key of a process then goes through the same layout. A layout
    with neither knows only the names outside ``sessions/`` (``probe_prefix``)."""

    def __init__(
        self,
        prefix: str = "",
        version: int | None = None,
        *,
        decide: Callable[[], tuple[int, bytes | None]] | None = None,
        stream_key: bytes | None = None,
    ) -> None:
        self.prefix = _with_slash(prefix)
        self._version = None if version is None else check_layout(version)
        self._stream_key = stream_key
        self._decide = decide
        self._lock = threading.Lock()

    @property
    def version(self) -> int:
        version = self._version
        if version is None:
            with self._lock:
                if self._version is None:
                    if self._decide is None:
                        raise RuntimeError("this Layout has no version: pass one, or decide=")
                    # A failure (the object store unreachable) leaves it undecided: the next
                    # key asked for tries again, and fails as the request itself would.
                    decided, key = self._decide()
                    self._stream_key = key
                    self._version = check_layout(decided)
                version = self._version
        return version

    @property
    def stream_key(self) -> bytes | None:
        """The store's stream id key (its layout record's ``stream_key``): None for stores
        recorded before it existed, and for a layout given rather than recorded."""
        self.version  # decided with the version, from the same record
        return self._stream_key

    def stream_id(self, name: str) -> str:
        """The session id the stream or session named ``name`` is kept under
        (:func:`stream_session_id` with this store's key)."""
        return stream_session_id(name, self.stream_key)

    @property
    def decided(self) -> bool:
        return self._version is not None

    @property
    def sessions_prefix(self) -> str:
        return f"{self.prefix}sessions/"

    # --- session directories -----------------------------------------------------------------

    def dir_name(self, sid: str) -> str:
        """The session's directory below ``sessions/`` (and ``streams/refs/``)."""
        if self.version == LAYOUT_SPREAD:
            return f"{shard_of(sid)}{_SHARD_SEP}{sid}"
        return sid

    def sid_of_dir(self, name: str) -> str | None:
        """The session a directory below ``sessions/`` holds; None for a name this layout
        never writes (the other layout's, or not the store's at all)."""
        if self.version == LAYOUT_SPREAD:
            m = _SPREAD_DIR.match(name)
            if m is None or not is_session_id(m.group(2)) or shard_of(m.group(2)) != m.group(1):
                return None
            return m.group(2)
        return name if is_session_id(name) else None

    def session_prefix(self, sid: str) -> str:
        return f"{self.prefix}sessions/{self.dir_name(sid)}/"

    def header(self, sid: str) -> str:
        return f"{self.session_prefix(sid)}header.json"

    def incarnation_prefix(self, sid: str, inc: str) -> str:
        return f"{self.session_prefix(sid)}{inc}/"

    def segment_prefix(self, sid: str, inc: str) -> str:
        return f"{self.session_prefix(sid)}{inc}/seg/"

    def segment(self, sid: str, inc: str, seq: int) -> str:
        return f"{self.session_prefix(sid)}{inc}/seg/{seq:0{SEQ_WIDTH}d}.jsonl"

    def manifest_prefix(self, sid: str, inc: str) -> str:
        return f"{self.session_prefix(sid)}{inc}/manifest/"

    def manifest(self, sid: str, inc: str, gen: int) -> str:
        return f"{self.session_prefix(sid)}{inc}/manifest/{gen:0{SEQ_WIDTH}d}.json"

    def base(self, sid: str, inc: str, unique: str) -> str:
        return f"{self.session_prefix(sid)}{inc}/base/{unique}.jsonl"

    def keys_prefix(self, sid: str, inc: str) -> str:
        """Where an encrypted incarnation's wrapped data keys live (``store/protocol/keys.py``)."""
        return f"{self.session_prefix(sid)}{inc}/keys/"

    def key_record(self, sid: str, inc: str, version: int) -> str:
        return f"{self.keys_prefix(sid, inc)}{version:0{KEY_VERSION_WIDTH}d}.json"

    def withdrawn(self, sid: str, inc: str) -> str:
        """The fence written before an incarnation without a header is removed: its creator,
        finding it after writing the header, withdraws instead (``store/protocol/incarnations.py``)."""
        return f"{self.session_prefix(sid)}{inc}/{WITHDRAWN}"

    def stream_refs_prefix(self, sid: str, inc: str) -> str:
        """Where stores written before one fork registry hold stream forks' registrations:
        read and dropped by ``store/protocol/forks.py``, never written."""
        return f"{self.prefix}streams/refs/{self.dir_name(sid)}/{inc}/"

    def stream_ref(self, sid: str, inc: str, fork_sid: str, token: str = "") -> str:
        return f"{self.stream_refs_prefix(sid, inc)}{ref_name(fork_sid, token)}"

    # --- retention (store/lifecycle/retention.py): beside the sessions, so that one LIST finds every
    # session with a setting, every session in the trash, every fork of a source ---

    @property
    def retention_prefix(self) -> str:
        return f"{self.prefix}retention/"

    def retention_records_prefix(self, sid: str, inc: str) -> str:
        """Versioned retention records of an incarnation, each created once (If-None-Match):
        the highest version is the setting."""
        return f"{self.retention_prefix}{self.dir_name(sid)}/{inc}/"

    def retention_record(self, sid: str, inc: str, version: int) -> str:
        return f"{self.retention_records_prefix(sid, inc)}{version:0{SEQ_WIDTH}d}.json"

    @property
    def trash_prefix(self) -> str:
        return f"{self.prefix}trash/"

    def trash_entry(self, sid: str, inc: str, marker_id: str = "") -> str:
        """The trash's index entry of one trash event of an incarnation, ``<inc>.<token>``
        with the token of that event's trash marker (a hint: the session's log says whether
        it is in the trash). Each event has its own, so a restore that paused before dropping
        its event's entry never drops the entry of the next event (the session trashed again
        meanwhile). Written before the token was kept: ``<inc>`` (``marker_id`` "")."""
        key = self.trash_entries_prefix(sid, inc)
        return f"{key}.{marker_token(marker_id)}" if marker_id else key

    def trash_entries_prefix(self, sid: str, inc: str) -> str:
        """Every index entry of the incarnation's trash events (a LIST prefix; incarnation
        ids have one length, so no other incarnation's entries match)."""
        return f"{self.trash_prefix}{self.dir_name(sid)}/{inc}"

    def fork_refs_prefix(self, sid: str, inc: str) -> str:
        """Where the forks (pi or stream) of an incarnation register (``store/protocol/forks.py``):
        one empty object a fork, which keeps the source's data while the fork reads it."""
        return f"{self.prefix}forks/{self.dir_name(sid)}/{inc}/"

    def fork_ref(self, sid: str, inc: str, fork_sid: str, token: str = "") -> str:
        return f"{self.fork_refs_prefix(sid, inc)}{ref_name(fork_sid, token)}"

    def parse_beside(self, key: str, root: str) -> tuple[str, str, str] | None:
        """(session, incarnation, rest) of a key below ``root`` (``retention_prefix``,
        ``trash_prefix``): None for one this layout never writes."""
        if not key.startswith(root):
            return None
        name, _, rest = key[len(root):].partition("/")
        sid = self.sid_of_dir(name)
        if sid is None:
            return None
        inc, _, rest = rest.partition("/")
        return (sid, inc, rest) if inc else None

    @property
    def probe_prefix(self) -> str:
        return f"{self.prefix}_probe/"

    @property
    def record(self) -> str:
        return record_key(self.prefix)

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
        """The session, incarnation, kind and number a key names; None outside ``sessions/``
        and for a directory this store's layout never writes (so GC, which deletes only what
        parses, never touches the other layout's objects)."""
        root = self.sessions_prefix
        if not key.startswith(root):
            return None
        name, sep, rest = key[len(root) :].partition("/")
        if not sep or not name:
            return None
        sid = self.sid_of_dir(name)
        if sid is None:
            return None
        if rest == "header.json":
            return ParsedKey(sid, None, "header")
        inc, sep, sub = rest.partition("/")
        if sep and inc and sub == WITHDRAWN:
            return ParsedKey(sid, inc, "withdrawn")
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
