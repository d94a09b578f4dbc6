"""What every subcommand shares: configuration, the store, output, exit codes.

Configuration is read here and only here (entry points read the environment, nothing below
them does). Exit codes are one per class of outcome, so that a script can tell "the session
does not exist" from "Redis is down" without parsing text; ``docs/cli.md`` documents them.
"""

from __future__ import annotations

import enum
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

import orjson

from store.errors import (
    BackendError,
    BackendRefusedError,
    BackendUnavailableError,
    ConditionalWritesUnsupportedError,
    CorruptObjectError,
    EntryNotFoundError,
    IndeterminateError,
    InvalidInputError,
    KeyUnavailableError,
    ObjectExistsError,
    ObjectNotFoundError,
    SessionExistsError,
    SessionNotFoundError,
    SessionStoreError,
    WriteRefusedError,
)
from store.retry import RetryPolicy

#: Where the embedded default keeps its objects and its Redis, relative to the working dir.
DEFAULT_DIR = ".sessionstore"

ENV_OBJECTS = "SESSIONSTORE_OBJECTS_URL"
ENV_REDIS = "SESSIONSTORE_REDIS_URL"
ENV_PREFIX = "SESSIONSTORE_REDIS_PREFIX"
ENV_DEBUG = "SESSIONSTORE_DEBUG"
#: The key provider of encrypted sessions (``store.formats.crypto.key_provider_from_url``).
ENV_KEYS = "SESSIONSTORE_KEYS"


class Exit(enum.IntEnum):
    """Process exit codes, one per class of outcome (documented in docs/cli.md)."""

    OK = 0
    #: The command ran and found faults: verify, doctor, the demo's verification, an import
    #: with refused files, a GC pass with errors.
    FAILED = 1
    #: Bad arguments, a bad URL, malformed input (JSON, entries, ids).
    USAGE = 2
    #: Unknown session, entry or input file.
    NOT_FOUND = 3
    #: A well-formed write the store refused: expected tail mismatch, session exists, id
    #: collision, unknown parent, contention.
    CONFLICT = 4
    #: A backend is down or timed out (Redis, S3, the embedded redis-server).
    UNAVAILABLE = 5
    #: A backend refused permanently: access denied, no such bucket, no conditional writes.
    REFUSED = 6
    #: A write whose outcome is unknown; re-sending the same batch is safe.
    INDETERMINATE = 7
    #: An object in the store is not what the store wrote.
    CORRUPT = 8
    #: A bug in sessionstore (EX_SOFTWARE).
    INTERNAL = 70
    #: stdout was closed under us (``sessionstore export X | head``).
    BROKEN_PIPE = 141
    INTERRUPTED = 130


class CliError(Exception):
    """A failure the CLI reports as one line and an exit code (raised by subcommands)."""

    def __init__(self, message: str, code: Exit) -> None:
        super().__init__(message)
        self.code = code


def classify(exc: BaseException) -> tuple[Exit, str]:
    """The exit code and the one line to print for an exception from the store."""
    msg = str(exc) or type(exc).__name__
    if isinstance(exc, CliError):
        return exc.code, msg
    if isinstance(exc, InvalidInputError):
        return Exit.USAGE, msg
    if isinstance(exc, (SessionNotFoundError, EntryNotFoundError, ObjectNotFoundError)):
        return Exit.NOT_FOUND, msg
    if isinstance(exc, SessionExistsError):
        return Exit.CONFLICT, msg
    if isinstance(exc, WriteRefusedError):
        hint = ""
        if hasattr(exc, "actual_tail_entry_id"):
            hint = "; read the session again and retry, or append without --expect-tail"
        return Exit.CONFLICT, msg + hint
    if isinstance(exc, ObjectExistsError):
        return Exit.CONFLICT, msg
    if isinstance(exc, IndeterminateError):
        return Exit.INDETERMINATE, msg
    if isinstance(exc, KeyUnavailableError):
        return Exit.REFUSED, msg + f"; {ENV_KEYS} names the key provider (docs/encryption.md)"
    if isinstance(exc, CorruptObjectError):
        return Exit.CORRUPT, msg + "; run `sessionstore verify` for a full report"
    if isinstance(exc, (BackendRefusedError, ConditionalWritesUnsupportedError)):
        return Exit.REFUSED, msg
    if isinstance(exc, (BackendUnavailableError, BackendError)):
        return Exit.UNAVAILABLE, msg + "; is the server running? `sessionstore doctor` checks the backends"
    if isinstance(exc, SessionStoreError):
        return Exit.FAILED, msg
    if isinstance(exc, FileNotFoundError):
        return Exit.NOT_FOUND, f"{exc.strerror or 'not found'}: {exc.filename}"
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return Exit.USAGE, f"{exc.strerror or exc}{where}"
    return Exit.INTERNAL, f"internal error: {type(exc).__name__}: {msg} (set {ENV_DEBUG}=1 for a traceback)"


