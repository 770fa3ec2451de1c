"""No finding behind a green exit (issue 33): the seven holes a review found in the verdict, trials, scenario
and KV code, each pinned by a test that failed on the code before its fix (d4dcb7f), and the one exit rule
(repro.record.exit_rule.exit_reason) that plain arms and scenarios share. No engine: judged entries and results are
built as the parent and the child build them."""

from __future__ import annotations

import copy
from pathlib import Path

from test_kvaudit import _planes, _record
from test_scenario_lmcache_checks import BASE, _baseline, _control, _scenario
from test_scenario_views import scenario_report

from repro.contract.job import ArmSpec
from repro.contract.result import ArmResult, ProbeResult, RequestResult, ScenarioResult, StepRequest
from repro.errors import EXIT_MISMATCH, EXIT_OK, EXIT_RUNTIME
from repro.judge import trials
from repro.judge.evaluate import judge_arm
from repro.judge.scenario_verdict import MISS, decide_scenario_request
from repro.judge.verdict import FAIL, INCONCLUSIVE, PASS, Request, decide_baseline_probe, decide_probe
from repro.plan.arms import PlannedArm
from repro.publish.summary import format_summary
from repro.readmodel.conditions import TrialRate
from repro.record.acceptance import check_acceptance
from repro.record.exit_rule import exit_code, exit_reason, scenario_exit
from repro.run.runner import ArmOutcome
from repro.run.scenarios import annotate_kv, judge_run

TOKENS = (5, 6, 7, 8)
OTHER = (5, 6, 9, 9)  # differs from TOKENS @2


# --- plain arms: a report of a baseline and one connector arm with trials ---------------------------------


def _probe(name: str, verdict: str, kv: str | None = None, diffs=(None, None), cached=(0, 256)) -> dict:
    reqs = [{"first_diff": d, "cached_tokens": c} for d, c in zip(diffs, cached)]
    return {"name": name, "verdict": verdict, "reasons": [], "requests": reqs,
            "kv": None if kv is None else {"verdict": kv}, "skipped": None}  # fmt: skip


def _entry(name: str, probes: list[dict], verdict: str | None = None) -> dict:
    worst = verdict or max((p["verdict"] for p in probes), key=[PASS, INCONCLUSIVE, FAIL, "ERROR"].index)
    return {"name": name, "mode": "connector", "verdict": worst, "reasons": [], "probes": probes, "error": None,
            "timing": {"wall_s": 1.0}}  # fmt: skip


def _plain_report(own: dict, later: list[dict], expected: dict, expected_kv: dict | None = None) -> dict:
    base = _entry("baseline", [_probe("a", PASS), _probe("b", PASS)])
    base["mode"] = "baseline"
    arm = copy.deepcopy(own)
    runs = [trials.run_summary(own, 1, False)] + [trials.run_summary(e, k, False) for k, e in enumerate(later, 2)]
    arm["trials"] = trials.trial_rates(runs)
    arms = [base, arm]
    acc = check_acceptance(arms, expected, "acceptance", expected_kv)
    return {"complete": True, "errors": [], "arms": arms, "acceptance": acc, "generations": 0}


def test_1_a_later_trials_fail_is_a_finding_when_trial_1_was_an_expected_inconclusive():
    own = _entry("Conn", [_probe("a", INCONCLUSIVE, cached=(0, 0)), _probe("b", PASS)])
    later = _entry("Conn", [_probe("a", FAIL, diffs=(None, 3)), _probe("b", PASS)])
    report = _plain_report(own, [later], {"Conn": {"a": INCONCLUSIVE, "b": PASS}})
    assert report["acceptance"]["matched"] is True
    code, why = exit_reason(report)
    assert code == EXIT_MISMATCH and "Conn trial 2: a FAIL" in why


