"""Value types of the public API and of the stored header and manifest objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from store.formats.entries import DEFAULT_MAX_BATCH_BYTES, DEFAULT_MAX_BATCH_ENTRIES
from store.faults import FaultHook
from store.retry import DEFAULT_RETRY, RetryPolicy

if TYPE_CHECKING:
    from store.formats.crypto import KeyProvider
    from store.metrics import Metrics

#: Pass as ``expected_tail_entry_id`` to require that the session has no entry yet.
EMPTY_TAIL = ""

from store.formats.migrations import CURRENT_SCHEMA as HEADER_SCHEMA  # noqa: E402


@dataclass(frozen=True, slots=True)
class AppendResult:
    session_id: str
    #: The segment the batch was committed in. Without an expected tail, the batches of
    #: writers queued on the session may share it (group commit): see ``segment_entries``.
    seq: int
    last_appended_entry_id: str
    appended_count: int
    #: How many entries segment ``seq`` holds, when this call wrote it: ``appended_count``
    #: when the segment is this batch alone, more when other writers' batches rode in it
    #: after this one. None when the call found its batch committed already (a re-send, or
    #: a batch that rode in another writer's segment): the segment may hold other batches.
    #: Not part of equality: a re-sent batch's result equals the original's.
    segment_entries: int | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class TailInfo:
    session_id: str
    #: Last committed segment (0 for a new session).
    seq: int
    #: Id of the last entry committed ("" when the session has none; a fork's fork point
    #: until it has its own entries).
    last_entry_id: str
    #: Entries readable in the session, a fork's inherited path included.
    entry_count: int


@dataclass(frozen=True, slots=True)
class ForkPoint:
    session_id: str
    incarnation: str
    entry_id: str
    #: The source's segment holding ``entry_id`` when the fork was made (0 if compacted).
    seq: int
    #: The name of this fork's registration with its source (``Layout.fork_ref``), random
    #: per fork create, so that whoever drops a registration of an earlier life of the
    #: fork's id never drops this one's. "" in headers written before it was kept.
    ref: str = ""


@dataclass(frozen=True, slots=True)
class Header:
    """What ``header.json`` holds. Immutable for the life of an incarnation."""

    session_id: str
    #: Random id minted at creation; names the key space of this life of the session.
    incarnation: str
    created_at_ms: int
    #: pi's session header verbatim (``type: "session"``, version, id, timestamp, cwd, ...).
    pi_header: dict[str, Any]
    fork: ForkPoint | None = None
    schema: int = HEADER_SCHEMA
    #: What the log holds: ``"pi"`` (pi's entries, the session model on top) or ``"stream"``
    #: (opaque messages; ``store/streams/``). Written only when not ``"pi"``.
    kind: str = "pi"
    #: The kind's own settings, fixed at creation (a stream's content type, TTL, fork point,
    #: name). Empty for pi sessions.
    config: dict[str, Any] = field(default_factory=dict)
    #: The scheme sealing this incarnation's segments and bases (``store.formats.crypto.SCHEME``),
    #: whose data keys are in its key records (``store/protocol/keys.py``); None: plaintext. Fixed
    #: at creation. Written only when set.
    encryption: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = self._to_json()
        if self.kind != "pi":
            out["kind"] = self.kind
        if self.config:
            out["config"] = self.config
        if self.encryption:
            out["encryption"] = self.encryption
        return out

    def _to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "session_id": self.session_id,
            "incarnation": self.incarnation,
            "created_at_ms": self.created_at_ms,
            "fork": None
            if self.fork is None
            else {
                "session_id": self.fork.session_id,
                "incarnation": self.fork.incarnation,
                "entry_id": self.fork.entry_id,
                "seq": self.fork.seq,
                **({"ref": self.fork.ref} if self.fork.ref else {}),
            },
            "pi_header": self.pi_header,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Header":
        fork = data.get("fork")
        return cls(
            session_id=data["session_id"],
            incarnation=data["incarnation"],
            created_at_ms=int(data["created_at_ms"]),
            pi_header=data["pi_header"],
            fork=None
            if not fork
            else ForkPoint(
                fork["session_id"], fork["incarnation"], fork["entry_id"], int(fork["seq"]),
                str(fork.get("ref") or ""),
            ),
            schema=int(data.get("schema", 1)),
            kind=str(data.get("kind", "pi")),
            config=dict(data.get("config") or {}),
            encryption=str(data["encryption"]) if data.get("encryption") else None,
        )


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One row of a listing (``SessionStore.list_sessions``): what a session picker shows,
    read without reading the session's entries (``store/protocol/listing.py``)."""

    session_id: str
    created_at_ms: int
    cwd: str | None
    #: The session (or stream) this one was forked from.
    fork_of: str | None
    #: When a batch was last committed (Redis's clock; after a rebuild, the object store's
    #: time of the last segment); the creation time before the first.
    updated_at_ms: int | None = None
    #: pi's session name: the last ``session_info`` entry's, trimmed (None: no name).
    name: str | None = None
    #: ``"pi"`` or ``"stream"`` (``Header.kind``).
    kind: str = "pi"
    #: Entries readable in the session, a fork's inherited path included.
    entry_count: int = 0
    #: Bytes of the session's own entries as stored (JSONL; a fork's inherited path is the
    #: source's).
    bytes: int = 0
    #: The first non-empty user message, whitespace collapsed, at most
    #: ``store.protocol.listing.PREVIEW_CHARS`` characters (None: none yet, or not a pi session).
    first_message: str | None = None
    #: The stream path the session is served under over HTTP (``Header.config["path"]``).
    path: str | None = None
    #: A forked session's fork point: the source's entry its history ends at.
    fork_entry_id: str | None = None
    #: In the trash (docs/lifecycle.md): when it is purged (None: not in the trash). Listings
    #: leave such sessions out unless asked (``SessionFilter(trashed=None or True)``).
    trash_purge_after_ms: int | None = None
    #: The life of the session this row describes (``Header.incarnation``): what belongs to
    #: it, and not to an earlier or abandoned life of the same id, carries the same one.
    incarnation: str | None = None



