"""Acceptance checking and exit codes: pure functions over judged arms (repro.record.report)."""

from __future__ import annotations

import copy

import pytest

from repro.errors import EXIT_MISMATCH, EXIT_OK, EXIT_RUNTIME
from repro.judge.verdict import CORRUPT, EXACT, FOREIGN, MISPLACED, NUMERIC, UNAVAILABLE
from repro.publish.summary import format_summary
from repro.record.acceptance import check_acceptance, excused_kv_findings, kv_findings
from repro.record.exit_rule import exit_code, exit_reason


def _arm(name: str, mode: str, verdicts: dict[str, str], arm_verdict: str | None = None) -> dict:
    probes = [{"name": p, "verdict": v} for p, v in verdicts.items()]
    worst = arm_verdict or ("FAIL" if "FAIL" in verdicts.values() else "PASS")
    return {"name": name, "mode": mode, "verdict": worst, "probes": probes, "error": None}


ARMS = [
    _arm("baseline", "baseline", {"a": "PASS", "b": "PASS"}),
    _arm("Conn", "connector", {"a": "FAIL", "b": "PASS"}),
    _arm("native", "native", {"a": "PASS", "b": "PASS"}),
]
EXPECTED = {"Conn": {"a": "FAIL", "b": "PASS"}, "native": {"a": "PASS", "b": "PASS"}}


def _report(arms: list[dict], expected: dict | None, suite: str | None = "acceptance", **top) -> dict:
    return {
        "complete": True,
        "errors": [],
        "arms": arms,
        "acceptance": check_acceptance(arms, expected or {}, suite),
        **top,
    }


def test_every_expected_verdict_observed_is_matched_and_exit_0():
    acc = check_acceptance(ARMS, EXPECTED, "acceptance")
    assert acc["matched"] is True and acc["unchecked_arms"] == [] and acc["unchecked_probes"] == []
    assert [(c["arm"], c["probe"], c["ok"]) for c in acc["checked"]] == [
        ("Conn", "a", True),
        ("Conn", "b", True),
        ("native", "a", True),
        ("native", "b", True),
    ]
    assert exit_code(_report(ARMS, EXPECTED)) == EXIT_OK  # a FAIL that was expected is a match


def test_an_expected_verdict_not_observed_is_a_mismatch_exit_1():
    expected = {"Conn": {"a": "PASS", "b": "PASS"}, "native": EXPECTED["native"]}
    acc = check_acceptance(ARMS, expected, "acceptance")
    assert acc["matched"] is False
    assert [c for c in acc["checked"] if not c["ok"]] == [
        {"check": "tokens", "arm": "Conn", "probe": "a", "expected": "PASS", "observed": "FAIL", "ok": False}
    ]
    assert exit_code(_report(ARMS, expected)) == EXIT_MISMATCH


def test_a_probe_an_expected_arm_ran_but_its_table_does_not_list_is_never_silent():
    """Bug b: 'c' FAILs on Conn and nothing expects it; acceptance must not match."""
    arms = [ARMS[0], _arm("Conn", "connector", {"a": "FAIL", "b": "PASS", "c": "FAIL"}), ARMS[2]]
    acc = check_acceptance(arms, EXPECTED, "acceptance")
    assert acc["matched"] is False
    assert acc["unchecked_probes"] == [{"arm": "Conn", "probe": "c", "observed": "FAIL", "check": "tokens"}]
    assert exit_code(_report(arms, EXPECTED)) == EXIT_MISMATCH


def test_a_skipped_probe_need_not_be_listed():
    arms = [ARMS[0], _arm("Conn", "connector", {"a": "FAIL", "b": "PASS", "c": "SKIPPED"}), ARMS[2]]
    assert check_acceptance(arms, EXPECTED, "acceptance")["matched"] is True


def test_an_arm_nobody_expects_is_unchecked_and_must_pass():
    extra = _arm("Other", "connector", {"a": "PASS"})
    acc = check_acceptance([*ARMS, extra], EXPECTED, "acceptance")
    assert acc["unchecked_arms"] == ["Other"] and acc["matched"] is False
    assert exit_code(_report([*ARMS, extra], EXPECTED)) == EXIT_MISMATCH


