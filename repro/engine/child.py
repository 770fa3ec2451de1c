"""The engine child: run one arm (one engine, every probe, or a scenario's steps) and write one JSON result.

The parent (repro.run.runner) starts it as `python -m repro.engine JOB.json` with a repro.contract.job.Job;
the child writes one repro.contract.result.ArmResult to the job's output path and exits. Everything it
prints goes to the arm log the parent captured at the file-descriptor level. Beside it: the engine it
builds (repro.engine.engine_args), the KV audit's records (repro.engine.audit_records) and what the arm
ran with (repro.engine.facts).
"""

from __future__ import annotations

import time

_T_PROCESS = time.monotonic()  # before any heavy import: engine start counts from here

import os
import sys
import traceback
from dataclasses import replace

from repro.contract.chat import build_chat_prompt
from repro.contract.job import MULTI_CONNECTOR, PREFLIGHT_GATE_ENV, Job
from repro.contract.result import (
    ArmResult,
    ProbeResult,
    ScenarioResult,
    StepRequest,
)
from repro.engine.adapters import AdapterRequests
from repro.engine.audit_records import AuditRecords, audit_env, served_member
from repro.engine.engine_args import engine_kwargs
from repro.engine.facts import collect_versions, effective_config, lmcache_build, process_facts
from repro.engine.frontend import build_frontend, frontend_from_env
from repro.engine.images import prompt as mm_prompt
from repro.engine.outputs import (
    _request,
    connector_tokens,
    external_hits,
    preemption_count,
    read_counters_from,
    speculative_counters,
)
from repro.engine.prompt_logprobs import record as plp_record
from repro.engine.prompt_logprobs import sampling_for
from repro.record.child_io import read_job, report_stage, wait_for_probes, write_result


class PreflightStopped(RuntimeError):
    """The first arm's preflight failed: this arm imported vLLM but built no engine."""


def wait_for_preflight(job: Job) -> float:
    """An arm started during the first arm's preflight imports vLLM meanwhile and waits here, before
    it builds an engine, for the parent's word: "go", or "stop" (then PreflightStopped: the run ends
    with the preflight's exit 2 and no engine was ever built). Returns the seconds it waited, which
    are not engine start time."""
    gate = os.environ.get(PREFLIGHT_GATE_ENV)
    if not gate:
        return 0.0
    t0 = time.monotonic()
    report_stage(job, "waiting for the preflight")
    while True:
        try:
            with open(gate, encoding="utf-8") as fh:
                word = fh.read().strip()
        except FileNotFoundError:
            time.sleep(0.1)
            continue
        if word == "go":
            return time.monotonic() - t0
        raise PreflightStopped(f"the first arm's preflight failed ({word!r}): no engine built")


