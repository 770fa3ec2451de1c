"""Planning a verification run: which arms run, in what order, and the job each arm's child gets."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from repro.contract.job import (
    ArmSpec,
    ConnectorSpec,
    Job,
    Preflight,
    PreflightConnector,
    ProbeJob,
    build_job,
)
from repro.contract.result import ArmResult
from repro.errors import UsageError
from repro.plan import devices, multi, offloading
from repro.plan.fixtures import Fixture, Probe, arm_name_problem
from repro.plan.options import DEFAULT_ENGINE_MODULE
from repro.plan.settings import ArmsAsked, EngineSettings
from repro.plan.suite import requests_for

# A connector setting with this value gets a fresh directory for its arm alone.
TMPDIR_TOKEN = "@tmpdir"
_SCRATCH_PREFIX = "kvkit-"  # materialize's directories: kvkit-<run>-XXXXXXXX
PLANTED_FAULT_MODULE = "repro.engine.connectors.planted_fault"
NATIVE_MATCHED = "native-matched"

# Connector state between runs (docs/usage.md#connector-state-between-runs). Every run of an arm (its own, each
# trial, the re-run alone, each scenario run) starts with an empty store: materialize gives each its own where the
# kit knows where the store is, and records in the run's `store` what it rewrote, or why its state may persist.
#
# A directory the store lives in, named by any connector's setting: each run gets a fresh subfolder of it
# (vLLM's ExampleConnector, SharedStorageConnector in older vLLM, reads shared_storage_path).
STORE_DIR_KEYS = ("shared_storage_path",)
# The planted connector's store; once_in is shared by an arm's engines on purpose (the claim that makes one
# engine in N fault) and audit_path is a log: neither is a store.
PLANTED_STORE_KEYS = ("store_dir",)
PLANTED_NOT_STORES = ("once_in", "audit_path")
# LMCache settings, read from its YAML, then its LMCACHE_<KEY> environment variables, then
# kv_connector_extra_config's "lmcache.<key>" (each over the one before): a directory its store lives in gets
# a fresh subfolder per run; a store outside any run (a remote server: lm://, redis://, fs://; a shared memory
# device; storage plugins) cannot be made fresh.
LMCACHE_DIR_KEYS = ("local_disk", "gds_path")
LMCACHE_SHARED_KEYS = ("remote_url", "maru_path", "storage_plugins", "remote_storage_plugins", "external_backends")
LMCACHE_CONFIG_ENV = "LMCACHE_CONFIG_FILE"
LMCACHE_ENV_PREFIX = "LMCACHE_"
LMCACHE_EXTRA_PREFIX = "lmcache."
# repro.lmcache.mp.CONNECTOR (that module imports the runner, which imports this one): the kit starts its MP
# server for each run, and its lmcache.mp.* settings point the connector at it.
LMCACHE_MP_CONNECTOR = "LMCacheMPConnector"
_FILE_URL = "file://"  # LMCache's local_disk form "file:///path/" (it strips the scheme where a "/" ends it)
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_LOCATION_KEY = re.compile(
    r"(?:^|[_.-])(?:path|dir|directory|folder|root|url|uri|location|store|storage)$", re.IGNORECASE
)


@dataclass(frozen=True)
class PlannedArm:
    spec: ArmSpec
    skip_probes: dict = field(default_factory=dict)  # probe name -> why this arm cannot run it
    match_arm: str | None = None  # native-matched: the connector arm whose reuse lengths it copies
    lmcache_ops: str | None = None  # the fixture arm's own LMCache copy path (else --lmcache-ops)
    env: dict = field(default_factory=dict)  # what its processes' environment holds apart (its copy path)
    skip_scenarios: dict = field(default_factory=dict)  # scenario name -> why this arm cannot run it
    lmcache_config: str | None = None  # an LMCache arm: the YAML its processes read (--lmcache-config)
    store: dict | None = None  # a materialized run: how its connector state was made fresh (the report's `store`)

    @property
    def name(self) -> str:
        return self.spec.name


def plan_arms(asked: ArmsAsked, fixture: Fixture, lmcache_config: str | None = None) -> list[PlannedArm]:
    """baseline first, then the connector arm(s) (the command line's, else the fixture's), then native.
    lmcache_config: the YAML an LMCache arm's processes read (--lmcache-config)."""
    arms = [PlannedArm(ArmSpec("baseline", "baseline"))]
    if asked.offloading_size is not None:
        conn = offloading.offloading_connector(asked.offloading_size, asked.offloading_backend)
        arms.append(PlannedArm(ArmSpec(conn.name, "connector", conn)))
    elif asked.kv_connector:
        if (problem := arm_name_problem(asked.kv_connector)) is not None:  # the arm is named after it
            raise UsageError(f"--kv-connector: {problem}")
        extra = dict(asked.extra_config)
        if asked.kv_connector == "ExampleConnector":
            extra.setdefault("shared_storage_path", TMPDIR_TOKEN)
        if asked.kv_connector == "PlantedFaultConnector" and asked.module_path == PLANTED_FAULT_MODULE:
            extra.setdefault("store_dir", TMPDIR_TOKEN)
        if asked.kv_connector == multi.MULTI:
            if (problem := multi.members_problem(extra)) is not None:
                raise UsageError(f"--kv-connector-extra-config: {problem}")
            extra = multi.planned_members(extra, TMPDIR_TOKEN)
        conn = _beneath(ConnectorSpec(asked.kv_connector, asked.module_path, extra), None, None)
        yaml = _lmcache_yaml(conn, lmcache_config)
        arms.append(PlannedArm(ArmSpec(asked.kv_connector, "connector", conn), lmcache_config=yaml))
    else:
        for spec in fixture.arms:
            extra = dict(spec.extra_config)
            if spec.connector == multi.MULTI:  # checked when the fixture was read (repro.plan.fixtures)
                extra = multi.planned_members(extra, TMPDIR_TOKEN)
            conn = ConnectorSpec(spec.connector, spec.module_path, extra, shipped_as=spec.shipped_as)
            conn = _beneath(conn, spec.gpu_prefix_cache, spec.gpu_cache_reset)
            arms.append(
                PlannedArm(
                    ArmSpec(spec.name, "connector", conn),
                    dict(spec.skip_probes),
                    lmcache_ops=spec.lmcache_ops,
                    skip_scenarios=dict(spec.skip_scenarios),
                    lmcache_config=_lmcache_yaml(conn, lmcache_config),
                )
            )
    if asked.compare_native:
        arms.append(PlannedArm(ArmSpec("native", "native")))
        connectors = [arm.name for arm in arms if arm.spec.mode == "connector"]
        # the critic's control: native reusing exactly what the connector reused
        if connectors and asked.native_matched:
            arms.append(PlannedArm(ArmSpec(NATIVE_MATCHED, "native"), match_arm=connectors[0]))
    if len(arms) == 1:
        raise UsageError(
            "nothing to compare: give --kv-connector or --compare-native (or a fixture that declares arms)"
        )
    return arms


