"""PlantedFaultConnector: stores KV faithfully, corrupts it on load, and says it loaded it all.

A positive control for the verifier. It behaves like a working external KV cache (block-granular
prefix keys, counted hits, `kv_transfer_params` saying how many tokens were loaded) while the
load path applies one configured fault. Blocks are copied whole (`kv[block_id]`), which assumes a
per-layer KV tensor indexed by block first: vLLM's CPU backend, whose layout is
(num_blocks, num_kv_heads, block_size, 2 * head_size). Per head, that memory is all the block's
K rows (block_size x head_size) followed by all its V rows: the backend views it as
(num_kv_heads, 2 * block_size, head_size) and splits dim 1 in two (cpu_attn.py).

Configure through `kv_connector_extra_config`:
  store_dir    directory for stored blocks (a fresh one per arm; the runner makes it)
  fault        one of FAULTS (below)
  first_block  first loaded block the fault touches; negative counts from the end of the loaded
               blocks (-1 is the last one). Default 0, and -num_blocks for the two tail faults.
  num_blocks   how many blocks it touches (default 16, i.e. 256 tokens at block size 16)
  layer        layer index (model order) for corrupt_layer (default 0)
  scale        standard deviation of the noise for corrupt_layer / overwrite_tail (default 1.0)
  audit_path   optional JSON-lines file: one line per load with the faulted blocks and how far
               each loaded block ended up from the stored KV (max |difference|), so a harness can
               show that a fault really changed what attention reads

The faults, each a bug class seen in KV offloading code:
  none           faithful load (a no-fault control)
  zero_blocks    the chunk arrives as zeros (a transfer that never filled its buffer)
  shift_blocks   off by one block: block j gets block j+1's KV (the last loaded block, which has
                 no successor among the loaded ones, gets block j-1's); keys carry RoPE of the
                 wrong positions
  stale          block j gets block j of the most recently stored *other* prompt that has a
                 block j with different content (a stale chunk served for a colliding or
                 reused slot); when no such prompt is stored the block loads faithfully and is
                 not reported as faulted
  other_prompt   every loaded block gets its source as stale picks it (first_block and num_blocks do
                 not apply): the request runs on another prompt's stored KV at the same positions,
                 usually the previous probe's (a prefix served under another prompt's key); only its
                 own last partial block is computed. Its answer may be that prompt's (a replay)
  swap_kv        K and V exchanged within each head (a transposed K/V layout)
  corrupt_layer  Gaussian noise added to one layer's K and V only (a per-layer offset bug)
  overwrite_tail the last num_blocks loaded blocks (a partial last chunk) overwritten with noise
  drop_tail      the last num_blocks loaded blocks are never written but still counted as a hit:
                 attention reads whatever the freshly allocated blocks held

Gates: optional conditions under which a load's fault applies at all (a load a gate holds back
is faithful and reports no faulted blocks). Each load's gate figures go in its audit line and in
`kv_transfer_params["planted_fault"]["gate"]`, so a report shows why a load faulted or not.
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
               union) and min (2). Plain probes run one request at a time (max_num_seqs 1, each
               generate call finished before the next): in_flight is 1 and the gate stays shut;
               several prompts of one generate call with max_num_seqs >= 2 open it.
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

The scheduler side decides which blocks a load faults (and their sources) and evaluates the gates,
so `kv_transfer_params["planted_fault"]` reports exactly what the worker did.

Preemption: a request preempted and resumed asks the connector again (its computed tokens went with
its blocks) and is promised its prompt's stored blocks; vLLM's V1 model runner then sends it among
scheduler_output.scheduled_cached_reqs (resumed_req_ids, all its block IDs anew), not among the new
ones, and the connector loads it there, the fault and gates applying as to any load. Its
kv_transfer_params then also carry "loads" (each load in order: loaded_tokens, faulted_blocks,
resumed, gate) and faulted_blocks is their union; its audit line says "resumed": true.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

FAULTS = (
    "none",
    "zero_blocks",
    "shift_blocks",
    "stale",
    "swap_kv",
    "corrupt_layer",
    "overwrite_tail",
    "drop_tail",
    "other_prompt",
)
TAIL_FAULTS = ("overwrite_tail", "drop_tail")
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


def in_flight_figures(scheduled: set[str], unfinished: set[str]) -> dict:
    """The in_flight gate's figures for one scheduler step: the requests it schedules, those the
    connector saw scheduled and not finished, their union, and whether that is enough to fault."""
    union = len(scheduled | unfinished)
    return {
        "scheduled": len(scheduled),
        "unfinished": len(unfinished),
        "in_flight": union,
        "min": IN_FLIGHT_MIN,
        "open": union >= IN_FLIGHT_MIN,
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


def faulted_indices(fault: str, first_block: int | None, num_blocks: int, n_loaded: int) -> list[int]:
    """Indices among the n_loaded blocks of one load that the fault touches."""
    if fault == "none" or n_loaded <= 0 or num_blocks <= 0:
        return []
    if fault == "other_prompt":
        return list(range(n_loaded))
    if first_block is None:
        first_block = -num_blocks if fault in TAIL_FAULTS else 0
    start = first_block + n_loaded if first_block < 0 else first_block
    return list(range(max(start, 0), min(start + num_blocks, n_loaded)))


def _layer_order(name: str) -> tuple:
    """Model order for layer names: 'layers.10' after 'layers.9' (plain sorting would not)."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


