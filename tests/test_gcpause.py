"""The reader's pause of the cyclic GC (store/gcpause.py): collections in steps while paused,
none when the caller had the collector off, and the collector back on only when the last
reader leaves. Counted through ``gc.callbacks``, never timed."""

from __future__ import annotations

import gc
import hashlib
import threading
from collections.abc import Iterator

import orjson
import pytest

from store.entries import decode_segment
from store.gcpause import collect_young, gc_paused


def _decode(data: bytes) -> list[dict[str, object]]:
    """As the reader decodes a verified object (the fast parse: its sha256 matches)."""
    return decode_segment("k", data, hashlib.sha256(data).hexdigest())


def _session_bytes(n: int) -> bytes:
    lines = []
    for i in range(n):
        entry = {"type": "message", "id": f"e{i}", "parentId": f"e{i - 1}" if i else None,
                 "message": {"role": "assistant", "content": [{"type": "text", "text": "x" * 20}]}}
        lines.append(orjson.dumps(entry))
    return b"\n".join(lines) + b"\n"


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generation of every collection while the test runs; the GC's state restored."""
    seen: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    enabled, thresholds = gc.isenabled(), gc.get_threshold()
    gc.enable()
    gc.collect()
    gc.callbacks.append(note)
    try:
        yield seen
    finally:
        gc.callbacks.remove(note)
        gc.set_threshold(*thresholds)
        (gc.enable if enabled else gc.disable)()


def test_a_paused_decode_collects_its_young_objects_in_steps(collections: list[int]) -> None:
    data = _session_bytes(20_000)  # about 80k containers: several steps of 7,700
    with gc_paused():
        assert not gc.isenabled()
        entries = _decode(data)
        assert len(entries) == 20_000
        assert collections and set(collections) == {1}  # middle collections only, no young ones
        young, middle, _ = gc.get_threshold()
        assert gc.get_count()[0] < young * (middle + 1)  # what is left for the re-enable is small
    assert gc.isenabled()


def test_nothing_is_collected_when_the_caller_had_the_collector_off(collections: list[int]) -> None:
    gc.disable()
    with gc_paused():
        _decode(_session_bytes(20_000))
        collect_young()
    assert collections == []
    assert not gc.isenabled()  # and it stays off


def test_nothing_is_collected_with_automatic_collection_switched_off(collections: list[int]) -> None:
    gc.set_threshold(0)
    with gc_paused():
        _decode(_session_bytes(20_000))
    assert collections == []


def test_outside_a_pause_the_decoder_leaves_the_collector_alone(collections: list[int]) -> None:
    gc.disable()  # so that only an explicit collection could show up
    _decode(_session_bytes(20_000))
    assert collections == []
    gc.enable()


def test_concurrent_readers_share_one_pause_and_collect_beside_each_other(collections: list[int]) -> None:
    """Two readers decode at once, each collecting in steps while the other builds its
    entries; the collector comes back on only when the second one leaves, and both get
    every entry intact."""
    data = _session_bytes(20_000)
    inside = threading.Barrier(2)
    first_left = threading.Event()
    results: dict[str, list[dict[str, object]]] = {}
    still_paused: list[bool] = []
    while_paused: list[int] = []

    def reader(name: str) -> None:
        with gc_paused():
            inside.wait()
            results[name] = _decode(data)
            if name == "b":
                first_left.wait()
                still_paused.append(not gc.isenabled())
                while_paused.extend(collections)
        if name == "a":
            first_left.set()

    threads = [threading.Thread(target=reader, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert still_paused == [True]
    assert gc.isenabled()
    assert set(while_paused) == {1}
    for got in results.values():
        assert [e["id"] for e in got] == [f"e{i}" for i in range(20_000)]
        assert got[-1]["message"] == {"role": "assistant", "content": [{"type": "text", "text": "x" * 20}]}
