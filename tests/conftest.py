"""Shared fixtures: real servers over real connections (never mocks of boto3 or redis-py).

Two local S3 backends, each server started once per session (per xdist worker): moto's S3
server (real HTTP, loopback, with the harness' write lock) and SeaweedFS (``weed mini``, a real
object store; see tests/harness/seaweedfs.py). Redis is a redis-server process started once per
session. A test runs on each backend where its behaviour can differ: the modules in
``EVERY_BACKEND`` (the object-store contract, the append/read/compaction protocols, pauses,
faults, outages, multi-process and soak tests) run once per backend (test ids ``[moto]`` and
``[seaweedfs]``); every other S3 test (features used through the public API: adapters, CLI,
HTTP, pi files, ...) runs on the first selected backend only (SeaweedFS, see ``S3_BACKENDS``). ``SESSIONSTORE_TEST_S3_EVERY=1``
runs every S3 test on every selected backend.
These environment variables change that (see infra/README.md and docs/reliability.md):

* ``SESSIONSTORE_TEST_S3_BACKENDS``: a comma-separated subset of ``moto,seaweedfs`` (default
  both). Without a ``weed`` binary the SeaweedFS tests are skipped, except under ``CI`` (set
  and not ``false``/``0``), where they fail.
* ``SESSIONSTORE_TEST_S3_URL``, e.g. ``s3://sessions?endpoint=http://localhost:9000``: instead
  of the local backends, one external S3 (test ids ``[external]``); each test gets a fresh
  unique prefix in that bucket (credentials from ``AWS_ACCESS_KEY_ID`` /
  ``AWS_SECRET_ACCESS_KEY``), removed afterwards.
* ``SESSIONSTORE_TEST_REDIS_URL``, e.g. ``redis://localhost:6379/0``: no FLUSHALL; each test
  gets a fresh key prefix (``redis_prefix``) whose keys are removed afterwards.

A test that needs one backend's own features says so with a marker: it runs on that backend
only, and when the run has none of its backends it is reported as skipped, with the reason::

    @pytest.mark.s3_backends("moto", reason="patches moto's in-process backend")

Fixtures (scope):

* ``s3_backend`` (session, parametrized) -> ``"moto"``, ``"seaweedfs"`` or ``"external"``.
* ``s3_server`` (session) -> the backend's server: ``S3Server`` (moto) or ``SeaweedServer``;
  skipped when S3 is external. ``moto_server`` / ``seaweed_server`` (session) are the two
  servers themselves, started on first use; ``seaweed_bucket`` (session) the one SeaweedFS
  bucket the tests' prefixes live in.
* ``s3_location`` (function) -> ``S3Location``: bucket, prefix, endpoint_url, region, backend,
  url, ``client()``. moto: a fresh bucket per test. SeaweedFS: a fresh prefix per test in one
  bucket of the session (each new SeaweedFS bucket costs a volume and ~0.2 s on its first
  write). External: a fresh prefix in the given bucket.
* ``s3_url`` (function) -> ``str``: ``s3://BUCKET/PREFIX?endpoint=http://127.0.0.1:PORT&region=us-east-1``.
* ``s3_proxy`` (function) -> ``S3Proxy``: a ``TcpProxy`` in front of the S3 endpoint, with
  ``url`` (same bucket/prefix as ``s3_url``, through the proxy), ``endpoint_url``, ``client()``.
  Works against every backend, external S3 too.
* ``redis_server`` (session) -> ``RedisServer`` (no persistence); skipped when Redis is external.
* ``redis_url`` (function) -> ``str``: local: FLUSHALLed before the test.
* ``redis_prefix`` (function) -> ``str``: a fresh key prefix (``sstest-<hex>``, no trailing
  colon: the store's ``Keys(prefix=...)`` form); always unique, cleaned up on external Redis.
* ``private_redis`` (function) -> a started ``RedisServer`` of the test's own, to kill, pause
  or restart; skipped when Redis is external.
* ``redis_server_factory`` (function) -> ``(**RedisServer kwargs) -> started RedisServer``,
  all closed after the test (e.g. ``persistence="aof"``); skipped when Redis is external.
* ``tcp_proxy_factory`` (function) -> ``(host, port, **TcpProxy kwargs) -> started TcpProxy``,
  all stopped after the test.
"""

from __future__ import annotations

