"""The session model and the pi file format against pi's own behaviour.

Every scenario of the pi fixture corpus (``tests/fixtures/pi``, see ``pi_samples.pi_fixtures``)
is parsed and compared with what pi 0.73.1 made of it (``expected.json``). Scenarios that this
project deliberately refuses are listed in ``REFUSED`` below, mirrored in ``docs/pi-format.md``;
all others must match pi exactly.
"""

from __future__ import annotations

import io
import math
import random
import re
import struct
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pi_samples import conversation_message, pi_expected, pi_fixtures, pi_scenarios

from store.errors import EntryNotFoundError, InvalidEntryError, InvalidInputError
from store.model.context import branch_path, build_session_context
from store.model.js import js_date_ms, js_number_to_string, js_to_number, js_trim
from store.model.js_json import dumps_js, normalize_js_value
from store.model.rules import validate_entry
from store.model.session import Session, TreeNode
from store.pi.export import export_pi_bytes, export_pi_lines
from store.pi.migrate import mint_id
from store.pi.scan import PiFile, parse_pi_lines, read_pi_file

FIXTURES = pi_fixtures()

# Pathological scenarios this project refuses instead of reproducing pi (docs/pi-format.md,
# "Deliberate differences"). scenario -> (error, fragment of its message).
REFUSED: dict[str, tuple[type[Exception], str]] = {
    "null_json_line": (InvalidEntryError, "null where an entry object was expected"),
    "non_object_json_lines": (InvalidEntryError, "where an entry object was expected"),
    "message_entry_null_message": (InvalidEntryError, "needs a `message` object"),
    "duplicate_ids": (InvalidEntryError, "duplicate entry id"),
    "empty_string_ids": (InvalidEntryError, "entry id is the empty string"),
    "self_parent_not_on_path": (InvalidEntryError, "parentId cycle"),
    "cycle_parent_loop": (InvalidEntryError, "parentId cycle"),
    "legacy_v2_missing_ids": (InvalidEntryError, "entry id is missing"),
    "fork_from_v1_legacy": (InvalidEntryError, "entry id is missing"),
}

# Fields that hold entry ids which the v1 migration mints (remapped when comparing by position).
_MINTED_ID_FIELDS = ("id", "parentId", "firstKeptEntryId")
_HEX16 = re.compile(r"[0-9a-f]{16}\Z")


SCENARIOS = pi_scenarios()
_load_expected = pi_expected


