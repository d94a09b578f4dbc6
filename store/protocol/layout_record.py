"""Which layout a store uses (``store/formats/layout.py``): decided once for ever, by its record.

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

The record of a store created empty also holds the store's **stream key** (``stream_key``,
32 random bytes in hex): stream names that are not session ids are kept under a blake2b of
the name keyed with it (``store.formats.layout.stream_session_id``), so an id seen by a client (a
listing, an error, a log) cannot be tested against guessed names without the record. A store
recorded while it already held sessions gets no key: its streams were named by the unkeyed
hash and keep it.
"""

from __future__ import annotations

import json
import logging
import secrets

from store.errors import BackendRefusedError, CorruptObjectError, ObjectExistsError, ObjectNotFoundError
from store.formats.layout import LAYOUT_FLAT, LAYOUT_SPREAD, LAYOUTS, SHARDS, Layout, record_key
from store.backends.object_store import ObjectStore
from store.retry import RetryPolicy

log = logging.getLogger("sessionstore")


#: Bytes of a stream key (blake2b's largest key).
STREAM_KEY_BYTES = 32


def read_record(objects: ObjectStore, prefix: str, retry: RetryPolicy) -> tuple[int, bytes | None] | None:
    """The layout the store's record names and its stream key (None in records written
    before keys); None when there is no record."""
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
    stream_key = doc.get("stream_key")
    if stream_key is None:
        return int(version), None
    try:
        raw = bytes.fromhex(stream_key)
    except (TypeError, ValueError):
        raw = b""
    if len(raw) != STREAM_KEY_BYTES:
        raise CorruptObjectError(key, 0, f"stream_key is not {STREAM_KEY_BYTES} bytes in hex")
    return int(version), raw


def propose(objects: ObjectStore, prefix: str, retry: RetryPolicy) -> tuple[int, bool]:
    """The layout a store without a record should get: that of a session directory it
    already holds (one LIST of one directory), else the spread layout; and whether the
    store is empty (so its stream ids may be keyed)."""
    spread = Layout(prefix, LAYOUT_SPREAD)
    names, _ = retry.call(lambda: objects.list_dirs_page(spread.sessions_prefix, None, 1))
    if not names:
        return LAYOUT_SPREAD, True
    return (LAYOUT_SPREAD if spread.sid_of_dir(names[0]) is not None else LAYOUT_FLAT), False


def record_body(version: int, stream_key: bytes | None = None) -> bytes:
    doc: dict[str, object] = {"layout": version, "shards": SHARDS if version == LAYOUT_SPREAD else 1,
                              "shard_of": "blake2b(utf-8 session id, digest_size=1), hex"}
    if stream_key is not None:
        doc["stream_key"] = stream_key.hex()
        doc["stream_id"] = "name if a session id, else 'ds.' + blake2b(utf-8 name, digest_size=16, key), hex"
    return json.dumps(doc, sort_keys=True).encode() + b"\n"


def decide_layout(objects: ObjectStore, prefix: str, retry: RetryPolicy) -> tuple[int, bytes | None]:
    """The store's layout and stream key: its record's, creating the record when there is
    none (with a new key when the store is empty)."""
    recorded = read_record(objects, prefix, retry)
    if recorded is not None:
        return recorded
    proposal, empty = propose(objects, prefix, retry)
    stream_key = secrets.token_bytes(STREAM_KEY_BYTES) if empty else None
    key = record_key(prefix)
    try:
        retry.call(lambda: objects.put_if_absent(key, record_body(proposal, stream_key)))
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
        # Its stream ids are the unkeyed ones: a read-only process of a store that has no
        # record yet finds no stream either way (the store holds none written under a key).
        log.warning("layout record not created (%s): using layout %d unrecorded", exc, proposal)
        return proposal, None
    log.info("layout record created: layout %d%s", proposal, ", keyed stream ids" if stream_key else "")
    return proposal, stream_key


__all__ = ["decide_layout", "propose", "read_record", "record_body"]
