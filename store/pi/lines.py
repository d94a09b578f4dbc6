"""Where a pi file's lines come from: paths, bytes, ``str`` and streams, read once or again.

A one-pass read (``read_pi_file``) takes the lines once (:func:`lines_once`, :func:`iter_items`).
A streaming read (``scan_pi_file`` then ``iter_pi_entries``) needs the very same lines more than
once: :func:`replayable` gives a :class:`Replay` that splits in-memory content again, re-reads a
path or a seekable stream (verified line by line) or spools any other stream to a temporary
file. Lines are split on ``"\\n"`` only, whatever the read chunks are.
"""

from __future__ import annotations

import os
import tempfile
import zlib
from array import array
from collections.abc import Iterable, Iterator
from typing import IO, Any, Final, cast

from store.errors import InvalidInputError
from store.model.js import js_trim_start

__all__ = ["Once", "PiSource", "Replay", "iter_items", "lines_once", "replayable"]

_READ_CHUNK: Final = 1 << 20


def _iter_split(data: str | bytes, sep: str | bytes) -> Iterator[Any]:
    start = 0
    while True:
        end = data.find(sep, start)  # type: ignore[arg-type]
        if end < 0:
            yield data[start:]
            return
        yield data[start:end]
        start = end + 1


def iter_items(lines: Iterable[bytes | bytearray | memoryview | str]) -> Iterator[bytes | str]:
    """Lines from items that are each one or more complete lines (a trailing "\\n" optional)."""
    for item in lines:
        if isinstance(item, str):
            item = item.removesuffix("\n")
            if "\n" in item:
                yield from _iter_split(item, "\n")
            else:
                yield item
        else:
            data = bytes(item) if not isinstance(item, bytes) else item
            if data.endswith(b"\n"):
                data = data[:-1]
            if b"\n" in data:
                yield from _iter_split(data, b"\n")
            else:
                yield data


# --- line sources --------------------------------------------------------------------------------


def _read_chunks(handle: IO[Any], limit: int | None = None) -> Iterator[Any]:
    """``handle.read()`` in 1 MiB chunks; at most ``limit`` units (bytes, or characters of a
    text stream) when given."""
    remaining = limit
    while remaining is None or remaining > 0:
        chunk = handle.read(_READ_CHUNK if remaining is None else min(_READ_CHUNK, remaining))
        if not chunk:
            return
        if remaining is not None:
            remaining -= len(chunk)
        yield chunk


def _split_chunks(chunks: Iterable[Any]) -> Iterator[bytes | str]:
    """Lines of a text given in chunks (all bytes or all str), split on "\\n" only, whatever
    the chunk boundaries are."""
    pending: list[Any] = []
    for chunk in chunks:
        sep: Any = "\n" if isinstance(chunk, str) else b"\n"
        start = 0
        while True:
            end = chunk.find(sep, start)
            if end < 0:
                if start < len(chunk):
                    pending.append(chunk[start:])
                break
            piece = chunk[start:end]
            if pending:
                pending.append(piece)
                yield piece[:0].join(pending)
                pending = []
            else:
                yield piece
            start = end + 1
    if pending:
        yield pending[0][:0].join(pending)


def _iter_stream(stream: IO[bytes] | IO[str]) -> Iterator[bytes | str]:
    """Lines of a readable stream, split on "\\n" only, whatever the read chunks are."""
    return _split_chunks(_read_chunks(stream))


PiSource = str | os.PathLike[str] | bytes | bytearray | memoryview | IO[bytes] | IO[str]


def _is_path(source: object) -> bool:
    return isinstance(source, os.PathLike) or (
        isinstance(source, str) and _looks_like_path(source)
    )


def _looks_like_path(text: str) -> bool:
    return "\n" not in text and not js_trim_start(text).startswith("{") and text != ""


def lines_once(source: PiSource) -> Iterator[bytes | str]:
    """The lines of ``source``, read once (see :func:`store.pi.scan.read_pi_file` for the
    kinds of source)."""
    if _is_path(source):
        with open(source, "rb") as handle:  # type: ignore[arg-type]
            # Binary file iteration splits on b"\n" only: each line is complete.
            for line in handle:
                yield line[:-1] if line.endswith(b"\n") else line
    elif isinstance(source, (bytes, bytearray, memoryview)):
        yield from _iter_split(bytes(source), b"\n")
    elif isinstance(source, str):
        yield from _iter_split(source, "\n")
    elif hasattr(source, "read"):
        yield from _iter_stream(cast(IO[Any], source))
    else:
        raise TypeError(f"cannot read a pi file from {type(source).__name__}")