# --- configuration ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Config:
    """Where the store lives, resolved from flags, then the environment, then the default."""

    objects_url: str
    #: None: the embedded Redis beside a file:// store.
    redis_url: str | None
    redis_prefix: str
    allow_unsafe_backend: bool = False

    @property
    def embedded(self) -> bool:
        return self.redis_url is None

    @property
    def local_dir(self) -> Path | None:
        """The directory of a file:// store."""
        parsed = urlparse(self.objects_url)
        if parsed.scheme != "file":
            return None
        from urllib.parse import unquote

        path = unquote(parsed.path)
        if parsed.netloc and parsed.netloc != "localhost":
            path = parsed.netloc + path
        return Path(path)


def objects_url_of(value: str) -> str:
    """Accept a URL or a plain directory path (relative paths are made absolute)."""
    if "://" in value:
        return value
    return Path(value).expanduser().absolute().as_uri()


def resolve_config(
    objects: str | None, redis_url: str | None, prefix: str | None, allow_unsafe: bool = False
) -> Config:
    """The configuration, with both URLs checked: a bad one is a usage error (exit 2) here,
    before anything connects, never an internal error from a client library later."""
    env = os.environ
    obj = objects or env.get(ENV_OBJECTS) or DEFAULT_DIR
    red = redis_url or env.get(ENV_REDIS) or None
    pre = prefix or env.get(ENV_PREFIX) or "ss"
    obj_source = "--objects" if objects else (ENV_OBJECTS if env.get(ENV_OBJECTS) else "--objects")
    red_source = "--redis" if redis_url else ENV_REDIS
    url = objects_url_of(obj)
    check_objects_url(url, obj_source)
    if red is not None:
        check_redis_url(red, red_source)
    return Config(url, red, pre, allow_unsafe)


_REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")


def _bad_url(source: str, url: str, why: str, example: str) -> CliError:
    kind = "Redis" if source in ("--redis", ENV_REDIS) else "object store"
    return CliError(f"bad {kind} URL {url!r} (from {source}): {why}; e.g. {example}", Exit.USAGE)


def check_redis_url(url: str, source: str = "--redis") -> None:
    """Refuse a Redis URL that redis-py would refuse (or silently misread) when connecting."""
    example = "redis://localhost:6379/0"
    try:
        parsed = urlparse(url)
        scheme = parsed.scheme.lower()
        if scheme not in _REDIS_SCHEMES:
            raise _bad_url(source, url, "the scheme must be redis://, rediss://, unix:// or "
                           "redis+cluster://", example)
        if "://" not in url:
            raise _bad_url(source, url, f"it must start with {scheme}://",
                           "unix:///run/redis.sock?db=0" if scheme == "unix" else example)
        if scheme == "unix":
            if not parsed.path:
                raise _bad_url(source, url, "no socket path", "unix:///run/redis.sock?db=0")
        else:
            if not parsed.hostname:
                raise _bad_url(source, url, "no host", example)
            parsed.port  # noqa: B018 - raises ValueError for a port that is not 0-65535
            db = parsed.path.strip("/")
            if db and not db.isdigit():
                raise _bad_url(source, url, f"the database must be a number, not {db!r}", example)
        from urllib.parse import parse_qsl

        for key, value in parse_qsl(parsed.query, keep_blank_values=True):
            if key == "db" and not value.isdigit():
                raise _bad_url(source, url, f"db must be a number, not {value!r}", example)
        # What redis-py itself parses (query options, ports), without the cluster flag.
        from redis.connection import parse_url

        parse_url(_without_cluster_flag(url))
    except CliError:
        raise
    except ValueError as exc:
        raise _bad_url(source, url, str(exc), example) from None


