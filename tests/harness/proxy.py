"""A small TCP proxy on loopback that injects network faults in front of a real server.

    with TcpProxy("127.0.0.1", s3.port) as proxy:
        client = s3_client(proxy.endpoint_url)   # or redis.Redis.from_url(proxy.redis_url())
        proxy.drop_next_response()               # the server does the work, the client never
                                                 # hears back: its connection is closed
        proxy.cut_next_response()                # the client gets the head and half the body,
                                                 # then a reset
        proxy.blackhole()                        # accept, never answer (client read timeouts)
        proxy.delay(0.5, direction="response")   # hold data for 0.5 s
        proxy.reset_connections()                # RST every open connection now
        proxy.heal()                             # back to plain pass-through

It works on bytes, so it fronts any TCP protocol (HTTP for S3, RESP for Redis). One thread runs
a ``selectors`` loop over non-blocking sockets; the public methods hand their change to that
thread and return once it is in effect. :meth:`stop` closes every socket and joins the thread.

Fault semantics:

* ``drop_next_response(n)``: the next ``n`` times bytes come back from the server on any
  connection, the proxy closes that connection (both sides, FIN) instead of forwarding them.
  The request has reached the server and been processed (the server was already answering).
  Interim ``HTTP/1.x 1xx`` responses (``100 Continue``) are passed through and do not count.
* ``cut_next_response(n)``: the next ``n`` final responses (on any connection) are passed on
  as their head and half the body bytes that came with it; 0.2 s later (the client has read
  them and waits for the rest) the connection is reset (RST) on both sides. The client's
  HTTP library fails inside the body, after it had the status and headers.
* ``blackhole()``: every open connection and every new one is accepted and read, but nothing
  is forwarded in either direction (queued data is discarded). Those connections can never
  carry an answer again: :meth:`heal` resets them.
* ``delay(seconds, direction)``: each chunk is held ``seconds`` after it arrived before being
  sent on; ``direction`` is ``"request"`` (client to server), ``"response"`` or ``"both"``
  (a round trip then takes at least twice ``seconds``). Order is kept.
* ``reset_connections()``: every open connection is closed with RST on both sides; new
  connections are accepted as usual.
* ``heal()``: no blackhole, no delay, no pending drops; blackholed connections are reset.
"""

from __future__ import annotations

import atexit
import collections
import queue
import selectors
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["TcpProxy"]

_CHUNK = 65536
_BACKLOG_LIMIT = 4 * 1024 * 1024  # stop reading a side while this much waits for its peer
_EOF = None  # queue marker: shut down the write side of the destination
_RST: Any = object()  # queue marker: reset the connection (cut_next_response)
_CUT_HOLD_S = 0.2

_LIVE: weakref.WeakSet[TcpProxy] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for proxy in list(_LIVE):
        try:
            proxy.stop()
        except Exception:
            pass


def _interim_split(buf: bytes) -> tuple[bytes, bytes, str]:
    """Split leading interim HTTP responses (``HTTP/1.x 1xx ...\r\n\r\n``) off ``buf``.

    Returns ``(interim, rest, verdict)`` with verdict ``"final"`` (``rest`` starts a real
    response, or non-HTTP data: drop it), ``"wait"`` (``rest`` may still turn out to be an
    interim response: read more) or ``"empty"`` (nothing but interim responses).
    """
    interim = b""
    while buf:
        head = buf[:10]
        could_be_interim = (
            head[:7] == b"HTTP/1."[: len(head[:7])]
            and (len(head) < 9 or head[8:9] == b" ")
            and (len(head) < 10 or head[9:10] == b"1")
        )
        if not could_be_interim:
            return interim, buf, "final"
        end = buf.find(b"\r\n\r\n")
        if len(head) < 10 or end < 0:
            return interim, buf, "wait"
        interim += buf[: end + 4]
        buf = buf[end + 4 :]
    return interim, b"", "empty"


class _Conn:
    __slots__ = ("id", "client", "upstream", "out", "read_eof", "shut", "doomed", "sniff", "closed")

    def __init__(self, cid: int, client: socket.socket, upstream: socket.socket | None) -> None:
        self.id = cid
        self.client = client
        self.upstream = upstream
        # pending writes *to* each socket: deque of (due monotonic time, bytes | _EOF)
        self.out: dict[socket.socket, collections.deque[tuple[float, bytes | None]]] = {
            client: collections.deque()
        }
        self.read_eof: dict[socket.socket, bool] = {client: False}
        self.shut: dict[socket.socket, bool] = {client: False}
        if upstream is not None:
            self.out[upstream] = collections.deque()
            self.read_eof[upstream] = False
            self.shut[upstream] = False
        self.doomed = upstream is None  # blackholed: will never carry an answer again
        self.sniff = b""  # upstream bytes held while deciding whether to drop
        self.closed = False

    def sockets(self) -> list[socket.socket]:
        return [self.client] if self.upstream is None else [self.client, self.upstream]

    def peer(self, sock: socket.socket) -> socket.socket | None:
        return self.upstream if sock is self.client else self.client

    def backlog(self, sock: socket.socket) -> int:
        return sum(len(d) for _, d in self.out.get(sock, ()) if isinstance(d, bytes))


