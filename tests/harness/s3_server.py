"""moto's S3 server over real HTTP on a free loopback port, with atomic conditional writes.

moto's ``PUT`` with ``If-None-Match: *`` (and ``If-Match``) checks the condition and then
writes without holding any lock, and its threaded server runs requests concurrently, so two
racing conditional writers can both get 200. Real S3 and MinIO never let that happen, and the
store's correctness rests on it. :func:`install_moto_write_lock` wraps every S3 write path in
moto's ``S3Response`` (see :data:`LOCKED_METHODS`) in one process-wide lock;
:meth:`S3Server.start` installs it, so every test gets it.

moto keeps its state in process-global backends: every moto server in this process (and any
``mock_aws``) shares the same buckets, and ``mock_aws()`` resets them when it starts. Do not
use ``mock_aws`` in this suite; isolate tests with :func:`new_bucket_name` (or
:meth:`S3Server.reset`, which wipes everything).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

__all__ = [
    "LOCKED_METHODS",
    "S3Server",
    "ServerRequests",
    "install_moto_write_lock",
    "moto_write_lock",
    "moto_write_lock_bypassed",
    "new_bucket_name",
    "s3_client",
]

#: ``S3Response`` methods run under :data:`moto_write_lock` (names as in moto 5.2):
#:
#: * ``put_object``: PutObject, incl. its If-None-Match / If-Match checks;
#: * ``copy_object``: CopyObject (writes the destination key);
#: * ``delete_object``: DeleteObject, incl. its If-Match check;
#: * ``_bucket_response_delete_keys``: DeleteObjects (the bulk ``POST ?delete`` path);
#: * ``_bucket_response_post``: bucket-level POST, i.e. DeleteObjects and browser POST uploads;
#: * ``_key_response_post``: key-level POST. CompleteMultipartUpload has no method of its own
#:   in moto 5.2: it is the ``uploadId`` branch of this method, with its If-None-Match check.
LOCKED_METHODS: tuple[str, ...] = (
    "put_object",
    "copy_object",
    "delete_object",
    "_bucket_response_delete_keys",
    "_bucket_response_post",
    "_key_response_post",
)

#: The one process-wide lock (re-entrant: ``_bucket_response_post`` calls
#: ``_bucket_response_delete_keys``).
moto_write_lock = threading.RLock()

_install_lock = threading.Lock()
_bypass = False
_MARK = "_sessionstore_write_locked"


def install_moto_write_lock() -> None:
    """Wrap :data:`LOCKED_METHODS` of moto's ``S3Response`` in :data:`moto_write_lock`.

    Idempotent. Raises if a method is missing, so a moto upgrade that renames one fails loudly
    instead of silently losing atomicity.
    """
    from moto.s3.responses import S3Response

    with _install_lock:
        missing = [name for name in LOCKED_METHODS if not callable(getattr(S3Response, name, None))]
        if missing:
            import moto

            raise RuntimeError(
                f"moto {moto.__version__}: S3Response has no {missing}; update "
                "tests/harness/s3_server.py LOCKED_METHODS or conditional writes are not atomic"
            )
        for name in LOCKED_METHODS:
            original = getattr(S3Response, name)
            if getattr(original, _MARK, False):
                continue
            setattr(S3Response, name, _locked(original))


def _locked(method: Any) -> Any:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _bypass:
            return method(*args, **kwargs)
        with moto_write_lock:
            return method(*args, **kwargs)

    setattr(wrapper, _MARK, True)
    return wrapper


@contextlib.contextmanager
def moto_write_lock_bypassed() -> Iterator[None]:
    """Only for the test that shows moto is racy without the lock. Process-wide."""
    global _bypass
    _bypass = True
    try:
        yield
    finally:
        _bypass = False


def new_bucket_name(prefix: str = "sstest") -> str:
    """A unique, valid bucket name."""
    return f"{prefix}-{uuid.uuid4().hex[:20]}"


def s3_client(
    endpoint_url: str | None,
    *,
    region: str = "us-east-1",
    access_key_id: str | None = "testing",
    secret_access_key: str | None = "testing",
    attempts: int = 1,
    connect_timeout: float = 5.0,
    read_timeout: float = 15.0,
    max_pool_connections: int = 32,
    **config: Any,
) -> Any:
    """A real boto3 S3 client: path-style, ``attempts`` total attempts (default 1: no hidden
    botocore retries), checksums only when required (as the store does). Pass
    ``access_key_id=None`` to use the environment's credentials."""
    import boto3
    from botocore.config import Config

    botocore_config = Config(
        region_name=region,
        s3={"addressing_style": "path"},
        retries={"total_max_attempts": attempts, "mode": "standard"},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        max_pool_connections=max_pool_connections,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        **config,
    )
    if access_key_id is None:  # the environment's credentials, as they are now: a new session
        return boto3.session.Session().client("s3", endpoint_url=endpoint_url, region_name=region,
                                              config=botocore_config)
    # Explicit credentials: a client of the process's one session (the store's own).
    from store.backends.s3 import shared_client

    return shared_client("s3", endpoint_url=endpoint_url, region_name=region, config=botocore_config,
                         aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key)


#: The service a SigV4-signed request is for: the fourth part of its credential scope.
_SIGNED_FOR = re.compile(r"Credential=[^/,\s]+/\d{8}/[^/]+/([a-z0-9-]+)/aws4_request")


