"""Where a benchmark run stores things, and the raw clients its floors are measured with.

Three kinds of run:

- ``moto`` (default): the servers the test suite uses, started the way ``tests/harness`` starts
  them: moto's S3 server with the harness's write lock (``harness.S3Server``) and a
  ``redis-server`` process without persistence (``harness.RedisServer``). The S3 server runs in
  a child process of its own, so that its Python work and the benchmark's client work do not
  share one GIL: a client that competed with its server for the interpreter would measure
  both at once.
- ``embedded`` (``--embedded``): ``SessionStore.from_url("file:///tmp/...")`` with no Redis URL,
  i.e. the local directory and the embedded redis-server beside it.
- ``external`` (``--objects URL --redis URL``): e.g. MinIO and Redis from docker-compose.yml.
  The run works below a prefix of its own and removes what it wrote afterwards.

Every run uses a fresh Redis key prefix, so a compactor listening on the default prefix never
picks up the benchmark's jobs.

The floors use the same client library and configuration as the store (the raw boto3 client
of an ``S3ObjectStore``, a redis-py client built like the coordinator's), so a ratio against
the floor measures the store's own work, not a difference between clients.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse, urlunparse

import redis

REPO_ROOT = Path(__file__).resolve().parent.parent
TESTS_DIR = REPO_ROOT / "tests"

_MOTO_BUCKET = "sessionstore-bench"
_MOTO_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}

# The cheapest form one coordinator round trip can take: a one-line script on one key.
_RTT_SCRIPT = "return redis.call('HINCRBY', KEYS[1], 'n', 1)"


def _harness() -> Any:
    """tests/harness, importable without moving it (its package is ``harness``)."""
    if str(TESTS_DIR) not in sys.path:
        sys.path.insert(0, str(TESTS_DIR))
    import harness

    return harness


# --- raw object access for the floors --------------------------------------------------------


class RawObjects(ABC):
    """The requests a store cannot avoid, made with nothing around them."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Create ``key`` if absent (the store's one write primitive)."""

    @abstractmethod
    def get(self, key: str) -> bytes: ...

    def put_replace(self, key: str, data: bytes, etag: str | None) -> str | None:
        """Overwrite (for the naive baseline); returns the new ETag where there is one."""
        self.put(key, data)
        return None

    def get_with_etag(self, key: str) -> tuple[bytes, str | None]:
        return self.get(key), None

    def close(self) -> None:
        pass


class RawS3(RawObjects):
    def __init__(self, objects_url: str, key_prefix: str) -> None:
        from store.backends.objects import S3ObjectStore, parse_s3_url

        # The store's own client construction: same timeouts, pool size and checksum settings.
        self._owner = S3ObjectStore(parse_s3_url(objects_url))
        self.client = self._owner.client
        self.bucket = self._owner.bucket
        self.prefix = key_prefix

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data, IfNoneMatch="*")

    def get(self, key: str) -> bytes:
        data: bytes = self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"].read()
        return data

    def get_with_etag(self, key: str) -> tuple[bytes, str | None]:
        resp = self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)
        return resp["Body"].read(), resp.get("ETag")

    def put_replace(self, key: str, data: bytes, etag: str | None) -> str | None:
        # A JSON-blob store that is safe with two writers needs a compare-and-swap: If-Match.
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": self.prefix + key, "Body": data}
        if etag:
            args["IfMatch"] = etag
        resp = self.client.put_object(**args)
        new_etag: str | None = resp.get("ETag")
        return new_etag

    def close(self) -> None:
        self._owner.close()


