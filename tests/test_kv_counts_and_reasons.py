"""A KV finding counts wherever a token FAIL does (a confirmation, a trial's rate), and every INCONCLUSIVE says why in
the terminal summary. No engine: judged entries and reports are built as the parent builds them
(tests/test_green_holes.py, tests/test_trial_headline.py).

- A token-keyed connector across LoRA adapters: the token verdicts of the adapters' probes are INCONCLUSIVE (the
  cold request already hit) while the KV audit finds another adapter's KV (FOREIGN). A re-run alone that finds the
  same FOREIGN KV on the same probes confirms the finding; it is not "unconfirmed: the re-run alone decided nothing".
- A trial's rate counts the trials that FAILed a probe or had a KV finding on it, the KV counts beside the FAILs.
- An INCONCLUSIVE probe, arm, baseline, scenario request or P→D request prints its reason(s), and an acceptance that
  did not match names the arms and probes it did not check.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from test_green_holes import _entry, _probe
from test_scenario_views import scenario_report

from repro.contract.job import ArmSpec, ConnectorSpec
from repro.disagg.report import summary_lines
from repro.judge import trials
from repro.judge.verdict import CORRUPT, EXACT, FAIL, FOREIGN, INCONCLUSIVE, NUMERIC, PASS
from repro.plan.arms import PlannedArm
from repro.publish.summary import format_summary
from repro.readmodel import as_report
from repro.readmodel.conditions import ArmConditions
from repro.record.acceptance import check_acceptance
from repro.run.arm_runs import Run
from repro.run.confirm import confirmation_of

# The probes a token-keyed cache serves another adapter's KV for (reports/adapters/*-tiny-v028: LMCacheMPConnector).
ADAPTER_PROBES = ("fixture-B", "short-B", "fixture-A-id3", "short-A-id3", "fixture-A-reloaded", "short-A-reloaded")
NOT_A_MISS = "cold request reported 1280 cached tokens: not a verified miss"


def _lora_entry(name: str, kv: dict[str, str] | None = None) -> dict:
    """A token-keyed connector's run across LoRA adapters: fixture-A PASS, the other adapters' probes INCONCLUSIVE
    (their cold request hit another adapter's blocks) with the KV verdict given (FOREIGN unless said)."""
    kv = kv or {}
    probes = [_probe("fixture-A", PASS, NUMERIC)]
    for p in ADAPTER_PROBES:
        probes.append({**_probe(p, INCONCLUSIVE, kv.get(p, FOREIGN), cached=(1280, 1280)), "reasons": [NOT_A_MISS]})
    return _entry(name, probes)


def _alone(entry: dict) -> Run:
    arm = PlannedArm(ArmSpec("Mp~alone", "connector", ConnectorSpec("LMCacheMPConnector", None, {})))
    return Run(0, "alone", None, replace(arm, store={"fresh": True, "rewritten": []}), entry=entry)


def _sharing(name: str) -> dict:
    shared = "~" not in name
    return {"resource": "GPU 0", "others": [{"process": "arm native", "overlap_s": 9.0}] if shared else [],
            "shared": shared}  # fmt: skip


# --- a confirmation counts KV findings ------------------------------------------------------------------


def test_a_run_alone_that_finds_the_same_foreign_kv_on_the_same_probes_confirms_the_finding():
    own = _lora_entry("Mp")
    named = [("Mp", trials.run_summary(own, 1, True))]
    conf = confirmation_of(named, [_alone(_lora_entry("Mp~alone"))], _sharing, confirm=True)
    assert conf["status"] == "ran" and conf["run"]["verdict"] == INCONCLUSIVE
    assert conf["class"] == trials.DETERMINISTIC, conf["reason"]
    assert "decided nothing" not in conf["reason"] and "neither confirmed nor cleared" not in conf["reason"]
    assert f"KV {FOREIGN} on {', '.join(sorted(ADAPTER_PROBES))}" in conf["reason"], conf["reason"]
    assert "confirmed by the KV audit" in conf["reason"], conf["reason"]


def test_a_run_alone_with_other_kv_classes_on_the_same_probes_reproduces_it_varying():
    shared = [trials.run_summary(_lora_entry("Mp"), 1, True)]
    other = {p: CORRUPT for p in ADAPTER_PROBES if p.startswith("short")}
    cls, reason = trials.classify_confirmation(shared, trials.run_summary(_lora_entry("Mp~alone", other), None, False))
    assert cls == trials.REPRODUCED_VARYING and "the same probes wrong again" in reason, reason


def test_a_run_alone_that_decided_nothing_on_the_finding_stays_unconfirmed():
    shared = [trials.run_summary(_lora_entry("Mp"), 1, True)]
    # INCONCLUSIVE with no finding at all (its KV audit found nothing it could blame)
    nothing = trials.run_summary(_lora_entry("Mp~alone", dict.fromkeys(ADAPTER_PROBES, "UNAVAILABLE")), None, False)
    cls, reason = trials.classify_confirmation(shared, nothing)
    assert cls == trials.UNCONFIRMED and "neither confirmed nor cleared" in reason, reason
    # a clean run alone whose KV audit said nothing of the probes the shared run blamed KV on: absent is not good
    clean = _entry("Mp~alone", [_probe("fixture-A", PASS, NUMERIC)] + [_probe(p, PASS) for p in ADAPTER_PROBES])
    cls, reason = trials.classify_confirmation(shared, trials.run_summary(clean, None, False))
    assert cls == trials.UNCONFIRMED and "no KV verdict on" in reason, reason


def test_the_read_model_classes_a_report_an_older_kit_called_unconfirmed():
    """A report written before: its confirmation records 'unconfirmed: the run alone decided nothing' for a run alone
    whose KV audit found the same FOREIGN KV on the same six probes. The views class it as the judge now does."""
    arm = copy.deepcopy(_lora_entry("Mp"))
    arm["sharing"] = _sharing("Mp")
    alone = trials.run_summary(_lora_entry("Mp~alone"), None, False)
    arm["confirmation"] = {"status": "ran", "why": "its run found it while it shared GPU 0", "run": alone,
                           "class": trials.UNCONFIRMED, "independent": True,
                           "reason": "alone: INCONCLUSIVE (INCONCLUSIVE): the finding is neither confirmed nor cleared"}  # fmt: skip
    c = ArmConditions(arm)
    assert c.confirmation_class == trials.DETERMINISTIC, c.confirmation_reason
    assert c.confirmation_text.startswith(f"re-run alone: {INCONCLUSIVE} → {trials.DETERMINISTIC}"), c.confirmation_text
    assert "the re-run alone decided nothing" not in c.finding_class_text and not c.qualified
    base = _entry("baseline", [_probe(p, PASS) for p in ("fixture-A", *ADAPTER_PROBES)])
    report = {"kind": "kvkit-report", "schema_version": 3, "complete": True, "errors": [], "generations": 0,
              "arms": [{**base, "mode": "baseline"}, arm], "provenance": {}, "config": {"kv_audit": True},
              "warnings": [], "acceptance": check_acceptance([], {}, None)}  # fmt: skip
    line = next(x for x in format_summary(report).splitlines() if x.startswith("Mp (None): "))
    assert trials.UNCONFIRMED not in line and trials.DETERMINISTIC in line, line


# --- a trial's rate counts KV findings beside token FAILs ---------------------------------------------------------


def test_a_trial_rate_counts_a_kv_only_finding_beside_the_fails():
    """Trial 1 FAILed `a` with exact KV, trial 2 matched its tokens over FOREIGN KV, trial 3 was clean: 2 of 3 trials
    found something on `a`, not 1."""
    runs = [
        trials.run_summary(_entry("C", [_probe("a", FAIL, EXACT, diffs=(None, 3))]), 1, False),
        trials.run_summary(_entry("C", [_probe("a", PASS, FOREIGN)]), 2, False),
        trials.run_summary(_entry("C", [_probe("a", PASS, EXACT)]), 3, False),
    ]
    rates = trials.trial_rates(runs)
    (rate,) = rates["rates"]
    # the JSON keeps each count apart: the FAILs are not the KV findings
    assert (rate["failed"], rate["kv_foreign"], rate["kv_corrupt"], rate["of"]) == (1, 1, 0, 3)
    assert rate["class"] == trials.INTERMITTENT
    (read,) = ArmConditions({"trials": rates}).rates
    assert read.mark is not None and read.mark.text == "intermittent 2/3", read.mark
    assert read.cell == "FAIL 1/3, KV FOREIGN 1/3, FAIL or KV finding 2/3", read.cell
    # the token-keyed connector's trials: INCONCLUSIVE tokens over FOREIGN KV in every trial are found every trial
    runs = [trials.run_summary(_lora_entry("Mp"), k, False) for k in (1, 2, 3)]
    rates = trials.trial_rates(runs)
    rate = next(r for r in rates["rates"] if r["probe"] == "fixture-B")
    assert (rate["failed"], rate["kv_foreign"], rate["class"]) == (0, 3, trials.EVERY_TRIAL)
    read = ArmConditions({"trials": rates}).rate("fixture-B")
    assert read is not None and read.cell == "FAIL 0/3, KV FOREIGN 3/3" and read.mark.text == "3/3 trials"


# --- every INCONCLUSIVE says why in the terminal summary ----------------------------------------------------------


def _endpoint_report(probes: list[dict], acceptance: dict | None = None) -> dict:
    base = {**_entry("baseline", [_probe("fixture", PASS)]), "mode": "baseline"}
    arm = {**_entry("endpoint", probes, None if probes else INCONCLUSIVE), "mode": "native"}
    arm["reasons"] = [f"{p['name']}: {r}" for p in probes for r in p["reasons"]]
    return {"kind": "kvkit-report", "schema_version": 3, "complete": True, "errors": [], "generations": 5,
            "arms": [base, arm], "provenance": {}, "config": {"kv_audit": False}, "warnings": [],
            "acceptance": acceptance or check_acceptance([base, arm], {}, None)}  # fmt: skip


def test_an_inconclusive_probe_prints_its_reason_under_its_line():
    """A second `repro endpoint` against the same servers: the cold request hit what the first run stored."""
    why = "cold request reported 1408 cached tokens: not a verified miss"
    probe = {**_probe("fixture", INCONCLUSIVE, cached=(1408, 1408)), "reasons": [why]}
    lines = format_summary(_endpoint_report([probe])).splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("  fixture ") and INCONCLUSIVE in x)
    assert lines[at + 1] == f"    why: {why}", lines[at : at + 2]
    # an INCONCLUSIVE whose record gives no reason says so
    bare = {**_probe("fixture", INCONCLUSIVE, cached=(1408, 1408)), "reasons": []}
    lines = format_summary(_endpoint_report([bare])).splitlines()
    assert lines[at + 1] == "    why: no reason recorded", lines
    # an INCONCLUSIVE arm with no probe to say why for it says its own reasons under its line
    report = _endpoint_report([])
    report["arms"][1]["reasons"] = ["the arm's result has no probe"]
    lines = format_summary(report).splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("endpoint (a server the kit did not start): "))
    assert lines[at + 1] == "  why: the arm's result has no probe", lines


