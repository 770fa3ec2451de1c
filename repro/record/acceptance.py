"""Acceptance: the observed verdicts (token and KV, of the plain arms and of the scenarios) against what the
fixture states, and the KV findings (CORRUPT, FOREIGN, MISPLACED) a matched acceptance excuses (planted faults meant
to be caught): only the class the fixture states for that probe, never another.
"""

from __future__ import annotations

from repro.judge.expectations import expectation_met, expectation_states
from repro.judge.upstream import UPSTREAM_CHANGES, judge_bound
from repro.judge.verdict import ERROR, KV_FINDINGS, SKIPPED


def kv_verdict(probe: dict) -> str | None:
    """A probe's KV verdict as written (None: not audited)."""
    kv = probe.get("kv")
    return str(kv.get("verdict")) if isinstance(kv, dict) else None


def kv_findings(report: dict) -> list[tuple[dict, dict]]:
    """(arm, probe) of every probe whose KV verdict is a finding (CORRUPT, FOREIGN, MISPLACED), in report order."""
    return [
        (arm, probe)
        for arm in report["arms"]
        if arm["mode"] != "baseline"
        for probe in arm.get("probes") or []
        if kv_verdict(probe) in KV_FINDINGS
    ]


def _unlisted(arm: dict, table: dict, observe, check: str) -> list[dict]:
    """Probes an expected arm ran that its table does not list: they would never be checked."""
    return [
        {"arm": arm["name"], "probe": p["name"], "observed": observe(p), "check": check}
        for p in arm.get("probes", [])
        if observe(p) not in (SKIPPED, None) and p["name"] not in table
    ]


def check_acceptance(arms: list[dict], expected: dict, suite: str | None, expected_kv: dict | None = None) -> dict:
    """Observed verdicts against the fixture's expected ones; matched only if all were checked.

    expected: arm -> {probe: token verdict}; expected_kv: arm -> {probe: KV verdict}, given only
    for a run that audited KV (a run without the audit checks no KV expectation). An expectation is
    one verdict or a set of them (a list: ["EXACT", "NUMERIC"]), met when the observed verdict is one
    of them (repro.judge.expectations.expectation_met); each checked item keeps it as the fixture wrote it. Each
    checked item says its check, "tokens" or "kv"; a KV item observes probe["kv"]["verdict"] (None
    when the probe has no KV verdict). An arm listed in expected_kv must list every probe that got a
    KV verdict, as one listed in expected must list every probe it ran (else unchecked_probes)."""
    if suite != "acceptance":
        return {
            "suite": suite,
            "matched": None,
            "checked": [],
            "unchecked_arms": [],
            "unchecked_probes": [],
            "note": "no acceptance suite was run",
        }
    expected_kv = expected_kv or {}
    checked, unchecked, unlisted = [], [], []
    by_name = {a["name"]: a for a in arms}
    for arm in arms:
        if arm["mode"] != "baseline" and arm["name"] not in expected:
            unchecked.append(arm["name"])
        if arm["name"] in expected:
            unlisted += _unlisted(arm, expected[arm["name"]], lambda p: p["verdict"], "tokens")
        if arm["name"] in expected_kv:
            unlisted += _unlisted(arm, expected_kv[arm["name"]], kv_verdict, "kv")
    for arm_name, table in sorted(expected.items()):
        arm = by_name.get(arm_name)
        probes = {p["name"]: p for p in (arm or {}).get("probes", [])}
        for probe_name, want in sorted(table.items()):
            got = (
                probes[probe_name]["verdict"]
                if probe_name in probes
                else (arm["verdict"] if arm and arm["verdict"] == ERROR else None)
            )
            checked.append(_checked("tokens", arm_name, probe_name, want, got))
    for arm_name, table in sorted(expected_kv.items()):
        probes = {p["name"]: p for p in (by_name.get(arm_name) or {}).get("probes", [])}
        for probe_name, want in sorted(table.items()):
            got = kv_verdict(probes[probe_name]) if probe_name in probes else None
            checked.append(_checked("kv", arm_name, probe_name, want, got))
    matched = bool(checked) and all(c["ok"] for c in checked) and not unchecked and not unlisted
    return {
        "suite": suite,
        "matched": matched,
        "checked": checked,
        "unchecked_arms": unchecked,
        "unchecked_probes": unlisted,
    }