class RawFile(RawObjects):
    """A durable create-if-absent on a local filesystem, the fewest steps: write a file with
    no name yet (``O_TMPFILE``; a named temporary file where there is none), fsync it,
    ``link(2)`` it to its name, fsync the directory. Directories are made once per parent."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tmp = root / ".tmp-floor"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self._made: set[Path] = set()
        self._unnamed = bool(getattr(os, "O_TMPFILE", 0)) and os.path.isdir("/proc/self/fd")

    def _path(self, key: str) -> Path:
        return self.root / key

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        if path.parent not in self._made:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._made.add(path.parent)
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        tmp = None
        try:
            if self._unnamed:
                fd = os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o644, dir_fd=dfd)
            else:
                tmp = str(self.tmp / uuid.uuid4().hex)
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
                os.link(tmp or f"/proc/self/fd/{fd}", path.name, dst_dir_fd=dfd, follow_symlinks=True)
            finally:
                os.close(fd)
                if tmp:
                    os.unlink(tmp)
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def put_replace(self, key: str, data: bytes, etag: str | None) -> str | None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.tmp / uuid.uuid4().hex
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        return None

    def get(self, key: str) -> bytes:
        with open(self._path(key), "rb") as fh:
            return fh.read()


# --- the run's backend -----------------------------------------------------------------------


@dataclass
class WorkerSpec:
    """What a writer process needs to build its own store and floor clients (picklable)."""

    objects_url: str
    redis_url: str | None
    redis_rtt_url: str
    redis_prefix: str
    floor_prefix: str
    kind: str
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Backend:
    kind: str  # moto | seaweedfs | embedded | external
    objects_url: str
    #: Passed to SessionStore.from_url (None: the embedded Redis).
    redis_url: str | None
    #: The Redis the store ends up talking to (for the floor's round trip and INFO).
    redis_rtt_url: str
    redis_prefix: str
    #: Object-key prefix of the run (the s3:// URL's prefix), for raw floor objects.
    key_prefix: str
    description: str
    versions: dict[str, str] = field(default_factory=dict)
    #: Server processes this run started, by name (for the CPU and memory the HTTP load
    #: scenario reports): the moto server and redis-server of the default backend.
    pids: dict[str, int] = field(default_factory=dict)
    _cleanup: list[Any] = field(default_factory=list, repr=False)
    _stores: list[Any] = field(default_factory=list, repr=False)

    def store(self, **options: Any) -> Any:
        from store.core import SessionStore

        options.setdefault("redis_prefix", self.redis_prefix)
        st = SessionStore.from_url(self.objects_url, self.redis_url, **options)
        self._stores.append(st)
        return st

    def raw(self) -> RawObjects:
        return make_raw(self.kind, self.objects_url, self.key_prefix)

    def redis_client(self) -> redis.Redis:
        return make_redis(self.redis_rtt_url)

    def worker_spec(self) -> WorkerSpec:
        env = dict(_MOTO_ENV) if self.kind in ("moto", "seaweedfs") else {}
        return WorkerSpec(
            objects_url=self.objects_url,
            redis_url=self.redis_url,
            redis_rtt_url=self.redis_rtt_url,
            redis_prefix=self.redis_prefix,
            floor_prefix=self.key_prefix,
            kind=self.kind,
            env=env,
        )

    def close(self, keep: bool = False) -> None:
        for st in self._stores:
            try:
                st.close()
            except Exception:
                pass
        self._stores.clear()
        for fn in reversed(self._cleanup):
            try:
                fn(keep)
            except Exception as exc:  # cleanup must not hide the results
                print(f"warning: cleanup failed: {exc}", file=sys.stderr)
        self._cleanup.clear()


def make_raw(kind: str, objects_url: str, key_prefix: str) -> RawObjects:
    parsed = urlparse(objects_url)
    if parsed.scheme == "s3":
        return RawS3(objects_url, key_prefix + "bench-floor/")
    if parsed.scheme == "file":
        return RawFile(Path(unquote(parsed.path)) / "bench-floor")
    raise ValueError(f"no raw floor client for {objects_url!r}")


def make_redis(url: str) -> redis.Redis:
    """A client built like the coordinator's (no hidden retries)."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        url, socket_timeout=2.0, socket_connect_timeout=2.0, retry=Retry(NoBackoff(), 0)
    )


