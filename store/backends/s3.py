"""``S3ObjectStore``: boto3 with ``If-None-Match: *``, over real HTTP (AWS, MinIO, R2,
SeaweedFS). botocore's exceptions are translated here, and only here, into ``store.errors``.
"""

from __future__ import annotations

import heapq
import os
import threading
from dataclasses import dataclass
from http.client import HTTPException
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar
from urllib.parse import parse_qs, unquote, urlparse

from store.errors import (
    BackendRefusedError,
    BackendUnavailableError,
    InvalidInputError,
    ObjectExistsError,
    ObjectNotFoundError,
)
from store.backends.object_store import ObjectInfo, ObjectStore, StoredObject, check_key

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class S3Config:
    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    addressing_style: str = "path"
    connect_timeout: float = 3.0
    read_timeout: float = 10.0
    max_pool_connections: int = 32
    #: Attempts botocore makes on its own. The store retries with its own policy; botocore's
    #: hidden retries would only hide ambiguity, so one attempt is the default.
    botocore_attempts: int = 1
    sse: str | None = None
    sse_kms_key_id: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    #: How listings are read. ``"flat"``: S3's own listing, keys in byte order (AWS, MinIO,
    #: R2, Ceph RGW). ``"tree"``: directory by directory, for a gateway that keeps keys as a
    #: directory tree (SeaweedFS; see :meth:`S3ObjectStore.list`). ``"auto"``: tree when the
    #: first listing's ``Server`` header says SeaweedFS, else flat.
    listing: str = "auto"

    def __post_init__(self) -> None:
        if self.listing not in _LISTINGS:
            raise InvalidInputError(f"S3 listing must be one of {_LISTINGS}, not {self.listing!r}")


_LISTINGS = ("auto", "flat", "tree")


