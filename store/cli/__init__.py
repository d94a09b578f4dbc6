"""``sessionstore``: the command line (entry point ``store.cli:main``).

Every subcommand runs against one store, chosen by ``--objects`` / ``--redis`` (or the
environment, see ``store.cli.common``); with neither, the embedded default: ``./.sessionstore/``
and a redis-server beside it. A failure prints one line on stderr and exits with the code of
its class (``store.cli.common.Exit``), never a traceback (``SESSIONSTORE_DEBUG=1`` shows one).
See docs/cli.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from store.cli import commands
from store.cli.claude import add_claude_commands
from store.cli.retention import add_retention_commands
from store.cli.serve import add_serve_arguments
from store.cli.common import (
    ENV_DEBUG,
    ENV_OBJECTS,
    ENV_PREFIX,
    ENV_REDIS,
    CliError,
    Config,
    Exit,
    classify,
    err,
    name_the_bucket,
    require_existing_store,
    resolve_config,
)

__all__ = ["Exit", "build_parser", "main"]

_EPILOG = """\
exit codes: 0 ok, 1 faults found (verify, doctor, demo, import with refused files),
2 usage or invalid input, 3 not found, 4 conflict / refused write, 5 backend unavailable,
6 backend refused (permissions, no bucket, no conditional writes), 7 outcome unknown
(re-send the same batch), 8 corrupt object, 70 internal error, 130 interrupted.

