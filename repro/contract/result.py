"""The result: what one engine child hands back (every probe's requests, or the error it raised),
written to the job's output path and read strictly by the parent.

Arm result schema (kind "kvkit-arm-result"):
  schema_version 1: first version.
  schema_version 2: the KV audit (Job.kv_audit_dir, RequestResult.kv_audit_record, ArmResult.kv_audit).
    Additions without a bump (both sides are always one kit; an absent field reads as None): a scenario
    job (Job.scenario, EngineConfig.max_num_seqs and max_num_batched_tokens) and its result
    (ArmResult.scenario: the steps' requests and the engine's preemption counter); the LoRA adapter a probe ran
    under (ProbeResult.adapter; EngineConfig.lora and ProbeJob.prompt["adapter"] on the job's side); a request's
    prompt logprobs (RequestResult.prompt_logprobs, where ProbeJob.prompt["prompt_logprobs"] asked for them); the
    tenant salt a probe's requests were sent with (ProbeResult.cache_salt, ProbeJob.prompt["cache_salt"]).
"""

from __future__ import annotations

from dataclasses import dataclass

from repro.contract.failure import RESULT_VERSION, ContractError, read_field, read_ints

ARM_RESULT_KIND = "kvkit-arm-result"
ARM_RESULT_SCHEMA_VERSION = 2
# The child's exit codes: EXIT_RAISED always comes with ArmResult.error.
EXIT_OK = 0
EXIT_RAISED = 3


