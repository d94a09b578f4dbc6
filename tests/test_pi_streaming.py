"""Streaming reads of pi files (scan_pi_file + iter_pi_entries) and the streaming import.

The two-pass reader must mean exactly what read_pi_file means, for every fixture and every
odd input, whatever the kind of source; the import built on it must refuse before writing,
send the same batches every time, and need memory independent of the file's size.
"""

from __future__ import annotations

import io
import json
import marshal
import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pi_samples import conversation_message, pi_fixtures, pi_scenarios

from store.core import SessionStore
from store.errors import BatchTooLargeError, InvalidEntryError, InvalidInputError
from store.model.js_json import dumps_js
from store.pi.scan import PiFile, PiScan, iter_pi_entries, read_pi_file, scan_pi_file

FIXTURES = pi_fixtures()
SCENARIOS = pi_scenarios()
ROOT = Path(__file__).resolve().parents[1]

H3 = {
    "type": "session",
    "version": 3,
    "id": "s3",
    "timestamp": "2025-03-01T10:00:00.000Z",
    "cwd": "/w",
}
H2 = {
    "type": "session",
    "version": 2,
    "id": "s2",
    "timestamp": "2025-03-01T10:00:00.000Z",
    "cwd": "/w",
}
H1 = {"type": "session", "id": "s1", "timestamp": "2025-03-01T10:00:00.000Z", "cwd": "/w"}


def _file(*values: Any) -> bytes:
    return b"".join((v if isinstance(v, bytes) else orjson.dumps(v)) + b"\n" for v in values)


def _msg(
    entry_id: str | None, parent: str | None, text: str = "x", role: str = "user"
) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "message"}
    if entry_id is not None:
        entry |= {"id": entry_id, "parentId": parent}
    entry |= {"timestamp": "2025-03-01T10:00:01.000Z", "message": {"role": role, "content": text}}
    return entry


def _deep(entry_id: str, depth: int) -> bytes:
    """An entry nested ``depth`` levels deep, as a line (orjson cannot write it)."""
    return (
        b'{"type":"custom","id":"%s","parentId":null,"data":' % entry_id.encode()
        + b"[" * depth
        + b"]" * depth
        + b"}"
    )


def _compaction(index: Any) -> dict[str, Any]:
    return {
        "type": "compaction",
        "timestamp": "2025-03-01T10:00:02.000Z",
        "summary": "s",
        "firstKeptEntryIndex": index,
        "tokensBefore": 10,
    }


