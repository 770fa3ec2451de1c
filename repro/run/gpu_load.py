"""The GPU-load neighbour (parent side, `--gpu-load`): started beside the reuse arms, watched, stopped, recorded.

A stream-ordering race in a connector (a KV copy read before it is written) shows mostly when the
GPU is busy; on an idle GPU the copy tends to win. `--gpu-load` makes the contention deliberate: the
kit starts repro.engine.gpu_load (back-to-back matrix products on every GPU the arms use, at most a
few GiB each) before the reuse arms and stops it after them, and the report says when it ran and
what it achieved, so which arms ran under load is a fact rather than a guess.

Its life-cycle (process group on a lifeline, waiting until it runs, the watcher, the stop, the two
named failures GPU_LOAD_START and GPU_LOAD_DIED) is repro.run.neighbour's, shared with `--cpu-load`
(repro.run.cpu_load). No vllm, torch or lmcache import here.
"""

from __future__ import annotations

from pathlib import Path

from repro.run.neighbour import (  # noqa: F401 (what tests and callers name here: this module's API)
    STATUS_SCHEMA_VERSION,
    LoadError,
    LoadKind,
    Neighbour,
    overlap_s,
    status_path_for,
    wait_running,
)
from repro.run.neighbour import neighbour as _neighbour

MODULE = "repro.engine.gpu_load"
# The child's status file: must equal repro.engine.gpu_load's (tests/test_gpu_load.py checks; this
# module may not import that one's package).
STATUS_KIND = "kvkit-gpu-load-status"
READY_TIMEOUT_S = 180.0  # imports torch, initializes CUDA on each device, runs one product


def _device_record(gpus: list[str], d: dict) -> dict:
    ordinal = d.get("device")  # the child's CUDA ordinal: an index into gpus
    gpu = gpus[ordinal] if isinstance(ordinal, int) and 0 <= ordinal < len(gpus) else None
    return {"gpu": gpu, **{k: d.get(k) for k in ("name", "n", "dtype", "iterations", "tflops", "reserved_bytes")}}


def command(python: str, module: str, n_gpus: int, status_path: Path, seconds_per_report: float) -> list[str]:
    """The child's command line: it sees only the given GPUs (CUDA_VISIBLE_DEVICES), as ordinals 0..n-1."""
    devices = ",".join(str(i) for i in range(n_gpus))
    return [python, "-m", module, "--devices", devices, "--status", str(status_path),
            "--seconds-per-report", f"{seconds_per_report:g}"]  # fmt: skip


KIND = LoadKind(
    "gpu-load", "GPU-load neighbour", STATUS_KIND, "gpus", "devices", _device_record, MODULE, READY_TIMEOUT_S,
    argv=lambda python, module, gpus, status, every: command(python, module, len(gpus), status, every),
    child_env=lambda env, gpus: dict(env, CUDA_VISIBLE_DEVICES=",".join(gpus)),
)  # fmt: skip
GPU_LOAD_START, GPU_LOAD_DIED = KIND.start_failure, KIND.died_failure
# Failure kinds (not in repro.contract.failure.FAILURE_KINDS yet: the verifier decides what an arm gets).
FAILURE_KINDS = (GPU_LOAD_START, GPU_LOAD_DIED)


def load_log_path(workdir: Path) -> Path:
    """The neighbour's log, beside the arm logs."""
    return KIND.log_path(workdir)


def neighbour(python: str, gpus: list[str], env: dict[str, str], log_path: Path, module: str = MODULE, **options):
    """Start the load on `gpus` (the names CUDA_VISIBLE_DEVICES takes, e.g. repro.plan.devices.visible_gpus()),
    wait until it runs, yield it; on leaving, stop and reap its whole group, whatever happens. `python`
    must have torch with CUDA. options: repro.run.neighbour.neighbour's (t0, ready_timeout_s, stop_grace_s,
    seconds_per_report, on_death)."""
    return _neighbour(KIND, python, gpus, env, log_path, module, **options)
