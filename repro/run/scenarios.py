"""Scenarios, parent side: each (scenario, arm) child's job, the schedule control, the KV audit of their
requests and the report's `scenarios` section (which ones run: repro.plan.scenarios; running them:
repro.run.scenario_runs).

A fixture's scenarios (repro.plan.fixtures.Scenario) run after the plain probes when --scenarios asks for them.
Each (scenario, arm) is one engine child with the scenario's engine settings (a fresh engine), the
baseline arm included: its cache-off run of the same steps is the schedule control. Every request is
compared with its probe's cache-off baseline (the plain baseline arm's cold request of that probe), token
by token, no tolerance; a divergence the control shows too is the schedule's numerics, not reuse. The
verdicts are repro.judge.scenario_verdict's (decide_scenario_request, decide_scenario_arm; a hit across tenant
salts, repro.judge.salts) and repro.judge.kv_verdict's (decide_scenario_kv, through repro.run.scenario_kv).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from repro.contract.failure import Failure
from repro.contract.job import Job, ProbeJob, ScenarioJob, StepJob, build_job
from repro.contract.result import ArmResult
from repro.judge import adapters, prompt_logprobs, salts
from repro.judge.compare import first_diff
from repro.judge.evaluate import ENDPOINT, comparability_problems, margin_of
from repro.judge.replays import find_replays
from repro.judge.scenario_verdict import (
    SCHEDULE_NUMERICS,
    ScenarioRequestVerdict,
    decide_load_request,
    decide_scenario_arm,
    decide_scenario_request,
    decide_scenario_request_unbased,
    decide_scenario_tenant_isolation,
)
from repro.judge.verdict import (
    ERROR,
    SKIPPED,
    Request,
    decide_child_failure,
    decide_incomparable,
    decide_lmcache_degraded,
    decide_no_baseline,
)
from repro.lmcache.signals import arm_copy_paths, scan_log
from repro.plan.arms import PlannedArm, fresh_state, is_lmcache_connector
from repro.plan.fixtures import Probe, Scenario
from repro.plan.load import CONTROL_SUFFIX, REFERENCE_SUFFIX, control_kv_tokens
from repro.plan.settings import EngineSettings
from repro.run import load_scenario, scenario_kv
from repro.run.runner import ArmOutcome
from repro.run.scenario_kv import request_label as _label

# A scenario run's name (its log, result and KV directory): `<arm>~scenario.<name>`; `~` is no name character.
SEPARATOR = "~scenario."


# The KV audit of scenario requests (repro.run.scenario_kv), where the callers of this module find it.
annotate_kv, compare_job = scenario_kv.annotate_kv, scenario_kv.compare_job


def run_name(arm: str, scenario: str) -> str:
    return f"{arm}{SEPARATOR}{scenario}"


def trial_run(run: PlannedArm, trial: int) -> PlannedArm:
    """Trial k (2..N) of a (scenario, arm) run, named apart (its log, result and KV directory):
    `<arm>~scenario.<name>~trial<k>`, as a plain arm's trial is `<arm>~trial<k>`. Made from the run before it is
    prepared: prepare then gives the trial connector state of its own (its store starts empty, whatever trial 1
    stored); a run already prepared would hand the trial trial 1's store, so it is refused."""
    if run.store is not None:
        raise ValueError(f"trial_run: {run.name} is already prepared; its trial {trial} would share its store")
    return replace(run, spec=replace(run.spec, name=f"{run.name}~trial{trial}"))


def runs_of(
    scenario: Scenario, arms: list[PlannedArm]
) -> tuple[list[tuple[PlannedArm, PlannedArm]], dict[str, tuple[str, str]]]:
    """The (arm, its renamed run) pairs a scenario runs, baseline (the schedule control) first, and the arms
    it skips (name -> (mode, why)): those the fixture says cannot run it (skip_scenarios), and native-matched: primes each plain reuse with a connector arm's reuse length: a
    scenario has no such plan, so it is skipped."""
    runs, skipped = [], {}
    for arm in arms:
        if arm.match_arm is not None:
            why = "native-matched primes each plain reuse with the prefix length its connector arm reused; "
            skipped[arm.name] = (arm.spec.mode, why + "a scenario's steps have no such plan")
            continue
        if scenario.name in arm.skip_scenarios:
            skipped[arm.name] = (arm.spec.mode, arm.skip_scenarios[scenario.name])
            continue
        renamed = replace(arm, spec=replace(arm.spec, name=run_name(arm.name, scenario.name)))
        runs.append((arm, renamed))
    return runs + load_scenario.control_runs(scenario, arms, run_name), skipped  # a load scenario's two controls


