"""The GPU-load neighbour (parent side, `--gpu-load`): started beside the reuse arms, watched, stopped, recorded.

A stream-ordering race in a connector (a KV copy read before it is written) shows mostly when the
GPU is busy; on an idle GPU the copy tends to win. `--gpu-load` makes the contention deliberate: the
kit starts repro.engine.gpu_load (back-to-back matrix products on every GPU the arms use, at most a
few GiB each) before the reuse arms and stops it after them, and the report says when it ran and
what it achieved, so which arms ran under load is a fact rather than a guess.

Like the LMCache MP server (repro.lmcache_mp), the kit starts it as its own process group on a
lifeline (repro.lifeline: kill -9 of the kit takes it down), waits until its status file says it is
running, stops the whole group on leaving the block however the block ends, and names its two
failures: GPU_LOAD_START (did not start, or not running in time) and GPU_LOAD_DIED (exited while
the arms ran), each with the tail of its log. No vllm, torch or lmcache import here.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from repro.contract import Failure
from repro.lmcache_mp import exit_text
from repro.runner import deferred_signals, kill_group, redact_log, redacted_tail, start_child

# Failure kinds (not in repro.contract.FAILURE_KINDS yet: the verifier decides what an arm gets).
GPU_LOAD_START = "gpu-load-start"
GPU_LOAD_DIED = "gpu-load-died"
FAILURE_KINDS = (GPU_LOAD_START, GPU_LOAD_DIED)
MODULE = "repro.engine.gpu_load"
# The child's status file: must equal repro.engine.gpu_load's (tests/test_gpu_load.py checks; this
# module may not import that one's package).
STATUS_KIND = "kvkit-gpu-load-status"
STATUS_SCHEMA_VERSION = 1
READY_TIMEOUT_S = 180.0  # imports torch, initializes CUDA on each device, runs one product
STOP_GRACE_S = 10.0  # SIGTERM to SIGKILL; the child itself stops within a few products
SECONDS_PER_REPORT = 1.0
_POLL_S = 0.2


def load_log_path(workdir: Path) -> Path:
    """The neighbour's log, beside the arm logs."""
    return workdir / "gpu-load.log"


def status_path_for(log_path: Path) -> Path:
    return log_path.with_name(log_path.stem + ".status.json")


def overlap_s(load: tuple[float | None, float | None], arm: tuple[float, float]) -> float:
    """Seconds of the arm's interval (start, end) the load covered; a load still running has end None."""
    start, end = load
    if start is None:
        return 0.0
    hi = arm[1] if end is None else min(end, arm[1])
    return round(max(0.0, hi - max(start, arm[0])), 3)


class LoadError(Exception):
    """The neighbour did not start (GPU_LOAD_START) or died while the arms ran (GPU_LOAD_DIED)."""

    def __init__(self, kind: str, detail: str, log_tail: str = "") -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail, self.log_tail = kind, detail, log_tail

    def failure(self) -> Failure:
        return Failure(self.kind, self.detail, self.log_tail)


