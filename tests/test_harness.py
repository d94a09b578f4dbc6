"""Tests of the test harness itself: RedisServer, S3Server (+ moto write lock), SeaweedServer,
TcpProxy.

They start servers of their own, so they run the same with or without the SESSIONSTORE_TEST_*
variables, except the few that exercise conftest's env-dependent fixtures (``private_redis``
skips against an external Redis; ``s3_proxy``/``s3_location`` run once per S3 backend, or
against the external S3; the SeaweedFS ones follow SESSIONSTORE_TEST_S3_BACKENDS).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import botocore.exceptions
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from harness import (
    RedisServer,
    RedisServerError,
    S3Server,
    SeaweedServer,
    SeaweedServerError,
    TcpProxy,
    find_redis_server,
    moto_write_lock_bypassed,
)
from harness.s3_server import LOCKED_METHODS

pytestmark = pytest.mark.timeout(120)


def _alive(pid: int) -> bool:
    """True while a process (zombie or not) with this pid exists."""
    return os.path.exists(f"/proc/{pid}")


def _one_shot(server_or_url: Any, **kwargs: Any) -> redis.Redis:
    """A redis-py client that does not retry (redis-py 8 retries 10 times by default)."""
    kwargs.setdefault("socket_timeout", 1.0)
    kwargs.setdefault("socket_connect_timeout", 1.0)
    kwargs.setdefault("retry", Retry(NoBackoff(), 0))
    url = server_or_url if isinstance(server_or_url, str) else server_or_url.url
    return redis.Redis.from_url(url, **kwargs)


def _status(exc_or_resp: Any) -> int:
    if isinstance(exc_or_resp, botocore.exceptions.ClientError):
        return int(exc_or_resp.response["ResponseMetadata"]["HTTPStatusCode"])
    return int(exc_or_resp["ResponseMetadata"]["HTTPStatusCode"])


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    """This module's own moto server, whatever the run's S3 backends (it shadows conftest's
    ``s3_server``): the tests that use it check moto's own features (the write lock,
    ``moto_write_lock_bypassed``, patches of its in-process backend, the moto-api reset), or
    need any HTTP server to put a TcpProxy in front of."""
    with S3Server() as server:
        yield server


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def make_redis() -> Iterator[Callable[..., RedisServer]]:
    servers: list[RedisServer] = []

    def make(**kwargs: Any) -> RedisServer:
        servers.append(RedisServer(**kwargs))
        return servers[-1].start()

    yield make
    for server in servers:
        server.close()


# === RedisServer ==============================================================================


def test_redis_binary_is_a_real_executable() -> None:
    path = find_redis_server()
    assert os.access(path, os.X_OK)
    with open(path, "rb") as fh:
        assert fh.read(4) == b"\x7fELF", f"{path} is a wrapper script, not redis-server itself"


def test_redis_start_url_client_and_close_reaps() -> None:
    server = RedisServer()
    with server:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        client = server.client()
        assert client.ping()
        client.set("k", "v")
        assert client.get("k") == b"v"
        pid = server.pid
        assert pid is not None and _alive(pid)
        client.close()
    assert not _alive(pid), "redis-server still exists (or is a zombie) after close()"
    assert not os.path.exists(server.dir)


def test_redis_kill_is_sigkill_and_clients_fail(private_redis: RedisServer) -> None:
    """(Through conftest's private_redis fixture.)"""
    client = _one_shot(private_redis)
    client.set("k", "v")
    pid = private_redis.pid
    assert pid is not None
    private_redis.kill()
    assert not private_redis.running
    assert not _alive(pid)
    with pytest.raises(redis.ConnectionError):
        client.get("k")
    client.close()


def test_redis_restart_without_persistence_loses_data(own_redis: RedisServer) -> None:
    port = own_redis.port
    client = _one_shot(own_redis)
    client.set("k", "v")
    own_redis.restart()
    assert own_redis.port == port
    assert client.get("k") is None
    client.set("k", "v2")
    own_redis.restart(kill=True)
    assert client.get("k") is None
    client.close()


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_redis_restart_with_appendonly_keeps_data(
    make_redis: Callable[..., RedisServer], kill: bool
) -> None:
    server = make_redis(persistence="aof")
    client = _one_shot(server)
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    client.set("k", "v")
    client.rpush("l", 1, 2, 3)
    port, directory = server.port, server.dir
    server.restart(kill=kill)  # appendfsync always: even SIGKILL keeps acknowledged writes
    assert (server.port, server.dir) == (port, directory)
    assert client.get("k") == b"v"
    assert client.lrange("l", 0, -1) == [b"1", b"2", b"3"]
    client.close()


def test_redis_extra_config_is_applied(make_redis: Callable[..., RedisServer]) -> None:
    server = make_redis(config={"maxmemory-policy": "noeviction", "appendfsync": "everysec"}, persistence="aof")
    client = _one_shot(server)
    assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
    assert client.config_get("save") == {"save": ""}
    client.close()


def test_redis_pause_causes_timeout_and_resume_recovers(own_redis: RedisServer) -> None:
    client = _one_shot(own_redis, socket_timeout=0.3)
    client.set("k", "v")
    own_redis.pause()
    assert own_redis.paused
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        client.get("k")
    assert time.monotonic() - started < 2.0
    # a new connection is accepted by the kernel, but nothing answers on it either
    fresh = _one_shot(own_redis, socket_timeout=0.3)
    with pytest.raises(redis.TimeoutError):
        fresh.ping()
    own_redis.resume()
    assert not own_redis.paused
    assert fresh.get("k") == b"v"
    client.close()
    fresh.close()


def test_redis_stop_while_paused_does_not_hang(own_redis: RedisServer) -> None:
    pid = own_redis.pid
    assert pid is not None
    own_redis.pause()
    started = time.monotonic()
    own_redis.stop()
    assert time.monotonic() - started < 5
    assert not _alive(pid)


def test_redis_start_failure_reports_the_log() -> None:
    server = RedisServer(config={"no-such-directive": "1"}, startup_timeout=5)
    try:
        with pytest.raises(RedisServerError) as info:
            server.start()
        message = str(info.value)
        assert "exited with code" in message
        assert "no-such-directive" in message or "Bad directive" in message, message
        assert not server.running
    finally:
        server.close()


def test_redis_finalizer_reaps_a_forgotten_server() -> None:
    server = RedisServer().start()
    pid = server.pid
    directory = server.dir
    assert pid is not None
    del server  # never stopped: the weakref finalizer must kill and reap it
    import gc

    gc.collect()
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
    assert not os.path.exists(directory)


# === S3Server and moto's conditional writes ==================================================


def test_moto_write_lock_is_installed_on_every_write_path(s3_server: S3Server) -> None:
    from moto.s3.responses import S3Response

    for name in LOCKED_METHODS:
        assert getattr(getattr(S3Response, name), "_sessionstore_write_locked", False), name


def test_moto_answers_412_for_if_none_match_on_an_existing_key(s3_server: S3Server) -> None:
    client = s3_server.client()
    bucket = s3_server.create_bucket()
    assert _status(client.put_object(Bucket=bucket, Key="k", Body=b"one", IfNoneMatch="*")) == 200
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.put_object(Bucket=bucket, Key="k", Body=b"two", IfNoneMatch="*")
    assert _status(info.value) == 412
    assert info.value.response["Error"]["Code"] == "PreconditionFailed"
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"one"


def test_moto_if_match_on_put_and_delete(s3_server: S3Server) -> None:
    client = s3_server.client()
    bucket = s3_server.create_bucket()
    etag = client.put_object(Bucket=bucket, Key="k", Body=b"one")["ETag"]
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.put_object(Bucket=bucket, Key="k", Body=b"x", IfMatch='"0123456789abcdef0123456789abcdef"')
    assert _status(info.value) == 412
    etag2 = client.put_object(Bucket=bucket, Key="k", Body=b"two", IfMatch=etag)["ETag"]
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.delete_object(Bucket=bucket, Key="k", IfMatch=etag)  # stale etag
    assert _status(info.value) == 412
    assert _status(client.delete_object(Bucket=bucket, Key="k", IfMatch=etag2)) == 204
    # If-Match on a missing key: moto answers 404 NoSuchKey (not 412)
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.put_object(Bucket=bucket, Key="missing", Body=b"x", IfMatch=etag)
    assert _status(info.value) == 404


@pytest.fixture
def slow_moto_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Widen moto's check-then-write window so that a race, if possible, really happens.

    (Patches moto's in-process backend: the requests still go through boto3 over real HTTP.)
    """
    from moto.s3.models import S3Backend

    for name in ("put_object", "complete_multipart_upload"):
        original = getattr(S3Backend, name)

        def slow(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
            time.sleep(0.05)
            return __original(self, *args, **kwargs)

        monkeypatch.setattr(S3Backend, name, slow)


def _race_conditional_puts(s3_server: S3Server, writers: int) -> tuple[list[int], str, bytes]:
    client = s3_server.client(max_pool_connections=writers)
    bucket = s3_server.create_bucket()
    key = f"race/{uuid.uuid4().hex}"
    barrier = threading.Barrier(writers)

    def put(i: int) -> int:
        barrier.wait()
        try:
            return _status(client.put_object(Bucket=bucket, Key=key, Body=f"writer-{i}".encode(), IfNoneMatch="*"))
        except botocore.exceptions.ClientError as exc:
            return _status(exc)

    with ThreadPoolExecutor(writers) as pool:
        statuses = list(pool.map(put, range(writers)))
    body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    return statuses, key, body


@pytest.mark.usefixtures("slow_moto_writes")
def test_conditional_put_race_has_exactly_one_winner(s3_server: S3Server) -> None:
    writers = 16
    statuses, _, body = _race_conditional_puts(s3_server, writers)
    assert sorted(statuses) == [200] + [412] * (writers - 1), statuses
    assert body == f"writer-{statuses.index(200)}".encode()


@pytest.mark.usefixtures("slow_moto_writes")
def test_moto_without_the_lock_lets_racing_conditional_puts_both_win(s3_server: S3Server) -> None:
    """Why the lock exists: moto checks If-None-Match, then writes, with nothing in between."""
    with moto_write_lock_bypassed():
        statuses, _, _ = _race_conditional_puts(s3_server, 8)
    if statuses.count(200) <= 1:
        pytest.skip(f"moto no longer races on conditional PUT ({statuses}): the lock may be unneeded")
    assert statuses.count(200) > 1


@pytest.mark.usefixtures("slow_moto_writes")
def test_conditional_multipart_complete_race_has_exactly_one_winner(s3_server: S3Server) -> None:
    writers = 4
    client = s3_server.client(max_pool_connections=writers)
    bucket = s3_server.create_bucket()
    key = "race/multipart"
    uploads = []
    for i in range(writers):
        upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        etag = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=f"part-{i}".encode())["ETag"]
        uploads.append((upload_id, etag))
    barrier = threading.Barrier(writers)

    def complete(i: int) -> int:
        upload_id, etag = uploads[i]
        barrier.wait()
        try:
            return _status(
                client.complete_multipart_upload(
                    Bucket=bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
                    IfNoneMatch="*",
                )
            )
        except botocore.exceptions.ClientError as exc:
            return _status(exc)

    with ThreadPoolExecutor(writers) as pool:
        statuses = list(pool.map(complete, range(writers)))
    assert sorted(statuses) == [200] + [412] * (writers - 1), statuses
    body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert body == f"part-{statuses.index(200)}".encode()


def test_s3_bulk_delete_and_reset() -> None:
    # a server of its own: reset wipes all of moto's (process-global) state
    with S3Server() as server:
        # One endpoint serves each service a request is signed for: KMS beside S3.
        import boto3

        kms = boto3.client("kms", endpoint_url=server.endpoint_url, region_name=server.region,
                           aws_access_key_id="testing", aws_secret_access_key="testing")
        key_id = kms.create_key(Description="harness")["KeyMetadata"]["KeyId"]
        assert kms.describe_key(KeyId=key_id)["KeyMetadata"]["KeyState"] == "Enabled"
        client = server.client()
        bucket = server.create_bucket()
        for i in range(3):
            client.put_object(Bucket=bucket, Key=f"k{i}", Body=b"x")
        result = client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "k0"}, {"Key": "k1"}]})
        assert sorted(d["Key"] for d in result["Deleted"]) == ["k0", "k1"]
        assert [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]] == ["k2"]
        server.reset()
        assert bucket not in [b["Name"] for b in client.list_buckets()["Buckets"]]
        port = server.port
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_fixtures_give_a_fresh_location_per_test(s3_url: str, s3_location: Any, redis_url: str, redis_prefix: str) -> None:
    assert s3_url.startswith(f"s3://{s3_location.bucket}/{s3_location.prefix}?endpoint=")
    assert "region=" in s3_url
    client = s3_location.client()
    key = f"{s3_location.key_prefix}hello"
    client.put_object(Bucket=s3_location.bucket, Key=key, Body=b"hi")
    assert client.get_object(Bucket=s3_location.bucket, Key=key)["Body"].read() == b"hi"
    r = redis.Redis.from_url(redis_url)
    r.set(f"{redis_prefix}:k", "v")
    assert r.get(f"{redis_prefix}:k") == b"v"
    r.close()


# === SeaweedServer ============================================================================

seaweedfs_only = pytest.mark.s3_backends("seaweedfs", reason="tests the SeaweedFS harness")


def _code(exc: botocore.exceptions.ClientError) -> str:
    return str(exc.response["Error"]["Code"])


@seaweedfs_only
def test_seaweed_checks_signatures_and_refuses_missing_buckets(s3_backend: str, seaweed_server: SeaweedServer) -> None:
    client = seaweed_server.client()
    bucket = seaweed_server.create_bucket()
    assert _status(client.put_object(Bucket=bucket, Key="k", Body=b"one", IfNoneMatch="*")) == 200
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.put_object(Bucket=bucket, Key="k", Body=b"two", IfNoneMatch="*")
    assert (_status(info.value), _code(info.value)) == (412, "PreconditionFailed")
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"one"
    with pytest.raises(botocore.exceptions.ClientError) as info:
        seaweed_server.client(secret_access_key="wrong").get_object(Bucket=bucket, Key="k")
    assert _code(info.value) == "SignatureDoesNotMatch"
    # -s3.autoCreateBucket=false: the admin identity's write does not create the bucket
    missing = f"missing-{uuid.uuid4().hex[:12]}"
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.put_object(Bucket=missing, Key="k", Body=b"x", IfNoneMatch="*")
    assert (_status(info.value), _code(info.value)) == (404, "NoSuchBucket")
    assert missing not in [b["Name"] for b in client.list_buckets()["Buckets"]]


@seaweedfs_only
def test_seaweed_conditional_put_race_has_exactly_one_winner(s3_backend: str, seaweed_server: SeaweedServer) -> None:
    """No lock of ours: SeaweedFS arbitrates racing If-None-Match creates on its own."""
    writers = 8
    client = seaweed_server.client(max_pool_connections=writers)
    bucket = seaweed_server.create_bucket()
    for round_no in range(3):
        barrier = threading.Barrier(writers)

        def put(i: int, key: str = f"race-{round_no}") -> int:
            barrier.wait()
            try:
                return _status(client.put_object(Bucket=bucket, Key=key, Body=str(i).encode(), IfNoneMatch="*"))
            except botocore.exceptions.ClientError as exc:
                return _status(exc)

        with ThreadPoolExecutor(writers) as pool:
            statuses = list(pool.map(put, range(writers)))
        assert sorted(statuses) == [200] + [412] * (writers - 1), statuses


@seaweedfs_only
def test_seaweed_close_reaps_and_cleans_up(s3_backend: str, seaweed_server: SeaweedServer) -> None:
    import glob

    server = SeaweedServer(binary=seaweed_server.binary).start()
    pid, directory, ports = server.pid, server.dir, dict(server.ports)
    assert pid is not None and _alive(pid)
    assert len(set(ports.values())) == len(ports) and ports["admin.grpc"] == ports["admin"] + 10000
    bucket = server.create_bucket()
    server.client().put_object(Bucket=bucket, Key="k", Body=b"x")
    assert "weed" in open(server.log_path).read(4096)
    server.close()
    assert not _alive(pid)
    assert not os.path.exists(directory)
    assert not [p for port in ports.values() for p in glob.glob(f"/tmp/seaweedfs-*-grpc-{port}.sock")]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", ports["s3"]), timeout=1).close()
    assert not server.crashed


def test_seaweed_start_failure_reports_and_keeps_the_log() -> None:
    import shutil

    server = SeaweedServer(binary="/bin/false", startup_timeout=10)
    try:
        with pytest.raises(SeaweedServerError) as info:
            server.start()
        message = str(info.value)
        assert "exited with code 1" in message and server.log_path in message
        assert not server.running
        server.close()
        assert os.path.exists(server.log_path), "the log of a failed start is kept"
    finally:
        shutil.rmtree(server.dir, ignore_errors=True)


@pytest.mark.parametrize("ci", ["true", ""], ids=["ci", "local"])
def test_seaweed_missing_binary_fails_in_ci_and_skips_locally(ci: str) -> None:
    """Without weed, the SeaweedFS tests are skipped locally, but under CI they fail."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONSTORE_TEST_") and k != "CI"}
    env.update(SESSIONSTORE_WEED="/nonexistent/weed", SESSIONSTORE_TEST_S3_BACKENDS="seaweedfs", CI=ci)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-rs",
         os.path.join(tests_dir, "test_objects.py"), "-k", "TestS3ObjectStore and test_empty_object"],
        cwd=os.path.dirname(tests_dir), env=env, capture_output=True, text=True, timeout=120,
    )
    out = result.stdout + result.stderr
    if ci:
        assert result.returncode == 1 and "1 error" in out and "CI: the SeaweedFS tests must run" in out, out
    else:
        assert result.returncode == 0 and "1 skipped" in out and "SESSIONSTORE_WEED" in out, out


