"""``sessionstore serve`` as a real process of its own, for tests over real HTTP:

    with serve(["--objects", s3_url, "--redis", redis_url], tmp_path / "serve.log", cwd=tmp_path) as server:
        httpx.get(server.url + "/healthz")
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
#: The suite waits at most 5 s per test (vitest's default): long-polls answer well before.
LONG_POLL_TIMEOUT_S = 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "store.cli", *args]


def server_env() -> dict[str, str]:
    """The test's environment (AWS test credentials, PATH), minus the store's own settings: the
    command line says which store, and no tokens means loopback only, no auth."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONSTORE_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


@dataclass
class ServeProcess:
    """One ``sessionstore serve`` process; its stderr goes to ``log_path``."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log(self, limit: int = 20_000) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text if len(text) <= limit else "...\n" + text[-limit:]


@contextmanager
def serve(store_args: Sequence[str], log_path: Path, *, cwd: Path, serve_args: Sequence[str] = (),
          env: dict[str, str] | None = None) -> Iterator[ServeProcess]:
    """``sessionstore STORE_ARGS serve SERVE_ARGS`` on a free loopback port (``env`` over the
    test's environment), up once ``/healthz`` says 200; terminated (then killed) on exit."""
    for attempt in range(3):
        port = free_port()
        command = cli(*store_args, "serve", "--host", "127.0.0.1", "--port", str(port),
                       "--long-poll-timeout", str(LONG_POLL_TIMEOUT_S), *serve_args)
        with open(log_path, "wb") as log:
            process = subprocess.Popen(command, cwd=cwd, env={**server_env(), **(env or {})},
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        server = ServeProcess(process, f"http://127.0.0.1:{port}", log_path)
        try:
            if _wait_healthy(server, last_attempt=attempt == 2):
                yield server
                return
        finally:
            stop(process)


def stop(process: subprocess.Popen[bytes]) -> None:
    """Terminate ``process``, then kill it if it has not ended within 10 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _wait_healthy(server: ServeProcess, *, last_attempt: bool, timeout: float = 60.0) -> bool:
    """True once ``/healthz`` answers 200; False if the port was taken meanwhile (try another,
    unless ``last_attempt``); fails the test otherwise."""
    deadline = time.monotonic() + timeout
    last: str = "no answer yet"
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            if "address already in use" in server.log().lower() and not last_attempt:
                return False
            pytest.fail(f"sessionstore serve exited with {server.process.returncode} while starting:\n"
                        f"{server.log()}", pytrace=False)
        try:
            response = httpx.get(f"{server.url}/healthz", timeout=2)
            if response.status_code == 200:
                return True
            last = f"{response.status_code} {response.text[:200]}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.1)
    pytest.fail(f"sessionstore serve at {server.url} not healthy after {timeout}s ({last}):\n{server.log()}",
                pytrace=False)


__all__ = ["ServeProcess", "cli", "free_port", "serve", "server_env", "stop"]