@dataclass(eq=False)
class Neighbour:
    """A running load: its process, when it ran (seconds since the caller's t0), what it last said."""

    proc: subprocess.Popen
    gpus: list[str]
    module: str
    log_path: Path
    status_path: Path
    env: dict[str, str]
    t0: float  # time.monotonic() of the caller's origin
    started_s: float | None = None  # when its status first said "running"
    ended_s: float | None = None  # when the kit began to stop it, or first saw it dead
    stopping: bool = False  # set once the kit stops it: an exit after that is no death
    last_status: dict | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid  # the group's leader (lifeline execs the child in place) and its pgid

    def now_s(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def alive(self) -> bool:
        if self.proc.poll() is None:
            return True
        self._mark_end()
        return False

    def _mark_end(self) -> None:
        with self._lock:
            if self.ended_s is None:
                self.ended_s = self.now_s()

    def interval(self) -> tuple[float | None, float | None]:
        """(started_s, ended_s): when the load ran; ended_s is None while it still runs."""
        self.alive()
        return self.started_s, self.ended_s

    def overlap_s(self, arm_start_s: float, arm_end_s: float) -> float:
        """Seconds of an arm's run (same origin t0) that ran under this load."""
        return overlap_s(self.interval(), (arm_start_s, arm_end_s))

    def read_status(self) -> dict | None:
        """Its status file, when it is whole, ours and of this version (kept as last_status)."""
        try:
            doc = json.loads(self.status_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("kind") != STATUS_KIND or doc.get("pid") != self.pid:
            return None
        if doc.get("schema_version") != STATUS_SCHEMA_VERSION:
            raise LoadError(
                GPU_LOAD_START,
                f"{self.status_path.name}: status schema_version {doc.get('schema_version')!r}, this kit reads "
                f"{STATUS_SCHEMA_VERSION} (is --python running another kit?)",
                self.log_tail(),
            )
        self.last_status = doc
        return doc

    def check(self) -> None:
        """Raise GPU_LOAD_DIED if the load has exited (call it after the arms, and whenever)."""
        if self.alive():
            return
        self.read_status()
        error = (self.last_status or {}).get("error")
        detail = f"the GPU-load neighbour exited while the arms ran ({self.how_it_ended()}) at {self.ended_s:g} s"
        raise LoadError(GPU_LOAD_DIED, detail + (f": {error}" if error else ""), self.log_tail())

    def how_it_ended(self) -> str:
        if self.proc.returncode is None:
            return "running"
        return "stopped by the kit" if self.stopping else exit_text(self.proc.returncode)

    def log_tail(self) -> str:
        return redacted_tail(self.log_path, self.env)

    def _device_record(self, d: dict) -> dict:
        ordinal = d.get("device")  # the child's CUDA ordinal: an index into gpus
        gpu = self.gpus[ordinal] if isinstance(ordinal, int) and 0 <= ordinal < len(self.gpus) else None
        return {"gpu": gpu, **{k: d.get(k) for k in ("name", "n", "dtype", "iterations", "tflops", "reserved_bytes")}}

    def record(self) -> dict:
        """The report's top-level `gpu_load`: where and when it ran, and what each device achieved."""
        devices = (self.last_status or {}).get("devices") or []
        out = {
            "gpus": list(self.gpus),
            "module": self.module,
            "started_s": self.started_s,
            "ended_s": self.ended_s,
            "devices": [self._device_record(d) for d in devices if isinstance(d, dict)],
            "state": (self.last_status or {}).get("state"),
            "ended": self.how_it_ended(),
            "returncode": self.proc.returncode,
            "log": self.log_path.name,
        }
        if self.proc.returncode is not None and not self.stopping:
            out["failure"] = {"kind": GPU_LOAD_DIED, "detail": f"exited while the arms ran ({self.how_it_ended()})"}
        return out


def command(python: str, module: str, n_gpus: int, status_path: Path, seconds_per_report: float) -> list[str]:
    """The child's command line: it sees only the given GPUs (CUDA_VISIBLE_DEVICES), as ordinals 0..n-1."""
    devices = ",".join(str(i) for i in range(n_gpus))
    return [python, "-m", module, "--devices", devices, "--status", str(status_path),
            "--seconds-per-report", f"{seconds_per_report:g}"]  # fmt: skip


@contextlib.contextmanager
def neighbour(
    python: str,
    gpus: list[str],
    env: dict[str, str],
    log_path: Path,
    module: str = MODULE,
    *,
    t0: float | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
    stop_grace_s: float = STOP_GRACE_S,
    seconds_per_report: float = SECONDS_PER_REPORT,
    on_death: Callable[[Neighbour], None] | None = None,
) -> Iterator[Neighbour]:
    """Start the load on `gpus` (the names CUDA_VISIBLE_DEVICES takes, e.g. repro.devices.visible_gpus()),
    wait until it runs, yield it; on leaving, stop and reap its whole group, whatever happens.

    `python` must have torch with CUDA; `env` is runner.child_env(...) (the kit on PYTHONPATH). Times
    are seconds since t0 (time.monotonic(); default: now). A load that exits or is not running within
    ready_timeout_s raises LoadError(GPU_LOAD_START). A death inside the block never raises on leaving:
    `check()` raises GPU_LOAD_DIED, `on_death(neighbour)` runs once from a watcher thread, and
    `record()` carries a `failure`."""
    if not gpus:
        raise ValueError("the GPU load needs at least one GPU")
    t0 = time.monotonic() if t0 is None else t0
    status_path = status_path_for(log_path)
    status_path.unlink(missing_ok=True)  # a previous run's "running" must not pass for this one's
    child_env = dict(env, CUDA_VISIBLE_DEVICES=",".join(gpus))
    argv = command(python, module, len(gpus), status_path, seconds_per_report)
    try:
        proc, lifeline = start_child(argv, log_path=log_path, env=child_env)
    except OSError as exc:
        raise LoadError(GPU_LOAD_START, f"the GPU-load neighbour could not be started: {exc}") from exc
    load = Neighbour(proc, list(gpus), module, log_path, status_path, child_env, t0)
    stop_watch = threading.Event()
    watcher = threading.Thread(target=_watch, args=(load, stop_watch, on_death), name="kvkit-gpu-load", daemon=True)
    try:
        wait_running(load, time.monotonic() + ready_timeout_s, ready_timeout_s)
        watcher.start()
        yield load
    finally:
        with deferred_signals():  # a second Ctrl-C must not leave the group half stopped
            load.stopping = load.proc.poll() is None or load.stopping
            load._mark_end()
            kill_group(proc, grace_s=stop_grace_s if proc.poll() is None else 0)  # leftovers: at once
            os.close(lifeline)  # only now: its watcher was reaped with the group
            stop_watch.set()
            if watcher.is_alive():
                watcher.join()
        with contextlib.suppress(LoadError):
            load.read_status()  # its last word: the counters at SIGTERM
        redact_log(log_path, child_env)  # the group is gone: the file can be rewritten


def wait_running(load: Neighbour, deadline: float, timeout_s: float) -> None:
    """Poll the status file until it says running; raise GPU_LOAD_START if the child exits or time runs out."""
    while True:
        if not load.alive():
            raise LoadError(
                GPU_LOAD_START,
                f"the GPU-load neighbour exited before it was running ({load.how_it_ended()})",
                load.log_tail(),
            )
        doc = load.read_status()
        if doc is not None and doc.get("state") == "running":
            load.started_s = load.now_s()
            return
        if time.monotonic() >= deadline:
            state = "no status file" if doc is None else f"status {doc.get('state')!r}"
            raise LoadError(
                GPU_LOAD_START,
                f"the GPU-load neighbour was not running within {timeout_s:g} s ({state}, {load.status_path.name})",
                load.log_tail(),
            )
        time.sleep(_POLL_S)


def _watch(load: Neighbour, stop: threading.Event, on_death: Callable[[Neighbour], None] | None) -> None:
    """Note the moment of a death (ended_s), and tell on_death; the status is re-read as it goes."""
    while not stop.wait(_POLL_S):
        if not load.alive():
            if not load.stopping and on_death is not None:
                on_death(load)
            return
        with contextlib.suppress(LoadError):
            load.read_status()
