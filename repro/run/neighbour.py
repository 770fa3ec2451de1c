"""A load neighbour's life-cycle (parent side): started beside the reuse arms, watched, stopped, recorded.

A fault that shows only on a busy device is found or missed by chance unless the kit makes the device
busy itself. `--gpu-load` (repro.run.gpu_load: matrix products on every GPU the arms use) and `--cpu-load`
(repro.run.cpu_load: one spinning process per CPU core) do that with a neighbour process that the kit
starts before the reuse arms and stops after them and their trials, before any confirmation re-run
alone; the report says when it ran and what it achieved, so which arms ran under load is a fact
rather than a guess. A LoadKind says what differs between them: names, status format, record keys.

Like the LMCache MP server (repro.lmcache.mp), the kit starts the neighbour as its own process group
on a lifeline (repro.run.lifeline: kill -9 of the kit takes it down), waits until its status file says it
is running, stops and reaps the whole group on leaving the block however the block ends, and names
its two failures: <name>-start (did not start, or not running in time) and <name>-died (exited while
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

from repro.contract.failure import Failure
from repro.lmcache.mp import exit_text
from repro.run.lifeline import group_members
from repro.run.runner import deferred_signals, kill_group, redact_log, redacted_tail, start_child

STATUS_SCHEMA_VERSION = 1  # both children's status files (each child module keeps its own copy)
STOP_GRACE_S = 10.0  # SIGTERM to SIGKILL; the children themselves stop within a fraction of a second
SECONDS_PER_REPORT = 1.0
_POLL_S = 0.2


@dataclass(frozen=True)
class LoadKind:
    """What one kind of neighbour is called and how its status reads."""

    name: str  # "gpu-load": its flag (--gpu-load), log (gpu-load.log), sharing window, failure kinds
    noun: str  # "GPU-load neighbour", in its failures' details
    status_kind: str  # the child's status file's `kind`
    targets_key: str  # the record's list of what it loads: "gpus", "cores"
    items_key: str  # the status's and the record's list, one per target: "devices", "workers"
    item_record: Callable[[list[str], dict], dict]  # (targets, one status item) -> the record's item
    module: str  # the child's module
    ready_timeout_s: float  # from its start until its status must say "running"
    # (python, module, targets, status path, seconds per report) -> the child's command line
    argv: Callable[[str, str, list[str], Path, float], list[str]]
    child_env: Callable[[dict[str, str], list[str]], dict[str, str]] = lambda env, targets: dict(env)

    @property
    def flag(self) -> str:
        return f"--{self.name}"

    @property
    def start_failure(self) -> str:
        return f"{self.name}-start"

    @property
    def died_failure(self) -> str:
        return f"{self.name}-died"

    def log_path(self, workdir: Path) -> Path:
        """The neighbour's log, beside the arm logs."""
        return workdir / f"{self.name}.log"


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
    """The neighbour did not start (<name>-start) or died while the arms ran (<name>-died); flag: the
    option that asked for it, for the kit's one line."""

    def __init__(self, kind: str, detail: str, log_tail: str = "", flag: str = "--gpu-load") -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail, self.log_tail, self.flag = kind, detail, log_tail, flag

    def failure(self) -> Failure:
        return Failure(self.kind, self.detail, self.log_tail)


