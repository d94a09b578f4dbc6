"""Bearer tokens bound to tenants, each with a scope and optionally a name prefix.

A tenant owns every stream and session named ``<tenant>/...``; a token of tenant A can
neither read, append to, list, fork from nor follow a stream of tenant B (403), and a request
without a known token gets 401. The tenant ``*`` is an operator's: every name.

A token grants (:class:`Grant`) its tenant, a scope and a prefix:

| scope | may |
| --- | --- |
| ``read`` | read, follow, list, export |
| ``write`` (the default) | everything a tenant may: read, append, create, fork, redact, import, delete |

With a ``prefix`` (a name prefix within the tenant, ``acme/bots/``), a token sees and touches
only the names that start with it (a listing shows only those), and cannot use the Claude
routes, whose keys are not names. Which action each route needs is ``store/http/access.py``.

Tokens come from a JSON file (``sessionstore serve --tokens FILE``)::

    {"tenants": {"acme": ["<token>", "sha256:<hex of a token's SHA-256>",
                          {"token": "<token>", "scope": "read", "prefix": "acme/bots/"},
                          {"sha256": "<hex>", "scope": "write"}],
                 "*": ["<operator token>"]},
     "limits": {"acme": {"requests_per_s": 20, "bytes_per_s": 1048576, "followers": 10}}}

(``limits``: ``store/http/limits.py``), which :class:`TokenFile` re-reads when it changes, or
from the environment, ``SESSIONSTORE_TOKENS="acme:<token>,beta:<token>"`` (full access, read
once at start). Only digests are kept in memory and compared (in constant time); tokens are
never logged.

A configuration that could not mean what it says is refused (:class:`InvalidInputError`): a
token shorter than :data:`MIN_TOKEN_CHARS`, a token or a tenant name with surrounding
whitespace (in the environment, whitespace around an item is dropped, never inside it), a
malformed entry, an unknown key or scope, a prefix outside its tenant, limits of a tenant
that has no token, and one token (or digest) under two tenants or twice. At start that stops
the service; a file changed under a running service that is refused leaves the tokens in
force (:class:`TokenFile`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store.errors import InvalidInputError
from store.http.limits import LimitOverrides, parse_overrides

log = logging.getLogger("sessionstore.http")

ENV_TOKENS = "SESSIONSTORE_TOKENS"
ALL_TENANTS = "*"
#: The shortest token accepted: a guessable token is no boundary between tenants.
MIN_TOKEN_CHARS = 16
READ, WRITE = "read", "write"
SCOPES = (READ, WRITE)
_ITEM_KEYS = frozenset({"token", "sha256", "scope", "prefix"})
_FILE_KEYS = frozenset({"tenants", "limits"})


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


@dataclass(frozen=True, slots=True)
class Grant:
    """What one token may do."""

    #: The tenant the token belongs to (``*``: the operator's).
    tenant: str
    #: ``read`` or ``write``.
    scope: str = WRITE
    #: The names it reaches start with this (None: every name of its tenant).
    prefix: str | None = None

    def may_access(self, name: str) -> bool:
        """May this token see or touch the stream or session ``name``?"""
        if self.prefix is not None:
            return name.startswith(self.prefix)
        return may_access(self.tenant, name)

    @property
    def sees_all(self) -> bool:
        """Does it reach every name of the store (the operator's, without a prefix)?"""
        return self.tenant == ALL_TENANTS and self.prefix is None


@dataclass(frozen=True, slots=True)
class Tokens:
    """Token digests, what each grants, and the limits the file sets per tenant."""

    grants: tuple[tuple[bytes, Grant], ...]
    #: Per-tenant limits of the file (over ``serve``'s defaults, key by key).
    limits: Mapping[str, LimitOverrides] = field(default_factory=dict)

    @classmethod
    def parse_env(cls, value: str) -> Tokens:
        pairs: list[tuple[bytes, Grant]] = []
        for n, item in enumerate(value.split(","), 1):
            item = item.strip()
            if not item:
                continue
            tenant, sep, token = item.partition(":")
            if not sep or not tenant or not token:
                raise InvalidInputError(f"{ENV_TOKENS}: item {n} is not tenant:token")
            where = f"{ENV_TOKENS}: item {n}"
            pairs.append((_digest(_check_token(token, where)), Grant(_check_tenant(tenant, where))))
        return cls.of(pairs, ENV_TOKENS)

    @classmethod
    def load(cls, path: str | Path) -> Tokens:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidInputError(f"tokens file {path}: {exc}") from None
        return cls.parse_file(text, f"tokens file {path}")

    @classmethod
    def parse_file(cls, text: str, where: str) -> Tokens:
        """The tokens of a file's text (``where`` names it in errors)."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InvalidInputError(f"{where}: {exc}") from None
        tenants = data.get("tenants") if isinstance(data, dict) else None
        if not isinstance(tenants, dict):
            raise InvalidInputError(f'{where}: expected {{"tenants": {{"name": ["token", ...]}}}}')
        unknown = sorted(set(data) - _FILE_KEYS)
        if unknown:
            raise InvalidInputError(f"{where}: unknown key {unknown[0]!r} (known: tenants, limits)")
        pairs: list[tuple[bytes, Grant]] = []
        for tenant, items in tenants.items():
            at = f"{where}: tenant {tenant!r}"
            _check_tenant(tenant, at)
            if not isinstance(items, list) or not items:
                raise InvalidInputError(f"{at} needs a list of tokens")
            for item in items:
                pairs.append(_parse_item(item, tenant, at))
        limits = data.get("limits", {})
        if not isinstance(limits, dict):
            raise InvalidInputError(f'{where}: limits is {{"tenant": {{"requests_per_s": ...}}}}')
        overrides: dict[str, LimitOverrides] = {}
        for tenant, value in limits.items():
            at = f"{where}: limits of {tenant!r}"
            if tenant not in tenants:
                raise InvalidInputError(f"{at}: no such tenant among the tokens")
            overrides[tenant] = parse_overrides(value, at)
        return cls.of(pairs, where, overrides)

    @classmethod
    def of(cls, pairs: list[tuple[bytes, Grant]], where: str,
           limits: Mapping[str, LimitOverrides] | None = None) -> Tokens:
        """The tokens of ``pairs``, none of them under two tenants (nor twice under one)."""
        seen: dict[bytes, str] = {}
        for digest, grant in pairs:
            if digest in seen:
                other = seen[digest]
                also = "twice" if other == grant.tenant else f"under tenants {other!r} and {grant.tenant!r}"
                raise InvalidInputError(f"{where}: one token is listed {also}")
            seen[digest] = grant.tenant
        return cls(tuple(pairs), dict(limits or {}))

    @classmethod
    def configured(cls, path: str | None) -> Tokens | None:
        """The tokens of ``path``, else of the environment, else None (no tokens)."""
        if path:
            return cls.load(path)
        env = os.environ.get(ENV_TOKENS, "").strip()
        return cls.parse_env(env) if env else None

    def grant_of(self, authorization: str | None) -> Grant | None:
        """What the token of an ``Authorization: Bearer`` header grants, or None if it is
        no token of these."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        digest = _digest(token.strip())
        found = None
        for known, grant in self.grants:
            if hmac.compare_digest(known, digest):
                found = grant
        return found

    def tenant_of(self, authorization: str | None) -> str | None:
        """The tenant of an ``Authorization: Bearer`` header, or None if it names none."""
        grant = self.grant_of(authorization)
        return None if grant is None else grant.tenant


class TokenFile:
    """A tokens file, re-read when it changes: :meth:`poll` (the service calls it on every
    request) compares the file's identity (inode, size, modification and change times) with
    the one it last read, and reads it again when they differ.

    The identity is taken *before* the file is read, so a change made while it is read is
    seen at the next poll. A file that is refused (unreadable, not JSON, any check of
    :class:`Tokens`) leaves :attr:`tokens` as they were and is logged once, as one line
    naming the file and the problem; it is tried again when it changes again. A removed file
    is refused alike (the tokens in force stay)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._seen = self._identity()
        #: The tokens in force (an :class:`InvalidInputError` here stops the service).
        self.tokens = Tokens.load(self.path)

    def _identity(self) -> tuple[int, ...] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def poll(self) -> bool:
        """Read the file again if it changed; True if new tokens are in force."""
        seen = self._identity()
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            tokens = Tokens.load(self.path)
        except InvalidInputError as exc:
            log.error("%s; the tokens in force stay until the file changes again", exc)
            return False
        self.tokens = tokens
        log.info("tokens file %s read again: %d token(s)", self.path, len(tokens.grants))
        return True


def may_access(tenant: str, stream_name: str) -> bool:
    """May ``tenant`` touch the stream named ``stream_name`` (the path after /v1/stream/)?"""
    return tenant == ALL_TENANTS or stream_name.startswith(tenant + "/")


def _parse_item(item: Any, tenant: str, where: str) -> tuple[bytes, Grant]:
    """One token of a tenant's list: a string (full access) or an object."""
    if isinstance(item, str):
        return _digest_of(item, None, where), Grant(tenant)
    if not isinstance(item, dict):
        raise InvalidInputError(f"{where}: a token is a string or an object, not {type(item).__name__}")
    unknown = sorted(set(item) - _ITEM_KEYS)
    if unknown:
        known = ", ".join(sorted(_ITEM_KEYS))
        raise InvalidInputError(f"{where}: unknown key {unknown[0]!r} of a token (known: {known})")
    if ("token" in item) == ("sha256" in item):
        raise InvalidInputError(f'{where}: a token object has either "token" or "sha256"')
    if "token" in item:
        if not isinstance(item["token"], str):
            raise InvalidInputError(f"{where}: a token is a string")
        digest = _digest_of(item["token"], None, where)
    else:
        digest = _digest_of(None, item["sha256"], where)
    scope = item.get("scope", WRITE)
    if scope not in SCOPES:
        raise InvalidInputError(f"{where}: unknown scope {scope!r} (read or write)")
    prefix = item.get("prefix")
    if prefix is not None:
        inside = tenant == ALL_TENANTS or (isinstance(prefix, str) and prefix.startswith(tenant + "/"))
        if not isinstance(prefix, str) or not prefix or prefix != prefix.strip() or not inside:
            raise InvalidInputError(f"{where}: prefix {prefix!r} is not a name prefix within the tenant "
                                    f"(one that starts with {tenant + '/'!r})")
    return digest, Grant(tenant, scope, prefix)


def _digest_of(token: str | None, sha256: Any, where: str) -> bytes:
    if token is not None and not token.startswith("sha256:"):
        return _digest(_check_token(token, where))
    hexdigest = token[7:] if token is not None else sha256
    try:
        digest = bytes.fromhex(hexdigest) if isinstance(hexdigest, str) else b""
    except ValueError:
        digest = b""
    if len(digest) != 32:
        raise InvalidInputError(f"{where}: a bad sha256 digest (64 hex digits)")
    return digest


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


__all__ = ["ALL_TENANTS", "ENV_TOKENS", "MIN_TOKEN_CHARS", "READ", "SCOPES", "WRITE", "Grant", "TokenFile",
           "Tokens", "may_access"]
