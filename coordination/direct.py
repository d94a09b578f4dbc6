"""The append's two scripts, CHECK and COMMIT, on connections of the coordinator's own.

Every append makes two Redis calls. Through redis-py's client each one costs about 0.1 ms of
client work besides the round trip (a raw ``PING`` on a unix socket: 0.02 ms): the pool's
lock, bookkeeping and metrics on taking and giving back a connection, the client's retry and
event layers, and a packer that encodes each argument through several type checks (a
COMMIT has two dozen). With the embedded default that is a tenth of an append.

:class:`DirectScripts` runs ``EVALSHA`` on connections it keeps itself: redis-py
``Connection`` objects made like the pool's (same address, auth, TLS, timeouts, protocol,
health checks), never counted in or taken from the pool, packed here in one pass. Their
replies are read here too (``_read_reply``): one ``recv`` for a reply that fits, parsed in
one function, where redis-py's parser reads each element through a buffered line reader
(with the one-pass packer 0.03-0.04 ms of an append: docs/performance.md). The
connection's own parser reads a reply when it is not one of redis-py's pure-Python parsers
(hiredis's, a subclass), when it holds bytes already read, or when the client decodes
responses. What can go wrong goes wrong as through the client: the same redis-py
exceptions (error replies through redis-py's own ``parse_error``, so a ``NoScriptError``
loads the script and runs it again through the client), which the coordinator translates
as for every call. A connection whose call failed in any other way is disconnected before
it is used again (it may hold half a reply), and a process that forked drops the free
connections it inherited without touching them.

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
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.commands.core import Script

try:  # redis-py's own parsers, whose buffer the reply reader knows (hiredis's it does not)
    from redis._parsers import _RESP2Parser, _RESP3Parser

    _READ_HERE: tuple[type, ...] = (_RESP2Parser, _RESP3Parser)
except ImportError:  # pragma: no cover - another redis-py layout: its parser reads them all
    _READ_HERE = ()

_CRLF = b"\r\n"
#: Bytes asked of the socket per ``recv``: a CHECK or COMMIT reply fits in one.
_RECV = 65536
#: Arguments at least this long are not copied into a formatted header (``_pack``).
_LARGE_ARG = 4096
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
        conn = self._send(script, keys, args)
        try:
            if meanwhile is not None:
                meanwhile()
        except BaseException:
            conn.disconnect()  # its reply is never read: the connection is not reused
            raise
        return self._finish(conn, script, keys, args)

    def send(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Reply:
        """``run`` in two halves: the command is sent now, its reply read by the ``Reply``
        returned (``read()``), so that the caller's own work (the append's flush) runs while
        Redis runs the script. Raises as ``run`` does when the command cannot be sent."""
        return Reply(self, self._send(script, keys, args), script, keys, args)

    def _send(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        conn = self._take()
        try:
            conn.send_packed_command([_pack(conn, script.sha, keys, args)])
        except BaseException:
            conn.disconnect()
            raise
        return conn

    def _finish(self, conn: Any, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        try:
            res = _read_reply(conn)
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


class Reply:
    """The reply of a command ``DirectScripts.send`` sent: ``read()`` it once (it raises what
    ``run`` raises), or ``drop()`` it (the connection is closed unread: the command may
    still run in Redis)."""

    __slots__ = ("_owner", "_conn", "_script", "_keys", "_args")

    def __init__(self, owner: DirectScripts, conn: Any, script: Script, keys: Sequence[Any],
                 args: Sequence[Any]) -> None:
        self._owner, self._conn = owner, conn
        self._script, self._keys, self._args = script, keys, args

    def read(self) -> Any:
        conn, self._conn = self._conn, None
        if conn is None:
            raise RuntimeError("a reply is read once")
        return self._owner._finish(conn, self._script, self._keys, self._args)

    def drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.disconnect()


def _pack(conn: Any, sha: str, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
    """``EVALSHA sha len(keys) *keys *args`` in RESP, each argument encoded as redis-py's
    encoder would (str in the connection's encoding, int as its decimal, bytes as they are);
    anything else goes through that encoder itself (and its errors)."""
    encoder = conn.encoder
    encoding, errors = encoder.encoding, encoder.encoding_errors
    nkeys = b"%d" % len(keys)
    parts = [
        b"*%d\r\n$7\r\nEVALSHA\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n"
        % (3 + len(keys) + len(args), len(sha), sha.encode(), len(nkeys), nkeys),
    ]
    append = parts.append
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
            if len(data) < _LARGE_ARG:
                append(b"$%d\r\n%b\r\n" % (len(data), data))
            else:  # a segment's bytes (the recent-segments cache): not copied twice
                append(b"$%d\r\n" % len(data))
                append(data)
                append(_CRLF)
    return b"".join(parts)


class _Short(Exception):
    """The bytes end inside the reply: read more."""


def _read_reply(conn: Any) -> Any:
    """The reply to the one command sent on ``conn``, as redis-py's ``read_response`` gives
    it (undecoded: bytes, int, None, lists; an error reply raised as redis-py's exception,
    one nested in an array returned as one, as redis-py does). The connection's own parser
    reads it when that is not one of redis-py's pure-Python parsers (hiredis, a subclass),
    when it holds bytes already read, or when the client decodes responses."""
    parser = conn._parser
    sock = conn._sock
    if (type(parser) not in _READ_HERE or sock is None or parser._buffer is None
            or parser._buffer.unread_bytes() or conn.encoder.decode_responses):
        return conn.read_response()
    data = b""
    pos = 0
    try:
        while True:
            try:
                value, end = _parse(data, pos, parser)
            except _Short:
                chunk = sock.recv(_RECV)
                if not chunk:
                    raise redis.exceptions.ConnectionError("Connection closed by server.") from None
                data += chunk
                continue
            if value is _PUSH:  # out of band (a server's notice): not the reply
                pos = end
                continue
            break
    except TimeoutError:  # the socket timeout (socket.timeout)
        conn.disconnect()
        raise redis.exceptions.TimeoutError(f"Timeout reading from {conn._host_error()}") from None
    except OSError as exc:
        conn.disconnect()
        raise redis.exceptions.ConnectionError(
            f"Error while reading from {conn._host_error()} : {exc.args}"
        ) from None
    except (ValueError, redis.exceptions.InvalidResponse) as exc:
        conn.disconnect()
        raise redis.exceptions.InvalidResponse(f"Protocol error: {exc}") from None
    except BaseException:
        conn.disconnect()
        raise
    if end != len(data):
        conn.disconnect()  # bytes after the reply: nothing else was asked, do not reuse it
    if conn.health_check_interval:
        conn.next_health_check = time.monotonic() + conn.health_check_interval
    if isinstance(value, redis.exceptions.ResponseError):
        raise value  # an error reply (one inside an array is returned, as redis-py does)
    return value


_PUSH = object()


def _parse(data: bytes, pos: int, parser: Any, top: bool = True) -> tuple[Any, int]:
    """One RESP2/RESP3 value of ``data`` at ``pos``: (value, the position after it). A push
    message at the top is ``_PUSH``; an error reply the exception redis-py's ``parser``
    makes of it (as its own parser returns it)."""
    end = data.find(b"\r\n", pos)
    if end < 0:
        raise _Short
    kind = data[pos]
    line = data[pos + 1:end]
    pos = end + 2
    if kind == 36 or kind == 61 or kind == 33:  # $ bulk, = verbatim, ! bulk error
        size = int(line)
        if size < 0:
            return None, pos
        stop = pos + size
        if len(data) < stop + 2:
            raise _Short
        blob = data[pos:stop]
        if kind == 61:
            blob = blob[4:]  # "txt:" (redis-py drops the format too)
        elif kind == 33:
            return _error(blob, parser), stop + 2
        return blob, stop + 2
    if kind == 58:  # : integer
        return int(line), pos
    if kind == 42 or kind == 126 or kind == 62:  # * array, ~ set, > push
        count = int(line)
        if count < 0:
            return None, pos
        items = []
        for _ in range(count):
            item, pos = _parse(data, pos, parser, False)
            items.append(item)
        if kind == 62 and top:
            return _PUSH, pos
        return items, pos  # a set too, as redis-py gives it (its members may be unhashable)
    if kind == 43:  # + simple string
        return line, pos
    if kind == 45:  # - error
        return _error(line, parser), pos
    if kind == 95:  # _ null
        return None, pos
    if kind == 35:  # # boolean
        return line == b"t", pos
    if kind == 44:  # , double
        return float(line), pos
    if kind == 40:  # ( big number
        return int(line), pos
    if kind == 37:  # % map
        out = {}
        for _ in range(int(line)):
            key, pos = _parse(data, pos, parser, False)
            out[key], pos = _parse(data, pos, parser, False)
        return out, pos
    raise redis.exceptions.InvalidResponse(f"unknown reply type {bytes([kind])!r}")


def _error(text: bytes, parser: Any) -> Any:
    error = parser.parse_error(text.decode("utf-8", "replace"))
    if isinstance(error, redis.exceptions.ConnectionError):
        raise error  # as redis-py's parser does, wherever the error sits
    return error


__all__ = ["DirectScripts", "Reply"]
