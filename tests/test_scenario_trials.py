"""--trials N for scenario runs, without an engine: each run of a (scenario, arm) reduced to its requests
(repro.judge.trials.scenario_run_summary), the rates and classes of its findings across the trials
(scenario_trial_rates), the exit code of a finding only a later trial made, the schema, and the views
(summary, issue Markdown, site facts) saying "in k of N trials". Entries are judged by repro.run.scenarios
(judge_run) from results shaped as the child writes them, or taken from the hand-made scenario report;
with one trial every view is pinned byte for byte by tests/test_scenario_views.py."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from test_scenario_lmcache_checks import _baseline, _control, _judge, _scenario
from test_scenario_views import scenario_report

from repro.contract.failure import Failure
from repro.contract.job import ArmSpec
from repro.errors import EXIT_MISMATCH
from repro.judge import trials
from repro.judge.verdict import FOREIGN, MISPLACED
from repro.plan.arms import PlannedArm
from repro.publish.issue_md import format_issue_md
from repro.publish.site_index import build_index_row
from repro.publish.site_scenarios import _scenario_arm
from repro.publish.summary import format_summary
from repro.readmodel import as_report
from repro.readmodel.scenario_trials import RequestRate
from repro.record.exit_rule import later_findings, scenario_exit, scenario_trial_findings
from repro.record.report import ReportInvalid, validate_report
from repro.run.runner import ArmOutcome
from repro.run.scenarios import judge_run, trial_run

CHANGED = (5, 6, 9, 9)  # the reuse's tokens: differs from the baseline @2


def _crashed() -> dict:
    """A trial whose child crashed: ERROR, no requests."""
    failure = Failure("crash", "the engine child exited 1 before writing its result")
    outcome = ArmOutcome("native", None, failure, Path("/logs/native.log"), "", 2.0)
    return judge_run(_scenario(), PlannedArm(ArmSpec("native", "native")), outcome, _baseline(), _control(), "logs")


def _runs(*entries: dict) -> list[dict]:
    return [trials.scenario_run_summary(e, k, False) for k, e in enumerate(entries, start=1)]


def test_a_scenario_run_is_reduced_to_its_requests():
    summary = trials.scenario_run_summary(_judge(None, second=CHANGED), 1, True)
    assert summary == {
        "trial": 1,
        "verdict": "FAIL",
        "kv": None,
        "error": None,
        "wall_s": 1.0,
        "shared": True,
        "reasons": ["step 1 fixture: 32 cached tokens, differs from baseline @2"],
        "preemptions": 0,
        "requests": [
            {"step": 0, "probe": "fixture", "verdict": "PASS", "first_diff": None, "cached_tokens": 0, "kv": None,
             "kv_blocks": None, "reasons": [], "token_ids": [5, 6, 7, 8]},
            {"step": 1, "probe": "fixture", "verdict": "FAIL", "first_diff": 2, "cached_tokens": 32, "kv": None,
             "kv_blocks": None, "reasons": ["32 cached tokens, differs from baseline @2"], "token_ids": [5, 6, 9, 9]},
        ],
    }  # fmt: skip


def test_a_later_trial_keeps_its_preemption_count_blamed_blocks_and_tokens():
    """A later trial is all the report keeps of its run: its preemption count (a preemption scenario's PASS
    needs one), why it has its verdict, and per request its tokens and the blocks the KV audit blamed."""
    entry = copy.deepcopy(_judge(None, second=CHANGED))
    entry["preemptions"] = 3
    entry["requests"][1]["kv"] = {"verdict": "CORRUPT", "blame": {"text": "blocks 0–1 (tokens 0–31), K+V, layers 0–3"}}
    summary = trials.scenario_run_summary(entry, 2, False)
    assert summary["preemptions"] == 3 and summary["reasons"] == entry["reasons"]
    second = summary["requests"][1]
    assert (second["kv"], second["kv_blocks"]) == ("CORRUPT", "blocks 0–1 (tokens 0–31), K+V, layers 0–3")
    assert second["token_ids"] == list(CHANGED) and summary["requests"][0]["kv_blocks"] is None
    crashed = trials.scenario_run_summary(_crashed(), 3, False)
    assert crashed["preemptions"] is None and crashed["requests"] == [] and crashed["reasons"]


def test_a_finding_in_every_trial_is_consistent():
    rates = trials.scenario_trial_rates(_runs(_judge(None, second=CHANGED), _judge(None, second=CHANGED)))
    assert (rates["n"], rates["class"], len(rates["runs"])) == (2, trials.CONSISTENT, 2)
    assert rates["rates"] == [
        {"step": 1, "probe": "fixture", "nth": 0, "verdicts": ["FAIL", "FAIL"], "first_diffs": [2, 2],
         "kv": [None, None], "failed": 2, "kv_corrupt": 0, "kv_foreign": 0, "kv_misplaced": 0, "of": 2,
         "class": trials.EVERY_TRIAL},
    ]  # fmt: skip


def test_a_finding_not_in_every_trial_is_intermittent_and_a_crashed_trial_has_no_requests():
    runs = _runs(_judge(None), _judge(None, second=CHANGED), _crashed())
    assert runs[2]["verdict"] == "ERROR" and runs[2]["requests"] == []
    assert runs[2]["error"] == {"kind": "crash", "detail": "the engine child exited 1 before writing its result"}
    rates = trials.scenario_trial_rates(runs)
    assert rates["class"] == trials.INTERMITTENT
    (rate,) = rates["rates"]
    assert (rate["verdicts"], rate["first_diffs"]) == (["PASS", "FAIL", None], [None, 2, None])
    assert (rate["failed"], rate["of"], rate["class"]) == (1, 3, trials.INTERMITTENT)


def test_clean_trials_list_no_request():
    rates = trials.scenario_trial_rates(_runs(_judge(None), _judge(None)))
    assert (rates["rates"], rates["class"]) == ([], trials.CLEAN)


def test_corrupt_kv_under_matching_tokens_is_a_finding_of_its_own():
    corrupt = _judge(None)
    corrupt["requests"][1]["kv"] = {"verdict": "CORRUPT"}
    corrupt["kv"] = {"verdict": "CORRUPT"}
    rates = trials.scenario_trial_rates(_runs(corrupt, _judge(None)))
    (rate,) = rates["rates"]
    assert (rate["verdicts"], rate["kv"]) == (["PASS", "PASS"], ["CORRUPT", None])
    assert (rate["failed"], rate["kv_corrupt"], rate["class"]) == (0, 1, trials.INTERMITTENT)
    assert rates["runs"][0]["kv"] == "CORRUPT"


def test_misplaced_or_foreign_kv_under_matching_tokens_is_a_finding_counted_by_its_class():
    """MISPLACED and FOREIGN are KV findings as CORRUPT is: the request is listed, counted by class, named."""
    misplaced, foreign = _judge(None), _judge(None)
    misplaced["requests"][1]["kv"] = misplaced["kv"] = {"verdict": MISPLACED}
    foreign["requests"][1]["kv"] = foreign["kv"] = {"verdict": FOREIGN}
    rates = trials.scenario_trial_rates(_runs(misplaced, _judge(None), foreign))
    (rate,) = rates["rates"]
    assert rate["kv"] == [MISPLACED, None, FOREIGN]
    assert (rate["kv_corrupt"], rate["kv_foreign"], rate["kv_misplaced"], rate["class"]) == (
        0, 1, 1, trials.INTERMITTENT
    )  # fmt: skip
    read = RequestRate(rate)
    assert read.runs_text == "#1 PASS KV MISPLACED · #2 PASS · #3 PASS KV FOREIGN"
    assert read.cls == trials.INTERMITTENT and read.kv_count(MISPLACED) == 1
    assert read.kv_count(FOREIGN) == 1 and RequestRate({"kv": [MISPLACED, MISPLACED]}).kv_count(MISPLACED) == 2


def test_a_later_trial_whose_kv_is_misplaced_is_a_finding_for_the_exit_code():
    """PlantedFault's own run is CORRUPT (the fixture states it); a later trial's MISPLACED is another kind of
    finding, never hidden behind trial 1's CORRUPT."""
    report = _with_trials()
    planted = report["scenarios"][0]["arms"][0]
    later = planted["trials"]["runs"][1]
    later["kv"] = MISPLACED
    assert ("a-b-a", "PlantedFault") in scenario_trial_findings(report)
    assert ("PlantedFault", "trial 2", "scenario a-b-a", MISPLACED) in later_findings(report)