import os
import sys
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (  # noqa: E402
    RedisServer,
    RedisServerError,
    S3Server,
    SeaweedServer,
    SeaweedServerError,
    TcpProxy,
    find_redis_server,
    find_weed,
    new_bucket_name,
    redis_server_version,
    s3_client,
    weed_version,
)
from harness.s3_server import s3_url as _make_s3_url  # noqa: E402

EXTERNAL_S3_URL = os.environ.get("SESSIONSTORE_TEST_S3_URL") or None
EXTERNAL_REDIS_URL = os.environ.get("SESSIONSTORE_TEST_REDIS_URL") or None

#: The local S3 backends, in the order their tests run. The first is the one tests outside
#: ``EVERY_BACKEND`` use: SeaweedFS, a real object store in its own process, where moto's
#: server shares the test process (and its interpreter lock) with the code under test and
#: made the same tests take about 45% longer (tests/test_pi_store.py, test_listing.py,
#: test_cli.py: 150 s against 104 s, the same CPU time).
S3_BACKENDS = ("seaweedfs", "moto")

#: Test modules whose behaviour depends on the object store's own semantics (conditional
#: creates and deletes, listing order and pages, errors, latency under concurrency): each of
#: their S3 tests runs on every selected backend. These are the object-store contract
#: (test_objects), the protocols under concurrency, pauses, faults and outages, and the
#: multi-process, soak and kill runs. The rest use the store through its public API, where a
#: backend is held to the contract once: one backend is enough. A test there whose figures
#: depend on the backend (request counts, which follow the store's listing on each server)
#: says so with ``@pytest.mark.every_backend``.
EVERY_BACKEND = frozenset({
    "test_objects", "test_pauses", "test_faults", "test_outages", "test_multiprocess",
    "test_durability", "test_group_commit", "test_incarnation_races", "test_compacted_ids",
    "test_model_based", "test_listing", "test_fair_appends", "test_idle_state", "test_soak",
    "test_compactor_soak", "test_harness", "test_http_kills",
})


_SKIP_EXTERNAL_REDIS = (
    "SESSIONSTORE_TEST_REDIS_URL points at an external Redis: this test needs a redis-server "
    "process of its own (to kill, pause or restart)"
)
_SKIP_EXTERNAL_S3 = "SESSIONSTORE_TEST_S3_URL points at an external S3: no local S3 server"


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def selected_s3_backends() -> tuple[str, ...]:
    """``("external",)`` with SESSIONSTORE_TEST_S3_URL, else SESSIONSTORE_TEST_S3_BACKENDS."""
    if EXTERNAL_S3_URL:
        return ("external",)
    raw = os.environ.get("SESSIONSTORE_TEST_S3_BACKENDS", "")
    names = tuple(dict.fromkeys(n.strip().lower() for n in raw.split(",") if n.strip()))
    if not names:
        return S3_BACKENDS
    unknown = [n for n in names if n not in S3_BACKENDS]
    if unknown:
        raise pytest.UsageError(
            f"SESSIONSTORE_TEST_S3_BACKENDS={raw!r}: unknown {unknown}; choose from {list(S3_BACKENDS)}"
        )
    return names


def _every_backend() -> bool:
    return os.environ.get("SESSIONSTORE_TEST_S3_EVERY", "").strip().lower() not in ("", "0", "false", "no")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "s3_backends(*names, reason): run only against these S3 backends (moto, seaweedfs, "
        "external); skipped, with the reason, when the run has none of them",
    )
    config.addinivalue_line(
        "markers",
        "long: takes tens of seconds on its own; collected first, so that the long tests start "
        "early instead of ending the run with them",
    )
    config.addinivalue_line(
        "markers",
        "every_backend: this test runs on every S3 backend of the run, as the modules of "
        "EVERY_BACKEND do (a conformance suite, a protocol test in a module of feature tests)",
    )
    config.addinivalue_line(
        "markers",
        "empty_prefix: the test's S3 prefix starts empty (no probe verdict recorded in it): "
        "for tests of the object store itself and of the probe",
    )
    selected_s3_backends()  # a bad SESSIONSTORE_TEST_S3_BACKENDS is a usage error up front


