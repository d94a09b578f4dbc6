"""``sessionstore doctor``: check that the backends can carry the store's promises.

Each check is independent and reports ``ok``, ``warn`` or ``fail`` with one line of detail;
a backend that is down fails its own checks and the others still run. Nothing here writes
outside the probe prefix (objects) or one probe key (Redis), and both are removed.
"""

from __future__ import annotations

import email.utils
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from coordination.redis import parse_version
from store.cli.common import Config
from store.errors import ConditionalWritesUnsupportedError, SessionStoreError
from store.backends.filesystems import verdict
from store.formats.layout import LAYOUT_FLAT, LAYOUT_SPREAD, Layout
from store.protocol.layout_record import propose, read_record
from store.backends.objects import (
    LOCAL_STORES,
    ObjectStore,
    S3ObjectStore,
    object_store_from_url,
    s3_prefix_of,
)
from store.retry import DEFAULT_RETRY

#: Redis 6.2 brought XAUTOCLAIM (the compactor's take-over of a dead worker's jobs) and GETDEL.
MIN_REDIS = (6, 2)
#: Clock skew: beyond WARN it eats into the compactor's grace period; beyond FAIL, S3 starts
#: refusing signatures (15 min) long before, and GC's decisions across machines are unsafe.
SKEW_WARN_S = 2.0
SKEW_FAIL_S = 60.0


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: str  # ok warn fail
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}


def _run(checks: list[Check], name: str, fn: Callable[[], tuple[str, str]]) -> bool:
    try:
        status, detail = fn()
    except SessionStoreError as exc:
        status, detail = "fail", str(exc)
    except Exception as exc:  # a doctor reports every failure as a finding, never a crash
        status, detail = "fail", f"{type(exc).__name__}: {exc}"
    checks.append(Check(name, status, detail))
    return status != "fail"


def run_doctor(config: Config) -> list[Check]:
    checks: list[Check] = []
    objects: ObjectStore | None = None

    def open_objects() -> tuple[str, str]:
        nonlocal objects
        objects = object_store_from_url(config.objects_url)
        return "ok", f"{type(objects).__name__} at {config.objects_url}"

    if _run(checks, "objects: URL", open_objects):
        assert objects is not None
        try:
            _object_checks(checks, objects, Layout(s3_prefix_of(config.objects_url)))
        finally:
            objects.close()
    _redis_checks(checks, config)
    return checks


# --- object store ----------------------------------------------------------------------------


