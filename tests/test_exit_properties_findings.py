"""The findings no fixture's FAIL excuses (repro.judge.verdict.FINDINGS: a tenant-isolation failure, an answer
changed with no hit reported) through the one exit rule and its views, over generated judged records: plain arms
whose probes carry either finding or none, scenario runs whose requests do, and a fixture that states every
observed verdict (its acceptance then matches) or none. No engine, no files (database=None).

The oracle, written here from the generated records: a finding anywhere is exit 1 (3 where an ERROR is too), its
words are in the exit reason, and neither the headline's clauses about its arm, the arm's summary line nor the
scenario's headline clause says PASS, "matched" or "bit-exact" of it; the arm's summary line names the finding.
"""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from repro.errors import EXIT_MISMATCH, EXIT_OK, EXIT_RUNTIME
from repro.judge.verdict import (
    ERROR,
    FAIL,
    FINDING_WORDS,
    FINDINGS,
    INCONCLUSIVE,
    NO_HIT_DIFFERS,
    PASS,
    TENANT_ISOLATION,
)
from repro.publish.headline import headline
from repro.publish.summary import format_summary
from repro.readmodel import as_report
from repro.record.acceptance import check_acceptance, check_scenario_acceptance
from repro.record.exit_rule import exit_reason

PROBES = ("a", "b")
ORDER = [PASS, INCONCLUSIVE, FAIL, ERROR]
GREEN = (PASS, "matched", "bit-exact")

# one probe's (or one scenario request's) judged outcome: a plain verdict, or a FAIL with a finding
outcome = st.sampled_from([(PASS, None), (INCONCLUSIVE, None), (FAIL, None), (FAIL, TENANT_ISOLATION),
                           (FAIL, NO_HIT_DIFFERS)])  # fmt: skip


def _probe(name: str, verdict: str, finding: str | None) -> dict:
    cached = 0 if finding == NO_HIT_DIFFERS or verdict == INCONCLUSIVE else 288
    diff = 3 if verdict == FAIL and finding != TENANT_ISOLATION else None
    return {"name": name, "verdict": verdict, "reasons": [] if verdict == PASS else [f"{name}: why"], "skipped": None,
            "kv": None, "requests": [{"first_diff": None, "cached_tokens": 288 if finding == TENANT_ISOLATION else 0},
                                     {"first_diff": diff, "cached_tokens": cached}]} | (
        {"finding": finding} if finding else {})  # fmt: skip


def _arm(name: str, outcomes) -> dict:
    probes = [_probe(p, v, f) for p, (v, f) in zip(PROBES, outcomes)]
    return {"name": name, "mode": "connector", "verdict": max((v for v, _ in outcomes), key=ORDER.index),
            "reasons": [], "probes": probes, "error": None, "timing": {"wall_s": 1.0}}  # fmt: skip


def _request(step: int, verdict: str, finding: str | None) -> dict:
    return {"step": step, "probe": "a", "role": "reuse", "verdict": verdict, "reasons": [], "expect": None,
            "first_diff": 3 if verdict == FAIL and finding != TENANT_ISOLATION else None, "cached_tokens": 288,
            "token_ids": [1, 2], "kv": None, "control_matches": True, "preemptions": 0} | (
        {"finding": finding} if finding else {})  # fmt: skip


def _report(plain, scenario, stated: bool) -> dict:
    base = {"name": "baseline", "mode": "baseline", "verdict": PASS, "reasons": [], "error": None,
            "probes": [_probe(p, PASS, None) for p in PROBES]}  # fmt: skip
    arm = _arm("Conn", plain)
    reqs = [_request(k, v, f) for k, (v, f) in enumerate(scenario)]
    sc_arm = {"arm": "Conn", "mode": "connector", "verdict": max((r["verdict"] for r in reqs), key=ORDER.index),
              "reasons": [], "class": None, "requests": reqs, "kv": None, "error": None}  # fmt: skip
    sections = [{"name": "sc", "control": {"status": "ok", "requests": []}, "arms": [sc_arm], "steps": []}]
    suite = "acceptance" if stated else None
    expected = {"Conn": {p["name"]: p["verdict"] for p in arm["probes"]}} if stated else {}
    acc = check_acceptance([base, arm], expected, suite)
    acc["scenarios"] = check_scenario_acceptance(sections, {"Conn": {"sc": sc_arm["verdict"]}} if stated else {}, suite)
    return {"kind": "kvkit-report", "schema_version": 3, "complete": True, "errors": [], "arms": [base, arm],
            "acceptance": acc, "generations": 0, "provenance": {}, "config": {"kv_audit": False}, "warnings": [],
            "scenarios": sections}  # fmt: skip


def _green(text: str) -> bool:
    return any(w in text for w in GREEN)


@settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@example([(PASS, None), (FAIL, TENANT_ISOLATION)], [(PASS, None)], True)  # stated, matched: exit 1 all the same
@example([(PASS, None), (PASS, None)], [(PASS, None), (FAIL, NO_HIT_DIFFERS)], True)  # a scenario's, stated
@example([(PASS, None), (PASS, None)], [(PASS, None)], True)  # nothing found, all stated: exit 0
@given(st.lists(outcome, min_size=2, max_size=2), st.lists(outcome, min_size=1, max_size=3), st.booleans())
def test_a_finding_no_fixture_excuses_is_exit_1_and_never_said_green(plain, scenario, stated):
    report = _report(plain, scenario, stated)
    if stated:
        assert report["acceptance"]["matched"] is True and report["acceptance"]["scenarios"]["matched"] is True
    code, why = exit_reason(report)
    assert code != EXIT_RUNTIME, why
    found = [f for _, f in (*plain, *scenario) if f]
    if not found:
        if stated:
            assert code == EXIT_OK, why
        return
    assert code == EXIT_MISMATCH, why
    for finding in set(found):
        assert FINDING_WORDS[finding] in why, why
    assert why.startswith(FINDING_WORDS[min(found, key=FINDINGS.index)]), why
    text = headline(report)
    title = next(a.title for a in as_report(report).arms if a.name == "Conn")
    line = next(x for x in format_summary(report).splitlines() if x.startswith(f"{title}: "))
    plain_found = [f for _, f in plain if f]
    if plain_found:
        for clause in (c for c in text.split("; ") if c.startswith("Conn")):
            assert not _green(clause), clause
        verdict = line.removeprefix(f"{title}: ")
        assert verdict.startswith(FAIL) and "matched" not in verdict, line
        assert all(FINDING_WORDS[f] in verdict for f in plain_found), line
    if any(f for _, f in scenario):
        (clause,) = [c for c in text.split("; ") if c.startswith("scenario sc: ")]
        assert not _green(clause) and FAIL in clause, clause
        assert all(FINDING_WORDS[f] in clause for _, f in scenario if f), clause
