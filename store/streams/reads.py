"""Reading a stream from an offset: its fork source's messages first, then its own.

A read is made against a state already brought up to the stream's tail (``StreamStates``),
so it knows which segments hold ``[offset, tail)``: those kept in the segment cache are not
fetched again, the others come through the core read path (``Reader.read_after`` with
``through``: segments known to exist, no probe). A budget of bytes bounds one read (always
at least one batch); the caller continues from ``next_offset``.
"""

from __future__ import annotations

import base64
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from store.errors import InvalidOffsetError, StreamGoneError, StreamNotFoundError
from store.protocol.headers import HeaderStore
from store.model.rules import REDACTION_TYPE
from store.protocol.read import Reader
from store.protocol.segment_cache import SegmentCache
from store.streams.model import Batch, Offset, ReadResult, StreamConfig, StreamState, config_of, message_size

#: Most bytes of messages one read returns by default.
DEFAULT_MAX_BYTES = 4 << 20
#: Segments a read fetches in one parallel round: a long read goes window by window.
READ_WINDOW = 32
#: Bytes of binary messages a process keeps decoded (``DecodedMessages``).
DECODED_BYTES = 64 << 20


class DecodedMessages:
    """The messages of a binary stream's segments, decoded from the base64 they are stored
    in, kept by segment: a segment never changes within an incarnation (``SegmentCache``), so
    neither do its messages, and every catch-up read of a binary stream would otherwise
    decode them again (a tenth of a second of CPU for 12 MiB here). Least recently used
    segments go first past ``max_bytes``. Thread-safe (two readers may decode one segment
    at once; either result is the same)."""

    def __init__(self, max_bytes: int = DECODED_BYTES) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[str, str, int], list[bytes]] = OrderedDict()
        self._bytes = 0

    def of(self, sid: str, inc: str, seq: int, encoded: Sequence[str]) -> list[bytes]:
        key = (sid, inc, seq)
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
                return kept
        decoded = [base64.b64decode(m) for m in encoded]
        size = sum(len(m) for m in decoded)
        if size <= self.max_bytes:
            with self._lock:
                if key not in self._kept:
                    self._kept[key] = decoded
                    self._bytes += size
                while self._bytes > self.max_bytes:
                    _, old = self._kept.popitem(last=False)
                    self._bytes -= sum(len(m) for m in old)
        return decoded

    @property
    def kept_bytes(self) -> int:
        return self._bytes

    def drop(self, sid: str) -> None:
        """Forget every segment of ``sid`` (a deleted stream's data is not kept)."""
        with self._lock:
            for key in [k for k in self._kept if k[0] == sid]:
                self._bytes -= sum(len(m) for m in self._kept.pop(key))