def is_lmcache(arm: PlannedArm) -> bool:
    return is_lmcache_connector(arm.spec.connector)


def prepare(
    arm: PlannedArm, scenario: Scenario, work: Path, scratch: list[str], scratch_root, lmcache_base: str | None
) -> tuple[PlannedArm, dict | None]:
    """A run's arm made ready: connector state of its own (repro.plan.arms.fresh_state: @tmpdir directories, a fresh
    subfolder of a store directory the user named; its store starts empty), and for an LMCache arm its YAML
    (lmcache_base's, else the environment's) derived in the work directory with the scenario's LMCache keys over
    it, when it has keys or a store directory to rewrite. Returns the arm and the derived YAML's record."""
    overrides = (scenario.lmcache or None) if is_lmcache(arm) else None
    if is_lmcache(arm) and lmcache_base:
        arm = replace(arm, lmcache_config=lmcache_base)
    return fresh_state(arm, scratch, scratch_root, lmcache_overrides=overrides, yaml_dir=work)


def job_for(
    engine: EngineSettings,
    arm: PlannedArm,
    scenario: Scenario,
    probes: list[Probe],
    fixture_sha256: str,
    kv_dir: str | None,
) -> Job:
    """The verifier's job for a (scenario, arm) run: the run's engine and sampling, made the scenario's."""
    job = build_job(
        arm.spec,
        engine.config(),
        [],
        max_tokens=engine.max_tokens,
        logprobs=engine.logprobs,
        fixture_sha256=fixture_sha256,
        kv_audit_dir=kv_dir,
    )
    return scenario_job(job, scenario, probes)


def scenario_job(job: Job, scenario: Scenario, probes: list[Probe]) -> Job:
    """A job made a scenario's: the probes the scenario names (prompts only, one request each), its steps, and
    its engine settings over the job's (max_num_seqs defaults to its largest together-step; the KV cache to the
    run's --kv-cache-tokens, if given)."""
    by_name = {p.name: p for p in (*probes, *scenario.generated)}
    eng = scenario.engine
    engine = replace(
        job.engine,
        kv_cache_tokens=eng.get("kv_cache_tokens", job.engine.kv_cache_tokens),
        max_num_seqs=eng.get("max_num_seqs", scenario.widest),
        max_num_batched_tokens=eng.get("max_num_batched_tokens"),
        async_scheduling=eng.get("async_scheduling"),
        long_prefill_token_threshold=eng.get("long_prefill_token_threshold"),
        kv_unified=eng.get("kv_unified"),
    )
    steps = tuple(StepJob(s.submit, s.together, s.wait_s, dict(s.cancel)) for s in scenario.steps)
    load, reference = scenario.load is not None, job.arm.name.endswith(REFERENCE_SUFFIX)
    if load and job.arm.name.endswith(CONTROL_SUFFIX):  # the reuse control: a pool that holds every prompt
        tokens = control_kv_tokens(scenario.load, job.max_tokens, engine.block_size, engine.max_model_len)
        engine = replace(engine, kv_cache_tokens=tokens)
    if load and reference:  # every prompt alone in the plain arms' engine: no rounds
        engine, steps = job.engine, ()
    return replace(
        job,
        probes=tuple(ProbeJob(n, by_name[n].prompt_spec(), 1) for n in scenario.probe_names),
        engine=engine,
        scenario=ScenarioJob(scenario.name, steps, load, load and reference),
    )


def mp_settings(scenario: Scenario) -> dict:
    """repro.lmcache.mp.ServerSettings overrides for an LMCacheMPConnector arm's server."""
    return dict(scenario.mp_server or {})


# ---- judging --------------------------------------------------------------------------------------------