def test_an_expected_arm_that_errored_is_observed_as_error():
    errored = {"name": "Conn", "mode": "connector", "verdict": "ERROR", "probes": [], "error": {"kind": "crash"}}
    acc = check_acceptance([ARMS[0], errored, ARMS[2]], EXPECTED, "acceptance")
    assert {c["observed"] for c in acc["checked"] if c["arm"] == "Conn"} == {"ERROR"}


@pytest.mark.parametrize(
    "arms, suite, top, code",
    [
        (ARMS, None, {}, EXIT_MISMATCH),  # without a suite every arm must PASS
        ([ARMS[0], ARMS[2]], None, {}, EXIT_OK),
        (ARMS, "acceptance", {"errors": [{"arm": "Conn", "kind": "crash", "detail": ""}]}, EXIT_RUNTIME),
        (ARMS, "acceptance", {"complete": False}, EXIT_RUNTIME),
        ([ARMS[0], _arm("Conn", "connector", {}, "ERROR"), ARMS[2]], "acceptance", {}, EXIT_RUNTIME),
    ],
)
def test_exit_codes(arms, suite, top, code):
    report = _report(arms, EXPECTED, suite)
    report.update(top)
    assert exit_code(report) == code


# --- KV expectations (expected_kv) and KV findings ---


def _kv_arm(name: str, mode: str, verdicts: dict[str, str], kv: dict[str, str | None]) -> dict:
    arm = _arm(name, mode, verdicts)
    for p in arm["probes"]:
        verdict = kv.get(p["name"])
        blame = {"text": f"blocks 0–1 of {p['name']}"} if verdict in (CORRUPT, FOREIGN, MISPLACED) else None
        p["kv"] = None if verdict is None else {"verdict": verdict, "reasons": [], "blame": blame}
    return arm


KV_ARMS = [
    _kv_arm("baseline", "baseline", {"a": "PASS", "b": "PASS"}, {}),
    _kv_arm("Conn", "connector", {"a": "FAIL", "b": "PASS"}, {"a": CORRUPT, "b": EXACT}),
    _kv_arm("native", "native", {"a": "PASS", "b": "PASS"}, {"a": EXACT, "b": NUMERIC}),
]
EXPECTED_KV = {"Conn": {"a": CORRUPT, "b": EXACT}, "native": {"a": EXACT, "b": NUMERIC}}


def _kv_report(arms, expected_kv, suite="acceptance") -> dict:
    return {
        "complete": True,
        "errors": [],
        "arms": arms,
        "acceptance": check_acceptance(arms, EXPECTED, suite, expected_kv),
    }


def test_kv_expectations_are_checked_after_the_token_ones_and_say_which_check():
    acc = check_acceptance(KV_ARMS, EXPECTED, "acceptance", EXPECTED_KV)
    assert acc["matched"] is True and acc["unchecked_probes"] == []
    assert [(c["check"], c["arm"], c["probe"], c["observed"]) for c in acc["checked"]] == [
        ("tokens", "Conn", "a", "FAIL"),
        ("tokens", "Conn", "b", "PASS"),
        ("tokens", "native", "a", "PASS"),
        ("tokens", "native", "b", "PASS"),
        ("kv", "Conn", "a", CORRUPT),
        ("kv", "Conn", "b", EXACT),
        ("kv", "native", "a", EXACT),
        ("kv", "native", "b", NUMERIC),
    ]


def test_an_expected_corrupt_that_matched_is_exit_0():
    assert exit_code(_kv_report(KV_ARMS, EXPECTED_KV)) == EXIT_OK
    assert "(expected by the fixture)" in _summary(_kv_report(KV_ARMS, EXPECTED_KV))


def test_an_unexpected_corrupt_is_a_finding_exit_1_even_when_every_token_verdict_matched():
    no_kv = _kv_report(KV_ARMS, None)  # the fixture states no KV expectation
    assert no_kv["acceptance"]["matched"] is True
    assert exit_code(no_kv) == EXIT_MISMATCH
    assert no_kv["acceptance"]["checked"] and all(c["check"] == "tokens" for c in no_kv["acceptance"]["checked"])
    text = _summary(no_kv)
    assert "  Conn (None) / a: blocks 0–1 of a" in text.splitlines() and "expected by the fixture" not in text


