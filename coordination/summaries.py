"""The listing's summaries (``store/protocol/listing.py``) and a session's last access, in Redis.

A summary is installed from the object store (``scripts.SUMMARY``), marked by a delete
(``scripts.DELETING``) and read a page at a time; ``forget`` drops all of a session's state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from coordination.client import RedisClient
from coordination.formats import _read_text, _s, _text


class SummaryCalls(RedisClient):
    """The listing's and the session state's calls of the coordinator."""

    def install_summary(self, sid: str, inc: str, seq: int, fields: dict[str, str | int]) -> str:
        """Install a summary computed from the object store through segment ``seq`` (see
        scripts.SUMMARY): "INSTALLED", "KEPT", or "MOVED" (Redis's tail is elsewhere)."""
        args: list[Any] = [inc, seq]
        for name, value in fields.items():
            args.append(name)
            args.append(_text(value) if isinstance(value, str) else value)
        keys = [self.keys.tail(sid), self.keys.summary(sid)]
        return _s(self._call(lambda: self._summary(keys=keys, args=args)))

    def mark_deleting(self, sid: str, inc: str) -> bool:
        """Mark the summary of ``inc`` as being deleted (scripts.DELETING)."""
        return bool(self._call(lambda: self._deleting(keys=[self.keys.summary(sid)], args=[inc])))

    def summaries(self, sids: Sequence[str]) -> list[tuple[list[Any], dict[str, str]]]:
        """For each session: its tail's ``inc``, ``seq``, ``count`` and its summary hash, in
        one round trip (a pipeline; on Redis Cluster one per node holding a page's slots).
        Read-only, so a resend after a timeout is safe."""
        if not sids:
            return []

        def go() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for sid in sids:
                pipe.hmget(self.keys.tail(sid), "inc", "seq", "count")
                pipe.hgetall(self.keys.summary(sid))
            return cast(list[Any], pipe.execute())

        raw = self._call(go)
        out: list[tuple[list[Any], dict[str, str]]] = []
        for i in range(len(sids)):
            tail = [None if v is None else _s(v) for v in raw[2 * i]]
            summary = {_s(k): _read_text(v) for k, v in (raw[2 * i + 1] or {}).items()}
            out.append((tail, summary))
        return out

    def forget(self, sid: str, inc: str = "*", *, deleted_for_ms: int = 0) -> bool:
        """Drop the session's state (of ``inc`` only, unless "*"). ``deleted_for_ms``: also
        record for that long that ``inc`` was deleted, so that no rebuild of it is installed
        (a delete passes its rebuild age limit here)."""
        keys = [
            self.keys.tail(sid),
            self.keys.ids(sid),
            self.keys.job_pending(sid),
            self.keys.claim(sid),
            self.keys.deleted(sid),
            self.keys.access(sid),
            self.keys.summary(sid),
            self.keys.recent(sid),
        ]
        return bool(self._call(lambda: self._forget(keys=keys, args=[inc, deleted_for_ms])))

    # --- last access (retention's activity time) --------------------------------------------

    def touch_access(self, sid: str, inc: str, when_ms: int) -> None:
        """Record that incarnation ``inc`` of ``sid`` was read or written at ``when_ms``."""
        self._call(lambda: self.client.set(self.keys.access(sid), f"{inc}:{when_ms}"))

    def last_access(self, sid: str, inc: str) -> int | None:
        """When incarnation ``inc`` of ``sid`` was last read or written, if Redis knows."""
        raw = self._call(lambda: self.client.get(self.keys.access(sid)))
        if raw is None:
            return None
        got_inc, _, ms = _s(raw).rpartition(":")
        if got_inc != inc:
            return None
        try:
            return int(ms)
        except ValueError:
            return None


__all__ = ["SummaryCalls"]
