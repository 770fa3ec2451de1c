"""A production-load scenario in the engine child (repro.plan.load): vLLM's engine driven step by step.

Each round adds every prompt at once, in the round's order, and steps the engine until all are done. A request the
round cancels is aborted through the engine's own abort (vLLM's LLMEngine.abort_request, what a client's
disconnect does in the server) and sent again at once under a new request ID:
- "prefill": once the scheduler has computed part of its prompt and not all of it (read from the scheduler where it
  runs in this process: the CPU's one-process layout; in vLLM's own layout it runs in another process, and the
  request is aborted after the first engine step it was waiting or running in, its state recorded as unobserved);
  a request whose prefill finished within one step is not aborted and is recorded as missed;
- "last-step": when it has generated all but its last token.
The baseline's child first answers every prompt alone (its cache-disabled answer: the reference). Every request's
KV audit record is matched by the request ID the engine gave it. The results list each round's requests in the
round's order, the one that finished (a cancelled request's retry) with what its cancelled attempt had done, so
every arm's list lines up with every other's."""

from __future__ import annotations

from dataclasses import dataclass, field

from repro.contract.job import MULTI_CONNECTOR, Job
from repro.contract.result import ProbeResult, ScenarioResult, StepRequest
from repro.engine.audit_records import AuditRecords, served_member
from repro.engine.outputs import _request, connector_tokens, preemption_count

IN_PREFILL, AT_LAST_STEP = "prefill", "last-step"  # repro.plan.load's


@dataclass
class _Live:
    """One prompt's request in a round: its current attempt and what it has produced."""

    name: str
    rid: str  # the engine's (internal) request ID of the current attempt
    external: str = ""  # the ID the kit gave the current attempt (its outputs carry it)
    tokens: list = field(default_factory=list)
    out: object = None
    cancel: dict | None = None
    steps_in_engine: int = 0


def scheduler_computed(engine, rid: str) -> tuple[bool, int | None]:
    """(observable, tokens the scheduler has computed for request rid): observable only where the engine core runs
    in this process (LLMEngine over an InprocClient); the count is None while the scheduler does not hold it."""
    core = getattr(getattr(engine, "engine_core", None), "engine_core", None)
    requests = getattr(getattr(core, "scheduler", None), "requests", None)
    if not isinstance(requests, dict):
        return False, None
    req = requests.get(rid)
    return True, None if req is None else int(req.num_computed_tokens)


def reference_probes(llm, job: Job, prompts: dict, sp, audit: AuditRecords, report_stage) -> list[ProbeResult]:
    """The scenario's prompts as probes; in the reference run each with its answer alone, caching off (its
    cache-disabled answer). llm: the offline engine or a served one (the same generate call)."""
    from vllm import TokensPrompt

    probes = []
    for n, (name, ids) in enumerate(prompts.items(), start=1):
        requests = ()
        if job.scenario.reference:
            if n == 1 or n % 16 == 0:
                report_stage(job, f"reference {n} of {len(prompts)}", preflight_ok=True)
            out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0]
            requests = (_request(out, "cold", audit.take(ids)),)
        probes.append(ProbeResult(name=name, prompt_token_ids=tuple(ids), messages=None, requests=requests))
    return probes


def run_load(llm, job: Job, sp, audit: AuditRecords, report_stage) -> tuple[list[ProbeResult], ScenarioResult]:
    """The load scenario's reference or rounds in this (fresh) engine (module docstring); report_stage: the child's
    progress reporter."""
    from vllm import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    engine = getattr(llm, "llm_engine", None)
    if engine is None:  # the parent allows a load scenario only with the synchronous front end
        raise RuntimeError("a load scenario needs vLLM's LLMEngine (the synchronous front end)")
    prompts = {p.name: list(p.prompt["token_ids"]) for p in job.probes}
    multi = job.arm.connector is not None and job.arm.connector.name == MULTI_CONNECTOR
    beneath = job.arm.connector is not None and job.arm.connector.gpu_prefix_cache
    probes = reference_probes(llm, job, prompts, sp, audit, report_stage)
    params = sp.clone()
    params.output_kind = RequestOutputKind.CUMULATIVE  # every step's tokens so far: the last-step cancel needs them
    ext = {}  # external request ID -> live request
    counter = iter(range(10**9))

    def add(live: _Live) -> None:
        ext.pop(live.external, None)  # an aborted attempt's late output (if any) is not this attempt's
        live.external = f"load-{next(counter)}"
        live.rid = engine.add_request(live.external, TokensPrompt(prompt_token_ids=prompts[live.name]), params.clone())
        live.tokens, live.steps_in_engine = [], 0
        ext[live.external] = live

    steps, results = job.scenario.steps, []
    for k, step in enumerate(steps):
        report_stage(job, f"round {k + 1} of {len(steps)}: {len(step.submit)} requests", preflight_ok=True)
        before, _ = preemption_count()
        round_live = {name: _Live(name, "") for name in step.submit}
        for live in round_live.values():
            add(live)
        pending = {n: w for n, w in step.cancel.items() if n in round_live}
        while engine.has_unfinished_requests():
            for out in engine.step():
                live = ext.get(out.request_id)
                if live is None:
                    continue
                live.tokens = list(out.outputs[0].token_ids)
                if out.finished:
                    live.out = out
            for live in round_live.values():
                if live.out is None:
                    live.steps_in_engine += 1
            for name, when in list(pending.items()):
                live = round_live[name]
                if live.out is not None:  # finished before its cancel came
                    live.cancel = {"when": when, "missed": "it finished before its cancellation point"}
                    del pending[name]
                    continue
                record = _cancel_point(engine, live, when, len(prompts[name]), job.max_tokens)
                if record is None:
                    continue
                del pending[name]
                if record.get("missed"):
                    live.cancel = record
                    continue
                engine.abort_request([live.rid], internal=True)
                live.cancel = {**record, "request_id": live.rid, "output_tokens": list(live.tokens)}
                add(live)
        after, _ = preemption_count()
        grew = None if before is None or after is None else after - before
        records = audit.take_requests([live.rid for live in round_live.values()])
        for (name, live), record in zip(round_live.items(), records):
            cached = getattr(live.out, "num_cached_tokens", None)
            member = served_member(record, job.kv_audit_dir) if multi else None
            external = connector_tokens(record, None, None) if beneath else None
            req = _request(live.out, "reuse" if cached else "cold", record, external, member)
            results.append(StepRequest(k, name, req, grew, live.cancel))
    count, source = preemption_count()
    return probes, ScenarioResult(job.scenario.name, tuple(results), count, source)


def _cancel_point(engine, live: _Live, when: str, prompt_len: int, max_tokens: int) -> dict | None:
    """Whether to cancel the request now: the cancellation's record (with "missed" when its point passed without
    one), or None to wait for a later step."""
    if when == AT_LAST_STEP:
        if max_tokens < 2:
            return {"when": when, "missed": "max_tokens is 1: the first token is the last"}
        return {"when": when, "generated": len(live.tokens)} if len(live.tokens) == max_tokens - 1 else None
    if live.tokens:  # its first token is out: the prefill is over
        return {"when": when, "missed": "its prefill finished within one engine step"}
    observable, computed = scheduler_computed(engine, live.rid)
    if observable:
        if computed is not None and 0 < computed < prompt_len:
            return {"when": when, "computed_tokens": computed, "prompt_tokens": prompt_len, "observed": True}
        return None
    if live.steps_in_engine >= 1:
        return {"when": when, "computed_tokens": None, "prompt_tokens": prompt_len, "observed": False}
    return None
