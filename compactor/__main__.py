"""``python -m compactor`` / ``sessionstore-compactor``: the worker and operator commands.

The store is found as ``sessionstore`` finds it (``store.cli.common.resolve_config``): the same
flags, environment variables, checks and default (``./.sessionstore`` and its embedded Redis),
and a local directory that does not exist is refused, never made a new store. ``--help`` prints
``_DESCRIPTION``, plain text. Logs are JSON lines on stderr; command results are JSON on stdout.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from dataclasses import asdict
from typing import Any, Sequence

import orjson

from compactor.compact import Compactor
from compactor.config import DEFAULT_GRACE_MS, CompactorOptions, WorkerOptions
from coordination.jobs import JobQueue
from compactor.logs import configure
from compactor.worker import Worker
from store.cli.common import (
    DEFAULT_DIR,
    ENV_OBJECTS,
    ENV_PREFIX,
    ENV_REDIS,
    CliError,
    Config,
    classify,
    require_existing_store,
    resolve_config,
)
from store.core import SessionStore
from store.errors import BackendUnavailableError, SessionStoreError

log = logging.getLogger("sessionstore.compactor")

_DESCRIPTION = """\
The compactor: merges sessions' segments into bases, deletes what that retires once its grace
period is over, and runs retention.

  python -m compactor [work] [--burst] ...      serve the job queue (the default command)
  python -m compactor compact SID [SID ...]     compact now, print the results (JSON)
  python -m compactor gc [SID ...]              GC the given sessions, or all of them
  python -m compactor purge SID [SID ...]       compact, then delete retired objects now (erasure)
  python -m compactor history SID               compaction records, newest first
  python -m compactor parked                    parked jobs and their errors

