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
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 1000


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=4437, help="port (default %(default)s)")
    p.add_argument("--long-poll-timeout", type=float, default=2.0, metavar="SECONDS",
                   help="how long a long-poll waits at the tail before answering 204 (default %(default)s)")
    p.add_argument("--sse-max", type=float, default=60.0, metavar="SECONDS",
                   help="how long one SSE response stays open; clients reconnect (default %(default)s)")
    p.add_argument("--tokens", metavar="FILE",
                   help='bearer tokens per tenant, JSON {"tenants": {"acme": ["TOKEN", ...]}} '
                        "(env SESSIONSTORE_TOKENS=acme:TOKEN,...); without tokens: loopback only")
    p.add_argument("--max-body", type=int, default=12 * 1024 * 1024, metavar="BYTES",
                   help="largest request body, on every route (default %(default)s; more is 413)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web origin (https://app.example) whose pages may call this service "
                        "(repeatable; '*' for any; default: none)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a Host name this service answers to besides localhost, 127.0.0.1 and [::1] "
                        "(repeatable; checked without tokens, and with tokens once one is given)")
    p.add_argument("--header-timeout", type=float, default=DEFAULT_HEADER_TIMEOUT_S, metavar="SECONDS",
                   help="how long a connection may go without a complete request's headers "
                        "(default %(default)s)")
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

    host = args.host
    for name, value in (("--header-timeout", args.header_timeout), ("--body-timeout", args.body_timeout),
                        ("--max-connections", args.max_connections), ("--max-body", args.max_body)):
        if not value > 0:
            raise InvalidInputError(f"{name} must be positive, not {value}")
    tokens = Tokens.configured(args.tokens)
    if tokens is None:
        if not _loopback(host):
            raise InvalidInputError(
                f"no tokens are configured (--tokens FILE or {ENV_TOKENS}): sessionstore serve "
                f"listens on loopback only, not on {host}"
            )
        err("no tokens configured: listening on loopback only; every local client may read "
            "and write every stream")
    else:
        err(f"{len(tokens.by_digest)} token(s) configured: each reaches its tenant's streams only")
    service = StreamService(
        ctx.store,
        long_poll_s=args.long_poll_timeout,
        sse_max_s=args.sse_max,
        max_body=args.max_body,
        tokens=tokens,
        cors_origins=args.cors_origin,
        allowed_hosts=args.allowed_host,
        body_timeout_s=args.body_timeout,
    )
    limits = ServerLimits(header_timeout_s=args.header_timeout, max_connections=args.max_connections)
    err(f"serving Durable Streams at http://{host}:{args.port}/v1/stream/ (Ctrl-C to stop)")
    logging.basicConfig(level=logging.WARNING)
    uvicorn.Server(server_config(service.app, host=host, port=args.port, limits=limits,
                                 timeout_graceful_shutdown=5)).run()
    return 0


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = ["add_serve_arguments", "cmd_serve"]
