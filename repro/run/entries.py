"""Each run of an arm judged into its entry of the report: its result against the baseline (repro.judge.evaluate),
or its failure; for an LMCache arm its LMCache evidence beside the verdict, and with --batch-invariant whether
its workers ran the kernels. The arms' own runs first, then each trial and confirmation alone, judged alike."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from repro.contract.failure import Failure
from repro.contract.result import ArmResult
from repro.judge import logscan
from repro.judge.batch_invariance import BATCH_INVARIANT_INACTIVE, batch_invariance_state, decide_batch_invariance
from repro.judge.evaluate import judge_arm
from repro.judge.members import decide_members, served_reuses
from repro.judge.verdict import LMCACHE_DEGRADED, decide_child_failure, decide_lmcache_degraded
from repro.lmcache import mp as lmcache_mp
from repro.lmcache.signals import lmcache_evidence
from repro.plan import multi
from repro.plan.arms import PlannedArm


def arm_entry(
    arm: PlannedArm,
    outcome,
    baseline: ArmResult | None,
    block_size: int,
    logs_rel: str,
    batch_invariant: bool = False,
) -> dict:
    """One arm of the report: its result judged against the baseline, or its failure. outcome: how its run
    went (repro.run.runner.ArmOutcome)."""
    spec = arm.spec
    # the log the outcome came from: the arm's, or its MP server's when the arm never ran (never one not written)
    log = outcome.log_path.name if outcome.log_path is not None else f"{spec.name}.log"
    entry = {
        "name": spec.name,
        "mode": spec.mode,
        "connector": spec.connector and spec.connector.to_json(),
        "error": None,
        "log": f"{logs_rel}/{log}",
        "warnings": logscan.count_warnings(outcome.log_text),
        "effective_config": None,
        "versions": None,
        "probes": [],
        "findings": [],
        "timing": {"wall_s": outcome.wall_s},
    }
    if arm.store is not None:  # how this run's connector state was made fresh, or why it may persist (repro.plan.arms)
        entry["store"] = arm.store
    res = outcome.result
    if res is not None:
        entry.update(effective_config=res.effective_config, versions=res.versions)
        entry["timing"].update(engine_start_s=res.engine_start_s, import_s=res.import_s, generation_s=res.generation_s)
    if outcome.failure is not None:
        verdict = decide_child_failure(outcome.failure.kind, outcome.failure.detail)
        entry.update(error=outcome.failure.to_json(), verdict=verdict.verdict, reasons=list(verdict.reasons))
        return entry
    beneath = bool(spec.connector and spec.connector.gpu_prefix_cache)  # its own hits count (repro.plan.offloading)
    probes, verdict = judge_arm(
        res, baseline, spec.mode, block_size, arm.skip_probes, outcome.asked, beneath, outcome.max_tokens
    )
    entry["probes"] = probes
    if multi.is_multi(spec.connector):  # hits and a verdict per member; the token verdict stays what served
        members = decide_members([m.name for m in multi.member_specs(spec.connector)], served_reuses(probes),
                                 verdict.verdict)  # fmt: skip
        entry["members"] = [m.to_json() for m in members]
        verdict = replace(verdict, reasons=(*verdict.reasons, *(r for m in members for r in m.reasons)))
    if spec.connector is not None and "lmcache" in spec.connector.name.lower():
        evidence = lmcache_evidence(
            probes,
            outcome.log_text,
            connector=spec.connector.name,
            server_log=lmcache_mp.server_log_path(Path(logs_rel), spec.name).as_posix(),
            engine_build=(res.versions or {}).get("lmcache_build"),
            server_copy_path=outcome.server_copy_path,
        )
        entry["lmcache"] = evidence.signals
        entry["copy_paths"] = evidence.signals.get("copy_paths")  # every LMCache process: compiled or fallback
        entry["findings"] += list(evidence.findings)
        for probe in probes:
            for i, req in enumerate(probe["requests"]):
                req["lmcache"] = evidence.request_views[(probe["name"], i)]
        verdict = decide_lmcache_degraded(verdict, evidence.degraded)
        if verdict.error_kind == LMCACHE_DEGRADED:
            entry["error"] = Failure(verdict.error_kind, verdict.error_detail, "\n".join(evidence.degraded)).to_json()
    # --batch-invariant: an arm whose workers did not confirm the kernels were active is no evidence
    cfg = res.effective_config or {}
    if (note := speculative_note(cfg)) is not None:
        entry["warnings"][note] = 1
    verdict = decide_batch_invariance(verdict, batch_invariant, batch_invariance_state(cfg.get("workers")))
    if verdict.error_kind == BATCH_INVARIANT_INACTIVE:
        entry["error"] = Failure(verdict.error_kind, verdict.error_detail).to_json()
    entry.update(verdict=verdict.verdict, reasons=list(verdict.reasons))
    return entry


def speculative_note(effective_config: dict) -> str | None:
    """The kit's warning for an arm asked to decode speculatively (--speculative-config) whose engine's counters do
    not show a drafted token: its reuse was judged, but not under speculative decoding. None: it drafted, or was not
    asked to."""
    counts = effective_config.get("speculative_decoding")
    if not isinstance(counts, dict):
        return None
    drafted = counts.get("draft_tokens")
    if isinstance(drafted, int) and drafted > 0:
        return None
    why = (counts.get("sources") or {}).get("draft_tokens") if drafted is None else "0 draft tokens"
    return f"kvkit: speculative decoding was asked for and drafted no token ({why}): no verification step ran"


def judge_arms(
    planned: list[PlannedArm],
    outcomes: list,
    matched: dict[str, tuple[dict, dict]],
    block_size: int,
    logs_rel: str,
    batch_invariant: bool = False,
) -> tuple[list[dict], dict[str, ArmResult], ArmResult | None]:
    """The arms' own runs, in plan order: their entries (native-matched's saying what it matched), the results
    that came back whole by arm name, and the baseline's result (None when it failed)."""
    baseline = None
    entries: list[dict] = []
    results: dict[str, ArmResult] = {}
    for arm, outcome in zip(planned, outcomes):
        if arm.spec.mode == "baseline" and outcome.failure is None:
            baseline = outcome.result
        if outcome.result is not None and outcome.failure is None:
            results[arm.name] = outcome.result
        entries.append(arm_entry(arm, outcome, baseline, block_size, logs_rel, batch_invariant))
        if arm.match_arm is not None:
            info = matched.get(arm.name, ({}, {}))[1]
            entries[-1]["matched_to"] = arm.match_arm
            for p in entries[-1]["probes"]:
                p["match"] = info.get(p["name"])
    return entries, results, baseline


def judge_runs(
    runs: list,
    planned: list[PlannedArm],
    baseline: ArmResult | None,
    block_size: int,
    logs_rel: str,
    batch_invariant: bool = False,
) -> dict[str, ArmResult]:
    """The runs beyond each arm's own (trials, confirmations alone: repro.run.arm_runs.Run) not judged yet, each
    judged like its arm, skipping what its arm skipped; returns their results that came back whole."""
    results: dict[str, ArmResult] = {}
    for r in runs:
        if r.entry is not None:
            continue
        arm = replace(r.arm, skip_probes={**r.arm.skip_probes, **planned[r.primary].skip_probes})
        r.entry = arm_entry(arm, r.outcome, baseline, block_size, logs_rel, batch_invariant)
        if r.outcome.result is not None and r.outcome.failure is None:
            results[r.arm.name] = r.outcome.result
    return results