def test_1_a_later_trials_corrupt_kv_is_a_finding_when_trial_1_was_an_expected_fail_with_exact_kv():
    own = _entry("Conn", [_probe("a", FAIL, "EXACT", diffs=(None, 3)), _probe("b", PASS, "EXACT")])
    later = _entry("Conn", [_probe("a", FAIL, "CORRUPT", diffs=(None, 3)), _probe("b", PASS, "EXACT")])
    report = _plain_report(own, [later], {"Conn": {"a": FAIL, "b": PASS}}, {"Conn": {"a": "EXACT", "b": "EXACT"}})
    assert report["acceptance"]["matched"] is True
    code, why = exit_reason(report)
    assert code == EXIT_MISMATCH and "Conn trial 2: a CORRUPT" in why
    # the same kinds as trial 1 (a FAIL again, at another index) are no new finding: exit 0
    again = _entry("Conn", [_probe("a", FAIL, "EXACT", diffs=(None, 5)), _probe("b", PASS, "EXACT")])
    report = _plain_report(own, [again], {"Conn": {"a": FAIL, "b": PASS}}, {"Conn": {"a": "EXACT", "b": "EXACT"}})
    assert exit_code(report) == EXIT_OK


def _result(name: str, probes: dict[str, int], cached: int | None = 256, config: dict | None = None) -> ArmResult:
    out = []
    for probe, n in probes.items():
        reqs = [RequestResult("cold", 0, TOKENS, (), "length", None, "")]
        reqs += [RequestResult("reuse", cached, TOKENS, (), "length", None, "") for _ in range(n - 1)]
        out.append(ProbeResult(probe, (1, 2, 3), None, tuple(reqs)))
    return ArmResult(name, tuple(out), effective_config=config)


def test_2_a_trial_judged_error_without_an_error_object_exits_3():
    baseline = _result("baseline", {"a": 1, "b": 1})
    incomparable = _result("Conn~trial2", {"a": 3, "b": 3}, config={"dtype": "bfloat16"})
    entries, verdict = judge_arm(incomparable, baseline, "connector", 16)
    assert verdict.verdict == "ERROR" and verdict.error_kind is None  # refusing to compare: no error object
    later = _entry("Conn", entries, verdict.verdict)
    own = _entry("Conn", [_probe("a", PASS), _probe("b", PASS)])
    report = _plain_report(own, [later], {"Conn": {"a": PASS, "b": PASS}})
    assert report["errors"] == []  # what the parent writes there comes from error objects only
    code, why = exit_reason(report)
    assert code == EXIT_RUNTIME and "Conn (trial 2): ERROR" in why


def test_2_a_scenario_trial_judged_error_without_an_error_object_exits_3():
    report = scenario_report()
    report["scenarios"] = [report["scenarios"][0]]
    report["errors"] = []
    native = report["scenarios"][0]["arms"][1]
    bad = ArmResult("native~trial2", scenario=None)  # a result without its scenario: ERROR, no error object
    outcome = ArmOutcome("native~trial2", bad, None, Path("/logs/n.log"), "", 1.0)
    judged = judge_run(_scenario(), PlannedArm(ArmSpec("native", "native")), outcome, _baseline(), _control(), "l")
    assert judged["verdict"] == "ERROR" and judged["error"] is None
    native["trials"] = trials.scenario_trial_rates(
        [trials.scenario_run_summary(native, 1, False), trials.scenario_run_summary(judged, 2, False)]
    )
    assert scenario_exit(report) == EXIT_RUNTIME
    assert exit_reason(report)[0] == EXIT_RUNTIME