def _control(outcome: ArmOutcome | None, answers: dict[str, list[int]], logs_rel: str) -> dict:
    """The schedule control: the baseline arm's cache-off run of the scenario, request by request
    against the plain cache-off baseline."""
    if outcome is None:
        return {"arm": "baseline", "status": "error", "error": "it never ran (the run was stopping)", "requests": []}
    log = f"{logs_rel}/{outcome.log_path.name}"
    if outcome.failure is not None or outcome.result is None or outcome.result.scenario is None:
        why = outcome.failure.detail if outcome.failure else "its result has no scenario"
        kind = outcome.failure.kind if outcome.failure else "missing-output"
        return {"arm": "baseline", "status": "error", "error": f"{kind}: {why}", "requests": [], "log": log,
                "wall_s": outcome.wall_s}  # fmt: skip
    reqs = []
    for sr in outcome.result.scenario.requests:
        base = answers.get(sr.probe)
        diff = None if base is None else first_diff(base, list(sr.request.token_ids))
        reqs.append(
            {
                "step": sr.step,
                "probe": sr.probe,
                "token_ids": list(sr.request.token_ids),
                "cached_tokens": sr.request.cached_tokens,
                "matches_plain": base is not None and diff is None,
                "first_diff": diff,
                "preemptions": sr.preemptions,
            }
        )
    res = outcome.result.scenario
    return {"arm": "baseline", "status": "ok", "error": None, "requests": reqs, "log": log, "wall_s": outcome.wall_s,
            "timing": _timing(outcome.result), "preemptions": res.preemptions,
            "preemptions_source": res.preemptions_source}  # fmt: skip


def _timing(result: ArmResult) -> dict:
    """What the child's own clock says: engine start (process start to a ready engine) and generation."""
    return {"engine_start_s": result.engine_start_s, "generation_s": result.generation_s}


def _arm_entry_base(name: str, mode: str, outcome: ArmOutcome | None, logs_rel: str) -> dict:
    return {
        "arm": name,
        "mode": mode,
        "verdict": None,
        "reasons": [],
        "class": None,
        "preemptions": None,
        "preemptions_source": "unavailable: the arm did not run",
        "error": None,
        "log": f"{logs_rel}/{outcome.log_path.name}" if outcome is not None else None,
        "wall_s": outcome.wall_s if outcome is not None else None,
        "timing": None,
        "lmcache_config": None,
        "copy_paths": None,
        "lmcache_degraded": None,
        "kv": None,
        "requests": [],
    }


def lmcache_checks(entry: dict, arm: PlannedArm, outcome: ArmOutcome, verdict):
    """An LMCache (scenario, arm)'s own process checks, as a plain LMCache arm gets them: each LMCache
    process's copy path (compiled or torch fallback: this child is its own engine, and an MP arm its own
    server, so the plain arm's path is not evidence for it) and LMCache's degraded mode (it failed to
    start and silently recomputes: the arm is ERROR, never PASS). Returns the verdict, maybe ERROR."""
    if not is_lmcache(arm):
        return verdict
    build = (outcome.result.versions or {}).get("lmcache_build") if outcome.result is not None else None
    entry["copy_paths"] = arm_copy_paths(arm.spec.connector.name, build, outcome.log_text, outcome.server_copy_path)
    degraded = scan_log(outcome.log_text)["degraded"]
    entry["lmcache_degraded"] = degraded[:3]
    verdict = decide_lmcache_degraded(verdict, degraded)
    if verdict.error_kind is not None and entry["error"] is None:
        entry["error"] = Failure(verdict.error_kind, verdict.error_detail, "\n".join(degraded)).to_json()
    return verdict