environment: SESSIONSTORE_OBJECTS_URL, SESSIONSTORE_REDIS_URL, SESSIONSTORE_REDIS_PREFIX,
SESSIONSTORE_KEYS (encryption at rest: file:///keyring.json or kms://KEY), SESSIONSTORE_DEBUG=1 (tracebacks). Without them: ./.sessionstore/ and an embedded Redis.
"""


#: The commands that may start a store in a local directory that does not exist yet (they
#: write something new there, or, ``doctor``, check a place before a store lives there).
#: Every other one refuses such a directory: it reads or changes what is there, and a
#: mistyped path must not read as a new, empty store. (``embedded`` opens no store: it looks
#: for a server.)
STARTS_A_STORE = ("create", "import", "claude-import", "serve", "demo", "doctor", "embedded")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (and exit code 2)."""

    def error(self, message: str) -> NoReturn:
        err(f"{self.prog}: error: {message} (see {self.prog} --help)")
        raise SystemExit(Exit.USAGE)


def _add_global(parser: argparse.ArgumentParser, *, sub: bool) -> None:
    # On subcommands the defaults are SUPPRESS, so `sessionstore --json ls` and
    # `sessionstore ls --json` both work and neither overrides the other with a default.
    d: Any = argparse.SUPPRESS if sub else None
    g = parser.add_argument_group("store")
    g.add_argument("--objects", metavar="URL|DIR", default=d,
                   help=f"object store: s3://bucket/prefix?endpoint=..., file:///dir or a directory "
                        f"(env {ENV_OBJECTS}; default ./.sessionstore)")
    g.add_argument("--redis", metavar="URL", default=d,
                   help=f"redis://host:6379/0, rediss://... or unix:///path/redis.sock?db=0 (env {ENV_REDIS}; "
                        "default: an embedded redis-server beside a local directory)")
    g.add_argument("--redis-prefix", metavar="PREFIX", default=d,
                   help=f"Redis key prefix (env {ENV_PREFIX}; default ss)")
    g.add_argument("--allow-unsafe-backend", action="store_true", default=d if sub else False,
                   help="run on an object store that ignores If-None-Match (loses writes under races)")
    g.add_argument("--json", action="store_true", default=d if sub else False,
                   help="machine-readable output on stdout")


#: ``add(name, help, func)``: a subcommand with the global options, run by ``func``.
_Add = Callable[[str, str, Callable[..., int]], argparse.ArgumentParser]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="sessionstore",
        description="A multi-writer session store for AI agents (pi JSONL v3 sessions) over "
                    "object storage and Redis.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_global(parser, sub=False)
    parser.add_argument("--version", action="version", version=f"sessionstore {_version()}")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def add(name: str, help_text: str, func: Callable[..., int]) -> argparse.ArgumentParser:
        p = subs.add_parser(name, help=help_text, description=help_text)
        _add_global(p, sub=True)
        p.set_defaults(func=func)
        return p

    # In the order of `sessionstore --help`.
    _add_session_commands(add)
    _add_transfer_commands(add)
    add_claude_commands(add)
    _add_follow_command(add)
    _add_serve_command(add)
    _add_removal_commands(add)
    add_retention_commands(add)
    _add_operate_commands(add)
    _add_demo_command(add)
    return parser


def _add_session_commands(add: _Add) -> None:
    p = add("create", "create a session and print its id", commands.cmd_create)
    p.add_argument("session", nargs="?", help="session id (default: a new UUIDv7)")
    p.add_argument("--cwd", help="the working directory recorded in the header (default: this one)")
    p.add_argument("--name", help="a session name (a session_info entry)")

    p = add("append", "append JSON-lines entries as one atomic batch", commands.cmd_append)
    p.add_argument("session")
    p.add_argument("file", nargs="?", default="-", help="JSONL file (default: stdin)")
    tail = p.add_mutually_exclusive_group()
    tail.add_argument("--expect-tail", metavar="ENTRY_ID",
                      help="append only if the session's last entry is this one (else exit 4)")
    tail.add_argument("--expect-empty", action="store_true", help="append only if the session has no entry")

    p = add("ls", "list sessions: name, entries, last update", commands.cmd_ls)
    p.add_argument("--limit", type=int, help="show the N most recently updated")
    p.add_argument("--page-size", type=int, metavar="N",
                   help="one page of N sessions (1..1000) in the store's order (shard, then id), and the cursor of the next")
    p.add_argument("--cursor", help="the page after this cursor (printed by the previous page)")
    p.add_argument("--cwd", help="only sessions whose cwd is this")
    p.add_argument("--cwd-prefix", metavar="PREFIX", help="only sessions whose cwd starts with this")
    p.add_argument("--kind", choices=("pi", "stream"), help="only sessions of this kind")
    p.add_argument("--since", metavar="TIME", help="only sessions updated since (ISO 8601 or epoch ms)")
    p.add_argument("--name", metavar="TEXT", help="only sessions whose name contains this")
    p.add_argument("--trashed", action="store_true", help="only sessions in the trash (see `trash ls`)")

    p = add("info", "one session's header, tail, size and compactions", commands.cmd_info)
    p.add_argument("session")

    p = add("show", "draw a session's tree: branches, labels, the leaf, compactions", commands.cmd_show)
    p.add_argument("session")

    p = add("context", "the context (messages, model, thinking level) for a leaf, as JSON", commands.cmd_context)
    p.add_argument("session")
    p.add_argument("--leaf", metavar="ENTRY_ID", help="build the context for this entry (default: the leaf)")
    p.add_argument("--compact", action="store_true", help="one line instead of indented JSON")

    p = add("fork", "new session whose history is the path to an entry (copies nothing)", commands.cmd_fork)
    p.add_argument("session")
    p.add_argument("entry", nargs="?", help="entry to fork from (default: the leaf)")
    p.add_argument("--id", help="id of the new session (default: a new UUIDv7)")
    p.add_argument("--name", help="a name for the new session")


def _add_transfer_commands(add: _Add) -> None:
    p = add("import", "import pi session files or whole pi session directories", commands.cmd_import)
    p.add_argument("paths", nargs="+", metavar="PATH", help="a .jsonl file, a directory (searched for *.jsonl), or - for stdin")
    p.add_argument("--id", help="session id for a single file (default: the id in its header)")
    p.add_argument("--new-ids", action="store_true", help="give every imported session a new (random) id")
    p.add_argument("--on-conflict", choices=["refuse", "new-id"], default="refuse",
                   help="a file whose session id holds other content: refuse it, writing nothing (default), "
                        "or import it as <id>-2, <id>-3, ...")
    p.add_argument("--jobs", type=int, default=4, help="files imported at once (default %(default)s)")
    p.add_argument("-v", "--verbose", action="store_true", help="report every imported file, not only refused ones")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")

    p = add("export", "write sessions as pi v3 JSONL files", commands.cmd_export)
    p.add_argument("sessions", nargs="*", metavar="SESSION")
    p.add_argument("--all", action="store_true", help="every session (needs -o DIR)")
    p.add_argument("-o", "--output", metavar="FILE|DIR",
                   help="file to write (default: stdout); a directory for several sessions (<id>.jsonl each)")


def _add_follow_command(add: _Add) -> None:
    p = add("follow", "print entries live as any writer appends them", commands.cmd_follow)
    p.add_argument("session")
    p.add_argument("-n", "--lines", type=int, default=10, help="print the last N entries first (default %(default)s)")
    p.add_argument("--from-start", action="store_true", help="print every entry first")
    p.add_argument("--count", type=int, help="exit after printing N new entries")
    p.add_argument("--timeout", type=float, help="exit after this many seconds")
    p.add_argument("--poll", type=float, default=2.0,
                   help="seconds between reads when no notification arrives (default %(default)s)")


def _cmd_serve(args: argparse.Namespace, ctx: commands.Ctx) -> int:
    # Without the http extra, a configuration error (exit 2) that names it, not exit 1 (which
    # means "faults found") from deep inside the service's imports.
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise CliError(f"sessionstore serve needs the http extra, which is not installed ({exc}): "
                       "pip install 'sessionstore[http]'", Exit.USAGE) from None
    return commands.cmd_serve(args, ctx)


def _add_serve_command(add: _Add) -> None:
    p = add("serve", "serve every stream and session over HTTP (the Durable Streams protocol)", _cmd_serve)
    add_serve_arguments(p)


def _add_removal_commands(add: _Add) -> None:
    p = add("redact", "hide an entry's content from every reader now (its bytes leave storage at "
                      "compaction + gc, or at once with --purge-now)", commands.cmd_redact)
    p.add_argument("session")
    p.add_argument("entry")
    p.add_argument("--reason", required=True)
    p.add_argument("--purge-now", action="store_true",
                   help="compact the session and delete the objects holding the content now (erasure requests)")

    p = add("delete", "delete a session and everything in it", commands.cmd_delete)
    p.add_argument("session")
    p.add_argument("--yes", action="store_true", help="confirm")

    p = add("erase", "an erasure request: delete whole sessions (with their data keys), or redact "
                     "and purge at once every entry that mentions --matching TEXT; reports what "
                     "was removed (then prove it with `verify --canary TEXT`)", commands.cmd_erase)
    p.add_argument("sessions", nargs="*", metavar="SESSION",
                   help="the sessions (with --matching and none named: every session)")
    p.add_argument("--matching", metavar="TEXT",
                   help="erase the entries whose strings contain TEXT, not whole sessions")
    p.add_argument("--dry-run", action="store_true", help="report what would be erased, change nothing")
    p.add_argument("--yes", action="store_true", help="confirm (not needed with --dry-run)")


def _add_operate_commands(add: _Add) -> None:
    p = add("compact", "merge sessions' segments into bases now (default: every session)", commands.cmd_compact)
    p.add_argument("sessions", nargs="*", metavar="SESSION", help="default: every session")
    p.add_argument("--all", action="store_true", help="every session (the default)")
    p.add_argument("--grace", type=float, metavar="SECONDS",
                   help="grace period recorded in the manifest: gc deletes the merged objects after it (default 600)")
    p.add_argument("--purge-now", action="store_true",
                   help="then delete at once every object the new manifest does not reach (redacted bytes included)")

    p = add("gc", "delete retired objects whose grace period is over", commands.cmd_gc)
    p.add_argument("sessions", nargs="*", metavar="SESSION", help="default: every session")
    p.add_argument("--grace", type=float, metavar="SECONDS",
                   help="grace period (default 600); it can lengthen, never shorten, the grace a compaction "
                        "recorded in its manifest")

    p = add("verify", "check sessions (default: the whole bucket) against the store's invariants", commands.cmd_verify)
    p.add_argument("sessions", nargs="*", metavar="SESSION")
    p.add_argument("--strict", action="store_true", help="warnings fail too")
    p.add_argument("--canary", metavar="TEXT",
                   help="instead: byte-scan every object of the store and every Redis value under its "
                        "prefix for TEXT (the proof of an erasure); fails if it is anywhere")

    p = add("doctor", "check the backends: conditional writes, Redis settings, clocks, permissions", commands.cmd_doctor)
    p.add_argument("--strict", action="store_true", help="warnings fail too")

    p = add("embedded", "status or stop of the embedded redis-server of a local store", commands.cmd_embedded)
    p.add_argument("action", choices=["status", "stop"])


def _add_demo_command(add: _Add) -> None:
    from store.demo.options import add_demo_arguments

    p = add("demo", "run a fleet of scripted agents on shared sessions, then verify everything", _cmd_demo)
    add_demo_arguments(p)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sessionstore")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def _cmd_demo(args: argparse.Namespace, ctx: commands.Ctx) -> int:
    from store.demo import run_demo_command

    return run_demo_command(args, ctx)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return int(exc.code or 0) if not isinstance(exc.code, str) else Exit.USAGE
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return Exit.USAGE
    _log_to_stderr()
    _OneLine.config = None  # this command's, once resolved (main may run several in a process)
    ctx: commands.Ctx | None = None
    try:
        config = resolve_config(args.objects, args.redis, args.redis_prefix, args.allow_unsafe_backend)
        _OneLine.config = config
        if args.command not in STARTS_A_STORE:
            require_existing_store(config, "sessionstore create, import and serve")
        ctx = commands.Ctx(config, json=args.json)
        return int(args.func(args, ctx))
    except KeyboardInterrupt:
        err("sessionstore: interrupted")
        return Exit.INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return Exit.BROKEN_PIPE
    except Exception as exc:
        code, message = classify(exc)
        if os.environ.get(ENV_DEBUG):
            traceback.print_exc()
        err(f"sessionstore: {name_the_bucket(message, _OneLine.config)}")
        return code
    finally:
        if ctx is not None:
            try:
                ctx.close()
            except Exception:
                pass  # closing a dead connection must not mask the command's outcome


class _OneLine(logging.Handler):
    """The store's warnings (Redis index not updated, ...) as one line each on stderr."""

    #: The command's configuration, once resolved: lines name its bucket, not object keys.
    config: Config | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = name_the_bucket(record.getMessage(), self.config)
            if record.name == "sessionstore.embedded":
                # What the embedded server does (started, left running, stopped): news, not faults.
                err(f"sessionstore: {message}")
            else:
                err(f"sessionstore: {record.levelname.lower()}: {message}")
        except Exception:
            pass


def _log_to_stderr() -> None:
    # Every logger of the project is under "sessionstore"; a handler there also keeps
    # logging's last-resort handler (which prints bare messages) from firing.
    logger = logging.getLogger("sessionstore")
    if not any(isinstance(h, _OneLine) for h in logger.handlers):
        logger.addHandler(_OneLine(logging.WARNING))


def _silence_stdout() -> None:
    # The reader went away: point stdout at /dev/null so the interpreter's final flush
    # does not raise a second BrokenPipeError on the way out.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