The store is found as sessionstore finds it: --objects (a URL or a directory; env
SESSIONSTORE_OBJECTS_URL; default ./.sessionstore), --redis (env SESSIONSTORE_REDIS_URL;
default: the embedded Redis beside a local directory), --redis-prefix (env
SESSIONSTORE_REDIS_PREFIX; default ss). --grace: env SESSIONSTORE_COMPACTOR_GRACE (seconds).
`python -m compactor COMMAND --help` lists a command's options. Logs are JSON lines on stderr;
command results are JSON on stdout.
"""

_COMMANDS = ("work", "compact", "gc", "purge", "history", "parked")


def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    d = CompactorOptions(worker="-")
    env = os.environ.get
    # Resolved by store.cli.common.resolve_config, as sessionstore resolves them (flag, then
    # environment, then default): no defaults here.
    p.add_argument("--objects", metavar="URL|DIR",
                   help="object store: s3://bucket/prefix?endpoint=..., file:///dir or a directory "
                        f"(env {ENV_OBJECTS}; default ./{DEFAULT_DIR})")
    p.add_argument("--redis", metavar="URL",
                   help="redis://host:6379/0, rediss://... or unix:///path/redis.sock?db=0 "
                        f"(env {ENV_REDIS}; default: the embedded Redis beside a local directory)")
    p.add_argument("--keys", default=env("SESSIONSTORE_KEYS"),
                   help="key provider of encrypted sessions: file:///path/keyring.json or "
                        "kms://KEY?region=... (env SESSIONSTORE_KEYS; docs/encryption.md)")
    p.add_argument("--redis-prefix", metavar="PREFIX",
                   help=f"Redis key prefix (env {ENV_PREFIX}; default ss)")
    p.add_argument("--grace", type=float,
                   default=float(env("SESSIONSTORE_COMPACTOR_GRACE", DEFAULT_GRACE_MS / 1000)),
                   help="seconds before retired objects and orphans are deleted "
                        "(env SESSIONSTORE_COMPACTOR_GRACE, default %(default)s)")
    p.add_argument("--max-base-bytes", type=int, default=d.max_base_bytes,
                   help="cut base objects after this many bytes")
    p.add_argument("--max-segments", type=int, default=d.max_segments,
                   help="segments merged by one compaction at most")
    p.add_argument("--name", default="", help="worker name (default host-pid-random)")
    p.add_argument("--log-level", default="INFO")
    return p


def _parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(prog="python -m compactor", description=_DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("work", parents=[common], help="serve the job queue")
    d = WorkerOptions()
    w.add_argument("--burst", action="store_true", help="drain the queue, then exit")
    w.add_argument("--group", default=d.group, help="consumer group (default %(default)s)")
    w.add_argument("--claim-idle", type=float, default=d.claim_idle_ms / 1000,
                   help="take over jobs pending this many seconds (default %(default)s)")
    w.add_argument("--max-deliveries", type=int, default=d.max_deliveries,
                   help="park a job after this many failed deliveries (default %(default)s)")
    w.add_argument("--block", type=float, default=d.block_ms / 1000,
                   help="seconds to wait for a job per pass (default %(default)s)")
    w.add_argument("--heartbeat", type=float, default=d.heartbeat_interval_ms / 1000,
                   help="seconds between heartbeats (default %(default)s)")
    w.add_argument("--gc-poll", type=float, default=d.gc_poll_ms / 1000,
                   help="seconds between looks at the GC schedule, 0: no scheduled GC on this "
                        "worker (default %(default)s)")
    w.add_argument("--gc-lease", type=float, default=d.gc_lease_ms / 1000,
                   help="seconds a claimed GC entry stays this worker's (default %(default)s)")
    w.add_argument("--gc-interval", type=float, default=d.gc_interval_ms / 1000,
                   help="seconds between sweeps (the full GC pass that finds orphans; one "
                        "worker at a time), 0: this worker never sweeps (default %(default)s)")
    w.add_argument("--sweep-rate", type=float, default=d.sweep_rate,
                   help="sessions per second the sweep collects at most, 0: no limit "
                        "(default %(default)s)")
    w.add_argument("--sweep-lease", type=float, default=d.sweep_lease_ms / 1000,
                   help="seconds after which a silent sweeper is replaced (default %(default)s)")
    w.add_argument("--idle-days", type=float, default=None,
                   help="retention: move pi sessions idle this many days to the trash (default: "
                        "no store-wide policy; sessions' own TTLs still run)")
    w.add_argument("--trash-grace-days", type=float, default=d.retention_grace_ms / 86_400_000,
                   help="days a trashed session stays restorable before it is purged (default %(default)s)")
    w.add_argument("--retention-poll", type=float, default=d.retention_poll_ms / 1000,
                   help="seconds between retention runs, fleet-wide; 0: none on this worker (default %(default)s)")
    w.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on this port (docs/operations.md; needs "
                        "prometheus-client: pip install 'sessionstore[metrics]')")
    w.add_argument("--metrics-host", default="127.0.0.1",
                   help="address the metrics listen on (default %(default)s)")
    c = sub.add_parser("compact", parents=[common], help="compact sessions now")
    c.add_argument("sessions", nargs="+")
    g = sub.add_parser("gc", parents=[common], help="garbage-collect sessions (all by default)")
    g.add_argument("sessions", nargs="*")
    p = sub.add_parser("purge", parents=[common],
                       help="compact, then delete at once every object the new manifest does not reach "
                            "(redacted content included; docs/compaction.md, 'Purge now')")
    p.add_argument("sessions", nargs="+")
    h = sub.add_parser("history", parents=[common], help="compaction history of a session")
    h.add_argument("session")
    sub.add_parser("parked", parents=[common], help="list parked jobs")
    return parser


def _print(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2, default=repr).decode() + "\n")
    sys.stdout.flush()


def _store_options(args: argparse.Namespace, config: Config) -> dict[str, object]:
    # This process is the compactor: no second worker in a thread (store/lifecycle/maintenance.py).
    options: dict[str, object] = {"redis_prefix": config.redis_prefix, "compact": False}
    if args.keys:
        from store.formats.crypto import key_provider_from_url

        options["key_provider"] = key_provider_from_url(args.keys)
    return options


def _open_store(args: argparse.Namespace, config: Config) -> SessionStore | None:
    """Open the store. A worker (``work``) started during an outage waits for the backends
    with backoff, logging why, instead of exiting; SIGTERM/SIGINT while waiting stop it
    (None). One-shot commands fail at once. A refusal (bad credentials, a missing bucket, a
    backend without conditional writes) is never waited on."""
    if args.command != "work":
        return SessionStore.from_url(config.objects_url, config.redis_url, **_store_options(args, config))
    stop = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in previous:
        signal.signal(sig, lambda *_: stop.set())
    try:
        wait = 0.5
        while not stop.is_set():
            try:
                return SessionStore.from_url(config.objects_url, config.redis_url, **_store_options(args, config))
            except BackendUnavailableError as exc:
                log.warning("store unavailable at start, retrying", extra={"error": str(exc), "wait_s": wait})
                stop.wait(wait)
                wait = min(wait * 2, 30.0)
        return None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or args_list[0] not in _COMMANDS and args_list[0] not in ("-h", "--help"):
        args_list.insert(0, "work")
    args = _parser().parse_args(args_list)
    configure(args.log_level)
    try:
        config = resolve_config(args.objects, args.redis, args.redis_prefix)
        require_existing_store(config, "sessionstore create, import and serve")
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return int(exc.code)
    options = CompactorOptions(
        grace_ms=int(args.grace * 1000),
        max_base_bytes=args.max_base_bytes,
        max_segments=args.max_segments,
        worker=args.name,
    )
    try:
        store = _open_store(args, config)
    except SessionStoreError as exc:
        code, message = classify(exc)  # sessionstore's exit codes: 5 unavailable, 6 refused, ...
        print(f"error: cannot open the store: {message}", file=sys.stderr)
        return int(code)
    if store is None:
        return 0  # stopped while waiting for the store
    try:
        compactor = Compactor(store, options)
        if args.command == "work":
            worker = Worker(
                compactor,
                WorkerOptions(
                    group=args.group,
                    claim_idle_ms=int(args.claim_idle * 1000),
                    max_deliveries=args.max_deliveries,
                    block_ms=max(1, int(args.block * 1000)),
                    heartbeat_interval_ms=int(args.heartbeat * 1000),
                    gc_poll_ms=int(args.gc_poll * 1000),
                    gc_lease_ms=max(1, int(args.gc_lease * 1000)),
                    gc_interval_ms=int(args.gc_interval * 1000),
                    sweep_rate=args.sweep_rate,
                    sweep_lease_ms=max(1, int(args.sweep_lease * 1000)),
                    retention_idle_ms=None if args.idle_days is None else int(args.idle_days * 86_400_000),
                    retention_grace_ms=int(args.trash_grace_days * 86_400_000),
                    retention_poll_ms=int(args.retention_poll * 1000),
                ),
            )
            metrics = None
            if args.metrics_port is not None:
                from compactor.metrics import serve_metrics

                metrics = serve_metrics(worker, args.metrics_host, args.metrics_port)
            try:
                return worker.run(burst=args.burst)
            finally:
                if metrics is not None:
                    metrics.shutdown()
        if args.command == "compact":
            _print([asdict(compactor.compact_session(sid)) for sid in args.sessions])
        elif args.command == "gc":
            if args.sessions:
                results = [compactor.gc_session(sid) for sid in args.sessions]
            else:
                results = [compactor.gc()]
            _print([{"sessions": r.sessions, "deleted": len(r.deleted), "waiting": r.waiting,
                     "errors": list(r.errors)} for r in results])
        elif args.command == "purge":
            from compactor.purge import purge_now

            out = []
            for sid in args.sessions:
                res = purge_now(compactor, sid)
                out.append({"session_id": sid, "generation": res.generation, "through_seq": res.through_seq,
                            "compactions": [asdict(c) for c in res.compactions],
                            "deleted": [key for _, key in res.deleted]})
            _print(out)
        elif args.command == "history":
            _print([asdict(r) for r in compactor.history(args.session)])
        elif args.command == "parked":
            queue = JobQueue(compactor.ctx.coord, group=WorkerOptions().group, consumer=options.worker)
            _print({sid: asdict(p) for sid, p in queue.parked().items()})
        return 0
    except SessionStoreError as exc:
        code, message = classify(exc)
        print(f"error: {type(exc).__name__}: {message}", file=sys.stderr)
        return int(code)
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(main())
