"""What a fault left, judged: the report (the previous one byte for byte, a new complete one, absent, or
partial), files a run left behind, and whether the kit named what happened (exit code, one-line message).

Pure but for reading the report's folder: the chaos command decides which of these a fault must pass.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from repro.chaos.faults import CHILD, DISK_FULL, KIT, RAY_WORKER, RESULT_FILE, SERVER, UNWRITABLE
from repro.contract.failure import (
    CRASH,
    LMCACHE_SERVER_DIED,
    LMCACHE_SERVER_START,
    MISSING_OUTPUT,
    NONZERO_EXIT,
    RAISED,
    RESULT_VERSION,
    UNPARSABLE_OUTPUT,
)
from repro.errors import EXIT_INTERRUPTED, EXIT_MISMATCH, EXIT_OK, EXIT_RUNTIME, EXIT_USAGE
from repro.judge.verdict import ERROR
from repro.matrix.status import DONE as CELL_DONE

PREVIOUS, NEW, ABSENT, PARTIAL = "previous", "new", "absent", "partial"
WORK_MARK = ".work-"  # the verifier's work directory beside its report: .<stem>.work-XXXXXXXX
# What the kit names a killed engine child, a bad result file, a dead MP server (repro.contract).
CHILD_KINDS = (CRASH, NONZERO_EXIT, RAISED, MISSING_OUTPUT)
RESULT_KINDS = (UNPARSABLE_OUTPUT, MISSING_OUTPUT, RESULT_VERSION)
SERVER_KINDS = (LMCACHE_SERVER_DIED, LMCACHE_SERVER_START)
_MATRIX_CELL_ERROR = re.compile(r"^\[kvkit\] matrix: cell (?P<cell>\S+): " + ERROR + r" (?P<kind>[a-z-]+):")


@dataclass(frozen=True)
class Snapshot:
    """A report and its logs as they were before a run (None: no report)."""

    report: bytes | None
    logs: dict[str, str]  # path under the logs folder -> SHA-256


def logs_dir(report: Path) -> Path:
    return report.with_name(report.stem + ".logs")


def take_snapshot(report: Path) -> Snapshot:
    try:
        data = report.read_bytes()
    except FileNotFoundError:
        data = None
    logs = logs_dir(report)
    files = sorted(p for p in logs.rglob("*") if p.is_file()) if logs.is_dir() else []
    return Snapshot(data, {p.relative_to(logs).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files})


@dataclass(frozen=True)
class ReportState:
    state: str  # PREVIOUS, NEW, ABSENT or PARTIAL
    detail: str
    data: dict | None = None  # a NEW report, loaded
    missing_logs: tuple[str, ...] = ()  # logs a NEW report cites that are not there (a dangling link, not a part)


def report_state(report: Path, before: Snapshot, load: Callable[[Path], dict], cited_logs=None) -> ReportState:
    """The report after a run: byte-identical to `before` with the same logs (PREVIOUS), a new one that `load`
    accepts (NEW; with the logs it cites that are not there), none where there was none (ABSENT), or anything
    else (PARTIAL: a temporary file or a logs swap left half done, a report that does not load, the previous
    report with logs that changed). cited_logs(data) lists a NEW report's logs, relative to its folder."""
    leftover = sorted(p.name for p in report.parent.glob(f".{report.name}.*.tmp"))
    if leftover:
        return ReportState(PARTIAL, f"a temporary file of the report is left: {leftover[0]}")
    old_logs = logs_dir(report).with_name(logs_dir(report).name + ".old")
    if old_logs.exists():
        return ReportState(PARTIAL, f"the logs swap was left half done: {old_logs.name}")
    if not report.exists():
        if before.report is None:
            return ReportState(ABSENT, "no report, as before")
        return ReportState(PARTIAL, "the previous report is gone and no new one is there")
    now = take_snapshot(report)
    if now.report == before.report:
        if now.logs != before.logs:
            return ReportState(PARTIAL, "the previous report, with logs that changed")
        return ReportState(PREVIOUS, "the previous report, byte for byte, with its logs")
    try:
        data = load(report)
    except Exception as exc:  # noqa: BLE001 - whatever the loader refuses, the report is not whole
        return ReportState(PARTIAL, f"not a complete report: {str(exc).splitlines()[0][:200] if str(exc) else exc!r}")
    missing = tuple(rel for rel in (cited_logs(data) if cited_logs else []) if not (report.parent / rel).is_file())
    return ReportState(NEW, "a new, complete report", data, missing)


