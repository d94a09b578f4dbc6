"""Bearer tokens bound to tenants: who may touch which streams.

A tenant owns every stream under ``/v1/stream/<tenant>/``; a token of tenant A can neither
read, append to, list, fork from nor follow a stream of tenant B (403), and a request without
a token gets 401. The tenant ``*`` is an operator's: every stream.

Tokens come from a JSON file (``sessionstore serve --tokens FILE``)::

    {"tenants": {"acme": ["<token>", "sha256:<hex of a token's SHA-256>"], "*": ["<admin>"]}}

or from the environment, ``SESSIONSTORE_TOKENS="acme:<token>,beta:<token>"``. Only digests are
kept in memory and compared (in constant time); tokens are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from pathlib import Path

from store.errors import InvalidInputError

ENV_TOKENS = "SESSIONSTORE_TOKENS"
ALL_TENANTS = "*"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


@dataclass(frozen=True, slots=True)
class Tokens:
    """Token digests and the tenant each belongs to."""

    by_digest: tuple[tuple[bytes, str], ...]

    @classmethod
    def parse_env(cls, value: str) -> Tokens:
        pairs: list[tuple[bytes, str]] = []
        for item in value.split(","):
            item = item.strip()
            if not item:
                continue
            tenant, sep, token = item.partition(":")
            if not sep or not tenant or not token:
                raise InvalidInputError(f"{ENV_TOKENS}: each item is tenant:token")
            pairs.append((_digest(token), _check_tenant(tenant)))
        return cls(tuple(pairs))

    @classmethod
    def load(cls, path: str | Path) -> Tokens:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidInputError(f"tokens file {path}: {exc}") from None
        tenants = data.get("tenants") if isinstance(data, dict) else None
        if not isinstance(tenants, dict):
            raise InvalidInputError(f'tokens file {path}: expected {{"tenants": {{"name": ["token", ...]}}}}')
        pairs: list[tuple[bytes, str]] = []
        for tenant, tokens in tenants.items():
            if not isinstance(tokens, list) or not all(isinstance(t, str) and t for t in tokens):
                raise InvalidInputError(f"tokens file {path}: tenant {tenant!r} needs a list of tokens")
            for token in tokens:
                if token.startswith("sha256:"):
                    try:
                        digest = bytes.fromhex(token[7:])
                    except ValueError:
                        digest = b""
                    if len(digest) != 32:
                        raise InvalidInputError(f"tokens file {path}: a bad sha256: digest")
                else:
                    digest = _digest(token)
                pairs.append((digest, _check_tenant(tenant)))
        return cls(tuple(pairs))

    @classmethod
    def configured(cls, path: str | None) -> Tokens | None:
        """The tokens of ``path``, else of the environment, else None (no tokens)."""
        if path:
            return cls.load(path)
        env = os.environ.get(ENV_TOKENS, "").strip()
        return cls.parse_env(env) if env else None

    def tenant_of(self, authorization: str | None) -> str | None:
        """The tenant of an ``Authorization: Bearer`` header, or None if it names none."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        digest = _digest(token.strip())
        found = None
        for known, tenant in self.by_digest:
            if hmac.compare_digest(known, digest):
                found = tenant
        return found


def may_access(tenant: str, stream_name: str) -> bool:
    """May ``tenant`` touch the stream named ``stream_name`` (the path after /v1/stream/)?"""
    return tenant == ALL_TENANTS or stream_name.startswith(tenant + "/")


def _check_tenant(tenant: str) -> str:
    if tenant != ALL_TENANTS and (not tenant or "/" in tenant or tenant in (".", "..")):
        raise InvalidInputError(f"tenant {tenant!r}: a name without '/'")
    return tenant


__all__ = ["ALL_TENANTS", "ENV_TOKENS", "Tokens", "may_access"]
