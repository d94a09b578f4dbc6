"""``sessionstore serve``: the Durable Streams HTTP service on this store (``store/http/``)."""

from __future__ import annotations

import argparse
import ipaddress
import logging

from store.cli.common import err
from store.cli.ctx import Ctx
from store.errors import InvalidInputError


def cmd_serve(args: argparse.Namespace, ctx: Ctx) -> int:
    """Serve every stream of the store over HTTP until interrupted. Processes share nothing
    but the object store and Redis: run as many as you like behind any load balancer."""
    try:
        import uvicorn

        from store.http.app import StreamService
    except ImportError as exc:  # the http extra is not installed
        raise SystemExit(f"sessionstore serve needs the http extra: pip install 'sessionstore[http]' ({exc})")
    from store.http.auth import ENV_TOKENS, Tokens

    host = args.host
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
    )
    err(f"serving Durable Streams at http://{host}:{args.port}/v1/stream/ (Ctrl-C to stop)")
    logging.basicConfig(level=logging.WARNING)
    uvicorn.run(
        service.app,
        host=host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    return 0


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = ["cmd_serve"]