class RedisRoundTrip:
    """One coordinator round trip, the cheapest it can be: EVALSHA of a one-line script."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self._script = client.register_script(_RTT_SCRIPT)
        self._keys = [key]

    def __call__(self) -> None:
        self._script(keys=self._keys)


class RedisCallCounter:
    """Counts the commands a redis-py client sends (one per round trip; a script is one)."""

    def __init__(self, client: Any) -> None:
        self.calls: dict[str, int] = {}
        original = client.execute_command

        def counting(*args: Any, **kwargs: Any) -> Any:
            name = str(args[0]).lower() if args else "?"
            self.calls[name] = self.calls.get(name, 0) + 1
            return original(*args, **kwargs)

        client.execute_command = counting
        make_pipeline = client.pipeline

        def pipeline(*args: Any, **kwargs: Any) -> Any:
            pipe = make_pipeline(*args, **kwargs)
            execute = pipe.execute

            def counted_execute(*a: Any, **k: Any) -> Any:
                self.calls["pipeline"] = self.calls.get("pipeline", 0) + 1
                return execute(*a, **k)

            pipe.execute = counted_execute
            return pipe

        client.pipeline = pipeline

    def snapshot(self) -> dict[str, int]:
        return dict(self.calls)


def redis_commandstats(client: redis.Redis) -> dict[str, int]:
    """Calls per command so far (``INFO commandstats``)."""
    info = client.info("commandstats")
    out: dict[str, int] = {}
    for name, value in info.items():
        if name.startswith("cmdstat_") and isinstance(value, dict):
            out[name[len("cmdstat_") :]] = int(value.get("calls", 0))
    return out


def _add_url_prefix(url: str, extra: str) -> str:
    parsed = urlparse(url)
    path = parsed.path.rstrip("/") + "/" + extra
    return urlunparse(parsed._replace(path=path))


def _key_prefix(objects_url: str) -> str:
    from store.backends.objects import s3_prefix_of

    return s3_prefix_of(objects_url)


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    for pkg in ("boto3", "botocore", "redis", "orjson", "moto", "tenacity", "matplotlib"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def _serve_moto() -> None:
    """Child process: the harness's moto server; prints its port, runs until stdin closes."""
    harness = _harness()
    server = harness.S3Server().start()
    print(server.port, flush=True)
    try:
        sys.stdin.read()
    finally:
        server.stop()


def start_moto_backend(run_id: str) -> Backend:
    harness = _harness()
    _use_test_credentials()
    proc = subprocess.Popen(
        [sys.executable, "-c", "from benchmarks.backends import _serve_moto; _serve_moto()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=str(REPO_ROOT),
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])},
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline()
    if not line.strip().isdigit():
        proc.kill()
        raise RuntimeError(f"the moto server did not start (got {line!r})")
    port = int(line)
    endpoint = f"http://127.0.0.1:{port}"
    harness.s3_client(endpoint).create_bucket(Bucket=_MOTO_BUCKET)
    redis_server = harness.RedisServer(persistence="none").start()
    objects_url = harness.s3_server.s3_url(_MOTO_BUCKET, f"run-{run_id}", endpoint)
    versions = _versions()
    versions["redis-server"] = harness.redis_server_version(redis_server.binary)

    def stop(keep: bool) -> None:
        redis_server.close()
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    return _on_local_servers(
        "moto", run_id, objects_url, redis_server, versions, stop,
        f"moto {versions.get('moto', '?')} S3 server (harness write lock, own process)", proc.pid)


def start_seaweedfs_backend(run_id: str) -> Backend:
    """SeaweedFS (``weed mini``, as the test suite starts it) and a redis-server: a real
    object store whose work runs outside Python, so that a run whose own processes load the
    machine (``--only http-load``) measures them, not a Python S3 server beside them."""
    harness = _harness()
    _use_test_credentials()  # weed mini's admin identity is testing/testing, as moto's
    weed = harness.SeaweedServer().start()
    try:
        bucket = weed.create_bucket(_MOTO_BUCKET)
        redis_server = harness.RedisServer(persistence="none").start()
    except BaseException:
        weed.close()
        raise
    objects_url = weed.url_for(bucket, f"run-{run_id}")
    versions = _versions()
    versions["redis-server"] = harness.redis_server_version(redis_server.binary)
    versions["seaweedfs"] = harness.weed_version(weed.binary)

    def stop(keep: bool) -> None:
        redis_server.close()
        weed.close()

    return _on_local_servers("seaweedfs", run_id, objects_url, redis_server, versions, stop,
                             f"SeaweedFS {versions['seaweedfs']} (weed mini)", weed.pid)


def _use_test_credentials() -> None:
    """The local S3 servers' identity (testing/testing), and nothing of the environment's."""
    os.environ.update(_MOTO_ENV)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(name, None)


