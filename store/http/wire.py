"""The wire of the Durable Streams protocol: what a request's headers, query and body mean,
and how an answer is written (problem documents, bodies, SSE events, the CDN cursor).

Pure functions of their arguments, no store and no service: every integer a stream request
carries is read by ``uint`` (a number of thousands of digits is refused by its length), a
refusal is ``HttpError`` with its status, and ``store/http/app.py`` (the routes) turns it
into a problem document.
"""

from __future__ import annotations

import base64
import random
import re
import time
from datetime import datetime
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.responses import Response, StreamingResponse

from store.http.guard import problem_body
from store.model.js_json import encode_json
from store.streams import Batch, Offset, Producer, StreamInfo, is_json_type, media_type

STREAM_ROOT = "/v1/stream/"

OFFSET_PARAM = re.compile(r"-1|now|\d+_\d+")
_UINT = re.compile(r"0|[1-9]\d*")
_DIGITS = re.compile(r"\d+")
_MAX_SAFE_INT = 2**53 - 1
_MAX_TTL_S = 2**53 // 1000 // 2
_CURSOR_EPOCH_S = datetime.fromisoformat("2024-10-09T00:00:00+00:00").timestamp()
_CURSOR_INTERVAL_S = 20


class HttpError(Exception):
    """A refusal of the wire layer itself (bad header, bad body) with its status."""

    def __init__(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = headers or {}


class ClientGone(Exception):
    """The client disconnected before its request's body ended."""


def problem_response(status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> Response:
    """An RFC 9457 problem document naming the error class."""
    body = problem_body(status, code, detail)
    all_headers = {"content-type": "application/problem+json"}
    all_headers.update(headers or {})
    return Response(body, status_code=status, headers=all_headers)


def stream_name(value: str) -> str:
    """The name of a stream given by path (``/v1/stream/<name>``) or URL."""
    if "://" in value:
        value = "/" + value.split("://", 1)[1].partition("/")[2]
    if not value.startswith(STREAM_ROOT) or len(value) == len(STREAM_ROOT):
        raise HttpError(400, "bad-request", f"a stream is named {STREAM_ROOT}<name>")
    return value[len(STREAM_ROOT):]


def parse_if_match(value: str | None) -> str | None:
    """``If-Match: "<tail>"``: the tail an append expects, an offset (``"-1"``: an empty
    stream) or, for a session, an entry id (``""``: no entry yet)."""
    if value is None:
        return None
    text = value.strip()
    if len(text) < 2 or not (text.startswith('"') and text.endswith('"')):
        raise HttpError(400, "bad-request", 'If-Match is quoted: "<Stream-Next-Offset>" or "<entry id>"')
    return text[1:-1]


def parse_flag(value: str | None) -> bool:
    return value is not None and value.strip().lower() == "true"


def uint(value: str, what: str, largest: int = _MAX_SAFE_INT, *, zeros: bool = False) -> int:
    """``value`` as a non-negative integer of at most ``largest`` (leading zeros only if
    ``zeros``), else 400: every integer of a stream request's headers and query is read here
    (the sessions' routes have theirs), and a number of thousands of digits is refused by
    its length before Python converts it."""
    if not (_DIGITS if zeros else _UINT).fullmatch(value):
        raise HttpError(400, "bad-request", f"{what} is an integer from 0 to {largest}")
    digits = value.lstrip("0") or "0"
    if len(digits) > len(str(largest)) or int(digits) > largest:
        raise HttpError(400, "bad-request", f"{what} is an integer from 0 to {largest}")
    return int(digits)


def parse_ttl(value: str | None) -> int | None:
    if value is None:
        return None
    # Seconds: at most 2^53 ms, halved, so that any clock plus it stays an exact integer.
    return uint(value, "Stream-TTL", _MAX_TTL_S)


def parse_expires_at(value: str | None) -> tuple[str | None, int | None]:
    if value is None:
        return None, None
    text = value.strip()
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise HttpError(400, "bad-request", "Stream-Expires-At is an RFC 3339 timestamp") from None
    if when.tzinfo is None or "T" not in text.upper():
        raise HttpError(400, "bad-request", "Stream-Expires-At needs a date, a time and a zone")
    return value, int(when.timestamp() * 1000)


def parse_producer(h: Any) -> Producer | None:
    pid, epoch, seq = h.get("producer-id"), h.get("producer-epoch"), h.get("producer-seq")
    given = [v is not None for v in (pid, epoch, seq)]
    if not any(given):
        return None
    if not all(given):
        raise HttpError(400, "bad-request", "Producer-Id, Producer-Epoch and Producer-Seq go together")
    if not pid:
        raise HttpError(400, "bad-request", "Producer-Id is empty")
    return Producer(pid, uint(epoch, "Producer-Epoch", zeros=True), uint(seq, "Producer-Seq", zeros=True))


def parse_messages(body: bytes, content_type: str | None, *, allow_empty_array: bool) -> list[Any]:
    """A request body as the messages of one append: a JSON body's values (an array is
    flattened one level), any other body as one message."""
    if content_type is None or not is_json_type(content_type):
        return [body]
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise HttpError(400, "invalid-json", f"the body is not JSON: {exc}") from None
    if isinstance(value, list):
        if not value and not allow_empty_array:
            raise HttpError(400, "empty-body", "an empty JSON array appends nothing")
        return value
    return [value]


#: A binary read's body goes out in pieces of about this size (small messages joined).
BODY_PIECE = 256 << 10


def body_of(info: StreamInfo, batches: list[Batch]) -> list[bytes]:
    """A read's body, in pieces: a JSON stream's as one array; any other stream's as its
    messages (small ones joined into pieces of about ``BODY_PIECE``), sent one after
    another (``body_response``): a catch-up answer of up to 4 MiB is not copied once more
    into one object, which each of the service's threads would leave in its own malloc
    arena after the answer is gone."""
    if info.config.json:
        # One call for the whole body (a session's entries may hold lone surrogates, as pi
        # writes them: encode_json writes those as JSON.stringify does).
        return [encode_json([m for b in batches for m in b.messages])]
    pieces: list[bytes] = []
    small: list[bytes] = []  # consecutive small messages, sent as one piece
    small_bytes = 0
    for m in (m for b in batches for m in b.messages):
        if len(m) >= BODY_PIECE:
            if small:
                pieces.append(b"".join(small))
                small, small_bytes = [], 0
            pieces.append(m)
            continue
        small.append(m)
        small_bytes += len(m)
        if small_bytes >= BODY_PIECE:
            pieces.append(b"".join(small))
            small, small_bytes = [], 0
    if small:
        pieces.append(b"".join(small))
    return pieces


def body_response(body: list[bytes], headers: dict[str, str]) -> Response:
    """A 200 with ``body``'s pieces, their total as its Content-Length."""
    if len(body) <= 1:
        return Response(body[0] if body else b"", status_code=200, headers=headers)
    headers["Content-Length"] = str(sum(len(piece) for piece in body))

    async def pieces() -> AsyncIterator[bytes]:
        for piece in body:
            yield piece

    return StreamingResponse(pieces(), status_code=200, headers=headers)


def next_cursor(client: str | None) -> str:
    """The CDN-collapsing cursor of the protocol: the current 20 s interval, or strictly
    past the client's when the client is already there."""
    current = int((time.time() - _CURSOR_EPOCH_S) // _CURSOR_INTERVAL_S)
    if client is not None and _DIGITS.fullmatch(client):  # any other cursor is not ours
        theirs = uint(client, "cursor", zeros=True)
        if theirs >= current:
            return str(theirs + max(1, -(-random.randint(1, 3600) // _CURSOR_INTERVAL_S)))
    return str(current)


def sse_base64(content_type: str) -> bool:
    mt = media_type(content_type)
    return not (mt.startswith("text/") or mt == "application/json")


_NEWLINES = re.compile(r"\r\n|\r|\n")


def sse_data(info: StreamInfo, batch: Batch, b64: bool) -> bytes:
    if info.config.json:
        text = encode_json(batch.messages).decode()
    elif b64:
        text = base64.b64encode(b"".join(batch.messages)).decode("ascii")
    else:
        text = b"".join(batch.messages).decode("utf-8", "replace")
    lines = "".join(f"data:{line}\n" for line in _NEWLINES.split(text))
    return f"event: data\n{lines}\n".encode()


def sse_control(end: Offset, cursor: str, *, up_to_date: bool, closed: bool) -> bytes:
    ctrl: dict[str, Any] = {"streamNextOffset": str(end)}
    if closed:
        ctrl["streamClosed"] = True
    else:
        ctrl["streamCursor"] = cursor
    if up_to_date:
        ctrl["upToDate"] = True
    return b"event: control\ndata:" + orjson.dumps(ctrl) + b"\n\n"


__all__ = [
    "OFFSET_PARAM", "STREAM_ROOT", "ClientGone", "HttpError", "body_of", "body_response", "next_cursor", "parse_expires_at",
    "parse_flag", "parse_if_match", "parse_messages", "parse_producer", "parse_ttl", "problem_response",
    "sse_base64", "sse_control", "sse_data", "stream_name", "uint",
]