def load_complete_report(path: Path) -> dict:
    """The strict loader, the schema, and `complete: true`: what a whole report is."""
    from repro.record.report import load_report, validate_report

    data = load_report(path)
    validate_report(data)
    if data.get("complete") is not True:
        raise ValueError("the report does not say complete: true")
    return data


def report_logs(data: dict) -> list[str]:
    return [arm["log"] for arm in data.get("arms", []) if isinstance(arm, dict) and arm.get("log")]


def load_matrix_summary(path: Path) -> dict:
    from repro.matrix.commands import load_summary

    data = load_summary(path)
    if not isinstance(data.get("cells"), list) or not isinstance(data.get("exit_code"), int):
        raise TypeError("the summary has no cells or exit code")
    return data


def work_dirs(folder: Path) -> set[str]:
    """The verifier work directories in a report's folder (each run makes one; kill -9 leaves it)."""
    try:
        return {p.name for p in folder.iterdir() if p.name.startswith(".") and WORK_MARK in p.name and p.is_dir()}
    except OSError:
        return set()


def entries(folder: Path) -> set[str]:
    try:
        return {p.name for p in folder.iterdir()}
    except OSError:
        return set()


def error_line(stderr: str) -> str | None:
    """The kit's one-line message: its last line, `error: ...`, with no traceback anywhere before it."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    if not lines or "Traceback (most recent call last)" in stderr or not lines[-1].startswith("error: "):
        return None
    return lines[-1]


def said_last_word(stderr: str) -> bool:
    """Whether the kit has said its last word: `report: <path>` once its report is written, or its one
    `error:` line (repro.verify prints either as the last thing it does)."""
    return any(line.startswith(("report: ", "error: ")) for line in stderr.splitlines())


def named_arm_error(data: dict | None, stdout: str, arm: str, kinds: tuple[str, ...]) -> str | None:
    """The kind the report gives `arm`'s failure, when it is one of `kinds` and the summary printed it."""
    for err in (data or {}).get("errors", []):
        if err.get("arm") == arm and err.get("kind") in kinds and f"{ERROR} {arm}: {err['kind']}" in stdout:
            return err["kind"]
    return None


def matrix_cell_error(data: dict | None, stderr: str, cell: str) -> str | None:
    """The kind the matrix gives `cell`, when its summary has the cell as an error and the driver said so."""
    record = next((c for c in (data or {}).get("cells", []) if c.get("name") == cell), None)
    if record is None or record.get("error") is None:
        return None
    said = [m for line in stderr.splitlines() if (m := _MATRIX_CELL_ERROR.match(line)) and m["cell"] == cell]
    return record["error"]["kind"] if said and said[-1]["kind"] == record["error"]["kind"] else None


@dataclass(frozen=True)
class Run:
    """How a kit run under a fault ended."""

    rc: int | None
    stdout: str
    stderr: str
    state: ReportState
    landed: bool  # the fault hit while the run (or its target) was still going
    target: str = ""  # the arm or cell the fault hit, where it hit one
    survived: bool = False  # the process signalled was still alive seconds later (it ignored the signal)


def name_outcome(category: str, variant: str, run: Run, normal_rc: int) -> tuple[str | None, str]:
    """(the failure as the kit named it, or None; what was seen). A fault that missed (the run had ended)
    is named by a normal completion: the scenario's usual exit code and a new report."""
    if "internal error in the kit" in run.stderr:
        return None, "the kit called it an internal error of its own (a traceback)"
    if not run.landed:
        if run.rc == normal_rc and run.state.state == NEW:
            return "missed: the run had ended", f"exit {run.rc}, a new report"
        return None, f"the fault missed, yet exit {run.rc} and the report is {run.state.state}"
    judge = _JUDGES.get(category)
    if judge is None:
        raise ValueError(f"unknown fault category {category!r}")
    named, seen = judge(variant, run, normal_rc)
    if named is None and run.survived and run.rc == normal_rc and run.state.state == NEW:
        return f"no effect: {run.target} survived {variant}", f"exit {run.rc}, a new report"
    return named, seen