def _object_checks(checks: list[Check], objects: ObjectStore, layout: Layout) -> None:
    key = f"{layout.probe_prefix}doctor/{uuid.uuid4().hex}"
    body = b"sessionstore doctor probe\n"

    def write_read_list_delete() -> tuple[str, str]:
        steps = []
        objects.put_if_absent(key, body, {"nonce": "doctor"})
        steps.append("create")
        try:
            got = objects.get(key)
            if got.data != body:
                return "fail", "an object read back differs from what was written"
            steps.append("read")
            if objects.head(key) is None:
                return "fail", "HEAD does not find an object just written"
            if key not in [i.key for i in objects.list(f"{layout.probe_prefix}doctor/")]:
                return "fail", "LIST does not show an object just written"
            steps.append("list")
        finally:
            objects.delete(key)
        if objects.head(key) is not None:
            return "fail", "DELETE left the object in place"
        steps.append("delete")
        return "ok", " / ".join(steps) + " allowed"

    if not _run(checks, "objects: permissions", write_read_list_delete):
        return

    def conditional() -> tuple[str, str]:
        try:
            objects.probe_conditional_writes(layout.probe_prefix)
        except ConditionalWritesUnsupportedError as exc:
            return "fail", str(exc)
        return "ok", ("a second create of the same key was refused (If-None-Match: * honoured), "
                      "and a delete naming another object (If-Match honoured)")

    _run(checks, "objects: conditional writes", conditional)

    def layout_check() -> tuple[str, str]:
        # Read only: the record is created by the first store that opens the bucket.
        names = {LAYOUT_FLAT: "flat (sessions/<id>/)", LAYOUT_SPREAD: "spread (sessions/<h>=<id>/)"}
        recorded = read_record(objects, layout.prefix, DEFAULT_RETRY)
        if recorded is not None:
            keyed = "keyed stream ids" if recorded[1] is not None else "unkeyed stream ids"
            return "ok", f"{names[recorded[0]]}, {keyed}, recorded in {layout.record}"
        proposed, _ = propose(objects, layout.prefix, DEFAULT_RETRY)
        return "ok", f"no layout record yet: the first store to open it records {names[proposed]}"

    _run(checks, "objects: layout", layout_check)

    if isinstance(objects, S3ObjectStore):
        store = objects

        def skew() -> tuple[str, str]:
            before = time.time()
            resp = store.client.list_objects_v2(Bucket=store.bucket, Prefix=layout.probe_prefix, MaxKeys=1)
            after = time.time()
            date = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
            if not date:
                return "warn", "the S3 server sent no Date header"
            server = email.utils.parsedate_to_datetime(date).timestamp()
            # The Date header has one-second resolution: the comparison is to +-1 s.
            return _skew_verdict(server - (before + after) / 2, "S3 server", slack=1.0)

        _run(checks, "objects: clock skew", skew)
    elif isinstance(objects, LOCAL_STORES):
        checks.append(Check("objects: clock skew", "ok", "local directory: same clock"))
        local = objects
        checks.append(Check("objects: backend", "ok", "file backend: a file per object, an append two fsyncs"))

        def durability() -> tuple[str, str]:
            # The power-loss promise leans on a journaling filesystem (store/backends/filesystems.py);
            # one this cannot tell about is reported as not checked, not as a fault.
            found = verdict(local.root, fsync=local.fsync)
            return ("warn" if found.status == "warn" else "ok"), found.detail

        _run(checks, "objects: durability", durability)


def _skew_verdict(skew: float, what: str, *, slack: float = 0.0) -> tuple[str, str]:
    size = max(0.0, abs(skew) - slack)
    detail = f"{what} clock is {skew:+.3f} s from this machine's"
    if size >= SKEW_FAIL_S:
        return "fail", detail + f" (over {SKEW_FAIL_S:.0f} s: the compactor's grace period is unsafe)"
    if size >= SKEW_WARN_S:
        return "warn", detail + " (run NTP)"
    return "ok", detail


# --- Redis -----------------------------------------------------------------------------------


def _redis_checks(checks: list[Check], config: Config) -> None:
    from coordination.redis import Coordinator

    url = config.redis_url
    if url is None:
        url = _embedded_redis(checks, config)
        if url is None:
            return
    coord = Coordinator.from_url(url, prefix=config.redis_prefix)
    probe = _RedisProbe(coord.client, config.redis_prefix, url)
    try:
        if not _run(checks, "redis: version", probe.version):
            return
        _run(checks, "redis: persistence", probe.persistence)
        _run(checks, "redis: eviction", probe.eviction)
        _run(checks, "redis: clock skew", probe.skew)
        _run(checks, "redis: permissions", probe.permissions)
    finally:
        coord.close()


def _embedded_redis(checks: list[Check], config: Config) -> str | None:
    """No --redis: the embedded redis-server of a local directory, started if need be. Its
    URL, or None when the check failed."""
    url: str | None = None

    def embedded() -> tuple[str, str]:
        nonlocal url
        from store.backends.embedded import EmbeddedRedis, redis_server_binary

        directory = config.local_dir
        if directory is None:
            return "fail", "no --redis given and the objects are not a local directory: the embedded Redis needs file://"
        embedded = EmbeddedRedis(directory / ".redis")
        url = embedded.ensure_running()
        started = ""
        if embedded.started_here:
            started = f"; started now (pid {embedded.pid()}), it keeps running: `sessionstore embedded stop` stops it"
        return "ok", f"embedded redis-server ({redis_server_binary()}) in {embedded.dir}{started}"

    if not _run(checks, "redis: embedded server", embedded):
        return None
    return url


