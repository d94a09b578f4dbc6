"""The records of the Claude Agent SDK's store: entry and index types, the ids derived from an
entry's content, the project index's fold (``ProjectState``) and the fold of a transcript's
summary that a listing keeps (``Fold``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from store.adapters.names import digest
from store.errors import InvalidInputError
from store.formats.records import Header


#: ``customType`` of the entry holding one SDK transcript entry (``data``).
ENTRY_TYPE = "claude-agent-sdk.entry"
#: ``customType`` of the records of a project's index session.
INDEX_TYPE = "claude-agent-sdk.index"
#: Key in a session header's ``pi_header`` naming the SDK key it holds.
HEADER_KEY = "claudeAgentSdk"

_EPOCH_ISO = "1970-01-01T00:00:00.000Z"
_MAX_UUID_ID = 200
#: Transcripts a listing reads at once.
_LIST_CONCURRENCY = 16


def _h(text: str, size: int = 10) -> str:
    return digest(text, scheme="blake2b", size=size)


def _anchor(uuids: list[str | None], i: int) -> str:
    """Where a uuid-less entry sits: the nearest uuid before it in its batch and how far back
    (else the nearest after it). The same batch gives the same anchors, and so does the same
    file cut into other batches as long as the cut does not fall between the two."""
    for j in range(i - 1, -1, -1):
        if uuids[j] is not None:
            return f"{uuids[j]}+{i - j}"
    for j in range(i + 1, len(uuids)):
        if uuids[j] is not None:
            return f"{uuids[j]}-{j - i}"
    raise AssertionError("a batch with a uuid")


def _canonical(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"a transcript entry is not JSON: {exc}") from None


# --- the project index ------------------------------------------------------------------------


@dataclass
class _Main:
    """What the index says of one main transcript."""

    mtime: int = 0
    #: {"inc", "through", "mtime", "data"} of the newest ``sum`` record, or None.
    summary: dict[str, Any] | None = None


@dataclass
class _ProjectState:
    mains: dict[str, _Main] = field(default_factory=dict)
    #: session id -> subpath -> registration time
    subs: dict[str, dict[str, int]] = field(default_factory=dict)
    #: incarnations a ``del`` record ended: their ``sum`` records are void.
    dead: set[str] = field(default_factory=set)

    def apply(self, entry: dict[str, Any]) -> None:
        if entry.get("type") != "custom" or entry.get("customType") != INDEX_TYPE:
            return
        rec = entry.get("data")
        if not isinstance(rec, dict):
            return
        op, sid, sub = rec.get("op"), rec.get("session_id"), rec.get("subpath")
        if not isinstance(sid, str):
            return
        if op == "reg":
            if sub is None:
                main = self.mains.setdefault(sid, _Main())
                if not main.mtime:
                    main.mtime = int(rec.get("mtime") or 0)
            else:
                self.subs.setdefault(sid, {}).setdefault(str(sub), int(rec.get("mtime") or 0))
        elif op == "sum":
            inc = rec.get("inc")
            if inc in self.dead:
                return  # folded from a transcript that a delete has ended since
            main = self.mains.setdefault(sid, _Main())
            cur = main.summary
            through = int(rec.get("through") or 0)
            if cur is None or cur["inc"] != inc or through >= cur["through"]:
                # A record whose fold changed nothing carries no ``data``: the previous stands.
                data = rec["data"] if "data" in rec else (cur["data"] if cur and cur["inc"] == inc else {})
                main.summary = {"inc": inc, "through": through, "mtime": int(rec["mtime"]), "data": data}
            main.mtime = max(main.mtime, int(rec["mtime"]))
        elif op == "del":
            self.dead.update(str(i) for i in rec.get("incs") or ())
            if sub is None:
                self.mains.pop(sid, None)
                self.subs.pop(sid, None)
            else:
                subs = self.subs.get(sid)
                if subs is not None:
                    subs.pop(str(sub), None)
                    if not subs:
                        del self.subs[sid]


@dataclass(frozen=True, slots=True)
class _Fold:
    """A main transcript's summary as this process last folded it: ``fold_session_summary``'s
    ``data`` over segments 1..``seq`` of incarnation ``inc``, and the newest write time
    (``mtime``, epoch ms) among them."""

    inc: str
    seq: int
    data: dict[str, Any]
    mtime: int


@dataclass
class _View:
    """This process's copy of a project index: read once, then only what was added."""

    header: Header | None
    seq: int
    tail: str
    state: _ProjectState