def run_job(job: Job, keep: list) -> ArmResult:
    """Run every probe of the arm in one engine; the engine is parked in `keep` so that it is not
    torn down before the result is written (the parent reaps its processes)."""
    from vllm import SamplingParams

    frontend = frontend_from_env(os.environ)  # before any engine: a bad value fails the arm at once
    salts = salt_support(frontend) if any("cache_salt" in p.prompt for p in job.probes) else None
    versions = collect_versions()
    waited = wait_for_preflight(job)
    report_stage(job, "building the engine", preflight_ok=True)
    audit_env(job)
    audit = AuditRecords(job.kv_audit_dir)
    t0 = time.monotonic()
    llm = build_frontend(frontend, engine_kwargs(job))  # LLM, or a bare AsyncLLM behind the same calls
    keep.append(llm)
    served = hasattr(llm, "served_facts")  # a `vllm serve` process over HTTP (repro.engine.served)
    if served:
        read_counters_from(llm)  # its counters come from its /metrics
    ready = time.monotonic()
    if job.probes_file:
        job = wait_for_probes(job)
    tokenizer = llm.get_tokenizer()
    sp = SamplingParams(
        temperature=0.0, max_tokens=job.max_tokens, ignore_eos=True, logprobs=job.logprobs, seed=job.engine.seed
    )
    t_gen = time.monotonic()
    probes, scenario, gpu_resets, between = [], None, [], []
    multi = job.arm.connector is not None and job.arm.connector.name == MULTI_CONNECTOR
    beneath = job.arm.connector is not None and job.arm.connector.gpu_prefix_cache
    loras = AdapterRequests(job)  # the LoRA adapter each probe runs under (repro.engine.adapters)
    if job.scenario is not None and job.scenario.load and served:  # cancellations as HTTP disconnects
        from repro.engine.load_served import run_load_served

        probes, scenario = run_load_served(llm, job, sp, audit, report_stage)
    elif job.scenario is not None and job.scenario.load:
        from repro.engine.load import run_load

        probes, scenario = run_load(llm, job, sp, audit, report_stage)
    elif job.scenario is not None:
        probes, scenario = run_scenario(llm, job, tokenizer, sp, audit)
    for n, probe in enumerate(job.probes if job.scenario is None else (), start=1):
        report_stage(job, f"probe {n} of {len(job.probes)}", preflight_ok=True)
        if "token_ids" in probe.prompt:
            ids, messages = list(probe.prompt["token_ids"]), None
        else:
            ids, messages = build_chat_prompt(tokenizer, probe.prompt["chat"])
        if job.arm.mode == "native" or beneath:
            llm.reset_prefix_cache()  # belt and braces: probes are also isolated by content
        requests, lora = [], loras.generate_kwargs([probe.prompt])
        for i in range(probe.requests):
            if i > 0 and probe.match_tokens is not None:
                primed = _prime(llm, ids[: probe.match_tokens[i - 1]], audit, lora, probe.prompt.get("cache_salt"))
                if primed is not None:
                    audit.primes.append({"probe": probe.name, "reuse": i, "record": primed})
            if i > 0 and beneath and job.arm.connector.gpu_cache_reset == "before-reuse":
                # the GPU prefix cache forgets, the connector's tier stays: the reuse is the connector's to serve
                gpu_resets.append(bool(llm.reset_prefix_cache()))
            if i > 0 and probe.between is not None:  # another prompt, whole, between this reuse and what came before
                between.append(_between(llm, tokenizer, probe, i, sp, audit))
            before = external_hits()[0] if beneath else None
            out = llm.generate([mm_prompt(ids, probe.prompt)], sampling_for(sp, [probe.prompt]), use_tqdm=False,
                               **lora)[0]  # fmt: skip
            after = external_hits()[0] if beneath else None
            record = audit.take(list(getattr(out, "prompt_token_ids", None) or ids))  # an image expanded, as stored
            ext = connector_tokens(record, before, after) if beneath else None
            member = served_member(record, job.kv_audit_dir) if multi else None
            plp = plp_record(out, probe.prompt.get("prompt_logprobs"))  # where it asked for them
            requests.append(
                replace(_request(out, "cold" if i == 0 else "reuse", record, ext, member), prompt_logprobs=plp)
            )
        probes.append(ProbeResult(probe.name, tuple(ids), messages, tuple(requests), adapter=loras.sent(probe.prompt),
                                  image=probe.prompt.get("image"), cache_salt=probe.prompt.get("cache_salt")))  # fmt: skip
    if job.arm.connector is not None and "lmcache" in job.arm.connector.name.lower():
        # after the run: the engine's worker imported LMCache's compiled ops first (or failed to)
        try:
            versions["lmcache_build"] = lmcache_build()
        except Exception as exc:  # noqa: BLE001 - a fact that cannot be read never fails the arm
            versions["lmcache_build"] = {"problem": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return ArmResult(
        arm=job.arm.name,
        probes=tuple(probes),
        pid=os.getpid(),
        versions=versions,
        effective_config={
            **(config := effective_config(llm)),
            **process_facts(probes, audit, scenario),
            **({"gpu_cache_resets": gpu_resets} if gpu_resets else {}),
            **({"between_requests": between} if between else {}),
            **({"served": llm.served_facts()} if served and "served" not in config else {}),
            **({"cache_salt": salts} if salts else {}),  # probed where a probe names a tenant salt
            # what speculative decoding did (--speculative-config): drafted and accepted tokens
            **({"speculative_decoding": speculative_counters()} if job.engine.speculative_config else {}),
        },
        # from process start to a ready engine: interpreter, imports and engine construction
        engine_start_s=round(ready - _T_PROCESS - waited, 3),
        import_s=round(t0 - _T_PROCESS - waited, 3),
        generation_s=round(time.monotonic() - t_gen, 3),
        fixture_sha256=job.fixture_sha256,
        kv_audit=audit.summary(),
        scenario=scenario,
    )


def salt_support(frontend: str) -> str:
    """Whether this vLLM sends a probe's tenant salt and keys its prefix cache on it
    (repro.engine.capabilities.cache_salt_support, asked of vLLM, never of its version); RuntimeError where it
    does not, so that the arm is an ERROR naming why rather than a run of unsalted requests judged as salted."""
    if frontend == "endpoint":
        return "not asked: a server the kit did not start decides what it does with cache_salt"
    from repro.engine.capabilities import cache_salt_support

    answer = cache_salt_support("server" if frontend == "server" else "offline")
    if answer != "available":
        raise RuntimeError(f"a probe names a cache_salt and this vLLM cannot send it: {answer}")
    return answer


def run_scenario(llm, job: Job, tokenizer, sp, audit: AuditRecords) -> tuple[list[ProbeResult], ScenarioResult]:
    """A scenario's steps in this (fresh) engine: each step's probes one generate call each in order,
    or one call with all of them (together: in flight at once, as many as max_num_seqs lets run). The
    prefix cache is never reset: what earlier steps left is the point. Each request's audit record is
    matched by its prompt among the records its call made."""
    prompts: dict[str, list[int]] = {}
    probes = []
    loras, specs = AdapterRequests(job), {p.name: p.prompt for p in job.probes}  # LoRA adapters (repro.engine.adapters)
    multi = job.arm.connector is not None and job.arm.connector.name == MULTI_CONNECTOR
    beneath = job.arm.connector is not None and job.arm.connector.gpu_prefix_cache
    for probe in job.probes:
        if "token_ids" in probe.prompt:
            ids, messages = list(probe.prompt["token_ids"]), None
        else:
            ids, messages = build_chat_prompt(tokenizer, probe.prompt["chat"])
        prompts[probe.name] = ids
        probes.append(ProbeResult(name=probe.name, prompt_token_ids=tuple(ids), messages=messages, requests=(),
                                  image=probe.prompt.get("image"), cache_salt=probe.prompt.get("cache_salt")))  # fmt: skip
    requests = []
    steps = job.scenario.steps
    for k, step in enumerate(steps):
        if step.wait_s:  # the engine idle, so the store's own background work (an eviction loop) can run
            report_stage(job, f"step {k + 1} of {len(steps)}: waiting {step.wait_s:g} s", preflight_ok=True)
            time.sleep(step.wait_s)
        report_stage(job, f"step {k + 1} of {len(steps)}", preflight_ok=True)
        calls = [list(step.submit)] if step.together else [[name] for name in step.submit]
        for names in calls:
            before, _ = preemption_count()
            ids = [prompts[name] for name in names]
            lora = loras.generate_kwargs([specs[name] for name in names])  # the adapters they run under, if any
            params = sampling_for(sp, [specs[name] for name in names])  # prompt logprobs where a probe asks
            outs = llm.generate([mm_prompt(i, specs[n]) for i, n in zip(ids, names)], params, use_tqdm=False, **lora)
            after, _ = preemption_count()
            grew = None if before is None or after is None else after - before
            ids = [list(getattr(o, "prompt_token_ids", None) or i) for o, i in zip(outs, ids)]  # an image expanded
            records = audit.take_many(ids) if len(ids) > 1 else [audit.take(ids[0])]
            for name, out, record in zip(names, outs, records):
                cached = getattr(out, "num_cached_tokens", None)
                role = "reuse" if cached else "cold"
                member = served_member(record, job.kv_audit_dir) if multi else None
                # beneath the GPU prefix cache: the connector's own count, from the audit's record alone (vLLM's
                # counter cannot be split between requests in flight together)
                ext = connector_tokens(record, None, None) if beneath else None
                plp = plp_record(out, specs[name].get("prompt_logprobs"))
                requests.append(
                    StepRequest(k, name, replace(_request(out, role, record, ext, member), prompt_logprobs=plp), grew)
                )
    count, source = preemption_count()
    return probes, ScenarioResult(job.scenario.name, tuple(requests), count, source)


def _prime(llm, prefix: list[int], audit, lora: dict, salt: str | None = None) -> dict | None:
    """Leave exactly `prefix` in native prefix caching: reset the cache, then prefill the prefix
    alone (one token generated, not recorded), under the probe's LoRA adapter (lora: generate's
    lora_request, or nothing) and its tenant salt, since native keys its blocks on both. Its full blocks are what
    the next request reuses; returns the priming prefill's audit record (a prefill of another shape than the
    baseline's: its KV belongs to the arm's measured floor)."""
    from vllm import SamplingParams, TokensPrompt

    llm.reset_prefix_cache()
    if not prefix:
        return None
    salted = {"cache_salt": salt} if salt is not None else {}
    llm.generate([TokensPrompt(prompt_token_ids=prefix, **salted)], SamplingParams(temperature=0.0, max_tokens=1),
                 use_tqdm=False, **lora)  # fmt: skip
    return audit.take(prefix)


def _between(llm, tokenizer, probe, reuse: int, sp, audit) -> dict:
    """Send a probe's `between` prompt once, whole and greedy as the probes are, right before its reuse `reuse`:
    what it answered (kept, never judged) and its audit record (taken, so the reuse gets its own)."""
    if "token_ids" in probe.between:
        ids = list(probe.between["token_ids"])
    else:
        ids, _ = build_chat_prompt(tokenizer, probe.between["chat"])
    out = llm.generate([mm_prompt(ids, probe.between)], sp, use_tqdm=False)[0]
    result = _request(out, "between", audit.take(ids))
    return {"probe": probe.name, "reuse": reuse, "prompt_token_ids": ids, **result.to_json()}


def _preflight_problems(job: Job) -> list[str]:
    """The first arm's child checks every arm's connector and the device before building its
    engine (see repro.engine.preflight); problems go back to the parent as a usage error."""
    if job.preflight is None:
        return []
    from repro.engine.preflight import run_preflight

    try:
        return run_preflight(job.preflight)
    except Exception:  # noqa: BLE001 - a broken check must not invent a problem: the arms report their own errors
        traceback.print_exc()
        print("kvkit-engine: warning: the preflight check did not complete; running the arm anyway", flush=True)
        return []


def run_and_write(job: Job, keep: list) -> int:
    """Run the job (its preflight first, where it has one) and write its result (repro.record.child_io.write_result);
    returns the child's exit code."""

    def produce() -> ArmResult:
        report_stage(job, "preflight" if job.preflight is not None else "importing")
        problems = _preflight_problems(job)
        if job.preflight is not None:
            report_stage(job, "importing" if not problems else "preflight failed", preflight_ok=not problems)
        return ArmResult(arm=job.arm.name, preflight_problems=tuple(problems)) if problems else run_job(job, keep)

    return write_result(job, produce)


def slot_cores(environ) -> list[int] | None:
    """The cores of this arm's slot where the engine runs inside this process (the one-process layout,
    repro.plan.settings.engine_layout_env) and the slot names them (VLLM_CPU_OMP_THREADS_BIND, "1" or "0,2-3",
    which vLLM's own layout binds its worker's threads to); None: nothing to pin."""
    if environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        return None
    cores: list[int] = []
    for part in (environ.get("VLLM_CPU_OMP_THREADS_BIND") or "").split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return None  # auto, nobind, unset, or a list of lists: vLLM's own words, nothing for the kit to pin
        cores.extend(range(int(lo), int(hi or lo) + 1))
    return cores


def main(argv: list[str]) -> int:
    job = read_job(argv, "repro.engine")
    if job is None:
        return 2
    print(
        f"kvkit-engine: arm={job.arm.name} pid={os.getpid()} PYTHONHASHSEED={os.environ.get('PYTHONHASHSEED')}",
        flush=True,
    )
    cores = slot_cores(os.environ)
    if cores:  # before vLLM and torch start a thread: every one of them inherits the slot
        os.sched_setaffinity(0, cores)
        print(f"kvkit-engine: one-process engine layout, pinned to core(s) {cores}", flush=True)
    keep: list = []
    code = run_and_write(job, keep)
    sys.stdout.flush()
    sys.stderr.flush()
    # No graceful engine shutdown: the result is on disk, and the parent kills the whole process
    # group (engine core and workers included) as soon as this process is gone.
    os._exit(code)
