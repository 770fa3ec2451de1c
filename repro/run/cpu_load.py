"""The CPU-load neighbour (parent side, `--cpu-load`): started beside the reuse arms, watched, stopped, recorded.

A fault that needs a busy machine (a copy that misses its window when another process holds its core:
the planted fault's `when: contended` gate) shows only when something else is runnable on the arm's
cores. Whether other arms are depends on how many run at once, the machine and what else it does;
`--cpu-load` makes the contention deliberate, as `--gpu-load` does on a GPU: the kit starts
repro.engine.cpu_load (one spinning process per CPU core the kit may use, at the kit's niceness)
before the reuse arms and stops it after them and their trials, before any confirmation re-run alone,
and the report says when it ran and what each worker got (CPU seconds, run-queue wait).

Its life-cycle (process group on a lifeline, waiting until it runs, the watcher, the stop, the two
named failures CPU_LOAD_START and CPU_LOAD_DIED) is repro.run.neighbour's. No vllm, torch or lmcache
import here.
"""

from __future__ import annotations

import os
from pathlib import Path

from repro.run.neighbour import LoadKind
from repro.run.neighbour import neighbour as _neighbour

MODULE = "repro.engine.cpu_load"
# The child's status file: must equal repro.engine.cpu_load's (tests/test_cpu_load.py checks).
STATUS_KIND = "kvkit-cpu-load-status"
READY_TIMEOUT_S = 60.0  # a Python start and a fork per core: seconds even on a busy machine
WORKER_KEYS = ("core", "pid", "affinity", "nice", "iterations", "cpu_s", "wait_s")


def _worker_record(cores: list[str], w: dict) -> dict:
    return {k: w.get(k) for k in WORKER_KEYS}


def command(python: str, module: str, cores: list[str], status_path: Path, seconds_per_report: float) -> list[str]:
    return [python, "-m", module, "--cores", ",".join(cores), "--status", str(status_path),
            "--seconds-per-report", f"{seconds_per_report:g}"]  # fmt: skip


KIND = LoadKind("cpu-load", "CPU-load neighbour", STATUS_KIND, "cores", "workers", _worker_record, MODULE,
                READY_TIMEOUT_S, command)  # fmt: skip
CPU_LOAD_START, CPU_LOAD_DIED = KIND.start_failure, KIND.died_failure


def load_log_path(workdir: Path) -> Path:
    """The neighbour's log, beside the arm logs."""
    return KIND.log_path(workdir)


def cores() -> list[str]:
    """The CPUs this process may run on (its affinity: a container's or taskset's share), as numbers."""
    try:
        return [str(c) for c in sorted(os.sched_getaffinity(0))]
    except (AttributeError, OSError):  # not Linux
        return [str(c) for c in range(os.cpu_count() or 1)]


def neighbour(python: str, cores: list[str], env: dict[str, str], log_path: Path, module: str = MODULE, **options):
    """Start one spinning worker per core in `cores` (e.g. cores()), wait until every one runs, yield the
    load; on leaving, stop and reap its whole group, workers included, whatever happens. options:
    repro.run.neighbour.neighbour's (t0, ready_timeout_s, stop_grace_s, seconds_per_report, on_death)."""
    return _neighbour(KIND, python, cores, env, log_path, module, **options)