def test_a_probe_twice_in_one_step_is_two_requests():
    def run(second: str) -> dict:
        reqs = [{"step": 0, "probe": "a", "verdict": v, "first_diff": None if v == "PASS" else 1, "kv": None}
                for v in ("PASS", second)]  # fmt: skip
        return {"requests": reqs}

    (rate,) = trials.scenario_trial_rates([run("FAIL"), run("PASS")])["rates"]
    assert (rate["step"], rate["probe"], rate["nth"], rate["verdicts"]) == (0, "a", 1, ["FAIL", "PASS"])


def test_a_trial_run_is_named_apart():
    arm = PlannedArm(ArmSpec("native~scenario.in-flight", "native"))
    assert trial_run(arm, 2).name == "native~scenario.in-flight~trial2"
    assert arm.name == "native~scenario.in-flight"


# --- the report: the hand-made scenario report with trials on its a-b-a arms -----------------------------


def _with_trials() -> dict:
    """a-b-a: PlantedFault FAIL (KV CORRUPT) in both trials; native PASS in its own run, but its trial 2
    FAILed at step 1 chat-512 @3."""
    report = scenario_report()
    planted, native = report["scenarios"][0]["arms"]
    planted["trials"] = trials.scenario_trial_rates(_runs(planted, copy.deepcopy(planted)))
    second = copy.deepcopy(native)
    second.update(verdict="FAIL")
    second["requests"][1].update(verdict="FAIL", first_diff=3)
    native["trials"] = trials.scenario_trial_rates(_runs(native, second))
    return report


