"""How an engine child ended, read as the parent records it: its exit as a named failure kind (out of memory
only on evidence about this child), and its result file read back strictly (repro.contract)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from repro.contract.failure import (
    CRASH,
    MISSING_OUTPUT,
    NONZERO_EXIT,
    OOM,
    RAISED,
    TIMEOUT,
    UNPARSABLE_OUTPUT,
    ContractError,
)
from repro.contract.result import EXIT_RAISED, ArmResult
from repro.judge import logscan

_OOM_MARKERS = (
    "out of memory",
    "outofmemoryerror",
    "cannot allocate memory",
    "memoryerror",
    "oom-kill",
    "oom_kill",
    "std::bad_alloc",
)
# A rise of the cgroup's oom_kill count covers every process in it (other arms, MP servers, the
# load neighbour): said beside an arm's own failure, never in its place.
OOM_ELSEWHERE = (
    "; the kernel's out-of-memory killer fired in this cgroup while the arm ran (some process was killed, "
    "not necessarily this arm's)"
)


def classify_exit(
    returncode: int | None,
    log_text: str,
    timed_out: bool,
    oom_killed: bool = False,
    stopped: tuple[str, str] | None = None,
) -> tuple[str, str] | None:
    """The failure kind for a child's exit, or None when it exited 0 (the output decides then).

    stopped: why the parent killed the child for its disk use (repro.run.diskwatch), which is what it died of.

    Out of memory is claimed only on evidence about this child: it died of SIGKILL (what the
    kernel's killer sends; 137 through a shell) while the cgroup counted an OOM kill, or its own log
    says so. With arms at once the count is the whole cgroup's, so any other failure keeps its kind
    and detail, and says that something was OOM-killed meanwhile (OOM_ELSEWHERE). A bare SIGKILL
    without that count is a crash (whose detail mentions the OOM killer)."""
    if stopped is not None:
        return stopped
    if timed_out:  # what its log ended on (a loop or a silence), told by its own lines
        said = logscan.stall_text(log_text)
        return TIMEOUT, "the arm ran past its time limit and was killed with its process group" + (
            f"; {said}" if said else ""
        )
    if returncode == 0:
        return None
    low = log_text[-20000:].lower()
    marker = next((m for m in _OOM_MARKERS if m in low), None)
    killed = returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)
    note = OOM_ELSEWHERE if oom_killed else ""
    if returncode is not None and returncode < 0:
        sig = signal.Signals(-returncode).name if -returncode in signal.Signals._value2member_map_ else str(-returncode)
        if oom_killed and killed:
            return OOM, f"killed by {sig}; the kernel's out-of-memory killer fired during the arm"
        if marker:
            return OOM, f"killed by {sig}; the log mentions running out of memory ({marker!r})"
        if killed:
            return CRASH, f"killed by {sig} from outside (no out-of-memory kill was counted or logged)"
        return CRASH, f"killed by {sig}{note}"
    if oom_killed and killed:
        return OOM, f"exit status {returncode} (SIGKILL); the kernel's out-of-memory killer fired during the arm"
    if marker:
        return OOM, f"exit status {returncode}; the log mentions running out of memory ({marker!r})"
    if returncode == EXIT_RAISED:
        return RAISED, f"the engine raised (see the log tail){note}"
    return NONZERO_EXIT, f"exit status {returncode}{note}"


def read_result(path: Path) -> tuple[ArmResult | None, tuple[str, str] | None]:
    """The child's result and, when it did not deliver one, why (a failure kind and detail)."""
    if not path.exists():
        return None, (MISSING_OUTPUT, "the child exited without writing its result file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, (UNPARSABLE_OUTPUT, f"the result file is not valid JSON ({str(exc)[:200]})")
    try:
        result = ArmResult.from_json(data)
    except ContractError as exc:
        return None, (exc.kind, str(exc))
    if result.error is not None:
        return result, (RAISED, f"{result.error.type}: {result.error.message}"[:600])
    return result, None


def collect_outcome(
    returncode: int | None,
    timed_out: bool,
    oom_killed: bool,
    log_text: str,
    out_path: Path,
    stopped: tuple[str, str] | None = None,
) -> tuple[ArmResult | None, tuple[str, str] | None]:
    """(result, failure) from how the child exited and what it left: exit 0 with a valid result
    is the only success; exit 3 must come with the error record the engine writes. A child stopped
    for its disk use (stopped) has no result, whatever it left."""
    failure = classify_exit(returncode, log_text, timed_out, oom_killed, stopped)
    if failure is not None and failure[0] != RAISED:
        return None, failure
    result, problem = read_result(out_path)
    if failure is None:
        return result, problem
    note = OOM_ELSEWHERE if oom_killed else ""
    if problem is None or problem[0] != RAISED:
        said = problem[1] if problem else "no error recorded"
        return None, (NONZERO_EXIT, f"exit status {returncode} and {said}{note}")
    return result, (problem[0], problem[1] + note)