def judge_run(
    scenario: Scenario,
    arm: PlannedArm,
    outcome: ArmOutcome | None,
    baseline: ArmResult | None,
    control: dict,
    logs_rel: str,
    reuse_pairs: list | None = None,
) -> dict:
    """One (scenario, arm) entry of the report: every request judged, then the arm. A load scenario's baseline is
    its own cache-off reference run, and reuse_pairs its reuse control's answers (repro.run.load_scenario)."""
    entry = _arm_entry_base(arm.name, arm.spec.mode, outcome, logs_rel)
    if outcome is None:
        entry.update(verdict=ERROR, reasons=["it never ran (the run was stopping)"])
        return entry
    if outcome.failure is not None:
        v = decide_child_failure(outcome.failure.kind, outcome.failure.detail)
        entry.update(verdict=v.verdict, reasons=list(v.reasons), error=outcome.failure.to_json())
        return entry
    result = outcome.result
    entry["timing"] = _timing(result)
    if baseline is None:
        v = decide_no_baseline()
        entry.update(verdict=v.verdict, reasons=list(v.reasons))
        return entry
    problems = comparability_problems(baseline, result)
    if problems or result.scenario is None:
        v = decide_incomparable(problems or ["its result has no scenario"])
        entry.update(verdict=v.verdict, reasons=list(v.reasons))
        return entry
    base_probes = {p.name: p for p in baseline.probes if p.requests}
    answers = {n: list(p.requests[0].token_ids) for n, p in base_probes.items()}
    sibs = adapters.siblings(base_probes.values())  # probes that are one prompt under other LoRA adapters
    ok = control["status"] == "ok"
    ctl = control["requests"]
    judged: list[tuple[str, ScenarioRequestVerdict]] = []
    earlier: dict[str, list[tuple[str, list[int]]]] = {}
    beneath = bool(arm.spec.connector and arm.spec.connector.gpu_prefix_cache)  # repro.plan.offloading
    load = scenario.load is not None
    pairs = load_scenario.aligned(reuse_pairs, result) if load else None
    tenants = salts.Tenants(result.probes, (result.effective_config or {}).get("frontend") != ENDPOINT)
    for i, sr in enumerate(result.scenario.requests):
        req, step = sr.request, scenario.steps[sr.step]
        expect, note = step.expect, None
        if expect == "reuse" and sr.probe in arm.skip_probes:  # run and compared all the same; its reuse not owed
            expect, note = (
                None,
                f"expect reuse not enforced: the fixture says this arm cannot reuse it ({arm.skip_probes[sr.probe]})",
            )
        base = base_probes.get(sr.probe)
        matches = None
        if ok and i < len(ctl) and (ctl[i]["step"], ctl[i]["probe"]) == (sr.step, sr.probe):
            matches = ctl[i]["matches_plain"]
        view = Request(tuple(req.token_ids), req.cached_tokens, req.external_tokens, beneath)
        if base is None:
            v = decide_scenario_request_unbased(view)
        elif load:
            pair = pairs[i][2:] if pairs is not None and pairs[i][:2] == (sr.step, sr.probe) else None
            v = decide_load_request(
                tuple(answers[sr.probe]), view, matches, bool(sr.preemptions), pair, outcome.max_tokens
            )
        else:
            v = decide_scenario_request(
                tuple(answers[sr.probe]), view, expect, matches, bool(sr.preemptions), outcome.max_tokens
            )
        v = decide_scenario_tenant_isolation(
            v, tenants.cross(_label(sr.step, sr.probe, load), sr.probe, req.cached_tokens)
        )
        judged.append((_label(sr.step, sr.probe, load), v))
        tokens = list(req.token_ids)
        replays = None
        if v.first_diff is not None and base is not None:
            found = find_replays(
                sr.probe, tokens, answers[sr.probe], answers, earlier.get(sr.probe, []), sibs.get(sr.probe)
            )
            replays = [r.as_dict() for r in found]
        v = adapters.judge_scenario_request(v, sr.probe, answers, sibs.get(sr.probe), replays)  # key identity
        base_cold = base.requests[0] if base is not None else None
        v, plp = prompt_logprobs.judge_request(v, req, base_cold, expect == "reuse")  # where it asked for them
        judged[-1] = (judged[-1][0], v)
        earlier.setdefault(sr.probe, []).append((_label(sr.step, sr.probe, load), tokens))
        entry["requests"].append(
            {
                "step": sr.step,
                "probe": sr.probe,
                "role": v.role,
                "cached_tokens": req.cached_tokens,
                "expect": step.expect,
                "note": note,
                "verdict": v.verdict,
                "reasons": list(v.reasons),
                "class": v.cls,
                "first_diff": v.first_diff,
                "margin": margin_of(v.first_diff, base.requests[0], req) if base is not None else None,
                "replays": replays,
                "token_ids": tokens,
                "text": None if load else req.text,  # a load round's hundreds of answers: their token IDs only
                "kv_transfer_params": req.kv_transfer_params,
                "preemptions": sr.preemptions,
                "kv": None,
                "control_matches": matches,
            }
        )
        if v.finding:  # a finding no fixture's FAIL excuses (repro.judge.verdict.FINDINGS); absent otherwise
            entry["requests"][-1]["finding"] = v.finding
        if beneath:  # the connector's own count (repro.plan.offloading); absent for every other arm, as before
            entry["requests"][-1]["external_tokens"] = req.external_tokens
        if plp is not None:  # its prompt logprobs' summary (repro.judge.prompt_logprobs); absent otherwise
            entry["requests"][-1]["prompt_logprobs"] = plp
        if load:  # the reuse control's hit for the same request, and what its cancelled attempt had done
            entry["requests"][-1]["control_cached_tokens"] = pairs[i][3] if pairs is not None else None
            entry["requests"][-1]["cancel"] = sr.cancel
    served = any((r.request.external_tokens or 0) > 0 for r in result.scenario.requests) if beneath else None
    verdict = decide_scenario_arm(judged, bool(scenario.engine.get("preemption")), result.scenario.preemptions, served,
                                  scenario.engine.get("long_prefill_token_threshold"))  # fmt: skip
    verdict = lmcache_checks(entry, arm, outcome, verdict)
    entry.update(
        verdict=verdict.verdict,
        reasons=list(verdict.reasons),
        preemptions=result.scenario.preemptions,
        preemptions_source=result.scenario.preemptions_source,
    )
    if any(v.cls == SCHEDULE_NUMERICS for _, v in judged):
        entry["class"] = SCHEDULE_NUMERICS
    if load:
        entry["load"] = {"rounds": load_scenario.rates(entry), "reuse_control": pairs is not None}
    return entry