#: About how many seconds each long test of a module takes on a loaded 2-core machine: what
#: ``pytest_collection_modifyitems`` balances the two lanes of long tests by (a module not
#: listed counts ``LANE_DEFAULT_S``). Only the balance depends on these figures, never a result.
LANE_WEIGHTS_S = {
    "test_http_conformance": 90, "test_http_kills": 70, "test_soak": 55, "test_benchmarks_smoke": 50,
    "test_compactor_soak": 40, "test_multiprocess": 25, "test_adapter_langgraph": 20,
}
LANE_DEFAULT_S = 15
LANES = ("long-a", "long-b")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long tests first, in two lanes (``xdist_group`` marks; the run's ``--dist
    loadgroup`` gives each lane to one worker, which runs its tests one after another): each
    worker then starts on its lane or on the short tests, and the long tests run at most two
    at a time, so that their processes do not all load the machine at once (the kill test's
    recovery bound, tests/test_http_kills.py, failed when every worker ran long tests)."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)  # stable: order kept otherwise
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        if item.get_closest_marker("long") is None:
            break
        modules.setdefault(item.module.__name__.rpartition(".")[2], []).append(item)
    # A module's long tests share a lane (the two kill runs never overlap); heaviest first.
    load = dict.fromkeys(LANES, 0)
    for module, long_items in sorted(modules.items(),
                                     key=lambda kv: -len(kv[1]) * LANE_WEIGHTS_S.get(kv[0], LANE_DEFAULT_S)):
        lane = min(LANES, key=lambda name: load[name])
        load[lane] += len(long_items) * LANE_WEIGHTS_S.get(module, LANE_DEFAULT_S)
        for item in long_items:
            item.add_marker(pytest.mark.xdist_group(lane))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that uses S3 (``s3_backend`` in its fixture closure) runs once per backend."""
    if "s3_backend" not in metafunc.fixturenames:
        return
    selected = selected_s3_backends()
    one = (metafunc.module.__name__.rpartition(".")[2] not in EVERY_BACKEND and not _every_backend()
           and metafunc.definition.get_closest_marker("every_backend") is None)
    marker = metafunc.definition.get_closest_marker("s3_backends")
    if marker is None:
        params = [pytest.param(backend, id=backend) for backend in selected[: 1 if one else None]]
    elif any(backend in marker.args for backend in selected):
        ours = [backend for backend in selected if backend in marker.args]
        params = [pytest.param(backend, id=backend) for backend in ours[: 1 if one else None]]
    else:  # none of its backends in this run: one skipped id per backend, with the reason
        reason = f"{', '.join(marker.args)} only: {marker.kwargs.get('reason') or 'needs that backend'}"
        params = [pytest.param(b, id=b, marks=pytest.mark.skip(reason=reason)) for b in selected]
    metafunc.parametrize("s3_backend", params, indirect=True, scope="session")


def pytest_report_header(config: pytest.Config) -> list[str]:
    if EXTERNAL_REDIS_URL:
        redis_desc = EXTERNAL_REDIS_URL
    else:
        try:
            binary = find_redis_server()
            redis_desc = f"{binary} (v{redis_server_version(binary)})"
        except Exception as exc:  # reported again, with detail, by the fixtures
            redis_desc = f"unavailable: {exc}"
    if EXTERNAL_S3_URL:
        s3_desc = EXTERNAL_S3_URL
    else:
        parts = []
        for backend in selected_s3_backends():
            if backend == "seaweedfs":
                try:
                    binary = find_weed()
                    parts.append(f"seaweedfs ({binary}, v{weed_version(binary)})")
                except Exception as exc:  # reported again by the fixture
                    parts.append(f"seaweedfs (unavailable: {exc})")
            else:
                parts.append(backend)
        s3_desc = ", ".join(parts)
    return [f"sessionstore S3: {s3_desc}; Redis: {redis_desc}"]


# --- S3 --------------------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def _aws_test_environment() -> Iterator[None]:
    """Against the local servers: dummy credentials in the environment (the ones both servers
    accept), so any boto3 client the code under test builds (credentials from the default
    chain) signs its requests, and real credentials of the developer's never get used.
    Against external S3 the environment is left alone."""
    if EXTERNAL_S3_URL:
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        for name in ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            mp.delenv(name, raising=False)
        yield


@dataclass
class S3Location:
    """Where one test's objects live."""

    bucket: str
    prefix: str  # no leading/trailing '/'; may be ''
    endpoint_url: str
    region: str = "us-east-1"
    extra_query: dict[str, str] = field(default_factory=dict)
    external: bool = False
    backend: str = "moto"  # "moto", "seaweedfs" or "external"

    @property
    def url(self) -> str:
        return self.url_via(self.endpoint_url)

    def url_via(self, endpoint_url: str) -> str:
        """The store URL for this bucket/prefix through another endpoint (e.g. a proxy)."""
        url = _make_s3_url(self.bucket, self.prefix, endpoint_url, self.region)
        if self.extra_query:
            url += "&" + urllib.parse.urlencode(self.extra_query)
        return url

    @property
    def key_prefix(self) -> str:
        """The prefix as keys start with it: ``'PREFIX/'`` (or ``''``)."""
        return f"{self.prefix}/" if self.prefix else ""

    def client(self, endpoint_url: str | None = None, **kwargs: Any) -> Any:
        """A boto3 client (local servers: dummy credentials; external: the environment's)."""
        if self.external:
            kwargs.setdefault("access_key_id", None)
        return s3_client(endpoint_url or self.endpoint_url, region=self.region, **kwargs)