def test_a_corrupt_expected_elsewhere_is_not_excused():
    """CORRUPT was expected on probe b, observed on a: a mismatch, and the finding on a stands."""
    arms = [
        KV_ARMS[0],
        _kv_arm("Conn", "connector", {"a": "FAIL", "b": "PASS"}, {"a": CORRUPT, "b": CORRUPT}),
        KV_ARMS[2],
    ]
    expected_kv = {"Conn": {"a": EXACT, "b": CORRUPT}, "native": EXPECTED_KV["native"]}
    report = _kv_report(arms, expected_kv)
    assert report["acceptance"]["matched"] is False
    assert [(c["probe"], c["expected"], c["observed"]) for c in report["acceptance"]["checked"] if not c["ok"]] == [
        ("a", EXACT, CORRUPT)
    ]
    assert exit_code(report) == EXIT_MISMATCH


def test_a_corrupt_without_an_acceptance_suite_is_exit_1():
    report = _kv_report(KV_ARMS, EXPECTED_KV, suite=None)
    report["arms"] = [KV_ARMS[0], dict(KV_ARMS[1], verdict="PASS"), KV_ARMS[2]]  # every token verdict a PASS
    assert exit_code(report) == EXIT_MISMATCH
    report["arms"][1] = _kv_arm("Conn", "connector", {"a": "PASS", "b": "PASS"}, {"a": EXACT, "b": UNAVAILABLE})
    assert exit_code(report) == EXIT_OK  # UNAVAILABLE is no finding (the summary says why)


def test_an_error_still_exits_3_before_any_kv_finding():
    report = _kv_report(KV_ARMS, None)
    report["errors"] = [{"arm": "native", "kind": "crash", "detail": ""}]
    assert exit_code(report) == EXIT_RUNTIME


def test_an_expected_kv_verdict_not_observed_or_absent_is_a_mismatch():
    expected_kv = {"Conn": {"a": CORRUPT, "b": NUMERIC}, "native": {"a": EXACT, "b": NUMERIC, "z": EXACT}}
    acc = check_acceptance(KV_ARMS, EXPECTED, "acceptance", expected_kv)
    assert acc["matched"] is False
    assert [(c["arm"], c["probe"], c["observed"]) for c in acc["checked"] if not c["ok"]] == [
        ("Conn", "b", EXACT),
        ("native", "z", None),  # the arm has no such probe: observed None
    ]


def test_a_kv_verdict_an_expected_kv_table_does_not_list_is_never_silent():
    expected_kv = {"Conn": {"a": CORRUPT}, "native": EXPECTED_KV["native"]}
    acc = check_acceptance(KV_ARMS, EXPECTED, "acceptance", expected_kv)
    assert acc["unchecked_probes"] == [{"arm": "Conn", "probe": "b", "observed": EXACT, "check": "kv"}]
    assert acc["matched"] is False


def test_a_probe_without_a_kv_verdict_need_not_be_listed_in_expected_kv():
    arms = [KV_ARMS[0], _kv_arm("Conn", "connector", {"a": "FAIL", "b": "SKIPPED"}, {"a": CORRUPT}), KV_ARMS[2]]
    expected = {"Conn": {"a": "FAIL"}, "native": EXPECTED["native"]}
    acc = check_acceptance(arms, expected, "acceptance", {"Conn": {"a": CORRUPT}, "native": EXPECTED_KV["native"]})
    assert acc["matched"] is True and acc["unchecked_probes"] == []


# --- the finer KV findings: MISPLACED (this prompt's KV in the wrong slot), FOREIGN (another prompt's KV) ---


def _finer_arms(a: str, b: str = EXACT) -> list[dict]:
    return [KV_ARMS[0], _kv_arm("Conn", "connector", {"a": "FAIL", "b": "PASS"}, {"a": a, "b": b}), KV_ARMS[2]]