def _kit(variant: str, run: Run, normal_rc: int) -> tuple[str | None, str]:
    line = error_line(run.stderr) or ""
    if variant == "SIGKILL" and run.rc == -9:
        return "killed (SIGKILL): no message possible", "exit -9"
    if run.rc == EXIT_INTERRUPTED and line.startswith("error: interrupted") and run.state.state != NEW:
        return "interrupted (exit 130)", line
    if run.rc in (EXIT_OK, EXIT_MISMATCH, EXIT_RUNTIME) and "after the run completed" in line:
        return f"interrupted after the report was swapped in (exit {run.rc})", line
    if run.rc is not None and run.rc < 0:
        return None, f"died of signal {-run.rc} without a message"
    return None, f"exit {run.rc}: {line or 'no one-line message'}"


def _arm_failure(kinds: tuple[str, ...]):
    def judge(variant: str, run: Run, normal_rc: int) -> tuple[str | None, str]:
        kind = named_arm_error(run.state.data, run.stdout, run.target, kinds) if run.state.state == NEW else None
        if run.rc == EXIT_RUNTIME and kind:
            return f"{kind} ({run.target})", f"{ERROR} {run.target}: {kind}"
        return None, f"exit {run.rc}, report {run.state.state}, no {'/'.join(kinds)} named for {run.target}"

    return judge


def _io_failure(variant: str, run: Run, normal_rc: int) -> tuple[str | None, str]:
    """A full disk or an unwritable folder: one line and exit 2 or 3, the previous report kept; or arms
    that could not write their results, named ERRORs in a new report."""
    line = error_line(run.stderr)
    if run.rc in (EXIT_USAGE, EXIT_RUNTIME) and line and run.state.state in (PREVIOUS, ABSENT):
        return f"exit {run.rc}: one line", line
    if run.rc == EXIT_RUNTIME and run.state.state == NEW and (run.state.data or {}).get("errors"):
        err = run.state.data["errors"][0]
        return f"{err['kind']} ({err['arm']})", f"{ERROR} {err['arm']}: {err['kind']}"
    if run.rc == normal_rc and run.state.state == NEW:
        return "completed: the report was written before the fault", f"exit {run.rc}"
    return None, f"exit {run.rc}, report {run.state.state}: {line or 'no one-line message'}"


def _ray_worker(variant: str, run: Run, normal_rc: int) -> tuple[str | None, str]:
    """The cell an error of the kind the driver said, or, when its worker still ended the cell's task
    (Ray's worker ignores a stray SIGINT; a worker shut down with the cluster is no failure), done."""
    kind = matrix_cell_error(run.state.data, run.stderr, run.target) if run.state.state == NEW else None
    if run.rc == EXIT_RUNTIME and kind:
        return f"{kind} (cell {run.target})", f"cell {run.target}: {ERROR} {kind}"
    cells = (run.state.data or {}).get("cells", []) if run.state.state == NEW else []
    record = next((c for c in cells if c.get("name") == run.target), None)
    if run.rc == normal_rc and record is not None and record.get("status") == CELL_DONE:
        return f"no effect: cell {run.target} finished", f"exit {run.rc}: its worker still ended the task"
    return None, f"exit {run.rc}, summary {run.state.state}, cell {run.target} not named as an error"


_JUDGES = {
    KIT: _kit,
    CHILD: _arm_failure(CHILD_KINDS),
    SERVER: _arm_failure(SERVER_KINDS),
    RESULT_FILE: _arm_failure(RESULT_KINDS),
    DISK_FULL: _io_failure,
    UNWRITABLE: _io_failure,
    RAY_WORKER: _ray_worker,
}
