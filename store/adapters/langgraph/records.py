"""LangGraph's checkpoints as entries of a store session, and the fold that reads them back.

One store session holds one LangGraph thread, every checkpoint namespace of it. Every entry
is a pi ``custom`` entry, chained by ``parentId`` (each append continues from the tail it was
checked against), so the session is one path and a fork at its tail holds all of it:

| ``customType`` | ``id`` | ``data`` |
| --- | --- | --- |
| ``langgraph.blob`` | ``b.`` + digest(ns, channel, version, value) | one channel's value at one version |
| ``langgraph.checkpoint`` | ``c.`` + digest(ns, checkpoint id, checkpoint, metadata) | the checkpoint without its channel values, its metadata, its parent |
| ``langgraph.writes`` | ``w.`` + digest(ns, checkpoint id, task, path, writes) | one ``put_writes`` call |
| ``langgraph.drop`` | ``d.`` + random | checkpoint entries hidden from now on (``prune``, ``delete_for_runs``) |
| ``langgraph.thread`` | ``t.`` + digest(thread id) | the thread id of a copy, as ``copy_thread`` wrote it before the copy's header named it (read, no longer written) |

Values are LangGraph's own serializer's ``(type, bytes)``, the bytes in base64. A channel's
value is stored once per version: a checkpoint names its versions (``channel_versions``) and
the reader finds each channel's value by (namespace, channel, version), so a checkpoint
costs what changed since its parent. Ids are digests of the content, so a re-sent entry is
the store's duplicate (stored once) and a different one never collides.

The run index (``lg.runs.<digest>``, one per saver namespace) holds ``langgraph.run`` entries
``{"run": run_id, "thread": thread_id}``, written before the run's first checkpoint in a
thread, so ``delete_for_runs`` finds the threads without reading the store.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from store.clock import iso_now

BLOB_TYPE = "langgraph.blob"
CHECKPOINT_TYPE = "langgraph.checkpoint"
WRITES_TYPE = "langgraph.writes"
DROP_TYPE = "langgraph.drop"
THREAD_TYPE = "langgraph.thread"
RUN_TYPE = "langgraph.run"
#: The key of the header's ``pi_header`` that names the thread: ``{"thread", "namespace"}``.
HEADER_KEY = "langgraph"

Typed = tuple[str, bytes]


def digest_id(prefix: str, *parts: Any) -> str:
    """``<prefix>.`` + 20 bytes of blake2b of the parts as JSON: the same in every process."""
    text = json.dumps(parts, separators=(",", ":"), ensure_ascii=False)
    return prefix + "." + hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=20).hexdigest()


def typed_to_json(value: Typed) -> list[str]:
    return [value[0], base64.b64encode(value[1]).decode("ascii")]


def typed_from_json(value: Any) -> Typed:
    return (str(value[0]), base64.b64decode(value[1]))


def version_key(version: object) -> str:
    """A channel version as a key: its JSON, so 1 and "1" stay apart."""
    return json.dumps(version)


def custom(kind: str, entry_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """An entry of ``kind``; its ``parentId`` is set when the batch is chained to the tail."""
    return {"type": "custom", "customType": kind, "id": entry_id, "parentId": None,
            "timestamp": iso_now(), "data": data}


@dataclass(slots=True)
class StoredCheckpoint:
    """A checkpoint entry as the fold keeps it (decoded only when returned)."""

    entry_id: str
    ns: str
    checkpoint_id: str
    parent_id: str | None
    checkpoint: Typed
    metadata: Typed
    source: str | None
    run_id: str | None


#: A stored write: (task id, channel, value, task path).
StoredWrite = tuple[str, str, Typed, str]


@dataclass
class ThreadFold:
    """A thread's live checkpoints, blobs and writes, folded from its entries in commit order.

    ``incarnation``/``seq`` say how far the fold has read (``SessionStore.read_since``);
    ``last`` is the session's last entry id, the expected tail of the next append.
    """

    incarnation: str
    thread_id: str | None = None
    #: The session's header names the thread: a ``langgraph.thread`` record (in the path a
    #: copy inherits from a copy made before headers named it) does not rename it.
    named: bool = False
    seq: int = 0
    last: str = ""
    ids: set[str] = field(default_factory=set)
    #: ns -> checkpoint id -> checkpoint (namespaces in the order they first appeared).
    checkpoints: dict[str, dict[str, StoredCheckpoint]] = field(default_factory=dict)
    #: (ns, parent checkpoint id) -> the ids of its live children.
    children: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    #: (ns, channel, version key) -> value.
    blobs: dict[tuple[str, str, str], Typed] = field(default_factory=dict)
    #: (ns, checkpoint id) -> (task id, idx) -> write.
    writes: dict[tuple[str, str], dict[tuple[str, int], StoredWrite]] = field(default_factory=dict)
    by_entry: dict[str, StoredCheckpoint] = field(default_factory=dict)

    def apply(self, entries: Any) -> None:
        for entry in entries:
            entry_id = str(entry.get("id"))
            self.ids.add(entry_id)
            self.last = entry_id
            data = entry.get("data")
            kind = entry.get("customType")
            if entry.get("type") != "custom" or not isinstance(data, dict):
                continue
            if kind == BLOB_TYPE:
                self.blobs[(data["ns"], data["channel"], data["version"])] = typed_from_json(data["value"])
            elif kind == CHECKPOINT_TYPE:
                self._checkpoint(entry_id, data)
            elif kind == WRITES_TYPE:
                self._writes(data)
            elif kind == DROP_TYPE:
                for dropped in data.get("entries", ()):
                    self._drop(dropped)
            elif kind == THREAD_TYPE and not self.named:
                self.thread_id = data.get("thread")

    def _checkpoint(self, entry_id: str, data: dict[str, Any]) -> None:
        ns, cid, parent = data["ns"], data["id"], data.get("parent")
        old = self.checkpoints.get(ns, {}).get(cid)
        if old is not None:  # put again with other content: the newest is the checkpoint
            self.by_entry.pop(old.entry_id, None)
            self._unlink(old)
        stored = StoredCheckpoint(entry_id, ns, cid, parent, typed_from_json(data["checkpoint"]),
                                  typed_from_json(data["metadata"]), data.get("source"), data.get("run"))
        self.checkpoints.setdefault(ns, {})[cid] = stored
        self.by_entry[entry_id] = stored
        if parent is not None:
            self.children.setdefault((ns, parent), set()).add(cid)

    def _unlink(self, stored: StoredCheckpoint) -> None:
        if stored.parent_id is not None:
            kids = self.children.get((stored.ns, stored.parent_id))
            if kids is not None:
                kids.discard(stored.checkpoint_id)
                if not kids:
                    del self.children[(stored.ns, stored.parent_id)]

    def _drop(self, entry_id: str) -> None:
        stored = self.by_entry.pop(entry_id, None)
        if stored is None:
            return
        self._unlink(stored)
        ns_checkpoints = self.checkpoints.get(stored.ns, {})
        if ns_checkpoints.get(stored.checkpoint_id) is stored:
            del ns_checkpoints[stored.checkpoint_id]
            self.writes.pop((stored.ns, stored.checkpoint_id), None)

    def _writes(self, data: dict[str, Any]) -> None:
        # InMemorySaver's rule: a task's regular write (idx >= 0) is kept once, the first;
        # a special one (error, interrupt, ...: idx < 0) is replaced by the newest.
        stored = self.writes.setdefault((data["ns"], data["checkpoint"]), {})
        task, path = data["task"], data.get("path", "")
        for idx, channel, value in data["writes"]:
            key = (task, idx)
            if idx >= 0 and key in stored:
                continue
            stored[key] = (task, channel, typed_from_json(value), path)

    def has_writes(self, ns: str, checkpoint_id: str, task: str, idxs: list[int]) -> bool:
        """Whether every write of a ``put_writes`` call would be skipped (all regular, all kept)."""
        stored = self.writes.get((ns, checkpoint_id), {})
        return all(idx >= 0 and (task, idx) in stored for idx in idxs)

    def latest(self, ns: str) -> StoredCheckpoint | None:
        checkpoints = self.checkpoints.get(ns)
        return checkpoints[max(checkpoints)] if checkpoints else None


def checkpoint_entry(
    ns: str, checkpoint_id: str, parent_id: str | None, checkpoint: Typed, metadata: Typed,
    source: str | None, run_id: str | None,
) -> dict[str, Any]:
    data = {"ns": ns, "id": checkpoint_id, "parent": parent_id, "checkpoint": typed_to_json(checkpoint),
            "metadata": typed_to_json(metadata), "source": source, "run": run_id}
    entry_id = digest_id("c", ns, checkpoint_id, parent_id, data["checkpoint"], data["metadata"])
    return custom(CHECKPOINT_TYPE, entry_id, data)


def blob_entry(ns: str, channel: str, version: object, value: Typed) -> dict[str, Any]:
    data = {"ns": ns, "channel": channel, "version": version_key(version), "value": typed_to_json(value)}
    return custom(BLOB_TYPE, digest_id("b", ns, channel, data["version"], data["value"]), data)


def writes_entry(
    ns: str, checkpoint_id: str, task_id: str, task_path: str, writes: list[tuple[int, str, Typed]]
) -> dict[str, Any]:
    items = [[idx, channel, typed_to_json(value)] for idx, channel, value in writes]
    data = {"ns": ns, "checkpoint": checkpoint_id, "task": task_id, "path": task_path, "writes": items}
    return custom(WRITES_TYPE, digest_id("w", ns, checkpoint_id, task_id, task_path, items), data)


def run_entry(run_id: str, thread_id: str) -> dict[str, Any]:
    return custom(RUN_TYPE, digest_id("r", run_id, thread_id), {"run": run_id, "thread": thread_id})


__all__ = [
    "BLOB_TYPE", "CHECKPOINT_TYPE", "DROP_TYPE", "HEADER_KEY", "RUN_TYPE", "THREAD_TYPE", "WRITES_TYPE",
    "StoredCheckpoint", "StoredWrite", "ThreadFold", "Typed", "blob_entry", "checkpoint_entry", "custom",
    "digest_id", "run_entry", "typed_from_json", "typed_to_json", "version_key", "writes_entry",
]