def _without_cluster_flag(url: str) -> str:
    """``url`` as redis-py reads it: the scheme without ``+cluster``, the query without
    ``cluster=``. Rebuilt by hand: ``urlunparse`` writes ``unix:///run/redis.sock`` (no host)
    as ``unix:/run/redis.sock``, which redis-py refuses."""
    from urllib.parse import parse_qsl, urlencode

    scheme, rest = url.split("://", 1)
    rest, _, query = rest.partition("?")
    options = urlencode([(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != "cluster"])
    return f"{scheme.lower().replace('+cluster', '')}://{rest}" + (f"?{options}" if options else "")


def check_objects_url(url: str, source: str = "--objects") -> None:
    """Refuse an object-store URL the store or boto3 would refuse when connecting."""
    example = "s3://bucket/prefix?endpoint=http://localhost:9000, file:///dir or a directory"
    try:
        parsed = urlparse(url)
        scheme = parsed.scheme.lower()
        if scheme == "memory":
            return
        if scheme == "file":
            if not parsed.path and not parsed.netloc:
                raise _bad_url(source, url, "no directory", example)
            if parsed.query:
                raise _bad_url(source, url, "a file:// URL takes no options", example)
            return
        if scheme != "s3":
            raise _bad_url(source, url, "the scheme must be s3:// or file:// (or give a directory)",
                           example)
        from store.backends.objects import parse_s3_url

        config = parse_s3_url(url)
        if config.endpoint_url is not None:
            endpoint = urlparse(config.endpoint_url)
            if endpoint.scheme not in ("http", "https") or not endpoint.hostname:
                raise _bad_url(source, url, f"endpoint {config.endpoint_url!r} is not an http:// or "
                               "https:// URL", example)
            endpoint.port  # noqa: B018 - raises ValueError for a bad port
        if config.region is not None and not re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", config.region):
            raise _bad_url(source, url, f"region {config.region!r} is not a region name", example)
    except CliError:
        raise
    except ValueError as exc:  # InvalidInputError included: parse_s3_url's own refusals
        raise _bad_url(source, url, str(exc), example) from None


def require_existing_store(config: Config, starts: str) -> None:
    """Refuse a local directory that does not exist: opening it would make a new, empty store
    there, so a mistyped or vanished path would read as a store without sessions. Commands
    that start a store (``starts`` names them) create it instead."""
    directory = config.local_dir
    if directory is None or directory.exists():
        return
    raise CliError(f"no store at {directory}: the directory does not exist (mistyped? {starts} "
                   "start a new store there)", Exit.NOT_FOUND)


#: A one-shot command's question to Redis before it starts: a few quick tries (a restart
#: that is already ending), not the store's budget of up to 20 s per call, which is made for
#: long-running processes riding out an outage and would let a command with Redis down take
#: many times that, one wait and one warning per session.
_REDIS_CHECK = RetryPolicy(attempts=3, max_elapsed=1.0, initial_wait=0.05, max_wait=0.5)


def check_redis_answers(url: str) -> None:
    """One PING to Redis (a few quick tries): a clear one-line error (exit 5) at once when it
    does not answer, instead of every call of the command waiting out the retry budget."""
    from coordination.redis import Coordinator

    try:
        coord = Coordinator.from_url(url, prefix="-", retry=_REDIS_CHECK)
    except ValueError:
        return  # a URL redis-py refuses: open_store reports it
    try:
        coord.ping()
    except BackendError as exc:
        raise CliError(f"Redis at {safe_url(url)} does not answer ({exc}); is the server running? "
                       "`sessionstore doctor` checks the backends", Exit.UNAVAILABLE) from None
    finally:
        coord.close()


def safe_url(url: str) -> str:
    """The URL without its password."""
    parsed = urlparse(url)
    if parsed.password:
        return url.replace(f":{parsed.password}@", ":***@", 1)
    return url


def open_store(config: Config, **options: Any) -> Any:
    """A ``SessionStore`` for the configuration (starting the embedded Redis if needed).
    A Redis of its own must answer first (:func:`check_redis_answers`)."""
    from store.core import SessionStore

    if config.redis_url is not None:
        check_redis_answers(config.redis_url)

    options.setdefault("redis_prefix", config.redis_prefix)
    options.setdefault("allow_unsafe_backend", config.allow_unsafe_backend)
    rebuild_age = os.environ.get("SESSIONSTORE_REBUILD_MAX_AGE_MS")
    if rebuild_age and rebuild_age.isdigit():
        options.setdefault("rebuild_max_age_ms", int(rebuild_age))
    keys = os.environ.get(ENV_KEYS)
    if keys and "key_provider" not in options:
        from store.formats.crypto import key_provider_from_url

        options["key_provider"] = key_provider_from_url(keys)
    try:
        return SessionStore.from_url(config.objects_url, config.redis_url, **options)
    except SessionStoreError:
        raise
    except ValueError as exc:
        # A client library refusing a URL that check_*_url let through: still the user's
        # configuration, never an internal error.
        raise CliError(f"bad backend URL ({config.objects_url!r}, {config.redis_url or 'embedded'}): "
                       f"{exc}", Exit.USAGE) from None


def name_the_bucket(text: str, config: Config | None) -> str:
    """``text`` (an error or warning line) with the object keys and request URLs of an S3
    store replaced by its bucket and endpoint: what the user configured, not the store's
    internal objects (``_probe/verdict-...``)."""
    if config is None or urlparse(config.objects_url).scheme != "s3":
        return text
    from store.backends.objects import parse_s3_url

    try:
        s3 = parse_s3_url(config.objects_url)
    except ValueError:
        return text
    where = f"bucket {s3.bucket!r}" + (f" at {s3.endpoint_url}" if s3.endpoint_url else "")
    text = re.sub(r"\(object '[^']*'\)", f"({where})", text)
    text = re.sub(r"\b(for|on) '[^']*'", rf"\1 {where}", text)
    # botocore's "Could not connect to the endpoint URL: "http://host/bucket/key?..."": the endpoint.
    return re.sub(r'"(https?://[^/"]+)/[^"]*"', r'"\1"', text)


# --- output ----------------------------------------------------------------------------------


def dump_json(value: Any, *, pretty: bool = True) -> str:
    opt = orjson.OPT_INDENT_2 if pretty else 0
    return orjson.dumps(value, option=opt | orjson.OPT_NON_STR_KEYS, default=_json_default).decode()


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError


def out(text: str = "", *, stream: IO[str] | None = None) -> None:
    """Print to stdout; the stream is looked up at call time so captured stdout works."""
    (stream or sys.stdout).write(text + "\n")


def err(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def is_tty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def read_jsonl(stream: IO[bytes], source: str) -> Iterator[dict[str, Any]]:
    """JSON objects, one a line; blank lines skipped; a bad line is a usage error."""
    for lineno, raw in enumerate(stream, 1):
        line = raw.strip()
        if not line:
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise CliError(f"{source}, line {lineno}: invalid JSON: {exc}", Exit.USAGE) from None
        if not isinstance(value, dict):
            raise CliError(f"{source}, line {lineno}: not a JSON object", Exit.USAGE)
        yield value


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def iso_of_ms(ms: int | None) -> str | None:
    """Epoch milliseconds as ISO 8601 UTC (``2026-11-22T10:00:00.000Z``), like pi's timestamps."""
    if ms is None:
        return None
    from datetime import datetime, timezone

    when = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def human_age(ms: int | None, now_ms: int) -> str:
    if ms is None:
        return "-"
    s = max(0, (now_ms - ms) // 1000)
    if s < 60:
        return f"{s}s ago"
    if s < 3600:
        return f"{s // 60}m ago"
    if s < 86400:
        return f"{s // 3600}h ago"
    return f"{s // 86400}d ago"


def parse_time_ms(text: str) -> int | None:
    """Epoch milliseconds, or an ISO 8601 time (``2026-11-22T10:00:00Z``; UTC when it names no
    zone); None if ``text`` is neither (the caller raises its own error)."""
    if text.isdigit():
        return int(text)
    from datetime import UTC, datetime

    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return int((when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp() * 1000)