@pytest.mark.parametrize("finding", [MISPLACED, FOREIGN])
def test_a_misplaced_or_foreign_kv_verdict_is_a_finding_exit_1_unless_the_fixture_states_it(finding):
    """As CORRUPT: exit 1 when the fixture states no KV expectation (every token verdict matched), named by its
    class; exit 0 when the fixture states that very class; never excused by a stated CORRUPT."""
    unstated = _kv_report(_finer_arms(finding), None)
    assert unstated["acceptance"]["matched"] is True and [p["name"] for _, p in kv_findings(unstated)] == ["a"]
    code, why = exit_reason(unstated)
    assert code == EXIT_MISMATCH and why == f"KV {finding} that the fixture does not state: Conn a"
    text = _summary(unstated)
    assert f"  Conn (None) / a: {finding}: blocks 0–1 of a" in text.splitlines()
    assert f"FAIL                 KV {finding}: blocks 0–1 of a" in text  # the probe line names it too
    stated = _kv_report(_finer_arms(finding), {**EXPECTED_KV, "Conn": {"a": finding, "b": EXACT}})
    assert exit_code(stated) == EXIT_OK and excused_kv_findings(stated["acceptance"]) == {("Conn", "a")}
    assert f"  Conn (None) / a: {finding}: blocks 0–1 of a (expected by the fixture)" in _summary(stated)
    as_corrupt = _kv_report(_finer_arms(finding), EXPECTED_KV)  # the fixture states CORRUPT: not this finding
    assert as_corrupt["acceptance"]["matched"] is False and exit_code(as_corrupt) == EXIT_MISMATCH
    either = _kv_report(_finer_arms(finding), {**EXPECTED_KV, "Conn": {"a": [CORRUPT, finding], "b": EXACT}})
    assert exit_code(either) == EXIT_OK  # a set of findings states each of them
    without_suite = _kv_report(_finer_arms(finding), EXPECTED_KV, suite=None)
    without_suite["arms"] = [KV_ARMS[0], dict(without_suite["arms"][1], verdict="PASS"), KV_ARMS[2]]
    assert exit_code(without_suite) == EXIT_MISMATCH


def test_several_kv_finding_classes_each_say_their_class():
    report = _kv_report(_finer_arms(MISPLACED, FOREIGN), None)
    code, why = exit_reason(report)
    assert code == EXIT_MISMATCH
    assert why == "KV FOREIGN and MISPLACED that the fixture does not state: Conn a (MISPLACED); Conn b (FOREIGN)"


def _summary(report: dict) -> str:
    """format_summary on the thin test arms: the fields a written report always has."""
    report = copy.deepcopy(dict(report, generations=0, provenance={}, config={"kv_audit": True, "block_size": 16}))
    for arm in report["arms"]:
        arm.setdefault("reasons", [])
        for p in arm["probes"]:
            p.setdefault("prompt_tokens", 32)
            p.setdefault("requests", [])
    return format_summary(report)


def test_a_stated_kv_finding_under_an_acceptance_that_failed_elsewhere_is_named_stated_not_unstated():
    """A fixture that states a planted CORRUPT, whose acceptance failed on another arm's tokens: the finding is not
    excused (a failed acceptance excuses nothing: exit 1), and the reason says the fixture states it rather than that
    it does not; an unstated finding beside it is still the one named first."""
    native = _kv_arm("native", "native", {"a": "FAIL", "b": "PASS"}, {"a": EXACT, "b": NUMERIC})  # expected PASS
    arms = [KV_ARMS[0], KV_ARMS[1], native]
    report = _kv_report(arms, {**EXPECTED_KV, "Conn": {"a": CORRUPT, "b": EXACT}})
    assert report["acceptance"]["matched"] is False and excused_kv_findings(report["acceptance"]) == set()
    code, why = exit_reason(report)
    assert code == EXIT_MISMATCH
    assert why == "KV CORRUPT that the fixture states, not excused while its acceptance does not match: Conn a"
    unstated = _kv_report(_finer_arms(MISPLACED, FOREIGN), {**EXPECTED_KV, "Conn": {"a": MISPLACED, "b": EXACT}})
    assert exit_reason(unstated)[1] == "KV FOREIGN that the fixture does not state: Conn b"