def test_the_schema_knows_a_scenario_arms_trials():
    report = _with_trials()
    validate_report(report)
    bad = copy.deepcopy(report)
    bad["scenarios"][0]["arms"][0]["trials"]["rates"][0]["class"] = "sometimes"
    with pytest.raises(ReportInvalid):
        validate_report(bad)
    bad = copy.deepcopy(report)
    del bad["scenarios"][0]["arms"][1]["trials"]["runs"][1]["requests"][0]["kv"]
    with pytest.raises(ReportInvalid):
        validate_report(bad)


def test_a_finding_only_a_later_trial_made_is_a_finding_for_the_exit_code():
    report = scenario_report()
    assert scenario_trial_findings(report) == []
    report = _with_trials()
    assert scenario_trial_findings(report) == [("a-b-a", "native")]  # PlantedFault found it in its own run
    alone = copy.deepcopy(report)  # only native's a-b-a, no acceptance: it would exit 0 on its own run
    alone["scenarios"] = [alone["scenarios"][0]]
    alone["scenarios"][0]["arms"] = [alone["scenarios"][0]["arms"][1]]
    alone["acceptance"]["scenarios"] = {"matched": None}
    assert scenario_exit(alone) == EXIT_MISMATCH
    del alone["scenarios"][0]["arms"][0]["trials"]
    assert scenario_exit(alone) is None


def test_the_summary_says_in_how_many_trials():
    text = format_summary(_with_trials())
    lines = text[text.index("\n\nScenarios\n") + 2 :].splitlines()
    assert lines[1] == (
        "  a-b-a · PlantedFault: FAIL · KV CORRUPT · preemptions 0 · hits 0 16 496 · found in 2 of 2 trials (FAIL, FAIL)"
    )
    assert lines[2].startswith(
        "      step 2 chat-511 (reuse, 496 cached, must reuse): FAIL @2 (decisive, gap 8.376 nats) in 2 of 2 trials, "
        "KV CORRUPT in 2 of 2 · KV CORRUPT: blocks 0–15, 20"
    )
    assert lines[3:5] == [
        (
            "  a-b-a · native: FAIL in trial 2 · its own run (trial 1): PASS · KV EXACT · preemptions 0 · hits 0 16 496 "
            "· intermittent: found in 1 of 2 trials (PASS, FAIL)"
        ),
        "      trials: step 1 chat-512: #1 PASS · #2 FAIL @3 (intermittent)",
    ]
    assert lines[5].startswith("  in-flight · control")  # the next scenario, which ran once, as before