def _beneath(conn: ConnectorSpec, asked: bool | None, reset: str | None) -> ConnectorSpec:
    """The connector with the GPU prefix cache on beneath it where asked, else where the kit knows it sits there
    (repro.plan.offloading); such an arm is made to serve by a GPU-cache reset before each reuse unless told."""
    on = offloading.beneath_gpu_cache(conn.name) or (multi.is_multi(conn) and multi.beneath_gpu_cache(conn))
    on = on if asked is None else asked
    if not on:
        if reset is not None:
            raise UsageError(f"connector {conn.name}: gpu_cache_reset needs the GPU prefix cache on (gpu_prefix_cache)")
        return replace(conn, gpu_prefix_cache=False, gpu_cache_reset=None)
    return replace(conn, gpu_prefix_cache=True, gpu_cache_reset=reset or "before-reuse")


def is_lmcache_connector(conn: ConnectorSpec | None) -> bool:
    return conn is not None and "lmcache" in conn.name.lower()


def _lmcache_yaml(conn: ConnectorSpec, lmcache_config: str | None) -> str | None:
    return lmcache_config if is_lmcache_connector(conn) else None


def materialize(arm: PlannedArm, scratch: list[str], root: str | Path | None = None) -> PlannedArm:
    """This run of an arm with connector state of its own (fresh_state); what it did is the arm's `store`."""
    return fresh_state(arm, scratch, root)[0]


