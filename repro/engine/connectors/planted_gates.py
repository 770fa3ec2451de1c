"""The planted fault's gates (repro.engine.connectors.planted_fault): optional conditions under which a
load's fault applies at all (a load a gate holds back is faithful and reports no faulted blocks). The
connector takes them from `kv_connector_extra_config` (LoadGates, mixed in). Each load's gate figures go
in its audit line and in `kv_transfer_params["planted_fault"]["gate"]`, so a report shows why a load
faulted or not.
  when         "always" (default), "contended", "in_flight" or "after_eviction", one of them.
  when "contended": a race with another process for the CPU. At each load the scheduler
               does a fixed amount of CPU work standing for an asynchronous copy
               (contended_cpu_ms of this thread's CPU time, default 40) and reads how long the thread
               waited on a run queue meanwhile (/proc/thread-self/schedstat, 2nd field). If the wait
               reaches contended_ratio (default 0.25) of the copy's CPU time, the copy "missed its
               window" and the load faults. Why 0.25: a thread sharing its core with one other
               runnable thread for the whole copy waits about as long as it runs (ratio ~1, r with r
               of them); one alone on the machine waits only for short wake-ups of idle daemons
               (well under a millisecond each, ratio < 0.05 over 40 ms). 0.25 sits between the two
               (a quarter of the copy, 10 ms, is several scheduler slices), so a load faults when
               another process was runnable on its core for a real part of the copy, not for a blip.
               The engine itself keeps one core busy meanwhile: its worker busy-waits (sched_yield)
               for the scheduler's next output for up to 1 s after each step (vLLM shm_broadcast
               SpinCondition), so the copy runs on the other core; alone on an idle 2-core machine
               it has that core to itself. Any other runnable process counts as contention, the
               kit's own arms or not: the figures recorded with each load (runnable tasks on the
               machine before and after, CPU time of the engine's other threads and processes
               during the copy) say where it came from.
               Where schedstat is unreadable (no CONFIG_SCHEDSTATS / SCHED_INFO, not Linux) the
               connector refuses to start and says so, rather than never or always fault.
  when "in_flight": a load faults only when another request is in flight with it. Decided in
               build_connector_meta from what the scheduler hands the connector: the requests of
               that step's scheduler_output.num_scheduled_tokens (new, resumed and running ones
               scheduled in the step, the load's own included), together with the requests the
               connector saw scheduled and has not yet seen finish (request_finished), which covers
               a running request the step left out (token budget) or one preempted and waiting to
               resume. A request still waiting, never scheduled, does not count: it shares no batch
               with the load. The load faults when that union holds at least 2 requests. Recorded:
               scheduled (the step's count), unfinished (the connector's count), in_flight (the
               union) and min (2, or in_flight_min). Plain probes run one request at a time (max_num_seqs 1,
               each generate call finished before the next): in_flight is 1 and the gate stays shut;
               several prompts of one generate call with max_num_seqs >= 2 open it.
  in_flight_min with when "in_flight": the union must hold at least this many requests (an integer, default
               2): 16 keeps the gate shut for the four-probe in-flight scenario and opens it only under load.
  when "after_eviction" with local_capacity_blocks N (a positive integer, required then and
               refused with any other `when`): the scheduler side keeps a local tier of N block keys,
               least recently used first, in front of the store (store_dir stands for the next
               tier, which keeps every block). A stored block enters the local tier, pushing out the
               least recently used beyond N; a loaded block is served from the local tier if it is
               there, else from the next tier, and either way becomes the most recently used (a
               reload is promoted). A load faults when at least one of its blocks was evicted from
               this engine's local tier (so it came from the next tier); a block the next tier holds
               that this engine never held (another engine stored it) is counted apart and does not
               open the gate. The fault then touches the blocks its first_block / num_blocks name, as
               always, not only the reloaded ones. Recorded: capacity_blocks, local_blocks,
               next_tier_blocks, evicted_blocks (their prompt block indices), never_local_blocks and
               evictions (the engine's total so far). Plain probes (a probe's cold request, then its
               reuses; N at least the blocks of the longest probe) never open it; A, B, A with more
               blocks in A and B together than N does.
  once_in      an absolute directory shared by the engines of one arm's trials: at construction
               the scheduler side claims DIR/claim (O_CREAT | O_EXCL, atomic); only the engine
               that wins applies the fault, every other engine loads faithfully. So of N fresh
               engines exactly one faults: an intermittent fault. Delete the claim to re-arm.
`when` takes one value; once_in combines with any of them: a load then faults only when both let it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

WHEN = ("always", "contended", "in_flight", "after_eviction")
SCHEDSTAT_PATH = "/proc/thread-self/schedstat"
CONTENDED_CPU_MS = 40.0  # the stand-in copy: long enough for many scheduler slices (a few ms each)
CONTENDED_RATIO = 0.25  # see the module docstring for why
CLAIM_NAME = "claim"
IN_FLIGHT_MIN = 2  # the load's own request and at least one other


class SchedstatUnavailable(RuntimeError):
    """This system does not say how long a thread waited on a run queue."""


def parse_schedstat(text: str) -> tuple[int, int]:
    """(ns on a CPU, ns waiting on a run queue) from a schedstat line "<run> <wait> <timeslices>"."""
    fields = text.split()
    if len(fields) < 2 or not all(f.isdigit() for f in fields[:2]):
        raise SchedstatUnavailable(f"unexpected schedstat line {text.strip()[:80]!r}")
    return int(fields[0]), int(fields[1])


def read_runqueue_wait_ns(path: str | None = None) -> int:
    """How long the calling thread has waited on a run queue, in ns; SchedstatUnavailable if unknown."""
    path = path or SCHEDSTAT_PATH
    try:
        with open(path, encoding="ascii") as fh:
            text = fh.read()
    except OSError as exc:
        raise SchedstatUnavailable(f"{path} is not readable ({exc.strerror or exc})") from None
    return parse_schedstat(text)[1]


def missed_window(cpu_ns: int, wait_ns: int, ratio: float) -> bool:
    """Whether a copy that ran cpu_ns waited long enough on a run queue to have missed its window."""
    return cpu_ns > 0 and wait_ns >= ratio * cpu_ns


def runnable_tasks() -> int | None:
    """Tasks runnable on the whole machine now, this one included (/proc/loadavg), None if unknown:
    recorded next to a copy's wait so a report shows whether other processes were competing."""
    try:
        with open("/proc/loadavg", encoding="ascii") as fh:
            return int(fh.read().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


def _task_cpu_ns(pid: int, skip_tid: int | None = None) -> int:
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        if skip_tid is not None and tid == str(skip_tid):
            continue
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as fh:
                total += parse_schedstat(fh.read())[0]
        except (OSError, SchedstatUnavailable):
            continue  # a thread that ended meanwhile
    return total


def engine_cpu_ns() -> int:
    """CPU time so far of this engine's other threads and processes: this process's threads but the
    caller, its parent (the frontend) and its children (the workers). Recorded next to a copy's
    wait: when it barely moved during the copy, the wait came from outside the engine."""
    me = os.getpid()
    pids = [os.getppid()]
    try:
        with open(f"/proc/{me}/task/{me}/children", encoding="ascii") as fh:
            pids += [int(c) for c in fh.read().split()]
    except OSError:
        pass
    return _task_cpu_ns(me, skip_tid=threading.get_native_id()) + sum(_task_cpu_ns(p) for p in pids)


def timed_copy(cpu_ns: int, path: str | None = None) -> dict:
    """Spend cpu_ns of this thread's CPU time (the stand-in for a copy) and say how long the thread
    waited on a run queue meanwhile: {"cpu_ns", "wait_ns", "wall_ns", "runnable": [before, after],
    "engine_other_cpu_ns"} (the last two say where the competition came from; see engine_cpu_ns)."""
    runnable0, engine0 = runnable_tasks(), engine_cpu_ns()
    wait0, cpu0, wall0 = read_runqueue_wait_ns(path), time.thread_time_ns(), time.monotonic_ns()
    x = 0
    while time.thread_time_ns() - cpu0 < cpu_ns:
        for i in range(2000):  # arithmetic between clock reads, so the clock is not the whole work
            x ^= i * 2654435761
    wait1, cpu1, wall1 = read_runqueue_wait_ns(path), time.thread_time_ns(), time.monotonic_ns()
    return {
        "cpu_ns": cpu1 - cpu0,
        "wait_ns": wait1 - wait0,
        "wall_ns": wall1 - wall0,
        "runnable": [runnable0, runnable_tasks()],
        "engine_other_cpu_ns": engine_cpu_ns() - engine0,
    }


def claim_once(directory: str) -> bool:
    """Atomically claim directory/claim: True for exactly one caller, ever (until the file is removed)."""
    os.makedirs(directory, exist_ok=True)
    try:
        fd = os.open(os.path.join(directory, CLAIM_NAME), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"pid": os.getpid()}) + "\n")
    return True


