"""One compaction: manifest g + the segments after it -> new bases + manifest g+1.

Protocol (several workers on several machines may run it on the same session at once; any of
them may die at any point):

1. Read the header (incarnation) and the latest manifest g; list the segments after it
   (contiguous from ``through_seq + 1``, at most ``max_segments``).
2. Choose which of g's bases to rewrite (``compactor/tiers.py``): g's bases form runs, and
   the newest runs are merged geometrically; the older ones are kept as they are, named
   again by g+1. Bytes rewritten per byte appended grow as log N, not N.
3. Pass 1: GET the bases to rewrite and those segments one at a time, verify them (a corrupt
   object fails the compaction with ``CorruptObjectError``), learn every redaction (those of
   the kept bases come from g's ``redactions``), count entries per segment, and spool the
   bytes to a local temporary file. Memory holds one object. A new redaction whose target
   is not in the spool may name an entry of a kept base: the kept bases are searched for it
   (GETs, spooled too) and the runs from the oldest one holding a target are put before the
   rest of the spool, to be rewritten with it.
4. Pass 2: replay the spool in commit order, replacing redacted targets by their tombstones,
   and cut the output into base objects of at most ``max_base_bytes``, each created with
   If-None-Match under a key no one else uses (``<gen>-<started ms>-<token>-<part>``).
5. Create ``manifest/<g+1>`` naming the kept bases and then the new ones, with
   If-None-Match. That one request is the only arbiter: the
   worker whose create wins has compacted; a loser deletes its own bases and reports ``lost``.
   A worker that dies before this step leaves bases no manifest names: GC removes them as
   orphans after the grace period.
6. Tell Redis how many segments and bytes the manifest merged (the compaction trigger's
   counters). Best effort: Redis is a cache, and a rebuild recounts from the manifest.

Nothing is deleted here (except a loser's own, never-referenced bases): the previous manifest,
its bases and the merged segments stay readable for the grace period, which is what lets a
reader that loaded manifest g a moment ago finish its read (see ``compactor/gc.py``).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import tempfile
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any, Iterator


from compactor.bases import BaseWriter
from compactor.config import Clock, CompactorOptions, wall_clock_ms
from compactor.gc import GarbageCollector
from compactor.schedule import schedule_gc
from compactor.records import BaseRef, CompactionRecord, CompactionResult, GcResult
from compactor.redaction import RedactionIndex
from compactor.tiers import Run, plan_cut, run_entries, runs_of
from store import tracing
from store.core import SessionStore
from store.formats.entries import encode_json
from store.errors import (
    BackendError,
    BackendUnavailableError,
    CorruptObjectError,
    ObjectNotFoundError,
)
from store.faults import FaultHook
from store.formats.layout import Layout, check_session_id
from store.protocol.manifest import Manifest, build_manifest, compaction_record
from store.formats.migrations import CURRENT_SCHEMA
from store.formats.crypto import is_sealed
from store.formats.segments import SCHEMA, SHA256, contiguous, decode_object

log = logging.getLogger("sessionstore.compactor")

# A source vanished mid-compaction: another worker's newer manifest retired it and the grace
# period ran out. Start over from the newest manifest, a few times at most.
_MAX_RESTARTS = 3


class _SourceGone(Exception):
    pass


@dataclass(frozen=True, slots=True)
class _Source:
    """One input object as spooled: where its bytes sit in the spool file."""

    key: str
    checksum: str | None
    #: The segment number, or 0 for a previous base.
    seq: int
    offset: int
    length: int
    entries: int
    #: The schema its writer used (store/formats/migrations.py); older ones are lifted on rewrite.
    schema: int = CURRENT_SCHEMA


@dataclass(frozen=True, slots=True)
class _Scan:
    sources: tuple[_Source, ...]
    redactions: RedactionIndex
    seq_counts: tuple[int, ...]
    #: Entries read (and so written): the rewritten bases and the segments.
    entries: int
    last_entry_id: str
    bytes_in: int
    segment_bytes: int
    #: The previous manifest's bases named again as they are, and the entries they hold.
    kept: tuple[dict[str, Any], ...] = ()
    kept_entries: int = 0


class Compactor:
    """Compaction and garbage collection of the sessions of one ``SessionStore``.

    Operators call :meth:`compact_session` and :meth:`gc` directly; ``python -m compactor``
    runs them from the job queue (``compactor.worker``).
    """

    def __init__(
        self,
        store: SessionStore,
        options: CompactorOptions | None = None,
        *,
        now: Clock = wall_clock_ms,
        fault_hook: FaultHook | None = None,
    ) -> None:
        self.store = store
        self.ctx = store.ctx
        self.options = options or CompactorOptions()
        self.now = now
        self.fault_hook = fault_hook
        self._gc = GarbageCollector(self.ctx, self.options, now=now, fault_hook=fault_hook)

    @property
    def worker(self) -> str:
        return self.options.worker

    def fault(self, point: str, **ctx: Any) -> None:
        if self.fault_hook is not None:
            self.fault_hook(point, ctx)

    # --- public API --------------------------------------------------------------------------

    def compact_session(self, session_id: str) -> CompactionResult:
        """Merge the segments after the latest manifest into new bases and manifest g+1."""
        sid = check_session_id(session_id)
        with tracing.span("compact", sid) as traced:
            for _ in range(_MAX_RESTARTS):
                try:
                    result = self._compact_once(sid)
                except _SourceGone as gone:
                    log.info("source vanished, restarting", extra={"session_id": sid, "key": str(gone)})
                    continue
                traced.set_attribute("sessionstore.outcome", result.outcome)
                return result
            raise BackendUnavailableError(
                f"session {sid!r}: the manifest kept changing under the compaction; try again later"
            )

    def gc_session(self, session_id: str) -> GcResult:
        """Delete what no manifest or tail of the session reaches once its grace is over."""
        return self._gc.collect_session(check_session_id(session_id))

    def gc(self) -> GcResult:
        """:meth:`gc_session` for every session directory in the bucket."""
        return self._gc.collect()

    def history(self, session_id: str) -> list[CompactionRecord]:
        """The compactions of the session's current incarnation, newest first."""
        sid = check_session_id(session_id)
        header = self.store.get_header(sid)
        manifest = self.store.latest_manifest(sid, header.incarnation)
        if manifest is None:
            return []
        raw = manifest.raw
        out = [CompactionRecord.from_json(manifest.generation, dict(raw.get("compaction") or {}))]
        for item in raw.get("history") or []:
            out.append(CompactionRecord.from_json(0, dict(item)))
        return out

    # --- one attempt -------------------------------------------------------------------------

    def _compact_once(self, sid: str) -> CompactionResult:
        store = self.store
        ctx = self.ctx
        header = store.get_header(sid)
        inc = header.incarnation
        started_ms = self.now()
        previous = ctx.manifests.latest(sid, inc)
        first = previous.through_seq + 1 if previous else 1
        segments, more, incoming = self._segments_from(sid, inc, first)
        if not segments:
            return CompactionResult(sid, "nothing", generation=previous.generation if previous else 0)
        gen = (previous.generation if previous else 0) + 1
        known = self._known_redactions(sid, inc, previous)
        runs = runs_of(previous.bases) if previous else []
        cut = plan_cut(runs, incoming, self.options.merge_ratio, knows_redactions=known is not None)
        with tempfile.TemporaryFile(prefix="sessionstore-compact-") as spool, \
                tempfile.TemporaryFile(prefix="sessionstore-compact-") as searched:
            scan = self._scan(sid, inc, previous, runs, cut, known, segments, spool, header.schema)
            unmet = self._unmet_targets(scan, known, spool) if cut > 0 else set()
            oldest, found = self._oldest_run_holding(runs[:cut], unmet, scan.redactions, searched) \
                if unmet else (None, [])
            if oldest is not None:
                # A new redaction names an entry of a kept run: rewrite from that run on.
                self.fault("compact.redaction_in_kept_run", session_id=sid, generation=gen, run=oldest)
                scan, spool = self._prepend_runs(sid, inc, previous, scan, spool, searched, found, runs, oldest), searched
            self.fault("compact.after_scan", session_id=sid, generation=gen)
            token = uuid.uuid4().hex
            stem = Layout.base_stem(gen, started_ms, token)
            writer = BaseWriter(self.ctx, self.options.max_base_bytes, sid, inc, stem, sealed=bool(header.encryption))
            try:
                purged = self._write_bases(scan, spool, writer)
            except BaseException:
                writer.delete_all()
                raise
        bases = writer.bases
        self.fault("compact.after_base", session_id=sid, generation=gen, keys=[b.key for b in bases])
        self._check_not_too_slow(sid, started_ms, writer)
        first_seq, last_seq = segments[0][0], segments[-1][0]
        finished_ms = self.now()
        manifest = self._manifest(
            sid, inc, gen, previous, scan, bases, (first_seq, last_seq), purged, started_ms,
            finished_ms, segments,
        )
        mkey = ctx.layout.manifest(sid, inc, gen)
        self.fault("compact.before_manifest", session_id=sid, generation=gen, key=mkey)
        if not ctx.manifests.create(sid, inc, gen, manifest, token):
            writer.delete_all()
            log.info(
                "lost the race for a manifest",
                extra={"session_id": sid, "generation": gen, "deleted_bases": len(bases)},
            )
            return CompactionResult(sid, "lost", generation=gen, manifest_key=mkey)
        self.fault("compact.after_manifest", session_id=sid, generation=gen, key=mkey)
        try:
            ctx.coord.compacted(sid, inc, len(segments), scan.segment_bytes, last_seq, gen)
        except BackendError as exc:
            log.warning("pending counters not updated", extra={"session_id": sid, "error": str(exc)})
        # GC schedule (compactor/schedule.py): what this manifest retired is due one grace
        # period from now (taken after the create: never before the manifest's own time).
        schedule_gc(ctx.coord, sid, self.now() + self.options.grace_ms)
        result = CompactionResult(
            sid,
            "compacted",
            generation=gen,
            manifest_key=mkey,
            segments_merged=(first_seq, last_seq),
            segment_count=len(segments),
            entries=scan.entries,
            bytes_in=scan.bytes_in,
            segment_bytes=scan.segment_bytes,
            bytes_out=sum(b.bytes for b in bases),
            redactions_purged=purged,
            base_keys=tuple(b.key for b in bases),
            more_pending=more,
            bases_kept=len(scan.kept),
        )
        log.info(
            "compacted",
            extra={
                "session_id": sid,
                "generation": gen,
                "segments": [first_seq, last_seq],
                "entries": scan.entries,
                "bytes_in": scan.bytes_in,
                "bytes_out": result.bytes_out,
                "redactions_purged": purged,
            },
        )
        return result

    def _segments_from(self, sid: str, inc: str, first: int) -> tuple[list[tuple[int, str]], bool, int]:
        """Segments first, first+1, ... up to the first gap; (at most max_segments, more?,
        their bytes as listed)."""
        layout = self.ctx.layout
        prefix = layout.segment_prefix(sid, inc)
        start_after = layout.segment(sid, inc, first - 1) if first > 1 else None
        limit = self.options.max_segments
        infos = self.ctx.options.retry.call(
            lambda: list(itertools.islice(self.ctx.objects.list(prefix, start_after), limit + 1))
        )
        numbers: list[int] = []
        sizes: dict[int, int] = {}
        for info in infos:
            parsed = layout.parse(info.key)
            if parsed is None or parsed.kind != "segment" or parsed.number is None:
                break  # not a segment name: treat like a gap, never merge past it
            numbers.append(parsed.number)
            sizes[parsed.number] = info.size
        seqs = contiguous(numbers, first)
        out = [(seq, layout.segment(sid, inc, seq)) for seq in seqs]
        more = len(out) > limit
        return out[:limit], more, sum(sizes[seq] for seq, _ in out[:limit])

    def _get(self, key: str) -> Any:
        try:
            return self.ctx.options.retry.call(lambda: self.ctx.objects.get(key))
        except ObjectNotFoundError:
            raise _SourceGone(key) from None

    def _opened(self, key: str, data: bytes, checksum: str | None) -> tuple[bytes, str | None]:
        """An input object as the spool keeps it: a sealed one opened (AES-GCM verified it),
        with the digest of its plaintext, so that pass 2 may copy it as it is; the bases it
        ends up in are sealed again, with the session's newest data key (``compactor/bases.py``).
        The spool is a local temporary file: the compactor's host holds plaintext while it
        works, as it holds the keys (docs/encryption.md, threat model)."""
        if not is_sealed(data):
            self.ctx.keys.open(key, data)  # refuses a plaintext object of an encrypted session
            return data, checksum
        plain = self.ctx.keys.open(key, data)
        return plain, hashlib.sha256(plain).hexdigest()

    def _known_redactions(self, sid: str, inc: str, previous: Manifest | None) -> RedactionIndex | None:
        """The redactions the previous manifest's bases hold; None if it does not say."""
        if previous is None:
            return RedactionIndex()
        if "redactions" not in previous.raw:
            return None
        try:
            return RedactionIndex.from_json(previous.raw["redactions"])
        except ValueError as exc:
            key = self.ctx.layout.manifest(sid, inc, previous.generation)
            raise CorruptObjectError(key, 0, str(exc)) from None

    def _unmet_targets(self, scan: _Scan, known: RedactionIndex | None, spool: IO[bytes]) -> set[str]:
        """Targets of redactions new in this compaction that no spooled entry holds."""
        wanted = {t for t, _, _ in scan.redactions.to_json() if known is None or t not in known}
        if not wanted:
            return wanted
        for source in scan.sources:
            spool.seek(source.offset)
            for entry in decode_object(source.key, spool.read(source.length), source.checksum, source.schema):
                if entry.get("id") in wanted and scan.redactions.targets(entry):
                    wanted.discard(entry["id"])
        return wanted

    def _oldest_run_holding(
        self, runs: list[Run], targets: set[str], redactions: RedactionIndex, searched: IO[bytes]
    ) -> tuple[int | None, list[_Source]]:
        """The index of the oldest kept run holding an entry in ``targets`` (newest first,
        one base in memory at a time, stopping once every target is found), or None; and
        every base read, verified and spooled to ``searched`` (newest run first)."""
        remaining = set(targets)
        oldest = None
        found: list[_Source] = []
        offset = 0
        for i in range(len(runs) - 1, -1, -1):
            for base in runs[i]:
                key = str(base["key"])
                data, checksum = self._opened(key, self._get(key).data, base.get(SHA256))
                schema = int(base.get("schema", CURRENT_SCHEMA))
                decoded = decode_object(key, data, checksum, schema)
                if len(decoded) != int(base.get("entries") or 0):
                    raise CorruptObjectError(key, 0, f"holds {len(decoded)} entries, the manifest counts {base.get('entries')}")
                for entry in decoded:
                    if entry.get("id") in remaining and redactions.targets(entry):
                        remaining.discard(entry["id"])
                        oldest = i
                searched.write(data)
                found.append(_Source(key, checksum, 0, offset, len(data), len(decoded), schema))
                offset += len(data)
            if not remaining:
                break
        return oldest, found

    def _prepend_runs(
        self, sid: str, inc: str, previous: Manifest | None, scan: _Scan, spool: IO[bytes],
        searched: IO[bytes], found: list[_Source], runs: list[Run], oldest: int,
    ) -> _Scan:
        """The scan with runs ``oldest..`` (read by the search) put before what it holds, in
        commit order, all in ``searched``: their redactions are in the manifest's index
        already, so nothing else changes."""
        by_key = {s.key: s for s in found}  # runs oldest.. up to the kept ones, all read
        ordered = [by_key[str(b["key"])] for run in runs[oldest:] for b in run if str(b["key"]) in by_key]
        # ``searched`` holds them newest first: copy them in commit order after its end, then
        # the spool, and point every source at its new place.
        searched.seek(0, 2)
        sources: list[_Source] = []
        for src in ordered:
            searched.seek(src.offset)
            data = searched.read(src.length)
            searched.seek(0, 2)
            sources.append(_Source(src.key, src.checksum, 0, searched.tell(), len(data), src.entries, src.schema))
            searched.write(data)
        shift = searched.tell()
        spool.seek(0)
        while chunk := spool.read(1 << 20):
            searched.write(chunk)
        sources.extend(_Source(s.key, s.checksum, s.seq, s.offset + shift, s.length, s.entries, s.schema)
                       for s in scan.sources)
        kept = tuple(b for run in runs[:oldest] for b in run)
        moved_entries = sum(s.entries for s in ordered)
        moved_bytes = sum(s.length for s in ordered)
        return _Scan(
            tuple(sources), scan.redactions, scan.seq_counts, scan.entries + moved_entries,
            scan.last_entry_id, scan.bytes_in + moved_bytes, scan.segment_bytes,
            kept, scan.kept_entries - moved_entries,
        )

    def _scan(
        self,
        sid: str,
        inc: str,
        previous: Manifest | None,
        runs: list[Run],
        cut: int,
        known: RedactionIndex | None,
        segments: list[tuple[int, str]],
        spool: IO[bytes],
        header_schema: int = CURRENT_SCHEMA,
    ) -> _Scan:
        redactions = known.copy() if known is not None else RedactionIndex()
        kept = tuple(b for run in runs[:cut] for b in run)
        kept_entries = sum(run_entries(run) for run in runs[:cut])
        rewritten = [b for run in runs[cut:] for b in run]
        sources: list[_Source] = []
        seq_counts = list(previous.seq_counts) if previous else []
        offset = 0
        entries = 0
        last_id = ""
        bytes_in = 0
        segment_bytes = 0

        def take(key: str, data: bytes, checksum: str | None, seq: int, schema: int) -> int:
            nonlocal offset, entries, last_id, bytes_in
            data, checksum = self._opened(key, data, checksum)
            decoded = decode_object(key, data, checksum, schema)
            for entry in decoded:
                redactions.observe(entry)
            if decoded:
                last_id = str(decoded[-1]["id"])
            spool.write(data)
            sources.append(_Source(key, checksum, seq, offset, len(data), len(decoded), schema))
            offset += len(data)
            entries += len(decoded)
            bytes_in += len(data)
            return len(decoded)

        specs: list[tuple[str, str | None, int]] = [(str(b["key"]), b.get(SHA256), 0) for b in rewritten]
        base_schemas = [int(b.get("schema", CURRENT_SCHEMA)) for b in rewritten]
        specs.extend((key, None, seq) for seq, key in segments)
        # The bases must hold what the manifest counts, or seq numbers would shift.
        unchecked = previous is not None
        base_entries = kept_entries
        for (key, checksum, seq), obj in self._fetch_ahead(specs):
            if seq == 0:
                base_entries += take(key, obj.data, checksum, 0, base_schemas.pop(0))
                continue
            if unchecked and previous is not None:
                if base_entries != sum(previous.seq_counts):
                    raise CorruptObjectError(
                        self.ctx.layout.manifest(sid, inc, previous.generation),
                        0,
                        f"bases hold {base_entries} entries, the manifest counts "
                        f"{sum(previous.seq_counts)}",
                    )
                unchecked = False
            written = int(obj.metadata.get(SCHEMA, header_schema))
            seq_counts.append(take(key, obj.data, obj.metadata.get(SHA256), seq, written))
            segment_bytes += len(obj.data)
        return _Scan(
            tuple(sources), redactions, tuple(seq_counts), entries, last_id, bytes_in, segment_bytes,
            kept, kept_entries,
        )

    def _fetch_ahead(
        self, specs: list[tuple[str, str | None, int]]
    ) -> Iterator[tuple[tuple[str, str | None, int], Any]]:
        """GET the objects in order, ``read_ahead`` requests in flight (and in memory)."""
        ahead = self.options.read_ahead
        with ThreadPoolExecutor(max_workers=ahead, thread_name_prefix="compactor-read") as pool:
            window: deque[tuple[tuple[str, str | None, int], Future[Any]]] = deque()
            pending = iter(specs)
            for spec in itertools.islice(pending, ahead):
                window.append((spec, pool.submit(self._get, spec[0])))
            try:
                while window:
                    spec, fut = window.popleft()
                    obj = fut.result()
                    nxt = next(pending, None)
                    if nxt is not None:
                        window.append((nxt, pool.submit(self._get, nxt[0])))
                    yield spec, obj
            finally:
                for _, fut in window:
                    fut.cancel()

    def _write_bases(self, scan: _Scan, spool: IO[bytes], writer: BaseWriter) -> int:
        """Pass 2. Returns the number of entries whose content was replaced by a tombstone."""
        purged = 0
        for source in scan.sources:
            spool.seek(source.offset)
            data = spool.read(source.length)
            if not len(scan.redactions) and source.schema == CURRENT_SCHEMA:
                # Verified bytes exactly as a writer (or an earlier compaction) encoded them.
                writer.add(data, source.entries)
                continue
            out: list[bytes] = []
            changed = source.schema != CURRENT_SCHEMA
            decoded = decode_object(source.key, data, source.checksum, source.schema)
            for entry in decoded:
                kept = scan.redactions.apply(entry)
                if kept is not entry and kept != entry:
                    purged += 1
                    changed = True
                out.append(encode_json(kept) + b"\n")
            writer.add(b"".join(out) if changed else data, source.entries)
        writer.flush()
        return purged

    def _check_not_too_slow(self, sid: str, started_ms: int, writer: BaseWriter) -> None:
        """Refuse to publish bases that GC may already count as orphans.

        GC deletes an unreferenced base once its key's start time is a grace period old. A
        compaction that took half of that (a long pause, a huge session) gives up instead of
        creating a manifest that might name a deleted base.
        """
        grace = self.options.grace_ms
        if grace > 0 and self.now() - started_ms > grace // 2:
            writer.delete_all()
            raise BackendUnavailableError(
                f"session {sid!r}: compaction took more than half the grace period "
                f"({grace} ms); bases withdrawn, the job will be retried"
            )

    def _manifest(
        self,
        sid: str,
        inc: str,
        gen: int,
        previous: Manifest | None,
        scan: _Scan,
        bases: list[BaseRef],
        merged: tuple[int, int],
        purged: int,
        started_ms: int,
        finished_ms: int,
        segments: list[tuple[int, str]],
    ) -> dict[str, Any]:
        layout = self.ctx.layout
        retired: list[str] = []
        kept = {str(b["key"]) for b in scan.kept}
        if previous is not None:
            retired.append(layout.manifest(sid, inc, previous.generation))
            retired.extend(str(b["key"]) for b in previous.bases if str(b["key"]) not in kept)
        retired.extend(key for _, key in segments)
        record = compaction_record(
            worker=self.worker,
            started_ms=started_ms,
            finished_ms=finished_ms,
            segments_merged=[merged[0], merged[1]],
            segment_count=len(segments),
            entries=scan.entries,
            entries_merged=sum(scan.seq_counts[merged[0] - 1 :]),
            bytes_in=scan.bytes_in,
            segment_bytes=scan.segment_bytes,
            bytes_out=sum(b.bytes for b in bases),
            redactions_purged=purged,
            bases_kept=len(scan.kept),
            bytes_kept=sum(int(b.get("bytes") or 0) for b in scan.kept),
        )
        return build_manifest(
            session_id=sid,
            incarnation=inc,
            generation=gen,
            previous=previous,
            through_seq=merged[1],
            seq_counts=scan.seq_counts,
            bases=[dict(b) for b in scan.kept] + [b.to_json() for b in bases],
            entry_count=scan.kept_entries + scan.entries,
            last_entry_id=scan.last_entry_id or str((previous.raw if previous else {}).get("last_entry_id", "")),
            compaction=record,
            retired=retired,
            grace_ms=self.options.grace_ms,
            finished_ms=finished_ms,
            history_limit=self.options.history_limit,
            redactions=scan.redactions.to_json(),
        )


def migrate_session(store: SessionStore, session_id: str, **compactor_options: Any) -> CompactionResult:
    """Rewrite a session written at an older schema forward (store/formats/migrations.py).

    Readers already see every session at the current schema: each segment and base is lifted
    through the migration list as it is read. This makes it permanent, without overwriting
    any object: one compaction, which lifts everything it merges and writes its base at the
    current schema (a base at an older schema is always among those it rewrites,
    ``compactor/tiers.py``; and, like every compaction, it leaves the old objects to GC after
    the grace period). ``outcome`` is "nothing" when no segment follows the newest manifest: a
    manifest's bases are rewritten by the next compaction that has a segment to merge.
    """
    return Compactor(store, CompactorOptions(**compactor_options)).compact_session(
        check_session_id(session_id)
    )