def parse_s3_url(url: str) -> S3Config:
    """``s3://bucket/prefix?endpoint=http://localhost:9000&region=us-east-1``."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise InvalidInputError(f"not an s3:// URL with a bucket: {url!r}")
    q = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    prefix = unquote(parsed.path).strip("/")
    kwargs: dict[str, Any] = {}
    if "endpoint" in q:
        kwargs["endpoint_url"] = q["endpoint"]
    if "region" in q:
        kwargs["region"] = q["region"]
    if "addressing" in q:
        kwargs["addressing_style"] = q["addressing"]
    for name in ("connect_timeout", "read_timeout"):
        if name in q:
            kwargs[name] = float(q[name])
    if "sse" in q:
        kwargs["sse"] = q["sse"]
    if "sse_kms_key_id" in q:
        kwargs["sse_kms_key_id"] = q["sse_kms_key_id"]
    return S3Config(bucket=parsed.netloc, prefix=prefix, **kwargs)


def s3_identity(config: S3Config) -> str:
    """The identity (``ObjectStore.identity``) of the S3 backend ``config`` names."""
    return f"s3 {config.endpoint_url or 'aws'} {config.bucket}"


class S3ObjectStore(ObjectStore):
    def __init__(self, config: S3Config, *, client: Any = None) -> None:
        super().__init__()
        from botocore.config import Config

        self.config = config
        if client is None:
            botocore_config = Config(
                connect_timeout=config.connect_timeout,
                read_timeout=config.read_timeout,
                retries={"total_max_attempts": config.botocore_attempts, "mode": "standard"},
                s3={"addressing_style": config.addressing_style},
                max_pool_connections=config.max_pool_connections,
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            )
            client = shared_client(
                "s3",
                endpoint_url=config.endpoint_url,
                region_name=config.region or os.environ.get("AWS_REGION") or "us-east-1",
                config=botocore_config,
                aws_access_key_id=config.access_key_id,
                aws_secret_access_key=config.secret_access_key,
            )
        self.client = client
        self.bucket = config.bucket
        #: Listings read directory by directory (None: not known yet, see S3Config.listing).
        self._tree_listing: bool | None = {"flat": False, "tree": True}.get(config.listing)
        #: MaxKeys of a listing page (None: the server's, 1,000); small in tests of paging.
        self._page_size: int | None = None

    @property
    def identity(self) -> str:
        return s3_identity(self.config)

    def _sse_args(self) -> dict[str, str]:
        args: dict[str, str] = {}
        if self.config.sse:
            args["ServerSideEncryption"] = self.config.sse
        if self.config.sse_kms_key_id:
            args["SSEKMSKeyId"] = self.config.sse_kms_key_id
        return args

    def put_if_absent(
        self, key: str, data: bytes, metadata: Mapping[str, str] | None = None
    ) -> None:
        check_key(key)
        self._send("put", key, lambda: self.client.put_object(
            Bucket=self.bucket,
            Key=key,
            Body=data,
            IfNoneMatch="*",
            Metadata=dict(metadata or {}),
            ContentType="application/x-ndjson",
            **self._sse_args(),
        ), writing=True)

    def get(self, key: str) -> StoredObject:
        def fetch() -> tuple[dict[str, Any], bytes]:
            resp = self.client.get_object(Bucket=self.bucket, Key=key)
            return resp, resp["Body"].read()

        resp, data = self._send("get", key, fetch)
        modified = resp.get("LastModified")
        return StoredObject(
            key,
            data,
            resp.get("Metadata") or {},
            int(modified.timestamp() * 1000) if modified is not None else None,
            resp.get("ETag"),
        )

    def head(self, key: str) -> ObjectInfo | None:
        try:
            resp = self._send("head", key, lambda: self.client.head_object(Bucket=self.bucket, Key=key))
        except ObjectNotFoundError:
            return None
        return ObjectInfo(key, int(resp.get("ContentLength", 0)))

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        """Keys in byte order, paged.

        SeaweedFS keeps keys as a directory tree and lists them depth first, each directory's
        entries by name: ``a/x`` comes before ``a-b`` there, after it on AWS ('-' and '.' sort
        below '/'), and its ``StartAfter`` skips by that order too. Against it (``listing``
        "tree", or "auto" once a listing's ``Server`` header said SeaweedFS) each directory is
        listed on its own with ``Delimiter='/'`` and its entries merged in byte order, a
        sub-directory's keys taking their place when its turn comes: the same keys in the
        same order as AWS, for one request per directory listed.
        """
        if self._tree_listing is None:
            first = self._list_page(prefix, start_after=start_after)
            self._tree_listing = _served_by_seaweedfs(first)
            if not self._tree_listing:
                yield from self._list_flat(prefix, first)
                return
        if self._tree_listing:
            level = prefix[: prefix.rfind("/") + 1]
            yield from self._list_tree(level, prefix, start_after)
        else:
            yield from self._list_flat(prefix, self._list_page(prefix, start_after=start_after))

    def _list_page(
        self,
        prefix: str,
        *,
        token: str | None = None,
        start_after: str | None = None,
        delimiter: str | None = None,
        max_keys: int | None = None,
    ) -> dict[str, Any]:
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if token:
            args["ContinuationToken"] = token
        elif start_after:
            args["StartAfter"] = start_after
        if delimiter:
            args["Delimiter"] = delimiter
        if max_keys or self._page_size:
            args["MaxKeys"] = max_keys or self._page_size
        resp: dict[str, Any] = self._send("list", prefix, lambda: self.client.list_objects_v2(**args))
        return resp

    def _list_flat(self, prefix: str, resp: dict[str, Any]) -> Iterator[ObjectInfo]:
        while True:
            for item in resp.get("Contents", []):
                yield ObjectInfo(item["Key"], int(item.get("Size", 0)))
            token = resp.get("NextContinuationToken") if resp.get("IsTruncated") else None
            if not token:
                return
            resp = self._list_page(prefix, token=token)

    def _list_tree(self, level: str, prefix: str, start_after: str | None) -> Iterator[ObjectInfo]:
        """The keys under ``prefix`` (which lies in directory ``level``) in byte order.

        The directory is listed with ``Delimiter='/'``, in pages whose names ascend. An entry
        sorts as its key (an object) or as ``level + name + '/'`` (a sub-directory, whose keys
        all sort from there on, next to each other). Every later entry's name is above the
        largest name seen so far, so everything in the heap up to ``level + that name`` is
        final: it is emitted, a sub-directory by listing it the same way. Keys ending in '/'
        are left out: SeaweedFS lists a directory emptied by deletes (until its cleaner
        removes it, minutes later) as such a key, and the store never writes one.
        """
        heap: list[tuple[str, int, ObjectInfo | None]] = []
        order = 0
        token: str | None = None
        server_start = _tree_start_after(level, start_after)
        while True:
            resp = self._list_page(prefix, token=token, start_after=server_start, delimiter="/")
            bound = ""
            for item in resp.get("Contents", []):
                key = item["Key"]
                bound = max(bound, key)
                if key.endswith("/"):
                    continue  # SeaweedFS shows an empty directory as one: no object of ours
                if start_after is None or key > start_after:
                    order += 1
                    heapq.heappush(heap, (key, order, ObjectInfo(key, int(item.get("Size", 0)))))
            for item in resp.get("CommonPrefixes", []):
                sub = item["Prefix"]
                bound = max(bound, sub.rstrip("/"))
                if start_after is None or sub > start_after or start_after.startswith(sub):
                    order += 1
                    heapq.heappush(heap, (sub, order, None))
            token = resp.get("NextContinuationToken") if resp.get("IsTruncated") else None
            while heap and (not token or heap[0][0] <= bound):
                sub, _, info = heapq.heappop(heap)
                if info is not None:
                    yield info
                else:
                    inner = start_after if start_after is not None and start_after.startswith(sub) else None
                    yield from self._list_tree(sub, sub, inner)
            if not token:
                return

    def list_dirs(self, prefix: str) -> Iterator[str]:
        """The common prefixes below ``prefix``. SeaweedFS removes a directory its last
        object left only minutes later (an asynchronous cleaner) and lists it meanwhile: there
        (see :meth:`list`) each one is checked to hold an object, one request each."""
        token: str | None = None
        while True:
            resp = self._list_page(prefix, token=token, delimiter="/")
            if self._tree_listing is None:
                self._tree_listing = _served_by_seaweedfs(resp)
            for item in resp.get("CommonPrefixes", []):
                sub = item["Prefix"]
                if self._tree_listing and not self._list_page(sub, max_keys=1).get("Contents"):
                    continue
                yield sub[len(prefix) :].rstrip("/")
            token = resp.get("NextContinuationToken") if resp.get("IsTruncated") else None
            if not token:
                return

    def list_dirs_page(
        self, prefix: str, start_after: str | None, limit: int
    ) -> tuple[list[str], bool]:
        """One LIST request: ``Delimiter='/'``, ``MaxKeys=limit``, ``StartAfter`` past the
        directory ``start_after``. The order is S3's: by ``name + '/'`` in byte order on a
        flat listing (``a-b/`` before ``a/``), so the page starts after every key of
        ``start_after/`` (``StartAfter = prefix + start_after + '0'``, '0' being the
        character after '/'); by name on a tree listing (SeaweedFS skips by name). A
        directory emptied just now may be listed (SeaweedFS): unlike :meth:`list_dirs`, not
        checked here (that would cost a request a directory); callers check."""
        resp = self._list_page(
            prefix, start_after=self._dir_start(prefix, start_after), delimiter="/", max_keys=limit
        )
        if self._tree_listing is None:
            self._tree_listing = _served_by_seaweedfs(resp)
            if self._tree_listing and start_after is not None:  # once: the order differs
                return self.list_dirs_page(prefix, start_after, limit)
        names = [item["Prefix"][len(prefix) :].rstrip("/") for item in resp.get("CommonPrefixes", [])]
        if start_after is not None:
            names = [n for n in names if self._dir_after(n, start_after)]
        return names, bool(resp.get("IsTruncated"))

    def _dir_start(self, prefix: str, start_after: str | None) -> str | None:
        if start_after is None:
            return None
        return prefix + start_after if self._tree_listing else prefix + start_after + "0"

    def _dir_after(self, name: str, start_after: str) -> bool:
        return name > start_after if self._tree_listing else name + "/" > start_after + "/"

    def delete(self, key: str) -> None:
        try:
            self._send("delete", key, lambda: self.client.delete_object(Bucket=self.bucket, Key=key))
        except ObjectNotFoundError:
            return

    def delete_if_unchanged(self, key: str, seen: StoredObject) -> bool:
        """DeleteObject with ``If-Match: <seen's ETag>``: 412 (another object, or none on
        some servers) and 404 (none) are False."""
        check_key(key)
        if not seen.etag:
            raise InvalidInputError(f"no ETag for {key!r}: pass the object a get() of it returned")
        try:
            self._send("delete", key, lambda: self.client.delete_object(Bucket=self.bucket, Key=key, IfMatch=seen.etag))
        except (ObjectExistsError, ObjectNotFoundError):  # 412, 404
            return False
        return True

    def delete_many(self, keys: Sequence[str]) -> None:
        for i in range(0, len(keys), 1000):
            chunk = keys[i : i + 1000]
            resp = self._send("delete", chunk[0], lambda: self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True},
            ))
            errors = [e for e in resp.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errors:
                raise BackendUnavailableError(f"delete_objects failed for {errors[:3]!r}")

    def _send(self, op: str, key: str, call: Callable[[], T], *, writing: bool = False) -> T:
        """One request: counted and observed (``ObjectStore.request``), botocore's failures
        translated (``_s3_error``)."""
        with self.request(op):
            try:
                return call()
            except Exception as exc:
                raise _s3_error(exc, key, writing=writing) from exc

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            pass


_BOTO_SESSION: Any = None
_BOTO_LOCK = threading.Lock()


def shared_client(service: str, **kwargs: Any) -> Any:
    """A boto3 client (``boto3.session.Session.client``'s arguments) from the process's one
    session: each new session loads the service's model again (0.17-0.4 s of CPU, against
    0.013 s for a client of an existing one). Creating clients from one session is not
    thread-safe, hence the lock. A session resolves the environment's credentials once: pass
    them explicitly where they may change."""
    import boto3

    global _BOTO_SESSION
    with _BOTO_LOCK:
        if _BOTO_SESSION is None:
            _BOTO_SESSION = boto3.session.Session()
        return _BOTO_SESSION.client(service, **kwargs)


def _served_by_seaweedfs(resp: Mapping[str, Any]) -> bool:
    headers = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}) or {}
    return str(headers.get("server", "")).lower().startswith("seaweedfs")


def _tree_start_after(level: str, start_after: str | None) -> str | None:
    """A ``StartAfter`` for listing directory ``level`` that skips nothing sorting after
    ``start_after`` in byte order. The server skips by name, and a name the rest of
    ``start_after`` continues with a character at or below '/' must still come (as a
    sub-directory, ``n/`` sorts above ``n-x`` and holds ``n/x``): so the rest is cut one
    character before its first such character."""
    if start_after is None or not start_after.startswith(level):
        return None
    rest = start_after[len(level) :]
    cut = next((i for i, ch in enumerate(rest) if ch <= "/"), len(rest))
    return level + rest[: cut - 1] if cut >= 2 else None


_TRANSIENT_CODES = {
    "SlowDown",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "Throttling",
    "ThrottlingException",
    "OperationAborted",
    "ConditionalRequestConflict",
}


def _s3_error(exc: Exception, key: str, *, writing: bool = False) -> Exception:
    """Translate a botocore failure. 404 is 'not found', never 'access denied'."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        HTTPClientError,
        NoCredentialsError,
        PartialCredentialsError,
    )
    from botocore.exceptions import (
        ConnectionError as BotoConnectionError,
    )
    from urllib3.exceptions import HTTPError as URLLib3HTTPError

    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if status == 412 or code == "PreconditionFailed":
            return ObjectExistsError(key)
        if status == 404 and code in ("NoSuchKey", "404", "NotFound", ""):
            return ObjectNotFoundError(key)
        if code == "NoSuchBucket":
            return BackendRefusedError(f"bucket does not exist (object {key!r}): {exc}")
        # 409 on a conditional write means a concurrent conditional request was in flight:
        # the outcome of ours is unknown, so it is retried like a timeout.
        if status in (409, 429) or status >= 500 or code in _TRANSIENT_CODES:
            return BackendUnavailableError(f"S3 {code or status} on {key!r}: {exc}")
        return BackendRefusedError(f"S3 {code or status} on {key!r}: {exc}")
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return BackendRefusedError(f"S3 credentials missing for {key!r}: {exc}")
    if isinstance(exc, (BotoConnectionError, HTTPClientError, BotoCoreError, OSError)):
        return BackendUnavailableError(f"S3 request for {key!r} failed: {exc}")
    if isinstance(exc, (URLLib3HTTPError, HTTPException)):
        # The HTTP library's own, where botocore lets it through: an error response (404,
        # 412, 503) whose XML body botocore reads outside its transport's translation, cut
        # by a reset ("Connection broken"). What the server said is unknown: retryable.
        return BackendUnavailableError(f"S3 request for {key!r} failed: {exc!r}")
    return exc