def _parse_external_s3(url: str) -> S3Location:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise pytest.UsageError(f"SESSIONSTORE_TEST_S3_URL is not s3://BUCKET[/PREFIX]?endpoint=...: {url!r}")
    query = {k: v[-1] for k, v in urllib.parse.parse_qs(parsed.query).items()}
    endpoint = query.pop("endpoint", None)
    if not endpoint:
        raise pytest.UsageError("SESSIONSTORE_TEST_S3_URL needs ?endpoint=http://HOST:PORT")
    region = query.pop("region", None) or os.environ.get("AWS_REGION") or "us-east-1"
    base = urllib.parse.unquote(parsed.path).strip("/")
    prefix = "/".join(p for p in (base, _unique("sstest")) if p)
    return S3Location(parsed.netloc, prefix, endpoint, region, query, external=True, backend="external")


@pytest.fixture(scope="session")
def s3_backend(request: pytest.FixtureRequest) -> str:
    """The S3 backend of this test's run (parametrized by pytest_generate_tests)."""
    return str(request.param)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[S3Server]:
    """moto's S3 server (with the harness' write lock), started on first use."""
    if EXTERNAL_S3_URL:
        pytest.skip(_SKIP_EXTERNAL_S3)
    server = S3Server().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def seaweed_server() -> Iterator[SeaweedServer]:
    """SeaweedFS (``weed mini``), started on first use."""
    if EXTERNAL_S3_URL:
        pytest.skip(_SKIP_EXTERNAL_S3)
    try:
        binary = find_weed()
    except SeaweedServerError as exc:
        if _in_ci():
            pytest.fail(f"CI: the SeaweedFS tests must run, and {exc}", pytrace=False)
        pytest.skip(f"SeaweedFS tests skipped: {exc} (SESSIONSTORE_TEST_S3_BACKENDS=moto runs moto only)")
    server = SeaweedServer(binary=binary).start()
    try:
        yield server
    finally:
        server.close()
        if server.crashed:  # pragma: no cover - shows up next to the failures it caused
            print(f"\nSeaweedFS died during the session; its log: {server.log_path}", file=sys.stderr)


@pytest.fixture(scope="session")
def seaweed_bucket(seaweed_server: SeaweedServer) -> str:
    """The one SeaweedFS bucket of the session (tests get fresh prefixes in it)."""
    return seaweed_server.create_bucket(new_bucket_name("sstest-weed"))


_SERVER_FIXTURES = {"moto": "moto_server", "seaweedfs": "seaweed_server"}


@pytest.fixture(scope="session")
def s3_server(s3_backend: str, request: pytest.FixtureRequest) -> S3Server | SeaweedServer:
    """The local server of this test's backend; skipped when S3 is external."""
    if s3_backend == "external":
        pytest.skip(_SKIP_EXTERNAL_S3)
    server: S3Server | SeaweedServer = request.getfixturevalue(_SERVER_FIXTURES[s3_backend])
    return server


@pytest.fixture
def s3_location(s3_backend: str, request: pytest.FixtureRequest) -> Iterator[S3Location]:
    if s3_backend == "external":
        assert EXTERNAL_S3_URL
        location = _parse_external_s3(EXTERNAL_S3_URL)
        yield location
        _delete_prefix(location)
        return
    # By name, not through ``s3_server``: a module may shadow that fixture (test_harness.py).
    server: S3Server | SeaweedServer
    if s3_backend == "seaweedfs":
        server = request.getfixturevalue("seaweed_server")
        bucket: str = request.getfixturevalue("seaweed_bucket")
    else:
        server = request.getfixturevalue("moto_server")
        bucket = server.create_bucket(new_bucket_name())
    location = S3Location(bucket, _unique("p"), server.endpoint_url, server.region, backend=s3_backend)
    if request.node.get_closest_marker("empty_prefix") is None:
        _record_probe_verdict(server, location)
    yield location


