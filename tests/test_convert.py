"""``sessionstore embedded convert``: a store of the file backend (a file per object) becomes
a log store, with every session, entry and time as they were; refused while the store is in
use; a failure leaves the old store untouched."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path
from typing import Any

import pytest

from compactor.compact import Compactor
from compactor.config import CompactorOptions
from store import SessionStore
from store.cli import main
from store.convert import StoreInUseError, convert_to_log
from store.embedded import EmbeddedRedis
from store.file_objects import FileObjectStore
from store.log_objects import LogObjectStore
from store.objects import object_store_from_url


def _entry(eid: str, parent: str | None, text: str) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent, "timestamp": "2026-11-27T10:00:00.000Z",
            "message": {"role": "user", "content": [{"type": "text", "text": text}]}}


def _old_store(root: Path) -> dict[str, list[dict[str, Any]]]:
    """A store of the file backend with three sessions (one compacted, one forked), its
    embedded Redis stopped afterwards: what a user of an earlier version has on disk."""
    st = SessionStore.from_url(root.as_uri() + "?format=files")
    assert isinstance(st.objects, FileObjectStore)
    for sid in ("a", "b"):
        st.create_session(sid, cwd="/w")
        parent = None
        for i in range(12):
            st.append_session_entries(sid, [_entry(f"{sid}{i}", parent, f"{sid} says {i}")])
            parent = f"{sid}{i}"
    Compactor(st, CompactorOptions()).compact_session("a")
    st.branch_from_entry("b", "b5", "c")
    st.append_session_entries("c", [_entry("c0", "b5", "forked")])
    loaded = {sid: st.load_session_entries(sid) for sid in ("a", "b", "c")}
    st.close()
    EmbeddedRedis(root / ".redis").stop()
    return loaded


def test_a_file_store_converted_reads_the_same_and_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    before = _old_store(root)
    times = {i.key: FileObjectStore(root).get(i.key).last_modified_ms for i in FileObjectStore(root).list("")}
    capsys.readouterr()
    assert main(["--objects", str(root), "--json", "embedded", "convert"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["objects"] == len(times) and Path(report["kept"]).is_dir()
    objects = object_store_from_url(root.as_uri())
    assert isinstance(objects, LogObjectStore)
    assert {i.key: objects.get(i.key).last_modified_ms for i in objects.list("")} == times
    assert not [p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")]  # no object files
    st = SessionStore.from_url(root.as_uri())  # a new embedded Redis: rebuilt from the objects
    try:
        assert {sid: st.load_session_entries(sid) for sid in before} == before
        st.append_session_entries("a", [_entry("a12", "a11", "after the conversion")], "a11")
        assert [e["id"] for e in st.load_session_entries("a")][-2:] == ["a11", "a12"]
        assert sorted(s.session_id for s in st.list_sessions().items) == ["a", "b", "c"]
    finally:
        st.close()
        EmbeddedRedis(root / ".redis").stop()
    # The old store, kept as it was, still opens as a file store with what it held.
    kept = SessionStore.from_url(Path(report["kept"]).as_uri())
    try:
        assert kept.load_session_entries("b") == before["b"]
    finally:
        kept.close()
        EmbeddedRedis(Path(report["kept"]) / ".redis").stop()


def test_a_failure_before_the_swap_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "store"
    before = _old_store(root)
    listing = sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".redis" not in p.parts)

    def die(point: str) -> None:
        raise RuntimeError("killed in the middle of the copy")

    with pytest.raises(RuntimeError):
        convert_to_log(root, fault=die)
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".redis" not in p.parts) == listing
    assert [p.name for p in tmp_path.iterdir()] == ["store"]  # the half copy is gone
    st = SessionStore.from_url(root.as_uri())
    try:
        assert isinstance(st.objects, FileObjectStore)
        assert st.load_session_entries("c") == before["c"]
    finally:
        st.close()
        EmbeddedRedis(root / ".redis").stop()


def _hold_open(root: str, ready: Any, done: Any) -> None:
    store = FileObjectStore(root)
    store.get("_layout/record.json")  # a store in use keeps its directories open
    ready.set()
    done.wait(60)


def test_refused_while_the_store_is_in_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    _old_store(root)
    st = SessionStore.from_url(root.as_uri())  # starts its embedded Redis again
    try:
        with pytest.raises(StoreInUseError, match="redis-server .* is running"):
            convert_to_log(root)
    finally:
        st.close()
        EmbeddedRedis(root / ".redis").stop()
    ctx = mp.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold_open, args=(str(root), ready, done))
    proc.start()
    try:
        assert ready.wait(60)
        capsys.readouterr()
        assert main(["--objects", str(root), "embedded", "convert"]) != 0
        assert f"processes {proc.pid} have files below" in capsys.readouterr().err
    finally:
        done.set()
        proc.join(30)
    assert isinstance(object_store_from_url(root.as_uri()), FileObjectStore)
    convert_to_log(root)  # at rest now
    assert isinstance(object_store_from_url(root.as_uri()), LogObjectStore)
    with pytest.raises(Exception, match="log store already"):
        convert_to_log(root)