def test_3_a_negative_hit_counter_is_missing_never_a_hit_or_a_miss():
    # a reuse with -1 cached tokens (vLLM's "not checked yet") is no hit: INCONCLUSIVE, never PASS
    pv = decide_probe(TOKENS, Request(TOKENS, 0), [Request(TOKENS, -1)])
    assert pv.verdict == INCONCLUSIVE and "-1" in pv.reasons[0] and "missing" in pv.reasons[0]
    # a cold request with -1 is not a verified miss
    pv = decide_probe(TOKENS, Request(TOKENS, -1), [Request(TOKENS, 256)])
    assert pv.verdict == INCONCLUSIVE and "not a verified miss" in pv.reasons[0] and "-1" in pv.reasons[0]
    assert decide_baseline_probe(Request(TOKENS, -1)).verdict == INCONCLUSIVE
    # neither is a float, a bool or a string a count
    for bad in (1.5, True, "256"):
        assert decide_probe(TOKENS, Request(TOKENS, 0), [Request(TOKENS, bad)]).verdict == INCONCLUSIVE
    # a scenario request with -1 is not a verified reuse: a miss whose counter is missing
    v = decide_scenario_request(TOKENS, Request(TOKENS, -1), "reuse", True)
    assert v.role == MISS and v.verdict == INCONCLUSIVE and "-1" in v.reasons[0]
    # and a request expected to miss that reports -1 is not a verified miss either
    v = decide_scenario_request(TOKENS, Request(TOKENS, -1), "miss", True)
    assert v.verdict == INCONCLUSIVE


def test_4_the_scenario_audit_classes_a_request_that_reused_blocks_whatever_its_hit_counter():
    """The second request's hit counter is missing, but its audit record says it reused 2 blocks, and their KV
    is corrupt: the (scenario, arm)'s KV verdict is CORRUPT, as a plain arm's would be."""
    cold_rec, reuse_rec = _record(0, computed=2), _record(1, reused=2)
    reqs = (
        StepRequest(0, "fixture", RequestResult("cold", 0, BASE, (), "length", None, "", kv_audit_record=cold_rec), 0),
        StepRequest(1, "fixture", RequestResult("reuse", None, BASE, (), "length", None, "",
                                                kv_audit_record=reuse_rec), 0),
    )  # fmt: skip
    result = ArmResult("native", scenario=ScenarioResult("s", reqs, 0, "vllm:num_preemptions"),
                       kv_audit={"dir": "/a", "errors": []})  # fmt: skip
    outcome = ArmOutcome("native", result, None, Path("/logs/native.log"), "", 1.0)
    entry = judge_run(_scenario(), PlannedArm(ArmSpec("native", "native")), outcome, _baseline(), _control(), "l")
    assert [r["role"] for r in entry["requests"]] == ["miss", "miss"]  # the counter says nothing of reuse
    same, zero = {"K": [True, True], "V": [True, True]}, {"K": [0.0, 0.0], "V": [0.0, 0.0]}
    wrong = {"K": [False, True], "V": [True, True]}
    raw = {"arms": {"native": {"fixture": {
        "0": {"kind": "computed", "num_blocks": 2, "layers": 1, "planes": _planes(same, zero), "matches": [], "error": None},
        "1": {"kind": "reused", "num_blocks": 2, "layers": 1, "planes": _planes(wrong, {"K": [0.5, 0.0], "V": [0.0, 0.0]}),
              "matches": [], "error": None},
    }}}}  # fmt: skip
    raw["arms"]["native"] = {"s": {str(i): v for i, v in enumerate(raw["arms"]["native"]["fixture"].values())}}
    annotate_kv(entry, result, raw, None, 16)
    assert entry["requests"][1]["kv"]["verdict"] == "CORRUPT"
    assert entry["kv"]["verdict"] == "CORRUPT"


def _run(trial: int, verdict: str, probes: dict[str, str], shared: bool = True) -> dict:
    return {"trial": trial, "verdict": verdict, "error": None, "wall_s": 1.0, "shared": shared,
            "probes": [{"name": n, "verdict": v, "first_diffs": [None, 3 if v == FAIL else None],
                        "cached_tokens": [0, 256], "kv": None} for n, v in probes.items()]}  # fmt: skip


