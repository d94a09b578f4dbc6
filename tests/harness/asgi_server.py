"""An ASGI app served by uvicorn on a free loopback port, in a thread of the test process.

    with AsgiServer(app) as server:
        httpx.get(server.url + "/healthz")

Real HTTP over a real socket (the tests' clients cannot tell it from a separate process); the
app's lifespan runs, so its start-up and shutdown are exercised too.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn


class AsgiServer:
    def __init__(self, app: Any, host: str = "127.0.0.1") -> None:
        sock = socket.socket()
        sock.bind((host, 0))
        self.port = sock.getsockname()[1]
        sock.close()
        self.host = host
        config = uvicorn.Config(
            app, host=host, port=self.port, log_level="warning", access_log=False,
            lifespan="on", timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"asgi-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        asyncio.run(self._server.serve())

    def start(self) -> AsgiServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on port {self.port}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)

    def __enter__(self) -> AsgiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["AsgiServer"]