def _checked(check: str, arm: str, probe: str, want: str | list[str], got: str | None) -> dict:
    """One checked item: the expectation as written (a verdict or a set), what was observed, and whether
    the expectation accepts it."""
    return {
        "check": check,
        "arm": arm,
        "probe": probe,
        "expected": want,
        "observed": got,
        "ok": expectation_met(want, got),
    }


def unexpected_kv_findings(report: dict) -> list[tuple[dict, dict]]:
    """(arm, probe) of every KV finding the acceptance did not expect: an expected one (CORRUPT, FOREIGN,
    MISPLACED) is excused only when the fixture stated that class for that arm and probe and acceptance matched."""
    excused = excused_kv_findings(report["acceptance"])
    return [(a, p) for a, p in kv_findings(report) if (a["name"], p["name"]) not in excused]


def excused_kv_findings(acceptance: dict) -> set[tuple[str, str]]:
    """(arm, probe) names whose KV finding the fixture stated and a matched acceptance checked: observed a
    finding (CORRUPT, FOREIGN, MISPLACED), and that very class is what the expectation (a verdict or a set) states."""
    return _excused(acceptance, "probe")


def _excused(acceptance: dict, what: str) -> set[tuple[str, str]]:
    """(arm, probe) ("probe") or (scenario, arm) ("scenario") of every KV item a matched acceptance checked
    whose observed KV finding its expectation states."""
    if not acceptance.get("matched"):
        return set()
    return {
        (c["arm"], c["probe"]) if what == "probe" else (c["scenario"], c["arm"])
        for c in acceptance.get("checked", [])
        if c.get("check") == "kv"
        and c.get("observed") in KV_FINDINGS
        and expectation_states(c.get("expected"), str(c.get("observed")))
        and c.get("ok")
    }


def scenario_arms(report: dict) -> list[tuple[dict, dict]]:
    """(scenario, arm entry) of every (scenario, arm) of a report's scenarios section, in report order."""
    return [(sc, arm) for sc in report.get("scenarios") or [] for arm in sc.get("arms") or []]


def scenario_kv_verdict(arm: dict) -> str | None:
    """A (scenario, arm) entry's KV verdict as written (None: not audited)."""
    kv = arm.get("kv")
    return str(kv.get("verdict")) if isinstance(kv, dict) else None


def check_scenario_acceptance(
    sections: list[dict], expected: dict, suite: str | None, expected_kv: dict | None = None
) -> dict:
    """The scenarios' verdicts against the fixture's expected_scenarios (arm -> {scenario: verdict}) and, for
    a run that audited KV, expected_scenarios_kv (arm -> {scenario: KV verdict}); checked, like `expected`,
    only under the acceptance suite, an expectation being one verdict or a set (kept as written; met when
    the observed verdict is one of it). Matched only if something was checked and every (scenario, arm)
    that was judged is listed (else `unchecked`)."""
    if suite != "acceptance":
        return {"matched": None, "checked": [], "unchecked": [], "note": "no acceptance suite was run"}
    expected_kv = expected_kv or {}
    observed = {(sc["name"], arm["arm"]): arm for sc in sections for arm in sc["arms"]}
    checked, unchecked = [], []
    for (scenario, arm), entry in sorted(observed.items()):
        if entry["verdict"] != SKIPPED and scenario not in expected.get(arm, {}):
            unchecked.append({"arm": arm, "scenario": scenario, "observed": entry["verdict"], "check": "tokens"})
        if arm in expected_kv and scenario_kv_verdict(entry) is not None and scenario not in expected_kv[arm]:
            unchecked.append({"arm": arm, "scenario": scenario, "observed": scenario_kv_verdict(entry), "check": "kv"})
    ran = {sc["name"] for sc in sections}
    for check, table_of, observe in (
        ("tokens", expected, lambda e: e["verdict"]),
        ("kv", expected_kv, scenario_kv_verdict),
    ):
        for arm, table in sorted(table_of.items()):
            for scenario, want in sorted(table.items()):
                if scenario not in ran:
                    continue  # not asked for in this run (--scenarios NAME)
                entry = observed.get((scenario, arm))
                got = observe(entry) if entry is not None else None
                checked.append(
                    {
                        "check": check,
                        "arm": arm,
                        "scenario": scenario,
                        "expected": want,
                        "observed": got,
                        "ok": expectation_met(want, got),
                    }
                )
    matched = bool(checked) and all(c["ok"] for c in checked) and not unchecked
    return {"matched": matched, "checked": checked, "unchecked": unchecked}


