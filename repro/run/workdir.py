"""The run's work directory beside the report: made with its owner recorded, removed when the run
ends, and those of kits no longer running (kill -9 leaves them) removed by the next run.

A work directory holds the jobs, results, logs and KV audit tensors of a run (gigabytes on a GPU
box), and its connector stores live in a scratch directory under $TMPDIR that it lists. Its owner
record (`owner.json`, kind "kvkit-work-owner") names the kit's pid and the pid's start time (the
kernel's clock ticks since boot), with the boot, the pid namespace and the host it was made on: a
pid that was reused since, a reboot, or no such process means the kit is gone; a record made on
another host or in another pid namespace is not this run's to judge, and a directory without a
readable record (being made this instant, or left by an older kit) is never touched.

Owner record versions:
  schema_version 1: first version.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

from repro import __version__
from repro.record.atomic import write_json_atomic

OWNER_KIND = "kvkit-work-owner"
OWNER_SCHEMA_VERSION = 1
OWNER_FILE = "owner.json"
_WORK_MARK = ".work-"  # .<report stem>.work-XXXXXXXX


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (/proc/PID/stat field 22); None if there
    is no such live process (a zombie has finished) or /proc cannot say."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # from field 3, the state
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _boot_id() -> str | None:
    text = _read("/proc/sys/kernel/random/boot_id")
    return text.strip() if text else None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def owner_record(scratch: Path | None) -> dict:
    """This process as a work directory's owner, and the scratch directory that goes with it."""
    return {
        "kind": OWNER_KIND,
        "schema_version": OWNER_SCHEMA_VERSION,
        "tool_version": __version__,
        "pid": os.getpid(),
        "start_ticks": start_ticks(os.getpid()),
        "boot_id": _boot_id(),
        "pid_namespace": _pid_namespace(),
        "host": socket.gethostname(),
        "scratch": str(scratch) if scratch is not None else None,
    }


def make_work_dir(report_path: Path) -> tuple[Path, Path]:
    """A new work directory beside the report and a scratch directory for its connector stores under
    $TMPDIR, recorded in the work directory's owner record before anything else is written."""
    work = Path(tempfile.mkdtemp(prefix=f".{report_path.stem}{_WORK_MARK}", dir=report_path.parent))
    scratch = None
    try:
        scratch = Path(tempfile.mkdtemp(prefix=f"kvkit-{work.name.lstrip('.')}-"))
        write_json_atomic(work / OWNER_FILE, owner_record(scratch))
    except BaseException:  # a full disk, an interrupt: no later run could tell whose the folders were
        remove_work_dir(work, scratch)
        raise
    return work, scratch


def remove_work_dir(work: Path, scratch: Path | None) -> None:
    shutil.rmtree(work, ignore_errors=True)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)


def owner_gone(record: dict) -> bool | None:
    """True when the kit that wrote the record is no longer running, False when it is, None when this
    process cannot tell (another host or pid namespace, no /proc)."""
    if record.get("host") != socket.gethostname():
        return None
    boot = _boot_id()
    if boot is not None and record.get("boot_id") not in (None, boot):
        return True  # the machine rebooted since: every process of that boot is gone
    if record.get("pid_namespace") != _pid_namespace() or not os.path.isdir("/proc/self"):
        return None
    pid, ticks = record.get("pid"), record.get("start_ticks")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    now = start_ticks(pid)
    return now is None or (ticks is not None and now != ticks)  # gone, or the pid was reused since


def _read_owner(work: Path) -> dict | None:
    try:
        record = json.loads((work / OWNER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("kind") != OWNER_KIND:
        return None
    if record.get("schema_version") != OWNER_SCHEMA_VERSION:
        return None  # a newer kit's: not this one's to read
    return record


@dataclass(frozen=True)
class Removed:
    """A work directory sweep_stale removed: the pid that owned it, and its scratch directory."""

    work: Path
    pid: int | None
    scratch: Path | None


def sweep_stale(parent: Path) -> list[Removed]:
    """Remove the work directories in `parent` whose kit is no longer running, with their scratch
    directories; return what was removed (nothing is removed whose owner is alive or unknown)."""
    removed = []
    try:
        entries = sorted(parent.iterdir())
    except OSError:
        return removed
    for work in entries:
        if not (work.name.startswith(".") and _WORK_MARK in work.name and work.is_dir()):
            continue
        record = _read_owner(work)
        if record is None or owner_gone(record) is not True:
            continue
        scratch = Path(record["scratch"]) if isinstance(record.get("scratch"), str) else None
        remove_work_dir(work, scratch)
        removed.append(Removed(work, record.get("pid"), scratch))
    return removed


def sweep_line(removed: list[Removed]) -> str | None:
    """One line saying what sweep_stale removed, or None."""
    if not removed:
        return None
    what = ", ".join(f"{r.work.name} (pid {r.pid})" for r in removed)
    n = len(removed)
    return (
        f"[kvkit] removed {n} work director{'y' if n == 1 else 'ies'} of kits no longer running, with their "
        f"connector stores: {what}"
    )