def test_5_an_undecided_shared_trial_never_makes_a_clean_run_alone_contention_dependent():
    found = _run(1, FAIL, {"a": FAIL, "b": PASS})
    alone = _run(None, PASS, {"a": PASS, "b": PASS}, shared=False)
    # trial 2 ran `a` cleanly and was INCONCLUSIVE elsewhere: a clean shared trial of the failing probe
    clean_on_a = _run(2, INCONCLUSIVE, {"a": PASS, "b": INCONCLUSIVE})
    cls, reason = trials.classify_confirmation([found, clean_on_a], alone)
    assert cls == trials.NOT_REPRODUCED, reason
    # trial 2 decided nothing on `a`: no evidence that the finding needed the shared device
    undecided = _run(2, INCONCLUSIVE, {"a": INCONCLUSIVE, "b": PASS})
    cls, reason = trials.classify_confirmation([found, undecided], alone)
    assert cls == trials.UNCONFIRMED and "decided nothing on a" in reason
    crashed = {**_run(2, "ERROR", {}), "error": {"kind": "timeout", "detail": "x"}}
    assert trials.classify_confirmation([found, crashed], alone)[0] == trials.UNCONFIRMED
    # every shared run found it and alone is clean: that, and only that, is contention-dependent
    assert trials.classify_confirmation([found, _run(2, FAIL, {"a": FAIL})], alone)[0] == trials.CONTENTION_DEPENDENT


def test_6_a_probe_the_job_asked_for_that_the_result_lacks_is_inconclusive():
    baseline = _result("baseline", {"a": 1, "b": 1})
    lacking = _result("Conn", {"a": 4})  # the job asked for a and b, 3 reuses each
    entries, verdict = judge_arm(lacking, baseline, "connector", 16, None, {"a": 4, "b": 4})
    assert verdict.verdict == INCONCLUSIVE
    by = {e["name"]: e for e in entries}
    assert by["b"]["verdict"] == INCONCLUSIVE and by["b"]["reasons"] == [
        "the arm's result has no result for this probe"
    ]
    short = _result("Conn", {"a": 2, "b": 4})  # one reuse came back of the three asked for
    entries, verdict = judge_arm(short, baseline, "connector", 16, None, {"a": 4, "b": 4})
    by = {e["name"]: e for e in entries}
    assert verdict.verdict == INCONCLUSIVE and by["a"]["verdict"] == INCONCLUSIVE
    assert "has 2 of the 4 requests its job asked for" in by["a"]["reasons"][-1]
    # without the acceptance suite, that arm exits 1 (it exited 0 on the probe that came back)
    arm = {"name": "Conn", "mode": "connector", "verdict": verdict.verdict, "probes": entries, "error": None}
    base = {"name": "baseline", "mode": "baseline", "verdict": PASS, "probes": [], "error": None}
    report = {"complete": True, "errors": [], "arms": [base, arm], "acceptance": check_acceptance([], {}, None)}
    assert exit_code(report) == EXIT_MISMATCH
    # a probe the fixture says the arm skips is not missing
    entries, verdict = judge_arm(lacking, baseline, "connector", 16, {"b": "cannot"}, {"a": 4})
    assert verdict.verdict == PASS


def test_7_a_trial_that_ended_in_error_never_makes_a_finding_intermittent():
    fail = _run(1, FAIL, {"a": FAIL})
    crashed = {**_run(2, "ERROR", {}), "error": {"kind": "timeout", "detail": "x"}}
    rates = trials.trial_rates([fail, crashed])
    (rate,) = rates["rates"]
    assert (rate["failed"], rate["of"], rate["errors"], rate["class"]) == (1, 2, 1, trials.EVERY_TRIAL)
    assert rates["class"] == trials.CONSISTENT
    assert TrialRate(rate).mark.text == "1/1 finished trials, 1 ERROR" and not TrialRate(rate).mark.qualifies
    # and it is a run error: exit 3
    own = _entry("Conn", [_probe("a", FAIL, diffs=(None, 3)), _probe("b", PASS)])
    crashed_entry = {**_entry("Conn", [], "ERROR"), "error": {"kind": "timeout", "detail": "x"}}
    report = _plain_report(own, [crashed_entry], {"Conn": {"a": FAIL, "b": PASS}})
    assert exit_code(report) == EXIT_RUNTIME