def _record_probe_verdict(server: S3Server | SeaweedServer, location: S3Location) -> None:
    """Record that this backend passed the conditional-write probe, below the test's fresh
    prefix, as the first store opened there would have (``verify_conditional_writes``): each
    store and CLI process of the test then finds it with one HEAD, as every process of a
    store in use does, instead of the first one probing (ten requests, a tenth of a second of
    a test's setup). Tests marked ``empty_prefix`` get an empty prefix: the object store's
    contract, and the probe itself (``test_store.py::test_the_conditional_write_probe_runs_once_per_store_and_backend``,
    on both servers)."""
    from store.formats.layout import Layout
    from store.backends.object_store import verdict_key
    from store.backends.s3 import parse_s3_url, s3_identity

    identity = s3_identity(parse_s3_url(location.url))
    key = verdict_key(Layout(location.key_prefix).probe_prefix, identity)
    server.shared_client().put_object(Bucket=location.bucket, Key=key, Body=identity.encode() + b"\n")


def _delete_prefix(location: S3Location) -> None:
    """Best effort: remove what a test left under its prefix on an external server."""
    try:
        client = location.client()
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=location.bucket, Prefix=location.key_prefix):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=location.bucket, Delete={"Objects": keys, "Quiet": True})
    except Exception as exc:  # pragma: no cover - cleanup must not fail the test
        print(f"warning: could not clean s3://{location.bucket}/{location.prefix}: {exc}", file=sys.stderr)


@pytest.fixture
def s3_url(s3_location: S3Location) -> str:
    """``s3://BUCKET/PREFIX?endpoint=http://127.0.0.1:PORT&region=us-east-1``, fresh per test."""
    return s3_location.url


@dataclass
class S3Proxy:
    """A :class:`TcpProxy` in front of the S3 endpoint of this test's :class:`S3Location`."""

    proxy: TcpProxy
    location: S3Location

    @property
    def endpoint_url(self) -> str:
        return self.proxy.endpoint_url

    @property
    def url(self) -> str:
        """Same bucket and prefix as ``s3_url``, through the proxy."""
        return self.location.url_via(self.proxy.endpoint_url)

    def client(self, **kwargs: Any) -> Any:
        """A boto3 client through the proxy (one attempt, see harness.s3_client)."""
        return self.location.client(self.proxy.endpoint_url, **kwargs)

    # the fault API, for brevity: s3_proxy.drop_next_response() etc.
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("proxy", "location"):
            raise AttributeError(name)
        return getattr(self.proxy, name)