# === TcpProxy =================================================================================


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    return s3_server.create_bucket()


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[TcpProxy]:
    with TcpProxy("127.0.0.1", s3_server.port, name="test-s3") as p:
        yield p


def test_proxy_passes_http_through(s3_server: S3Server, proxy: TcpProxy, bucket: str) -> None:
    client = s3_server.client(endpoint_url=proxy.endpoint_url)
    body = os.urandom(3 * 1024 * 1024)  # several chunks each way
    client.put_object(Bucket=bucket, Key="big", Body=body)
    assert client.get_object(Bucket=bucket, Key="big")["Body"].read() == body
    stats = proxy.stats()
    assert stats["accepted"] >= 1 and stats["dropped_responses"] == 0


def test_proxy_drop_next_response_put_landed_but_client_saw_an_error(
    s3_server: S3Server, proxy: TcpProxy, bucket: str
) -> None:
    client = s3_server.client(endpoint_url=proxy.endpoint_url)  # one attempt: no botocore retry
    direct = s3_server.client()
    proxy.drop_next_response()
    with pytest.raises(botocore.exceptions.ConnectionClosedError):
        client.put_object(Bucket=bucket, Key="k", Body=b"landed", IfNoneMatch="*")
    assert direct.get_object(Bucket=bucket, Key="k")["Body"].read() == b"landed"
    assert proxy.stats()["dropped_responses"] == 1
    # only one response was dropped: the next request goes through (a conditional retry
    # finds its own earlier write: the ambiguity the store has to resolve)
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.put_object(Bucket=bucket, Key="k", Body=b"landed", IfNoneMatch="*")
    assert _status(info.value) == 412


