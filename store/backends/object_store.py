"""The object-store seam: one small ABC (``ObjectStore``) and its reference implementation
(``MemoryObjectStore``). Backends live beside it: ``store/backends/files.py`` (a directory) and
``store/backends/s3.py`` (S3 over HTTP); ``store/backends/objects.py`` builds one from a URL.
``store/backends/testing.py`` holds the contract every backend is tested against.

Every state change the store makes is ``put_if_absent``: create object N+1 if it does not
exist. Nothing is ever overwritten, so that one primitive arbitrates every race. ``delete``
exists only for garbage collection and ``delete_session``, and the one object whose name a
later life of a session takes again (its header) is removed only by ``delete_if_unchanged``.
"""

from __future__ import annotations

import functools
import hashlib

import re
import threading
import time
import uuid
from abc import ABC, abstractmethod
from contextlib import contextmanager
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, ParamSpec, Sequence, TypeVar

from store.errors import (
    ConditionalWritesUnsupportedError,
    InvalidKeyError,
    ObjectExistsError,
    ObjectNotFoundError,
)

# Keys are '/'-separated; every component must match this, which keeps them safe as file
# names and as S3 keys alike (no '..', no empty component, no leading '/', no NUL or newline:
# the whole key must match, ``\Z`` and not ``$``, which would let a trailing newline through).
_KEY = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9._=-]{0,254}/)*[A-Za-z0-9_][A-Za-z0-9._=-]{0,254}\Z")
_KEY_MAX = 1024
P = ParamSpec("P")
R = TypeVar("R")
#: What ``probe_conditional_writes`` checks: 1 If-None-Match, 2 also conditional deletes.
_PROBE_VERSION = 2


def verdict_key(prefix: str, identity: str) -> str:
    """Where a passed probe of the backend ``identity`` is recorded below ``prefix``
    (``ObjectStore.verify_conditional_writes``). The probe's version is in the name: a store
    probed before the probe checked more (conditional deletes, from version 2) is probed
    again, once."""
    digest = hashlib.sha256(f"{identity}\n{_PROBE_VERSION}".encode()).hexdigest()[:16]
    return f"{prefix}verdict-{digest}"


