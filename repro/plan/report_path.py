"""Where a run's report goes, checked before any engine starts: a file the kit can write, not a folder or the
fixture, and no earlier run's report, logs or writeup replaced unless the user asks (--force).

A report's logs are the folder `<stem>.logs` beside it and its writeup `<stem>.md` (the site pairs them by that
stem). --force replaces a report and its logs, never a writeup: a writeup is text someone wrote about the run there,
which no command can write again, and left beside a new report it would describe a run it is not about (the site
would show it under the new one). Moving it away is the user's own step.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from repro.errors import UsageError


def logs_of(report: Path) -> Path:
    """The report's logs folder, `<stem>.logs` beside it (repro.plan.settings.OutputSettings.logs_rel)."""
    return report.with_name(f"{report.stem}.logs")


def writeup_of(report: Path) -> Path:
    """The writeup `<stem>.md` beside a report, which the site shows with it."""
    return report.with_suffix(".md")


def _there(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def holds_something(folder: Path) -> bool:
    """A folder with anything in it, or a file or link where a folder would go; an empty folder holds nothing lost."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        return True
    return folder.is_dir() and any(folder.iterdir())


def refuse_replacing(report: Path, force: bool, *, logs: Path | None = None, flag: str = "--report") -> None:
    """One line (UsageError, exit 2) where writing `report` would replace what an earlier run left: the report
    itself or its logs folder (`logs`, default `<stem>.logs`; empty, it loses nothing) unless `force`; a writeup
    `<stem>.md` even with `force`."""
    writeup = writeup_of(report)
    if _there(writeup):
        raise UsageError(
            f"{flag} {report}: the writeup {writeup} beside it describes the run there: give another {flag}, or move "
            "the writeup away first (--force replaces a report and its logs, never a writeup)"
        )
    if force:
        return
    logs = logs_of(report) if logs is None else logs
    if _there(report):
        what = "a report is already there" + (" (and its logs)" if holds_something(logs) else "")
    elif holds_something(logs):
        what = f"an earlier run's logs {logs} are already there"
    else:
        return
    raise UsageError(f"{flag} {report}: {what}: give another {flag}, or --force to replace it")


def check_report_path(path: Path, fixture: Path, force: bool = False) -> None:
    """The verifier's --report: not a folder or the fixture, its folder writable (made if missing), the file
    writable, and nothing an earlier run wrote replaced unless asked (refuse_replacing)."""
    if path.exists() and path.is_dir():
        raise UsageError(f"--report {path}: is a directory")
    if path.exists() and fixture.exists() and path.resolve() == fixture.resolve():
        raise UsageError(f"--report {path}: is the fixture itself")
    parent = path.parent if str(path.parent) else Path(".")
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"--report {path}: {probe} is not a directory")
    try:  # os.access says yes to root on a read-only file system; a real file does not lie
        fd, tmp = tempfile.mkstemp(prefix=".kvkit-writable-", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise UsageError(f"--report {path}: directory {probe} is not writable ({exc.strerror or exc})") from None
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"--report {path}: file is not writable")
    refuse_replacing(path, force)