def test_proxy_drop_next_response_counts(s3_server: S3Server, proxy: TcpProxy, bucket: str) -> None:
    client = s3_server.client(endpoint_url=proxy.endpoint_url)
    proxy.drop_next_response(2)
    for i in range(2):
        with pytest.raises(botocore.exceptions.ConnectionClosedError):
            client.put_object(Bucket=bucket, Key=f"k{i}", Body=b"x")
    client.put_object(Bucket=bucket, Key="k2", Body=b"x")
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == ["k0", "k1", "k2"]


def test_proxy_drop_passes_100_continue_through(s3_server: S3Server, proxy: TcpProxy, bucket: str) -> None:
    """botocore sends 'Expect: 100-continue' for file bodies; the interim response is not the
    one to drop (else the server would never see the body)."""
    import io

    client = s3_server.client(endpoint_url=proxy.endpoint_url)
    proxy.drop_next_response()
    with pytest.raises(botocore.exceptions.ConnectionClosedError):
        client.put_object(Bucket=bucket, Key="file", Body=io.BytesIO(b"file body"))
    assert s3_server.client().get_object(Bucket=bucket, Key="file")["Body"].read() == b"file body"


def test_proxy_blackhole_times_out_then_heal(s3_server: S3Server, proxy: TcpProxy, bucket: str) -> None:
    client = s3_server.client(endpoint_url=proxy.endpoint_url, read_timeout=0.5, connect_timeout=0.5)
    client.put_object(Bucket=bucket, Key="before", Body=b"x")  # a pooled, open connection
    proxy.blackhole()
    for key in ("during", "during2"):  # the pooled connection, then a brand-new one
        started = time.monotonic()
        with pytest.raises((botocore.exceptions.ReadTimeoutError, botocore.exceptions.ConnectTimeoutError)):
            client.put_object(Bucket=bucket, Key=key, Body=b"x")
        assert time.monotonic() - started < 3
    direct = s3_server.client()
    assert [o["Key"] for o in direct.list_objects_v2(Bucket=bucket)["Contents"]] == ["before"]
    proxy.heal()
    client.put_object(Bucket=bucket, Key="after", Body=b"x")
    assert client.get_object(Bucket=bucket, Key="after")["Body"].read() == b"x"


