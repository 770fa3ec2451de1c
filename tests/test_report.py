"""Acceptance checking and exit codes: pure functions over judged arms (repro.report)."""

from __future__ import annotations

import pytest

from repro.errors import EXIT_MISMATCH, EXIT_OK, EXIT_RUNTIME
from repro.report import check_acceptance, exit_code


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
        {"arm": "Conn", "probe": "a", "expected": "PASS", "observed": "FAIL", "ok": False}
    ]
    assert exit_code(_report(ARMS, expected)) == EXIT_MISMATCH


def test_a_probe_an_expected_arm_ran_but_its_table_does_not_list_is_never_silent():
    """Bug b: 'c' FAILs on Conn and nothing expects it; acceptance must not match."""
    arms = [ARMS[0], _arm("Conn", "connector", {"a": "FAIL", "b": "PASS", "c": "FAIL"}), ARMS[2]]
    acc = check_acceptance(arms, EXPECTED, "acceptance")
    assert acc["matched"] is False
    assert acc["unchecked_probes"] == [{"arm": "Conn", "probe": "c", "observed": "FAIL"}]
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
