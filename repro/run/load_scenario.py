"""A production-load scenario, parent side (repro.plan.load): its reuse control's run, its references and its rates.

Three runs stand behind every arm's verdict, each run once, none judged as an arm: the reference (each prompt alone
with caching off, in the plain arms' engine: the cache-disabled answer each request is compared with, and the
reference KV; `baseline~scenario.<name>~reference`), the baseline's rounds cache-off (the schedule control), and the
reuse control, native prefix caching with a pool that holds every prompt, over the same rounds
(`<native>~scenario.<name>~control`). A request counts as differing only when it differs from its
prompt's cache-off answer and from the reuse control's answer to the same request (repro.judge.scenario_verdict
.decide_load_request). Each arm's entry gets its rates per round: k of N requests, with n always given.
"""

from __future__ import annotations

from dataclasses import replace

from repro.contract.result import ArmResult
from repro.judge.compare import first_diff
from repro.judge.scenario_verdict import REUSE_NUMERICS, SCHEDULE_NUMERICS
from repro.judge.verdict import FAIL, KV_FINDINGS, UNAVAILABLE, hit_count
from repro.plan.arms import PlannedArm
from repro.plan.fixtures import Scenario
from repro.plan.load import CONTROL_SUFFIX, REFERENCE_SUFFIX


def is_control(run_name: str) -> bool:
    """The reference run or the reuse control: run once, never judged as an arm."""
    return run_name.endswith((CONTROL_SUFFIX, REFERENCE_SUFFIX))


def is_reference(run_name: str) -> bool:
    return run_name.endswith(REFERENCE_SUFFIX)


def is_reuse_control(run_name: str) -> bool:
    return run_name.endswith(CONTROL_SUFFIX)


def control_runs(scenario: Scenario, arms: list[PlannedArm], run_name) -> list[tuple[PlannedArm, PlannedArm]]:
    """A load scenario's two runs besides its arms: the reference (the baseline arm renamed
    `baseline~scenario.<name>~reference`: every prompt alone, cache off, in the plain arms' engine) and the reuse
    control (the run's native arm, not native-matched, renamed `<native>~scenario.<name>~control`); none for any
    other scenario (the run refuses a load scenario without native: repro.plan.scenarios.check_load)."""
    if scenario.load is None:
        return []
    out = []
    for mode, suffix in (("baseline", REFERENCE_SUFFIX), ("native", CONTROL_SUFFIX)):
        arm = next((a for a in arms if a.spec.mode == mode and a.match_arm is None), None)
        if arm is not None:
            out.append((arm, replace(arm, spec=replace(arm.spec, name=run_name(arm.name, scenario.name) + suffix))))
    return out


def reference(outcome) -> ArmResult | None:
    """The reference run's result when it answered every prompt alone: its probes hold each prompt's cache-disabled
    answer (and their KV audit records: the reference KV), the judging's baseline; None when it failed."""
    result = None if outcome is None or outcome.failure is not None else outcome.result
    if result is None or result.scenario is None or not all(p.requests for p in result.probes):
        return None
    return result


def reference_entry(outcome, logs_rel: str) -> dict:
    """The reference run's entry for the report: status, log, and its error when it gave no answers."""
    if outcome is None:
        return {"status": "error", "error": "it never ran (the run was stopping)", "log": None}
    log = f"{logs_rel}/{outcome.log_path.name}"
    if reference(outcome) is not None:
        return {"status": "ok", "error": None, "log": log, "wall_s": outcome.wall_s}
    why = f"{outcome.failure.kind}: {outcome.failure.detail}" if outcome.failure else "it answered not every prompt"
    return {"status": "error", "error": why, "log": log, "wall_s": outcome.wall_s}


def reuse_control(outcome, answers: dict[str, list[int]], logs_rel: str) -> tuple[list | None, dict]:
    """The reuse control's answers, request by request ((round, prompt, tokens, cached tokens), in the rounds' order, the order
    every arm lists them in), or None when it failed; and its entry for the report: status, its differences from the
    cache-off answers per round, and its hits (a pool that holds every prompt reuses every prompt after round 1)."""
    if outcome is None:
        return None, {"status": "error", "error": "it never ran (the run was stopping)"}
    log = f"{logs_rel}/{outcome.log_path.name}"
    if outcome.failure is not None or outcome.result is None or outcome.result.scenario is None:
        why = f"{outcome.failure.kind}: {outcome.failure.detail}" if outcome.failure else "its result has no scenario"
        return None, {"status": "error", "error": why, "log": log}
    reqs = outcome.result.scenario.requests
    rounds: dict[int, dict] = {}
    for sr in reqs:
        r = rounds.setdefault(sr.step, {"round": sr.step + 1, "requests": 0, "reused": 0, "counter_missing": 0,
                                        "differ": 0})  # fmt: skip
        r["requests"] += 1
        _count_hit(r, sr.request.cached_tokens)
        base = answers.get(sr.probe)
        r["differ"] += base is not None and first_diff(base, list(sr.request.token_ids)) is not None
    pairs = [(sr.step, sr.probe, tuple(sr.request.token_ids), sr.request.cached_tokens) for sr in reqs]
    entry = {
        "status": "ok",
        "error": None,
        "log": log,
        "wall_s": outcome.wall_s,
        "num_gpu_blocks": (outcome.result.effective_config or {}).get("num_gpu_blocks"),
        "rounds": [rounds[k] for k in sorted(rounds)],
    }
    return pairs, entry


