"""The one exit rule's invariants over every kind of run, not only plain arms × trials (tests/test_exit_properties.py):
generated judged records with KV classes on any probe of any trial, a probe missing from an arm's result, scenario
runs with later trials, P→D requests with their KV audit and negative controls, and hit counters missing, -1 or
zero. No engine, no files (database=None).

The oracle for "the exit code counts it against the run" is written here from the generated records, not taken from
the exit rule, so that the two are checked against each other:
- an ERROR anywhere is exit 3;
- else any unexpected FAIL or KV finding (CORRUPT, FOREIGN, MISPLACED) in any trial, a probe the fixture expects and
  the result lacks, a P→D request not PASS or a control not held, is exit 1;
- and nothing a reader sees first (the headline, the arm's summary line, the index row's verdict, the issue's
  title) says PASS, "matched" or "bit-exact" of what the exit counts against without naming the finding beside it.
"""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from repro.disagg.report import exit_view, summary_lines
from repro.errors import EXIT_MISMATCH, EXIT_OK, EXIT_RUNTIME
from repro.judge import trials
from repro.judge.verdict import (
    CORRUPT,
    ERROR,
    EXACT,
    FAIL,
    FOREIGN,
    INCONCLUSIVE,
    KV_FINDINGS,
    MISPLACED,
    NO_HIT_DIFFERS,
    NUMERIC,
    PASS,
    Request,
    decide_missing_probe,
    decide_probe,
)
from repro.publish.headline import headline
from repro.publish.site_index import build_index_row
from repro.publish.summary import format_summary
from repro.readmodel import as_report
from repro.record.acceptance import check_acceptance
from repro.record.exit_rule import exit_reason

PROBES = ("a", "b")
ORDER = [PASS, INCONCLUSIVE, FAIL, ERROR]
GREEN = (PASS, "matched", "bit-exact")
# words that say what the exit counts (a finding, an ERROR, missing evidence): a green word beside one is no claim
FINDING_WORDS = ("corrupt", "foreign", "misplaced", "CORRUPT", "FOREIGN", "MISPLACED", FAIL, "differently", ERROR,
                 INCONCLUSIVE, "not held", "exit 1", "exit 3")  # fmt: skip

kv_class = st.sampled_from([None, EXACT, NUMERIC, CORRUPT, FOREIGN, MISPLACED])
probe_run = st.tuples(st.sampled_from([PASS, FAIL]), kv_class)
one_run = st.one_of(st.just(ERROR), st.tuples(*(probe_run for _ in PROBES)))
arm_runs = st.lists(one_run, min_size=1, max_size=3)


def _probe(name: str, verdict: str, kv: str | None) -> dict:
    audit = None if kv is None else {"verdict": kv, "reason": "", "requests": []}
    return {"name": name, "verdict": verdict, "reasons": [] if verdict == PASS else ["reuse 1: differs @3"],
            "skipped": None, "kv": audit,
            "requests": [{"first_diff": None, "cached_tokens": 0},
                         {"first_diff": 3 if verdict == FAIL else None, "cached_tokens": 256}]}  # fmt: skip


def _missing(name: str) -> dict:
    """A probe the arm's job asked for and its result lacks, as the judge records it (decide_missing_probe)."""
    pv = decide_missing_probe(None, 2)
    return {"name": name, "verdict": pv.verdict, "reasons": list(pv.reasons), "skipped": None, "kv": None,
            "requests": []}  # fmt: skip


def _entry(one, drop: str | None = None) -> dict:
    if one == ERROR:
        return {"name": "Conn", "mode": "connector", "verdict": ERROR, "reasons": [], "probes": [],
                "error": {"kind": "timeout", "detail": "x"}, "timing": {"wall_s": 1.0}}  # fmt: skip
    probes = [_probe(p, v, kv) if p != drop else _missing(p) for p, (v, kv) in zip(PROBES, one)]
    verdicts = [p["verdict"] for p in probes] or [INCONCLUSIVE]
    return {"name": "Conn", "mode": "connector", "verdict": max(verdicts, key=ORDER.index), "reasons": [],
            "probes": probes, "error": None, "timing": {"wall_s": 1.0}}  # fmt: skip


