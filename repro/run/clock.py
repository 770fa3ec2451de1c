"""The run's clock: seconds since its start, and every device-using process's window on it (repro.run.sharing),
from which each arm's `sharing` is read (who shared its GPU or the CPU's cores while it ran)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from repro.plan.devices import uses_cuda, visible_gpus
from repro.run.sharing import CPU_CORES, Window, gpu_resource, sharing_of


class Clock:
    """Seconds since the run's start, and every device-using process's window (repro.run.sharing)."""

    def __init__(self, t0: float, resource_of: Callable) -> None:
        self.t0 = t0
        self.windows: list[Window] = []
        self._resource_of = resource_of
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def record(self, process: str, kind: str, owner: str | None, slot, start: float, resources=None) -> None:
        res = tuple(resources) if resources is not None else self._resource_of(slot)
        with self._lock:
            self.windows.append(Window(process, kind, owner, res, start, self.now()))

    def sharing(self, arm: str) -> dict | None:
        with self._lock:
            return sharing_of(arm, list(self.windows))


def resource_for(device: str) -> Callable:
    """slot -> the devices an arm in that slot uses: its GPU on CUDA (CUDA_VISIBLE_DEVICES of its
    slot, else the first visible one, which a child that sees them all uses), the cores on the CPU."""
    if not uses_cuda(device):
        return lambda slot: (CPU_CORES,)
    first = (visible_gpus() or ["0"])[0]
    return lambda slot: (gpu_resource((slot.env if slot else {}).get("CUDA_VISIBLE_DEVICES", first)),)