@dataclass(eq=False)
class Neighbour:
    """A running load: its process, when it ran (seconds since the caller's t0), what it last said."""

    kind: LoadKind
    proc: subprocess.Popen
    targets: list[str]  # the GPUs or cores it loads
    module: str
    log_path: Path
    status_path: Path
    env: dict[str, str]
    t0: float  # time.monotonic() of the caller's origin
    started_s: float | None = None  # when its status first said "running"
    ended_s: float | None = None  # when the kit began to stop it, or first saw it dead
    stopping: bool = False  # set once the kit stops it: an exit after that is no death
    last_status: dict | None = None
    left_running: list[int] | None = None  # its group's live processes once the kit stopped it: none
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

    def error(self, kind: str, detail: str) -> LoadError:
        return LoadError(kind, detail, self.log_tail(), self.kind.flag)

    def read_status(self) -> dict | None:
        """Its status file, when it is whole, ours and of this version (kept as last_status)."""
        try:
            doc = json.loads(self.status_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("kind") != self.kind.status_kind or doc.get("pid") != self.pid:
            return None
        if doc.get("schema_version") != STATUS_SCHEMA_VERSION:
            raise self.error(
                self.kind.start_failure,
                f"{self.status_path.name}: status schema_version {doc.get('schema_version')!r}, this kit reads "
                f"{STATUS_SCHEMA_VERSION} (is --python running another kit?)",
            )
        self.last_status = doc
        return doc

    def check(self) -> None:
        """Raise <name>-died if the load has exited (call it after the arms, and whenever)."""
        if self.alive():
            return
        self.read_status()
        error = (self.last_status or {}).get("error")
        detail = f"the {self.kind.noun} exited while the arms ran ({self.how_it_ended()}) at {self.ended_s:g} s"
        raise self.error(self.kind.died_failure, detail + (f": {error}" if error else ""))

    def how_it_ended(self) -> str:
        if self.proc.returncode is None:
            return "running"
        return "stopped by the kit" if self.stopping else exit_text(self.proc.returncode)

    def log_tail(self) -> str:
        return redacted_tail(self.log_path, self.env)

    def record(self) -> dict:
        """The report's `conditions.<gpu_load|cpu_load>`: what and when it loaded, and what each part achieved."""
        items = (self.last_status or {}).get(self.kind.items_key) or []
        out = {
            self.kind.targets_key: list(self.targets),
            "module": self.module,
            "started_s": self.started_s,
            "ended_s": self.ended_s,
            self.kind.items_key: [self.kind.item_record(self.targets, d) for d in items if isinstance(d, dict)],
            "state": (self.last_status or {}).get("state"),
            "ended": self.how_it_ended(),
            "returncode": self.proc.returncode,
            "log": self.log_path.name,
        }
        if self.left_running is not None:
            out["left_running"] = list(self.left_running)  # [] : nothing of it ran on into what came after
        if self.proc.returncode is not None and not self.stopping:
            out["failure"] = {
                "kind": self.kind.died_failure,
                "detail": f"exited while the arms ran ({self.how_it_ended()})",
            }
        return out


@contextlib.contextmanager
def neighbour(
    kind: LoadKind,
    python: str,
    targets: list[str],
    env: dict[str, str],
    log_path: Path,
    module: str | None = None,
    *,
    t0: float | None = None,
    ready_timeout_s: float | None = None,
    stop_grace_s: float = STOP_GRACE_S,
    seconds_per_report: float = SECONDS_PER_REPORT,
    on_death: Callable[[Neighbour], None] | None = None,
) -> Iterator[Neighbour]:
    """Start the load of this kind on `targets` (its GPUs or cores) with `python` running `module` (default:
    the kind's), wait until it runs, yield it; on leaving, stop and reap its whole group, whatever happens.

    `env` is runner.child_env(...) (the kit on PYTHONPATH). Times are seconds since t0 (time.monotonic();
    default: now). A load that exits or is not running within ready_timeout_s (default: the kind's) raises
    LoadError(<name>-start). A death inside the block never raises on leaving: `check()` raises
    <name>-died, `on_death(neighbour)` runs once from a watcher thread, and `record()` carries a `failure`."""
    if not targets:
        raise ValueError(f"the {kind.noun} needs something to load (no {kind.targets_key})")
    module = module or kind.module
    ready_timeout_s = kind.ready_timeout_s if ready_timeout_s is None else ready_timeout_s
    t0 = time.monotonic() if t0 is None else t0
    status_path = status_path_for(log_path)
    status_path.unlink(missing_ok=True)  # a previous run's "running" must not pass for this one's
    argv = kind.argv(python, module, list(targets), status_path, seconds_per_report)
    env = kind.child_env(env, list(targets))
    try:
        proc, lifeline = start_child(argv, log_path=log_path, env=env)
    except OSError as exc:
        raise LoadError(kind.start_failure, f"the {kind.noun} could not be started: {exc}", flag=kind.flag) from exc
    load = Neighbour(kind, proc, list(targets), module, log_path, status_path, env, t0)
    stop_watch = threading.Event()
    watcher = threading.Thread(target=_watch, args=(load, stop_watch, on_death), name=f"kvkit-{kind.name}", daemon=True)
    try:
        wait_running(load, time.monotonic() + ready_timeout_s, ready_timeout_s)
        watcher.start()
        yield load
    finally:
        with deferred_signals():  # a second Ctrl-C must not leave the group half stopped
            load.stopping = load.proc.poll() is None or load.stopping
            load._mark_end()
            kill_group(proc, grace_s=stop_grace_s if proc.poll() is None else 0)  # leftovers: at once
            load.left_running = group_members(proc.pid)  # what follows (a re-run alone) must run without it
            os.close(lifeline)  # only now: its watcher was reaped with the group
            stop_watch.set()
            if watcher.is_alive():
                watcher.join()
        with contextlib.suppress(LoadError):
            load.read_status()  # its last word: the counters at SIGTERM
        redact_log(log_path, env)  # the group is gone: the file can be rewritten


def wait_running(load: Neighbour, deadline: float, timeout_s: float) -> None:
    """Poll the status file until it says running; raise <name>-start if the child exits or time runs out."""
    noun = load.kind.noun
    while True:
        if not load.alive():
            raise load.error(
                load.kind.start_failure, f"the {noun} exited before it was running ({load.how_it_ended()})"
            )
        doc = load.read_status()
        if doc is not None and doc.get("state") == "running":
            load.started_s = load.now_s()
            return
        if time.monotonic() >= deadline:
            state = "no status file" if doc is None else f"status {doc.get('state')!r}"
            raise load.error(
                load.kind.start_failure,
                f"the {noun} was not running within {timeout_s:g} s ({state}, {load.status_path.name})",
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
