"""Every Redis key and channel name, behind one configurable prefix.

Per-session keys carry the hash tag ``{sid}`` so that all of a session's keys live in one
Redis Cluster slot and a Lua script may touch them together. The job queue is a global key
in another slot: it is never touched from a per-session script. The GC schedule is spread
over ``GC_BUCKETS`` keys, each with its own hash tag (a bucket's two keys share a slot), so
that it spreads over a cluster's nodes; a session's bucket is a hash of its id. There is no global session
index: listings page the object store and read each page's ``summary`` hashes in one
pipeline (``store/protocol/listing.py``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

#: Buckets of the GC schedule. Every process of a deployment must use the same number (an
#: entry in a bucket nobody drains waits for the sweep, see compactor/schedule.py).
GC_BUCKETS = 16


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = "ss"

    def tail(self, sid: str) -> str:
        """Hash: inc, seq, last, count, nids (see coordination/scripts.py)."""
        return f"{self.prefix}:{{{sid}}}:tail"

    def ids(self, sid: str) -> str:
        """Hash: entry id -> "<seq>:<content hash>"."""
        return f"{self.prefix}:{{{sid}}}:ids"

    def ids_building(self, sid: str, token: str) -> str:
        """Scratch hash a hydration fills before it is renamed onto ``ids``."""
        return f"{self.prefix}:{{{sid}}}:ids:building:{token}"

    def changes(self, sid: str) -> str:
        """Pub/sub channel: one message per committed segment."""
        return f"{self.prefix}:{{{sid}}}:changes"

    def changes_pattern(self) -> str:
        """Pattern of every session's ``changes`` channel (one subscription per process)."""
        return f"{self.prefix}:{{*}}:changes"

    def session_of_channel(self, channel: str) -> str | None:
        """The session id a ``changes`` channel names (None for another channel)."""
        head, tail = f"{self.prefix}:{{", "}:changes"
        if channel.startswith(head) and channel.endswith(tail):
            return channel[len(head) : -len(tail)]
        return None

    def recent(self, sid: str) -> str:
        """Hash: seq -> "<inc> <sha256> <schema>\\n" + the body of a committed segment not yet
        compacted. A cache for readers (the object store holds every segment), bounded per
        session by ``StoreOptions.recent_cache_bytes`` and trimmed as manifests retire slots."""
        return f"{self.prefix}:{{{sid}}}:recent"

    def access(self, sid: str) -> str:
        """String "<inc>:<ms>": when a stream was last read or written (its sliding TTL)."""
        return f"{self.prefix}:{{{sid}}}:access"

    def claim(self, sid: str) -> str:
        """String "<seq>:<nonce>": the writer about to PUT segment seq+1 (advisory, expiring)."""
        return f"{self.prefix}:{{{sid}}}:claim"

    def queue(self, sid: str) -> str:
        """Sorted set: nonce of a writer waiting for the claim -> its ticket (first come,
        first served; see scripts.CHECK)."""
        return f"{self.prefix}:{{{sid}}}:queue"

    def queue_leases(self, sid: str) -> str:
        """Hash: nonce of a waiting writer -> "<deadline ms>:<lease ms>" by Redis's clock (a
        waiter that stops asking is dropped at its deadline); field "#" the last ticket."""
        return f"{self.prefix}:{{{sid}}}:queue:leases"

    def turn(self, sid: str, nonce: str) -> str:
        """List a waiting writer blocks on: pushed when the claim is handed to it. Named from
        ``queue`` (the scripts derive it from that key), so it shares the session's slot."""
        return f"{self.queue(sid)}:{nonce}"

    def deleted(self, sid: str) -> str:
        """String: the incarnation a delete ended, kept for a while so that a rebuild that
        read the header before the delete is never installed (see scripts.INSTALL)."""
        return f"{self.prefix}:{{{sid}}}:deleted"

    def summary(self, sid: str) -> str:
        """Hash: what a session picker shows (name, first user message, bytes, updated, the
        header's fields), accounted through segment ``seq`` (see scripts.SUMMARY)."""
        return f"{self.prefix}:{{{sid}}}:summary"

    def job_pending(self, sid: str) -> str:
        """Set while a compaction job for the session is queued (de-duplicates jobs)."""
        return f"{self.prefix}:{{{sid}}}:job"

    @property
    def jobs(self) -> str:
        return f"{self.prefix}:compaction:jobs"

    @property
    def parked(self) -> str:
        return f"{self.prefix}:compaction:parked"

    @property
    def gc_seen(self) -> str:
        """Hash: "<sid>/<inc>" -> ms the GC first saw objects of a session without a header
        (losing it only delays a deletion: the clock starts again)."""
        return f"{self.prefix}:compaction:gc-seen"

    @staticmethod
    def gc_bucket(sid: str) -> int:
        return zlib.crc32(sid.encode()) % GC_BUCKETS

    def gc_due(self, bucket: int) -> str:
        """Sorted set: session id -> epoch ms when GC of the session is next due (a manifest
        retired objects whose grace period ends then; see compactor/schedule.py)."""
        return f"{self.prefix}:{{gc-{bucket}}}:due"

    def gc_leased(self, bucket: int) -> str:
        """Sorted set: session id -> deadline (ms) of the worker collecting it now. Shares
        ``gc_due``'s slot: a script moves entries between the two."""
        return f"{self.prefix}:{{gc-{bucket}}}:leased"

    @property
    def gc_sweep(self) -> str:
        """Hash: ``owner`` and ``until`` (the sweeper's lease), ``cursor`` (the last session
        swept), ``done`` (ms when the last full sweep finished)."""
        return f"{self.prefix}:compaction:gc-sweep"

    @property
    def retention_due(self) -> str:
        """Sorted set: session id -> epoch ms when its retention may be due (a TTL's deadline,
        a purge's time; early or lost entries only move work, ``compactor/retention.py``)."""
        return f"{self.prefix}:retention:due"

    @property
    def retention_run(self) -> str:
        """Hash: the retention runner's lease (scripts.SWEEP_LEASE's fields)."""
        return f"{self.prefix}:retention:run"

    @property
    def retention_stats(self) -> str:
        """Hash: counters of the trash (trashed, restored, purged, held): the metrics."""
        return f"{self.prefix}:retention:stats"

    @property
    def workers(self) -> str:
        return f"{self.prefix}:compaction:workers"
