"""A run's report and its logs put on disk together: the report is checked against its schema and serialized
before anything changes, then the new logs are swapped in for the previous report's and the report written
atomically; a write that fails puts the previous logs back, so a report never stands beside logs not its own.
The caller holds SIGINT and SIGTERM meanwhile (repro.run.runner.deferred_signals)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from repro.record.atomic import dumps_json, write_bytes_atomic
from repro.record.report import validate_report


def serialize(report: dict) -> bytes:
    """The report as written, checked against the schema first: a report that cannot be written (a NaN, a
    field off the schema) raises here, and the old report and its logs stay as they were."""
    validate_report(report)
    return dumps_json(report).encode("utf-8")


def publish(report_path: Path, data: bytes, work: Path, logs_dir: Path, names: list[str]) -> None:
    """The logs <name>.log of the work directory swapped in as logs_dir, and the report written beside them."""
    with publish_logs(work, logs_dir, names):  # the previous ones back on failure
        write_bytes_atomic(report_path, data)


@contextlib.contextmanager
def publish_logs(work: Path, dest: Path, names: list[str]):
    """Swap in the new arm logs for the block that writes the report: only a run that completed replaces
    the previous report's logs, and a block that fails (a report that cannot be written: a full disk, an
    interrupt) puts the previous ones back, so that the previous report keeps its own logs. Renames only,
    which a full disk allows."""
    staged = work / "logs"
    staged.mkdir()
    for n in names:
        src = work / f"{n}.log"
        if src.exists():
            os.replace(src, staged / f"{n}.log")
    old = dest.with_name(dest.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    had = dest.exists()
    if had:
        os.replace(dest, old)
    try:
        os.replace(staged, dest)
        yield
    except BaseException:
        if dest.exists():
            os.replace(dest, staged)  # the new logs go back into the work directory, and with it
        if had:
            os.replace(old, dest)
        raise
    shutil.rmtree(old, ignore_errors=True)