# The KV audit's file of the reused blocks a request's connector reported to vLLM as not loaded:
# load-errors.<seq>.json in the audit directory (repro.engine.kvaudit_hooks writes it, repro.engine.audit_records
# attaches it to the request's kv_audit_record as "load_errors"); not <seq>.json, the request's own record.
LOAD_ERRORS_PREFIX = "load-errors."


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
    # a connector beneath the GPU prefix cache: the tokens its own counter says it loaded for this request
    # (vLLM's vllm:external_prefix_cache_hits across the request; None: not measured, or not a count)
    external_tokens: int | None = None
    # a MultiConnector arm: the member that loaded this request, as the KV audit saw MultiConnector choose it
    # ({"index", "connector", "tokens"}; index None: none loaded, or {"index": None, "unavailable": why})
    connector_member: dict | None = None
    # asked for prompt logprobs (repro.engine.prompt_logprobs.record): {"k", "logprobs", "top1"}, one entry a prompt
    # position from the second token on; the report keeps a summary of it (repro.judge.prompt_logprobs)
    prompt_logprobs: dict | None = None

    def to_json(self) -> dict:
        extra = {} if self.external_tokens is None else {"external_tokens": self.external_tokens}
        if self.prompt_logprobs is not None:
            extra["prompt_logprobs"] = dict(self.prompt_logprobs)
        if self.connector_member is not None:
            extra["connector_member"] = dict(self.connector_member)
        return extra | {
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
        role = read_field(data, "role", str, where)
        if role not in ("cold", "reuse"):
            raise ContractError(f"{where}.role: {role!r} is neither cold nor reuse")
        logprobs = read_field(data, "logprobs", list, where, optional=True) or []
        return cls(
            role=role,
            cached_tokens=read_field(data, "cached_tokens", int, where, optional=True),
            token_ids=read_ints(read_field(data, "token_ids", list, where), f"{where}.token_ids"),
            logprobs=tuple(logprobs),
            finish_reason=read_field(data, "finish_reason", str, where, optional=True),
            kv_transfer_params=read_field(data, "kv_transfer_params", dict, where, optional=True),
            text=read_field(data, "text", str, where, optional=True),
            request_id=read_field(data, "request_id", str, where, optional=True),
            kv_audit_record=read_field(data, "kv_audit_record", dict, where, optional=True),
            external_tokens=read_field(data, "external_tokens", int, where, optional=True),
            connector_member=read_field(data, "connector_member", dict, where, optional=True),
            prompt_logprobs=read_field(data, "prompt_logprobs", dict, where, optional=True),
        )


@dataclass(frozen=True)
class ProbeResult:
    name: str
    prompt_token_ids: tuple[int, ...]
    messages: list | None
    requests: tuple[RequestResult, ...]
    # the LoRA adapter its requests ran under, as the child sent it (repro.engine.adapters); None: the base model
    adapter: dict | None = None
    image: dict | None = None  # the image its prompt was sent with (repro.plan.images); None: none
    cache_salt: str | None = None  # the tenant salt its requests were sent with (repro.plan.salts); None: none

    def to_json(self) -> dict:
        return (
            {
                "name": self.name,
                "prompt_token_ids": list(self.prompt_token_ids),
                "messages": self.messages,
                "requests": [r.to_json() for r in self.requests],
            }
            | ({"adapter": dict(self.adapter)} if self.adapter is not None else {})
            | ({"image": dict(self.image)} if self.image is not None else {})
            | ({"cache_salt": self.cache_salt} if self.cache_salt is not None else {})
        )

    @classmethod
    def from_json(cls, data: object, where: str) -> ProbeResult:
        reqs = read_field(data, "requests", list, where)
        return cls(
            name=read_field(data, "name", str, where),
            prompt_token_ids=read_ints(read_field(data, "prompt_token_ids", list, where), f"{where}.prompt_token_ids"),
            messages=read_field(data, "messages", list, where, optional=True),
            requests=tuple(RequestResult.from_json(r, f"{where}.requests[{i}]") for i, r in enumerate(reqs)),
            adapter=read_field(data, "adapter", dict, where, optional=True),
            image=read_field(data, "image", dict, where, optional=True),
            cache_salt=read_field(data, "cache_salt", str, where, optional=True),
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
    # a load round's cancelled attempt before this request was sent again (repro.engine.load): when it was
    # aborted, what it had computed and generated; None: it was not cancelled
    cancel: dict | None = None

    def to_json(self) -> dict:
        out = {
            "step": self.step,
            "probe": self.probe,
            "request": self.request.to_json(),
            "preemptions": self.preemptions,
        }
        if self.cancel is not None:
            out["cancel"] = self.cancel
        return out

    @classmethod
    def from_json(cls, data: object, where: str) -> StepRequest:
        return cls(
            step=read_field(data, "step", int, where),
            probe=read_field(data, "probe", str, where),
            request=RequestResult.from_json(read_field(data, "request", dict, where), f"{where}.request"),
            preemptions=read_field(data, "preemptions", int, where, optional=True),
            cancel=read_field(data, "cancel", dict, where, optional=True),
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
        reqs = read_field(data, "requests", list, where)
        return cls(
            name=read_field(data, "name", str, where),
            requests=tuple(StepRequest.from_json(r, f"{where}.requests[{i}]") for i, r in enumerate(reqs)),
            preemptions=read_field(data, "preemptions", int, where, optional=True),
            preemptions_source=read_field(data, "preemptions_source", str, where),
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
            k: read_field(data, k, (int, float), "result", optional=True)
            for k in ("engine_start_s", "import_s", "generation_s")
        }
        scenario = read_field(data, "scenario", dict, "result", optional=True)
        return cls(
            arm=read_field(data, "arm", str, "result"),
            probes=tuple(
                ProbeResult.from_json(p, f"result.probes[{i}]")
                for i, p in enumerate(read_field(data, "probes", list, "result"))
            ),
            error=None if not err else ChildError(str(err.get("type", "Exception")), str(err.get("message", ""))),
            preflight_problems=tuple(
                str(p) for p in read_field(data, "preflight_problems", list, "result", optional=True) or ()
            ),
            pid=read_field(data, "pid", int, "result", optional=True),
            versions=read_field(data, "versions", dict, "result", optional=True),
            effective_config=read_field(data, "effective_config", dict, "result", optional=True),
            fixture_sha256=read_field(data, "fixture_sha256", str, "result", optional=True),
            kv_audit=read_field(data, "kv_audit", dict, "result", optional=True),
            scenario=None if scenario is None else ScenarioResult.from_json(scenario),
            **timing,
        )
