"""The job: everything one engine child is asked to do (one arm, one engine, every probe, or a
scenario's steps), written by the parent as JSON and read strictly by the child.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from repro.contract.failure import ContractError, read_field, read_ints

MODES = ("baseline", "connector", "native")
# How the kit makes a connector beneath the GPU prefix cache serve (ConnectorSpec.gpu_cache_reset).
GPU_CACHE_RESETS = ("before-reuse", "never")


def progress_path(output: str) -> str:
    """Where a child reports its stage while it runs (JSON: stage, preflight_ok, at), beside its result."""
    return output + ".progress"


# Set by the parent for an arm that starts while the first arm's preflight runs: the file it writes
# once the preflight is decided ("go", or "stop": the preflight failed); see repro.engine.child.
PREFLIGHT_GATE_ENV = "KVKIT_PREFLIGHT_GATE"
PROBES_FILE_KEY = "probes"  # a native-matched arm's probes file: {"probes": [...]} or {"stop": why}


# vLLM's connector of connectors (repro.plan.multi): its report entries say which member served each reuse.
MULTI_CONNECTOR = "MultiConnector"


@dataclass(frozen=True)
class ConnectorSpec:
    """A connector arm's connector. gpu_prefix_cache: the arm runs with vLLM's GPU prefix cache on, the connector
    beneath it (vLLM's offloading connectors, as vLLM ships them; repro.plan.offloading); its hits are then the
    connector's own count, and gpu_cache_reset says how the kit makes the connector serve ("before-reuse": the GPU
    prefix cache is reset before each reuse, the connector's tier kept; "never"). shipped_as: the vLLM setting the
    arm stands for when the kit spelled it out (--kv-offloading-size)."""

    name: str
    module_path: str | None = None
    extra_config: dict = field(default_factory=dict)
    gpu_prefix_cache: bool = False
    gpu_cache_reset: str | None = None
    shipped_as: str | None = None

    def __post_init__(self):
        if self.gpu_cache_reset not in ((None,) if not self.gpu_prefix_cache else GPU_CACHE_RESETS):
            raise ContractError(
                f"connector {self.name}: gpu_cache_reset {self.gpu_cache_reset!r} "
                + ("needs the GPU prefix cache on" if not self.gpu_prefix_cache else f"not one of {GPU_CACHE_RESETS}")
            )

    def to_json(self) -> dict:
        out = {"name": self.name, "module_path": self.module_path, "extra_config": dict(self.extra_config)}
        if self.gpu_prefix_cache:  # only then: every report before it had the GPU prefix cache off for a connector
            out.update(gpu_prefix_cache=True, gpu_cache_reset=self.gpu_cache_reset)
        if self.shipped_as is not None:
            out["shipped_as"] = self.shipped_as
        return out

    @classmethod
    def from_json(cls, data: object, where: str = "connector") -> ConnectorSpec:
        return cls(
            name=read_field(data, "name", str, where),
            module_path=read_field(data, "module_path", str, where, optional=True),
            extra_config=dict(read_field(data, "extra_config", dict, where, optional=True) or {}),
            gpu_prefix_cache=bool(read_field(data, "gpu_prefix_cache", bool, where, optional=True)),
            gpu_cache_reset=read_field(data, "gpu_cache_reset", str, where, optional=True),
            shipped_as=read_field(data, "shipped_as", str, where, optional=True),
        )


@dataclass(frozen=True)
class ArmSpec:
    """Which arm a child runs: its name, mode and (for a connector arm) the connector."""

    name: str
    mode: str
    connector: ConnectorSpec | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise ContractError(f"arm {self.name}: unknown mode {self.mode!r}")
        if (self.mode == "connector") != (self.connector is not None):
            raise ContractError(f"arm {self.name}: a connector arm needs a connector, other arms none")

    def to_json(self) -> dict:
        return {"name": self.name, "mode": self.mode, "connector": self.connector and self.connector.to_json()}

    @classmethod
    def from_json(cls, data: object, where: str = "arm") -> ArmSpec:
        conn = read_field(data, "connector", dict, where, optional=True)
        return cls(
            name=read_field(data, "name", str, where),
            mode=read_field(data, "mode", str, where),
            connector=None if conn is None else ConnectorSpec.from_json(conn, f"{where}.connector"),
        )


@dataclass(frozen=True)
class EngineConfig:
    """The engine every arm of a run builds (identical across arms but for the arm's own settings)."""

    model: str
    revision: str | None
    dtype: str
    seed: int
    gpu_memory_utilization: float
    max_model_len: int
    block_size: int
    device: str
    # the KV cache holds this many tokens: --kv-cache-tokens, a scenario's own, or where arms share a GPU
    # (repro.plan.arms.arm_slots)
    kv_cache_tokens: int | None = None
    # a scenario's engine (repro.run.scenarios): requests in flight at once, and tokens one step schedules
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    # a scenario's engine may set vLLM's async scheduling (None: vLLM's default for the platform)
    async_scheduling: bool | None = None
    # a load scenario's chunked prefill: a request's tokens one step schedules at most (None: vLLM's default)
    long_prefill_token_threshold: int | None = None
    # probes under LoRA adapters (repro.plan.adapters): {"max_lora_rank", "max_loras"}; None: LoRA off
    lora: dict | None = None
    # --speculative-config: vLLM's speculative_config in every arm, the baseline's too (repro.plan.speculative); a
    # "model" of SPECULATIVE_SELF drafts with the verified model itself
    speculative_config: dict | None = None
    # a scenario's llama-server: one KV buffer shared by every slot (--kv-unified / --no-kv-unified); None: the
    # server's default. llama.cpp's only: vLLM's child refuses it (repro.engine.engine_args)
    kv_unified: bool | None = None

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in OPTIONAL_ENGINE_KEYS:
            if out[key] is None:
                del out[key]
        return out

    @classmethod
    def from_json(cls, data: object, where: str = "engine") -> EngineConfig:
        return cls(
            model=read_field(data, "model", str, where),
            revision=read_field(data, "revision", str, where, optional=True),
            dtype=read_field(data, "dtype", str, where),
            seed=read_field(data, "seed", int, where),
            gpu_memory_utilization=float(read_field(data, "gpu_memory_utilization", (int, float), where)),
            max_model_len=read_field(data, "max_model_len", int, where),
            block_size=read_field(data, "block_size", int, where),
            device=read_field(data, "device", str, where),
            kv_cache_tokens=read_field(data, "kv_cache_tokens", int, where, optional=True),
            max_num_seqs=read_field(data, "max_num_seqs", int, where, optional=True),
            max_num_batched_tokens=read_field(data, "max_num_batched_tokens", int, where, optional=True),
            async_scheduling=read_field(data, "async_scheduling", bool, where, optional=True),
            long_prefill_token_threshold=read_field(data, "long_prefill_token_threshold", int, where, optional=True),
            lora=read_field(data, "lora", dict, where, optional=True),
            speculative_config=read_field(data, "speculative_config", dict, where, optional=True),
            kv_unified=read_field(data, "kv_unified", bool, where, optional=True),
        )

    def speculative_kwargs(self) -> dict | None:
        """vLLM's speculative_config as the engine takes it: SPECULATIVE_SELF resolved to this engine's model."""
        if self.speculative_config is None:
            return None
        out = dict(self.speculative_config)
        if out.get("model") == SPECULATIVE_SELF:
            out["model"] = self.model
        return out


OPTIONAL_ENGINE_KEYS = (
    "kv_cache_tokens", "max_num_seqs", "max_num_batched_tokens", "async_scheduling", "long_prefill_token_threshold",
    "lora", "speculative_config", "kv_unified")  # fmt: skip
# A speculative_config's "model" naming the verified model (its folder differs per machine; a report keeps this)
SPECULATIVE_SELF = "@model"


@dataclass(frozen=True)
class ProbeJob:
    """One probe: its prompt ({"token_ids": [...]} or {"chat": {...}}, with "adapter": the LoRA adapter its requests
    run under, repro.plan.adapters.PlannedAdapter.request) and how many requests (cold + reuses)."""

    name: str
    prompt: dict
    requests: int
    # native-matched arms only: before reuse i, the cache holds exactly the first match_tokens[i-1]
    # prompt tokens (a priming request of that prefix after a cache reset); None: ordinary reuse
    match_tokens: tuple[int, ...] | None = None
    # another prompt ({"token_ids"} or {"chat"}) sent once, whole, right before each reuse: the reuse is then given
    # the blocks that request freed, not its own cold request's (vLLM hands out the last-freed blocks first). Its
    # answer is kept (the arm's effective_config "between_requests"), never judged; None: the reuse follows its cold
    between: dict | None = None

    def to_json(self) -> dict:
        out = {"name": self.name, "prompt": self.prompt, "requests": self.requests}
        if self.match_tokens is not None:
            out["match_tokens"] = list(self.match_tokens)
        if self.between is not None:
            out["between"] = self.between
        return out

    @classmethod
    def from_json(cls, data: object, where: str = "probe") -> ProbeJob:
        prompt = read_field(data, "prompt", dict, where)
        if ("token_ids" in prompt) == ("chat" in prompt):
            raise ContractError(f"{where}.prompt: give exactly one of token_ids or chat")
        if "adapter" in prompt:
            for key, kind in (("label", str), ("lora_name", str), ("lora_int_id", int), ("path", str)):
                read_field(prompt["adapter"], key, kind, f"{where}.prompt.adapter")
        match = read_field(data, "match_tokens", list, where, optional=True)
        between = read_field(data, "between", dict, where, optional=True)
        if between is not None and ("token_ids" in between) == ("chat" in between):
            raise ContractError(f"{where}.between: give exactly one of token_ids or chat")
        return cls(
            name=read_field(data, "name", str, where),
            prompt=prompt,
            requests=read_field(data, "requests", int, where),
            match_tokens=None if match is None else read_ints(match, f"{where}.match_tokens"),
            between=between,
        )


@dataclass(frozen=True)
class StepJob:
    """One step of a scenario: these probes' requests, one generate call each in order, or one call
    with all of them (together: in flight at once)."""

    submit: tuple[str, ...]
    together: bool = False
    wait_s: float = 0.0  # idle seconds before the step is submitted (repro.plan.fixtures.ScenarioStep.wait_s)
    cancel: dict = field(default_factory=dict)  # a load round's: probe -> "prefill" or "last-step" (repro.plan.load)

    def to_json(self) -> dict:
        out = {"submit": list(self.submit), "together": self.together}
        if self.wait_s:
            out["wait_s"] = self.wait_s
        if self.cancel:
            out["cancel"] = dict(self.cancel)
        return out

    @classmethod
    def from_json(cls, data: object, where: str = "step") -> StepJob:
        submit = read_field(data, "submit", list, where)
        if not submit or not all(isinstance(n, str) for n in submit):
            raise ContractError(f"{where}.submit: must be a non-empty list of probe names")
        wait_s = read_field(data, "wait_s", (int, float), where, optional=True) or 0.0
        if wait_s < 0:
            raise ContractError(f"{where}.wait_s: must not be negative")
        together = bool(read_field(data, "together", bool, where, optional=True))
        cancel = read_field(data, "cancel", dict, where, optional=True) or {}
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in cancel.items()):
            raise ContractError(f"{where}.cancel: must map probe names to when")
        return cls(submit=tuple(submit), together=together, wait_s=float(wait_s), cancel=dict(cancel))


@dataclass(frozen=True)
class ScenarioJob:
    """A scenario's steps (repro.run.scenarios); the job's probes are the prompts they name."""

    name: str
    steps: tuple[StepJob, ...]
    # a load scenario (repro.plan.load): its rounds driven step by step (repro.engine.load); reference: first every
    # prompt alone (the baseline's child: each prompt's cache-disabled answer)
    load: bool = False
    reference: bool = False

    def to_json(self) -> dict:
        out = {"name": self.name, "steps": [s.to_json() for s in self.steps]}
        if self.load:
            out |= {"load": True, "reference": self.reference}
        return out

    @classmethod
    def from_json(cls, data: object, where: str = "scenario") -> ScenarioJob:
        steps = read_field(data, "steps", list, where)
        return cls(
            name=read_field(data, "name", str, where),
            steps=tuple(StepJob.from_json(s, f"{where}.steps[{i}]") for i, s in enumerate(steps)),
            load=bool(read_field(data, "load", bool, where, optional=True)),
            reference=bool(read_field(data, "reference", bool, where, optional=True)),
        )


@dataclass(frozen=True)
class PreflightConnector:
    arm: str
    name: str
    module_path: str | None

    def to_json(self) -> dict:
        return {"arm": self.arm, "name": self.name, "module_path": self.module_path}


@dataclass(frozen=True)
class Preflight:
    """Checks the first child makes once vLLM is imported, before it builds an engine."""

    connectors: tuple[PreflightConnector, ...]
    device: str

    def to_json(self) -> dict:
        return {"connectors": [c.to_json() for c in self.connectors], "device": self.device}

    @classmethod
    def from_json(cls, data: object, where: str = "preflight") -> Preflight:
        conns = read_field(data, "connectors", list, where)
        return cls(
            connectors=tuple(
                PreflightConnector(
                    arm=read_field(c, "arm", str, f"{where}.connectors[{i}]"),
                    name=read_field(c, "name", str, f"{where}.connectors[{i}]"),
                    module_path=read_field(c, "module_path", str, f"{where}.connectors[{i}]", optional=True),
                )
                for i, c in enumerate(conns)
            ),
            device=read_field(data, "device", str, where),
        )


@dataclass(frozen=True)
class Job:
    """Everything one engine child needs: one arm, one engine, every probe."""

    arm: ArmSpec
    engine: EngineConfig
    max_tokens: int
    logprobs: int
    probes: tuple[ProbeJob, ...]
    preflight: Preflight | None = None
    fixture_sha256: str | None = None
    output: str | None = None  # the result path; set by the runner
    kv_audit_dir: str | None = None  # where repro.engine.kvaudit records KV blocks (None: no audit)
    # native-matched: the child builds its engine, then waits for this file to give its probes
    # (PROBES_FILE_KEY: a list of ProbeJob), or to say "stop" (its connector arm gave nothing to match)
    probes_file: str | None = None
    # a scenario's job: its steps over job.probes (each probe's prompt; its `requests` unused), in a fresh engine
    scenario: ScenarioJob | None = None

    def to_json(self) -> dict:
        out = {
            "kv_audit_dir": self.kv_audit_dir,
            "arm": self.arm.to_json(),
            "engine": self.engine.to_json(),
            "max_tokens": self.max_tokens,
            "logprobs": self.logprobs,
            "probes": [p.to_json() for p in self.probes],
            "fixture_sha256": self.fixture_sha256,
            "output": self.output,
        }
        if self.preflight is not None:
            out["preflight"] = self.preflight.to_json()
        if self.probes_file is not None:
            out["probes_file"] = self.probes_file
        if self.scenario is not None:
            out["scenario"] = self.scenario.to_json()
        return out

    @classmethod
    def from_json(cls, data: object) -> Job:
        pre = read_field(data, "preflight", dict, "job", optional=True)
        scenario = read_field(data, "scenario", dict, "job", optional=True)
        return cls(
            arm=ArmSpec.from_json(read_field(data, "arm", dict, "job")),
            engine=EngineConfig.from_json(read_field(data, "engine", dict, "job")),
            max_tokens=read_field(data, "max_tokens", int, "job"),
            logprobs=read_field(data, "logprobs", int, "job"),
            probes=tuple(
                ProbeJob.from_json(p, f"job.probes[{i}]") for i, p in enumerate(read_field(data, "probes", list, "job"))
            ),
            preflight=None if pre is None else Preflight.from_json(pre),
            fixture_sha256=read_field(data, "fixture_sha256", str, "job", optional=True),
            output=read_field(data, "output", str, "job", optional=True),
            kv_audit_dir=read_field(data, "kv_audit_dir", str, "job", optional=True),
            probes_file=read_field(data, "probes_file", str, "job", optional=True),
            scenario=None if scenario is None else ScenarioJob.from_json(scenario, "job.scenario"),
        )


def build_job(
    arm: ArmSpec,
    engine: EngineConfig,
    probes: list[ProbeJob] | tuple[ProbeJob, ...],
    *,
    max_tokens: int,
    logprobs: int,
    preflight: Preflight | None = None,
    fixture_sha256: str | None = None,
    kv_audit_dir: str | None = None,
) -> Job:
    """The one place a job is made (the verifier, the detection study and the tests all call it).

    A baseline arm runs each probe once (the cold request is its only request)."""
    if arm.mode == "baseline":
        probes = [ProbeJob(p.name, p.prompt, 1) for p in probes]
    return Job(
        arm=arm,
        engine=engine,
        max_tokens=max_tokens,
        logprobs=logprobs,
        probes=tuple(probes),
        preflight=preflight,
        fixture_sha256=fixture_sha256,
        kv_audit_dir=kv_audit_dir,
    )
