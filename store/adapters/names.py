"""Which store session holds a framework's object: one function for every adapter.

A framework names its sessions with strings of its own (any characters, several parts);
the store's ids are ``[A-Za-z0-9._-]``, at most 128 characters. :func:`session_id_for` maps
a framework's names (in a namespace) to the store session that holds them, the same in
every process. Each adapter's scheme is fixed by the data already stored under it: a
changed digest would leave that data under ids nobody computes any more, so the schemes
below are kept byte for byte (``tests/test_adapter_names.py`` pins them).

| adapter | names | store session id |
| --- | --- | --- |
| ``openai-agents`` | ``(session_id,)`` | the id itself when it is a valid store id, else ``oai-`` + 40 hex of SHA-256(UTF-8 id) |
| ``strands`` | ``(session_id,)`` | the id itself (Strands' ids must be valid store ids) |
| ``google-adk`` | ``(kind, app_name[, user_id[, session_id]])`` | ``<namespace>-<kind>-`` + 40 hex of SHA-256(JSON ``[kind, *names]``) |
| ``claude-agent-sdk`` | ``(project_key[, session_id[, subpath]])`` | ``cc.<P>[.<S>[.<U>]]``: ``P`` 10-byte blake2b of ``namespace NUL project_key`` (of ``project_key`` alone without a namespace), ``S`` the session id when it is a token of at most 64 characters else ``_`` + 12-byte blake2b, ``U`` 10-byte blake2b of the subpath |
| ``langgraph`` | ``("thread", thread_id)`` or ``("runs",)`` | ``lg.<kind>.`` + 16-byte blake2b of JSON ``[namespace, kind, *names]`` |

The digests are not secrets: whoever knows a framework's names can compute the id (the
store's keyed stream ids are for streams only: ``store.formats.layout.stream_session_id``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable

from store.errors import InvalidInputError
from store.formats.layout import check_session_id

__all__ = ["ADAPTERS", "digest", "session_id_for"]

_CLAUDE_SAFE_SID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def digest(text: str, *, scheme: str, size: int = 10) -> str:
    """The hex digest an adapter names things by: ``"sha256-40"`` (the first 40 hex digits of
    SHA-256) or ``"blake2b"`` (``size`` bytes)."""
    data = text.encode("utf-8", "surrogatepass")
    if scheme == "sha256-40":
        return hashlib.sha256(data).hexdigest()[:40]
    if scheme == "blake2b":
        return hashlib.blake2b(data, digest_size=size).hexdigest()
    raise InvalidInputError(f"unknown digest scheme {scheme!r}")


def _nonempty(what: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{what} must be a non-empty string")
    return value


def _openai(namespace: str, names: tuple[str, ...]) -> str:
    (session_id,) = names
    _nonempty("session_id", session_id)
    try:
        return check_session_id(session_id)
    except InvalidInputError:
        return "oai-" + digest(session_id, scheme="sha256-40")


def _strands(namespace: str, names: tuple[str, ...]) -> str:
    (session_id,) = names
    return check_session_id(session_id)


def _adk(namespace: str, names: tuple[str, ...]) -> str:
    kind, *rest = names
    for name in rest:
        if not isinstance(name, str):
            raise InvalidInputError(f"ADK names must be strings, not {type(name).__name__}")
    # json.dumps with its defaults (ASCII escapes): what every stored ADK id was made with.
    return f"{namespace}-{kind}-" + digest(json.dumps([kind, *rest]), scheme="sha256-40")


def _claude(namespace: str, names: tuple[str, ...]) -> str:
    project_key = _nonempty("project_key", names[0])
    name = "cc." + digest(f"{namespace}\x00{project_key}" if namespace else project_key, scheme="blake2b")
    if len(names) > 1:
        sid = _nonempty("session_id", names[1])
        name += "." + (sid if _CLAUDE_SAFE_SID.fullmatch(sid) else "_" + digest(sid, scheme="blake2b", size=12))
    if len(names) > 2 and names[2] is not None:
        subpath = names[2]
        if not isinstance(subpath, str) or not subpath:
            raise InvalidInputError("subpath must be a non-empty string (omit it for the main transcript)")
        name += "." + digest(subpath, scheme="blake2b")
    return check_session_id(name)


_LANGGRAPH_KINDS = {"thread": 1, "runs": 0}


def _langgraph(namespace: str, names: tuple[str, ...]) -> str:
    kind, *rest = names
    if _LANGGRAPH_KINDS.get(kind) != len(rest):
        raise InvalidInputError(f"langgraph names are ('thread', thread_id) or ('runs',), not {names!r}")
    for name in rest:
        _nonempty("thread_id", name)
    # ensure_ascii (json's default): the same bytes whatever the names' characters
    return f"lg.{kind}." + digest(json.dumps([namespace, kind, *rest]), scheme="blake2b", size=16)


#: Each adapter's scheme (the table in the module's docstring).
ADAPTERS: dict[str, Callable[[str, tuple[str, ...]], str]] = {
    "openai-agents": _openai,
    "strands": _strands,
    "google-adk": _adk,
    "claude-agent-sdk": _claude,
    "langgraph": _langgraph,
}


def session_id_for(adapter: str, *names: str, namespace: str = "") -> str:
    """The store session id that ``adapter`` keeps the object named ``names`` in, within
    ``namespace`` (see the module's table). ``InvalidInputError`` for names the adapter
    cannot map, or an unknown adapter."""
    scheme = ADAPTERS.get(adapter)
    if scheme is None:
        raise InvalidInputError(f"unknown adapter {adapter!r} (one of {sorted(ADAPTERS)})")
    if not names:
        raise InvalidInputError("session_id_for needs at least one name")
    if not isinstance(namespace, str):
        raise InvalidInputError("namespace must be a string")
    try:
        return scheme(namespace, names)
    except InvalidInputError:
        raise
    except ValueError as exc:  # a wrong number of names for the adapter
        raise InvalidInputError(f"{adapter}: {exc}") from None
