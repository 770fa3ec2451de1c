"""Who shared a device with whom while a run lasted: the processes' windows and their overlaps (pure).

Every process the run starts that can touch a device is a Window: each arm's engine child, an
LMCacheMPConnector arm's MP server, the --gpu-load or --cpu-load neighbour. An arm shared its device
when another arm, another arm's MP server or the load neighbour used the same device while it ran;
its own MP server is listed (it moves the arm's KV) but is part of the arm, so it does not count as
sharing.
On the CPU every arm uses the machine's cores, so any two arms that overlap in time shared them.
"""

from __future__ import annotations

from dataclasses import dataclass

ARM = "arm"
SERVER = "lmcache-server"
GPU_LOAD = "gpu-load"  # repro.run.gpu_load's window: on the GPUs it loads
CPU_LOAD = "cpu-load"  # repro.run.cpu_load's window: on CPU_CORES
CPU_CORES = "CPU cores"


@dataclass(frozen=True)
class Window:
    """One process: what it is, which arm it belongs to, the device it used, and when (seconds from
    the run's start)."""

    process: str  # "arm native", "LMCache MP server of LMCacheMPConnector", "gpu-load", "cpu-load"
    kind: str  # ARM | SERVER | GPU_LOAD | CPU_LOAD
    owner: str | None  # the arm it belongs to (None: the load neighbour)
    resources: tuple[str, ...]  # "GPU 0", ... or (CPU_CORES,)
    start: float
    end: float


def overlap(a: Window, b: Window) -> float:
    return max(0.0, min(a.end, b.end) - max(a.start, b.start))


def gpu_resource(visible: str | None) -> str:
    return f"GPU {visible}" if visible not in (None, "") else "GPU (default)"


def sharing_of(arm: str, windows: list[Window]) -> dict | None:
    """The report's `sharing` for one arm's own window: the other processes on its device(s), with
    seconds of overlap (largest first), and whether any of them was another arm or the load."""
    mine = next((w for w in windows if w.kind == ARM and w.owner == arm), None)
    if mine is None:
        return None
    others = []
    for w in windows:
        if w is mine or not set(w.resources) & set(mine.resources):
            continue
        seconds = overlap(mine, w)
        if seconds <= 0:
            continue
        others.append({"process": w.process, "kind": w.kind, "overlap_s": round(seconds, 1), "own": w.owner == arm})
    others.sort(key=lambda o: (-o["overlap_s"], o["process"]))
    return {
        "resource": ", ".join(mine.resources),
        "window_s": [round(mine.start, 1), round(mine.end, 1)],
        "others": others,
        "shared": any(not o["own"] for o in others),
    }


def who_shared(sharing: dict | None) -> str:
    """One line: "alone on GPU 0" or "shared GPU 0 with arm native (40.1 s), gpu-load (61.0 s)"."""
    if not sharing:
        return "not recorded"
    foreign = [o for o in sharing["others"] if not o.get("own")]
    if not foreign:
        return f"alone on {sharing['resource']}"
    named = ", ".join(f"{o['process']} ({o['overlap_s']:g} s)" for o in foreign)
    return f"shared {sharing['resource']} with {named}"
