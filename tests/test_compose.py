"""The compose stack (``docker-compose.yml``): the file is valid, and its sessionstore
services run as written, without Docker: the ``service`` and ``compactor`` commands, with the
stack's object store and Redis swapped for the test's (SeaweedFS, redis-server), come up
ready and serve their metrics.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import _in_ci
from harness.serve_process import free_port, server_env, stop

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
STACK_OBJECTS = "s3://sessions?endpoint=http://minio:9000"
STACK_REDIS = "redis://redis:6379/0"


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def test_docker_compose_config_validates_the_file() -> None:
    """``docker-compose config`` (Debian's docker-compose; no daemon needed) accepts the file."""
    tool = shutil.which("docker-compose")
    if tool is None:
        if _in_ci():
            pytest.fail("docker-compose missing (.ci/run installs it from Debian)")
        pytest.skip("docker-compose not installed")
    proc = subprocess.run([tool, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_the_stack_has_the_service_the_compactor_and_their_health_checks() -> None:
    services = compose()["services"]
    assert {"minio", "createbucket", "redis", "service", "compactor"} <= set(services)
    for name in ("service", "compactor", "redis", "minio"):
        assert services[name].get("healthcheck"), name
    assert "/readyz" in " ".join(services["service"]["healthcheck"]["test"])
    assert "--metrics-port" in services["compactor"]["command"]
    default = re.match(r"\$\{SESSIONSTORE_TOKENS_FILE:-([^}]+)\}:/run/sessionstore/tokens.json:ro\Z",
                       services["service"]["volumes"][0])
    assert default is not None, services["service"]["volumes"]
    tokens = json.loads((ROOT / default.group(1)).read_text())
    assert tokens["tenants"]["*"] and tokens["tenants"]["acme"], "the example tokens file"


def _as_here(command: list[str], s3_url: str, redis_url: str, redis_prefix: str,
             swap: dict[str, str]) -> list[str]:
    """A compose command as this machine runs it: the stack's backends are the test's, the
    program is this interpreter's."""
    out = []
    for arg in command:
        arg = {STACK_OBJECTS: s3_url, STACK_REDIS: redis_url}.get(arg, arg)
        out.append(swap.get(arg, arg))
    if out[0] == "sessionstore":
        out = [sys.executable, "-m", "store.cli", *out[1:]]
    elif out[0] == "python":
        out = [sys.executable, *out[1:]]
    # The test's Redis is shared: the store's keys go under the test's prefix.
    at = out.index("--redis") + 2
    return [*out[:at], "--redis-prefix", redis_prefix, *out[at:]]


def _own_environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment in the stack, but the object store's credentials (the test's
    servers have their own)."""
    return {k: str(v) for k, v in (service.get("environment") or {}).items() if not k.startswith("AWS_")}


@contextmanager
def _running(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**server_env(), **(env or {})}, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        stop(proc)


def _until(url: str, proc: subprocess.Popen[bytes], log: Path, **kwargs: Any) -> httpx.Response:
    deadline = time.monotonic() + 60  # synchronisation: the process starting, not a timing test
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            r = httpx.get(url, timeout=5, **kwargs)
            if r.status_code == 200:
                return r
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{url} never answered 200:\n{log.read_text()}"
        time.sleep(0.1)


def test_the_load_benchmark_runs_the_service_in_the_stacks_environment() -> None:
    """benchmarks/scenarios/http_load.py measures the service as the stack runs it."""
    from benchmarks.scenarios.http_load import SERVE_ENV

    env = _own_environment(compose()["services"]["service"])
    assert SERVE_ENV and {k: env.get(k) for k in SERVE_ENV} == SERVE_ENV


def test_the_stacks_service_and_compactor_run_as_written(
    s3_url: str, redis_url: str, redis_prefix: str, tmp_path: Path,
) -> None:
    services = compose()["services"]
    tokens = json.loads((ROOT / "infra" / "tokens.example.json").read_text())
    operator, tenant = tokens["tenants"]["*"][0], tokens["tenants"]["acme"][0]
    http_port, metrics_port = free_port(), free_port()
    swap = {"4437": str(http_port), "9101": str(metrics_port), "0.0.0.0": "127.0.0.1",
            "/run/sessionstore/tokens.json": str(ROOT / "infra" / "tokens.example.json")}
    serve = _as_here(services["service"]["command"], s3_url, redis_url, redis_prefix, swap)
    work = _as_here(services["compactor"]["command"], s3_url, redis_url, redis_prefix, swap)
    base = f"http://127.0.0.1:{http_port}"
    with _running(serve, tmp_path / "service.log", _own_environment(services["service"])) as service, \
            _running(work, tmp_path / "compactor.log", _own_environment(services["compactor"])) as compactor:
        assert b"MALLOC_ARENA_MAX=2" in Path(f"/proc/{service.pid}/environ").read_bytes().split(b"\0")
        ready = _until(base + "/readyz", service, tmp_path / "service.log")
        assert ready.json() == {"objects": "ok", "redis": "ok"}
        auth = {"authorization": f"Bearer {tenant}"}
        assert httpx.put(base + "/v1/stream/acme/c", headers={**auth, "content-type": "text/plain"}).status_code == 201
        assert httpx.post(base + "/v1/stream/acme/c", headers={**auth, "content-type": "text/plain"},
                          content=b"hello").status_code in (200, 204)
        scraped = httpx.get(base + "/metrics", headers={"authorization": f"Bearer {operator}"})
        assert scraped.status_code == 200 and "sessionstore_append_seconds_count" in scraped.text
        worker = _until(f"http://127.0.0.1:{metrics_port}/metrics", compactor, tmp_path / "compactor.log")
        assert "sessionstore_compactor_redis_up 1.0" in worker.text