class _MotoServices:
    """The WSGI application of the harness's moto server: moto's application for each service
    a request is signed for (S3 unless it says otherwise; KMS for the encryption tests), and
    its ``/moto-api/`` one (the harness's reset). moto's own server (``ThreadedMotoServer``)
    finds the service among all of moto's for every request, under a lock: 1.6 of the 8 ms of
    CPU a GET took here."""

    def __init__(self) -> None:
        self._apps: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._app("s3")  # created before the first request

    def _app(self, service: str) -> Any:
        app = self._apps.get(service)
        if app is None:
            from moto.server import create_backend_app

            with self._lock:
                app = self._apps.get(service)
                if app is None:
                    app = self._apps[service] = create_backend_app(service)
        return app

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO", "").startswith("/moto-api/"):
            service = "moto_api"
        else:
            signed = _SIGNED_FOR.search(environ.get("HTTP_AUTHORIZATION", ""))
            service = signed.group(1) if signed else "s3"
        return self._app(service)(environ, start_response)


class S3Server:
    """A moto S3 server on ``host`` (port 0: a free one), serving from a thread of this
    process (werkzeug's threaded server, with moto's request handler). Context manager."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, region: str = "us-east-1") -> None:
        self.host = host
        self.port = port
        self.region = region
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._client: Any = None

    @property
    def endpoint_url(self) -> str:
        if self._server is None:
            raise RuntimeError("start() the S3 server first")
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> S3Server:
        if self._server is not None:
            return self
        install_moto_write_lock()
        from moto.server import MotoRequestHandler
        from werkzeug.serving import make_server

        # werkzeug logs one line per request to stderr unless its logger has a level: keep
        # warnings and errors only (configure the "werkzeug" logger first to see requests)
        werkzeug_logger = logging.getLogger("werkzeug")
        if werkzeug_logger.level == logging.NOTSET:
            werkzeug_logger.setLevel(logging.WARNING)

        server = make_server(self.host, self.port, _MotoServices(), threaded=True,
                             request_handler=MotoRequestHandler)  # bound and listening
        self._thread = threading.Thread(target=server.serve_forever, name=f"moto-s3-{server.port}", daemon=True)
        self._thread.start()
        self._server = server
        self.port = server.port
        return self

    def stop(self) -> None:
        self._client = None
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def client(self, endpoint_url: str | None = None, **kwargs: Any) -> Any:
        """A boto3 client (dummy credentials, path-style; see :func:`s3_client`)."""
        kwargs.setdefault("region", self.region)
        return s3_client(endpoint_url or self.endpoint_url, **kwargs)

    def shared_client(self) -> Any:
        """One boto3 client of this server, built once (building one costs ~0.4 s: boto3
        loads its model)."""
        if self._client is None:
            self._client = self.client()
        return self._client

    def create_bucket(self, name: str | None = None) -> str:
        name = name or new_bucket_name()
        if self._client is None:  # building a client costs ~0.4 s (boto3 loads its model)
            self._client = self.client()
        self._client.create_bucket(Bucket=name)
        return name

    def url_for(self, bucket: str, prefix: str = "", endpoint_url: str | None = None) -> str:
        """The store's URL form: ``s3://BUCKET/PREFIX?endpoint=...&region=...``."""
        return s3_url(bucket, prefix, endpoint_url or self.endpoint_url, self.region)

    def reset(self) -> None:
        """Wipe all moto state (every bucket of every test): ``POST /moto-api/reset``."""
        req = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()


def s3_url(bucket: str, prefix: str, endpoint_url: str, region: str | None = "us-east-1") -> str:
    path = f"/{urllib.parse.quote(prefix.strip('/'))}" if prefix.strip("/") else ""
    query = {"endpoint": endpoint_url}
    if region:
        query["region"] = region
    return f"s3://{bucket}{path}?{urllib.parse.urlencode(query, safe=':/')}"


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class ServerRequests:
    """Requests as moto's server saw them, counted at the server (its request log), for the
    bucket given: ``with ServerRequests(bucket) as seen: ...``; then ``seen.count("GET")``,
    ``seen.lines``. Only for the in-process :class:`S3Server`. The server logs a request as it
    sends the response's status line, so every request whose answer the client has is in."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._handler: logging.Handler | None = None
        self._level = logging.NOTSET

    def __enter__(self) -> ServerRequests:
        seen = self

        class _Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                text = _ANSI.sub("", record.getMessage())  # werkzeug colours some lines
                if f" /{seen.bucket}" in text or f"/{seen.bucket}/" in text or f"/{seen.bucket}?" in text:
                    with seen._lock:
                        seen.lines.append(text)

        logger = logging.getLogger("werkzeug")
        self._level = logger.level
        self._handler = _Handler(logging.INFO)
        logger.addHandler(self._handler)
        logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        logger = logging.getLogger("werkzeug")
        if self._handler is not None:
            logger.removeHandler(self._handler)
        logger.setLevel(self._level)

    def count(self, method: str | None = None, *, containing: str = "") -> int:
        """Requests seen (of ``method``; whose request line holds ``containing``)."""
        with self._lock:
            lines = list(self.lines)
        return sum(
            1 for line in lines
            if (method is None or f'"{method} ' in line) and containing in line
        )

    def clear(self) -> None:
        with self._lock:
            self.lines.clear()
