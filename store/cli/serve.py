"""``sessionstore serve``: the Durable Streams HTTP service on this store (``store/http/``)."""

from __future__ import annotations

import argparse
import ipaddress
import logging

from store.cli.common import err
from store.cli.ctx import Ctx
from store.errors import InvalidInputError

#: The defaults of the server's guards (store/http/guard.py, store/http/server.py), here so
#: that ``--help`` needs no import of the http extra.
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_IDLE_TIMEOUT_S = 60.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 1000
#: Where serve listens by default, and where its browser viewer is (store/http/viewer.py).
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4437
VIEWER_PATH = "/ui/"


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default %(default)s)")
    p.add_argument("--long-poll-timeout", type=float, default=2.0, metavar="SECONDS",
                   help="how long a long-poll waits at the tail before answering 204 (default %(default)s)")
    p.add_argument("--sse-max", type=float, default=60.0, metavar="SECONDS",
                   help="how long one SSE response stays open; clients reconnect (default %(default)s)")
    p.add_argument("--tokens", metavar="FILE",
                   help='bearer tokens per tenant, JSON {"tenants": {"acme": ["TOKEN", ...]}}, read again '
                        "when it changes (env SESSIONSTORE_TOKENS=acme:TOKEN,..., read once); without "
                        "tokens: loopback only")
    p.add_argument("--rate-limit", type=float, metavar="REQUESTS_PER_S",
                   help="requests a second per tenant, over it 429 (default: none; the tokens file may "
                        "set a tenant's own)")
    p.add_argument("--byte-rate-limit", type=float, metavar="BYTES_PER_S",
                   help="bytes of request bodies a second per tenant, over it 429 (default: none)")
    p.add_argument("--max-followers", type=int, metavar="N",
                   help="live reads (SSE, long-poll) open at once per tenant, more are 429 (default: none)")
    p.add_argument("--access-log", nargs="?", const="-", metavar="FILE",
                   help="one JSON line a request (tenant, route, status, bytes, ms; never a token or "
                        "content) to FILE, or to stderr without one (default: off)")
    p.add_argument("--max-body", type=int, default=12 * 1024 * 1024, metavar="BYTES",
                   help="largest request body, on every route (default %(default)s; more is 413)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web origin (https://app.example) whose pages may call this service "
                        "(repeatable; '*' for any; default: none)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a Host name this service answers to besides localhost, 127.0.0.1 and [::1] "
                        "(repeatable; checked without tokens, and with tokens once one is given)")
    p.add_argument("--header-timeout", type=float, default=DEFAULT_HEADER_TIMEOUT_S, metavar="SECONDS",
                   help="how long a new connection, or a request from its first byte, may take to "
                        "complete its headers (default %(default)s)")
    p.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT_S, metavar="SECONDS",
                   help="how long a keep-alive connection may stay silent after an answer; longer "
                        "than clients keep theirs (default %(default)s)")
    p.add_argument("--body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT_S, metavar="SECONDS",
                   help="how long a request's body may stall before 408 (default %(default)s)")
    p.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS, metavar="N",
                   help="most connections open at once; more are closed (default %(default)s)")


def cmd_serve(args: argparse.Namespace, ctx: Ctx) -> int:
    """Serve every stream of the store over HTTP until interrupted. Processes share nothing
    but the object store and Redis: run as many as you like behind any load balancer."""
    try:
        import uvicorn

        from store.http.app import StreamService
        from store.http.server import ServerLimits, server_config
    except ImportError as exc:  # the http extra is not installed
        raise SystemExit(f"sessionstore serve needs the http extra: pip install 'sessionstore[http]' ({exc})")
    from store.http.auth import ENV_TOKENS, Tokens
    from store.http.limits import TenantLimits

    host = args.host
    for name, value in (("--header-timeout", args.header_timeout), ("--idle-timeout", args.idle_timeout),
                        ("--body-timeout", args.body_timeout),
                        ("--max-connections", args.max_connections), ("--max-body", args.max_body)):
        if not value > 0:
            raise InvalidInputError(f"{name} must be positive, not {value}")
    limits = TenantLimits(requests_per_s=args.rate_limit, bytes_per_s=args.byte_rate_limit,
                          followers=args.max_followers)
    tokens = Tokens.configured(args.tokens)
    if tokens is None:
        if limits.any:
            raise InvalidInputError("--rate-limit, --byte-rate-limit and --max-followers are per tenant: "
                                    f"they need tokens (--tokens FILE or {ENV_TOKENS})")
        if not _loopback(host):
            raise InvalidInputError(
                f"no tokens are configured (--tokens FILE or {ENV_TOKENS}): sessionstore serve "
                f"listens on loopback only, not on {host}"
            )
        err("no tokens configured: listening on loopback only; every local client may read "
            "and write every stream")
    else:
        err(f"{len(tokens.grants)} token(s) configured: each reaches its tenant's streams only"
            + (f" ({args.tokens} is read again when it changes)" if args.tokens else ""))
    service = StreamService(
        ctx.store,
        long_poll_s=args.long_poll_timeout,
        sse_max_s=args.sse_max,
        max_body=args.max_body,
        tokens=None if args.tokens else tokens,
        tokens_file=args.tokens or None,
        limits=limits,
        access_log=args.access_log is not None,
        cors_origins=args.cors_origin,
        allowed_hosts=args.allowed_host,
        body_timeout_s=args.body_timeout,
    )
    limits = ServerLimits(header_timeout_s=args.header_timeout, idle_timeout_s=args.idle_timeout,
                          max_connections=args.max_connections)
    err(f"serving Durable Streams at http://{host}:{args.port}/v1/stream/ and the viewer at "
        f"http://{host}:{args.port}{VIEWER_PATH} (Ctrl-C to stop)")
    logging.basicConfig(level=logging.WARNING)
    if args.access_log is not None:
        _log_access_to(args.access_log)
    uvicorn.Server(server_config(service.app, host=host, port=args.port, limits=limits,
                                 timeout_graceful_shutdown=5)).run()
    return 0


def _log_access_to(where: str) -> None:
    """The access log's lines (``store/http/gate.py``), bare, to the file ``where`` (``-``:
    stderr)."""
    handler = logging.StreamHandler() if where == "-" else logging.FileHandler(where, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(message)s"))
    access = logging.getLogger("sessionstore.access")
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    access.propagate = False


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "VIEWER_PATH", "add_serve_arguments", "cmd_serve"]