class StreamReads:
    """Reads of streams whose state is known. Thread-safe."""

    def __init__(self, reader: Reader, headers: HeaderStore, segments: SegmentCache,
                 decoded: DecodedMessages) -> None:
        self.reader = reader
        self.headers = headers
        self.segments = segments
        self.decoded = decoded

    def read_state(self, st: StreamState, offset: Offset | None, *, max_bytes: int = DEFAULT_MAX_BYTES) -> ReadResult:
        """The appends of ``st``'s stream after ``offset`` (``None``: the tail): whole
        batches of at most ``max_bytes`` in all (the first batch alone when it is larger);
        ``up_to_date`` when the result reaches the tail."""
        tail = st.tail
        if offset is not None and offset > tail:
            # Never handed out by this incarnation (the tail only grows): an offset of an
            # earlier life of the stream, whose positions name other data now.
            raise InvalidOffsetError(f"offset {offset} is beyond the stream's tail {tail}")
        if offset is None or offset == tail:
            return ReadResult([], tail, True, st.closed, tail)
        out: list[Batch] = []
        budget = [max_bytes]
        self._gather(st, offset, tail, out, budget)
        if budget[0] <= 0 and out and out[-1].end < tail:
            return ReadResult(out, out[-1].end, False, False, tail)
        return ReadResult(out, tail, True, st.closed, tail)

    def first_batch_after(self, st: StreamState, offset: Offset) -> Batch | None:
        out: list[Batch] = []
        self._gather(st, offset, st.tail, out, [1])
        return out[0] if out else None

    def _gather(self, st: StreamState, start: Offset, end: Offset, out: list[Batch], budget: list[int]) -> None:
        """Append the batches in [start, end) of ``st``'s stream, its fork source's first."""
        if st.pi:
            self._gather_entries(st, start, end, out, budget)
            return
        cfg = st.config
        base = cfg.base
        if cfg.fork_offset is not None and start < cfg.fork_offset:
            src = self._source_state(cfg)
            self._gather(src, start, min(end, cfg.fork_offset), out, budget)
            if budget[0] <= 0:
                return
            start = cfg.fork_offset
        if start >= end:
            return
        own_from = max(1, start.vseq - base)
        header = st.header
        # The segments that can hold [start, end): a fork source's state is not read (its
        # last_seq is 0), its end is the fork point.
        last_needed = end.vseq - base
        if st.last_seq:
            last_needed = min(last_needed, st.last_seq)
        if last_needed < own_from:
            return
        # A window of segments at a time (one parallel round each), so that a read of a long
        # stream holds about its budget in memory, not the stream.
        lo = own_from - 1
        while lo < last_needed:
            through = min(last_needed, lo + READ_WINDOW)
            fresh, _ = self.reader.read_after(
                header.session_id, header, lo, through=through, cache=self.segments
            )
            lo = through
            for seq, record in fresh:
                vseq = base + seq
                msgs = record.get("msgs") or ()
                if not cfg.json and msgs:  # one record a segment: stream appends are alone
                    msgs = self.decoded.of(header.session_id, header.incarnation, seq, msgs)
                taken = [m for i, m in enumerate(msgs) if start <= Offset(vseq, i) < end]
                if not taken:
                    continue
                size = sum(message_size(m) for m in taken)
                if out and size > budget[0]:
                    budget[0] = 0  # the next batch would overrun: the result ends before it
                    return
                out.append(Batch(min(Offset(vseq, len(msgs)), end), taken))
                budget[0] -= size
                if budget[0] <= 0:
                    return

    def _gather_entries(
        self, st: StreamState, start: Offset, end: Offset, out: list[Batch], budget: list[int]
    ) -> None:
        """A session's entries in [start, end), one batch a segment; redacted entries as the
        tombstones every reader sees (``SessionStore.load_session_entries``)."""
        data = self.reader.read_session(st.header.session_id)
        if data.header.incarnation != st.header.incarnation:
            raise StreamNotFoundError(f"no stream {st.config.path!r}")
        entries = data.all_entries
        if any(e.get("type") == REDACTION_TYPE for e in entries):
            from store.model.session import Session

            entries = list(Session({}, entries, validated=True).entries)
        seqs = [0] * len(data.inherited) + list(data.seqs)
        counts: dict[int, int] = {}
        for seq in seqs:
            counts[seq] = counts.get(seq, 0) + 1
        index = 0
        current: list[Any] = []
        prev = -1
        for entry, seq in zip(entries, seqs):
            index = index + 1 if seq == prev else 0
            if prev != -1 and seq != prev and current:
                out.append(Batch(min(Offset(prev, counts[prev]), end), current))
                current = []
                if budget[0] <= 0:
                    return
            prev = seq
            off = Offset(seq, index)
            if start <= off < end:
                current.append(entry)
                budget[0] -= 256
        if current:
            out.append(Batch(min(Offset(prev, counts[prev]), end), current))

    def _source_state(self, cfg: StreamConfig) -> StreamState:
        """The fork source's state as far as the fork point (its tombstone does not matter:
        a fork reads what it inherited until it is deleted itself)."""
        assert cfg.fork_sid is not None
        header = self.headers.get(cfg.fork_sid)
        if header.incarnation != cfg.fork_inc:
            header = self.headers.read(cfg.fork_sid)
            if header.incarnation != cfg.fork_inc:
                raise StreamGoneError("the stream this fork was made from is gone")
        return StreamState(header=header, config=config_of(header, header.config.get("path", "")))


__all__ = ["DEFAULT_MAX_BYTES", "DecodedMessages", "StreamReads"]