def judging_baseline(scenario: Scenario, runs: list, baseline: ArmResult | None, logs_rel: str) -> tuple:
    """What a (scenario, arm) is judged against: (baseline, reuse control's answers, its report entry). Any
    scenario: the plain baseline, None, None. A load scenario: the cache-off answers its baseline's child made
    alone, and its reuse control's run (repro.run.load_scenario); runs: (original arm, run arm, outcome, ...)."""
    if scenario.load is None:
        return baseline, None, None
    ref = next((r[2] for r in runs if load_scenario.is_reference(r[1].name)), None)
    reuse = next((r[2] for r in runs if load_scenario.is_reuse_control(r[1].name)), None)
    baseline = load_scenario.reference(ref)
    answers = {p.name: list(p.requests[0].token_ids) for p in (baseline.probes if baseline else ()) if p.requests}
    pairs, entry = load_scenario.reuse_control(reuse, answers, logs_rel)
    return baseline, pairs, {"reference": load_scenario.reference_entry(ref, logs_rel), "reuse_control": entry}


def section(
    scenario: Scenario,
    runs: list[tuple[PlannedArm, PlannedArm, ArmOutcome | None, dict | None]],
    skipped: dict[str, tuple[str, str]],
    baseline: ArmResult | None,
    logs_rel: str,
) -> dict:
    """One scenario of the report: its definition, the control and every arm (runs: original arm, run
    arm, outcome, derived LMCache YAML record)."""
    baseline, pairs, load_control = judging_baseline(scenario, runs, baseline, logs_rel)
    runs = [r for r in runs if not load_scenario.is_control(r[1].name)]
    control_run = next((r for r in runs if r[0].spec.mode == "baseline"), None)
    answers = {p.name: list(p.requests[0].token_ids) for p in (baseline.probes if baseline else ()) if p.requests}
    control = _control(control_run[2] if control_run else None, answers, logs_rel)
    arms = []
    for original, run, outcome, lmcache_record in runs:
        if original.spec.mode == "baseline":
            continue
        entry = judge_run(scenario, run, outcome, baseline, control, logs_rel, pairs)
        entry["arm"] = original.name
        entry["lmcache_config"] = lmcache_record
        if run.store is not None:  # how its connector state was made fresh, or why it may persist
            entry["store"] = run.store
        arms.append(entry)
    for name, (mode, why) in skipped.items():
        entry = _arm_entry_base(name, mode, None, logs_rel)
        arms.append({**entry, "verdict": SKIPPED, "reasons": [why], "preemptions_source": "unavailable: skipped"})
    return {
        "name": scenario.name,
        "description": scenario.description,
        "engine": dict(scenario.engine),
        "lmcache": scenario.lmcache,
        "mp_server": scenario.mp_server,
        "steps": [
            {"index": k, "submit": list(s.submit), "together": s.together, "expect": s.expect}
            | ({"wait_s": s.wait_s} if s.wait_s else {})
            | ({"cancel": dict(s.cancel)} if s.cancel else {})
            for k, s in enumerate(scenario.steps)
        ],
        "control": control,
        "arms": arms,
    } | ({"load": {**scenario.load.to_json(), **load_control}} if scenario.load is not None else {})
