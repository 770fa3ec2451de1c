"""The parent↔child contract: what an engine child is asked to do, and what it hands back.

The parent writes a Job as JSON and starts `python -m repro.engine JOB.json`; the child writes one
ArmResult to the job's output path and exits (EXIT_OK, or EXIT_RAISED with `error` set). Both
sides use these frozen dataclasses and their to_json/from_json. Reading is strict: a wrong kind,
a newer or older schema_version or a malformed field is a ContractError with one line, which the
runner turns into a named failure, never a KeyError. When the parent cannot get a result, the arm
carries a Failure of one of FAILURE_KINDS.

Arm result schema (kind "kvkit-arm-result"):
  schema_version 1: first version.
  schema_version 2: the KV audit (Job.kv_audit_dir, RequestResult.kv_audit_record, ArmResult.kv_audit).
    Additions without a bump (both sides are always one kit; an absent field reads as None): a scenario
    job (Job.scenario, EngineConfig.max_num_seqs and max_num_batched_tokens) and its result
    (ArmResult.scenario: the steps' requests and the engine's preemption counter).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

ARM_RESULT_KIND = "kvkit-arm-result"
ARM_RESULT_SCHEMA_VERSION = 2
MODES = ("baseline", "connector", "native")
# The child's exit codes: EXIT_RAISED always comes with ArmResult.error.
EXIT_OK = 0
EXIT_RAISED = 3

# Failure kinds, each distinct in the report.
TIMEOUT = "timeout"
CRASH = "crash"
OOM = "out-of-memory"
NONZERO_EXIT = "nonzero-exit"
MISSING_OUTPUT = "missing-output"
UNPARSABLE_OUTPUT = "unparsable-output"
RESULT_VERSION = "result-version-mismatch"
RAISED = "raised"
# The parent stopped the child, or never started it, to keep the disk from filling (repro.run.diskwatch):
# its own files grew past the per-child cap, or the free space where it writes fell under the floor.
DISK_RUNAWAY = "disk-runaway"
DISK_LOW = "disk-low"
# LMCache's MP server (repro.lmcache.mp), started by the kit for an LMCacheMPConnector arm
LMCACHE_SERVER_START = "lmcache-server-start"
LMCACHE_SERVER_DIED = "lmcache-server-died"
FAILURE_KINDS = (
    TIMEOUT,
    CRASH,
    OOM,
    NONZERO_EXIT,
    MISSING_OUTPUT,
    UNPARSABLE_OUTPUT,
    RESULT_VERSION,
    RAISED,
    DISK_RUNAWAY,
    DISK_LOW,
    LMCACHE_SERVER_START,
    LMCACHE_SERVER_DIED,
)


def progress_path(output: str) -> str:
    """Where a child reports its stage while it runs (JSON: stage, preflight_ok, at), beside its result."""
    return output + ".progress"


class ContractError(ValueError):
    """A job or result that does not follow the contract (one line; `kind` is the failure kind)."""

    def __init__(self, message: str, kind: str = UNPARSABLE_OUTPUT):
        super().__init__(message)
        self.kind = kind


def _get(obj: object, key: str, types: type | tuple[type, ...], where: str, optional: bool = False):
    if not isinstance(obj, dict):
        raise ContractError(f"{where}: not an object")
    if key not in obj or obj[key] is None:
        if optional:
            return None
        raise ContractError(f"{where}.{key}: missing")
    value = obj[key]
    bad_bool = isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,))
    if not isinstance(value, types) or bad_bool:
        raise ContractError(f"{where}.{key}: wrong type {type(value).__name__}")
    return value


def _ints(values: object, where: str) -> tuple[int, ...]:
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ContractError(f"{where}: must be a list of integers")
    return tuple(values)


# ---- the job --------------------------------------------------------------------------------------


# Set by the parent for an arm that starts while the first arm's preflight runs: the file it writes
# once the preflight is decided ("go", or "stop": the preflight failed); see repro.engine.child.
PREFLIGHT_GATE_ENV = "KVKIT_PREFLIGHT_GATE"
PROBES_FILE_KEY = "probes"  # a native-matched arm's probes file: {"probes": [...]} or {"stop": why}


@dataclass(frozen=True)
class ConnectorSpec:
    name: str
    module_path: str | None = None
    extra_config: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"name": self.name, "module_path": self.module_path, "extra_config": dict(self.extra_config)}

    @classmethod
    def from_json(cls, data: object, where: str = "connector") -> ConnectorSpec:
        return cls(
            name=_get(data, "name", str, where),
            module_path=_get(data, "module_path", str, where, optional=True),
            extra_config=dict(_get(data, "extra_config", dict, where, optional=True) or {}),
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
        conn = _get(data, "connector", dict, where, optional=True)
        return cls(
            name=_get(data, "name", str, where),
            mode=_get(data, "mode", str, where),
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
    # set where arms share a GPU: the KV cache holds this many tokens (repro.plan.arms.arm_slots); a scenario's own
    kv_cache_tokens: int | None = None
    # a scenario's engine (repro.run.scenarios): requests in flight at once, and tokens one step schedules
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    # a scenario's engine may set vLLM's async scheduling (None: vLLM's default for the platform)
    async_scheduling: bool | None = None

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("kv_cache_tokens", "max_num_seqs", "max_num_batched_tokens", "async_scheduling"):
            if out[key] is None:
                del out[key]
        return out

    @classmethod
    def from_json(cls, data: object, where: str = "engine") -> EngineConfig:
        return cls(
            model=_get(data, "model", str, where),
            revision=_get(data, "revision", str, where, optional=True),
            dtype=_get(data, "dtype", str, where),
            seed=_get(data, "seed", int, where),
            gpu_memory_utilization=float(_get(data, "gpu_memory_utilization", (int, float), where)),
            max_model_len=_get(data, "max_model_len", int, where),
            block_size=_get(data, "block_size", int, where),
            device=_get(data, "device", str, where),
            kv_cache_tokens=_get(data, "kv_cache_tokens", int, where, optional=True),
            max_num_seqs=_get(data, "max_num_seqs", int, where, optional=True),
            max_num_batched_tokens=_get(data, "max_num_batched_tokens", int, where, optional=True),
            async_scheduling=_get(data, "async_scheduling", bool, where, optional=True),
        )


@dataclass(frozen=True)
class ProbeJob:
    """One probe: its prompt ({"token_ids": [...]} or {"chat": {...}}) and how many requests (cold + reuses)."""

    name: str
    prompt: dict
    requests: int
    # native-matched arms only: before reuse i, the cache holds exactly the first match_tokens[i-1]
    # prompt tokens (a priming request of that prefix after a cache reset); None: ordinary reuse
    match_tokens: tuple[int, ...] | None = None

    def to_json(self) -> dict:
        out = {"name": self.name, "prompt": self.prompt, "requests": self.requests}
        if self.match_tokens is not None:
            out["match_tokens"] = list(self.match_tokens)
        return out

    @classmethod
    def from_json(cls, data: object, where: str = "probe") -> ProbeJob:
        prompt = _get(data, "prompt", dict, where)
        if ("token_ids" in prompt) == ("chat" in prompt):
            raise ContractError(f"{where}.prompt: give exactly one of token_ids or chat")
        match = _get(data, "match_tokens", list, where, optional=True)
        return cls(
            name=_get(data, "name", str, where),
            prompt=prompt,
            requests=_get(data, "requests", int, where),
            match_tokens=None if match is None else _ints(match, f"{where}.match_tokens"),
        )


@dataclass(frozen=True)
class StepJob:
    """One step of a scenario: these probes' requests, one generate call each in order, or one call
    with all of them (together: in flight at once)."""

    submit: tuple[str, ...]
    together: bool = False
    wait_s: float = 0.0  # idle seconds before the step is submitted (repro.plan.fixtures.ScenarioStep.wait_s)

    def to_json(self) -> dict:
        out = {"submit": list(self.submit), "together": self.together}
        if self.wait_s:
            out["wait_s"] = self.wait_s
        return out

    @classmethod
    def from_json(cls, data: object, where: str = "step") -> StepJob:
        submit = _get(data, "submit", list, where)
        if not submit or not all(isinstance(n, str) for n in submit):
            raise ContractError(f"{where}.submit: must be a non-empty list of probe names")
        wait_s = _get(data, "wait_s", (int, float), where, optional=True) or 0.0
        if wait_s < 0:
            raise ContractError(f"{where}.wait_s: must not be negative")
        together = bool(_get(data, "together", bool, where, optional=True))
        return cls(submit=tuple(submit), together=together, wait_s=float(wait_s))


@dataclass(frozen=True)
class ScenarioJob:
    """A scenario's steps (repro.run.scenarios); the job's probes are the prompts they name."""

    name: str
    steps: tuple[StepJob, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "steps": [s.to_json() for s in self.steps]}

    @classmethod
    def from_json(cls, data: object, where: str = "scenario") -> ScenarioJob:
        steps = _get(data, "steps", list, where)
        return cls(
            name=_get(data, "name", str, where),
            steps=tuple(StepJob.from_json(s, f"{where}.steps[{i}]") for i, s in enumerate(steps)),
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
        conns = _get(data, "connectors", list, where)
        return cls(
            connectors=tuple(
                PreflightConnector(
                    arm=_get(c, "arm", str, f"{where}.connectors[{i}]"),
                    name=_get(c, "name", str, f"{where}.connectors[{i}]"),
                    module_path=_get(c, "module_path", str, f"{where}.connectors[{i}]", optional=True),
                )
                for i, c in enumerate(conns)
            ),
            device=_get(data, "device", str, where),
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
        pre = _get(data, "preflight", dict, "job", optional=True)
        scenario = _get(data, "scenario", dict, "job", optional=True)
        return cls(
            arm=ArmSpec.from_json(_get(data, "arm", dict, "job")),
            engine=EngineConfig.from_json(_get(data, "engine", dict, "job")),
            max_tokens=_get(data, "max_tokens", int, "job"),
            logprobs=_get(data, "logprobs", int, "job"),
            probes=tuple(
                ProbeJob.from_json(p, f"job.probes[{i}]") for i, p in enumerate(_get(data, "probes", list, "job"))
            ),
            preflight=None if pre is None else Preflight.from_json(pre),
            fixture_sha256=_get(data, "fixture_sha256", str, "job", optional=True),
            output=_get(data, "output", str, "job", optional=True),
            kv_audit_dir=_get(data, "kv_audit_dir", str, "job", optional=True),
            probes_file=_get(data, "probes_file", str, "job", optional=True),
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


# ---- the result -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestResult:
    """One generation as the engine reported it."""

    role: str  # "cold" or "reuse"
    cached_tokens: int | None  # None: the engine reported nothing (never read as zero)
    token_ids: tuple[int, ...]
    logprobs: tuple  # per generated position: [[token_id, logprob], ...] best first
    finish_reason: str | None
    kv_transfer_params: dict | None
    text: str | None
    request_id: str | None = None
    # what the KV audit recorded for this request (repro.engine.kvaudit's <seq>.json, or why none)
    kv_audit_record: dict | None = None

    def to_json(self) -> dict:
        return {
            "kv_audit_record": self.kv_audit_record,
            "role": self.role,
            "request_id": self.request_id,
            "cached_tokens": self.cached_tokens,
            "token_ids": list(self.token_ids),
            "logprobs": [list(step) for step in self.logprobs],
            "finish_reason": self.finish_reason,
            "kv_transfer_params": self.kv_transfer_params,
            "text": self.text,
        }

    @classmethod
    def from_json(cls, data: object, where: str) -> RequestResult:
        role = _get(data, "role", str, where)
        if role not in ("cold", "reuse"):
            raise ContractError(f"{where}.role: {role!r} is neither cold nor reuse")
        logprobs = _get(data, "logprobs", list, where, optional=True) or []
        return cls(
            role=role,
            cached_tokens=_get(data, "cached_tokens", int, where, optional=True),
            token_ids=_ints(_get(data, "token_ids", list, where), f"{where}.token_ids"),
            logprobs=tuple(logprobs),
            finish_reason=_get(data, "finish_reason", str, where, optional=True),
            kv_transfer_params=_get(data, "kv_transfer_params", dict, where, optional=True),
            text=_get(data, "text", str, where, optional=True),
            request_id=_get(data, "request_id", str, where, optional=True),
            kv_audit_record=_get(data, "kv_audit_record", dict, where, optional=True),
        )


@dataclass(frozen=True)
class ProbeResult:
    name: str
    prompt_token_ids: tuple[int, ...]
    messages: list | None
    requests: tuple[RequestResult, ...]

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "prompt_token_ids": list(self.prompt_token_ids),
            "messages": self.messages,
            "requests": [r.to_json() for r in self.requests],
        }

    @classmethod
    def from_json(cls, data: object, where: str) -> ProbeResult:
        reqs = _get(data, "requests", list, where)
        return cls(
            name=_get(data, "name", str, where),
            prompt_token_ids=_ints(_get(data, "prompt_token_ids", list, where), f"{where}.prompt_token_ids"),
            messages=_get(data, "messages", list, where, optional=True),
            requests=tuple(RequestResult.from_json(r, f"{where}.requests[{i}]") for i, r in enumerate(reqs)),
        )


@dataclass(frozen=True)
class StepRequest:
    """One request of a scenario step, as the engine reported it."""

    step: int
    probe: str
    request: RequestResult
    # growth of the engine's preemption counter over the request's step (shared by a together step's
    # requests); None: the counter could not be read
    preemptions: int | None = None

    def to_json(self) -> dict:
        return {
            "step": self.step,
            "probe": self.probe,
            "request": self.request.to_json(),
            "preemptions": self.preemptions,
        }

    @classmethod
    def from_json(cls, data: object, where: str) -> StepRequest:
        return cls(
            step=_get(data, "step", int, where),
            probe=_get(data, "probe", str, where),
            request=RequestResult.from_json(_get(data, "request", dict, where), f"{where}.request"),
            preemptions=_get(data, "preemptions", int, where, optional=True),
        )


@dataclass(frozen=True)
class ScenarioResult:
    """What a scenario's child ran: every step's requests in order, and the engine's preemptions."""

    name: str
    requests: tuple[StepRequest, ...]
    preemptions: int | None  # the engine's counter at the end (a fresh engine: all of the scenario's)
    preemptions_source: str  # where the count came from, or "unavailable: why"

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "requests": [r.to_json() for r in self.requests],
            "preemptions": self.preemptions,
            "preemptions_source": self.preemptions_source,
        }

    @classmethod
    def from_json(cls, data: object, where: str = "result.scenario") -> ScenarioResult:
        reqs = _get(data, "requests", list, where)
        return cls(
            name=_get(data, "name", str, where),
            requests=tuple(StepRequest.from_json(r, f"{where}.requests[{i}]") for i, r in enumerate(reqs)),
            preemptions=_get(data, "preemptions", int, where, optional=True),
            preemptions_source=_get(data, "preemptions_source", str, where),
        )