def fresh_state(
    arm: PlannedArm,
    scratch: list[str],
    root: str | Path | None = None,
    lmcache_overrides: dict | None = None,
    yaml_dir: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[PlannedArm, dict | None]:
    """This run of an arm (named as it runs) with connector state of its own: @tmpdir replaced by a fresh
    directory under root (the run's scratch directory, repro.run.workdir; else $TMPDIR), a store directory the user
    named by a fresh subfolder of it, kvkit-<run>-XXXXXXXX (each listed in scratch, removed with the run); for an
    LMCache arm the same for the store directories its YAML, its environment (environ: the one its children
    inherit, default os.environ) and its settings name, its YAML derived, with lmcache_overrides (a scenario's
    keys) over it, into yaml_dir (else root) when anything in it changes. The arm's `store` says what was
    rewritten, or why its state may persist between runs (`fresh` false). Returns the arm and, when its YAML
    was derived, what the report records of it (base, overrides, yaml)."""
    conn = arm.spec.connector
    if conn is None:
        return arm, None
    run = _FreshRun(arm.name, scratch, root)
    extra = {key: run.setting(conn, key, value) for key, value in conn.extra_config.items() if key != multi.MEMBERS_KEY}
    if multi.is_multi(conn):  # each member's settings made fresh as an arm's, labelled connectors[i].<key>
        fresh = [{k: run.setting(m, k, v, f"{multi.MEMBERS_KEY}[{i}].{k}") for k, v in m.extra_config.items()}
                 for i, m in enumerate(multi.member_specs(conn))]  # fmt: skip
        extra[multi.MEMBERS_KEY] = multi.with_member_configs(conn, fresh)
    env, record = dict(arm.env), None
    if is_lmcache_connector(conn):
        environ = os.environ if environ is None else environ
        own, record = run.lmcache(arm.lmcache_config or environ.get(LMCACHE_CONFIG_ENV), lmcache_overrides, environ,
                                  yaml_dir)  # fmt: skip
        env.update(own)
    spec = replace(arm.spec, connector=replace(conn, extra_config=extra))
    return replace(arm, spec=spec, env=env, store=run.record(conn)), record


class _FreshRun:
    """One run's connector state made fresh: the directories made, what was rewritten, what could not be."""

    def __init__(self, name: str, scratch: list[str], root: str | Path | None) -> None:
        self.name, self.scratch, self.root = name, scratch, root
        self.rewritten: list[str] = []
        self.persists: list[str] = []

    def _mkdir(self, parent: str | Path | None) -> str:
        if parent is not None:
            os.makedirs(parent, exist_ok=True)
        path = tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{self.name}-", dir=parent)
        self.scratch.append(path)
        return path

    def tmpdir(self, label: str) -> str:
        path = self._mkdir(self.root)
        self.rewritten.append(f"{label} {TMPDIR_TOKEN} -> {path}")
        return path

    def subfolder(self, label: str, value: str) -> str:
        """A fresh subfolder of the directory a setting names (a path, or LMCache's file:///path/ form)."""
        scheme = _FILE_URL if value.startswith(_FILE_URL) else ""
        path = self._mkdir(value[len(scheme) :])
        new = f"{scheme}{path}/" if scheme else path
        self.rewritten.append(f"{label} {value} -> {new}")
        return new

    def persisting(self, label: str, value: object, why: str) -> None:
        self.persists.append(f"{label} {value}: {why}")

    def setting(self, conn: ConnectorSpec, key: str, value: object, label: str | None = None) -> object:
        """One kv_connector_extra_config entry as this run gets it (label: how the record names it, else key)."""
        label = label or key
        if value == TMPDIR_TOKEN:
            return self.tmpdir(label)
        kind = _store_kind(conn, key)
        if kind == "dir" and isinstance(value, str) and value:
            return self.subfolder(label, value)
        if kind == "shared" and value:
            self.persisting(label, value, "a store outside the run, shared by every run")
        elif kind is None and _names_location(key, value):
            self.persisting(
                label, value, "a setting the kit does not know names a place outside the run; a store there persists"
            )
        return value

    def lmcache(
        self, base: str | None, overrides: dict | None, environ: Mapping[str, str], yaml_dir: str | Path | None
    ) -> tuple[dict, dict | None]:
        """An LMCache arm's store settings outside kv_connector_extra_config: its YAML's (derived when a store
        directory in it is rewritten or a scenario overrides keys) and its environment's. Returns the arm's own
        environment entries and the derived YAML's record (None when none was derived)."""
        env: dict = {}
        data = {**(_read_yaml(base) if base else {}), **(overrides or {})}
        changed = overrides is not None
        for key in LMCACHE_DIR_KEYS:
            if isinstance(data.get(key), str) and data[key]:
                data[key], changed = self.subfolder(f"{key} (LMCache YAML)", data[key]), True
        for key in LMCACHE_SHARED_KEYS:
            if data.get(key):
                self.persisting(f"{key} (LMCache YAML)", data[key], "a store outside the run, shared by every run")
        for key in LMCACHE_DIR_KEYS:
            name = LMCACHE_ENV_PREFIX + key.upper()
            if environ.get(name):
                env[name] = self.subfolder(name, environ[name])
        for key in LMCACHE_SHARED_KEYS:
            name = LMCACHE_ENV_PREFIX + key.upper()
            if environ.get(name):
                self.persisting(name, environ[name], "a store outside the run, shared by every run")
        if not changed:
            return env, None
        import yaml  # pure Python; installed with vLLM

        text = yaml.safe_dump(data, sort_keys=True)
        where = yaml_dir if yaml_dir is not None else self.root if self.root is not None else self._mkdir(None)
        dest = Path(where) / f"{self.name}.lmcache.yaml"
        dest.write_text(text, encoding="utf-8")
        env[LMCACHE_CONFIG_ENV] = str(dest.resolve())
        return env, {"base": base, "overrides": dict(overrides or {}), "yaml": text}

    def record(self, conn: ConnectorSpec) -> dict:
        """The run's `store`: fresh, what was rewritten, and why (always when it may persist)."""
        out: dict = {"fresh": not self.persists, "rewritten": list(self.rewritten)}
        if self.persists:
            out["why"] = "; ".join(self.persists)
        elif conn.name == LMCACHE_MP_CONNECTOR:
            out["why"] = "its own LMCache MP server, started by the kit for this run alone"
        elif not self.rewritten:
            out["why"] = "no setting names a store outside its engine, whose state ends with it"
        return out


def _store_kind(conn: ConnectorSpec, key: str) -> str | None:
    """What a connector setting is to the store: "dir" (a directory it lives in), "shared" (a store outside any
    run), "none" (a setting the kit knows is no store) or None (one it does not know)."""
    if key in STORE_DIR_KEYS:
        return "dir"
    if conn.module_path == PLANTED_FAULT_MODULE:
        return "dir" if key in PLANTED_STORE_KEYS else "none" if key in PLANTED_NOT_STORES else None
    if is_lmcache_connector(conn) and key.startswith(LMCACHE_EXTRA_PREFIX):
        sub = key[len(LMCACHE_EXTRA_PREFIX) :]
        if conn.name == LMCACHE_MP_CONNECTOR:
            return "none"  # the kit points lmcache.mp.* at the server it starts for the run
        return "dir" if sub in LMCACHE_DIR_KEYS else "shared" if sub in LMCACHE_SHARED_KEYS else "none"
    return None


def _names_location(key: str, value: object) -> bool:
    """A setting that may name where a store lives: a path or a URL, or a key named like one."""
    if isinstance(value, dict):
        return any(_names_location(str(k), v) for k, v in value.items())
    if not isinstance(value, str) or not value:
        return False
    looks = os.path.isabs(value) or value.startswith(("~", "./", "../")) or _URL.match(value) is not None
    return looks or _LOCATION_KEY.search(key.rsplit(".", 1)[-1]) is not None


def _read_yaml(path: str) -> dict:
    import yaml  # pure Python; installed with vLLM

    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    return dict(data) if isinstance(data, dict) else {}


def persisting_store(arm: PlannedArm) -> str | None:
    """Why a run's connector state may persist between runs (its `store`), or None: it is fresh."""
    store = arm.store
    return None if store is None or store.get("fresh") else str(store.get("why") or "not recorded")


def scratch_dirs(spec: ArmSpec) -> list[Path]:
    """The directories materialize made for an arm's connector (its stores): what its child writes there."""
    conn = spec.connector
    values = list(conn.extra_config.values()) if conn is not None else []
    if multi.is_multi(conn):
        values += [v for m in multi.member_specs(conn) for v in m.extra_config.values()]
    return [
        Path(v)
        for v in values
        if isinstance(v, str) and os.path.isabs(v) and Path(v).name.startswith(_SCRATCH_PREFIX) and os.path.isdir(v)
    ]


def preflight_for(arms: list[PlannedArm], device: str, engine_module: str) -> Preflight | None:
    """Connector and device checks for the first child to make once vLLM is imported, before it
    builds an engine: a problem is a usage error (exit 2), and no extra vLLM import is paid. A
    stand-in engine (tests only) has no vLLM to check with."""
    if engine_module != DEFAULT_ENGINE_MODULE:
        return None
    conns = tuple(
        PreflightConnector(arm.name, arm.spec.connector.name, arm.spec.connector.module_path)
        for arm in arms
        if arm.spec.connector is not None
    )
    return Preflight(connectors=conns, device=device)


def arm_job(
    engine: EngineSettings,
    reuses: int | None,
    arm: PlannedArm,
    probes: list[Probe],
    fixture_sha256: str,
    preflight: Preflight | None = None,
    kv_audit_dir: str | None = None,
) -> Job:
    """The job for one arm: every probe it does not skip, each with its cold request and reuses (--reuses,
    else the probe's own)."""
    jobs = [ProbeJob(p.name, p.prompt_spec(), requests_for(p, reuses)) for p in probes if p.name not in arm.skip_probes]
    return build_job(
        arm.spec,
        engine.config(),
        jobs,
        max_tokens=engine.max_tokens,
        logprobs=engine.logprobs,
        preflight=preflight,
        fixture_sha256=fixture_sha256,
        kv_audit_dir=kv_audit_dir,
    )


def vocab_size(engine: EngineSettings) -> int | None:
    """The local model's vocabulary size (to reject out-of-vocabulary token IDs before any engine)."""
    if not engine.model_is_local:
        return None
    try:
        return int(json.loads((Path(engine.model) / "config.json").read_text())["vocab_size"])
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


def default_jobs(engine: EngineSettings, n_arms: int) -> int:
    """How many arms run at once when --jobs is not given: on CUDA every arm (the GPUs are shared,
    each arm's memory share split), on the CPU as many as the cores and the memory sustain."""
    if devices.uses_cuda(engine.device):
        return n_arms
    cores = len(devices.usable_cores())
    mem = _memory_gib()
    fit = n_arms
    if mem is not None:
        per_arm = engine.gpu_memory_utilization * mem[0] + CPU_ARM_BASE_GIB
        fit = max(1, int(mem[1] // per_arm))
    return max(1, min(n_arms, cores, fit))


# A shared GPU's arms get a KV cache of this many times --max-model-len tokens: the kit runs one
# sequence at a time, so this holds a primed prefix, the request that reuses it and the next probe.
SHARED_GPU_KV_MAX_MODEL_LENS = 4


def arm_slots(engine: EngineSettings, n_arms: int, jobs: int) -> list[ArmSlot]:
    """The slots of n_arms arms run `jobs` at a time, one per arm that runs at once (an arm takes a
    free one when it launches: repro.run.scheduler.SlotPool): on CUDA a GPU (round robin) and, where several
    arms share one, an equal share of 90 % of its memory (never more than --gpu-memory-utilization); on the CPU,
    when arms run at once, each arm's OpenMP thread on its own core of the process's affinity set
    (the thread count, and so the arithmetic, stay as in a run one at a time). One job: nothing
    changes.

    Arms that share a GPU also get a KV cache of a fixed size (SHARED_GPU_KV_MAX_MODEL_LENS x
    --max-model-len tokens, vLLM's kv_cache_memory_bytes): otherwise each engine sizes it by
    profiling the GPU's free memory, and vLLM stops with "Error in memory profiling" when another
    process frees memory meanwhile, which arms building at the same time do (seen on an H200)."""
    util = engine.gpu_memory_utilization
    at_once = max(1, min(jobs, n_arms))
    if jobs <= 1:
        return [ArmSlot({}, util)]
    if devices.uses_cuda(engine.device):
        gpus = devices.visible_gpus() or ["0"]
        per_gpu = -(-at_once // len(gpus))
        share = min(util, round(0.9 / per_gpu, 3))
        tokens = SHARED_GPU_KV_MAX_MODEL_LENS * engine.max_model_len if per_gpu > 1 else None
        return [ArmSlot({"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]}, share, tokens) for i in range(at_once)]
    cores = devices.usable_cores()
    return [ArmSlot({"VLLM_CPU_OMP_THREADS_BIND": str(cores[i % len(cores)])}, util) for i in range(at_once)]


def matched_probes(
    arm: PlannedArm, probes: list[Probe], connector: ArmResult | None, block_size: int
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
