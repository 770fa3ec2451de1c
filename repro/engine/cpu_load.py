"""The CPU-load neighbour (child side): one spinning process per given CPU core until SIGTERM.

`python -m repro.engine.cpu_load --cores 0,1 --status FILE [--seconds-per-report 1]` forks one worker
per listed core, pinned to it where the machine lets it and at the niceness it inherits (a kit run at
nice 0 gives workers of nice 0: they compete with the arms as equals), each an endless loop of integer
arithmetic that counts its rounds in shared memory. It writes a small JSON status file (STATUS_KIND)
about once a second: per worker its core, pid, the cores it may run on, niceness, rounds, CPU seconds
and run-queue wait (/proc/<pid>/schedstat). `state` is "starting" until every worker counted a round,
"running" after, and "stopped" (SIGTERM) or "failed" (a worker exited by itself; exit 1) at the end.

Why: a copy that must finish within a window (the planted fault's `when: contended` gate stands for
one) misses it only when another runnable process holds its core; whether other arms happen to do so
depends on the machine. This process is that other process, on every core, run beside the reuse
arms by repro.run.cpu_load (the parent side) and stopped before any confirmation re-run alone.

It must stop at once and leave nothing: the workers are in its process group (the kit's SIGTERM and
SIGKILL reach them), it reaps them before it exits, and a worker whose parent is gone (kill -9 of
this process) ends by itself within one round (a few milliseconds). No torch, no threads.
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import os
import signal
import sys
import time
from dataclasses import dataclass, field

from repro.engine.gpu_load import status_document, utc_now, write_status

# The status file the parent (repro.run.cpu_load) polls; it checks kind and version (keep them equal there).
# Version 1: state, pid, started_utc, last_utc, error (if any),
# workers[{worker, core, pid, affinity, nice, iterations, cpu_s, wait_s, returncode}].
STATUS_KIND = "kvkit-cpu-load-status"
STATUS_SCHEMA_VERSION = 1
ROUND = 50_000  # multiply-xors between counts and parent checks: a few milliseconds of CPython
_POLL_S = 0.05
_SETTLE_S = 0.3  # a worker's exit is a failure only if no stop arrives this soon after (the kit stops the group)


def spin(counts: memoryview, index: int, parent: int) -> None:
    """Keep this core busy, counting rounds in counts[index], for as long as the parent lives."""
    x = 0
    while os.getppid() == parent:
        for i in range(ROUND):
            x ^= i * 2654435761
        counts[index] += 1


def start_worker(core: int, index: int, counts: memoryview, parent: int) -> int:
    """Fork a worker pinned to core (if the machine allows); the parent gets its pid. The worker never
    returns into the caller's code: it leaves by os._exit."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        with contextlib.suppress(OSError):  # a core outside this cgroup's set: the scheduler places it
            os.sched_setaffinity(0, {core})
        spin(counts, index, parent)
        code = 0
    finally:
        os._exit(code)


def schedstat(pid: int) -> tuple[int, int] | None:
    """(CPU ns, run-queue wait ns) of a process's main thread, None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/schedstat", encoding="ascii") as fh:
            cpu, wait = fh.read().split()[:2]
        return int(cpu), int(wait)
    except (OSError, ValueError):
        return None


def exit_words(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


@dataclass
class Worker:
    index: int
    core: int
    pid: int
    affinity: list[int] | None = None
    nice: int | None = None
    cpu_ns: int | None = None
    wait_ns: int | None = None
    returncode: int | None = None  # once reaped: os.waitstatus_to_exitcode
    ended: str = ""  # "exit status 1", once reaped
    counts: memoryview | None = field(default=None, repr=False)

    def refresh(self) -> None:
        """Its figures from /proc while it is there (kept from the last reading after)."""
        if self.returncode is not None:
            return
        with contextlib.suppress(OSError):
            self.affinity = sorted(os.sched_getaffinity(self.pid))
        with contextlib.suppress(OSError):
            self.nice = os.getpriority(os.PRIO_PROCESS, self.pid)
        figures = schedstat(self.pid)
        if figures is not None:
            self.cpu_ns, self.wait_ns = figures

    def poll(self) -> bool:
        """Whether it has exited (reaped now, or before)."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid == 0:
                return False
            self.returncode, self.ended = os.waitstatus_to_exitcode(status), exit_words(status)
        return True

    def to_json(self) -> dict:
        def s(ns: int | None) -> float | None:
            return None if ns is None else round(ns / 1e9, 3)

        return {
            "worker": self.index,
            "core": self.core,
            "pid": self.pid,
            "affinity": self.affinity,
            "nice": self.nice,
            "iterations": int(self.counts[self.index]) if self.counts is not None else 0,
            "cpu_s": s(self.cpu_ns),
            "wait_s": s(self.wait_ns),
            "returncode": self.returncode,
        }


