"""Where a demo runs (a new temporary directory, ``--dir``, or a namespace of its own on the
given backends) and how it cleans up after itself."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse, urlunparse

from store.cli.common import ENV_OBJECTS, ENV_REDIS, CliError, Exit, err, objects_url_of
from store.cli.serve import DEFAULT_HOST, DEFAULT_PORT, VIEWER_PATH

if TYPE_CHECKING:
    from store.cli.ctx import Ctx
    from store.core import SessionStore


@dataclass
class Location:
    objects_url: str
    redis_url: str | None
    redis_prefix: str
    description: str
    #: Directories to remove at the end (unless --keep).
    remove_dirs: list[Path] = field(default_factory=list)
    #: The embedded redis-server to stop at the end (unless --keep).
    embedded_dir: Path | None = None
    #: External backends: delete the run's objects and keys at the end (unless --keep).
    external: bool = False

    @property
    def removes_data(self) -> bool:
        """Whether the end of the run (without --keep) removes what it wrote."""
        return bool(self.remove_dirs) or self.external


def run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def choose_location(args: argparse.Namespace, ctx: Ctx, run: str) -> Location:
    user_objects = getattr(args, "objects", None) or os.environ.get(ENV_OBJECTS)
    user_redis = getattr(args, "redis", None) or os.environ.get(ENV_REDIS)
    prefix = ctx.config.redis_prefix
    if args.dir:
        directory = Path(args.dir).expanduser().absolute()
        if directory.exists() and any(p for p in directory.iterdir() if p.name != ".redis"):
            raise CliError(f"{directory} is not empty: the demo needs a directory of its own", Exit.USAGE)
        directory.mkdir(parents=True, exist_ok=True)
        return Location(directory.as_uri(), None, prefix, f"embedded store in {directory}",
                        embedded_dir=directory / ".redis")
    if not user_objects and not user_redis:
        directory = Path(tempfile.mkdtemp(prefix="sessionstore-demo-"))
        return Location(directory.as_uri(), None, prefix, f"embedded store in {directory}",
                        remove_dirs=[directory], embedded_dir=directory / ".redis")
    # Explicit backends: a namespace of the run's own, so that repeated demos never mix.
    base = objects_url_of(user_objects or ctx.config.objects_url)
    parsed = urlparse(base)
    redis_prefix = f"{prefix}-demo-{run}"
    if parsed.scheme == "s3":
        path = "/".join(p for p in (parsed.path.strip("/"), f"demo-{run}") if p)
        url = urlunparse(parsed._replace(path="/" + path))
        return Location(url, user_redis, redis_prefix, f"{url} and {user_redis or 'the embedded Redis'}",
                        external=True)
    if parsed.scheme == "file":
        directory = Path(ctx.config.local_dir or ".") / f"demo-{run}"
        directory.mkdir(parents=True, exist_ok=True)
        return Location(directory.as_uri(), user_redis, redis_prefix,
                        f"{directory} and {user_redis or 'its embedded Redis'}",
                        remove_dirs=[directory], embedded_dir=None if user_redis else directory / ".redis",
                        external=bool(user_redis))
    raise CliError(f"the demo runs on s3:// or file:// stores, not {base!r}", Exit.USAGE)


def cleanup_external(store: SessionStore, loc: Location) -> None:
    """Remove the run's objects and Redis keys from shared backends."""
    try:
        keys = [i.key for i in store.objects.list(store.layout.prefix)] if store.layout.prefix else []
        if keys:
            store.objects.delete_many(keys)
        store.coord.purge()
    except Exception as exc:  # cleanup must not turn a passed demo into a failure
        err(f"sessionstore demo: could not remove the run's data ({exc})")


def stop_embedded(loc: Location) -> None:
    if loc.embedded_dir is not None:
        from store.backends.embedded import EmbeddedRedis

        try:
            EmbeddedRedis(loc.embedded_dir).stop()
        except Exception as exc:
            err(f"sessionstore demo: could not stop the embedded redis-server ({exc})")


def cleanup_local(loc: Location, log_dir: Path, *, keep: bool) -> None:
    if keep:
        say_kept(loc, log_dir)
        return
    stop_embedded(loc)
    for d in loc.remove_dirs:
        shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(log_dir, ignore_errors=True)
    say_removed(loc)


#: Where ``sessionstore serve`` shows its viewer by default.
VIEWER_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}{VIEWER_PATH}"


def say_kept(loc: Location, log_dir: Path) -> None:
    """Where the kept data is, and how to look at it."""
    where = _objects_arg(loc)
    redis = f" --redis '{loc.redis_url}'" if loc.redis_url else ""
    prefix = f" --redis-prefix {loc.redis_prefix}" if loc.external else ""
    err(f"kept the demo's data: {loc.description}; look at it with `sessionstore --objects {where}{redis}{prefix} ls`")
    err(f"see it in a browser: `sessionstore --objects {where}{redis}{prefix} serve`, then open "
        f"{VIEWER_URL} (its sessions, their trees and what the model saw, live)")
    if loc.embedded_dir is not None:
        err(f"its embedded redis-server keeps running: `sessionstore --objects {where} embedded stop` stops it")
    err(f"kept the demo's logs in {log_dir}")


def say_removed(loc: Location) -> None:
    """What the end of the run removed, or, for a --dir of the user's, that it stays."""
    if not loc.removes_data:
        where = _objects_arg(loc)
        err(f"the demo's data stays in {where} (--dir); its embedded redis-server was stopped, and "
            f"`sessionstore --objects {where} ls` starts it again")
        return
    what = [f"the store in {d}" for d in loc.remove_dirs]
    if loc.external:
        what.append(f"its objects under {loc.objects_url} and its Redis keys under {loc.redis_prefix}")
    err(f"removed the demo's data ({'; '.join(what)}); --keep keeps it to explore")


def _objects_arg(loc: Location) -> str:
    parsed = urlparse(loc.objects_url)
    if parsed.scheme == "file":
        from urllib.parse import unquote

        return unquote(parsed.path)
    return f"'{loc.objects_url}'"

