"""Running a stack's verifier runs one after another in the engine interpreter (--python), each one's output kept in
<run>.out beside its report, and the issue Markdown of a run with a new finding (`python -m repro issue-md`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from repro.errors import EXIT_INTERRUPTED, EXIT_USAGE, UsageError
from repro.matrix.cell import stop_verifier  # SIGTERM the verifier, then SIGKILL its group
from repro.paths import KIT_ROOT
from repro.readmodel import read_report
from repro.watch.outcome import RunOutcome, read_outcome
from repro.watch.stack import WatchRun

TAIL_CHARS = 300
ISSUE_TIMEOUT_S = 300


@dataclass(frozen=True)
class Finished:
    """How one verifier process ended: its exit code (None: stopped at the timeout), wall time and output's tail."""

    exit_code: int | None
    wall_s: float
    tail: str


Launch = Callable[[list[str], Path, float], Finished]  # (command, output file, timeout) -> how it ended


def kit_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(KIT_ROOT), os.environ.get("PYTHONPATH")) if p))


def launch(cmd: list[str], out: Path, timeout_s: float) -> Finished:
    """Run cmd in its own process group, its output into out; past timeout_s: SIGTERM (the verifier stops its
    engines and writes no report), then SIGKILL of the group."""
    t0 = time.monotonic()
    with open(out, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=KIT_ROOT, env=kit_env(), stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            code: int | None = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            code = None
            stop_verifier(proc)
        except BaseException:
            stop_verifier(proc)
            raise
    return Finished(code, round(time.monotonic() - t0, 1), _tail(out))


def _tail(out: Path) -> str:
    try:
        lines = out.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    last = next((line for line in reversed(lines) if line.strip()), "no output")
    return " ".join(last.split())[-TAIL_CHARS:]


def run_error(finished: Finished, report: Path) -> str | None:
    """Why a finished run gave no usable report (one line), or None: its report is its result."""
    if finished.exit_code is None:
        return f"timeout: stopped after {finished.wall_s:g} s, no report"
    if finished.exit_code == EXIT_INTERRUPTED:
        return "interrupted: the verifier exited 130, no report"
    if finished.exit_code < 0:
        return f"crash: the verifier was killed by signal {-finished.exit_code}"
    if finished.exit_code == EXIT_USAGE:
        return f"bad input: the verifier refused its arguments (exit 2): {finished.tail}"
    if not report.is_file():
        return f"no report: the verifier exited {finished.exit_code} without one: {finished.tail}"
    return None


def relative(path: Path) -> str:
    try:
        return path.resolve().relative_to(KIT_ROOT).as_posix()
    except ValueError:
        return str(path)


def execute_run(run: WatchRun, python: str, timeout_s: float, start: Launch = launch) -> RunOutcome:
    """One verifier run in python, read into its outcome; a run that gave no report, or one that does not load,
    is an outcome with an error and no arms."""
    report = Path(run.report)
    out = report.with_suffix(".out")
    cmd = [python, "-m", "repro.verify_kv_reuse", *run.argv, "--python", python]
    finished = start(cmd, out, timeout_s)
    error = run_error(finished, report)
    if error is None:
        try:
            return read_outcome(run.name, relative(report), read_report(report), finished.exit_code, finished.wall_s)
        except (UsageError, OSError, KeyError, TypeError, ValueError) as exc:
            error = f"unreadable report: {type(exc).__name__}: {exc}"[:TAIL_CHARS]
    return RunOutcome(run.name, relative(report) if report.is_file() else None, finished.exit_code, finished.wall_s,
                      error)  # fmt: skip


def say(text: str) -> None:
    print(f"[kvkit] watch: {text}", file=sys.stderr, flush=True)


def write_issue(report: str, folder: Path, run: str, python: str,
                start: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> str:  # fmt: skip
    """`python -m repro issue-md REPORT --out <folder>/<run>-issue/issue.md` (its repro_min.py beside it): the
    Markdown's path, or 'unavailable: <why>'."""
    target = folder / f"{run}-issue" / "issue.md"
    target.parent.mkdir(exist_ok=True)
    cmd = [python, "-m", "repro", "issue-md", str(KIT_ROOT / report), "--out", str(target)]
    try:
        done = start(cmd, cwd=KIT_ROOT, env=kit_env(), capture_output=True, text=True, timeout=ISSUE_TIMEOUT_S,
                     check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: issue-md did not run ({exc})"
    if done.returncode != 0 or not target.is_file():
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return f"unavailable: issue-md exited {done.returncode}: {last[:TAIL_CHARS]}"
    return relative(target)