def _plain_report(runs: list, drop: str | None) -> dict:
    base = {"name": "baseline", "mode": "baseline", "verdict": PASS, "reasons": [], "error": None,
            "probes": [_probe(p, PASS, None) for p in PROBES]}  # fmt: skip
    entries = [_entry(r, drop if k == 0 else None) for k, r in enumerate(runs)]
    arm = copy.deepcopy(entries[0])
    if len(entries) > 1:
        arm["trials"] = trials.trial_rates([trials.run_summary(e, k, False) for k, e in enumerate(entries, 1)])
    # the fixture states the token verdicts of the arm's own run, probe by probe, and no KV: every KV finding is
    # one it does not state; a dropped probe is one it states and the result lacks
    own = runs[0]
    stated = own if own != ERROR else [(PASS, None)] * len(PROBES)
    expected = {"Conn": {p: v for p, (v, _) in zip(PROBES, stated)}}
    acc = check_acceptance([base, arm], expected, "acceptance")
    return {"kind": "kvkit-report", "schema_version": 2, "complete": True, "errors": [], "arms": [base, arm],
            "acceptance": acc, "generations": 0, "provenance": {}, "config": {"kv_audit": True},
            "warnings": []}  # fmt: skip


def _plain_counted(runs: list, drop: str | None) -> tuple[bool, bool]:
    """(counted against the arm, an ERROR among its runs) by the oracle: any ERROR; a KV finding in any run; a
    FAIL a later run made where the own run did not FAIL that probe; a probe the own run lacks."""
    if any(r == ERROR for r in runs):
        return True, True
    own = dict(zip(PROBES, runs[0]))
    kv = any(kv in KV_FINDINGS for r in runs for _, kv in r)
    later_fail = any(v == FAIL and own[p][0] != FAIL for r in runs[1:] for p, (v, _) in zip(PROBES, r))
    return kv or later_fail or drop is not None, False


def _reader_texts(report: dict) -> tuple[list[str], str, list[str], str]:
    """What a reader sees of the arm Conn: the headline's clauses about it, its summary line, its index row
    verdict cell (verdict and condition), and the issue's title (the headline)."""
    text = headline(report)
    clauses = [c for c in text.split("; ") if "Conn" in c]
    title = next(a.title for a in as_report(report).arms if a.name == "Conn")
    line = next(x for x in format_summary(report).splitlines() if x.startswith(f"{title}: "))
    row = build_index_row(report, stem="r", href="r.html")
    (cell,) = [v for v in row.verdicts if v.arm == title]
    return clauses, line.removeprefix(f"{title}: "), [cell.verdict, cell.condition], text


def _says_green_without_finding(text: str) -> bool:
    return any(w in text for w in GREEN) and not any(w in text for w in FINDING_WORDS)


@settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@example([((PASS, EXACT), (PASS, FOREIGN))], None)  # tokens matched over another prompt's KV, own run
@example([((PASS, EXACT), (PASS, EXACT)), ((PASS, EXACT), (PASS, FOREIGN))], None)  # a KV-only finding in trial 2
@example([((PASS, EXACT), (PASS, EXACT))], "b")  # a probe the fixture states and the result lacks
@given(arm_runs, st.sampled_from([None, "b"]))
def test_plain_arms_any_kv_finding_missing_probe_or_error_is_never_green(runs, drop):
    if runs[0] == ERROR:
        drop = None
    report = _plain_report(runs, drop)
    code, why = exit_reason(report)
    counted, errored = _plain_counted(runs, drop)
    assert (code == EXIT_RUNTIME) == errored, why
    if not counted:
        assert code == EXIT_OK, why
        return
    assert code in (EXIT_MISMATCH, EXIT_RUNTIME), why
    clauses, line, cell, _ = _reader_texts(report)
    assert clauses, headline(report)
    for clause in clauses:
        assert not _says_green_without_finding(clause), clause
    assert not (line.startswith(PASS) and not any(w in line for w in FINDING_WORDS)), line
    if any(r != ERROR and any(v == FAIL for v, _ in r) for r in runs[1:]) or errored:
        assert not (cell[0] == PASS and not cell[1]), cell