# Odd inputs beyond the fixture corpus: every branch of migration, collapsing and refusal.
EDGE_CASES: dict[str, bytes] = {
    "collapsed_repeats": _file(
        H3,
        _msg("e1", None),
        _msg("e2", "e1"),
        H3,
        _msg("e1", None),
        _msg("e2", "e1"),
        _msg("e3", "e2"),
    ),
    # The same value written differently (spaces, escapes) is the same entry.
    "collapsed_despite_other_bytes": _file(
        H3,
        _msg("e1", None, "é"),
        b'{ "type" : "message", "id":"e1", "parentId":null, "timestamp":"2025-03-01T10:00:01.000Z",'
        b' "message":{"role":"user","content":"\\u00e9"} }',
        _msg("e2", "e1"),
    ),
    "repeat_with_other_content": _file(
        H3, _msg("e1", None), _msg("e2", "e1"), _msg("e1", None, "changed")
    ),
    "ends_with_repeat": _file(H3, _msg("e1", None), _msg("e2", "e1"), _msg("e1", None)),
    "cycle": _file(H3, _msg("r", None), _msg("a", "b"), _msg("b", "a")),
    "forward_parent": _file(H3, _msg("e1", None), _msg("e2", "e3"), _msg("e3", "e1")),
    "orphan": _file(H3, _msg("e1", "gone"), _msg("e2", "e1")),
    # A refused entry, then an unparseable value further down: the latter is reported.
    "parse_error_after_refusal": _file(
        H3,
        {"type": "message", "id": "m", "parentId": None, "message": None},
        _msg("e2", None),
        b"null",
    ),
    "two_refusals": _file(
        H3,
        {"type": "session_info", "id": "l", "parentId": None, "name": 5},
        _msg("e1", None),
        _msg("e1", None, "y"),
    ),
    # JavaScript's escapes for strings cut inside an emoji (the stdlib parser reads them), a
    # repeat written with other escapes (the same entry), labels pi files under other keys.
    "lone_surrogates": _file(
        H3,
        b'{"type":"message","id":"e1","parentId":null,"message":{"role":"user","content":"cut \\ud83d"}}',
        H3,
        b'{"type":"message","id":"e1","parentId":null,"message":{"role":"user","content":"cut \\uD83D"}}',
        b'{"type":"custom","id":"e2","parentId":"e1","data":{"\\udc00":["\\ud83d\\ude00","\\ude00"]}}',
        {"type": "label", "id": "l1", "parentId": "e2", "label": "no target"},
        {"type": "label", "id": "l2", "parentId": "l1", "targetId": {"id": "e1"}, "label": "object"},
    ),
    # firstKeptEntryIndex counts parsed values, header = 0; the position of each is noted.
    "v1_compaction_indices": _file(
        H1,  # 0
        _msg(None, None, "a"),  # 1
        _msg(None, None, "b"),  # 2
        _compaction(1),  # 3: an earlier entry -> its minted id
        _compaction(4),  # 4: itself
        _compaction(8),  # 5: a later entry -> its old id
        {**_compaction(9), "firstKeptEntryId": "kept"},  # 6: a later entry without id -> removed
        {**_compaction(10), "firstKeptEntryId": "kept"},  # 7: a later session line -> untouched
        {**_msg(None, None, "has an old id"), "id": "old"},  # 8
        _msg(None, None, "no id"),  # 9
        {**H1, "id": "second header"},  # 10
        _compaction(999),  # 11: out of range
        _compaction(-1),  # 12
        _compaction(2.5),  # 13
        _compaction("3"),  # 14: not a number: the index stays
        _compaction(True),  # 15: likewise
        _compaction(0),  # 16: the header
        _compaction(1e300),  # 17
        _compaction(None),  # 18: the index stays
        {**_compaction(3), "firstKeptEntryId": "kept"},  # 19: replaced by 3's minted id
        {**_msg(None, None, "a tree loses its ids"), "id": "t1", "parentId": "t0"},  # 20
    ),
    "v1_refused_entry": _file(
        H1, _msg(None, None), {"type": "message", "timestamp": "t", "message": None}
    ),
    "v2_hook_messages": _file(
        H2,
        _msg("e1", None),
        _msg("e2", "e1", role="hookMessage"),
        {**H2, "id": "later"},
        _msg("e3", "e2", role="hookMessage"),
    ),
    "version_string": _file({**H3, "version": "2"}, _msg("e1", None, role="hookMessage")),
    "version_nan": _file({**H3, "version": "abc"}, _msg("e1", None, role="hookMessage")),
    "version_null": _file({**H3, "version": None}, _msg("e1", None), _msg("e2", "e1")),
    "version_4": _file({**H3, "version": 4}, _msg("e1", None)),
    "whitespace_and_garbage": (
        b"\xef\xbb\xbf  "
        + orjson.dumps(H3)
        + b"\r\n\r\n"
        + b"garbage\n"
        + orjson.dumps(_msg("e1", None))
        + b"\r\n{truncated\n"
        + orjson.dumps(_msg("e2", "e1"))
        + "\u00a0\u2028".encode()
        + b"\n \n"
    ),
    "numbers": _file(
        H3,
        json.dumps({**_msg("e1", None), "n": [2**64, 2**70 + 1, 1.0, -0.0, 1.5e-6, 1e21]}).encode(),
        {**_msg("e2", "e1"), "n": {"10": 1, "2": 2.50, "a": 1e-7}},
    ),
    # Deeper than orjson writes (254 levels): repeats are still recognised.
    "deep": _file(H3, _msg("e1", None), _deep("e2", 900), _deep("e2", 900), _deep("e3", 300)),
    "not_a_session": _file(_msg("e1", None), H3),
    "empty": b"",
    "header_only": _file(H3),
}


def _outcome(read: Callable[[], Any]) -> Any:
    """What a reader made of a file, comparable across readers (errors included)."""
    try:
        return read()
    except InvalidEntryError as exc:
        return ("error", type(exc).__name__, str(exc), exc.index, exc.entry_id)


def _as_pifile(scan: PiScan) -> PiFile:
    return PiFile(
        header=scan.header,
        entries=list(iter_pi_entries(scan)),
        migration=scan.migration,
        empty_reason=scan.empty_reason,
        skipped_lines=scan.skipped_lines,
        dropped_headers=scan.dropped_headers,
        collapsed_duplicates=scan.collapsed_duplicates,
        content_hash=scan.content_hash,
        entry_lines=tuple(scan.entry_lines),
    )


