"""``sessionstore import`` when session ids meet: the same file again, a longer version of it,
another file under the same header id, a session that grew in the store. Deterministic: the
same files give the same sessions and the same report on every run, whatever ``--jobs``.

Through the real entry point (``store.cli.main``) against the test's servers, as
tests/test_cli.py does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import pytest
from test_cli import CLI, backend_args, cli, jsonl, msg, one_line  # noqa: F401 - fixtures

from store import SessionStore
from store.cli import main
from store.cli.common import Exit

HEADER = {"type": "session", "version": 3, "id": "shared-id", "timestamp": "2026-01-01T00:00:00.000Z", "cwd": "/w"}


def pi_file(path: Path, *entries: dict[str, Any], header: dict[str, Any] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(jsonl(header or HEADER, *entries))
    return path


def chain(prefix: str, n: int, start: int = 0, parent: str | None = None) -> list[dict[str, Any]]:
    out = []
    for i in range(start, start + n):
        out.append(msg(f"{prefix}{i}", parent, "user", f"{prefix} {i}"))
        parent = f"{prefix}{i}"
    return out


def entries_of(cli: CLI, sid: str) -> list[dict[str, Any]]:
    res = cli("export", sid)
    assert res.code == 0, res.err
    return [json.loads(line) for line in res.out.splitlines()[1:]]


def roots(entries: list[dict[str, Any]]) -> list[str]:
    return [e["id"] for e in entries if e.get("parentId") is None]


@pytest.fixture
def pi_dir(tmp_path: Path) -> Path:
    """Four files: a, its longer version c, another file b under the same header id, and d."""
    d = tmp_path / "pi"
    a = chain("a", 3)
    pi_file(d / "a.jsonl", *a)
    pi_file(d / "b.jsonl", *chain("b", 2))
    pi_file(d / "c-longer.jsonl", *a, *chain("a", 2, start=3, parent="a2"))
    pi_file(d / "d.jsonl", *chain("d", 2), header={**HEADER, "id": "other-id"})
    return d


def test_files_sharing_a_header_id_never_merge(cli: CLI, pi_dir: Path) -> None:
    res = cli("import", str(pi_dir), "-v", "--jobs", "4")
    assert res.code == Exit.FAILED
    lines = res.out.splitlines()
    assert lines == [
        f"imported {pi_dir / 'a.jsonl'} as shared-id (3 entries)",
        f"refused {pi_dir / 'b.jsonl'}: session 'shared-id' already exists with other content (entry 1 is 'a0' "
        "in the store but 'b0' in the file, line 2); nothing imported: import it under another id "
        "(--id ID, or --on-conflict new-id)",
        f"imported {pi_dir / 'c-longer.jsonl'} into shared-id: 2 new entries (5 entries in the file)",
        f"imported {pi_dir / 'd.jsonl'} as other-id (2 entries)",
        "imported 3 of 4 files (10 entries, 7 of them new); 1 refused",
    ]
    stored = entries_of(cli, "shared-id")
    assert [e["id"] for e in stored] == ["a0", "a1", "a2", "a3", "a4"] and roots(stored) == ["a0"]
    # Again: the same report, nothing new, nothing merged.
    again = cli("import", str(pi_dir), "--json", "--jobs", "4")
    report = again.json()
    assert again.code == Exit.FAILED and report["appended"] == 0 and report["entries"] == 10
    assert [(f["ok"], f.get("status")) for f in report["files"]] == [
        (True, "unchanged"), (False, None), (True, "unchanged"), (True, "unchanged")]
    assert entries_of(cli, "shared-id") == stored


def test_the_report_is_the_same_on_every_run(
    pi_dir: Path, s3_url: str, redis_url: str, redis_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three fresh stores, the same directory: the same lines (entry counts included)."""
    outputs = []
    for run in range(3):
        parsed = urlparse(s3_url)
        url = urlunparse(parsed._replace(path=f"{parsed.path.rstrip('/')}/run{run}"))
        capsys.readouterr()
        code = main(["--objects", url, "--redis", redis_url, "--redis-prefix", f"{redis_prefix}-run{run}",
                     "import", str(pi_dir), "--jobs", str(1 + run * 3), "-q", "-v"])
        outputs.append((code, capsys.readouterr().out))
    assert outputs[0] == outputs[1] == outputs[2]
    assert outputs[0][0] == Exit.FAILED


def test_a_refused_file_writes_nothing_and_new_id_imports_it_elsewhere(cli: CLI, pi_dir: Path) -> None:
    assert cli("import", str(pi_dir / "a.jsonl")).code == 0
    before = entries_of(cli, "shared-id")
    res = cli("import", str(pi_dir / "b.jsonl"))
    assert res.code == Exit.CONFLICT  # one file: its own class, a conflict
    assert "already exists with other content" in one_line(res.out)
    assert entries_of(cli, "shared-id") == before
    assert cli("show", "shared-id-2").code == Exit.NOT_FOUND
    # On request, under <id>-2 (the header keeps the file's own id).
    res = cli("import", str(pi_dir / "b.jsonl"), "--on-conflict", "new-id", "--json")
    assert res.code == 0, res.out
    (row,) = res.json()["files"]
    assert row["session"] == "shared-id-2" and row["header_id"] == "shared-id" and row["status"] == "created"
    assert [e["id"] for e in entries_of(cli, "shared-id-2")] == ["b0", "b1"]
    # Again: found where it went, nothing new.
    res = cli("import", str(pi_dir / "b.jsonl"), "--on-conflict", "new-id", "--json")
    assert res.json()["files"][0]["session"] == "shared-id-2" and res.json()["files"][0]["status"] == "unchanged"
    # The whole directory with new-id: b lands in shared-id-2 again, a and c in shared-id.
    res = cli("import", str(pi_dir), "--on-conflict", "new-id", "--json")
    assert res.code == 0
    assert [f["session"] for f in res.json()["files"]] == ["shared-id", "shared-id-2", "shared-id", "other-id"]
    assert [e["id"] for e in entries_of(cli, "shared-id-2")] == ["b0", "b1"]  # unchanged by the re-run
    assert res.json()["appended"] == 4  # c's two new entries and d's two; a and b unchanged


