"""Expectation sets: a fixture may expect one verdict or a set of them (["EXACT", "NUMERIC"]) where a correct
stack may legitimately give either; the loader refuses a set that says nothing or mixes a finding with its
absence, acceptance is met by any member, and only a stated CORRUPT excuses a KV finding."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
from conftest import ROOT

from repro.errors import EXIT_MISMATCH, EXIT_OK, UsageError
from repro.judge.expectations import expectation_problem
from repro.judge.verdict import CORRUPT, EXACT, FOREIGN, KV_VERDICTS, MISPLACED, NUMERIC, UNAVAILABLE
from repro.plan.fixtures import load_fixture, parse_fixture
from repro.readmodel import as_report
from repro.record.acceptance import (
    check_acceptance,
    check_scenario_acceptance,
    excused_kv_findings,
    excused_scenario_kv,
    unexpected_kv_findings,
)
from repro.record.exit_rule import _scenario_reason, exit_code, exit_reason
from repro.record.report import ReportInvalid, validate_report

FIXTURES = ROOT / "fixtures"
DATA = ROOT / "tests" / "data"
EITHER = [EXACT, NUMERIC]
FIXTURE_SCHEMA = jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / "fixture.schema.json").read_text()))


def _doc(**tables) -> dict:
    """The CPU scenarios fixture (probes, arms and scenarios) with only the expectation tables given."""
    doc = json.loads((FIXTURES / "scenarios-cpu.json").read_text(encoding="utf-8"))
    for key in ("expected", "expected_kv", "expected_scenarios", "expected_scenarios_kv"):
        doc.pop(key, None)
    doc.update(tables)
    return doc


# ---- the loader -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, want",
    [
        ("expected_kv", EITHER),
        ("expected_kv", [CORRUPT]),
        ("expected_kv", [UNAVAILABLE, EXACT]),
        ("expected", ["PASS", "INCONCLUSIVE"]),
        ("expected", ["FAIL"]),
    ],
)
def test_the_loader_accepts_a_set_and_keeps_it_as_written(key, want):
    fixture = parse_fixture(_doc(**{key: {"native": {"fixture": want}}}), "f.json", "0" * 64)
    assert getattr(fixture, key) == {"native": {"fixture": want}}
    FIXTURE_SCHEMA.validate(_doc(**{key: {"native": {"fixture": want}}}))


def test_the_scenario_tables_accept_sets_too():
    doc = _doc(
        expected_scenarios={"native": {"in-flight": ["PASS"]}}, expected_scenarios_kv={"native": {"a-b-a": EITHER}}
    )
    fixture = parse_fixture(doc, "f.json", "0" * 64)
    assert fixture.expected_scenarios_kv == {"native": {"a-b-a": EITHER}}
    assert fixture.expected_scenarios == {"native": {"in-flight": ["PASS"]}}
    FIXTURE_SCHEMA.validate(doc)


@pytest.mark.parametrize(
    "key, want, message",
    [
        (
            "expected_kv",
            [EXACT, CORRUPT],
            r"expected_kv\.native\.fixture: .* mixes a finding \(CORRUPT\) with its absence",
        ),
        ("expected", ["PASS", "FAIL"], r"expected\.native\.fixture: .* mixes a finding \(FAIL\) with its absence"),
        ("expected_kv", [], r"expected_kv\.native\.fixture: \[\] is neither a verdict nor a non-empty list"),
        ("expected_kv", [EXACT, "exact"], r"expected_kv\.native\.fixture: 'exact' is not one of EXACT, NUMERIC"),
        ("expected_kv", [EXACT, "PASS"], r"expected_kv\.native\.fixture: 'PASS' is not one of EXACT"),
        ("expected", [EXACT], r"expected\.native\.fixture: 'EXACT' is not one of PASS"),
        ("expected_kv", [EXACT, EXACT], r"expected_kv\.native\.fixture: \['EXACT', 'EXACT'\] lists a verdict twice"),
        ("expected_kv", [[EXACT]], r"expected_kv\.native\.fixture: \['EXACT'\] is not one of"),
        ("expected_kv", {"EXACT": True}, r"expected_kv\.native\.fixture: unknown field 'EXACT' \(a bound expectation"),
        ("expected_kv", None, r"expected_kv\.native\.fixture: None is neither a verdict nor"),
        ("expected_kv", "exact", r"expected_kv\.native\.fixture: 'exact' is not one of"),
    ],
)
def test_a_bad_set_is_one_line_naming_its_key_path(key, want, message):
    doc = _doc(**{key: {"native": {"fixture": want}}})
    with pytest.raises(UsageError, match=message) as info:
        parse_fixture(doc, "f.json", "0" * 64)
    assert "\n" not in str(info.value) and str(info.value).startswith("fixture f.json: ")
    assert not FIXTURE_SCHEMA.is_valid(doc)  # the schema refuses what the loader refuses


def test_a_bad_set_in_a_scenario_table_names_the_scenario():
    doc = _doc(expected_scenarios_kv={"native": {"in-flight": [NUMERIC, CORRUPT]}})
    with pytest.raises(UsageError, match=r"expected_scenarios_kv\.native\.in-flight: .* mixes a finding"):
        parse_fixture(doc, "f.json", "0" * 64)


def test_the_cpu_fixtures_expect_exact_or_numeric_where_a_prefill_of_another_length_computed_the_kv():
    """native-matched reuses KV its priming prefill (the reused length alone, not the whole prompt) computed:
    bit-identical to the baseline's or not depending on the CPU's kernels, never CORRUPT."""
    for name in ("selftest-cpu", "scenarios-cpu", "scenarios-cpu-planted", "smollm2-cpu"):
        fixture = load_fixture(FIXTURES / f"{name}.json")
        matched = fixture.expected_kv["native-matched"]
        assert matched and all(want == EITHER for want in matched.values()), (name, matched)
        assert all(want == "PASS" for want in fixture.expected["native-matched"].values()), name


# ---- acceptance -------------------------------------------------------------------------------------------


def _arm(name: str, mode: str, kv: dict[str, str]) -> dict:
    probes = [{"name": p, "verdict": "PASS", "kv": {"verdict": v, "reasons": [], "blame": None}} for p, v in kv.items()]
    return {"name": name, "mode": mode, "verdict": "PASS", "probes": probes, "error": None}


ARMS = [
    {
        "name": "baseline",
        "mode": "baseline",
        "verdict": "PASS",
        "probes": [{"name": "a", "verdict": "PASS", "kv": None}],
    },
    _arm("native-matched", "native", {"a": NUMERIC}),
]
TOKENS = {"native-matched": {"a": "PASS"}}


def _report(arms: list[dict], expected_kv: dict) -> dict:
    return {
        "complete": True,
        "errors": [],
        "arms": arms,
        "acceptance": check_acceptance(arms, TOKENS, "acceptance", expected_kv),
    }


def test_a_numeric_meets_exact_or_numeric_but_not_exact():
    either = check_acceptance(ARMS, TOKENS, "acceptance", {"native-matched": {"a": EITHER}})
    assert either["matched"] is True
    assert either["checked"][-1] == {
        "check": "kv",
        "arm": "native-matched",
        "probe": "a",
        "expected": EITHER,  # as the fixture wrote it
        "observed": NUMERIC,
        "ok": True,
    }
    exact = check_acceptance(ARMS, TOKENS, "acceptance", {"native-matched": {"a": EXACT}})
    assert exact["matched"] is False and exact["checked"][-1]["ok"] is False
    assert exit_code(_report(ARMS, {"native-matched": {"a": EITHER}})) == EXIT_OK
    assert exit_code(_report(ARMS, {"native-matched": {"a": EXACT}})) == EXIT_MISMATCH


def test_a_token_set_is_met_by_any_member():
    acc = check_acceptance(ARMS, {"native-matched": {"a": ["INCONCLUSIVE", "PASS"]}}, "acceptance")
    assert acc["matched"] is True and acc["checked"][0]["expected"] == ["INCONCLUSIVE", "PASS"]
    missing = check_acceptance(ARMS, {"native-matched": {"z": ["INCONCLUSIVE", "PASS"]}}, "acceptance")
    assert missing["checked"][0]["observed"] is None and missing["checked"][0]["ok"] is False


def test_a_corrupt_is_excused_only_where_the_fixture_states_it():
    arms = [ARMS[0], _arm("Planted", "connector", {"a": CORRUPT})]
    tokens = {"Planted": {"a": "PASS"}}
    stated = {"complete": True, "errors": [], "arms": arms,
              "acceptance": check_acceptance(arms, tokens, "acceptance", {"Planted": {"a": [CORRUPT]}})}  # fmt: skip
    assert excused_kv_findings(stated["acceptance"]) == {("Planted", "a")}
    assert unexpected_kv_findings(stated) == [] and exit_code(stated) == EXIT_OK
    either = {"complete": True, "errors": [], "arms": arms,
              "acceptance": check_acceptance(arms, tokens, "acceptance", {"Planted": {"a": EITHER}})}  # fmt: skip
    assert either["acceptance"]["matched"] is False and excused_kv_findings(either["acceptance"]) == set()
    assert [(a["name"], p["name"]) for a, p in unexpected_kv_findings(either)] == [("Planted", "a")]
    assert exit_code(either) == EXIT_MISMATCH


# ---- the report's schema and views --------------------------------------------------------------------------


def _v2() -> dict:
    return json.loads((DATA / "report-v2-example.json").read_text(encoding="utf-8"))


def test_a_report_whose_checked_item_is_a_set_matches_the_schema():
    report = _v2()
    item = next(c for c in report["acceptance"]["checked"] if c.get("check") == "kv" and c["observed"] == NUMERIC)
    item["expected"] = EITHER
    validate_report(report)
    for bad in ([], [EXACT, EXACT], 3, None):
        item["expected"] = bad
        with pytest.raises(ReportInvalid, match="acceptance/checked"):
            validate_report(report)


def _scenario_report() -> dict:
    return json.loads((DATA / "report-scenarios-example.json").read_text(encoding="utf-8"))


def _with_kv(report: dict, arm: str, verdict: str) -> dict:
    out = copy.deepcopy(report)
    for entry in out["scenarios"][0]["arms"]:
        if entry["arm"] == arm:
            entry["kv"] = {**(entry.get("kv") or {"reasons": [], "blame": None}), "verdict": verdict}
    return out


def test_scenario_acceptance_meets_a_set_and_the_report_keeps_it():
    report = _with_kv(_scenario_report(), "native", NUMERIC)
    tokens = {"native": {"a-b-a": "PASS"}, "ExampleConnector": {"a-b-a": "PASS"}}
    acc = check_scenario_acceptance(report["scenarios"], tokens, "acceptance", {"native": {"a-b-a": EITHER}})
    assert acc["matched"] is True
    kv = next(c for c in acc["checked"] if c["check"] == "kv")
    assert (kv["expected"], kv["observed"], kv["ok"]) == (EITHER, NUMERIC, True)
    exact = check_scenario_acceptance(report["scenarios"], tokens, "acceptance", {"native": {"a-b-a": EXACT}})
    assert exact["matched"] is False
    report["acceptance"]["scenarios"] = acc
    validate_report(report)
    report["acceptance"]["scenarios"]["checked"][0]["expected"] = []
    with pytest.raises(ReportInvalid, match="acceptance/scenarios/checked"):
        validate_report(report)


def test_a_stated_scenario_corrupt_is_excused_and_an_unstated_one_is_not():
    report = _with_kv(_scenario_report(), "native", CORRUPT)
    tokens = {"native": {"a-b-a": "PASS"}, "ExampleConnector": {"a-b-a": "PASS"}}
    stated = check_scenario_acceptance(report["scenarios"], tokens, "acceptance", {"native": {"a-b-a": [CORRUPT]}})
    assert stated["matched"] is True and excused_scenario_kv(stated) == {("a-b-a", "native")}
    single = check_scenario_acceptance(report["scenarios"], tokens, "acceptance", {"native": {"a-b-a": CORRUPT}})
    assert excused_scenario_kv(single) == {("a-b-a", "native")}
    either = check_scenario_acceptance(report["scenarios"], tokens, "acceptance", {"native": {"a-b-a": EITHER}})
    assert either["matched"] is False and excused_scenario_kv(either) == set()


def test_the_finer_kv_findings_are_findings_a_set_may_not_mix_with_their_absence():
    """MISPLACED and FOREIGN are findings as CORRUPT is: a set may hold several findings, never one beside EXACT."""
    assert expectation_problem([CORRUPT, MISPLACED], KV_VERDICTS) is None
    assert expectation_problem(FOREIGN, KV_VERDICTS) is None
    assert "mixes a finding (MISPLACED) with its absence" in expectation_problem([EXACT, MISPLACED], KV_VERDICTS)
    assert "mixes a finding (FOREIGN)" in expectation_problem([FOREIGN, NUMERIC], KV_VERDICTS)


def test_a_stated_scenario_misplaced_is_excused_and_a_stated_corrupt_does_not_excuse_it():
    report = _with_kv(_scenario_report(), "native", MISPLACED)
    tokens = {"native": {"a-b-a": "PASS"}, "ExampleConnector": {"a-b-a": "PASS"}}
    stated = check_scenario_acceptance(report["scenarios"], tokens, "acceptance", {"native": {"a-b-a": MISPLACED}})
    assert stated["matched"] is True and excused_scenario_kv(stated) == {("a-b-a", "native")}
    corrupt = check_scenario_acceptance(report["scenarios"], tokens, "acceptance", {"native": {"a-b-a": CORRUPT}})
    assert corrupt["matched"] is False and excused_scenario_kv(corrupt) == set()
    report["acceptance"]["scenarios"] = {"matched": None, "checked": [], "unchecked": []}
    assert exit_reason(report)[0] != EXIT_OK
    assert _scenario_reason(report) == (
        EXIT_MISMATCH,
        "scenario KV MISPLACED that the fixture does not state: a-b-a native",
    )
    report["acceptance"]["scenarios"] = stated
    assert _scenario_reason(report) is None


def test_a_failed_set_reads_exact_or_numeric():
    report = _with_kv(_scenario_report(), "native", CORRUPT)
    tokens = {"native": {"a-b-a": "PASS"}, "ExampleConnector": {"a-b-a": "PASS"}}
    acc = check_scenario_acceptance(report["scenarios"], tokens, "acceptance", {"native": {"a-b-a": EITHER}})
    report["acceptance"]["scenarios"] = acc
    text = as_report(report).scenario_acceptance_text
    assert "native a-b-a kv expected EXACT or NUMERIC, got CORRUPT" in text, text