def stop_workers(workers: list[Worker]) -> None:
    """Their last figures, then SIGKILL to those still running, and every one reaped."""
    for w in workers:
        w.refresh()
        if w.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, signal.SIGKILL)
    for w in workers:
        if w.returncode is None:
            with contextlib.suppress(ChildProcessError):
                _, status = os.waitpid(w.pid, 0)
                w.returncode, w.ended = os.waitstatus_to_exitcode(status), exit_words(status)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m repro.engine.cpu_load", description=__doc__.splitlines()[0])
    p.add_argument("--cores", required=True, help="CPU numbers, comma-separated: one worker each")
    p.add_argument("--status", required=True, help="the JSON status file, rewritten about once a report interval")
    p.add_argument("--seconds-per-report", type=float, default=1.0)
    args = p.parse_args(argv)
    try:
        args.cores = [int(c) for c in args.cores.split(",") if c.strip()]
    except ValueError:
        p.error(f"--cores {args.cores!r}: CPU numbers, comma-separated")
    if not args.cores or min(args.cores) < 0 or len(set(args.cores)) != len(args.cores) or args.seconds_per_report <= 0:
        p.error("--cores must name distinct CPUs (0 or more); --seconds-per-report must be positive")
    return args


def _document(state: str, started: str, workers: list[Worker], error: str | None = None) -> dict:
    return status_document(state, started, [w.to_json() for w in workers], error, kind=STATUS_KIND, key="workers")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    asked: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: asked.append(signum))
    signal.signal(signal.SIGINT, lambda signum, frame: asked.append(signum))
    started, parent = utc_now(), os.getpid()
    shared = mmap.mmap(-1, 8 * len(args.cores))  # anonymous and shared: the forked workers count into it
    counts = memoryview(shared).cast("Q")
    workers = [
        Worker(i, core, start_worker(core, i, counts, parent), counts=counts) for i, core in enumerate(args.cores)
    ]
    print(f"kvkit cpu-load: pid {parent}, cores {args.cores}, workers {[w.pid for w in workers]}, "
          f"nice {os.getpriority(os.PRIO_PROCESS, 0)}, status {args.status}", flush=True)  # fmt: skip
    error, announced, next_report = None, False, 0.0
    while not asked:
        dead = [w for w in workers if w.poll()]
        if dead:
            time.sleep(_SETTLE_S)  # the kit's stop reaches the whole group at once: wait for ours
            if not asked:
                error = "; ".join(f"worker {w.index} on core {w.core} (pid {w.pid}) {w.ended}" for w in dead)
            break
        if time.monotonic() >= next_report:
            for w in workers:
                w.refresh()
            running = all(counts[w.index] > 0 for w in workers)
            if running and not announced:
                print(f"kvkit cpu-load: running, {len(workers)} workers", flush=True)
                announced = True
            write_status(args.status, _document("running" if running else "starting", started, workers))
            next_report = time.monotonic() + args.seconds_per_report
        time.sleep(_POLL_S)  # a signal wakes it; its handler has run when it returns
    stop_workers(workers)
    state = "failed" if error else "stopped"
    write_status(args.status, _document(state, started, workers, error))
    print(f"kvkit cpu-load: {state} " + ", ".join(f"core {w.core}: {counts[w.index]} rounds, "
          f"{(w.cpu_ns or 0) / 1e9:.1f} s CPU, {(w.wait_ns or 0) / 1e9:.1f} s waiting" for w in workers)
          + (f"; {error}" if error else ""), flush=True)  # fmt: skip
    counts.release()
    shared.close()
    return 1 if error else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
