"""Git plumbing for the kit: HEAD's commit, its files and blobs, and the paths with uncommitted changes."""

from __future__ import annotations

import subprocess
from pathlib import Path

from repro.errors import UsageError

LINK_MODE = "120000"
EXECUTABLE_MODE = "100755"


def run_git(root: Path, *args: str) -> bytes:
    """git's stdout; a missing git or a failing command is a one-line UsageError."""
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, check=True, timeout=60).stdout
    except FileNotFoundError:
        raise UsageError("building a kit needs git (not found)") from None
    except subprocess.CalledProcessError as exc:
        msg = exc.stderr.decode(errors="replace").strip().splitlines()
        raise UsageError(
            f"building a kit needs a git checkout: git {args[0]} failed ({msg[-1] if msg else exc.returncode})"
        ) from None


def head_commit(root: Path) -> tuple[str, int]:
    """The full commit hash of HEAD and its committer timestamp (the mtime of every entry)."""
    commit, stamp = run_git(root, "show", "-s", "--format=%H %ct", "HEAD").decode().split()
    return commit, int(stamp)


def committed_files(root: Path, commit: str) -> list[tuple[str, bool]]:
    """(path, executable) of every file of the commit, from `git ls-tree` (ignored junk never enters)."""
    out = []
    for line in run_git(root, "ls-tree", "-r", "-z", "--full-tree", commit).split(b"\0"):
        if not line:
            continue
        meta, path = line.decode().split("\t", 1)
        mode, kind, _ = meta.split()
        if kind == "blob" and mode != LINK_MODE:  # links are not packed: the archive must stand alone
            out.append((path, mode == EXECUTABLE_MODE))
    return sorted(out)


def read_blob(root: Path, commit: str, path: str) -> bytes:
    return run_git(root, "show", f"{commit}:{path}")


def dirty_paths(root: Path) -> list[str]:
    """Tracked paths with uncommitted changes (staged or not), sorted."""
    out = run_git(root, "status", "--porcelain", "--untracked-files=no", "-z").decode()
    return sorted(p[3:] for p in out.split("\0") if len(p) > 3)