@pytest.fixture
def s3_proxy(s3_location: S3Location) -> Iterator[S3Proxy]:
    parsed = urllib.parse.urlparse(s3_location.endpoint_url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    proxy = TcpProxy(parsed.hostname or "127.0.0.1", port, name="s3").start()
    try:
        yield S3Proxy(proxy, s3_location)
    finally:
        proxy.stop()


# --- Redis -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """The shared redis-server (no persistence). Do not kill or pause it: use private_redis."""
    if EXTERNAL_REDIS_URL:
        pytest.skip(_SKIP_EXTERNAL_REDIS)
    server = RedisServer(persistence="none").start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A fresh key prefix for the store (``Keys(prefix=redis_prefix)``)."""
    prefix = _unique("sstest")
    yield prefix
    if EXTERNAL_REDIS_URL:
        _delete_redis_prefix(EXTERNAL_REDIS_URL, prefix)


def _delete_redis_prefix(url: str, prefix: str) -> None:
    from coordination.redis import Coordinator

    try:
        coord = Coordinator.from_url(url, prefix=prefix)
        try:
            coord.purge()
        finally:
            coord.close()
    except Exception as exc:  # pragma: no cover - cleanup must not fail the test
        print(f"warning: could not clean Redis keys {prefix}*: {exc}", file=sys.stderr)


@pytest.fixture
def redis_url(request: pytest.FixtureRequest) -> str:
    """A clean database: local FLUSHALL, or the external URL (isolate with ``redis_prefix``)."""
    if EXTERNAL_REDIS_URL:
        return EXTERNAL_REDIS_URL
    server: RedisServer = request.getfixturevalue("redis_server")
    if server.paused:
        server.resume()
    if not server.running:  # a test killed the shared server: heal it for the next ones
        server.start()
    client = server.client()
    try:
        client.flushall()
    finally:
        client.close()
    return server.url


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own (no persistence): kill, pause, restart it freely."""
    if EXTERNAL_REDIS_URL:
        pytest.skip(_SKIP_EXTERNAL_REDIS)
    server = RedisServer(persistence="none").start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_server_factory() -> Iterator[Callable[..., RedisServer]]:
    """``redis_server_factory(persistence="aof", config={...})`` -> a started RedisServer."""
    if EXTERNAL_REDIS_URL:
        pytest.skip(_SKIP_EXTERNAL_REDIS)
    servers: list[RedisServer] = []

    def make(**kwargs: Any) -> RedisServer:
        server = RedisServer(**kwargs)
        servers.append(server)
        return server.start()

    try:
        yield make
    finally:
        for server in servers:
            server.close()


@pytest.fixture
def tcp_proxy_factory() -> Iterator[Callable[..., TcpProxy]]:
    """``tcp_proxy_factory(host, port)`` -> a started TcpProxy, stopped after the test."""
    proxies: list[TcpProxy] = []

    def make(host: str, port: int, **kwargs: Any) -> TcpProxy:
        proxy = TcpProxy(host, port, **kwargs)
        proxies.append(proxy)
        return proxy.start()

    try:
        yield make
    finally:
        for proxy in proxies:
            proxy.stop()


# --- Redis Cluster ---------------------------------------------------------------------------


def _redis_cli() -> str | None:
    import shutil

    from harness.redis_server import find_redis_server

    server = find_redis_server()
    for candidate in (server.replace("redis-server", "redis-cli"), shutil.which("redis-cli")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture
def cluster_url() -> Iterator[str]:
    """A three-node Redis Cluster of the test's own: ``redis://...?cluster=true``."""
    import subprocess

    if os.environ.get("SESSIONSTORE_TEST_REDIS_URL"):
        pytest.skip("external Redis configured: this test starts a cluster of its own")
    cli = _redis_cli()
    assert cli, "redis-cli not found next to redis-server"
    nodes: list[RedisServer] = []
    try:
        for i in range(3):
            nodes.append(_cluster_node(i))
        subprocess.run(
            [cli, "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in nodes],
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )
        # Wait until every node agrees the cluster is up.
        import time

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = [n.client().cluster("info").get("cluster_state") for n in nodes]
            if all(s == "ok" for s in states):
                break
            time.sleep(0.2)
        yield f"redis://127.0.0.1:{nodes[0].port}/0?cluster=true"
    finally:
        for n in nodes:
            n.close()


def _cluster_node(i: int) -> RedisServer:
    """Cluster node ``i``, started on a free port pair: another process may take the port
    between :func:`_cluster_port`'s check and redis-server's bind, so a node whose port was
    taken meanwhile is started again on another."""
    config = {"cluster-enabled": "yes", "cluster-node-timeout": "2000", "cluster-config-file": f"nodes-{i}.conf"}
    for _ in range(4):
        node = RedisServer(port=_cluster_port(), config=config)
        try:
            return node.start()
        except RedisServerError as exc:
            node.close()
            if "already in use" not in str(exc):
                raise
    return RedisServer(port=_cluster_port(), config=config).start()


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too (both must be <= 65535)."""
    import random
    import socket

    for _ in range(200):
        port = random.randint(20000, 45000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for a cluster node")


# Fixtures that build SessionStores on these servers.
from store_fixtures import make_store, serve, store  # noqa: E402,F401


# --- embedded servers -------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def _no_embedded_server_outlives_the_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """An embedded redis-server keeps running after the command that started it, by design
    (store/backends/embedded.py): the tests that open stores in their temporary directories would leave
    theirs behind. At the end of the session (of each worker), every redis-server whose working
    directory lies under this session's temporary directory is stopped."""
    yield
    if not os.path.isdir("/proc"):
        return
    import signal

    base = str(tmp_path_factory.getbasetemp())
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                if b"redis-server" not in fh.read():
                    continue
            cwd = os.readlink(f"/proc/{name}/cwd")
        except OSError:
            continue
        if cwd == base or cwd.startswith(base + os.sep):
            try:
                os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass
