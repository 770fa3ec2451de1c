"""--trials 2 on a scenario, end to end on the real vLLM CPU engine: the planted fault gated `in_flight`
(fixtures/scenarios-cpu-planted.json), which only the in-flight scenario catches, is caught in both trials of
that scenario, each judged and KV-audited like the first; native prefix caching finds nothing in both; the
schedule control runs once. The shortest run that says it: a fixture derived in tmp from the planted one with
that arm alone and the in-flight scenario alone, native without native-matched, so 10 engine children (plain:
baseline, the arm, native, and their trial 2s; the scenario: the control, the arm, native, and their trial 2s).
Measured on 2026-12-01 (2 shared cores, --jobs 2, the fast tests running
beside it): 140 s (the verifier 139 s: plain arms 45 s, their trials 22 s, the scenario's five runs 69 s).
Which requests fault may differ between trials (a together step's first request may start alone), so the
test asks that each trial found the fault and that some request failed in both, not which. Run under
`flock /tmp/kvkit-e2e.lock`."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, have_vllm, run_cli

from repro.plan.options import selftest_cpu_argv
from repro.record.report import validate_report

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

PLANTED = ROOT / "fixtures" / "scenarios-cpu-planted.json"
ARM = "PlantedFault-in-flight"
SCENARIO = "in-flight"


def _fixture(dest) -> str:
    """The planted fixture with its in-flight arm and in-flight scenario alone (expectations cut to match)."""
    doc = json.loads(PLANTED.read_text(encoding="utf-8"))
    doc["arms"] = [a for a in doc["arms"] if a["name"] == ARM]
    doc["scenarios"] = [s for s in doc["scenarios"] if s["name"] == SCENARIO]
    for key in ("expected", "expected_kv"):
        doc[key] = {arm: doc[key][arm] for arm in (ARM, "native")}
    for key in ("expected_scenarios", "expected_scenarios_kv"):
        doc[key] = {arm: {SCENARIO: doc[key][arm][SCENARIO]} for arm in (ARM, "native")}
    path = dest / "scenarios-cpu-planted-in-flight.json"
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def trials_run(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scenario-trials")
    report = tmp / "trials.json"
    more = ["--scenarios", SCENARIO, "--trials", "2", "--no-native-matched", "--jobs", "2", "--quiet"]
    proc = run_cli([*selftest_cpu_argv(tiny_model, str(report), _fixture(tmp)), *more], timeout=3000)
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(report.read_text()), report


def _arm(report: dict, name: str) -> dict:
    (sc,) = report["scenarios"]
    return next(a for a in sc["arms"] if a["arm"] == name)


def test_the_run_matches_the_fixture_and_keeps_each_arms_own_verdict(trials_run):
    proc, report, _ = trials_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    validate_report(report)
    assert report["conditions"]["trials"] == 2 and report["errors"] == []
    assert report["acceptance"]["scenarios"]["matched"] is True, report["acceptance"]["scenarios"]
    for name in (ARM, "native"):
        arm = _arm(report, name)
        assert [r["trial"] for r in arm["trials"]["runs"]] == [1, 2]
        own = arm["trials"]["runs"][0]
        assert (arm["verdict"], arm["kv"]["verdict"]) == (own["verdict"], own["kv"]), name  # trial 1's


def test_the_planted_fault_is_found_in_both_trials(trials_run):
    proc, report, _ = trials_run
    trials = _arm(report, ARM)["trials"]
    assert trials["n"] == 2
    # each trial: a FAIL with CORRUPT KV (the second one audited by the same compare job as the first)
    assert [(r["verdict"], r["kv"]) for r in trials["runs"]] == [("FAIL", "CORRUPT")] * 2
    caught = [r for r in trials["rates"] if r["failed"] or r["kv_corrupt"]]
    assert caught and all(r["step"] == 1 and r["of"] == 2 for r in trials["rates"])  # the together reuses
    again = [r for r in caught if r["class"] == "every trial"]
    assert again, caught  # the same request failed in both trials
    for r in again:
        assert r["failed"] == 2 and r["kv_corrupt"] == 2 and None not in r["first_diffs"], r
    assert f"{SCENARIO} · {ARM}: FAIL · KV CORRUPT" in proc.stdout
    assert "found in 2 of 2 trials (FAIL, FAIL)" in proc.stdout


def test_native_finds_nothing_in_both_trials(trials_run):
    proc, report, _ = trials_run
    trials = _arm(report, "native")["trials"]
    # the four prompts are prefilled together: KV EXACT or NUMERIC, whichever this CPU's kernels give
    assert [r["verdict"] for r in trials["runs"]] == ["PASS"] * 2
    assert all(r["kv"] in ("EXACT", "NUMERIC") for r in trials["runs"]), trials["runs"]
    assert (trials["rates"], trials["class"]) == ([], "clean")
    assert all(q["first_diff"] is None for r in trials["runs"] for q in r["requests"])
    assert "no finding in 2 trials (PASS, PASS)" in proc.stdout


def test_every_trial_has_its_own_log_and_the_control_runs_once(trials_run):
    _, report, path = trials_run
    logs = {p.name for p in (path.parent / f"{path.stem}.logs").iterdir()}
    for name in (ARM, "native"):
        assert {f"{name}~scenario.{SCENARIO}.log", f"{name}~scenario.{SCENARIO}~trial2.log"} <= logs
    assert f"baseline~scenario.{SCENARIO}.log" in logs
    assert not [n for n in logs if n.startswith("baseline~") and "trial" in n]
    assert report["scenarios"][0]["control"]["status"] == "ok"
