"""What filesystem a local store lives on, and whether it keeps the file backend's promise.

``FileObjectStore`` promises that an acknowledged object survives a power loss. The argument
(docs/design.md, "The file backend") leans on two fsyncs and on the filesystem committing its
metadata in order, as the journaling ones do. This module says, for a directory, which
filesystem holds it (``/proc/self/mountinfo``: the mount whose mount point is the longest
prefix of the path) and whether that filesystem can keep the promise:

- memory filesystems (``tmpfs``, ``ramfs``): nothing survives a reboot;
- filesystems without a journal (``ext2``, ``ext4`` made or mounted without one, which
  ``/sys/fs/ext4/<device>/journal_task`` says as ``<none>``, FAT and the like): a power loss
  can leave a name whose inode or directory block was not written with it, until ``fsck``;
- the journaling and copy-on-write ones the argument was made for (``ext4`` with its
  journal, ``ext3``, XFS, btrfs, ZFS, F2FS): kept;
- anything else (an overlay, a network filesystem, ...): not checked, said so.

Read-only and best effort: what cannot be read (no ``/proc``, another operating system) is
"not checked", never an error. ``sessionstore doctor`` reports it for a local store.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_ESCAPE = re.compile(r"\\([0-7]{3})")
#: Filesystems whose metadata is journaled or copy-on-write: the file backend's argument holds.
ORDERED = frozenset({"ext3", "xfs", "btrfs", "zfs", "f2fs", "jfs", "reiserfs", "bcachefs"})
#: Kept in memory only.
MEMORY = frozenset({"tmpfs", "ramfs"})
#: No journal: metadata is written in no particular order.
UNORDERED = frozenset({"ext2", "vfat", "msdos", "exfat", "fat", "ntfs", "ntfs3", "hfsplus", "minix"})


@dataclass(frozen=True, slots=True)
class Mount:
    mount_point: str
    fs_type: str
    #: ``major:minor`` of the device, as ``/proc/self/mountinfo`` gives it.
    device: str
    source: str


@dataclass(frozen=True, slots=True)
class Verdict:
    #: ``ok``, ``warn`` (the promise is not kept here) or ``unknown`` (not checked).
    status: str
    detail: str


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    return _ESCAPE.sub(lambda m: chr(int(m[1], 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a ``/proc/<pid>/mountinfo`` text, in its order (later mounts over earlier
    ones at the same point). Malformed lines are skipped."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 2:
            continue
        mounts.append(Mount(_unescape(fields[4]), tail[0], fields[2], _unescape(tail[1])))
    return mounts


def mount_of(path: str | os.PathLike[str], mounts: list[Mount]) -> Mount | None:
    """The mount that holds ``path`` (made absolute and resolved): the one whose mount point
    is the longest prefix of it, the last such when several are stacked on one point."""
    target = os.path.realpath(path)
    best: Mount | None = None
    best_len = -1
    for m in mounts:
        point = m.mount_point.rstrip("/") or "/"
        holds = point == "/" or target == point or target.startswith(point + "/")
        if holds and len(point) >= best_len:
            best, best_len = m, len(point)
    return best


def ext4_journal(device: str, sys_root: str = "/sys") -> bool | None:
    """Whether the ext4 filesystem on ``device`` (``major:minor``) has a journal: its
    ``journal_task`` in sysfs is ``<none>`` without one. None: not known."""
    try:
        name = Path(os.readlink(f"{sys_root}/dev/block/{device}")).name
        task = Path(f"{sys_root}/fs/ext4/{name}/journal_task").read_text().strip()
    except OSError:
        return None
    return task != "<none>"


def verdict(
    path: str | os.PathLike[str],
    *,
    fsync: bool = True,
    mountinfo: str | None = None,
    sys_root: str = "/sys",
) -> Verdict:
    """Whether a ``FileObjectStore`` at ``path`` keeps its power-loss promise here."""
    if not fsync:
        return Verdict("warn", "fsync is off (fsync=False): a power loss can lose acknowledged appends")
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return Verdict("unknown", "filesystem not checked (no /proc/self/mountinfo)")
    mount = mount_of(path, parse_mountinfo(mountinfo))
    if mount is None:
        return Verdict("unknown", "filesystem not checked (no mount found for the directory)")
    where = f"{mount.fs_type} at {mount.mount_point}"
    if mount.fs_type in MEMORY:
        return Verdict("warn", f"{where}: kept in memory, nothing survives a reboot")
    if mount.fs_type in UNORDERED:
        return Verdict("warn", f"{where}: no journal; a power loss can lose acknowledged objects until fsck")
    if mount.fs_type == "ext4":
        journal = ext4_journal(mount.device, sys_root)
        if journal is False:
            return Verdict("warn", f"{where} without a journal: a power loss can lose acknowledged objects "
                                   "until fsck (docs/design.md, \"The file backend\")")
        if journal is None:
            return Verdict("unknown", f"{where}: whether it has a journal was not readable")
        return Verdict("ok", f"{where}, journaled: acknowledged objects survive a power loss")
    if mount.fs_type in ORDERED:
        return Verdict("ok", f"{where}: acknowledged objects survive a power loss")
    return Verdict("unknown", f"{where}: not checked (the file backend's argument is made for journaling filesystems)")


__all__ = ["MEMORY", "ORDERED", "UNORDERED", "Mount", "Verdict", "ext4_journal", "mount_of", "parse_mountinfo", "verdict"]