scenario_run = st.one_of(st.just(ERROR), probe_run)


def _scenario_entry(r) -> dict:
    """A judged (scenario, arm) entry of one run: ERROR, or one request with its verdict and KV class."""
    if r == ERROR:
        return {"arm": "Conn", "verdict": ERROR, "reasons": [], "requests": [], "kv": None,
                "error": {"kind": "timeout", "detail": "x"}}  # fmt: skip
    verdict, kv = r
    request = {"step": 0, "probe": "a", "verdict": verdict, "first_diff": 3 if verdict == FAIL else None,
               "cached_tokens": 256, "reasons": [], "token_ids": [1, 2],
               "kv": None if kv is None else {"verdict": kv}}  # fmt: skip
    return {"arm": "Conn", "verdict": verdict, "reasons": [], "requests": [request],
            "kv": None if kv is None else {"verdict": kv, "reason": ""}, "error": None}  # fmt: skip


def _scenario_report(runs: list) -> dict:
    entries = [_scenario_entry(r) for r in runs]
    arm = copy.deepcopy(entries[0])
    if len(runs) > 1:
        arm["trials"] = trials.scenario_trial_rates(
            [trials.scenario_run_summary(e, k, False) for k, e in enumerate(entries, 1)]
        )
    base = {"name": "baseline", "mode": "baseline", "verdict": PASS, "reasons": [], "error": None,
            "probes": [_probe(p, PASS, None) for p in PROBES]}  # fmt: skip
    plain = _entry(((PASS, EXACT), (PASS, EXACT)))
    acc = check_acceptance([base, plain], {"Conn": {p: PASS for p in PROBES}}, "acceptance")
    return {"kind": "kvkit-report", "schema_version": 2, "complete": True, "errors": [], "arms": [base, plain],
            "acceptance": acc, "generations": 0, "provenance": {}, "config": {"kv_audit": True}, "warnings": [],
            "scenarios": [{"name": "sc", "control": {"status": "ok"}, "arms": [arm]}]}  # fmt: skip


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@example([(PASS, EXACT), (FAIL, EXACT)])  # D4: a scenario run whose trial 2 FAILed
@example([(PASS, EXACT), (PASS, CORRUPT)])  # a KV-only finding in trial 2
@example([(PASS, EXACT), ERROR])
@given(st.lists(scenario_run, min_size=1, max_size=3))
def test_scenario_runs_any_later_finding_or_error_is_never_counted_as_pass(runs):
    report = _scenario_report(runs)
    code, why = exit_reason(report)
    errored = any(r == ERROR for r in runs)
    assert (code == EXIT_RUNTIME) == errored, why
    finding = any(r != ERROR and (r[0] != PASS or r[1] in KV_FINDINGS) for r in runs)
    if not (errored or finding):
        assert code == EXIT_OK, why
        assert "1 scenario run PASS" in headline(report)
        return
    assert code != EXIT_OK, why
    text = headline(report)
    assert "scenario run PASS" not in text and "scenario runs PASS" not in text, text
    assert "scenario sc: Conn" in text, text
    row = build_index_row(report, stem="r", href="r.html")
    assert row.scenario_passes == 0 and [s[0].split(" (")[0] for s in row.scenarios] == ["sc · Conn"], row.scenarios