class Replay:
    """The lines of a pi file, for a scan that reads them more than once (and pass 2).

    Every read must give exactly the lines of the first one: minted ids, collapsed
    duplicates and every check of pass 1 are about those lines.
    """

    def lines(self) -> Iterator[bytes | str]:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the source holds (a spooled copy); nothing by default."""


class Once(Replay):
    """Lines that can be read only once: for the one-pass readers."""

    def __init__(self, lines: Iterator[bytes | str]) -> None:
        self._lines: Iterator[bytes | str] | None = lines

    def lines(self) -> Iterator[bytes | str]:
        lines, self._lines = self._lines, None
        if lines is None:
            raise RuntimeError("these lines can be read only once")
        return lines


class _InMemory(Replay):
    """Content the caller passed (bytes or str): immutable, so simply split again."""

    def __init__(self, data: bytes | str) -> None:
        self._data = data

    def lines(self) -> Iterator[bytes | str]:
        return _iter_split(self._data, b"\n" if isinstance(self._data, bytes) else "\n")


class _Reread(Replay):
    """A path, or a seekable stream, read again from where the first read began.

    Later reads stop at the length the first read saw: pi appends to a live session file,
    and lines appended between the passes are not part of this import. Every line is
    compared with a CRC-32 taken by the first read (4 bytes a line), so that a file that was
    rewritten in between (pi rewrites old files when it migrates them) is refused instead of
    mixing two versions.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None, stream: IO[Any] | None, start: int = 0
    ) -> None:
        self._path = path
        self._stream = stream
        self._start = start
        self._length: int | None = None  # set once a first read has completed
        self._crcs = array("I")

    def lines(self) -> Iterator[bytes | str]:
        if self._path is not None:
            with open(self._path, "rb") as handle:
                yield from self._read(handle)
        else:
            assert self._stream is not None
            yield from self._read(self._stream)

    def _read(self, handle: IO[Any]) -> Iterator[bytes | str]:
        if self._stream is not None:
            handle.seek(self._start)
        length = self._length
        if length is None:
            yield from self._first_read(handle)
            return
        crcs = self._crcs
        count = 0
        for line in _split_chunks(_read_chunks(handle, length)):
            if count >= len(crcs) or _crc(line) != crcs[count]:
                raise self._changed(count + 1)
            count += 1
            yield line
        if count != len(crcs):
            raise self._changed(count + 1)

    def _first_read(self, handle: IO[Any]) -> Iterator[bytes | str]:
        length = 0
        crcs = array("I")

        def counted() -> Iterator[Any]:
            nonlocal length
            for chunk in _read_chunks(handle):
                length += len(chunk)
                yield chunk

        for line in _split_chunks(counted()):
            crcs.append(_crc(line))
            yield line
        self._length, self._crcs = length, crcs

    def _changed(self, lineno: int) -> InvalidInputError:
        what = os.fspath(self._path) if self._path is not None else "the stream"
        return InvalidInputError(
            f"{what}: the file changed while it was being read (line {lineno} is not what "
            "the first pass read); import it again once nothing rewrites it"
        )


def _crc(line: bytes | str) -> int:
    data = line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass")
    return zlib.crc32(data)


class _Spool(Replay):
    """A stream that cannot be read twice (a pipe, stdin): the first read copies it to an
    anonymous temporary file (disk, not memory), which later reads use."""

    def __init__(self, stream: IO[Any]) -> None:
        self._stream = stream
        self._copy: IO[Any] | None = None
        self._complete = False
        self._closed = False

    def lines(self) -> Iterator[bytes | str]:
        if self._closed:
            raise ValueError("the scan was closed: its copy of the stream is gone")
        if not self._complete:
            return _split_chunks(self._tee())
        if self._copy is None:
            return iter(())  # the stream was empty
        self._copy.seek(0)
        return _split_chunks(_read_chunks(self._copy))

    def _tee(self) -> Iterator[Any]:
        for chunk in _read_chunks(self._stream):
            if self._copy is None:
                # Text is kept as text (newline="" translates nothing), so that later reads
                # give the very same str lines, lone surrogates included.
                # Closed by close(): it has to outlive this read (noqa SIM115).
                self._copy = (
                    tempfile.TemporaryFile(  # noqa: SIM115
                        "w+", encoding="utf-8", errors="surrogatepass", newline=""
                    )
                    if isinstance(chunk, str)
                    else tempfile.TemporaryFile("w+b")  # noqa: SIM115
                )
            self._copy.write(chunk)
            yield chunk
        if self._copy is not None:
            self._copy.flush()
        self._complete = True

    def close(self) -> None:
        self._closed = True
        if self._copy is not None:
            self._copy.close()
            self._copy = None


def replayable(source: PiSource) -> Replay:
    if _is_path(source):
        return _Reread(source, None)  # type: ignore[arg-type]
    if isinstance(source, (bytes, str)):
        return _InMemory(source)
    if isinstance(source, (bytearray, memoryview)):
        # A snapshot: the caller's buffer could change between the passes.
        return _InMemory(bytes(source))
    if hasattr(source, "read"):
        stream = cast(IO[Any], source)
        try:
            start = stream.tell() if stream.seekable() else None
        except (AttributeError, OSError, ValueError):
            start = None  # not seekable after all (tell() refused): spool it
        return _Spool(stream) if start is None else _Reread(None, stream, start)
    raise TypeError(f"cannot read a pi file from {type(source).__name__}")