def _exact(value: Any) -> bytes:
    """Bytes that tell values apart as JSON.stringify does (key order, 1 vs 1.0 vs true)."""
    try:
        return dumps_js(value)
    except InvalidEntryError:  # nested beyond what orjson writes: marshal is as exact
        return marshal.dumps(value, 0)


def _comparable(pifile: Any) -> Any:
    if not isinstance(pifile, PiFile):
        return pifile
    return (
        _exact(pifile.header) if pifile.header is not None else None,
        [_exact(e) for e in pifile.entries],
        pifile.migration,
        pifile.empty_reason,
        pifile.skipped_lines,
        pifile.dropped_headers,
        pifile.collapsed_duplicates,
        pifile.content_hash,
        pifile.entry_lines,
    )


class _RawPipe(io.RawIOBase):
    """A stream that can be read once, in odd-sized pieces (like a pipe)."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readinto(self, buffer: Any) -> int:
        chunk = self._data[self._at : self._at + min(len(buffer), 7777)]
        buffer[: len(chunk)] = chunk
        self._at += len(chunk)
        return len(chunk)


def _pipe(data: bytes) -> io.BufferedReader:
    return io.BufferedReader(_RawPipe(data))


class _TextPipe(io.TextIOBase):
    def __init__(self, text: str) -> None:
        self._text = text
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, size: int | None = -1) -> str:
        size = min(size if size is not None and size >= 0 else len(self._text), 5555)
        chunk = self._text[self._at : self._at + size]
        self._at += len(chunk)
        return chunk


def _sources(data: bytes, tmp_path: Path) -> Iterator[tuple[str, Callable[[], Any]]]:
    path = tmp_path / "session.jsonl"
    path.write_bytes(data)
    yield "path", lambda: path
    yield "bytes", lambda: data
    yield "pipe", lambda: _pipe(data)
    yield "seekable stream", lambda: _positioned(io.BytesIO(b"not part of it\n" + data), 15)
    text = data.decode("utf-8", "replace")
    if text.encode() == data:  # text sources only for valid UTF-8
        if "\n" in text:  # (a str without one may be a path)
            yield "text", lambda: text
        yield "text pipe", lambda: _TextPipe(text)
        yield "seekable text stream", lambda: io.StringIO(text)


def _positioned(stream: io.BytesIO, offset: int) -> io.BytesIO:
    """A stream whose file starts where the caller left it, not at 0."""
    stream.seek(offset)
    return stream


def _streamed(source: Any) -> PiFile:
    with scan_pi_file(source) as scan:
        first = _as_pifile(scan)
        # Pass 2 can be run again and gives the same entries.
        assert [_exact(e) for e in iter_pi_entries(scan)] == [_exact(e) for e in first.entries]
        return first


def _check_same(data: bytes, tmp_path: Path) -> None:
    want = _comparable(_outcome(lambda: read_pi_file(data)))
    for kind, source in _sources(data, tmp_path):
        got = _comparable(_outcome(lambda: _streamed(source())))  # noqa: B023 (called at once)
        assert got == want, kind


@pytest.mark.parametrize("name", SCENARIOS)
def test_fixture_streams_exactly_like_read_pi_file(name: str, tmp_path: Path) -> None:
    data = (FIXTURES / name / "session.jsonl").read_bytes()
    _check_same(data, tmp_path)


@pytest.mark.parametrize("name", sorted(EDGE_CASES))
def test_edge_case_streams_exactly_like_read_pi_file(name: str, tmp_path: Path) -> None:
    _check_same(EDGE_CASES[name], tmp_path)


def test_edge_cases_mean_what_they_say() -> None:
    """The edge corpus exercises what it claims to (so the comparison above is not vacuous)."""
    assert read_pi_file(EDGE_CASES["collapsed_repeats"]).collapsed_duplicates == (5, 6)
    assert read_pi_file(EDGE_CASES["collapsed_despite_other_bytes"]).collapsed_duplicates == (3,)
    surrogates = read_pi_file(EDGE_CASES["lone_surrogates"])
    assert surrogates.collapsed_duplicates == (4,)
    assert surrogates.entries[0]["message"]["content"] == "cut \ud83d"
    assert surrogates.entries[1]["data"] == {"\udc00": ["😀", "\ude00"]}
    assert surrogates.to_session().label_map == ((None, "no target"), ({"id": "e1"}, "object"))
    for name, fragment in [
        ("repeat_with_other_content", "with different content"),
        ("ends_with_repeat", "ends with a repeat"),
        ("cycle", "parentId cycle"),
        ("parse_error_after_refusal", "null where an entry object"),
        ("two_refusals", "name must be a string"),
        ("v1_refused_entry", "needs a `message`"),
    ]:
        with pytest.raises(InvalidEntryError, match=fragment):
            read_pi_file(EDGE_CASES[name])
    v1 = read_pi_file(EDGE_CASES["v1_compaction_indices"])
    ids = [e["id"] for e in v1.entries]
    # By position in the file (entries: positions 1-9 are entries 0-8, 11-20 are 9-18).
    kept = {position: v1.entries[position - 1 - (position > 10)] for position in range(3, 21)}
    assert kept[3]["firstKeptEntryId"] == ids[0] and kept[4]["firstKeptEntryId"] == ids[3]
    assert kept[5]["firstKeptEntryId"] == "old" and "firstKeptEntryId" not in kept[6]
    assert kept[7]["firstKeptEntryId"] == "kept" and kept[19]["firstKeptEntryId"] == ids[2]
    assert [p for p in range(11, 19) if "firstKeptEntryId" in kept[p]] == []
    assert [p for p in range(3, 20) if "firstKeptEntryIndex" in kept[p]] == [14, 15, 18]
    assert kept[20]["id"] == ids[-1] and kept[20]["parentId"] == ids[-2]
    with pytest.raises(InvalidEntryError) as refused:
        read_pi_file(EDGE_CASES["v1_refused_entry"])
    assert refused.value.entry_id is not None and len(refused.value.entry_id) == 16  # minted
    with scan_pi_file(EDGE_CASES["forward_parent"]) as scan:
        assert scan.forward_parent == (3, "e2", "e3")
        assert scan.leaf_id == "e3" and list(scan.entry_ids) == ["e1", "e2", "e3"]
    with scan_pi_file(EDGE_CASES["orphan"]) as scan:
        assert scan.forward_parent is None and "gone" not in scan.entry_ids


def test_entry_check_sees_the_entries_pass_two_yields() -> None:
    data = EDGE_CASES["v1_compaction_indices"]
    seen: list[tuple[bytes, int]] = []
    with scan_pi_file(data, entry_check=lambda e, line: seen.append((dumps_js(e), line))) as scan:
        assert seen == list(zip([dumps_js(e) for e in iter_pi_entries(scan)], scan.entry_lines))

    def refuse(entry: dict[str, Any], line: int) -> None:
        raise InvalidInputError(f"line {line}: no")

    with pytest.raises(InvalidInputError, match="line 2: no"):
        scan_pi_file(EDGE_CASES["collapsed_repeats"], entry_check=refuse)
    # The model's own refusals come first, wherever they are in the file.
    with pytest.raises(InvalidEntryError, match="ends with a repeat"):
        scan_pi_file(EDGE_CASES["ends_with_repeat"], entry_check=refuse)


def test_a_file_rewritten_between_the_passes_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    path.write_bytes(_file(H3, _msg("e1", None), _msg("e2", "e1")))
    with scan_pi_file(path) as scan:
        # pi appends to a live session: the appended lines are not part of this import.
        with path.open("ab") as handle:
            handle.write(_file(_msg("e3", "e2")))
        assert [e["id"] for e in iter_pi_entries(scan)] == ["e1", "e2"]
        # pi rewrites a file it migrates: that is refused, not mixed in.
        path.write_bytes(_file(H3, _msg("e1", None), _msg("e2", "e1", "other")))
        with pytest.raises(InvalidInputError, match="changed while it was being read"):
            list(iter_pi_entries(scan))
        path.write_bytes(_file(H3, _msg("e1", None)))
        with pytest.raises(InvalidInputError, match="changed while it was being read"):
            list(iter_pi_entries(scan))


def test_streams_that_cannot_be_read_twice_are_spooled_to_disk() -> None:
    data = (FIXTURES / "long_linear_5000" / "session.jsonl").read_bytes()
    scan = scan_pi_file(_pipe(data))
    spool = scan._source._copy  # type: ignore[union-attr]
    assert spool is not None and not isinstance(spool, io.BytesIO)
    assert os.fstat(spool.fileno()).st_size == len(data)
    assert len(list(iter_pi_entries(scan))) == scan.entry_count == 5000
    scan.close()
    assert spool.closed


# --- the streaming import --------------------------------------------------------------------


def test_refusals_found_by_pass_one_write_nothing(make_store: Callable[..., SessionStore]) -> None:
    store = make_store(max_batch_bytes=4096)
    big = _msg("e2", "e1", "x" * 5000)
    cases: list[tuple[bytes, type[Exception], str]] = [
        (
            _file(H3, _msg("e1", None), big, _msg("e3", "e2")),
            BatchTooLargeError,
            "line 3: entry 'e2'",
        ),
        (_file(H3, _msg("e1", None), _msg("i" * 257, "e1")), InvalidEntryError, "longer than 256"),
        (
            EDGE_CASES["forward_parent"],
            InvalidEntryError,
            "line 3: parentId 'e3' names an entry further",
        ),
        (
            _file(H3, _msg("e1", None), _deep("e2", 300)),
            InvalidEntryError,
            "nested too deeply to be stored",
        ),
        (EDGE_CASES["cycle"], InvalidEntryError, "parentId cycle"),
    ]
    for data, error, fragment in cases:
        with pytest.raises(error, match=fragment):
            store.import_pi_session(data, session_id="refused")
        assert list(store.iter_sessions()) == []


def test_import_from_any_source_stores_what_read_pi_file_reads(
    store: SessionStore, tmp_path: Path
) -> None:
    data = EDGE_CASES["numbers"] + b"".join(
        orjson.dumps(_msg(f"n{i}", "e2" if i == 0 else f"n{i - 1}", "é" * i)) + b"\n"
        for i in range(50)
    )
    want = [dumps_js(e) for e in read_pi_file(data).entries]
    for number, (kind, source) in enumerate(_sources(data, tmp_path)):
        sid = f"src-{number}"
        store.import_pi_session(source(), session_id=sid)
        assert [dumps_js(e) for e in store.load_session_entries(sid)] == want, kind
    v1 = EDGE_CASES["v1_compaction_indices"]
    store.import_pi_session(_pipe(v1), session_id="v1-pipe")
    assert store.load_session_entries("v1-pipe") == read_pi_file(v1).entries


def test_batches_are_cut_as_before(make_store: Callable[..., SessionStore]) -> None:
    """Same cuts as the in-memory import made: greedy under both limits, so that files
    imported before this change re-import onto the duplicate path."""
    max_bytes, max_entries = 12 * 1024, 15
    store = make_store(max_batch_bytes=max_bytes, max_batch_entries=max_entries)
    rng = random.Random(5)
    lines = [orjson.dumps(H3)]
    for n in range(400):
        parent = f"m{n - 1}" if n else None
        lines.append(orjson.dumps(_msg(f"m{n}", parent, "w" * rng.choice([10, 100, 2000]))))
    data = b"\n".join(lines) + b"\n"
    cuts: dict[str, int] = {"entries": 0, "bytes": 0}
    size, count = 0, 0
    for entry in read_pi_file(data).entries:
        n = len(orjson.dumps(entry)) + 1
        if count and (count >= max_entries or size + n > max_bytes):
            cuts["entries" if count >= max_entries else "bytes"] += 1
            size, count = 0, 0
        size, count = size + n, count + 1
    assert cuts["entries"] and cuts["bytes"]  # both limits cut somewhere
    store.import_pi_session(data, session_id="cut")
    tail = store.get_tail("cut")
    assert tail.seq == cuts["entries"] + cuts["bytes"] + 1
    store.import_pi_session(io.BytesIO(data), session_id="cut")
    assert store.get_tail("cut") == tail


# --- memory: a subprocess reports its peak RSS -----------------------------------------------

_IMPORT_SCRIPT = textwrap.dedent(
    """
    import gc, json, resource, sys
    from pathlib import Path
    from store import SessionStore
    from store.model.js_json import dumps_js
    from store.pi.scan import read_pi_file

    path, objects, redis_url, prefix, max_batch_bytes = sys.argv[1:6]
    store = SessionStore.from_url(objects, redis_url, redis_prefix=prefix,
                                  max_batch_bytes=int(max_batch_bytes))
    # Warm up: modules, connections and caches that do not depend on the file.
    store.import_pi_session(Path(sys.argv[6]), session_id="warm-up")
    gc.collect()

    def rss():
        # Peak RSS of this process. Not getrusage's ru_maxrss: Linux carries the parent's
        # high-water mark over fork+exec, so in a child of pytest it reads pytest's size.
        # VmHWM belongs to this process's own address space.
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # not Linux

    baseline = rss()
    store.import_pi_session(Path(path), session_id="big")
    peak = rss()
    tail = store.get_tail("big")
    keys = [i.key for i in store.objects.list(store.layout.session_prefix("big"))]
    store.import_pi_session(Path(path), session_id="big")
    again_peak = rss()
    again_tail = store.get_tail("big")
    again_keys = [i.key for i in store.objects.list(store.layout.session_prefix("big"))]
    # Correctness, after the measurements: the stored entries are read_pi_file's.
    want = [dumps_js(e) for e in read_pi_file(Path(path)).entries]
    same = [dumps_js(e) for e in store.load_session_entries("big")] == want
    print(json.dumps({
        "baseline": baseline, "peak": peak, "again_peak": again_peak, "entries": len(want),
        "tail": [tail.seq, tail.last_entry_id, tail.entry_count],
        "again_tail": [again_tail.seq, again_tail.last_entry_id, again_tail.entry_count],
        "keys_unchanged": keys == again_keys, "segments": len(keys), "same_entries": same,
    }))
    store.close()
    """
)


def _write_large_file(path: Path, target_bytes: int, *, v1: bool) -> None:
    """A realistic pi file, written line by line (the test process never holds it)."""
    rng = random.Random(11)
    header = dict(H1 if v1 else H3)
    written = 0
    with path.open("wb") as handle:
        handle.write(orjson.dumps(header) + b"\n")
        parent: str | None = None
        n = 0
        while written < target_bytes:
            n += 1
            message = conversation_message(rng, n)
            entry: dict[str, Any] = {
                "type": "message",
                "timestamp": "2025-03-01T10:00:00.000Z",
                "message": message,
            }
            if v1 and n % 400 == 0:
                # Compactions pointing back, and forward (pi then copies a later line's old id).
                entry = _compaction(n - 50 if n % 800 else n + 3)
            if not v1:
                entry = {"type": "message", "id": f"{n:08x}", "parentId": parent, **entry}
            parent = f"{n:08x}"
            line = orjson.dumps(entry) + b"\n"
            handle.write(line)
            written += len(line)


@pytest.mark.long
@pytest.mark.parametrize(("version", "megabytes"), [("v3", 30), ("v1", 20)])
def test_large_import_memory_is_bounded_by_a_batch_not_the_file(
    version: str, megabytes: int, tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    path = tmp_path / f"large-{version}.jsonl"
    _write_large_file(path, megabytes * 1024 * 1024, v1=version == "v1")
    size = path.stat().st_size
    warm_up = tmp_path / "warm-up.jsonl"
    warm_up.write_bytes(_file(H3, _msg("w1", None), _msg("w2", "w1")))
    # A batch costs about ten times its bytes while prepare_batch holds each entry's orjson
    # output; 512 KiB batches keep that cost small next to the file, so that the assertion
    # measures what grows with the file (with 16 MiB batches the cost is ~170 MB, flat).
    max_batch_bytes = 512 * 1024
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _IMPORT_SCRIPT,
            str(path),
            (tmp_path / "objects").as_uri(),
            redis_url,
            redis_prefix,
            str(max_batch_bytes),
            str(warm_up),
        ],
        capture_output=True,
        check=False,
        timeout=600,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr.decode()[-4000:]
    report = json.loads(out.stdout)
    grown = report["peak"] - report["baseline"]
    grown_again = report["again_peak"] - report["baseline"]
    summary = f"{version}: file {size / 2**20:.1f} MiB, peak RSS grew by {grown / 2**20:.1f} MiB"
    print(summary)
    assert grown < size, summary
    assert grown_again < size, f"re-import: {grown_again / 2**20:.1f} MiB"
    assert report["same_entries"] and report["entries"] > 5000
    assert report["segments"] > 20  # many batches: the bound above is not one batch's luck
    # Idempotent: the second import found every batch committed and wrote nothing.
    assert report["again_tail"] == report["tail"] and report["keys_unchanged"]
    assert report["tail"][2] == report["entries"]