def test_a_long_reason_is_wrapped_never_cut():
    long = "the engine reported " + " ".join(f"block{i}" for i in range(120)) + " as cached: not a verified miss"
    probe = {**_probe("fixture", INCONCLUSIVE), "reasons": [long]}
    lines = format_summary(_endpoint_report([probe])).splitlines()
    at = next((i for i, x in enumerate(lines) if x.startswith("    why: ")), None)
    assert at is not None, lines
    said = [lines[at]] + [x for x in lines[at + 1 :] if x.startswith("      ")]
    assert all(len(x) <= 400 for x in said) and " ".join(x.strip() for x in said) == f"why: {long}", said


def test_a_scenario_requests_reason_is_printed_whole():
    report = scenario_report()
    arm = report["scenarios"][0]["arms"][1]
    long = "the hit counter said " + " ".join(f"t{i}" for i in range(150)) + ": no reuse is proven"
    arm["requests"][1] |= {"verdict": INCONCLUSIVE, "reasons": [long]}
    text = format_summary(report)
    assert all(len(x) <= 400 for x in text.splitlines())
    assert long in " ".join(x.strip() for x in text.splitlines()), "the reason is cut"


def test_acceptance_names_the_arms_and_probes_it_did_not_check():
    """A fixture whose expectations misspell a probe ('fixtur') and leave an arm out: the summary names both."""
    probe = _probe("fixture", PASS)
    report = _endpoint_report([probe])
    other = {**_entry("ExampleConnector", [_probe("fixture", PASS)]), "mode": "connector"}
    report["arms"].append(other)
    report["acceptance"] = check_acceptance(report["arms"], {"endpoint": {"fixtur": PASS}}, "acceptance")
    assert report["acceptance"]["unchecked_arms"] == ["ExampleConnector"]
    assert report["acceptance"]["unchecked_probes"][0]["probe"] == "fixture"
    text = format_summary(report)
    assert "acceptance: unchecked arms (the fixture states no verdict for them): ExampleConnector" in text, text
    assert "acceptance: unchecked probes (the fixture's expectations for their arm do not list them): endpoint " in text
    assert "endpoint fixtur tokens: expected PASS, observed None" in text, text
    assert as_report(report).acceptance_label() == "false"


def test_a_pd_request_without_a_reason_says_so():
    request = {"case": "c", "prompt": "p", "trial": 1, "control": None, "reference": [1, 2], "verdict": INCONCLUSIVE,
               "reasons": []}  # fmt: skip
    report = {"verdict": INCONCLUSIVE, "counts": {INCONCLUSIVE: 1}, "controls": {"run": 0, "held": 0},
              "requests": [request], "reasons": []}  # fmt: skip
    assert "  c p (trial 1): INCONCLUSIVE: no reason recorded" in summary_lines(report)