def requested(op: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A backend's method that makes one request ``op``: ``ObjectStore.request`` around it."""

    def wrap(method: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(method)
        def requesting(*args: P.args, **kwargs: P.kwargs) -> R:
            with args[0].request(op):  # type: ignore[attr-defined]
                return method(*args, **kwargs)

        return requesting

    return wrap


def check_key(key: str) -> str:
    """``key`` if it is a safe relative path of components, else ``InvalidKeyError``.

    Purely syntactic (no filesystem access), so a backend checks a key once per call at the
    cost of one regular expression: no component is empty, ``.``, ``..`` or dot-led (the
    file backend's own directories are dot-led), nothing outside ``[A-Za-z0-9._=-]``.
    """
    if not isinstance(key, str) or len(key) > _KEY_MAX or ".." in key or not _KEY.match(key):
        raise InvalidKeyError(key)
    return key


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int


@dataclass(frozen=True, slots=True)
class StoredObject:
    key: str
    data: bytes
    metadata: Mapping[str, str] = field(default_factory=dict)
    #: When the backend created the object, by the backend's clock (S3 ``Last-Modified``, the
    #: file's mtime), or None if it cannot say. GC trusts this over times written inside an
    #: object by a process that may have paused before creating it.
    last_modified_ms: int | None = field(default=None, compare=False)
    #: The backend's version tag of this object (S3's ``ETag``), if it reports one: what
    #: ``delete_if_unchanged`` conditions on.
    etag: str | None = field(default=None, compare=False)


class ObjectStore(ABC):
    """A flat namespace of immutable objects.

    Contract for implementers:

    - ``put_if_absent`` must be atomic with respect to every other ``put_if_absent`` of the
      same key, across processes and machines: exactly one caller wins, every other one gets
      ``ObjectExistsError``. A reader must never see a partially written object.
    - A ``put_if_absent`` whose outcome is unknown (timeout, connection lost after sending)
      raises ``BackendUnavailableError``. The caller retries; a retry that then answers
      ``ObjectExistsError`` may be its own earlier attempt, which is why callers put a nonce
      in the metadata and read it back.
    - ``list`` returns keys in lexicographic order and pages internally: it is correct past
      1,000 keys.
    - ``delete`` of a missing key is not an error.
    - ``delete_if_unchanged(key, seen)`` deletes ``key`` only while it still holds the object
      ``seen`` that a ``get`` of it returned, atomically with respect to ``put_if_absent`` of
      the same key: a name deleted and created again meanwhile (another object, with other
      bytes) is left alone. S3's conditional DELETE (``If-Match``). A delete that pauses
      between its read and its delete, or is resent after an answer it lost, can then never
      remove what was created under the name in between.
    - A key is never also the directory of other keys (``a/b`` beside ``a/b/c``): backends
      that keep keys as a tree (``FileObjectStore``, SeaweedFS) refuse the second of the two
      (``a/b`` as ``ObjectExistsError``). The store's layout never needs both.
    """

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self._count_lock = threading.Lock()
        #: Told of every request made with :meth:`request`: ``(op, exception or None,
        #: seconds)``; the store's metrics (``store/metrics.py``) set it.
        self.observer: Callable[[str, BaseException | None, float], None] | None = None

    def _count(self, op: str) -> None:
        with self._count_lock:
            self.requests[op] += 1

    @contextmanager
    def request(self, op: str) -> Iterator[None]:
        """One request to the backend: counted in ``requests`` and, when an ``observer`` is
        set, timed and told how it ended (the store's exception, as the backend raised it)."""
        self._count(op)
        observer = self.observer
        if observer is None:
            yield
            return
        started = time.perf_counter()
        failed: BaseException | None = None
        try:
            yield
        except BaseException as exc:
            failed = exc
            raise
        finally:
            observer(op, failed, time.perf_counter() - started)

    @abstractmethod
    def put_if_absent(
        self, key: str, data: bytes, metadata: Mapping[str, str] | None = None
    ) -> None: ...

    @abstractmethod
    def get(self, key: str) -> StoredObject: ...

    @abstractmethod
    def head(self, key: str) -> ObjectInfo | None: ...

    @abstractmethod
    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]: ...

    @abstractmethod
    def list_dirs(self, prefix: str) -> Iterator[str]:
        """The distinct next path components below ``prefix`` (which ends with '/') that
        hold objects: directories, as S3's common prefixes (not the objects at that level)."""

    def list_dirs_page(
        self, prefix: str, start_after: str | None, limit: int
    ) -> tuple[list[str], bool]:
        """Up to ``limit`` directories of ``list_dirs(prefix)`` that come after the name
        ``start_after`` in this backend's listing order, and whether more may follow.

        The order is fixed per backend (names here; S3 overrides this with one LIST request
        a page), so that paging with ``start_after`` = the last name of the previous page
        returns every directory present throughout exactly once. A directory emptied just
        now may still be listed (SeaweedFS): callers check what they list."""
        names = [n for n in self.list_dirs(prefix) if start_after is None or n > start_after]
        return names[:limit], len(names) > limit

    @abstractmethod
    def delete(self, key: str) -> None: ...

    def delete_many(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.delete(key)

    def delete_if_unchanged(self, key: str, seen: StoredObject) -> bool:
        """Delete ``key`` if it still holds ``seen`` (as a ``get`` of it returned it): True.
        False, changing nothing, if it is absent or holds another object (see the contract).
        A backend that cannot make this atomic raises ``ConditionalWritesUnsupportedError``
        (this default); ``probe_conditional_writes`` refuses such a backend."""
        raise ConditionalWritesUnsupportedError(
            f"{type(self).__name__} has no conditional delete: a session deleted by a process "
            "that paused could take the header of the session's next life with it"
        )

    def close(self) -> None:
        pass

    def flush(self, key: str) -> None:
        """Make the object at ``key`` (if there is one) survive a power loss before anyone is
        told of it. The store calls it before it acts on an object it did not create and
        make durable itself: a segment it rolls forward into Redis, a rebuild's read, its
        own earlier attempt met again (docs/design.md, "Durable before Redis hears of it").

        An object of S3 (and of memory) is durable once anyone can see it: nothing to do.
        The file backend makes an object visible (its link) before it is durable (its
        directory's fsync), and a writer that died or paused between the two has made it
        durable to nobody."""
        check_key(key)

    @property
    def identity(self) -> str:
        """What this backend is (its kind, and where its objects live): a recorded probe
        verdict holds for one identity only (see :meth:`verify_conditional_writes`)."""
        return type(self).__name__

    def verify_conditional_writes(self, prefix: str) -> None:
        """:meth:`probe_conditional_writes` once per store and backend, not once per process.

        A passed probe is recorded as ``<prefix>verdict-<hash of identity and probe
        version>``, created with If-None-Match after the probe passed; a process that finds it
        (one HEAD) skips the probe. A backend that ignores If-None-Match (or If-Match on a
        delete) never passes, so never has a verdict. The
        name holds the backend's identity (kind, endpoint, bucket): a bucket copied, verdict
        and all, to another backend or endpoint is probed again there. A server replaced in
        place behind the same endpoint and bucket is not noticed: delete ``<prefix>verdict-*``
        then (``doctor`` always probes).
        """
        key = verdict_key(prefix, self.identity)
        if self.head(key) is not None:
            return
        self.probe_conditional_writes(prefix)
        try:
            self.put_if_absent(key, self.identity.encode() + b"\n")
        except ObjectExistsError:
            pass  # another process of the store recorded it first

    def probe_conditional_writes(self, prefix: str) -> None:
        """Refuse a backend that silently ignores If-None-Match (some emulators do), or the
        If-Match of a conditional delete (``delete_if_unchanged``)."""
        key = f"{prefix}probe/{uuid.uuid4().hex}"
        self.put_if_absent(key, b"1")
        try:
            try:
                self.put_if_absent(key, b"2")
            except ObjectExistsError:
                self._probe_conditional_delete(key)
                return
            raise ConditionalWritesUnsupportedError(
                f"{type(self).__name__} accepted a second create of {key!r}: it ignores "
                "If-None-Match and cannot arbitrate concurrent writers. Use a backend with "
                "conditional writes (AWS S3, MinIO RELEASE.2025-09-07 or later, SeaweedFS 4.18 "
                "or later, R2, Ceph RGW) or pass allow_unsafe_backend=True if you accept lost "
                "writes."
            )
        finally:
            self.delete(key)

    def _probe_conditional_delete(self, key: str) -> None:
        """``key`` holds b"1": a delete conditioned on another object must leave it."""
        seen = self.get(key)
        other = StoredObject(key, b"2", {}, etag=f'"{hashlib.md5(b"2").hexdigest()}"')
        if self.delete_if_unchanged(key, other) or self.head(key) is None:
            raise ConditionalWritesUnsupportedError(
                f"{type(self).__name__} deleted {key!r} under an If-Match naming another "
                "object: it ignores conditional deletes, so a session deleted by a process "
                "that paused could take the header of the session's next life with it. Use a "
                "backend with conditional deletes (AWS S3 since September 2025; SeaweedFS, 4.30 and 4.48 tested) or pass "
                "allow_unsafe_backend=True if you accept that."
            )
        if not self.delete_if_unchanged(key, seen) or self.head(key) is not None:
            raise ConditionalWritesUnsupportedError(
                f"{type(self).__name__} refused a conditional delete of {key!r} naming the "
                "object it holds"
            )


# --- in memory -------------------------------------------------------------------------------


class MemoryObjectStore(ObjectStore):
    def __init__(self) -> None:
        super().__init__()
        self._objects: dict[str, StoredObject] = {}
        self._lock = threading.Lock()

    def put_if_absent(
        self, key: str, data: bytes, metadata: Mapping[str, str] | None = None
    ) -> None:
        check_key(key)
        self._count("put")
        with self._lock:
            if key in self._objects:
                raise ObjectExistsError(key)
            self._objects[key] = StoredObject(
                key, bytes(data), dict(metadata or {}), int(time.time() * 1000)
            )

    def get(self, key: str) -> StoredObject:
        self._count("get")
        with self._lock:
            obj = self._objects.get(key)
        if obj is None:
            raise ObjectNotFoundError(key)
        return obj

    def head(self, key: str) -> ObjectInfo | None:
        self._count("head")
        with self._lock:
            obj = self._objects.get(key)
        return None if obj is None else ObjectInfo(key, len(obj.data))

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        self._count("list")
        with self._lock:
            keys = sorted(k for k in self._objects if k.startswith(prefix))
            infos = [ObjectInfo(k, len(self._objects[k].data)) for k in keys]
        for info in infos:
            if start_after is None or info.key > start_after:
                yield info

    def list_dirs(self, prefix: str) -> Iterator[str]:
        self._count("list")
        with self._lock:
            names = {
                k[len(prefix) :].split("/", 1)[0]
                for k in self._objects
                if k.startswith(prefix) and "/" in k[len(prefix) :]
            }
        yield from sorted(n for n in names if n)

    def delete(self, key: str) -> None:
        self._count("delete")
        with self._lock:
            self._objects.pop(key, None)

    def delete_if_unchanged(self, key: str, seen: StoredObject) -> bool:
        check_key(key)
        self._count("delete")
        with self._lock:
            if self._objects.get(key) != seen:  # key, bytes and metadata
                return False
            del self._objects[key]
            return True


# --- local directory -------------------------------------------------------------------------

# A file object is an envelope: magic line, metadata as one JSON line, then the bytes. Metadata
# must live in the same file as the data, or create-if-absent would not be atomic.