class _RedisProbe:
    """The Redis checks, each a ``_run`` function: version, persistence, eviction, clock,
    permissions. Every redis-py error is translated to the store's."""

    def __init__(self, client: Any, prefix: str, url: str) -> None:
        self.client = client
        self.prefix = prefix
        self.url = url

    def call(self, fn: Callable[[], Any]) -> Any:
        from coordination.redis import translate_redis_error

        try:
            return fn()
        except Exception as exc:
            raise translate_redis_error(exc) from exc

    def config_value(self, name: str) -> str | None:
        try:
            got = self.call(lambda: self.client.config_get(name))
        except SessionStoreError:
            return None  # CONFIG is often disabled on managed Redis
        value = got.get(name)
        return None if value is None else str(value)

    def server_version(self) -> tuple[tuple[int, ...], str, str]:
        """(major, minor), the version as the server spells it, and its mode."""
        info = self.call(lambda: self.client.info("server"))
        version = str(info.get("redis_version", "?"))
        return parse_version(version)[:2], version, str(info.get("redis_mode", "standalone"))

    def version(self) -> tuple[str, str]:
        self.call(self.client.ping)
        parts, version, mode = self.server_version()
        if parts and parts < MIN_REDIS:
            return "fail", f"Redis {version} ({mode}); {'.'.join(map(str, MIN_REDIS))} or later is needed"
        notes = "SPUBLISH, sharded" if parts >= (7, 0) else "PUBLISH"
        return "ok", f"Redis {version} ({mode}) at {_safe_url(self.url or '')}; change notifications by {notes}"

    def persistence(self) -> tuple[str, str]:
        aof = self.config_value("appendonly")
        if aof is None:
            return "warn", "CONFIG GET is not allowed: cannot tell whether appendonly is on"
        if aof != "yes":
            return "warn", (
                "appendonly is off: a restart forgets every tail and id index, which the "
                "store then rebuilds from the object store session by session (set appendonly yes)"
            )
        return "ok", f"appendonly yes (appendfsync {self.config_value('appendfsync') or '?'})"

    def eviction(self) -> tuple[str, str]:
        policy = self.config_value("maxmemory-policy")
        if policy is None:
            return "warn", "CONFIG GET is not allowed: cannot tell the maxmemory-policy"
        if policy != "noeviction":
            return "warn", (
                f"maxmemory-policy is {policy}: evicted tails are rebuilt, but evicted "
                "compaction jobs are lost (set maxmemory-policy noeviction)"
            )
        return "ok", "maxmemory-policy noeviction"

    def skew(self) -> tuple[str, str]:
        before = time.time()
        secs, micros = self.call(self.client.time)
        after = time.time()
        return _skew_verdict(secs + micros / 1e6 - (before + after) / 2, "Redis server")

    def permissions(self) -> tuple[str, str]:
        key = f"{self.prefix}:doctor:{uuid.uuid4().hex}"
        sharded = False
        try:
            self.call(lambda: self.client.set(key, "1", nx=True, ex=30))
            if self.call(lambda: self.client.eval("return redis.call('GET', KEYS[1])", 1, key)) not in (b"1", "1"):
                return "fail", "a Lua script could not read a key just written"
            self.call(lambda: self.client.publish(f"{self.prefix}:doctor", "ping"))
            sharded = self.server_version()[0] >= (7, 0)
            if sharded:  # COMMIT announces with SPUBLISH there (docs/design.md, "Change notifications")
                self.call(lambda: self.client.spublish(f"{self.prefix}:doctor", "ping"))
        finally:
            self.call(lambda: self.client.delete(key))
        return "ok", f"SET / EVAL / PUBLISH{' / SPUBLISH' if sharded else ''} / DEL allowed"


def _safe_url(url: str) -> str:
    """The URL without its password."""
    from urllib.parse import urlparse

    parsed = urlparse(url)
    if parsed.password:
        netloc = parsed.netloc.replace(f":{parsed.password}@", ":***@")
        return parsed._replace(netloc=netloc).geturl()
    return url


__all__ = ["Check", "run_doctor"]