def in_flight_figures(scheduled: set[str], unfinished: set[str], minimum: int = IN_FLIGHT_MIN) -> dict:
    """The in_flight gate's figures for one scheduler step: the requests it schedules, those the
    connector saw scheduled and not finished, their union, and whether that reaches `minimum` (in_flight_min)."""
    union = len(scheduled | unfinished)
    return {
        "scheduled": len(scheduled),
        "unfinished": len(unfinished),
        "in_flight": union,
        "min": minimum,
        "open": union >= minimum,
    }


class LocalTier:
    """The after_eviction gate's local tier: `capacity` block keys, least recently used first, in
    front of a next tier that keeps every block. Only keys: the bytes stay in the store."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._keys: OrderedDict[str, None] = OrderedDict()
        self._evicted: set[str] = set()  # held here once, pushed out, not back since
        self.evictions = 0

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def put(self, keys: list[str]) -> None:
        """Make keys the most recently used, in order, then evict the least recently used beyond
        capacity (so one put never evicts its own keys to make room for each other, unless there are
        more of them than the tier holds)."""
        for key in keys:
            self._keys[key] = None
            self._keys.move_to_end(key)
            self._evicted.discard(key)
        while len(self._keys) > self.capacity:
            old, _ = self._keys.popitem(last=False)
            self._evicted.add(old)
            self.evictions += 1

    def load(self, keys: list[str], first_block: int = 0) -> dict:
        """Serve one load's blocks (keys[j] is prompt block first_block + j): the gate's figures,
        then every key promoted to most recently used, in order."""
        local = [k in self._keys for k in keys]
        evicted = [first_block + j for j, k in enumerate(keys) if not local[j] and k in self._evicted]
        figures = {
            "capacity_blocks": self.capacity,
            "local_blocks": sum(local),
            "next_tier_blocks": len(keys) - sum(local),
            "evicted_blocks": evicted,
            "never_local_blocks": len(keys) - sum(local) - len(evicted),
        }
        self.put(keys)
        figures["evictions"] = self.evictions
        figures["open"] = bool(evicted)
        return figures


class LoadGates:
    """The gates' half of the planted connector: its settings, checked at construction, and each load's
    gate figures (the connector's scheduler side asks once per load it plans)."""

    def _init_gates(self, extra: dict, role) -> None:
        self.when = str(extra.get("when", "always"))
        if self.when not in WHEN:
            raise ValueError(f"planted fault option when={self.when!r}; choose one of {', '.join(WHEN)}")
        self.contended_cpu_ns = int(float(extra.get("contended_cpu_ms", CONTENDED_CPU_MS)) * 1e6)
        self.contended_ratio = float(extra.get("contended_ratio", CONTENDED_RATIO))
        if self.when == "contended":
            try:
                read_runqueue_wait_ns()
            except SchedstatUnavailable as exc:
                raise ValueError(f"planted fault when=contended cannot measure run-queue wait: {exc}") from None
        capacity = extra.get("local_capacity_blocks")
        self.local_tier: LocalTier | None = None
        if self.when == "after_eviction":
            if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
                raise ValueError(
                    f"planted fault when=after_eviction needs local_capacity_blocks, a positive integer "
                    f"(the local tier's size in blocks); got {capacity!r}"
                )
            self.local_tier = LocalTier(capacity)
        elif capacity is not None:
            raise ValueError(
                f"planted fault option local_capacity_blocks={capacity!r} applies only to when=after_eviction "
                f"(when={self.when!r})"
            )
        self._unfinished: set[str] = set()  # requests seen scheduled, not yet finished (in_flight)
        minimum = extra.get("in_flight_min", IN_FLIGHT_MIN)
        if isinstance(minimum, bool) or not isinstance(minimum, int) or minimum < IN_FLIGHT_MIN:
            raise ValueError(f"planted fault option in_flight_min={minimum!r}: an integer of at least {IN_FLIGHT_MIN}")
        if "in_flight_min" in extra and self.when != "in_flight":
            raise ValueError(f"planted fault option in_flight_min applies only to when=in_flight (when={self.when!r})")
        self.in_flight_min = minimum
        self.once_in = extra.get("once_in")
        self.claimed: bool | None = None
        if self.once_in is not None:
            if not os.path.isabs(str(self.once_in)):
                raise ValueError(f"planted fault option once_in={self.once_in!r} must be an absolute directory")
            if role == KVConnectorRole.SCHEDULER:  # the side that decides faults claims, once per engine
                self.claimed = claim_once(str(self.once_in))

    def _gate_load(self, op: Any | None = None, step: dict | None = None) -> dict | None:
        """Evaluate the gates for one load (op: the connector's planned load): None when none is set, else
        the figures and "apply". step: the in_flight figures of the scheduler step that schedules the load."""
        if self.when == "always" and self.once_in is None:
            return None
        gate: dict[str, Any] = {"apply": True}
        if self.once_in is not None:
            gate["once_in"] = {"dir": str(self.once_in), "claimed": bool(self.claimed)}
            gate["apply"] = bool(self.claimed)
        if self.when == "contended":
            try:
                copy = timed_copy(self.contended_cpu_ns)
            except SchedstatUnavailable as exc:  # readable at start, not now: say so, load faithfully
                gate["contended"] = {"unavailable": str(exc)}
                gate["apply"] = False
                return gate
            missed = missed_window(copy["cpu_ns"], copy["wait_ns"], self.contended_ratio)
            ratio = copy["wait_ns"] / copy["cpu_ns"] if copy["cpu_ns"] else None
            gate["contended"] = {**copy, "wait_ratio": ratio, "threshold": self.contended_ratio, "missed": missed}
            gate["apply"] = gate["apply"] and missed
        elif self.when == "in_flight":
            gate["in_flight"] = step if step is not None else {"unavailable": "no scheduler step for this load"}
            gate["apply"] = gate["apply"] and bool(step and step["open"])
        elif self.when == "after_eviction":
            tier = self.local_tier.load(op.keys, op.first_loaded_block) if op is not None else None
            gate["after_eviction"] = tier if tier is not None else {"unavailable": "no load to serve"}
            gate["apply"] = gate["apply"] and bool(tier and tier["open"])
        return gate
