"""The format of a local store's directory, recorded in ``<root>/.format``: a directory
written in another format is refused instead of misread (``store/backends/objects.py`` checks it
before it opens a ``FileObjectStore``).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from store.errors import BackendUnavailableError, UnsupportedFormatError

#: The format of a local store, recorded in ``<root>/.format`` when it is first opened, so that
#: a directory written in another format (the former log backend's ``log1``) is refused
#: instead of misread.
FORMAT_FILES = "files"
_FORMAT_FILE = ".format"


def check_local_format(root: str | os.PathLike[str]) -> None:
    """Record the file backend's format in a new local store at ``root`` (or one made before
    the record existed); ``UnsupportedFormatError`` if the directory records another."""
    path = Path(root).absolute()
    path.mkdir(parents=True, exist_ok=True)
    marker = path / _FORMAT_FILE
    for _ in range(3):
        try:
            held = marker.read_text().strip()
        except FileNotFoundError:
            held = None
        if held:
            if held != FORMAT_FILES:
                raise UnsupportedFormatError(str(path), held)
            return
        dfd = os.open(str(path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            tmp = f".format-{uuid.uuid4().hex}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dfd)
            try:
                with os.fdopen(fd, "wb", closefd=False) as out:
                    out.write(f"{FORMAT_FILES}\n".encode())
                os.fsync(fd)
                try:
                    os.link(tmp, _FORMAT_FILE, src_dir_fd=dfd, dst_dir_fd=dfd)
                except FileExistsError:
                    pass  # another process recorded it first: read again
            finally:
                os.close(fd)
                os.unlink(tmp, dir_fd=dfd)
            os.fsync(dfd)  # the record is durable before the store is used
        finally:
            os.close(dfd)
    raise BackendUnavailableError(f"{marker}: could not be read or made")


__all__ = ["FORMAT_FILES", "check_local_format"]
