"""Object stores by URL, and the names users import: the seam (``store/object_store.py``),
the directory backend (``store/file_objects.py``) and the S3 backend (``store/s3_objects.py``).

- ``MemoryObjectStore``: a dict behind a lock; the reference implementation.
- ``LogObjectStore``: a directory whose objects are records in one log per directory of
  keys; a create is one append and one ``fdatasync`` (``store/log_objects.py``). What a new
  ``file://`` store is.
- ``FileObjectStore``: a directory, a file per object; create-if-absent is ``link(2)`` of a
  fully written, fsynced file that has no name yet, which the kernel refuses atomically when
  the name is taken, then an fsync of the directory. What a ``file://`` store made before the
  log backend is, and what ``?format=files`` makes.
- ``S3ObjectStore``: boto3 with ``If-None-Match: *``.

Foreign exceptions are translated in the backend modules, and only there, into
``store.errors``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from store.errors import InvalidInputError
from store.file_objects import FileObjectStore
from store.log_objects import FORMAT_LOG, LogObjectStore, local_format
from store.object_store import (
    MemoryObjectStore,
    ObjectInfo,
    ObjectStore,
    StoredObject,
    check_key,
)
from store.s3_objects import S3Config, S3ObjectStore, parse_s3_url

#: The backends of a local directory (the embedded Redis runs beside either).
LOCAL_STORES = (LogObjectStore, FileObjectStore)


def open_local_store(path: str, *, fsync: bool = True, format: str | None = None) -> ObjectStore:
    """The store in the directory ``path``, in the format recorded there (``.format``); a
    new directory is recorded as ``format``, by default the log backend."""
    if local_format(path, format) == FORMAT_LOG:
        return LogObjectStore(path, fsync=fsync)
    return FileObjectStore(path, fsync=fsync)


def object_store_from_url(url: str, **options: Any) -> ObjectStore:
    """``memory://``, ``file:///path[?format=log1|files]`` or ``s3://bucket/prefix?endpoint=...``."""
    parsed = urlparse(url)
    if parsed.scheme == "memory":
        return MemoryObjectStore()
    if parsed.scheme == "file":
        path = unquote(parsed.path)
        if parsed.netloc and parsed.netloc != "localhost":
            path = parsed.netloc + path
        if not path:
            raise InvalidInputError(f"file:// URL without a path: {url!r}")
        query = parse_qs(parsed.query)
        unknown = set(query) - {"format"}
        if unknown:
            raise InvalidInputError(f"file:// URL {url!r}: unknown option(s) {', '.join(sorted(unknown))}")
        wanted = query.get("format", [None])[-1]
        return open_local_store(path, fsync=options.get("fsync", True), format=wanted)
    if parsed.scheme == "s3":
        return S3ObjectStore(parse_s3_url(url))
    raise InvalidInputError(f"unsupported object store URL {url!r} (memory://, file://, s3://)")


def s3_prefix_of(url: str) -> str:
    """The key prefix an s3:// URL names ('' for other schemes), with a trailing '/'."""
    parsed = urlparse(url)
    if parsed.scheme != "s3":
        return ""
    prefix = unquote(parsed.path).strip("/")
    return f"{prefix}/" if prefix else ""


__all__ = [
    "LOCAL_STORES",
    "FileObjectStore",
    "LogObjectStore",
    "MemoryObjectStore",
    "ObjectInfo",
    "ObjectStore",
    "S3Config",
    "S3ObjectStore",
    "StoredObject",
    "check_key",
    "object_store_from_url",
    "open_local_store",
    "parse_s3_url",
    "s3_prefix_of",
]