def typed(value: Any) -> Any:
    """A comparison key that, unlike ==, tells 1 from 1.0 from True and sees key order."""
    if isinstance(value, dict):
        return ("object", tuple((k, typed(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", tuple(typed(v) for v in value))
    return (type(value).__name__, value)


def assert_same(actual: Any, expected: Any, what: str) -> None:
    assert actual == expected, what
    assert typed(actual) == typed(expected), (
        f"{what}: same values, different JSON types or key order"
    )


class IdMap:
    """Our ids -> pi's ids (identity unless pi minted random ids while opening)."""

    def __init__(self, ours: list[dict[str, Any]], expected: dict[str, Any]) -> None:
        self.mapping: dict[str, str] = {}
        if expected["idsGeneratedOnOpen"]:
            assert len(ours) == len(expected["entries"])
            for mine, theirs in zip(ours, expected["entries"]):
                assert _HEX16.match(mine["id"]), f"minted id {mine['id']!r} is not 16 hex chars"
                self.mapping[mine["id"]] = theirs["id"]
        self.reverse = {v: k for k, v in self.mapping.items()}

    def __call__(self, value: Any) -> Any:
        return self.mapping.get(value, value) if isinstance(value, str) else value

    def entry(self, entry: dict[str, Any]) -> dict[str, Any]:
        if not self.mapping:
            return entry
        return {k: self(v) if k in _MINTED_ID_FIELDS else v for k, v in entry.items()}

    def ours(self, pi_id: Any) -> Any:
        return self.reverse.get(pi_id, pi_id)


def flatten_tree(roots: list[TreeNode], ids: IdMap) -> dict[str, Any]:
    """expected.json's tree shape: roots, then nodes in depth-first preorder (iteratively)."""
    nodes: list[dict[str, Any]] = []
    stack = list(reversed(roots))
    while stack:
        node = stack.pop()
        flat: dict[str, Any] = {
            "id": ids(node.entry["id"]),
            "children": [ids(child.entry["id"]) for child in node.children],
        }
        if node.label is not None:
            flat["label"] = node.label
        if node.label_timestamp_present:
            flat["labelTimestamp"] = node.label_timestamp
        nodes.append(flat)
        stack.extend(reversed(node.children))
    return {"roots": [ids(root.entry["id"]) for root in roots], "nodes": nodes}


def check_view(session: Session, expected: dict[str, Any], ids: IdMap) -> None:
    """Everything pi shows after open(), compared with our Session."""
    assert ids(session.leaf_id) == expected["leafId"]
    leaf = session.leaf_entry
    assert (leaf.get("type") if leaf else None) == expected["leafEntryType"]
    assert [ids(e["id"]) for e in session.get_branch()] == expected["branch"]
    assert flatten_tree(session.get_tree(), ids) == expected["tree"]
    assert {ids(e["id"]): session.get_label(e["id"]) for e in session.entries} == expected["labels"]
    assert [[ids(k), v] for k, v in session.label_map] == expected["labelMap"]
    assert session.labels == {k: v for k, v in session.label_map if isinstance(k, str)}
    assert session.name == expected["sessionName"]
    assert_same(session.build_context(), expected["context"], "context at the leaf")

    for alternate in expected["alternates"]:
        target = session.entries[alternate["entryIndex"]]["id"]
        assert ids(target) == alternate["target"]
        assert target == ids.ours(alternate["target"])
        target_entry = session.get_entry(target)
        assert target_entry is not None
        assert target_entry.get("type") == alternate["leafEntryType"]
        assert [ids(e["id"]) for e in session.get_branch(target)] == alternate["branch"]
        assert_same(
            session.build_context(target), alternate["context"], f"context at {alternate['target']}"
        )

    reset = expected["afterResetLeaf"]
    assert reset["leafId"] is None and reset["branch"] == []
    assert_same(build_session_context([]), reset["context"], "context after resetLeaf()")


def _lines_without(path: Path, drop: set[int]) -> bytes:
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"", f"{path.name} does not end with a newline"
    return b"".join(line + b"\n" for n, line in enumerate(lines[:-1], 1) if n not in drop)


def test_fixture_corpus_is_complete() -> None:
    index = orjson.loads((FIXTURES / "index.json").read_bytes())
    assert sorted(s["name"] for s in index["scenarios"]) == SCENARIOS
    categories = {s["name"]: s["category"] for s in index["scenarios"]}
    for name in REFUSED:
        assert categories[name] == "pathological", f"{name} must match pi: it is {categories[name]}"


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario(name: str) -> None:
    expected = _load_expected(name)
    path = FIXTURES / name / "session.jsonl"

    if name in REFUSED:
        error, message = REFUSED[name]
        with pytest.raises(error, match=re.escape(message)):
            read_pi_file(path).to_session()
        return

    pifile = read_pi_file(path)
    assert len(pifile.entries) == expected["entryCount"]
    assert pifile.migration.header_version == expected["headerVersionInFile"]
    assert pifile.migration.label == expected["migration"]
    assert pifile.migration.ids_minted == expected["idsGeneratedOnOpen"]

    if expected["rewrittenOnOpen"] and expected["migration"] is None:
        # pi found no valid header and replaced the file by a fresh header, discarding the
        # rest. We hand back no header (and never rewrite); the view is pi's otherwise.
        assert pifile.header is None and pifile.empty_reason
        assert pifile.entries == expected["entries"] == []
        with pytest.raises(InvalidEntryError, match="not a pi session file"):
            pifile.require_header()
        check_view(Session(expected["header"], pifile.entries), expected, IdMap([], expected))
        return

    assert pifile.migration.rewritten == expected["rewrittenOnOpen"]
    assert pifile.header is not None
    assert_same(pifile.header, expected["header"], "header")
    assert pifile.header["id"] == expected["sessionId"]
    ids = IdMap(pifile.entries, expected)
    assert_same([ids.entry(e) for e in pifile.entries], expected["entries"], "entries")
    session = pifile.to_session()
    assert session.header == pifile.header
    check_view(session, expected, ids)


@pytest.mark.parametrize("name", pi_scenarios(lambda n: n not in REFUSED))
def test_export_round_trip(name: str) -> None:
    pifile = read_pi_file(FIXTURES / name / "session.jsonl")
    if pifile.header is None:
        return  # nothing to export: covered by test_scenario
    data = b"".join(export_pi_bytes(pifile.header, pifile.entries))
    again = read_pi_file(data)
    assert_same(again.header, pifile.header, "header after export")
    assert_same(again.entries, pifile.entries, "entries after export")
    assert again.migration.steps == () and not again.skipped_lines and not again.dropped_headers
    assert "".join(export_pi_lines(pifile.header, pifile.entries)).encode() == data


@pytest.mark.parametrize(
    "name", pi_scenarios(lambda n: _load_expected(n)["category"] == "generated")
)
def test_export_is_byte_identical_to_pi(name: str) -> None:
    """pi wrote these files: exporting what we parsed gives pi's bytes back."""
    path = FIXTURES / name / "session.jsonl"
    pifile = read_pi_file(path)
    assert pifile.header is not None and pifile.migration.steps == ()
    assert not pifile.skipped_lines and not pifile.collapsed_duplicates
    exported = b"".join(export_pi_bytes(pifile.header, pifile.entries))
    # Only pi's duplicate header lines (reopen_no_assistant_duplicate_flush) are left out.
    assert exported == _lines_without(path, set(pifile.dropped_headers))


@pytest.mark.parametrize(
    "name",
    pi_scenarios(lambda n: n not in REFUSED and _load_expected(n)["migration"] is not None),
)
def test_export_of_migrated_file_matches_pi_rewrite(name: str) -> None:
    """pi rewrote these files with JSON.stringify after migrating; so do we (ids aside)."""
    expected = _load_expected(name)
    pifile = read_pi_file(FIXTURES / name / "session.jsonl")
    assert pifile.header is not None
    ids = IdMap(pifile.entries, expected)
    exported = b"".join(export_pi_bytes(pifile.header, [ids.entry(e) for e in pifile.entries]))
    after_open = FIXTURES / name / "after_open.jsonl"
    later_headers = {
        n
        for n, line in enumerate(after_open.read_bytes().split(b"\n")[1:], 2)
        if line and orjson.loads(line).get("type") == "session"
    }
    assert exported == _lines_without(after_open, later_headers)


# --- pi file reading details ---------------------------------------------------------------------

HEADER = {
    "type": "session",
    "version": 3,
    "id": "s-1",
    "timestamp": "2025-03-01T10:00:00.000Z",
    "cwd": "/w",
}


def _entry(entry_id: str, parent: str | None, text: str = "x", **extra: Any) -> dict[str, Any]:
    second = sum(map(ord, entry_id)) % 60
    entry = {
        "type": "message",
        "id": entry_id,
        "parentId": parent,
        "timestamp": f"2025-03-01T10:01:{second:02d}.000Z",
        "message": {"role": "user", "content": text, "timestamp": 1740823260000},
    }
    entry.update(extra)
    return entry


def _file(*values: Any) -> bytes:
    return b"".join(orjson.dumps(v) + b"\n" for v in values)


def test_lines_split_on_newline_only() -> None:
    tricky = "a\u2028b\u2029c\u0085d\x0be\x0cf\x1cg\x1dh\x1ei"
    data = _file(HEADER, _entry("e1", None, tricky), _entry("e2", "e1"))
    for source in (data, data.decode(), io.BytesIO(data), io.StringIO(data.decode())):
        pifile = read_pi_file(source)
        assert [e["id"] for e in pifile.entries] == ["e1", "e2"]
        assert pifile.entries[0]["message"]["content"] == tricky
    # A raw CR inside a line does not end it (JSON.parse then rejects the line, as in pi).
    broken = orjson.dumps(_entry("e3", "e2")).replace(b'"x"', b'"x\rmore"')
    pifile = read_pi_file(data + broken + b"\n" + _file(_entry("e4", "e2")))
    assert [e["id"] for e in pifile.entries] == ["e1", "e2", "e4"]
    assert pifile.skipped_lines == (4,)


def test_js_trim_applies_to_file_start_and_end_only() -> None:
    # JS: content.trim().split("\n"): the BOM and NBSP go at the file's ends, not mid-file.
    text = (
        "\n \ufeff\u00a0"
        + orjson.dumps(HEADER).decode()
        + "\n"
        + "\ufeff"
        + orjson.dumps(_entry("aa", None)).decode()
        + "\n"
        + orjson.dumps(_entry("bb", None)).decode()
        + "\u00a0\n"
        + orjson.dumps(_entry("cc", None)).decode()
        + "\r\n"
        + "\u00a0\t\n"
        + "  "
        + orjson.dumps(_entry("dd", "cc")).decode()
        + "\u00a0\u2028\r\n \n\u3000"
    )
    pifile = read_pi_file(text)
    assert [e["id"] for e in pifile.entries] == ["cc", "dd"]
    assert pifile.skipped_lines == (3, 4)
    # A line with trailing NBSP parses only while it is the last non-blank line (checked
    # against node: once another line follows, "dd" fails JSON.parse and is skipped).
    tail = orjson.dumps(_entry("ee", "dd")).decode() + "\u00a0"
    assert [e["id"] for e in read_pi_file(text + "\n" + tail + "\n\n").entries] == ["cc", "ee"]
    assert [e["id"] for e in read_pi_file(text + "\n" + tail + "\ngarbage").entries] == ["cc"]


def test_streams_in_arbitrary_chunks() -> None:
    fixture = FIXTURES / "random_tree_small" / "session.jsonl"
    data = fixture.read_bytes()

    class Dribble(io.RawIOBase):
        def __init__(self) -> None:
            self.data, self.position = data, 0

        def read(self, size: int = -1) -> bytes:
            piece = self.data[self.position : self.position + 7]
            self.position += len(piece)
            return piece

    whole = read_pi_file(fixture)
    sources: list[Any] = [Dribble(), io.BytesIO(data), data, str(fixture)]
    for source in sources:
        other = read_pi_file(source)
        assert_same(other.entries, whole.entries, f"entries read from {type(source).__name__}")
    as_lines = parse_pi_lines(data.decode().split("\n"))
    assert_same(as_lines.entries, whole.entries, "entries from parse_pi_lines")
    assert as_lines.content_hash == whole.content_hash


def test_invalid_utf8_is_replaced_like_node() -> None:
    line = orjson.dumps(_entry("e1", None, "PLACEHOLDER")).replace(
        b"PLACEHOLDER", b"a\xff\xfeb\xe2\x82"
    )
    pifile = read_pi_file(orjson.dumps(HEADER) + b"\n" + line + b"\n")
    assert pifile.entries[0]["message"]["content"] == "a\ufffd\ufffdb\ufffd"


def test_refuses_what_the_store_cannot_hold() -> None:
    head = orjson.dumps(HEADER) + b"\n"
    cases = {
        b'{"type":"custom","id":"e1","parentId":null,"data":1e400}': "not finite",
        b'{"type":"custom","id":"e1","parentId":null,"data":' + b"9" * 5000 + b"}": "not finite",
        b'{"type":"custom","id":42,"parentId":null}': "entry id is not a string",
        b'{"type":"custom","id":"e1","parentId":7}': "parentId must be a string or null",
        b'{"type":"session_info","id":"e1","parentId":null,"name":5}': "name must be a string",
        b'{"type":"redaction","id":"e1","parentId":null,"targetId":"x"}': "string reason",
        b"null": "null where an entry object was expected",
        b"[1]": "a JSON array where an entry object was expected",
    }
    for line, message in cases.items():
        with pytest.raises(InvalidEntryError, match=re.escape(message)):
            read_pi_file(head + line + b"\n")
    with pytest.raises(InvalidEntryError, match="the first JSON value is null"):
        read_pi_file(b"garbage\nnull\n" + head)
    # JSON.parse takes any depth; Python's parsers stop near 1000 levels: refused, not skipped.
    deep = b'{"type":"custom","id":"d","parentId":null,"data":' + b"[" * 5000 + b"]" * 5000 + b"}"
    with pytest.raises(InvalidEntryError, match="nested too deeply"):
        read_pi_file(head + deep + b"\n")
    nested = b'{"type":"custom","id":"d","parentId":null,"data":' + b"[" * 900 + b"]" * 900 + b"}"
    assert [e["id"] for e in read_pi_file(head + nested + b"\n").entries] == ["d"]


def test_lone_surrogates_are_kept_and_written_back_as_javascript_writes_them() -> None:
    # What JSON.stringify wrote for strings cut inside an emoji (checked against node):
    # escapes, lowercase; a whole pair stays one character, raw.
    line = (
        b'{"type":"custom","id":"e1","parentId":null,"data":{"\\ud83d":"ab\\uD83D",'
        b'"k":["\\ude00\\ud83d","\\ud83d\\ude00","x\\udfff\\u00e9\xf0\x9f\x9a\x80"]}}'
    )
    pifile = read_pi_file(orjson.dumps(HEADER) + b"\n" + line + b"\n")
    (entry,) = pifile.entries
    assert entry["data"] == {"\ud83d": "ab\ud83d", "k": ["\ude00\ud83d", "😀", "x\udfffé🚀"]}
    assert dumps_js(entry) == (
        b'{"type":"custom","id":"e1","parentId":null,"data":{"\\ud83d":"ab\\ud83d",'
        b'"k":["\\ude00\\ud83d","\xf0\x9f\x98\x80","x\\udfff\xc3\xa9\xf0\x9f\x9a\x80"]}}'
    )
    again = read_pi_file(b"".join(export_pi_bytes(HEADER, pifile.entries)))
    assert_same(again.entries, pifile.entries, "entries after export")
    # Text given as str may hold the surrogates themselves: a pair of them is one character to
    # JavaScript (a UTF-16 string), so it is read as that character.
    text = orjson.dumps(HEADER).decode() + '\n{"type":"custom","id":"e1","parentId":null,"data":"\ud83d\ude00|\ud83d"}\n'
    assert read_pi_file(text).entries[0]["data"] == "😀|\ud83d"
    # Only Python values hold a pair as two code points: JSON.parse(JSON.stringify()) joins
    # them, and writing one is refused (it could never be read back as itself).
    assert normalize_js_value({"\ud83d\ude00": ["\ud83d\ude00", "\ude00\ud83d"]}) == {
        "😀": ["😀", "\ude00\ud83d"]
    }
    with pytest.raises(InvalidEntryError, match="surrogate pair as two code points"):
        dumps_js(["\ud83d\ude00"])


def _label(entry_id: str, parent: str, label: Any, **target: Any) -> dict[str, Any]:
    return {
        "type": "label",
        "id": entry_id,
        "parentId": parent,
        "timestamp": "2025-03-01T10:02:00.000Z",
        **target,
        "label": label,
    }


def test_labels_without_a_string_target_are_keys_of_pis_label_map() -> None:
    entries = [
        _entry("e1", None),
        _label("l1", "e1", "undefined"),
        _label("l2", "l1", "null", targetId=None),
        _label("l3", "l2", "true", targetId=True),
        _label("l4", "l3", "one", targetId=1),
        _label("l5", "l4", "one again", targetId=1.0),  # the same key: keeps its place
        _label("l6", "l5", "object", targetId={"id": "e1"}),
        _label("l7", "l6", "", targetId={"id": "e1"}),  # another object: deletes nothing
        _label("l8", "l7", None),  # deletes the undefined key, not the null one
        _label("l9", "l8", "e1's", targetId="e1"),
    ]
    validate_entry(entries[1])
    session = Session(HEADER, entries)
    assert session.label_map == (
        (None, "null"),
        (True, "true"),
        (1, "one again"),
        ({"id": "e1"}, "object"),
        ("e1", "e1's"),
    )
    # Only entry ids look labels up: the others show nowhere else.
    assert session.labels == {"e1": "e1's"} and session.get_label("e1") == "e1's"
    assert [node.label for node in session.get_tree()] == ["e1's"]
    assert session.label_timestamps == {"e1": "2025-03-01T10:02:00.000Z"}
    # A redacted label sets nothing, whatever its target.
    redacted = Session(HEADER, [*entries, _redaction("r1", "l9", "l2")])
    assert redacted.label_map[0] == (True, "true")


def test_empty_files_report_why() -> None:
    assert read_pi_file(b"").empty_reason == "no parseable line"
    assert read_pi_file(b"\n  \nnot json\n").skipped_lines == (3,)
    invalid = read_pi_file(_file({"type": "message", "id": "m"}, HEADER))
    assert invalid.header is None and invalid.entries == []
    assert invalid.empty_reason == "the first JSON value is not a session header"
    with pytest.raises(InvalidEntryError):
        invalid.to_session()


def test_identical_duplicate_lines_are_kept_once() -> None:
    e1, e2, e3 = _entry("e1", None), _entry("e2", "e1"), _entry("e3", "e2")
    pifile = read_pi_file(_file(HEADER, e1, e2, HEADER, e1, e2, e3))  # pi's re-append quirk
    assert [e["id"] for e in pifile.entries] == ["e1", "e2", "e3"]
    assert pifile.collapsed_duplicates == (5, 6) and pifile.dropped_headers == (4,)
    with pytest.raises(InvalidEntryError, match="duplicate entry id 'e1' with different content"):
        read_pi_file(_file(HEADER, e1, e2, _entry("e1", None, "changed")))
    with pytest.raises(InvalidEntryError, match="ends with a repeat of entry 'e1'"):
        read_pi_file(_file(HEADER, e1, e2, e1))


def test_v1_minted_ids_are_deterministic() -> None:
    path = FIXTURES / "legacy_v1_basic" / "session.jsonl"
    first, second = read_pi_file(path), read_pi_file(path.read_bytes())
    assert [e["id"] for e in first.entries] == [e["id"] for e in second.entries]
    digest = bytes.fromhex(first.content_hash)
    # Position counts parsed values, header included (like firstKeptEntryIndex).
    assert [e["id"] for e in first.entries] == [
        mint_id(digest, position) for position in range(1, len(first.entries) + 1)
    ]
    assert all(_HEX16.match(e["id"]) for e in first.entries)
    assert [e["parentId"] for e in first.entries] == [None] + [e["id"] for e in first.entries[:-1]]
    extra = b'{"type":"message","timestamp":"2025-03-01T11:00:00.000Z","message":{"role":"user","content":"more"}}\n'
    changed = read_pi_file(path.read_bytes() + extra)
    assert {e["id"] for e in changed.entries}.isdisjoint(e["id"] for e in first.entries)
    # CRLF and blank lines do not change the content, so they do not change the ids.
    crlf = read_pi_file(path.read_bytes().replace(b"\n", b"\r\n\n"))
    assert [e["id"] for e in crlf.entries] == [e["id"] for e in first.entries]


def test_version_comparisons_follow_javascript() -> None:
    assert js_to_number("2") == 2 and js_to_number(" 0x10 ") == 16 and js_to_number([3]) == 3
    assert js_to_number("") == 0 and js_to_number(None) == 0 and js_to_number(True) == 1
    not_numbers: list[Any] = ["abc", "1_0", "inf", {}, [1, 2]]
    assert all(math.isnan(js_to_number(v)) for v in not_numbers)
    body = _file(
        {"type": "message", "id": "m", "parentId": None, "message": {"role": "hookMessage"}}
    )
    for version, steps in (
        ('"2"', ("v2->v3",)),
        ("[2]", ("v2->v3",)),
        ("true", ("v1->v2", "v2->v3")),
        ("null", ("v1->v2", "v2->v3")),
        ('"3"', ()),
        ("4", ()),
        ('"abc"', ()),
    ):
        header = b'{"type":"session","id":"v","version":' + version.encode() + b"}\n"
        pifile = read_pi_file(header + body)
        assert pifile.migration.steps == steps, version
        assert pifile.migration.rewritten == (version not in ('"3"', "4")), version
        assert pifile.header is not None
        if steps:
            assert pifile.header["version"] == 3
        assert pifile.entries[0]["message"]["role"] == ("custom" if steps else "hookMessage")
        assert (pifile.entries[0]["id"] == "m") == ("v1->v2" not in steps)


# --- JavaScript values ---------------------------------------------------------------------------


def _js_quote(text: str) -> str:
    """ECMA-262 QuoteJSONString, written out independently of orjson."""
    short = {
        "\b": "\\b",
        "\t": "\\t",
        "\n": "\\n",
        "\f": "\\f",
        "\r": "\\r",
        '"': '\\"',
        "\\": "\\\\",
    }
    out = []
    for ch in text:
        if ch in short:
            out.append(short[ch])
        elif ord(ch) < 0x20 or 0xD800 <= ord(ch) <= 0xDFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def test_string_escapes_match_json_stringify() -> None:
    samples = [chr(c) for c in range(0x80)] + [
        "\u0085",
        "\u00a0",
        "\u2028",
        "\u2029",
        "\ufeff",
        "é",
        "😀",
        "/",
        "</script>",
        "\ud83d",  # lone surrogates, as "🚀".slice(0, 1) leaves one
        "\ude80",
        "😀\ud83d\u2028\udfff\n\ud800",
    ]
    for sample in samples:
        assert dumps_js(sample).decode() == _js_quote(sample), repr(sample)
        assert (
            dumps_js({sample: sample}).decode()
            == "{" + _js_quote(sample) + ":" + _js_quote(sample) + "}"
        )


# Number.prototype.toString results, taken from node 20 (ECMA-262 Number::toString).
JS_NUMBER_STRINGS = [
    (1e-7, "1e-7"),
    (1.5e-6, "0.0000015"),
    (1e-6, "0.000001"),
    (1.5e-5, "0.000015"),
    (1e21, "1e+21"),
    (1.2345e21, "1.2345e+21"),
    (123456789012345680000.0, "123456789012345680000"),
    (1e16, "10000000000000000"),
    (0.1, "0.1"),
    (-1.5e-6, "-0.0000015"),
    (5e-324, "5e-324"),
    (1.7976931348623157e308, "1.7976931348623157e+308"),
    (0.1 + 0.2, "0.30000000000000004"),
    (100.0, "100"),
    (2.0**53, "9007199254740992"),
    (2.0**64, "18446744073709552000"),
    (-1e-7, "-1e-7"),
    (1.5, "1.5"),
    (1.23e-18, "1.23e-18"),
    (-0.0, "0"),
]


def test_number_formatting_matches_javascript() -> None:
    for value, text in JS_NUMBER_STRINGS:
        assert js_number_to_string(value) == text, value
        assert dumps_js(value).decode() == text, value
        assert dumps_js([value]).decode() == f"[{text}]", value
    rng = random.Random(20250301)
    for _ in range(20000):
        value = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if not math.isfinite(value):
            continue
        text = js_number_to_string(value)
        assert float(text) == value
        assert dumps_js(value).decode() == text
        # Everything we write through orjson unchanged must already be JS's spelling.
        if not value.is_integer() and not 1e-6 <= abs(value) < 1e-5:
            assert orjson.dumps(value).decode() == text


def test_numbers_are_held_as_javascript_holds_them() -> None:
    value = normalize_js_value(
        {"a": 1.0, "b": -0.0, "c": 2**64, "d": 2**53 + 1, "e": 1e21, "f": [1e300 * 10]} | {"f": 0.5}
    )
    assert typed(value) == typed(
        {"a": 1, "b": 0, "c": 18446744073709552000, "d": 9007199254740992, "e": 1e21, "f": 0.5}
    )
    assert list(normalize_js_value({"b": 1, "10": 2, "2": 3, "01": 4, "4294967295": 5})) == [
        "2",
        "10",
        "b",
        "01",
        "4294967295",
    ]
    for bad in (math.nan, math.inf, {"k": object()}, {1: "x"}):
        with pytest.raises(InvalidEntryError):
            dumps_js(bad)
    assert dumps_js((1, 2.0)) == b"[1,2]"


# new Date(x).getTime() in node 20 (TZ=UTC); None is NaN.
JS_DATES: list[tuple[Any, int | None]] = [
    ("2025-03-01T10:00:00.000Z", 1740823200000),
    ("2025-02-30T00:00:00Z", 1740873600000),
    ("2024-02-29T23:59:59.999Z", 1709251199999),
    ("2025-03-01", 1740787200000),
    ("2025-03", 1740787200000),
    ("2025", 1735689600000),
    ("+002025-03-01T00:00:00Z", 1740787200000),
    ("-000001-01-01T00:00:00Z", -62198755200000),
    ("-271821-04-20T00:00:00Z", -8640000000000000),
    ("-271821-04-19T23:59:59.999Z", None),
    ("+275760-09-13T00:00:00Z", 8640000000000000),
    ("2025-03-01T24:00:00Z", 1740873600000),
    ("2025-03-01T24:00:00.001Z", None),
    ("2025-03-01T10:00Z", 1740823200000),
    ("2025-03-01T10:00:00.1Z", 1740823200100),
    ("2025-03-01T10:00:00.123456Z", 1740823200123),
    ("2025-03-01T10:00:00+01:00", 1740819600000),
    ("2025-03-01T10:00:00-0130", 1740828600000),
    ("2025-03-01t10:00:00z", 1740823200000),
    ("2025-03-01T10:00:00", 1740823200000),
    ("2025-13-01", None),
    ("2025-01-32", None),
    ("2025-03-01T10:60:00Z", None),
    ("2025-03-01T25:00:00Z", None),
    ("2025-03-01T10:00:00+24:00", None),
    ("0000-01-01T00:00:00Z", -62167219200000),
    ("-000400-02-29T00:00:00Z", -74784902400000),
    ("not-a-date", None),
    ("", None),
    (None, 0),
    (5, 5),
    (1.7, 1),
    (True, 1),
    ({}, None),
    (8.64e15 + 1, None),
]


def test_dates_parse_like_javascript() -> None:
    for value, ms in JS_DATES:
        assert js_date_ms(value) == ms, value
    assert js_date_ms() is None  # new Date(undefined)


def test_js_trim_is_not_str_strip() -> None:
    assert js_trim("\ufeff\u00a0 name \u2028") == "name"
    assert js_trim("\x1cname\x85") == "\x1cname\x85"  # Python's strip() would remove these


# --- the session model ---------------------------------------------------------------------------


def _linear_basic() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    pifile = read_pi_file(FIXTURES / "linear_basic" / "session.jsonl")
    assert pifile.header is not None
    return pifile.header, pifile.entries


def _redaction(rid: str, parent: str, target: str, reason: str = "pii") -> dict[str, Any]:
    return {
        "type": "redaction",
        "id": rid,
        "parentId": parent,
        "timestamp": "2025-03-01T10:00:20.000Z",
        "targetId": target,
        "reason": reason,
    }


def test_redaction_hides_target_everywhere() -> None:
    header, entries = _linear_basic()
    plain = Session(header, entries)
    assistant = next(
        e for e in entries if e["type"] == "message" and e["message"]["role"] == "assistant"
    )
    assert plain.leaf_id is not None
    redaction = _redaction("red00001", plain.leaf_id, assistant["id"])
    session = Session(header, [*entries, redaction])

    tombstone = session.get_entry(assistant["id"])
    assert tombstone == {
        "type": assistant["type"],
        "id": assistant["id"],
        "parentId": assistant["parentId"],
        "timestamp": assistant["timestamp"],
        "redacted": {"reason": "pii", "redactionId": "red00001"},
    }
    assert list(tombstone) == ["type", "id", "parentId", "timestamp", "redacted"]
    assert session.entries[entries.index(assistant)] is tombstone
    assert session.redacted_ids == {assistant["id"]}
    assert entries[entries.index(assistant)]["message"] is assistant["message"]  # input untouched

    assert session.leaf_id == "red00001"
    assert [e["id"] for e in session.get_branch()] == [e["id"] for e in plain.get_branch()] + [
        "red00001"
    ]
    context = session.build_context()
    expected_messages = [
        m for m in plain.build_context()["messages"] if m is not assistant["message"]
    ]
    assert context["messages"] == expected_messages
    assert context["model"] == plain.build_context()["model"]  # later assistants still set it
    # The redaction is a tree node like a label: child of the old leaf, emitting nothing.
    assert session.get_children(plain.leaf_id) == [redaction]
    assert (
        build_session_context(session.get_branch()[:-1], skip_ids=session.redacted_ids) == context
    )


def test_redacted_settings_have_no_effect() -> None:
    entries: list[dict[str, Any]] = [
        {
            "type": "model_change",
            "id": "m1",
            "parentId": None,
            "timestamp": "2025-03-01T10:00:01.000Z",
            "provider": "a",
            "modelId": "one",
        },
        {
            "type": "thinking_level_change",
            "id": "t1",
            "parentId": "m1",
            "timestamp": "2025-03-01T10:00:02.000Z",
            "thinkingLevel": "low",
        },
        _entry("u1", "t1", "q1"),
        {
            "type": "model_change",
            "id": "m2",
            "parentId": "u1",
            "timestamp": "2025-03-01T10:00:04.000Z",
            "provider": "b",
            "modelId": "two",
        },
        {
            "type": "thinking_level_change",
            "id": "t2",
            "parentId": "m2",
            "timestamp": "2025-03-01T10:00:05.000Z",
            "thinkingLevel": "high",
        },
        {
            "type": "compaction",
            "id": "c1",
            "parentId": "t2",
            "timestamp": "2025-03-01T10:00:06.000Z",
            "summary": "S",
            "firstKeptEntryId": "u1",
            "tokensBefore": 9,
        },
        {
            "type": "label",
            "id": "l1",
            "parentId": "c1",
            "timestamp": "2025-03-01T10:00:07.000Z",
            "targetId": "u1",
            "label": "mark",
        },
        {
            "type": "session_info",
            "id": "n1",
            "parentId": "l1",
            "timestamp": "2025-03-01T10:00:08.000Z",
            "name": " first ",
        },
        {
            "type": "session_info",
            "id": "n2",
            "parentId": "n1",
            "timestamp": "2025-03-01T10:00:09.000Z",
            "name": "second",
        },
        _entry("u2", "n2", "q2"),
    ]
    before = Session(HEADER, entries)
    assert before.build_context()["thinkingLevel"] == "high"
    assert before.build_context()["model"] == {"provider": "b", "modelId": "two"}
    assert before.build_context()["messages"][0]["role"] == "compactionSummary"
    assert before.labels == {"u1": "mark"} and before.name == "second"

    redactions = [
        _redaction(f"r{n}", prev, target)
        for n, (prev, target) in enumerate(
            zip(["u2", "r0", "r1", "r2", "r3"], ["m2", "t2", "c1", "l1", "n2"])
        )
    ]
    after = Session(HEADER, entries + redactions)
    context = after.build_context()
    assert context["thinkingLevel"] == "low"
    assert context["model"] == {"provider": "a", "modelId": "one"}
    assert [m.get("content") for m in context["messages"]] == ["q1", "q2"]  # no compaction
    assert after.labels == {} and after.name == "first"
    assert after.get_entry("c1") == {
        "type": "compaction",
        "id": "c1",
        "parentId": "t2",
        "timestamp": "2025-03-01T10:00:06.000Z",
        "redacted": {"reason": "pii", "redactionId": "r2"},
    }
    # Unknown targets and redactions of redactions change nothing.
    noop = Session(HEADER, entries + [_redaction("x1", "u2", "nope"), _redaction("x2", "x1", "x1")])
    assert noop.redacted_ids == frozenset()
    assert noop.build_context()["messages"] == before.build_context()["messages"]


def test_redacted_session_exports_safely_for_pi() -> None:
    header, entries = _linear_basic()
    target = entries[3]
    session = Session(header, [*entries, _redaction("red00001", entries[-1]["id"], target["id"])])
    exported = list(session.to_pi_entries())
    assert exported[3] == {
        "type": "redacted",
        "id": target["id"],
        "parentId": target["parentId"],
        "timestamp": target["timestamp"],
        "redacted": {"reason": "pii", "redactionId": "red00001", "type": target["type"]},
    }
    reread = read_pi_file(b"".join(export_pi_bytes(session.header, exported))).to_session()
    # pi ignores the unknown "redacted" type, so its context equals ours.
    assert reread.build_context()["messages"] == session.build_context()["messages"]
    assert reread.redacted_ids == {target["id"]}


def test_stored_tombstones_read_like_redactions() -> None:
    """A compacted base stores the tombstones themselves; the model reads them the same way."""
    header, entries = _linear_basic()
    leaf = entries[-1]["id"]
    live = Session(
        header,
        [
            *entries,
            _redaction("red00001", leaf, entries[3]["id"]),
            _redaction("red00002", "red00001", entries[0]["id"], "model"),
        ],
    )
    compacted = Session(header, live.entries)  # what the compactor writes, redactions kept
    assert compacted.entries == live.entries
    assert compacted.redacted_ids == live.redacted_ids == {entries[3]["id"], entries[0]["id"]}
    assert compacted.build_context() == live.build_context()
    assert compacted.build_context()["model"] == live.build_context()["model"]
    # Without the redaction entries the tombstones still have no effect.
    bare = Session(header, [e for e in live.entries if e["type"] != "redaction"])
    assert bare.redacted_ids == live.redacted_ids
    assert bare.build_context()["messages"] == live.build_context()["messages"]
    tombstone = live.get_entry(entries[3]["id"])
    assert tombstone is not None
    validate_entry(tombstone)
    # Only the exact tombstone shape counts: anything else must be a valid entry of its type.
    with pytest.raises(InvalidEntryError, match="needs a `message` object"):
        validate_entry({**tombstone, "extra": 1})
    lookalike = {**entries[2], "redacted": {"reason": "x", "redactionId": "y"}}
    assert Session(header, [*entries[:2], lookalike]).redacted_ids == frozenset()


@pytest.mark.timeout(10)
def test_cycles_are_refused_without_hanging() -> None:
    a = _entry("aa", "bb")
    b = _entry("bb", "aa")
    with pytest.raises(InvalidEntryError, match="parentId cycle"):
        Session(HEADER, [_entry("r0", None), a, b])
    with pytest.raises(InvalidEntryError, match="parentId cycle"):
        Session(HEADER, [_entry("ss", "ss")])
    long_cycle = [_entry(f"c{i:04d}", f"c{(i + 1) % 3000:04d}") for i in range(3000)]
    with pytest.raises(InvalidEntryError, match="parentId cycle"):
        Session(HEADER, long_cycle)
    # The pure walk refuses too, even on a mapping nobody validated.
    with pytest.raises(InvalidEntryError, match="parentId cycle"):
        branch_path({"aa": a, "bb": b}, "aa")
    with pytest.raises(InvalidEntryError, match="parentId cycle"):
        read_pi_file(_file(HEADER, _entry("r0", None), a, b))


def test_session_api() -> None:
    entries = [
        _entry("r1", None),
        _entry("c2", "r1"),
        _entry("c1", "r1", timestamp="2025-03-01T09:00:00.000Z"),
        _entry("o1", "ghost"),
        _entry("n1", "r1", timestamp="not a date"),
    ]
    session = Session(HEADER, entries)
    assert [e["id"] for e in session.get_children("r1")] == ["c2", "c1", "n1"]
    assert [e["id"] for e in session.get_children(None)] == ["r1"]
    tree = session.get_tree()
    assert [n.entry["id"] for n in tree] == ["r1", "o1"]  # orphans are roots, kept
    assert [n.entry["id"] for n in tree[0].children] == ["c1", "c2", "n1"]
    assert tree[0].to_dict()["children"][0]["entry"]["id"] == "c1"
    assert session.get_branch("o1") == [entries[3]]
    assert session.get_branch("missing") == [] and session.get_entry("missing") is None
    with pytest.raises(EntryNotFoundError):
        session.build_context("missing")
    assert session.build_context("c1")["messages"] == [entries[0]["message"], entries[2]["message"]]
    assert len(session) == 5 and "c1" in session and list(session) == entries
    with pytest.raises(InvalidEntryError, match="duplicate entry id"):
        Session(HEADER, [entries[0], entries[0]])
    with pytest.raises(InvalidInputError):
        Session(None, [])  # type: ignore[arg-type]
    empty = Session(HEADER, [])
    assert empty.leaf_id is None and empty.get_branch() == [] and empty.get_tree() == []
    assert empty.build_context() == {"messages": [], "thinkingLevel": "off", "model": None}
    for bad in (
        {"id": "x", "type": "session"},
        {"id": "", "type": "x"},
        {"type": "message", "id": "m"},
    ):
        with pytest.raises(InvalidEntryError):
            validate_entry(bad)


# --- streaming -----------------------------------------------------------------------------------


def _large_session_lines(target_bytes: int) -> Iterator[bytes]:
    rng = random.Random(7)
    yield dumps_js(HEADER) + b"\n"
    written, parent, n = 0, None, 0
    while written < target_bytes:
        n += 1
        entry_id = f"{n:08x}"
        message = conversation_message(rng, n)
        line = (
            dumps_js(
                {
                    "type": "message",
                    "id": entry_id,
                    "parentId": parent,
                    "timestamp": "2025-03-01T10:00:00.000Z",
                    "message": message,
                }
            )
            + b"\n"
        )
        written += len(line)
        parent = entry_id
        yield line


def test_large_file_parses_with_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "large.jsonl"
    with path.open("wb") as handle:
        handle.writelines(_large_session_lines(20 * 1024 * 1024))
    size = path.stat().st_size
    tracemalloc.start()
    try:
        pifile = read_pi_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert pifile.header is not None and len(pifile.entries) > 5000
    assert peak < 3 * size, f"peak {peak / size:.2f}x the file size"
    last = pifile.entries[-1]
    assert Session(pifile.header, pifile.entries).leaf_id == last["id"]


def test_parse_result_type() -> None:
    pifile = read_pi_file(FIXTURES / "linear_basic" / "session.jsonl")
    assert isinstance(pifile, PiFile)
    assert len(pifile.entry_lines) == len(pifile.entries) and pifile.entry_lines[0] == 2
    assert pifile.migration.header_version == 3 and pifile.migration.label is None