pd_request = st.tuples(st.sampled_from([PASS, FAIL, INCONCLUSIVE, ERROR]), kv_class)
pd_control = st.booleans()


def _pd_report(requests: list, controls: list[bool]) -> dict:
    reqs = [
        {"case": "warm", "prompt": f"p{i}", "trial": 1, "control": None, "reference": [1, 2], "verdict": v,
         "reasons": [] if v == PASS else [f"{v.lower()} reason"],
         "kv_audit": None if kv is None else {"verdict": kv, "reason": "", "shape": ""}}
        for i, (v, kv) in enumerate(requests)
    ]  # fmt: skip
    reqs += [
        {"case": f"neg{i}", "prompt": "p0", "trial": 1, "reference": [1, 2], "verdict": PASS, "reasons": [],
         "control": {"held": held, "reason": "held" if held else "the consumer used the KV"}, "kv_audit": None}
        for i, held in enumerate(controls)
    ]  # fmt: skip
    verdicts = [v for v, _ in requests]
    worst = max(verdicts, key=ORDER.index) if verdicts else INCONCLUSIVE
    counts = {v: verdicts.count(v) for v in ORDER if v in verdicts}
    return {"verdict": worst, "reasons": [], "requests": reqs, "counts": counts,
            "controls": {"held": sum(controls), "run": len(controls)}}  # fmt: skip


@settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@example([(PASS, FOREIGN)], [True])  # D2: a consumer that loaded another prompt's KV and answered right
@example([(ERROR, None)], [True])  # D12: a P→D ERROR is exit 3
@example([(PASS, EXACT)], [False])  # a negative control not held
@given(st.lists(pd_request, min_size=1, max_size=4), st.lists(pd_control, max_size=2))
def test_pd_requests_go_through_the_one_exit_rule_and_the_summary_names_what_it_counts(requests, controls):
    report = _pd_report(requests, controls)
    code, why = exit_reason(exit_view(report))
    errored = any(v == ERROR for v, _ in requests)
    assert (code == EXIT_RUNTIME) == errored, why
    bad = any(v != PASS or kv in KV_FINDINGS for v, kv in requests) or not all(controls)
    assert (code == EXIT_OK) == (not bad), why
    if bad:
        lines = summary_lines(report)
        assert not _says_green_without_finding("\n".join(lines)), lines


counter = st.one_of(st.none(), st.just(-1), st.just(0), st.integers(min_value=1, max_value=512), st.just(True))


@settings(max_examples=80, deadline=None, database=None)
@given(counter, st.lists(counter, min_size=1, max_size=3), st.booleans())
def test_a_missing_negative_or_zero_hit_counter_never_passes(cold, reuses, same):
    """A reuse PASSes only where the cold request is a verified miss (a count of 0) and every reuse counted a hit
    (a count above 0): None, -1 (vLLM's 'not checked yet'), a bool and 0 are never read as a hit or a miss. A FAIL
    needs a verified miss first and a reuse that counted a hit, or one that counted 0 and answered otherwise (the
    finding no-hit-differs, which only a count of 0, never a missing counter, can make)."""
    base = (1, 2, 3, 4)
    answer = base if same else (1, 2, 9, 9)
    pv = decide_probe(base, Request(base, cold), [Request(answer, c) for c in reuses])
    verdict = pv.verdict

    def count(c):
        return None if isinstance(c, bool) or c is None or c < 0 else c

    good = count(cold) == 0 and all((count(c) or 0) > 0 for c in reuses)
    if verdict == PASS:
        assert good and same
    if not good:
        assert verdict in (INCONCLUSIVE, FAIL)
        unowned = not same and any(count(c) == 0 for c in reuses)
        assert verdict != FAIL or (any((count(c) or 0) > 0 for c in reuses) or unowned) and count(cold) == 0
    assert (pv.finding == NO_HIT_DIFFERS) == (verdict == FAIL and not same and any(count(c) == 0 for c in reuses))
