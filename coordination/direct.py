"""The append's two scripts, CHECK and COMMIT, on connections of the coordinator's own.

Every append makes two Redis calls. Through redis-py's client each one costs about 0.1 ms of
client work besides the round trip (a raw ``PING`` on a unix socket: 0.02 ms): the pool's
lock, bookkeeping and metrics on taking and giving back a connection, the client's retry and
event layers, and a packer that encodes each argument through several type checks (a
COMMIT has two dozen). With the embedded default that is a tenth of an append.

:class:`DirectScripts` runs ``EVALSHA`` on connections it keeps itself: redis-py
``Connection`` objects made like the pool's (same address, auth, TLS, timeouts, protocol,
health checks), never counted in or taken from the pool, packed here in one pass, their
replies read by redis-py's own parser. What can go wrong goes wrong as through the client:
redis-py's exceptions (a ``NoScriptError`` loads the script and runs it again through the
client), which the coordinator translates as for every call. A connection whose call failed
in any other way is disconnected before it is used again (it may hold half a reply), and a
process that forked drops the free connections it inherited without touching them.

``meanwhile``: what the caller does while Redis runs the script. The command is sent, the
callable runs, then the reply is read, so that the round trip and the script's time in the
server overlap the caller's own work (the file backend writing and fsyncing the segment's
bytes into a file with no name while CHECK decides its slot: ``store/append.py``). Nothing
the caller does meanwhile may depend on the reply.

Not for Redis Cluster (a script's slot decides its node: the cluster client routes it) nor
a pool with client-side caching; the coordinator calls through the client there.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.commands.core import Script

_CRLF = b"\r\n"
#: Connections kept for reuse; more at once are made and closed after use.
_KEEP = 64


class DirectScripts:
    def __init__(self, pool: redis.ConnectionPool, keep: int = _KEEP) -> None:
        self._pool = pool
        self._free: list[Any] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._keep = keep
        self._closed = False

    @classmethod
    def for_client(cls, client: Any) -> DirectScripts | None:
        """Direct scripts for a plain ``redis.Redis`` client, or None (a cluster client,
        client-side caching, a pool of another kind)."""
        if type(client) is not redis.Redis:
            return None
        pool = getattr(client, "connection_pool", None)
        if type(pool) is not redis.ConnectionPool or getattr(pool, "cache", None) is not None:
            return None
        return cls(pool)

    def run(
        self,
        script: Script,
        keys: Sequence[Any],
        args: Sequence[Any],
        meanwhile: Callable[[], None] | None = None,
    ) -> Any:
        """``script(keys=keys, args=args)``, with ``meanwhile()`` run between sending the
        command and reading its reply (at most once: not if the command could not be sent)."""
        conn = self._take()
        try:
            conn.send_packed_command([_pack(conn, script.sha, keys, args)])
        except BaseException:
            conn.disconnect()
            raise
        try:
            if meanwhile is not None:
                meanwhile()
        except BaseException:
            conn.disconnect()  # its reply is never read: the connection is not reused
            raise
        try:
            res = conn.read_response()
        except redis.exceptions.NoScriptError:
            self._give(conn)
            return script(keys=keys, args=args)  # loads the script, runs it once
        except redis.exceptions.ResponseError:
            self._give(conn)  # an error reply, read whole: the connection is fine
            raise
        except BaseException:
            conn.disconnect()
            raise
        self._give(conn)
        return res

    def _take(self) -> Any:
        with self._lock:
            if self._pid != os.getpid():
                # Forked: the free connections are the parent's sockets. Forget them unused
                # (redis-py's disconnect leaves another process's socket alone too).
                self._free = []
                self._pid = os.getpid()
            if self._free:
                return self._free.pop()
        return self._pool.connection_class(**self._pool.connection_kwargs)

    def _give(self, conn: Any) -> None:
        with self._lock:
            if not self._closed and self._pid == os.getpid() and len(self._free) < self._keep:
                self._free.append(conn)
                return
        conn.disconnect()

    def close(self) -> None:
        with self._lock:
            free, self._free = self._free, []
            self._closed = True
            mine = self._pid == os.getpid()
        if mine:
            for conn in free:
                conn.disconnect()


def _pack(conn: Any, sha: str, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
    """``EVALSHA sha len(keys) *keys *args`` in RESP, each argument encoded as redis-py's
    encoder would (str in the connection's encoding, int as its decimal, bytes as they are);
    anything else goes through that encoder itself (and its errors)."""
    encoder = conn.encoder
    encoding, errors = encoder.encoding, encoder.encoding_errors
    parts = [
        b"*%d\r\n$7\r\nEVALSHA\r\n$%d\r\n%s\r\n" % (3 + len(keys) + len(args), len(sha), sha.encode()),
    ]
    nkeys = str(len(keys)).encode()
    parts.append(b"$%d\r\n%s\r\n" % (len(nkeys), nkeys))
    for group in (keys, args):
        for value in group:
            kind = type(value)
            if kind is bytes:
                data = value
            elif kind is str:
                data = value.encode(encoding, errors)
            elif kind is int:
                data = b"%d" % value
            else:
                data = encoder.encode(value)
                if isinstance(data, memoryview):
                    data = data.tobytes()
            parts.append(b"$%d\r\n" % len(data))
            parts.append(data)
            parts.append(_CRLF)
    return b"".join(parts)


__all__ = ["DirectScripts"]
