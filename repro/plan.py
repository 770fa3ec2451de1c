"""Planning a verification run: which arms run, in what order, and the job each arm's child gets."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from repro import devices
from repro.cli import DEFAULT_ENGINE_MODULE, Options
from repro.contract import (
    ArmResult,
    ArmSpec,
    ConnectorSpec,
    EngineConfig,
    Job,
    Preflight,
    PreflightConnector,
    ProbeJob,
    build_job,
)
from repro.errors import UsageError
from repro.fixtures import Fixture, Probe, arm_name_problem
from repro.suite import requests_for

# A connector setting with this value gets a fresh directory for its arm alone.
TMPDIR_TOKEN = "@tmpdir"
_SCRATCH_PREFIX = "kvkit-"  # materialize's directories: kvkit-<arm>-XXXXXXXX
PLANTED_FAULT_MODULE = "repro.engine.connectors.planted_fault"
NATIVE_MATCHED = "native-matched"


@dataclass(frozen=True)
class PlannedArm:
    spec: ArmSpec
    skip_probes: dict = field(default_factory=dict)  # probe name -> why this arm cannot run it
    match_arm: str | None = None  # native-matched: the connector arm whose reuse lengths it copies
    lmcache_ops: str | None = None  # the fixture arm's own LMCache copy path (else --lmcache-ops)
    env: dict = field(default_factory=dict)  # what its processes' environment holds apart (its copy path)
    skip_scenarios: dict = field(default_factory=dict)  # scenario name -> why this arm cannot run it

    @property
    def name(self) -> str:
        return self.spec.name


def plan_arms(opts: Options, fixture: Fixture) -> list[PlannedArm]:
    """baseline first, then the connector arm(s) (the command line's, else the fixture's), then native."""
    a = opts.args
    arms = [PlannedArm(ArmSpec("baseline", "baseline"))]
    if a.kv_connector:
        if (problem := arm_name_problem(a.kv_connector)) is not None:  # the arm is named after it
            raise UsageError(f"--kv-connector: {problem}")
        extra = dict(opts.extra_config)
        if a.kv_connector == "ExampleConnector":
            extra.setdefault("shared_storage_path", TMPDIR_TOKEN)
        if a.kv_connector == "PlantedFaultConnector" and a.kv_connector_module_path == PLANTED_FAULT_MODULE:
            extra.setdefault("store_dir", TMPDIR_TOKEN)
        conn = ConnectorSpec(a.kv_connector, a.kv_connector_module_path, extra)
        arms.append(PlannedArm(ArmSpec(a.kv_connector, "connector", conn)))
    else:
        for spec in fixture.arms:
            conn = ConnectorSpec(spec.connector, spec.module_path, dict(spec.extra_config))
            arms.append(
                PlannedArm(
                    ArmSpec(spec.name, "connector", conn),
                    dict(spec.skip_probes),
                    lmcache_ops=spec.lmcache_ops,
                    skip_scenarios=dict(spec.skip_scenarios),
                )
            )
    if a.compare_native:
        arms.append(PlannedArm(ArmSpec("native", "native")))
        connectors = [arm.name for arm in arms if arm.spec.mode == "connector"]
        # the critic's control: native reusing exactly what the connector reused
        if connectors and not a.no_native_matched:
            arms.append(PlannedArm(ArmSpec(NATIVE_MATCHED, "native"), match_arm=connectors[0]))
    if len(arms) == 1:
        raise UsageError(
            "nothing to compare: give --kv-connector or --compare-native (or a fixture that declares arms)"
        )
    return arms


def materialize(arm: PlannedArm, scratch: list[str], root: str | Path | None = None) -> PlannedArm:
    """Replace @tmpdir in connector settings with a fresh directory for this arm alone (listed in
    scratch), under root (the run's scratch directory, repro.workdir) or else $TMPDIR."""
    conn = arm.spec.connector
    if conn is None:
        return arm
    extra = {}
    for key, value in conn.extra_config.items():
        if value == TMPDIR_TOKEN:
            value = tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{arm.name}-", dir=root)
            scratch.append(value)
        extra[key] = value
    return replace(arm, spec=replace(arm.spec, connector=replace(conn, extra_config=extra)))


def scratch_dirs(spec: ArmSpec) -> list[Path]:
    """The directories materialize made for an arm's connector (its stores): what its child writes there."""
    conn = spec.connector
    values = conn.extra_config.values() if conn is not None else ()
    return [
        Path(v)
        for v in values
        if isinstance(v, str) and os.path.isabs(v) and Path(v).name.startswith(_SCRATCH_PREFIX) and os.path.isdir(v)
    ]


def engine_config(opts: Options) -> EngineConfig:
    a = opts.args
    return EngineConfig(
        model=str(Path(a.model).resolve()) if opts.model_is_local else a.model,
        revision=a.model_revision,
        dtype=a.dtype,
        seed=a.seed,
        gpu_memory_utilization=a.gpu_memory_utilization,
        max_model_len=a.max_model_len,
        block_size=a.block_size,
        device=a.device,
    )


def preflight_for(opts: Options, arms: list[PlannedArm]) -> Preflight | None:
    """Connector and device checks for the first child to make once vLLM is imported, before it
    builds an engine: a problem is a usage error (exit 2), and no extra vLLM import is paid. A
    stand-in engine (tests only) has no vLLM to check with."""
    if opts.args.engine_module != DEFAULT_ENGINE_MODULE:
        return None
    conns = tuple(
        PreflightConnector(arm.name, arm.spec.connector.name, arm.spec.connector.module_path)
        for arm in arms
        if arm.spec.connector is not None
    )
    return Preflight(connectors=conns, device=opts.args.device)


def arm_job(
    opts: Options,
    arm: PlannedArm,
    probes: list[Probe],
    fixture_sha256: str,
    preflight: Preflight | None = None,
    kv_audit_dir: str | None = None,
) -> Job:
    """The job for one arm: every probe it does not skip, each with its cold request and reuses."""
    jobs = [
        ProbeJob(p.name, p.prompt_spec(), requests_for(p, opts.args.reuses))
        for p in probes
        if p.name not in arm.skip_probes
    ]
    return build_job(
        arm.spec,
        engine_config(opts),
        jobs,
        max_tokens=opts.args.max_tokens,
        logprobs=opts.args.logprobs,
        preflight=preflight,
        fixture_sha256=fixture_sha256,
        kv_audit_dir=kv_audit_dir,
    )


def vocab_size(opts: Options) -> int | None:
    """The local model's vocabulary size (to reject out-of-vocabulary token IDs before any engine)."""
    if not opts.model_is_local:
        return None
    try:
        return int(json.loads((Path(opts.args.model) / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class ArmSlot:
    """Where one arm runs when arms run at the same time: extra environment and its GPU memory share."""

    env: dict
    gpu_memory_utilization: float
    # CUDA, several arms on one GPU at once: the KV cache is sized to this many tokens instead of
    # from vLLM's free-memory profiling, which other processes' builds disturb (see arm_slots)
    kv_cache_tokens: int | None = None

    def apply(self, job: Job) -> Job:
        """The job with this slot's engine settings (its environment goes to the child's env); a job that
        sizes its own KV cache (a scenario's) keeps its size."""
        tokens = job.engine.kv_cache_tokens or self.kv_cache_tokens
        engine = replace(job.engine, gpu_memory_utilization=self.gpu_memory_utilization, kv_cache_tokens=tokens)
        return replace(job, engine=engine)


def _memory_gib() -> tuple[float, float] | None:
    """(total, available) GiB from /proc/meminfo, or None."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        return int(info["MemTotal"].split()[0]) / 2**20, int(info["MemAvailable"].split()[0]) / 2**20
    except (OSError, KeyError, ValueError):
        return None


# What one CPU arm needs beyond its KV cache: the model, three processes' interpreters and vLLM.
CPU_ARM_BASE_GIB = 2.0


def default_jobs(opts: Options, n_arms: int) -> int:
    """How many arms run at once when --jobs is not given: on CUDA every arm (the GPUs are shared,
    each arm's memory share split), on the CPU as many as the cores and the memory sustain."""
    if devices.uses_cuda(opts.args.device):
        return n_arms
    cores = len(devices.usable_cores())
    mem = _memory_gib()
    fit = n_arms
    if mem is not None:
        per_arm = opts.args.gpu_memory_utilization * mem[0] + CPU_ARM_BASE_GIB
        fit = max(1, int(mem[1] // per_arm))
    return max(1, min(n_arms, cores, fit))


# A shared GPU's arms get a KV cache of this many times --max-model-len tokens: the kit runs one
# sequence at a time, so this holds a primed prefix, the request that reuses it and the next probe.
SHARED_GPU_KV_MAX_MODEL_LENS = 4


def arm_slots(opts: Options, n_arms: int, jobs: int) -> list[ArmSlot]:
    """The slots of n_arms arms run `jobs` at a time, one per arm that runs at once (an arm takes a
    free one when it launches: repro.scheduler.SlotPool): on CUDA a GPU (round robin) and, where several
    arms share one, an equal share of 90 % of its memory (never more than --gpu-memory-utilization); on the CPU,
    when arms run at once, each arm's OpenMP thread on its own core of the process's affinity set
    (the thread count, and so the arithmetic, stay as in a run one at a time). One job: nothing
    changes.

    Arms that share a GPU also get a KV cache of a fixed size (SHARED_GPU_KV_MAX_MODEL_LENS x
    --max-model-len tokens, vLLM's kv_cache_memory_bytes): otherwise each engine sizes it by
    profiling the GPU's free memory, and vLLM stops with "Error in memory profiling" when another
    process frees memory meanwhile, which arms building at the same time do (seen on an H200)."""
    util = opts.args.gpu_memory_utilization
    at_once = max(1, min(jobs, n_arms))
    if jobs <= 1:
        return [ArmSlot({}, util)]
    if devices.uses_cuda(opts.args.device):
        gpus = devices.visible_gpus() or ["0"]
        per_gpu = -(-at_once // len(gpus))
        share = min(util, round(0.9 / per_gpu, 3))
        tokens = SHARED_GPU_KV_MAX_MODEL_LENS * opts.args.max_model_len if per_gpu > 1 else None
        return [ArmSlot({"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]}, share, tokens) for i in range(at_once)]
    cores = devices.usable_cores()
    return [ArmSlot({"VLLM_CPU_OMP_THREADS_BIND": str(cores[i % len(cores)])}, util) for i in range(at_once)]


def matched_probes(
    opts: Options, arm: PlannedArm, probes: list[Probe], connector: ArmResult | None, block_size: int
) -> tuple[list[ProbeJob], dict, dict]:
    """The native-matched arm's probes: each reuse primed with the prefix length the connector arm
    reused at the same reuse, aligned down to a block (native prefix caching reuses whole blocks).

    Returns (probe jobs, probes skipped with why, per probe what was matched)."""
    by_name = {p.name: p for p in (connector.probes if connector else ())}
    jobs, skipped, matched = [], {}, {}
    for p in probes:
        if p.name in arm.skip_probes:
            continue
        got = by_name.get(p.name)
        counts = [r.cached_tokens for r in got.requests[1:]] if got else []
        if not any(counts):
            why = "has no result for this probe" if got is None else "reused nothing here"
            skipped[p.name] = f"the connector arm {arm.match_arm} {why}: no prefix length to match"
            continue
        aligned = [(c or 0) // block_size * block_size for c in counts]
        jobs.append(ProbeJob(p.name, p.prompt_spec(), 1 + len(counts), tuple(aligned)))
        matched[p.name] = {
            "arm": arm.match_arm,
            "connector_tokens": counts,
            "matched_tokens": aligned,
            "aligned_down": [c is not None and c != a for c, a in zip(counts, aligned)],
        }
    return jobs, skipped, matched