class TcpProxy:
    """See the module doc. ``listen_port=0`` picks a free port."""

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        connect_timeout: float = 2.0,
        name: str = "proxy",
    ) -> None:
        self.upstream = (upstream_host, int(upstream_port))
        self.listen_host = listen_host
        self._listen_port = listen_port
        self.connect_timeout = connect_timeout
        self.name = name
        self._sel: selectors.BaseSelector | None = None
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._commands: queue.Queue[tuple[Callable[[], Any], list[Any], threading.Event]] = queue.Queue()
        self._conns: dict[int, _Conn] = {}
        self._next_id = 0
        self._stopping = False
        self._error: BaseException | None = None
        # fault state (touched only on the loop thread)
        self._blackhole = False
        self._drops_pending = 0
        self._cuts_pending = 0
        self._delay = {"request": 0.0, "response": 0.0}
        self._stats = {"accepted": 0, "dropped_responses": 0, "cut_responses": 0, "reset": 0,
                       "upstream_failures": 0}

    # -- info ----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError("start() the proxy first")
        return int(self._listener.getsockname()[1])

    @property
    def host(self) -> str:
        return self.listen_host

    @property
    def address(self) -> tuple[str, int]:
        return (self.listen_host, self.port)

    @property
    def endpoint_url(self) -> str:
        """``http://HOST:PORT`` (for an HTTP server such as S3)."""
        return f"http://{self.listen_host}:{self.port}"

    def redis_url(self, db: int = 0) -> str:
        return f"redis://{self.listen_host}:{self.port}/{db}"

    def stats(self) -> dict[str, int]:
        """Counters: accepted, active, dropped_responses, reset, upstream_failures."""
        return self._call(lambda: {**self._stats, "active": len(self._conns)})

    @property
    def active_connections(self) -> int:
        return int(self.stats()["active"])

    def __repr__(self) -> str:
        where = f"{self.listen_host}:{self._listener.getsockname()[1]}" if self._listener else "-"
        return f"<TcpProxy {self.name} {where} -> {self.upstream[0]}:{self.upstream[1]}>"

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> TcpProxy:
        if self._thread is not None:
            return self
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.listen_host, self._listen_port))
            listener.listen(128)
            listener.setblocking(False)
            wake_r, wake_w = socket.socketpair()
        except BaseException:
            listener.close()
            raise
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        self._listener, self._wake_r, self._wake_w = listener, wake_r, wake_w
        self._sel = selectors.DefaultSelector()
        self._sel.register(listener, selectors.EVENT_READ, "listen")
        self._sel.register(wake_r, selectors.EVENT_READ, "wake")
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"TcpProxy-{self.name}", daemon=True)
        self._thread.start()
        _LIVE.add(self)
        return self

    def stop(self) -> None:
        """Close every socket and join the loop thread. Idempotent."""
        thread = self._thread
        if thread is None:
            return
        self._stopping = True
        self._wake()
        thread.join(timeout=10)
        self._thread = None
        _LIVE.discard(self)
        # fail any caller still waiting on a command
        while True:
            try:
                _, _, done = self._commands.get_nowait()
            except queue.Empty:
                break
            done.set()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults --------------------------------------------------------------------------

    def drop_next_response(self, n: int = 1) -> None:
        """The next ``n`` responses are swallowed and their connections closed."""
        self._arm("_drops_pending", n)

    def cut_next_response(self, n: int = 1) -> None:
        """The next ``n`` responses: their head and half their body, then a reset."""
        self._arm("_cuts_pending", n)

    def _arm(self, counter: str, n: int) -> None:
        """Add ``n`` to a fault's count of responses still to meet it, on the loop thread."""
        if n < 1:
            raise ValueError("n must be >= 1")
        self._call(lambda: setattr(self, counter, getattr(self, counter) + n))

    def blackhole(self) -> None:
        """Accept connections but never forward anything again, until :meth:`heal`."""

        def go() -> None:
            self._blackhole = True
            for conn in self._conns.values():
                conn.doomed = True
                conn.sniff = b""
                for pending in conn.out.values():
                    pending.clear()

        self._call(go)

    def delay(self, seconds: float, direction: str = "both") -> None:
        """Hold each chunk ``seconds`` before sending it on (``request``/``response``/``both``)."""
        if direction not in ("request", "response", "both"):
            raise ValueError("direction must be 'request', 'response' or 'both'")
        if seconds < 0:
            raise ValueError("seconds must be >= 0")

        def go() -> None:
            for d in ("request", "response"):
                if direction in (d, "both"):
                    self._delay[d] = float(seconds)

        self._call(go)

    def reset_connections(self) -> int:
        """RST every open connection (both sides). Returns how many were reset."""

        def go() -> int:
            conns = list(self._conns.values())
            for conn in conns:
                self._close(conn, rst=True)
            self._stats["reset"] += len(conns)
            return len(conns)

        return int(self._call(go))

    def heal(self) -> None:
        """Plain pass-through again; connections blackholed so far are reset."""

        def go() -> None:
            self._blackhole = False
            self._drops_pending = 0
            self._cuts_pending = 0
            self._delay = {"request": 0.0, "response": 0.0}
            now = time.monotonic()
            for conn in list(self._conns.values()):
                if conn.doomed:
                    self._close(conn, rst=True)
                    self._stats["reset"] += 1
                elif conn.sniff:
                    self._enqueue(conn, conn.client, conn.sniff, now)
                    conn.sniff = b""

        self._call(go)

    # -- loop plumbing -------------------------------------------------------------------

    def _wake(self) -> None:
        if self._wake_w is not None:
            try:
                self._wake_w.send(b"x")
            except (BlockingIOError, OSError):
                pass  # already awake / closing

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the loop thread and return its result."""
        if self._thread is None or threading.current_thread() is self._thread:
            return fn()
        result: list[Any] = []
        done = threading.Event()
        self._commands.put((fn, result, done))
        self._wake()
        if not done.wait(timeout=10):
            raise RuntimeError(f"{self!r}: loop thread did not answer")
        if self._error is not None:
            raise RuntimeError(f"{self!r}: loop thread died") from self._error
        if result and isinstance(result[0], BaseException):
            raise result[0]
        return result[0] if result else None

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._run_commands()
                timeout = self._update_interest(time.monotonic())
                assert self._sel is not None
                for key, mask in self._sel.select(timeout):
                    tag = key.data
                    if tag == "listen":
                        self._accept()
                    elif tag == "wake":
                        self._drain_wake()
                    else:
                        conn: _Conn = tag
                        sock: socket.socket = key.fileobj  # type: ignore[assignment]
                        if conn.closed:
                            continue
                        if mask & selectors.EVENT_READ:
                            self._on_readable(conn, sock)
                        if not conn.closed and mask & selectors.EVENT_WRITE:
                            self._flush(conn, sock, time.monotonic())
        except BaseException as exc:  # pragma: no cover - a bug in the proxy itself
            self._error = exc
            raise
        finally:
            self._shutdown_sockets()

    def _run_commands(self) -> None:
        while True:
            try:
                fn, result, done = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                result.append(fn())
            except BaseException as exc:
                result.append(exc)
            done.set()

    def _drain_wake(self) -> None:
        assert self._wake_r is not None
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _shutdown_sockets(self) -> None:
        for conn in list(self._conns.values()):
            self._close(conn, rst=False)
        for sock in (self._listener, self._wake_r, self._wake_w):
            if sock is not None:
                try:
                    if self._sel is not None:
                        self._sel.unregister(sock)
                except (KeyError, ValueError):
                    pass
                sock.close()
        if self._sel is not None:
            self._sel.close()
        self._listener = self._wake_r = self._wake_w = None
        self._sel = None
        self._run_commands()  # release anyone who queued a command meanwhile

    # -- per-connection work -------------------------------------------------------------

    def _accept(self) -> None:
        assert self._listener is not None and self._sel is not None
        while True:
            try:
                client, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._stats["accepted"] += 1
            upstream: socket.socket | None = None
            if not self._blackhole:
                try:
                    upstream = socket.create_connection(self.upstream, timeout=self.connect_timeout)
                    upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    upstream.setblocking(False)
                except OSError:
                    # the server is down: the client sees its connection reset
                    self._stats["upstream_failures"] += 1
                    _rst_close(client)
                    continue
            client.setblocking(False)
            self._next_id += 1
            conn = _Conn(self._next_id, client, upstream)
            self._conns[conn.id] = conn

    def _on_readable(self, conn: _Conn, sock: socket.socket) -> None:
        try:
            data = sock.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn, rst=True)  # pass a reset on as a reset
            return
        now = time.monotonic()
        if not data:
            conn.read_eof[sock] = True
            if conn.doomed:
                if sock is conn.client:
                    self._close(conn, rst=False)
                return
            peer = conn.peer(sock)
            if peer is not None:
                if sock is conn.upstream and conn.sniff:
                    self._enqueue(conn, peer, conn.sniff, now)
                    conn.sniff = b""
                conn.out[peer].append((now + self._delay_for(peer, conn), _EOF))
            self._maybe_finish(conn)
            return
        if conn.doomed or self._blackhole:
            conn.doomed = True
            return  # swallowed
        if sock is conn.upstream and (self._drops_pending > 0 or self._cuts_pending > 0 or conn.sniff):
            buf, conn.sniff = conn.sniff + data, b""
            if self._drops_pending <= 0 and self._cuts_pending <= 0:
                self._enqueue(conn, conn.client, buf, now)
                return
            interim, rest, verdict = _interim_split(buf)
            if interim:
                self._enqueue(conn, conn.client, interim, now)
            if verdict == "final" and self._drops_pending <= 0:
                head = rest.find(b"\r\n\r\n")
                if head >= 0 and b"\ncontent-length: 0\r" in rest[:head + 2].lower():
                    self._enqueue(conn, conn.client, rest, now)  # no body to cut: the next one
                    return
                if head < 0 or len(rest) < head + 6:
                    conn.sniff = rest  # the head and two body bytes, at least: read more
                    return
                self._cuts_pending -= 1
                self._stats["cut_responses"] += 1
                cut = head + 4 + (len(rest) - head - 4) // 2
                conn.doomed = True  # whatever else the server sends is swallowed
                conn.out[conn.client].append((now, rest[:cut]))
                conn.out[conn.client].append((now + _CUT_HOLD_S, _RST))
                self._flush(conn, conn.client, now)
            elif verdict == "final":
                self._drops_pending -= 1
                self._stats["dropped_responses"] += 1
                self._close(conn, rst=False)
            elif verdict == "wait":
                conn.sniff = rest
            return
        peer = conn.peer(sock)
        assert peer is not None
        self._enqueue(conn, peer, data, now)

    def _delay_for(self, dest: socket.socket, conn: _Conn) -> float:
        return self._delay["response"] if dest is conn.client else self._delay["request"]

    def _enqueue(self, conn: _Conn, dest: socket.socket, data: bytes, now: float) -> None:
        conn.out[dest].append((now + self._delay_for(dest, conn), data))
        self._flush(conn, dest, now)

    def _flush(self, conn: _Conn, dest: socket.socket, now: float) -> None:
        pending = conn.out[dest]
        while pending and not conn.closed:
            due, data = pending[0]
            if due > now:
                return
            if data is _RST:
                pending.popleft()
                self._close(conn, rst=True)
                return
            if data is _EOF:
                pending.popleft()
                try:
                    dest.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                conn.shut[dest] = True
                self._maybe_finish(conn)
                return
            assert data is not None
            try:
                sent = dest.send(data)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._close(conn, rst=True)
                return
            if sent < len(data):
                pending[0] = (due, data[sent:])
                return
            pending.popleft()

    def _maybe_finish(self, conn: _Conn) -> None:
        if conn.closed:
            return
        if all(conn.read_eof.values()) and all(conn.shut.values()):
            self._close(conn, rst=False)

    def _close(self, conn: _Conn, *, rst: bool) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._conns.pop(conn.id, None)
        for sock in conn.sockets():
            if self._sel is not None:
                try:
                    self._sel.unregister(sock)
                except (KeyError, ValueError):
                    pass
            if rst:
                _rst_close(sock)
            else:
                sock.close()

    def _update_interest(self, now: float) -> float:
        """Send what is due, (re)register each socket for what it needs, return the timeout."""
        assert self._sel is not None
        next_due = now + 0.5
        for conn in list(self._conns.values()):
            for sock in conn.sockets():
                if not conn.closed:
                    self._flush(conn, sock, now)
            if conn.closed:
                continue
            for sock in conn.sockets():
                peer = conn.peer(sock)
                events = 0
                if not conn.read_eof[sock] and (peer is None or conn.backlog(peer) < _BACKLOG_LIMIT):
                    events |= selectors.EVENT_READ
                pending = conn.out[sock]
                if pending:
                    due = pending[0][0]
                    if due <= now:
                        events |= selectors.EVENT_WRITE  # the socket buffer is full: wait
                    else:
                        next_due = min(next_due, due)
                self._set_events(sock, events, conn)
        return max(0.0, next_due - now)

    def _set_events(self, sock: socket.socket, events: int, conn: _Conn) -> None:
        assert self._sel is not None
        try:
            key = self._sel.get_key(sock)
        except KeyError:
            if events:
                self._sel.register(sock, events, conn)
            return
        if not events:
            self._sel.unregister(sock)
        elif key.events != events:
            self._sel.modify(sock, events, conn)


def _rst_close(sock: socket.socket) -> None:
    """Close with RST instead of FIN (SO_LINGER on, timeout 0)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()
