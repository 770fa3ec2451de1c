"""The devices a run may use, found without torch: the visible GPUs, this process's cores, and whether a
--device setting means CUDA. Below the command line and the planner, which both ask."""

from __future__ import annotations

import os
import subprocess


def visible_gpus() -> list[str]:
    """GPU indices the children may use, without importing torch: CUDA_VISIBLE_DEVICES, else nvidia-smi."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]


def usable_cores() -> list[int]:
    """The cores this process may run on (its affinity set: a cpuset-limited container's, or a matrix
    cell's own cores), not every core of the machine."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call on this platform
        return list(range(os.cpu_count() or 1))


def uses_cuda(device: str) -> bool:
    """Whether the arms run on CUDA: --device cuda, or auto with a GPU visible."""
    return device == "cuda" or (device == "auto" and bool(visible_gpus()))