@dataclass
class _Op:
    req_id: str
    kind: str  # "store" | "load"
    keys: list[str]
    block_ids: list[int]
    first_loaded_block: int = 0  # index of keys[0] within the prompt's blocks
    faulted: list[int] = field(default_factory=list)  # indices into keys/block_ids
    sources: dict[int, str] = field(default_factory=dict)  # faulted index -> key its bytes come from
    gate: dict | None = None  # why the gates let this load's fault apply or not (None: no gate set)
    resumed: bool = False  # a load on resuming after preemption


@dataclass
class PlantedFaultMetadata(KVConnectorMetadata):
    ops: list[_Op] = field(default_factory=list)


class PlantedFaultConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        if "store_dir" not in extra:
            raise ValueError("PlantedFaultConnector needs kv_connector_extra_config.store_dir")
        self.store_dir = str(extra["store_dir"])
        self.fault = str(extra.get("fault", "zero_blocks"))
        if self.fault not in FAULTS:
            raise ValueError(f"unknown planted fault {self.fault!r}; choose one of {', '.join(FAULTS)}")
        self.first_block = None if extra.get("first_block") is None else int(extra["first_block"])
        self.num_blocks = int(extra.get("num_blocks", 16))
        self.layer = int(extra.get("layer", 0))
        self.scale = float(extra.get("scale", 1.0))
        self.audit_path = extra.get("audit_path")
        self._init_gates(extra, role)
        self.block_size = vllm_config.cache_config.block_size
        os.makedirs(self.store_dir, exist_ok=True)
        self._external: dict[str, int] = {}
        self._loaded: dict[str, list[tuple]] = {}  # request -> its loads: (tokens, faulted, gate, resumed)
        self._resume_prompts: dict[str, list[int]] = {}  # prompt of a request promised a load, until scheduled
        self._stored_prompts: list[list[str]] = []  # block keys of each stored prompt, oldest first
        self._kv: dict[str, torch.Tensor] = {}

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
        self.once_in = extra.get("once_in")
        self.claimed: bool | None = None
        if self.once_in is not None:
            if not os.path.isabs(str(self.once_in)):
                raise ValueError(f"planted fault option once_in={self.once_in!r} must be an absolute directory")
            if role == KVConnectorRole.SCHEDULER:  # the side that decides faults claims, once per engine
                self.claimed = claim_once(str(self.once_in))

    def _gate_load(self, op: _Op | None = None, step: dict | None = None) -> dict | None:
        """Evaluate the gates for one load: None when none is set, else the figures and "apply".
        step: the in_flight figures of the scheduler step that schedules the load."""
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

    # ---- shared helpers
    def _keys(self, tokens: list[int], n_blocks: int) -> list[str]:
        """Chained per-block prefix hashes: block i's key covers tokens[: (i+1)*block_size]."""
        h, out = hashlib.sha256(), []
        for i in range(n_blocks):
            h.update(repr(tokens[i * self.block_size : (i + 1) * self.block_size]).encode())
            out.append(h.copy().hexdigest())
        return out

    def _path(self, key: str) -> str:
        return os.path.join(self.store_dir, key + ".pt")

    def _have(self, key: str) -> bool:
        return os.path.exists(self._path(key))

    # ---- scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        tokens = list(request.prompt_token_ids or [])
        hit = 0
        for key in self._keys(tokens, (len(tokens) - 1) // self.block_size):  # never the last prompt token
            if not self._have(key):
                break
            hit += 1
        return max(hit * self.block_size - num_computed_tokens, 0), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            self._external[request.request_id] = num_external_tokens
            self._resume_prompts[request.request_id] = list(request.prompt_token_ids or [])

    def _stale_source(self, block: int, key: str) -> str | None:
        """Block `block` of the most recently stored prompt whose block there differs from ours."""
        for keys in reversed(self._stored_prompts):
            if len(keys) > block and keys[block] != key and self._have(keys[block]):
                return keys[block]
        return None

    def _plan_load(self, op: _Op, step: dict | None = None) -> None:
        """Fill op.faulted and op.sources; a sourced fault without a source does not apply, nor does
        one a gate holds back. step: see _gate_load."""
        op.gate = self._gate_load(op, step)
        if op.gate is not None and not op.gate["apply"]:
            return
        n = len(op.keys)
        for j in faulted_indices(self.fault, self.first_block, self.num_blocks, n):
            if self.fault == "shift_blocks":
                src = j + 1 if j + 1 < n else j - 1
                if src < 0:
                    continue
                op.sources[j] = op.keys[src]
            elif self.fault in ("stale", "other_prompt"):
                other = self._stale_source(op.first_loaded_block + j, op.keys[j])
                if other is None:
                    continue
                op.sources[j] = other
            op.faulted.append(j)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = PlantedFaultMetadata()
        step = None
        if self.when == "in_flight":
            self._unfinished.update(req.req_id for req in scheduler_output.scheduled_new_reqs)
            step = in_flight_figures(set(scheduler_output.num_scheduled_tokens), self._unfinished)
        for req in scheduler_output.scheduled_new_reqs:
            tokens = list(req.prompt_token_ids or [])
            block_ids = list(req.block_ids[0])
            external = self._external.pop(req.req_id, 0)
            self._resume_prompts.pop(req.req_id, None)
            if external:
                meta.ops.append(self._load_op(req.req_id, tokens, block_ids, req.num_computed_tokens, external, step))
            else:
                done = min(len(tokens), req.num_computed_tokens + scheduler_output.num_scheduled_tokens[req.req_id])
                n = done // self.block_size
                keys = self._keys(tokens, n)
                todo = [(k, b) for k, b in zip(keys, block_ids[:n]) if not self._have(k)]
                if todo:
                    meta.ops.append(_Op(req.req_id, "store", [k for k, _ in todo], [b for _, b in todo]))
                    self._stored_prompts.append(keys)
                    if self.local_tier is not None:
                        self.local_tier.put([k for k, _ in todo])
        # A request resumed after preemption (vLLM's V1 model runner sends it among the cached requests,
        # with all its block IDs anew) asked the connector again and was promised its prompt's stored
        # blocks: load them, or attention reads whatever its fresh blocks hold.
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if req_id in cached.resumed_req_ids and req_id in self._external:
                external, tokens = self._external.pop(req_id), self._resume_prompts.pop(req_id)
                block_ids = list(cached.new_block_ids[i][0])
                computed = cached.num_computed_tokens[i]
                meta.ops.append(self._load_op(req_id, tokens, block_ids, computed, external, step, resumed=True))
        return meta

    def _load_op(self, req_id, tokens, block_ids, computed: int, external: int, step, resumed: bool = False) -> _Op:
        """Plan one load of `external` tokens after `computed - external` local ones, and remember it for
        the request's kv_transfer_params."""
        local = computed - external
        b0, b1 = local // self.block_size, (local + external) // self.block_size
        op = _Op(req_id, "load", self._keys(tokens, b1)[b0:], block_ids[b0:b1], b0, resumed=resumed)
        self._plan_load(op, step)
        self._loaded.setdefault(req_id, []).append((external, [b0 + j for j in op.faulted], op.gate, op.resumed))
        return op

    def request_finished(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        self._unfinished.discard(request.request_id)
        self._external.pop(request.request_id, None)
        self._resume_prompts.pop(request.request_id, None)
        loads = self._loaded.pop(request.request_id, [(0, [], None, False)])
        loaded, faulted, gate, _ = loads[0]
        report = {"loaded_tokens": loaded, "fault": self.fault, "faulted_blocks": faulted}
        if gate is not None:
            report["gate"] = gate
        if len(loads) > 1 or loads[0][3]:  # loaded again on resuming after preemption: every load, in order
            report["faulted_blocks"] = sorted({b for load in loads for b in load[1]})
            report["loads"] = [
                {"loaded_tokens": n, "faulted_blocks": f, "resumed": r, **({"gate": g} if g is not None else {})}
                for n, f, g, r in loads
            ]
        return False, {"planted_fault": report}

    # ---- worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._kv = dict(sorted(kv_caches.items(), key=lambda item: _layer_order(item[0])))

    def _corrupt(self, blob: torch.Tensor, j: int) -> torch.Tensor:
        """The faulted version of one block, blob: [num_layers, num_kv_heads, block_size, 2*head_size]."""
        if self.fault == "zero_blocks":
            return torch.zeros_like(blob)
        if self.fault == "swap_kv":
            # per head the block is K rows then V rows (see the module docstring): swap the halves
            layers, heads = blob.shape[0], blob.shape[1]
            return blob.reshape(layers, heads, 2, -1).flip(2).reshape(blob.shape).contiguous()
        if self.fault == "corrupt_layer":
            g = torch.Generator().manual_seed(j)
            out = blob.clone()
            out[self.layer] += self.scale * torch.randn(blob.shape[1:], generator=g).to(blob.dtype)
            return out
        if self.fault == "overwrite_tail":
            g = torch.Generator().manual_seed(1000 + j)
            return (self.scale * torch.randn(blob.shape, generator=g)).to(blob.dtype)
        return blob  # shift_blocks, stale and other_prompt: the bytes already come from the wrong block

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        layers = list(self._kv.values())
        for op in self._get_connector_metadata().ops:
            if op.kind != "load":
                continue
            faulted, diffs = set(op.faulted), []
            for j, (key, block_id) in enumerate(zip(op.keys, op.block_ids)):
                true = torch.load(self._path(key))  # [num_layers, *block_shape]
                if j in faulted and self.fault == "drop_tail":
                    src = None  # counted as loaded, never written
                elif j in faulted:
                    src = self._corrupt(torch.load(self._path(op.sources[j])) if j in op.sources else true, j)
                else:
                    src = true
                for li, kv in enumerate(layers):
                    if src is not None:
                        kv[block_id].copy_(src[li].to(kv.device))
                diffs.append(max(float((kv[block_id].cpu() - true[li]).abs().max()) for li, kv in enumerate(layers)))
            self._write_audit(op, diffs)

    def _write_audit(self, op: _Op, diffs: list[float]) -> None:
        if not self.audit_path:
            return
        b0 = op.first_loaded_block
        line = {
            "first_loaded_block": b0,
            "loaded_blocks": len(op.keys),
            "fault": self.fault,
            "faulted_blocks": [b0 + j for j in op.faulted],
            "faulted_max_abs_diff": [[b0 + j, diffs[j]] for j in op.faulted],
            "clean_max_abs_diff": max([d for j, d in enumerate(diffs) if j not in set(op.faulted)], default=0.0),
        }
        if op.gate is not None:
            line["gate"] = op.gate
        if op.resumed:
            line["resumed"] = True
        with open(self.audit_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, sort_keys=True) + "\n")

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        return

    def wait_for_save(self) -> None:
        for op in self._get_connector_metadata().ops:
            if op.kind != "store":
                continue
            for key, block_id in zip(op.keys, op.block_ids):
                blob = torch.stack([kv[block_id].detach().cpu().clone() for kv in self._kv.values()])
                tmp = self._path(key) + f".{os.getpid()}.tmp"
                torch.save(blob, tmp)
                os.replace(tmp, self._path(key))  # visible to lookups only once whole