@dataclass(frozen=True)
class ChildError:
    """What the child raised (it then exits EXIT_RAISED)."""

    type: str
    message: str

    def to_json(self) -> dict:
        return {"type": self.type, "message": self.message}


@dataclass(frozen=True)
class ArmResult:
    """What one engine child hands back: every probe's requests, or the error it raised."""

    arm: str
    probes: tuple[ProbeResult, ...] = ()
    error: ChildError | None = None
    preflight_problems: tuple[str, ...] = ()
    pid: int | None = None
    versions: dict | None = None
    effective_config: dict | None = None
    engine_start_s: float | None = None
    import_s: float | None = None
    generation_s: float | None = None
    fixture_sha256: str | None = None  # what the child was fed, stamped from the job
    kv_audit: dict | None = None  # the audit's directory, layout and any error it recorded
    scenario: ScenarioResult | None = None  # a scenario job's steps (its probes then carry no requests)

    def to_json(self) -> dict:
        out = {
            "kind": ARM_RESULT_KIND,
            "schema_version": ARM_RESULT_SCHEMA_VERSION,
            "arm": self.arm,
            "probes": [p.to_json() for p in self.probes],
            "error": self.error and self.error.to_json(),
            "pid": self.pid,
            "versions": self.versions,
            "effective_config": self.effective_config,
            "engine_start_s": self.engine_start_s,
            "import_s": self.import_s,
            "generation_s": self.generation_s,
            "fixture_sha256": self.fixture_sha256,
            "kv_audit": self.kv_audit,
        }
        if self.preflight_problems:
            out["preflight_problems"] = list(self.preflight_problems)
        if self.scenario is not None:
            out["scenario"] = self.scenario.to_json()
        return out

    @classmethod
    def from_json(cls, data: object) -> ArmResult:
        if not isinstance(data, dict) or data.get("kind") != ARM_RESULT_KIND:
            raise ContractError(f"the result file is not a {ARM_RESULT_KIND} file")
        version = data.get("schema_version")
        if version != ARM_RESULT_SCHEMA_VERSION:
            raise ContractError(
                f"the result has schema_version {version!r}; this kit reads {ARM_RESULT_SCHEMA_VERSION} "
                "(the engine child and the parent come from different kit versions)",
                kind=RESULT_VERSION,
            )
        err = data.get("error")
        if err is not None and not isinstance(err, dict):
            err = {"type": "Exception", "message": str(err)}
        timing = {
            k: _get(data, k, (int, float), "result", optional=True)
            for k in ("engine_start_s", "import_s", "generation_s")
        }
        scenario = _get(data, "scenario", dict, "result", optional=True)
        return cls(
            arm=_get(data, "arm", str, "result"),
            probes=tuple(
                ProbeResult.from_json(p, f"result.probes[{i}]")
                for i, p in enumerate(_get(data, "probes", list, "result"))
            ),
            error=None if not err else ChildError(str(err.get("type", "Exception")), str(err.get("message", ""))),
            preflight_problems=tuple(
                str(p) for p in _get(data, "preflight_problems", list, "result", optional=True) or ()
            ),
            pid=_get(data, "pid", int, "result", optional=True),
            versions=_get(data, "versions", dict, "result", optional=True),
            effective_config=_get(data, "effective_config", dict, "result", optional=True),
            fixture_sha256=_get(data, "fixture_sha256", str, "result", optional=True),
            kv_audit=_get(data, "kv_audit", dict, "result", optional=True),
            scenario=None if scenario is None else ScenarioResult.from_json(scenario),
            **timing,
        )


@dataclass(frozen=True)
class Failure:
    """Why the parent has no usable result from a child: a FAILURE_KINDS kind, a detail and the log tail."""

    kind: str
    detail: str
    log_tail: str = ""

    def to_json(self) -> dict:
        return {"kind": self.kind, "detail": self.detail, "log_tail": self.log_tail}