def test_a_longer_version_of_the_file_appends_its_new_entries(cli: CLI, tmp_path: Path) -> None:
    path = pi_file(tmp_path / "live.jsonl", *chain("e", 2))
    assert cli("import", str(path)).code == 0
    with open(path, "ab") as fh:  # pi went on writing the file
        fh.write(jsonl(*chain("e", 3, start=2, parent="e1")))
    res = cli("import", str(path))
    assert res.code == 0 and res.out.strip() == f"imported {path} into shared-id: 3 new entries (5 entries in the file)"
    stored = entries_of(cli, "shared-id")
    assert [e["id"] for e in stored] == [f"e{i}" for i in range(5)] and roots(stored) == ["e0"]
    assert cli("import", str(path)).out.strip() == f"unchanged {path}: shared-id already holds its 5 entries"


def test_a_session_that_grew_in_the_store(cli: CLI, tmp_path: Path) -> None:
    """The store's session went on (appends, a redaction, a compaction): the original file
    changes nothing; a file that went on differently is refused."""
    path = pi_file(tmp_path / "s.jsonl", *chain("g", 3))
    assert cli("import", str(path)).code == 0
    assert cli("append", "shared-id", stdin=jsonl(msg("x1", "g2", "user", "in the store"))).code == 0
    assert cli("redact", "shared-id", "g1", "--reason", "secret").code == 0
    for _ in range(2):
        res = cli("import", str(path), "--json")
        assert res.code == 0 and res.json()["files"][0]["status"] == "unchanged", res.out
        assert cli("compact", "shared-id").code == 0  # the second round reads the tombstone from a base
    diverged = pi_file(tmp_path / "diverged.jsonl", *chain("g", 3), msg("g3", "g2", "user", "pi went on"))
    res = cli("import", str(diverged))
    assert res.code == Exit.CONFLICT
    assert "entry 4 is 'x1' in the store but 'g3' in the file" in res.out
    # Same id, another header: refused by name.
    other = pi_file(tmp_path / "h.jsonl", *chain("g", 3), header={**HEADER, "cwd": "/elsewhere"})
    res = cli("import", str(other))
    assert res.code == Exit.CONFLICT and "its header's 'cwd' is '/w' in the store and '/elsewhere' in the file" in res.out


def test_the_library_refuses_the_same_way(pi_dir: Path, make_store: Any) -> None:
    """store.pi_import.import_pi_file: what SessionStore.import_pi_session runs."""
    from store.pi_import import ImportConflictError, import_pi_file

    store: SessionStore = make_store()
    first = import_pi_file(store, pi_dir / "a.jsonl")
    assert (first.session_id, first.status, first.appended) == ("shared-id", "created", 3)
    assert first.handle.tail().entry_count == 3
    with pytest.raises(ImportConflictError) as info:
        import_pi_file(store, pi_dir / "b.jsonl")
    assert info.value.session_id == "shared-id" and "'b0'" in info.value.detail
    longer = import_pi_file(store, pi_dir / "c-longer.jsonl")
    assert (longer.status, longer.appended, longer.handle.tail().entry_count) == ("extended", 2, 5)
    moved = import_pi_file(store, pi_dir / "b.jsonl", on_conflict="new-id")
    assert (moved.session_id, moved.header_id) == ("shared-id-2", "shared-id")


def test_lines_that_are_not_json_are_reported_with_their_numbers(cli: CLI, tmp_path: Path) -> None:
    """pi skips a line that does not parse, and so does the import; but it says so, on stderr
    and in --json, with the line numbers, instead of exiting 0 as if the file were whole."""
    a0, a1 = chain("a", 2)
    path = tmp_path / "cut.jsonl"
    path.write_bytes(jsonl(HEADER, a0) + b'{"type":"message", "id": "lost\n\n' + jsonl(a1) + b"not json\n")
    res = cli("import", str(path), "--json")
    assert res.code == 0, res.err
    report = res.json()
    assert report["skipped_lines"] == 2
    assert report["files"][0]["skipped_lines"] == [3, 6]
    assert report["files"][0]["entries"] == 2
    line = one_line(res.err)
    assert str(path) in line and "skipped 2 lines" in line and "lines 3, 6" in line
    # Without --json: the same line on stderr, the usual one on stdout.
    res = cli("import", str(path))
    assert res.code == 0 and res.out.startswith("unchanged")
    assert "lines 3, 6" in one_line(res.err)
    # A whole file: nothing said, an empty list.
    whole = pi_file(tmp_path / "whole.jsonl", *chain("w", 2), header={**HEADER, "id": "whole"})
    res = cli("import", str(whole), "--json")
    assert res.code == 0 and res.err == ""
    assert res.json()["files"][0]["skipped_lines"] == [] and res.json()["skipped_lines"] == 0
