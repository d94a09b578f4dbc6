"""Object stores by URL, and the names users import: the seam (``store/backends/object_store.py``),
the directory backend (``store/backends/files.py``) and the S3 backend (``store/backends/s3.py``).

- ``MemoryObjectStore``: a dict behind a lock; the reference implementation.
- ``FileObjectStore``: a directory, a file per object; create-if-absent is ``link(2)`` of a
  fully written, fsynced file that has no name yet, which the kernel refuses atomically when
  the name is taken, then an fsync of the directory. What a ``file://`` store is.
- ``S3ObjectStore``: boto3 with ``If-None-Match: *``.

Foreign exceptions are translated in the backend modules, and only there, into
``store.errors``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from store.errors import InvalidInputError
from store.backends.files import FileObjectStore
from store.backends.local_format import check_local_format
from store.backends.object_store import (
    MemoryObjectStore,
    ObjectInfo,
    ObjectStore,
    StoredObject,
    check_key,
)
from store.backends.s3 import S3Config, S3ObjectStore, parse_s3_url

#: The backends of a local directory (the embedded Redis runs beside them).
LOCAL_STORES = (FileObjectStore,)


def open_local_store(path: str, *, fsync: bool = True) -> FileObjectStore:
    """The store in the directory ``path``: the file backend, its format recorded there
    (``.format``); ``UnsupportedFormatError`` if the directory records another."""
    check_local_format(path)
    return FileObjectStore(path, fsync=fsync)


def object_store_from_url(url: str, **options: Any) -> ObjectStore:
    """``memory://``, ``file:///path`` or ``s3://bucket/prefix?endpoint=...``."""
    parsed = urlparse(url)
    if parsed.scheme == "memory":
        return MemoryObjectStore()
    if parsed.scheme == "file":
        path = unquote(parsed.path)
        if parsed.netloc and parsed.netloc != "localhost":
            path = parsed.netloc + path
        if not path:
            raise InvalidInputError(f"file:// URL without a path: {url!r}")
        query = parse_qs(parsed.query, keep_blank_values=True)
        if query:
            raise InvalidInputError(f"file:// URL {url!r}: unknown option(s) {', '.join(sorted(query))}")
        return open_local_store(path, fsync=options.get("fsync", True))
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
