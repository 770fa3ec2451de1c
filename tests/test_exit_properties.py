"""Properties of the one exit rule and what the headline and the summary say beside it (issue 55: D4, D8), over
small generated reports: arms × trials with verdicts drawn from PASS, FAIL, INCONCLUSIVE and ERROR, MultiConnector
members exercised or not, and expectations met, not met or absent. No engine, no files (database=None).

- An ERROR anywhere (an arm's own run, a later trial) is exit 3.
- No headline clause and no summary verdict line says PASS, "matched" or "bit-exact" for an arm that the exit code
  counts against: an ERROR in any of its runs, a FAIL a later trial made on a probe its own run did not FAIL, or a
  member never exercised. The oracle for "counts against" is written here from the generated runs, not taken from
  the exit rule, so that the two are checked against each other.
"""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from repro.errors import EXIT_OK, EXIT_RUNTIME
from repro.judge import trials
from repro.judge.verdict import ERROR, FAIL, INCONCLUSIVE, PASS
from repro.publish.headline import headline
from repro.publish.summary import format_summary
from repro.readmodel import as_report
from repro.record.acceptance import check_acceptance
from repro.record.exit_rule import exit_reason

PROBES = ("a", "b")
ARMS = ("ConnAlpha", "ConnBeta")
ORDER = [PASS, INCONCLUSIVE, FAIL, ERROR]
GREEN_WORDS = (PASS, "matched", "bit-exact")

probe_verdict = st.sampled_from([PASS, FAIL, INCONCLUSIVE])
# one run of an arm: ERROR (it did not finish), or a verdict per probe
run = st.one_of(st.just(ERROR), st.tuples(*(probe_verdict for _ in PROBES)))
arm_runs = st.lists(run, min_size=1, max_size=3)  # trial 1 (the arm's own run), then trials 2..N
members = st.one_of(st.none(), st.lists(st.booleans(), min_size=2, max_size=2))  # None: no MultiConnector
expectation = st.sampled_from(["none", "met", "not met"])


def _probe(name: str, verdict: str) -> dict:
    diff = 3 if verdict == FAIL else None
    return {"name": name, "verdict": verdict, "reasons": [], "skipped": None, "kv": None,
            "requests": [{"first_diff": None, "cached_tokens": 0},
                         {"first_diff": diff, "cached_tokens": 0 if verdict == INCONCLUSIVE else 256}]}  # fmt: skip


def _entry(name: str, one_run) -> dict:
    if one_run == ERROR:
        return {"name": name, "mode": "connector", "verdict": ERROR, "reasons": [], "probes": [],
                "error": {"kind": "timeout", "detail": "x"}, "timing": {"wall_s": 1.0}}  # fmt: skip
    probes = [_probe(p, v) for p, v in zip(PROBES, one_run)]
    worst = max(one_run, key=ORDER.index)
    return {"name": name, "mode": "connector", "verdict": worst, "reasons": [], "probes": probes, "error": None,
            "timing": {"wall_s": 1.0}}  # fmt: skip


def _members(served: list[bool]) -> list[dict]:
    return [
        {"index": i, "connector": f"Member{i}Connector", "reuses_served": ["a reuse 1"] if s else [],
         "hits": 256 if s else 0, "verdict": PASS if s else INCONCLUSIVE,
         "reasons": [] if s else [f"member {i} Member{i}Connector never served a reuse: not exercised"]}
        for i, s in enumerate(served)
    ]  # fmt: skip


def _report(runs_by_arm: list[list], served: list[bool] | None, expect: str) -> dict:
    base = {"name": "baseline", "mode": "baseline", "verdict": PASS, "reasons": [], "error": None,
            "probes": [_probe(p, PASS) for p in PROBES]}  # fmt: skip
    arms = [base]
    for name, runs in zip(ARMS, runs_by_arm):
        entries = [_entry(name, r) for r in runs]
        arm = copy.deepcopy(entries[0])
        if len(entries) > 1:
            arm["trials"] = trials.trial_rates([trials.run_summary(e, k, False) for k, e in enumerate(entries, 1)])
        if served is not None and name == ARMS[-1]:
            arm["members"] = _members(served)
        arms.append(arm)
    expected = {}
    if expect != "none":
        for arm in arms[1:]:
            own = {p["name"]: p["verdict"] for p in arm["probes"]}
            if expect == "not met":
                own = {p: (FAIL if v == PASS else PASS) for p, v in own.items()}
            expected[arm["name"]] = own or {p: PASS for p in PROBES}
    acc = check_acceptance(arms, expected, None if expect == "none" else "acceptance")
    return {"kind": "kvkit-report", "schema_version": 2, "complete": True, "errors": [], "arms": arms,
            "acceptance": acc, "generations": 0, "provenance": {}, "config": {"kv_audit": False},
            "warnings": []}  # fmt: skip


def _counted_against(runs: list, served: list[bool] | None) -> bool:
    """The oracle: an ERROR in any run, a FAIL a later run made on a probe the own run did not FAIL, or (for a
    MultiConnector arm that finished) a member never exercised."""
    if any(r == ERROR for r in runs):
        return True
    own = runs[0]
    if any(v == FAIL and own[i] != FAIL for r in runs[1:] for i, v in enumerate(r)):
        return True
    return served is not None and not all(served)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@example([[(PASS, PASS), (PASS, FAIL)]], None, "met")  # D4: trial 2 FAILed where trial 1 matched (exit 1)
@example([[(PASS, PASS), ERROR]], None, "none")  # D4: trial 2 ended in ERROR (exit 3)
@example([[(PASS, PASS)], [(PASS, PASS)]], [True, False], "none")  # D8: a member never exercised (exit 1)
@given(st.lists(arm_runs, min_size=1, max_size=2), members, expectation)
def test_an_error_is_exit_3_and_nothing_green_is_said_of_what_the_exit_counts_against(runs_by_arm, served, expect):
    if served is not None and len(runs_by_arm) < len(ARMS):
        served = None  # members belong to the last arm of ARMS
    report = _report(runs_by_arm, served, expect)
    code, why = exit_reason(report)
    any_error = any(r == ERROR for runs in runs_by_arm for r in runs)
    assert (code == EXIT_RUNTIME) == any_error, why
    text = headline(report)
    summary = format_summary(report).splitlines()
    titles = {a.name: a.title for a in as_report(report).arms}
    for name, runs in zip(ARMS, runs_by_arm):
        mine = served if name == ARMS[-1] else None
        if not _counted_against(runs, mine):
            continue
        assert code != EXIT_OK, (name, why)
        clauses = [c for c in text.split("; ") if c.startswith(name)]
        assert clauses, text
        for clause in clauses:
            assert not any(word in clause for word in GREEN_WORDS), (name, clause)
        (line,) = [x for x in summary if x.startswith(f"{titles[name]}: ")]
        verdict = line.removeprefix(f"{titles[name]}: ")
        assert not verdict.startswith(PASS) and "matched" not in verdict, (name, line)