def test_the_headline_says_the_exit_codes_reason_not_a_partial_matched():
    own = _entry("Conn", [_probe("a", INCONCLUSIVE, cached=(0, 0)), _probe("b", PASS)])
    later = _entry("Conn", [_probe("a", FAIL, diffs=(None, 3)), _probe("b", PASS)])
    report = _plain_report(own, [later], {"Conn": {"a": INCONCLUSIVE, "b": PASS}})
    report.update(kind="kvkit-report", schema_version=2, provenance={}, config={"kv_audit": False}, warnings=[])
    line = next(x for x in format_summary(report).splitlines() if x.startswith("# "))
    assert "acceptance.matched = true" in line
    assert "exit 1: a later run found what the arm's own run did not show: Conn trial 2: a FAIL" in line


def test_a_confirmation_that_read_a_persisting_store_is_qualified_and_marked():
    from repro.readmodel.conditions import ArmConditions

    arm = {"confirmation": {"status": "ran", "class": trials.DETERMINISTIC, "independent": False, "run": None,
                            "reason": "x; the store persisted: not independent (remote_url)"}}  # fmt: skip
    cond = ArmConditions(arm)
    assert cond.qualified and [m.text for m in cond.marks("a")] == [trials.DETERMINISTIC, "not independent"]
    arm["confirmation"]["independent"] = True
    assert not ArmConditions(arm).qualified


def test_a_trial_that_ended_in_error_is_set_apart_in_the_arms_finding_text():
    from repro.readmodel.conditions import ArmConditions

    fail = _run(1, FAIL, {"a": FAIL})
    crashed = {**_run(2, "ERROR", {}), "error": {"kind": "timeout", "detail": "x"}}
    cond = ArmConditions({"trials": trials.trial_rates([fail, crashed])})
    assert not cond.qualified and cond.finding_class_text == "findings in 1/1 finished trials, 1 ERROR"


def test_d14_a_load_rounds_missing_or_negative_hit_counter_is_no_reuse_and_is_counted_apart():
    """Issue 55, D14: vLLM's -1 ('not checked yet') and an absent counter are no hit (repro.judge.verdict.hit_count):
    the per-round 'k of N reused' counts neither, and counts them apart as a counter missing, said in the text."""
    from types import SimpleNamespace

    from repro.readmodel.scenario_load import arm_rates_text, controls_text
    from repro.run import load_scenario

    req = {"step": 0, "first_diff": None, "class": None, "verdict": PASS}
    entry = {"requests": [{**req, "cached_tokens": c} for c in (-1, None, 0, 256)]}
    (round_,) = load_scenario.rates(entry)
    assert (round_["requests"], round_["reused"], round_["counter_missing"]) == (4, 1, 2)
    assert "1 of 4 reused, 2 of 4 with no hit counter" in arm_rates_text({"rounds": [round_]})
    reqs = [SimpleNamespace(step=0, probe="p", request=SimpleNamespace(token_ids=TOKENS, cached_tokens=c))
            for c in (-1, None, 0, 256)]  # fmt: skip
    outcome = SimpleNamespace(failure=None, log_path=Path("/logs/c.log"), wall_s=1.0,
                              result=SimpleNamespace(scenario=SimpleNamespace(requests=reqs), effective_config={}))  # fmt: skip
    _, control = load_scenario.reuse_control(outcome, {"p": list(TOKENS)}, "logs")
    (round_,) = control["rounds"]
    assert (round_["reused"], round_["counter_missing"]) == (1, 2)
    assert "1 reused, 2 with no hit counter" in controls_text({"reuse_control": control})
