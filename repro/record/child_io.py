"""What every engine child (vLLM's repro.engine.child, llama.cpp's repro.llamacpp.child) tells its parent while it
runs and waits for from it: its stage (the progress display), and a native-matched arm's probes. Standard library
only."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback
from dataclasses import replace

from repro.contract.job import PROBES_FILE_KEY, Job, ProbeJob, progress_path
from repro.contract.result import EXIT_OK, EXIT_RAISED, ArmResult, ChildError
from repro.record.atomic import dumps_json, write_bytes_atomic


class ProbesStopped(RuntimeError):
    """A native-matched arm's connector arm gave nothing to match, or the run is stopping."""


def wait_for_probes(job: Job) -> Job:
    """native-matched: the engine is built while the connector arm runs; its probes (the prefix
    lengths that arm reused) arrive in job.probes_file when that arm is done (written atomically
    by the parent). The wait is after engine start and before generation, so it counts in neither."""
    report_stage(job, "waiting for the connector arm's reuse lengths", preflight_ok=True)
    while True:
        try:
            with open(job.probes_file, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            time.sleep(0.1)
            continue
        if PROBES_FILE_KEY not in data:
            raise ProbesStopped(f"no probes to match: {data.get('stop', data)}")
        probes = tuple(ProbeJob.from_json(p, f"probes_file[{i}]") for i, p in enumerate(data[PROBES_FILE_KEY]))
        return replace(job, probes=probes, probes_file=None)


def report_stage(job: Job, stage: str, preflight_ok: bool | None = None) -> None:
    """Tell the parent where this child is (its progress display; and, for the first arm, that the
    preflight passed so the other arms may start). Never fails the arm."""
    if not job.output:
        return
    try:
        data = {"stage": stage, "at": round(time.time(), 3)}
        if preflight_ok is not None:
            data["preflight_ok"] = preflight_ok
        write_bytes_atomic(progress_path(job.output), dumps_json(data).encode("utf-8"))
    except Exception:  # noqa: BLE001 - progress is a display, never a result
        traceback.print_exc()


def write_result(job: Job, produce) -> int:
    """Write what produce() returns (an ArmResult) to the job's output, or, where it raised, an ArmResult naming the
    error; the child's exit code. Serializing the result is part of the run: a result that cannot be written (a NaN,
    say) is a raised error, exit EXIT_RAISED."""
    try:
        data, code = dumps_json(produce().to_json()), EXIT_OK
    except BaseException as exc:  # noqa: BLE001 - the parent turns this into a named ERROR with the log tail
        traceback.print_exc()
        raised = ArmResult(
            arm=job.arm.name, pid=os.getpid(), fixture_sha256=job.fixture_sha256,
            error=ChildError(type(exc).__name__, str(exc)[:2000]),
        )  # fmt: skip
        data, code = dumps_json(raised.to_json()), EXIT_RAISED
    write_bytes_atomic(job.output, data.encode("utf-8"))
    return code


def read_job(argv: list[str], module: str) -> Job | None:
    """The job a child was started with (`python -m MODULE JOB.json`); None, after a usage line, for anything else."""
    if len(argv) != 1:
        print(f"usage: python -m {module} JOB.json", file=sys.stderr)
        return None
    with open(argv[0], encoding="utf-8") as fh:
        return Job.from_json(json.load(fh))


def prompt_sha256(token_ids) -> str:
    """What names a request in the KV audit's records (vLLM's and llama.cpp's): the SHA-256 of its prompt token IDs
    as JSON."""
    return hashlib.sha256(json.dumps([int(t) for t in token_ids]).encode()).hexdigest()