def _on_local_servers(kind: str, run_id: str, objects_url: str, redis_server: Any, versions: dict[str, str],
                      stop: Any, s3_description: str, s3_pid: int) -> Backend:
    """A run on an S3 server and a redis-server this run started."""
    backend = Backend(
        kind=kind,
        objects_url=objects_url,
        redis_url=redis_server.url,
        redis_rtt_url=redis_server.url,
        redis_prefix=f"bench-{run_id}",
        key_prefix=_key_prefix(objects_url),
        description=f"{s3_description} + redis-server {versions['redis-server']} (no persistence), loopback",
        versions=versions,
        pids={f"s3 ({kind})": s3_pid, "redis-server": redis_server.pid},
    )
    backend._cleanup.append(stop)
    return backend


def start_embedded_backend(run_id: str, directory: str | None = None) -> Backend:
    from store.backends.embedded import EmbeddedRedis, embedded_redis_url
    from store.backends.objects import FileObjectStore

    root = Path(directory or tempfile.mkdtemp(prefix=f"ssbench-{run_id}-"))
    objects_url = f"file://{root}"
    # Start the embedded Redis exactly as SessionStore.from_url(url) with no Redis URL does.
    rtt_url = embedded_redis_url(FileObjectStore(root))
    versions = _versions()
    try:
        harness = _harness()
        from store.backends.embedded import redis_server_binary

        versions["redis-server"] = harness.redis_server_version(redis_server_binary())
    except Exception:
        pass

    def stop(keep: bool) -> None:
        EmbeddedRedis(root / ".redis").stop()
        if not keep and directory is None:
            shutil.rmtree(root, ignore_errors=True)

    backend = Backend(
        kind="embedded",
        objects_url=objects_url,
        redis_url=None,
        redis_rtt_url=rtt_url,
        redis_prefix=f"bench-{run_id}",
        key_prefix="",
        description=f"embedded default: file:// store in {root} (fsync) + embedded redis-server "
        f"{versions.get('redis-server', '?')} (unix socket, AOF everysec)",
        versions=versions,
    )
    backend._cleanup.append(stop)
    return backend


def start_external_backend(run_id: str, objects_url: str, redis_url: str) -> Backend:
    parsed = urlparse(objects_url)
    if parsed.scheme == "file":
        root = Path(unquote(parsed.path)) / f"bench-{run_id}"
        url = f"file://{root}"
    elif parsed.scheme == "s3":
        url = _add_url_prefix(objects_url, f"bench-{run_id}")
        root = None
    else:
        raise ValueError(f"--objects must be s3://... or file://..., not {objects_url!r}")
    prefix = f"bench-{run_id}"
    versions = _versions()
    try:
        client = make_redis(redis_url)
        versions["redis-server"] = str(client.info("server").get("redis_version", "?"))
        client.close()
    except Exception:
        pass

    def stop(keep: bool) -> None:
        if keep:
            return
        _delete_redis_prefix(redis_url, prefix)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
        else:
            _delete_s3_prefix(url)

    backend = Backend(
        kind="external",
        objects_url=url,
        redis_url=redis_url,
        redis_rtt_url=redis_url,
        redis_prefix=prefix,
        key_prefix=_key_prefix(url),
        description=f"external: {_redact(objects_url)} + {_redact(redis_url)} "
        f"(redis-server {versions.get('redis-server', '?')})",
        versions=versions,
    )
    backend._cleanup.append(stop)
    return backend


def _redact(url: str) -> str:
    parsed = urlparse(url)
    if parsed.password:
        netloc = parsed.netloc.replace(f":{parsed.password}@", ":***@")
        return urlunparse(parsed._replace(netloc=netloc))
    return url


def _delete_redis_prefix(url: str, prefix: str) -> None:
    from coordination.redis import Coordinator

    coord = Coordinator.from_url(url, prefix=prefix)
    try:
        coord.purge()
    finally:
        coord.close()


def _delete_s3_prefix(objects_url: str) -> None:
    from store.backends.objects import S3ObjectStore, parse_s3_url

    owner = S3ObjectStore(parse_s3_url(objects_url))
    try:
        keys = [i.key for i in owner.list(_key_prefix(objects_url))]
        owner.delete_many(keys)
    finally:
        owner.close()


def parallel(fn: Any, items: list[Any], threads: int = 16) -> list[Any]:
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(fn, items))