def test_proxy_reset_connections(s3_server: S3Server, proxy: TcpProxy, bucket: str) -> None:
    client = s3_server.client(endpoint_url=proxy.endpoint_url)
    client.put_object(Bucket=bucket, Key="k", Body=b"x")
    # a request in flight: its response is held by a delay, then the connection is reset
    proxy.delay(2.0, direction="response")
    errors: list[BaseException] = []

    def get() -> None:
        try:
            client.get_object(Bucket=bucket, Key="k")["Body"].read()
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=get)
    started = time.monotonic()
    worker.start()
    deadline = time.monotonic() + 5
    while proxy.stats()["active"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # the request has reached the server; its answer waits in the proxy
    assert proxy.reset_connections() >= 1
    worker.join(5)
    assert time.monotonic() - started < 1.5, "the client waited for the delayed answer"
    assert len(errors) == 1
    assert isinstance(errors[0], (botocore.exceptions.ConnectionClosedError, botocore.exceptions.EndpointConnectionError)), repr(errors[0])
    proxy.heal()
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"x"  # reconnects
    assert proxy.stats()["reset"] >= 1


def test_proxy_delay(s3_server: S3Server, proxy: TcpProxy, bucket: str) -> None:
    client = s3_server.client(endpoint_url=proxy.endpoint_url)
    client.put_object(Bucket=bucket, Key="k", Body=b"x")

    def timed_get() -> float:
        started = time.monotonic()
        client.get_object(Bucket=bucket, Key="k")["Body"].read()
        return time.monotonic() - started

    assert timed_get() < 0.25
    proxy.delay(0.3, direction="response")
    assert 0.3 <= timed_get() < 1.5
    proxy.delay(0.3)  # both ways: a round trip pays twice
    assert 0.6 <= timed_get() < 2.0
    proxy.heal()
    assert timed_get() < 0.25


def test_proxy_delayed_request_lands_late(s3_server: S3Server, proxy: TcpProxy, bucket: str) -> None:
    client = s3_server.client(endpoint_url=proxy.endpoint_url)
    direct = s3_server.client()
    client.head_bucket(Bucket=bucket)  # connect first
    proxy.delay(0.6, direction="request")
    worker = threading.Thread(target=lambda: client.put_object(Bucket=bucket, Key="late", Body=b"x"))
    worker.start()
    time.sleep(0.3)
    assert "Contents" not in direct.list_objects_v2(Bucket=bucket)  # still on the wire
    worker.join(5)
    assert direct.get_object(Bucket=bucket, Key="late")["Body"].read() == b"x"


def test_proxy_upstream_down_resets_the_client(own_redis: RedisServer, tcp_proxy_factory: Any) -> None:
    proxy = tcp_proxy_factory("127.0.0.1", own_redis.port)
    client = _one_shot(proxy.redis_url())
    assert client.ping()
    own_redis.kill()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    # Whether that ping met the old connection already closed or tried a new one is a race;
    # a new client's connection certainly reaches the proxy and fails upstream.
    fresh = _one_shot(proxy.redis_url())
    with pytest.raises(redis.ConnectionError):
        fresh.ping()
    fresh.close()
    assert proxy.stats()["upstream_failures"] >= 1
    own_redis.start()
    assert client.ping()
    client.close()


def test_proxy_in_front_of_redis_drop_response(own_redis: RedisServer, tcp_proxy_factory: Any) -> None:
    proxy = tcp_proxy_factory("127.0.0.1", own_redis.port)
    client = _one_shot(proxy.redis_url())
    client.set("n", 0)
    proxy.drop_next_response()
    with pytest.raises(redis.ConnectionError):
        client.incr("n")
    assert _one_shot(own_redis).get("n") == b"1"  # executed, reply lost
    assert client.incr("n") == 2
    client.close()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_proxy_stop_closes_everything(s3_server: S3Server, bucket: str) -> None:
    before_fds = _open_fds()
    for mode in ("plain", "blackhole", "delay", "drop"):
        proxy = TcpProxy("127.0.0.1", s3_server.port).start()
        client = s3_server.client(endpoint_url=proxy.endpoint_url, read_timeout=0.3, connect_timeout=0.3)
        client.put_object(Bucket=bucket, Key=mode, Body=b"x")
        if mode == "blackhole":
            proxy.blackhole()
        elif mode == "delay":
            proxy.delay(5)
        elif mode == "drop":
            proxy.drop_next_response()
        try:
            client.put_object(Bucket=bucket, Key=mode, Body=b"y")
        except botocore.exceptions.BotoCoreError:
            pass
        port = proxy.port
        proxy.stop()
        proxy.stop()  # idempotent
        client.close()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
    assert not [t for t in threading.enumerate() if t.name.startswith("TcpProxy")]
    assert _open_fds() <= before_fds + 2, "proxy leaked sockets"


def test_s3_proxy_fixture_drop_and_heal(s3_proxy: Any, s3_location: Any) -> None:
    """conftest's s3_proxy (moto and SeaweedFS locally, or the external S3 from
    SESSIONSTORE_TEST_S3_URL)."""
    assert s3_proxy.url.startswith(f"s3://{s3_location.bucket}/{s3_location.prefix}?endpoint={s3_proxy.endpoint_url}")
    through_proxy = s3_proxy.client()
    direct = s3_location.client()
    key = f"{s3_location.key_prefix}dropped"
    s3_proxy.drop_next_response()
    with pytest.raises(botocore.exceptions.ConnectionClosedError):
        through_proxy.put_object(Bucket=s3_location.bucket, Key=key, Body=b"landed", IfNoneMatch="*")
    assert direct.get_object(Bucket=s3_location.bucket, Key=key)["Body"].read() == b"landed"
    s3_proxy.heal()
    assert through_proxy.get_object(Bucket=s3_location.bucket, Key=key)["Body"].read() == b"landed"
