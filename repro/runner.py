"""Parent side: start one engine child per arm, time it out, reap its process group, collect.

The parent never imports vllm, torch or lmcache. Each child's stdout and stderr are the arm log
file itself (file-descriptor level), so what vLLM workers and LMCache print from grandchildren
lands there too. Every way a child can go wrong becomes a named failure kind with the log tail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from repro import logscan
from repro.atomic import write_bytes_atomic, write_json_atomic
from repro.provenance import redact_text

KIT_ROOT = Path(__file__).resolve().parent.parent
# Failure kinds, each distinct in the report.
TIMEOUT, CRASH, OOM, NONZERO_EXIT, MISSING_OUTPUT, UNPARSABLE_OUTPUT, RAISED, INTERRUPTED = (
    "timeout", "crash", "out-of-memory", "nonzero-exit", "missing-output", "unparsable-output", "raised", "interrupted")
_OOM_MARKERS = ("out of memory", "outofmemoryerror", "cannot allocate memory", "memoryerror", "oom-kill", "killed process")
_GRACE_S = 10.0


@dataclass
class ArmOutcome:
    name: str
    result: dict | None
    failure: dict | None  # {"kind", "detail", "log_tail"} when the child did not deliver
    log_path: Path
    log_text: str
    wall_s: float
    returncode: int | None = None
    extra: dict = field(default_factory=dict)


def child_env(base: dict[str, str], *, hashseed: str, extra: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    env.update({
        "PYTHONHASHSEED": hashseed,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([str(KIT_ROOT)] + ([base["PYTHONPATH"]] if base.get("PYTHONPATH") else [])),
        # no telemetry leaves the machine, and logs stay greppable
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "LMCACHE_TRACK_USAGE": "false",
        "VLLM_LOGGING_COLOR": "0", "NO_COLOR": "1",
    })
    env.update(extra)
    return env


def _kill_group(pgid: int, graceful: bool = True) -> None:
    """SIGTERM the whole group, then SIGKILL whatever is left: vLLM spawns grandchildren.

    Once the child has exited its result is on disk, and the leftovers are killed at once."""
    steps = ((signal.SIGTERM, _GRACE_S), (signal.SIGKILL, 5.0)) if graceful else ((signal.SIGKILL, 5.0),)
    for sig, wait in steps:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def classify_exit(returncode: int | None, log_text: str, timed_out: bool) -> tuple[str, str] | None:
    """The failure kind for a child's exit, or None when it exited 0 (the output decides then)."""
    low = log_text[-20000:].lower()
    if timed_out:
        return TIMEOUT, "the arm ran past its time limit and was killed with its process group"
    if returncode == 0:
        return None
    oom_hint = any(m in low for m in _OOM_MARKERS)
    if returncode is not None and returncode < 0:
        sig = signal.Signals(-returncode).name if -returncode in signal.Signals._value2member_map_ else str(-returncode)
        if returncode == -signal.SIGKILL and oom_hint:
            return OOM, f"killed by {sig}; the log mentions running out of memory"
        if returncode == -signal.SIGKILL:
            return OOM if "killed" in low[-500:] else CRASH, f"killed by {sig} (the out-of-memory killer sends SIGKILL)"
        return CRASH, f"killed by {sig}"
    if returncode == 137:
        return OOM, "exit status 137 (SIGKILL, typically the out-of-memory killer)"
    if oom_hint:
        return OOM, f"exit status {returncode}; the log mentions running out of memory"
    if returncode == 3:
        return RAISED, "the engine raised (see the log tail)"
    return NONZERO_EXIT, f"exit status {returncode}"


def read_result(path: Path) -> tuple[dict | None, tuple[str, str] | None]:
    if not path.exists():
        return None, (MISSING_OUTPUT, "the child exited without writing its result file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, (UNPARSABLE_OUTPUT, f"the result file is not valid JSON ({str(exc)[:200]})")
    if not isinstance(data, dict) or data.get("kind") != "kvkit-arm-result" or not isinstance(data.get("probes"), list):
        return None, (UNPARSABLE_OUTPUT, "the result file is not a kvkit arm result")
    if data.get("error"):
        err = data["error"]
        return data, (RAISED, f"{err.get('type', 'Exception')}: {err.get('message', '')}"[:600])
    return data, None


class Interrupted(Exception):
    """SIGINT or SIGTERM reached the kit: children are killed, no complete report is written."""


def run_arm(job: dict, *, workdir: Path, log_path: Path, env: dict[str, str], timeout_s: float,
            python: str = sys.executable, module: str = "repro.engine") -> ArmOutcome:
    """Run one arm's child to completion (or failure) and reap everything it started."""
    name = job["arm"]["name"]
    job_path = workdir / f"{name}.job.json"
    out_path = workdir / f"{name}.result.json"
    job = dict(job, output=str(out_path))
    write_json_atomic(job_path, job)
    t0 = time.monotonic()
    timed_out = False
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([python, "-m", module, str(job_path)], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        except BaseException:
            _kill_group(proc.pid)
            proc.wait()
            raise
        finally:
            _kill_group(proc.pid, graceful=proc.returncode is None)  # its workers may live on
        if proc.returncode is None:
            proc.wait()
    wall = time.monotonic() - t0
    text = redact_log(log_path, env)
    failure = classify_exit(proc.returncode, text, timed_out)
    result = None
    if failure is None or failure[0] == RAISED:
        result, problem = read_result(out_path)
        failure = failure if failure and failure[0] != RAISED else problem or failure
    outcome = ArmOutcome(name=name, result=result, log_path=log_path, log_text=text, wall_s=round(wall, 3),
                         returncode=proc.returncode, failure=None)
    if failure is not None:
        outcome.failure = {"kind": failure[0], "detail": failure[1], "log_tail": logscan.tail(text)}
    return outcome


def redact_log(log_path: Path, env: dict[str, str]) -> str:
    """Read the arm log back and blank any secret values before it is kept next to a report."""
    try:
        raw = log_path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return ""
    clean = redact_text(raw, env)
    if clean != raw:
        write_bytes_atomic(log_path, clean.encode("utf-8"))
    return clean