def aligned(pairs: list | None, result: ArmResult) -> list | None:
    """The control's answers lined up with an arm's requests: the same (round, prompt) at every index, else None."""
    if pairs is None or result.scenario is None or len(pairs) != len(result.scenario.requests):
        return None
    same = all(p[:2] == (sr.step, sr.probe) for p, sr in zip(pairs, result.scenario.requests))
    return pairs if same else None


def _count_hit(round_: dict, cached_tokens: object) -> None:
    """One request's hit counter into its round: reused when it is a count above 0 (repro.judge.verdict.hit_count);
    a counter that is None, negative (vLLM's -1, 'not checked yet') or no integer is no hit and no miss: counted
    apart as counter_missing, never as reused (absent telemetry is never read as good)."""
    hits = hit_count(cached_tokens)
    round_["reused"] += bool(hits)
    round_["counter_missing"] += hits is None


KV_CLASS_KEYS = {c: f"kv_{c.lower()}" for c in KV_FINDINGS}  # CORRUPT -> kv_corrupt, ...


def rates(entry: dict) -> list[dict]:
    """An arm's load rates per round from its judged requests: N requests, how many reused (a hit counter above 0),
    how many have no hit counter (None, or vLLM's -1: counter_missing, counted apart), differ from the
    cache-off answer, are explained by the reuse control (reuse-numerics) or the schedule control (schedule-numerics),
    differ (neither explains them), are findings (FAIL), and how many cancellations landed or missed. Where the arm
    was KV-audited (its entry has a KV verdict: repro.run.scenarios.annotate_kv, which computes the rates again) its
    KV figures beside (_count_kv); absent where it was not, never a zero."""
    audited = isinstance(entry.get("kv"), dict)
    out: dict[int, dict] = {}
    for r in entry["requests"]:
        k = out.setdefault(
            r["step"],
            {"round": r["step"] + 1, "requests": 0, "reused": 0, "differ_from_cache_off": 0, "reuse_numerics": 0,
             "schedule_numerics": 0, "differ": 0, "fail": 0, "cancelled": 0, "cancel_missed": 0,
             "counter_missing": 0} | (_kv_zero() if audited else {}),
        )  # fmt: skip
        k["requests"] += 1
        _count_hit(k, r["cached_tokens"])
        if r["first_diff"] is not None:
            k["differ_from_cache_off"] += 1
            cls = r["class"]
            k["reuse_numerics"] += cls == REUSE_NUMERICS
            k["schedule_numerics"] += cls == SCHEDULE_NUMERICS
            k["differ"] += cls not in (REUSE_NUMERICS, SCHEDULE_NUMERICS)
        k["fail"] += r["verdict"] == FAIL
        cancel = r.get("cancel")
        if cancel:
            k["cancel_missed" if cancel.get("missed") else "cancelled"] += 1
        if audited:
            _count_kv(k, r)
    return [out[k] for k in sorted(out)]


def _kv_zero() -> dict:
    return {"kv_audited": 0, "kv_unavailable": 0, "kv_findings": 0, "kv_findings_tokens_match": 0,
            **dict.fromkeys(KV_CLASS_KEYS.values(), 0)}  # fmt: skip


def _count_kv(round_: dict, request: dict) -> None:
    """One request's KV verdict into its round: audited (it has one), unavailable, a finding (MISPLACED, FOREIGN or
    CORRUPT, each counted by its class), and a finding whose tokens equal the cache-off answer (the tokens alone
    would not show it)."""
    kv = request.get("kv")
    verdict = kv.get("verdict") if isinstance(kv, dict) else None
    if verdict is None:  # not audited: a miss, or a reuse the audit had no cause to read
        return
    round_["kv_audited"] += 1
    round_["kv_unavailable"] += verdict == UNAVAILABLE
    if verdict in KV_FINDINGS:
        round_["kv_findings"] += 1
        round_[KV_CLASS_KEYS[verdict]] += 1
        round_["kv_findings_tokens_match"] += request.get("first_diff") is None


def kv_summary(judged: dict) -> dict | None:
    """The reuse control's KV verdict over its reuses (its entry judged as an arm's would be, then cut to the
    verdict, its first reasons and its floor): what native reuse does to the bytes under the same load, beside
    which an arm's KV class is read; None when it was not audited."""
    kv = judged.get("kv")
    if not isinstance(kv, dict):
        return None
    counts: dict[str, int] = {}
    for r in judged.get("requests") or []:
        verdict = (r.get("kv") or {}).get("verdict")
        if verdict:
            counts[verdict] = counts.get(verdict, 0) + 1
    return {"verdict": kv.get("verdict"), "reasons": list(kv.get("reasons") or [])[:3], "floor": kv.get("floor"),
            "requests": dict(sorted(counts.items()))}  # fmt: skip
