"""The headline and the summary read every trial (issue 55, D4): an arm whose own run (trial 1) PASSed and whose
trial 2 FAILed (exit 1) or ended in ERROR (exit 3) is never "matched caching off token for token", and a scenario
run whose trial 2 FAILed is never counted among the scenario runs that PASS. No engine: judged entries and
reports are built as the parent builds them (tests/test_green_holes.py)."""

from __future__ import annotations

import copy

from test_green_holes import _entry, _plain_report, _probe
from test_scenario_views import scenario_report

from repro.errors import EXIT_MISMATCH, EXIT_RUNTIME
from repro.judge import trials
from repro.judge.verdict import ERROR, FAIL, PASS
from repro.publish.headline import headline
from repro.publish.summary import format_summary
from repro.record.exit_rule import exit_reason


def _report(later: dict) -> dict:
    own = _entry("Conn", [_probe("a", PASS), _probe("b", PASS)])
    report = _plain_report(own, [later], {"Conn": {"a": PASS, "b": PASS}})
    report.update(kind="kvkit-report", schema_version=2, provenance={}, config={"kv_audit": False}, warnings=[])
    return report


def _arm_line(report: dict) -> str:
    return next(line for line in format_summary(report).splitlines() if line.startswith("Conn (None): "))


def test_an_arm_whose_trial_2_failed_is_not_matched_in_the_headline_nor_pass_in_the_summary():
    report = _report(_entry("Conn", [_probe("a", FAIL, diffs=(None, 3)), _probe("b", PASS)]))
    code, why = exit_reason(report)
    assert code == EXIT_MISMATCH, why
    text = headline(report)
    assert "matched" not in text and PASS not in text, text
    assert "Conn" in text and "answered differently" in text and "trial 2" in text, text
    line = _arm_line(report)
    assert not line.removeprefix("Conn (None): ").startswith(PASS), line
    assert "trial 2" in line and FAIL in line, line


def test_an_arm_whose_trial_2_ended_in_error_is_not_matched_in_the_headline_nor_pass_in_the_summary():
    crashed = {**_entry("Conn", [], ERROR), "error": {"kind": "timeout", "detail": "x"}}
    report = _report(crashed)
    assert exit_reason(report)[0] == EXIT_RUNTIME
    text = headline(report)
    assert "matched" not in text and PASS not in text, text
    assert f"{ERROR} in trial 2 (timeout)" in text, text
    line = _arm_line(report)
    assert not line.removeprefix("Conn (None): ").startswith(PASS) and "trial 2" in line and ERROR in line, line


def test_a_clean_trial_2_keeps_the_matched_headline():
    report = _report(_entry("Conn", [_probe("a", PASS), _probe("b", PASS)]))
    assert exit_reason(report)[0] == 0
    assert "matched caching off token for token on 2 of 2 probes" in headline(report)
    assert _arm_line(report) == "Conn (None): PASS"


def test_a_scenario_run_whose_trial_2_failed_is_not_counted_among_the_passes():
    report = scenario_report()
    sc_arm = report["scenarios"][0]["arms"][1]  # a-b-a, native: the one scenario run that is a plain PASS
    assert (report["scenarios"][0]["name"], sc_arm["arm"], sc_arm["verdict"]) == ("a-b-a", "native", PASS)
    assert "1 scenario run PASS otherwise" in headline(report)
    later = copy.deepcopy(sc_arm)
    later["verdict"] = FAIL
    for r in later["requests"]:
        r["verdict"], r["first_diff"] = FAIL, 2
    sc_arm["trials"] = trials.scenario_trial_rates(
        [trials.scenario_run_summary(sc_arm, 1, False), trials.scenario_run_summary(later, 2, False)]
    )
    report["errors"], report["scenarios"] = [], report["scenarios"][:2]  # no ERROR elsewhere: exit 1, not 3
    assert exit_reason(report)[0] == EXIT_MISMATCH
    text = headline(report)
    assert "scenario run PASS" not in text, text
    clause = next(p for p in text.split("; ") if p.startswith("scenario a-b-a: native prefix caching"))
    assert f"{FAIL} in trial 2" in clause and PASS not in clause, clause