def test_the_issue_says_in_how_many_trials():
    body = format_issue_md(_with_trials())
    finding = body[body.index("**a-b-a · PlantedFault (PlantedFaultConnector): FAIL**") :]
    finding = finding[: finding.index("\n\n**in-flight")]
    assert "\n- trials: found in 2 of 2 trials (FAIL, FAIL)\n" in finding
    assert (
        "- **step 2 chat-511** (reuse, 496 cached tokens, must reuse): FAIL in 2 of 2 trials, KV CORRUPT in 2 of 2, "
        "first diff @2;" in finding
    )
    assert (
        "- **a-b-a · native prefix caching**: PASS — trials: intermittent: found in 1 of 2 trials (PASS, FAIL); "
        "step 1 chat-512: #1 PASS · #2 FAIL @3 (intermittent)"
    ) in body


def test_the_site_facts_say_in_how_many_trials():
    report = as_report(_with_trials())
    planted, native = report.scenarios[0].arms
    assert _scenario_arm(planted).facts.endswith(
        " · trials: found in 2 of 2 trials (FAIL, FAIL) · step 2 chat-511: #1 FAIL @2 KV CORRUPT · #2 FAIL @2 KV "
        "CORRUPT (every trial)"
    )
    assert _scenario_arm(native).facts.endswith(
        " · trials: intermittent: found in 1 of 2 trials (PASS, FAIL) · step 1 chat-512: #1 PASS · #2 FAIL @3 "
        "(intermittent)"
    )
    # the index lists native's a-b-a, a PASS whose later trial found something, as no plain PASS
    once = build_index_row(scenario_report(), stem="r", href="r.html")
    entry = build_index_row(report, stem="r", href="r.html")
    assert ("a-b-a · native prefix caching", "PASS") not in once.scenarios
    assert ("a-b-a · native prefix caching", "PASS", "") in entry.scenarios
    assert entry.scenario_passes == once.scenario_passes - 1


def test_a_trial_that_ended_in_error_is_said_and_is_no_plain_pass():
    """A scenario arm whose own run PASSed but whose trial 2 timed out (the H200 preemption run: an engine that
    stopped making progress) found nothing in the trial that finished. The trials text says one trial ERRORed, and
    the site's index lists the run with its ERROR count instead of counting it among the plain PASSes."""
    report = scenario_report()
    native = report["scenarios"][0]["arms"][1]
    timed_out = {**copy.deepcopy(native), "verdict": "ERROR", "requests": [], "kv": None}
    timed_out["error"] = {"kind": "timeout", "detail": "the arm ran past its time limit"}
    native["trials"] = trials.scenario_trial_rates(_runs(native, timed_out))
    validate_report(report)
    arm = as_report(report).scenarios[0].arms[1]
    assert arm.verdict == "PASS" and arm.trials.found == 0 and arm.trials.errors == 1
    assert arm.trials.text == "no finding in the 1 of 2 trials that finished; 1 ERROR (PASS, ERROR)"
    once = build_index_row(scenario_report(), stem="r", href="r.html")
    entry = build_index_row(report, stem="r", href="r.html")
    assert ("a-b-a · native prefix caching", "PASS", "1 of 2 trials ERROR") in entry.scenarios
    assert entry.scenario_passes == once.scenario_passes - 1
    assert "1 ERROR (PASS, ERROR)" in format_summary(report)


def test_no_trial_finished_is_said_as_such():
    """Both trials timed out (the H200 preemption run with async scheduling: both LMCache engines stopped making
    progress in 2 of 2 trials): 'no finding in the 0 of 2 trials that finished' said nothing; the text now says
    no trial finished, and the arm stays ERROR."""
    report = scenario_report()
    native = report["scenarios"][0]["arms"][1]
    timed_out = {**copy.deepcopy(native), "verdict": "ERROR", "requests": [], "kv": None}
    timed_out["error"] = {"kind": "timeout", "detail": "the arm ran past its time limit"}
    native.update({k: v for k, v in timed_out.items() if k != "trials"})
    native["trials"] = trials.scenario_trial_rates(_runs(timed_out, copy.deepcopy(timed_out)))
    validate_report(report)
    arm = as_report(report).scenarios[0].arms[1]
    assert arm.verdict == "ERROR" and arm.trials.errors == 2 and arm.trials.found == 0
    assert arm.trials.text == "no trial finished: 2 of 2 ERROR (ERROR, ERROR)"
    assert "no trial finished: 2 of 2 ERROR (ERROR, ERROR)" in format_summary(report)
