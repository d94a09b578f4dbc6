"""Bearer tokens bound to tenants: who may touch which streams.

A tenant owns every stream under ``/v1/stream/<tenant>/``; a token of tenant A can neither
read, append to, list, fork from nor follow a stream of tenant B (403), and a request without
a token gets 401. The tenant ``*`` is an operator's: every stream.

Tokens come from a JSON file (``sessionstore serve --tokens FILE``)::

    {"tenants": {"acme": ["<token>", "sha256:<hex of a token's SHA-256>"], "*": ["<admin>"]}}

or from the environment, ``SESSIONSTORE_TOKENS="acme:<token>,beta:<token>"``. Only digests are
kept in memory and compared (in constant time); tokens are never logged.

A configuration that could not mean what it says is refused at start
(:class:`InvalidInputError`): a token shorter than :data:`MIN_TOKEN_CHARS`, a token or a tenant
name with surrounding whitespace (in the environment, whitespace around an item is dropped,
never inside it), a malformed entry, and one token (or digest) under two tenants.
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
#: The shortest token accepted: a guessable token is no boundary between tenants.
MIN_TOKEN_CHARS = 16


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


@dataclass(frozen=True, slots=True)
class Tokens:
    """Token digests and the tenant each belongs to."""

    by_digest: tuple[tuple[bytes, str], ...]

    @classmethod
    def parse_env(cls, value: str) -> Tokens:
        pairs: list[tuple[bytes, str]] = []
        for n, item in enumerate(value.split(","), 1):
            item = item.strip()
            if not item:
                continue
            tenant, sep, token = item.partition(":")
            if not sep or not tenant or not token:
                raise InvalidInputError(f"{ENV_TOKENS}: item {n} is not tenant:token")
            where = f"{ENV_TOKENS}: item {n}"
            pairs.append((_digest(_check_token(token, where)), _check_tenant(tenant, where)))
        return cls.of(pairs, ENV_TOKENS)

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
            where = f"tokens file {path}: tenant {tenant!r}"
            _check_tenant(tenant, where)
            if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
                raise InvalidInputError(f"{where} needs a list of tokens")
            for token in tokens:
                if token.startswith("sha256:"):
                    try:
                        digest = bytes.fromhex(token[7:])
                    except ValueError:
                        digest = b""
                    if len(digest) != 32:
                        raise InvalidInputError(f"tokens file {path}: a bad sha256: digest")
                else:
                    digest = _digest(_check_token(token, where))
                pairs.append((digest, tenant))
        return cls.of(pairs, f"tokens file {path}")

    @classmethod
    def of(cls, pairs: list[tuple[bytes, str]], where: str) -> Tokens:
        """The tokens of ``pairs``, none of them under two tenants (nor twice under one)."""
        seen: dict[bytes, str] = {}
        for digest, tenant in pairs:
            if digest in seen:
                other = seen[digest]
                also = "twice" if other == tenant else f"under tenants {other!r} and {tenant!r}"
                raise InvalidInputError(f"{where}: one token is listed {also}")
            seen[digest] = tenant
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


def _check_tenant(tenant: str, where: str) -> str:
    if tenant == ALL_TENANTS:
        return tenant
    if not tenant or "/" in tenant or tenant in (".", "..") or tenant != tenant.strip():
        raise InvalidInputError(f"{where}: tenant {tenant!r} is not a name (no '/', no surrounding spaces)")
    return tenant


def _check_token(token: str, where: str) -> str:
    if token != token.strip():
        raise InvalidInputError(f"{where}: a token has surrounding whitespace (it could never match)")
    if len(token) < MIN_TOKEN_CHARS:
        raise InvalidInputError(f"{where}: a token is shorter than {MIN_TOKEN_CHARS} characters")
    return token


__all__ = ["ALL_TENANTS", "ENV_TOKENS", "MIN_TOKEN_CHARS", "Tokens", "may_access"]
