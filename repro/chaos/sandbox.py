"""The chaos run's hostile folders: a small filesystem that fills up under the kit, and a folder it cannot write.

Which way each works depends on the machine, and the chaos command says which it used:
- a full disk: a size-limited tmpfs mounted for the run's report folder and TMPDIR (root with CAP_SYS_ADMIN),
  filled to the last byte and inode at the fault's moment; elsewhere RLIMIT_FSIZE 0 set on the running kit
  (every later write past a file's end fails with EFBIG, as on a full disk; its running children keep theirs).
- an unwritable folder: the immutable attribute (`chattr +i`: root cannot write it either), or, for a user
  other than root, the write bits taken away (root ignores them).
"""

from __future__ import annotations

import errno
import os
import resource
import shutil
import subprocess
from pathlib import Path

TMPFS, FSIZE = "tmpfs (size-limited mount)", "RLIMIT_FSIZE 0 on the kit"
IMMUTABLE, READ_ONLY_MODE = "chattr +i (immutable folder)", "chmod a-w"
FILLER = ".kvkit-chaos-filler"
DISK_MIB = 16
DISK_INODES = 2048


def _run(*argv: str) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, check=False, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def disk_mechanism(scratch: Path) -> str:
    """tmpfs where this process may mount one, else RLIMIT_FSIZE."""
    probe = scratch / "mount-probe"
    probe.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") and _run("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)):
        _run("umount", str(probe))
        probe.rmdir()
        return TMPFS
    probe.rmdir()
    return FSIZE


def unwritable_mechanism(scratch: Path) -> str | None:
    """The immutable attribute where it holds, else (not root) the write bits; None: neither stops this user."""
    probe = scratch / "unwritable-probe"
    probe.mkdir(parents=True, exist_ok=True)
    try:
        for mechanism in (IMMUTABLE, READ_ONLY_MODE):
            if not make_unwritable(probe, mechanism):
                continue
            try:
                (probe / "x").touch()
                (probe / "x").unlink()
            except OSError:
                return mechanism
            finally:
                make_writable(probe, mechanism)
        return None
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def make_unwritable(folder: Path, mechanism: str) -> bool:
    if mechanism == IMMUTABLE:
        return shutil.which("chattr") is not None and _run("chattr", "+i", str(folder))
    folder.chmod(0o555)
    return True


def make_writable(folder: Path, mechanism: str) -> None:
    if mechanism == IMMUTABLE:
        _run("chattr", "-i", str(folder))
    else:
        folder.chmod(0o755)


class Disk:
    """A small filesystem at `root` for one run (mounted on entry, unmounted on exit), filled by fill()."""

    def __init__(self, root: Path, mechanism: str):
        self.root = root
        self.mechanism = mechanism
        self.unmounted = True

    def __enter__(self):
        self.root.mkdir(parents=True, exist_ok=True)
        if self.mechanism == TMPFS:
            opts = f"size={DISK_MIB}m,nr_inodes={DISK_INODES},mode=0755"
            if not _run("mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(self.root)):
                raise OSError(f"cannot mount a tmpfs on {self.root}")
            self.unmounted = False
        return self

    def fill(self, pid: int) -> bool:
        """Leave no byte and no inode free (tmpfs), or forbid the kit any write past a file's end."""
        if self.mechanism == FSIZE:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (0, 0))
            return True
        fd = os.open(self.root / FILLER, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            chunk = 1 << 20
            while chunk:
                try:
                    os.write(fd, bytes(chunk))
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    chunk //= 2
        finally:
            os.close(fd)
        for i in range(DISK_INODES):
            try:
                (self.root / f"{FILLER}.{i}").touch()
            except OSError:
                break
        return True

    def __exit__(self, *exc) -> None:
        if not self.unmounted:
            # a process left holding a file there makes it busy: detach it anyway (the orphan is reported)
            self.unmounted = _run("umount", str(self.root)) or _run("umount", "-l", str(self.root))
        shutil.rmtree(self.root, ignore_errors=True)