@dataclass(frozen=True, slots=True)
class StoreOptions:
    """Every tunable of a ``SessionStore``; built once, never mutated."""

    redis_prefix: str = "ss"
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    max_batch_entries: int = DEFAULT_MAX_BATCH_ENTRIES
    #: Rounds an append may lose to other writers before ContentionError.
    max_rounds: int = 200
    #: Lease (ms) of the advisory claim a writer takes on the next segment number, so that
    #: concurrent writers queue in Redis, first come first served, instead of all racing the
    #: PUT (0 disables claims and the queue). It only orders writers and saves wasted
    #: requests: If-None-Match stays the arbiter; a dead writer's claim, and its place in the
    #: queue, expire after this long.
    claim_ms: int = 2000
    #: How long an append waits behind other writers' claims in total before ContentionError.
    max_wait_s: float = 60.0
    #: Group commit: a writer that takes the claim on the next segment also writes, in the
    #: same segment, the batches of up to this many writers waiting in the session's queue
    #: (each batch whole and in queue order; appends without an expected tail, to sessions
    #: that are not encrypted), so that writers queued on one session wait for about one
    #: segment's write instead of one each. 0 disables it (docs/design.md, "Group commit").
    group_commit_riders: int = 16
    #: ... and at most this many bytes of their batches in all (a larger batch never rides).
    group_commit_bytes: int = 256 * 1024
    retry: RetryPolicy = DEFAULT_RETRY
    #: Parallel GETs when loading a session.
    read_concurrency: int = 16
    #: Run the compactor's worker in a thread of this store (``store/lifecycle/maintenance.py``): it
    #: compacts and collects the store, as ``python -m compactor work`` does, from the
    #: store's first append to its ``close()``. None, the default: on for the embedded
    #: default (``from_url`` with a ``file://`` URL and no Redis URL), off otherwise;
    #: ``False`` turns it off there too (for a store a worker process maintains).
    compact: bool | None = None
    #: Queue a compaction job once this many segments (or bytes) follow the last manifest.
    compact_after_segments: int = 64
    compact_after_bytes: int = 8 * 1024 * 1024
    #: Redis keeps the segments of a session not yet compacted, up to this many bytes pending
    #: compaction (each segment at most a quarter of it), so that a resume reads its live
    #: tail in one round trip instead of one GET a segment. A cache: the object store holds
    #: every segment, and a reader uses a cached one only if its sha256 matches. 0 disables.
    recent_cache_bytes: int = 1 << 20
    #: A session's id index and recent-segments cache in Redis expire this long (ms) after
    #: its last append (0: never), so that Redis holds them for active sessions only; the
    #: next append after that rebuilds them from the object store (one read of the
    #: session), and a re-send of any earlier batch is still recognised. The tail and the
    #: listing's summary stay (a few hundred bytes a session, whatever its length).
    idle_state_ttl_ms: int = 3_600_000
    #: Skip the start-up check that the backend refuses a second create (unsafe).
    allow_unsafe_backend: bool = False
    redis_socket_timeout: float = 2.0
    #: A rebuild of a session's Redis state from the object store is installed only if it
    #: reaches Redis within this long (by Redis's clock) of its first read; an older one (its
    #: process paused in between) is refused and done again. The compactor's grace period
    #: must exceed this plus the clock skew between machines (docs/design.md, "Pauses").
    rebuild_max_age_ms: int = 60_000
    #: Force the object layout (``store.formats.layout.LAYOUT_FLAT`` = 1, ``LAYOUT_SPREAD`` = 2)
    #: instead of reading it from the store's layout record, and write no record: for tests
    #: (to write a store as versions before the record wrote it) and tools. None, the default:
    #: the store's record decides, created on first use (``store/protocol/layout_record.py``).
    layout: int | None = None
    #: Encryption at rest (docs/encryption.md): sessions created while this is set get a
    #: data key of their own, wrapped by the provider's KEK, and their entries are stored
    #: sealed (AES-256-GCM). Sessions created without it stay plaintext. A store without a
    #: provider reads plaintext sessions and refuses encrypted ones (``KeyUnavailableError``).
    key_provider: KeyProvider | None = field(default=None, compare=False)
    #: How often (s) a writer checks whether a session's data key was rotated by another
    #: process; the rotating process and the compactor use the new key at once.
    data_key_refresh_s: float = 30.0
    #: How long (s) an unwrapped data key stays in a process's memory after it was
    #: unwrapped: a shred (``SessionStore.shred_keys``) reaches every process within this.
    data_key_ttl_s: float = 300.0
    #: Called at named points of the protocols (tests inject crashes and faults here).
    fault_hook: FaultHook | None = field(default=None, compare=False)
    #: Where the store's metrics go (``store/metrics.py``): None, the process's registry
    #: (``prometheus_client.REGISTRY``) when prometheus_client is installed.
    metrics: Metrics | None = field(default=None, compare=False)