def excused_scenario_kv(acc: dict) -> set[tuple[str, str]]:
    """(scenario, arm) whose KV finding the fixture stated (expected_scenarios_kv: CORRUPT, FOREIGN or MISPLACED,
    or a set of findings holding the one observed) and a matched scenario acceptance checked: a planted fault the
    scenario is meant to catch, as excused_kv_findings for the plain arms."""
    return _excused(acc, "scenario")


def check_upstream(
    bounds, arms: list[dict], sections: list[dict] | None, versions: dict | None, audited: bool
) -> list[dict]:
    """Each upstream bound (repro.plan.upstream.BoundExpectation) judged against what the run observed and the
    engine's version of its package (versions: the report's provenance.engine_versions, what the baseline's engine
    child recorded; None where it recorded none), in every run, with or without the acceptance suite: whether a
    known bug reproduces on this engine is a fact of the run, not of matching. A bound on a scenario the run did not
    ask for, or on a KV expectation of a run without the KV audit, is left out (nothing of it was asked); one on a
    plain arm the run lacks is judged on no verdict (unjudged), as acceptance checks it. The state and its sentence
    are repro.judge.upstream.judge_bound's."""
    by_arm = {a["name"]: {p["name"]: p for p in a.get("probes") or []} for a in arms}
    ran = {(sc["name"], arm["arm"]): arm for sc in sections or [] for arm in sc.get("arms") or []}
    asked = {sc["name"] for sc in sections or []}
    out = []
    for b in bounds:
        if (b.check == "kv" and not audited) or (b.on_scenario and b.item not in asked):
            continue
        entry = ran.get((b.item, b.arm)) if b.on_scenario else by_arm.get(b.arm, {}).get(b.item)
        kv = scenario_kv_verdict if b.on_scenario else kv_verdict
        got = None if entry is None else entry.get("verdict") if b.check == "tokens" else kv(entry)
        version = (versions or {}).get(b.bound.package)
        judged = judge_bound(b.bound, b.verdict, got, version, f"{b.arm} {b.item}" + (" KV" if b.check == "kv" else ""))
        item = {"check": b.check, "arm": b.arm, ("scenario" if b.on_scenario else "probe"): b.item}
        out.append(item | {"expected": b.verdict, "observed": got, **b.bound.to_json(),
                           "engine_version": version if isinstance(version, str) else None,
                           "state": judged.state, "text": judged.text})  # fmt: skip
    return out


def upstream_changes(report: dict, scenarios_only: bool = False) -> list[dict]:
    """The report's upstream bounds that are a change to look at (fixed upstream, a wrong bound, one that cannot be
    decided: repro.judge.upstream.UPSTREAM_CHANGES), in report order; [] for a report without bounds."""
    return [
        u
        for u in report.get("upstream") or []
        if u.get("state") in UPSTREAM_CHANGES and (not scenarios_only or "scenario" in u)
    ]
