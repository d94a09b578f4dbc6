"""Which filesystem a local store is on, and whether it keeps the power-loss promise
(store/backends/filesystems.py), and ``sessionstore doctor``'s check of it for a local directory."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from store.cli import main
from store.backends.filesystems import ext4_journal, mount_of, parse_mountinfo, verdict

# Real lines' shape (fields: id, parent, major:minor, root, mount point, options, optional
# fields, "-", type, source, super options); a space in a path is written \040.
MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
23 22 0:21 / /proc rw,nosuid - proc proc rw
24 22 0:5 / /dev/shm rw,nosuid,nodev shared:3 - tmpfs tmpfs rw
25 22 8:2 / /mnt/data rw,relatime - xfs /dev/sda2 rw,attr2
26 22 8:3 / /mnt/old rw - ext2 /dev/sda3 rw
27 22 8:4 / /mnt/my\\040disk rw - btrfs /dev/sda4 rw
28 22 0:40 / /mnt/data rw - overlay overlay rw,lowerdir=/a,upperdir=/b,workdir=/c
29 22 8:5 / /srv rw - ext4 /dev/sda5 rw
30 22 8:6 / /mnt/fat rw - vfat /dev/sda6 rw
this line is not a mount
"""


def test_mountinfo_is_parsed_with_its_escapes() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    assert len(mounts) == 9  # the malformed line is skipped
    assert mounts[0].mount_point == "/" and mounts[0].fs_type == "ext4" and mounts[0].device == "8:1"
    assert mounts[5].mount_point == "/mnt/my disk" and mounts[5].fs_type == "btrfs"
    odd = parse_mountinfo("1 0 8:1 / /a\\089\\134b\\011 rw - ext4 /dev/x rw\n")
    assert odd[0].mount_point == "/a\\089\\b\t"  # not an octal escape: kept as it is


@pytest.mark.parametrize(
    ("path", "fs_type"),
    [
        ("/", "ext4"),
        ("/home/me/project/.sessionstore", "ext4"),
        ("/dev/shm/store", "tmpfs"),
        ("/mnt/data", "overlay"),  # two mounts on one point: the later one is on top
        ("/mnt/data/x/y", "overlay"),
        ("/mnt/database", "ext4"),  # a sibling whose name starts like a mount point: not in it
        ("/mnt/my disk/store", "btrfs"),
        ("/srv/store", "ext4"),
    ],
)
def test_the_mount_of_a_path_is_the_longest_mount_point_above_it(path: str, fs_type: str) -> None:
    mount = mount_of(path, parse_mountinfo(MOUNTINFO))
    assert mount is not None and mount.fs_type == fs_type


def _sysfs(tmp_path: Path, device: str, name: str, journal_task: str | None) -> str:
    """A sysfs tree of one block device: /dev/block/<maj:min> -> .../<name>, and ext4's
    journal_task for it (None: no ext4 entry)."""
    (tmp_path / "devices" / name).mkdir(parents=True)
    (tmp_path / "dev" / "block").mkdir(parents=True)
    os.symlink(f"../../devices/{name}", tmp_path / "dev" / "block" / device)
    if journal_task is not None:
        (tmp_path / "fs" / "ext4" / name).mkdir(parents=True)
        (tmp_path / "fs" / "ext4" / name / "journal_task").write_text(journal_task + "\n")
    return str(tmp_path)


def test_an_ext4_journal_is_read_from_sysfs(tmp_path: Path) -> None:
    assert ext4_journal("8:5", _sysfs(tmp_path / "a", "8:5", "sda5", "<none>")) is False
    assert ext4_journal("8:5", _sysfs(tmp_path / "b", "8:5", "sda5", "812")) is True
    assert ext4_journal("8:5", _sysfs(tmp_path / "c", "8:5", "sda5", None)) is None
    assert ext4_journal("8:9", str(tmp_path / "c")) is None  # no such device


@pytest.mark.parametrize(
    ("path", "journal_task", "status", "words"),
    [
        ("/srv/store", "<none>", "warn", "ext4 at /srv without a journal"),
        ("/srv/store", "812", "ok", "ext4 at /srv, journaled"),
        ("/srv/store", None, "unknown", "whether it has a journal was not readable"),
        ("/dev/shm/store", "812", "warn", "tmpfs at /dev/shm: kept in memory"),
        ("/mnt/old/store", "812", "warn", "ext2 at /mnt/old: no journal"),
        ("/mnt/fat/store", "812", "warn", "vfat at /mnt/fat: no journal"),
        ("/mnt/my disk/store", "812", "ok", "btrfs at /mnt/my disk: acknowledged objects survive"),
        ("/mnt/data/store", "812", "unknown", "overlay at /mnt/data: not checked"),
    ],
)
def test_verdicts(tmp_path: Path, path: str, journal_task: str | None, status: str, words: str) -> None:
    sys_root = _sysfs(tmp_path, "8:5", "sda5", journal_task)
    found = verdict(path, mountinfo=MOUNTINFO, sys_root=sys_root)
    assert found.status == status and words in found.detail, found


def test_fsync_off_is_a_warning_wherever_the_store_is() -> None:
    found = verdict("/mnt/my disk/store", fsync=False, mountinfo=MOUNTINFO)
    assert found.status == "warn" and "fsync is off" in found.detail


def test_no_mount_found_is_not_checked() -> None:
    assert verdict("/anything", mountinfo="").status == "unknown"


# --- doctor, on this machine's real filesystems ----------------------------------------------


def _doctor(capsys: pytest.CaptureFixture[str], objects: Path, redis_url: str, prefix: str) -> dict[str, dict[str, str]]:
    capsys.readouterr()
    code = main(["--objects", str(objects), "--redis", redis_url, "--redis-prefix", prefix, "doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code in (0, 1)
    return {c["name"]: c for c in report["checks"]}


def test_doctor_reports_the_durability_of_a_local_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], redis_url: str, redis_prefix: str
) -> None:
    store_dir = tmp_path / "store"
    checks = _doctor(capsys, store_dir, redis_url, redis_prefix)
    found = verdict(store_dir)  # what this machine's /proc and /sys say of it
    assert checks["objects: durability"] == {
        "name": "objects: durability",
        "status": "warn" if found.status == "warn" else "ok",
        "detail": found.detail,
    }
    mount = mount_of(store_dir, parse_mountinfo(Path("/proc/self/mountinfo").read_text()))
    assert mount is not None and mount.fs_type in checks["objects: durability"]["detail"]
    assert checks["objects: backend"]["detail"].startswith("file backend")


def test_doctor_warns_of_a_store_in_memory(
    capsys: pytest.CaptureFixture[str], redis_url: str, redis_prefix: str
) -> None:
    shm = mount_of("/dev/shm", parse_mountinfo(Path("/proc/self/mountinfo").read_text()))
    assert shm is not None and shm.fs_type == "tmpfs", "this test needs /dev/shm to be a tmpfs, as on Linux"
    store_dir = Path("/dev/shm") / f"sessionstore-test-{redis_prefix}"
    try:
        checks = _doctor(capsys, store_dir, redis_url, redis_prefix)
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)
    assert checks["objects: durability"]["status"] == "warn"
    assert "tmpfs at /dev/shm: kept in memory, nothing survives a reboot" in checks["objects: durability"]["detail"]
