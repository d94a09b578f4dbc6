"""Which layout a store uses (``store/layout.py``): decided once for ever, by its record.

The record is one object, ``<prefix>_layout/record.json`` (``{"layout": 1 or 2, ...}``),
created with If-None-Match and never changed. A process reads it once (one GET, at start);
only when it is missing does the process propose a layout and try to create the record:

- the store already holds a session directory (one LIST, ``MaxKeys=1``): the layout that
  directory is in. A directory without ``=`` is of the flat layout: the store was written
  before the record existed, by versions that know only that layout, and stays on it;
- else (an empty store): the spread layout.

Whatever it proposed, the process then uses what the record says: its own create, or, when
the create finds the record there (``ObjectExistsError``: another process was first, or an
earlier attempt of this one whose answer was lost), the record it reads back. So every
process of the store uses the layout of the one create that succeeded, however they
interleave or pause: what a process saw in its LIST only chooses what it proposes, never
what it uses (docs/design.md, "Object layout", the argument in full).
"""

from __future__ import annotations

import json
import logging

from store.errors import BackendRefusedError, CorruptObjectError, ObjectExistsError, ObjectNotFoundError
from store.layout import LAYOUT_FLAT, LAYOUT_SPREAD, LAYOUTS, SHARDS, Layout, record_key
from store.object_store import ObjectStore
from store.retry import RetryPolicy

log = logging.getLogger("sessionstore")


def read_record(objects: ObjectStore, prefix: str, retry: RetryPolicy) -> int | None:
    """The layout the store's record names; None when there is no record."""
    key = record_key(prefix)
    try:
        obj = retry.call(lambda: objects.get(key))
    except ObjectNotFoundError:
        return None
    try:
        doc = json.loads(obj.data)
        version = doc["layout"]
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptObjectError(key, 0, f"not a layout record: {exc}") from None
    if isinstance(version, bool) or version not in LAYOUTS:
        raise CorruptObjectError(key, 0, f"unknown layout {version!r}: written by a newer version?")
    return int(version)


def propose(objects: ObjectStore, prefix: str, retry: RetryPolicy) -> int:
    """The layout a store without a record should get: that of a session directory it
    already holds (one LIST of one directory), else the spread layout."""
    spread = Layout(prefix, LAYOUT_SPREAD)
    names, _ = retry.call(lambda: objects.list_dirs_page(spread.sessions_prefix, None, 1))
    if not names:
        return LAYOUT_SPREAD
    return LAYOUT_SPREAD if spread.sid_of_dir(names[0]) is not None else LAYOUT_FLAT


def record_body(version: int) -> bytes:
    doc = {"layout": version, "shards": SHARDS if version == LAYOUT_SPREAD else 1,
           "shard_of": "blake2b(utf-8 session id, digest_size=1), hex"}
    return json.dumps(doc, sort_keys=True).encode() + b"\n"


def decide_layout(objects: ObjectStore, prefix: str, retry: RetryPolicy) -> int:
    """The store's layout: its record's, creating the record when there is none."""
    recorded = read_record(objects, prefix, retry)
    if recorded is not None:
        return recorded
    proposal = propose(objects, prefix, retry)
    key = record_key(prefix)
    try:
        retry.call(lambda: objects.put_if_absent(key, record_body(proposal)))
    except ObjectExistsError:
        # Another process's create, or an earlier attempt of ours whose answer was lost:
        # the record decides either way.
        recorded = read_record(objects, prefix, retry)
        if recorded is None:
            # Records are never deleted by the store: someone removed it by hand just now.
            raise CorruptObjectError(key, 0, "the layout record vanished after its create failed") from None
        return recorded
    except BackendRefusedError as exc:
        # Read-only credentials: nothing this process does can write a session, so it
        # cannot make the store disagree with the proposal; the first writer records it.
        log.warning("layout record not created (%s): using layout %d unrecorded", exc, proposal)
        return proposal
    log.info("layout record created: layout %d", proposal)
    return proposal


__all__ = ["decide_layout", "propose", "read_record", "record_body"]
