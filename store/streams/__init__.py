"""Durable streams: append-only logs of opaque messages (bytes or JSON) on the session log.

A stream is a session of kind ``"stream"`` (``Header.kind``): the same header, segments,
manifests, compaction, Redis tail and compare-and-set, so every invariant of the store holds
for it unchanged (nothing acknowledged is lost, a batch is all or nothing, zombies are
fenced; ``docs/design.md``). What this module adds is the stream's own rules on top:

- **One record a batch.** An append is one segment holding one record::

      {"type": "stream.batch", "id": <batch id>, "parentId": null, "at": <ms>,
       "msgs": [...], "producer": {"id", "epoch", "seq"}?, "streamSeq": "..."?, "close": true?}

  ``msgs`` are JSON values for a JSON stream and base64 strings for any other content type
  (one message per append). A record, not one entry per message, keeps the Redis id index at
  one id per append whatever the batch size.
- **Offsets** are ``<vseq:016d>_<index:016d>``: "before message ``index`` of segment
  ``vseq``, and everything after". Opaque to clients, sortable as strings, derived from the
  store's own segment numbers, and stable across compaction (a base keeps each record's
  segment number). A fork numbers its own segments after its fork point (``vseq = base +
  seq``), so offsets keep increasing across the boundary.
- **Producer state, Stream-Seq and closing are folded from the records.** Every append is a
  compare-and-set on the tail record the writer's checks were made against
  (``expected_tail_entry_id``), so a check and its append are one atomic step: a producer
  paused past any grace period, or a writer racing a close, finds the tail moved and checks
  again against the new state. Exactly-once therefore holds across server crashes and
  pauses, not only within an epoch: a re-sent producer batch has the same record id and the
  store's duplicate check returns the original result.

The package, top to bottom:

- ``model.py``: offsets, settings, the state folded from the records, results (pure values);
- ``state.py``: a stream's state brought up to its true tail through the core read path
  (``Reader.read_after``), and the segments kept behind it (``store/protocol/segment_cache.py``);
- ``reads.py``: reading from an offset, a fork's source first;
- ``collect.py``: delete (a tombstone while forks read it) and collection, with the store's
  one fork registry (``store/protocol/forks.py``);
- ``service.py``: ``Streams``, the operations: create and fork, append, read, delete.

Errors are the store's (``store/errors.py``, under ``StreamError``). Not here (the HTTP
service's business, ``store/http/``): headers, status codes, waiting.
"""

from __future__ import annotations

from store.errors import (
    ContentTypeMismatchError,
    InvalidOffsetError,
    ProducerEpochSeqError,
    ProducerSeqGapError,
    StaleEpochError,
    StreamClosedError,
    StreamError,
    StreamExistsError,
    StreamGoneError,
    StreamNotFoundError,
    StreamSeqConflictError,
    TailMismatchError,
)
from store.streams.model import (
    BATCH_TYPE,
    DEFAULT_CONTENT_TYPE,
    PI_KIND,
    SESSION_CONTENT_TYPE,
    START,
    STREAM_KIND,
    AppendOutcome,
    Batch,
    Offset,
    Producer,
    ReadResult,
    StreamConfig,
    StreamInfo,
    StreamState,
    is_json_type,
    media_type,
)
from store.streams.service import DEFAULT_CACHE_BYTES, Streams

__all__ = [
    "BATCH_TYPE",
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_CONTENT_TYPE",
    "PI_KIND",
    "SESSION_CONTENT_TYPE",
    "START",
    "STREAM_KIND",
    "AppendOutcome",
    "Batch",
    "ContentTypeMismatchError",
    "InvalidOffsetError",
    "Offset",
    "Producer",
    "ProducerEpochSeqError",
    "ProducerSeqGapError",
    "ReadResult",
    "StaleEpochError",
    "StreamClosedError",
    "StreamConfig",
    "StreamError",
    "StreamExistsError",
    "StreamGoneError",
    "StreamInfo",
    "StreamNotFoundError",
    "StreamSeqConflictError",
    "StreamState",
    "Streams",
    "TailMismatchError",
    "is_json_type",
    "media_type",
]
