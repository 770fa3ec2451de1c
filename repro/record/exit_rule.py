"""The exit rule (docs/verdicts.md#exit-codes): one rule for plain arms and scenarios alike, from a report's
errors, its later runs' findings, its KV findings, its upstream bounds and its acceptance; exit_reason says why.
"""

from __future__ import annotations

from repro.errors import EXIT_MISMATCH, EXIT_OK, EXIT_RUNTIME
from repro.judge.expectations import expectation_states, expectation_text
from repro.judge.verdict import ERROR, FAIL, FINDING_WORDS, FINDINGS, INCONCLUSIVE, KV_FINDINGS, PASS, SKIPPED
from repro.record.acceptance import (
    excused_scenario_kv,
    kv_verdict,
    scenario_arms,
    scenario_kv_verdict,
    unexpected_kv_findings,
    upstream_changes,
)


def _kinds(verdict: object, kv: object) -> set[str]:
    """The kinds of finding one probe (or one scenario run) shows: FAIL, and its KV finding (CORRUPT, FOREIGN or
    MISPLACED: each a kind of its own, so a later run's MISPLACED is not hidden behind trial 1's CORRUPT)."""
    return ({FAIL} if verdict == FAIL else set()) | ({str(kv)} if kv in KV_FINDINGS else set())


def _later_runs(arm: dict) -> list[tuple[str, dict]]:
    """(label, run summary) of every run of a plain arm beyond its own: trials 2..N, then the re-run alone."""
    runs = [(f"trial {r.get('trial')}", r) for r in (arm.get("trials") or {}).get("runs") or [] if r.get("trial") != 1]
    alone = (arm.get("confirmation") or {}).get("run")
    return runs + ([("alone", alone)] if isinstance(alone, dict) else [])


def later_findings(report: dict) -> list[tuple[str, str, str, str]]:
    """(arm, run, probe or "scenario <name>", kind) of every FAIL or KV finding that a later run (a trial 2..N, the
    re-run alone) made and the arm's own run (trial 1) did not show of the same kind on the same probe (for a
    scenario: the same (scenario, arm)). Whatever trial 1 was (PASS, an expected INCONCLUSIVE, a FAIL with KV
    EXACT), a kind of finding it did not show is a finding all the same, never hidden behind it."""
    return [(arm, run, probe, kind) for arm, run, probe, kind in _plain_later(report)] + [
        (arm, run, f"scenario {scenario}", kind) for scenario, arm, run, kind in _scenario_later(report)
    ]


def _plain_later(report: dict) -> list[tuple[str, str, str, str]]:
    """(arm, run, probe, kind) of later_findings for the plain arms."""
    out = []
    for arm in report["arms"]:
        if arm.get("mode") == "baseline":
            continue
        own = {p["name"]: _kinds(p.get("verdict"), kv_verdict(p)) for p in arm.get("probes") or []}
        for label, run in _later_runs(arm):
            for p in run.get("probes") or []:
                for kind in sorted(_kinds(p.get("verdict"), p.get("kv")) - own.get(p.get("name"), set())):
                    out.append((arm["name"], label, str(p.get("name")), kind))
    return out


def _scenario_later(report: dict) -> list[tuple[str, str, str, str]]:
    """(scenario, arm, run, kind) of later_findings for the scenarios."""
    out = []
    for sc, arm in scenario_arms(report):
        own = _kinds(arm.get("verdict"), scenario_kv_verdict(arm))
        for run in (arm.get("trials") or {}).get("runs") or []:
            if run.get("trial") == 1:
                continue
            for kind in sorted(_kinds(run.get("verdict"), run.get("kv")) - own):
                out.append((str(sc.get("name")), str(arm.get("arm")), f"trial {run.get('trial')}", kind))
    return out


def plain_later_findings(report: dict) -> list[tuple[str, str, str, str]]:
    """(arm, run, probe, kind) of later_findings for the plain arms: what a later run of each counts against it."""
    return _plain_later(report)


def scenario_later_findings(report: dict) -> list[tuple[str, str, str, str]]:
    """(scenario, arm, run, kind) of later_findings for the scenarios."""
    return _scenario_later(report)


def later_errors(report: dict) -> list[tuple[str, str, str]]:
    """(arm, run, kind) of every later run of a plain arm (a trial 2..N, the re-run alone) that ended in ERROR."""
    return [
        (arm["name"], label, _error_kind(run))
        for arm in report["arms"]
        for label, run in _later_runs(arm)
        if run.get("verdict") == ERROR
    ]


def scenario_later_errors(report: dict) -> list[tuple[str, str, str, str]]:
    """(scenario, arm, run, kind) of every later trial of a (scenario, arm) that ended in ERROR."""
    return [
        (str(sc.get("name")), str(arm.get("arm")), f"trial {run.get('trial')}", _error_kind(run))
        for sc in report.get("scenarios") or []
        for arm in sc.get("arms") or []
        for run in (arm.get("trials") or {}).get("runs") or []
        if run.get("trial") != 1 and run.get("verdict") == ERROR
    ]


def idle_members(report: dict) -> list[tuple[str, str]]:
    """(arm, 'member i Connector') of every MultiConnector member that served no reuse (repro.judge.members: INCONCLUSIVE,
    not exercised). No fixture states a member's verdict, so each is INCONCLUSIVE outside the expectations: exit 1."""
    return [
        (str(arm["name"]), f"member {m.get('index')} {m.get('connector')}")
        for arm in report["arms"]
        if arm.get("verdict") != ERROR  # an ERROR arm is exit 3 already, and its members were never judged
        for m in arm.get("members") or []
        if isinstance(m, dict) and not m.get("reuses_served") and m.get("verdict") != PASS
    ]


def unexcused_findings(report: dict) -> list[tuple[str, str, str]]:
    """(arm, where, finding) of every request the judge gave a finding that no fixture's FAIL excuses
    (repro.judge.verdict.FINDINGS: a tenant-isolation failure, an answer changed with no hit reported), worst finding
    first, then in report order: a plain arm's probe (where: the probe) and a scenario's request (where: 'scenario
    NAME step K PROBE'). A fixture that states FAIL there makes its acceptance match; the exit is 1 all the same."""
    found = [
        (str(arm["name"]), str(p.get("name")), str(p["finding"]))
        for arm in report["arms"]
        if arm.get("mode") != "baseline"
        for p in arm.get("probes") or []
        if p.get("finding") in FINDINGS
    ]
    found += [
        (str(arm.get("arm")), f"scenario {sc.get('name')} step {r.get('step')} {r.get('probe')}", str(r["finding"]))
        for sc, arm in scenario_arms(report)
        for r in arm.get("requests") or []
        if isinstance(r, dict) and r.get("finding") in FINDINGS
    ]
    return sorted(found, key=lambda f: FINDINGS.index(f[2]))


def findings_reason(found: list[tuple[str, str, str]]) -> str:
    """'tenant-isolation failure: ExampleConnector short-b; differs with no reported hit: Conn p' (each finding once,
    its places after it)."""
    parts = []
    for finding in FINDINGS:
        where = [f"{arm} {at}" for arm, at, f in found if f == finding]
        if where:
            parts.append(f"{FINDING_WORDS[finding]}: {_some(where)}")
    return "; ".join(parts)


def trial_findings(report: dict) -> list[tuple[str, str]]:
    """(arm, probe) of a plain arm's finding that only a later run made (later_findings), once each."""
    return list(dict.fromkeys((arm, probe) for arm, _, probe, _ in _plain_later(report)))


def scenario_trial_findings(report: dict) -> list[tuple[str, str]]:
    """(scenario, arm) where a later trial found a kind of finding (a FAIL, a KV finding) that its own
    run did not show (later_findings)."""
    return list(dict.fromkeys((scenario, arm) for scenario, arm, _, _ in _scenario_later(report)))


def run_errors(report: dict) -> list[str]:
    """Every ERROR anywhere in the run, each once, as 'where: kind': an arm, a trial, the re-run alone, a scenario's
    control, a (scenario, arm) or its trial, with or without an `error` object (an arm that could not be compared,
    that had no baseline, a result without its scenario, is ERROR without one), and the report's own errors."""
    found: dict[str, str] = {}
    if not report.get("complete", False):
        found["the run"] = "the report is not complete"
    for arm in report["arms"]:
        name = arm["name"]
        if arm.get("verdict") == ERROR:
            found.setdefault(name, _error_kind(arm))
        for label, run in _later_runs(arm):
            if run.get("verdict") == ERROR:
                found.setdefault(f"{name} ({label})", _error_kind(run))
    for where, kind in _scenario_errors(report).items():
        found.setdefault(where, kind)
    for e in report.get("errors") or []:
        found.setdefault(str(e.get("arm")), str(e.get("kind")))
    return [f"{where}: {kind}" for where, kind in found.items()]


def _scenario_errors(report: dict) -> dict[str, str]:
    """Where -> kind of every ERROR in the report's scenarios section (a control, a (scenario, arm), a trial)."""
    found: dict[str, str] = {}
    for sc in report.get("scenarios") or []:
        control = sc.get("control") or {}
        if control.get("status") == "error":
            found.setdefault(f"baseline (scenario {sc.get('name')})", str(control.get("error") or ERROR).split(":")[0])
        for which in ("reference", "reuse_control"):  # a load scenario's other runs (repro.run.load_scenario)
            got = (sc.get("load") or {}).get(which) or {}
            if got.get("status") == "error":
                found.setdefault(
                    f"{which.replace('_', ' ')} (scenario {sc.get('name')})",
                    str(got.get("error") or ERROR).split(":")[0],
                )
        for arm in sc.get("arms") or []:
            where = f"{arm.get('arm')} (scenario {sc.get('name')})"
            if arm.get("verdict") == ERROR:
                found.setdefault(where, _error_kind(arm))
            for run in (arm.get("trials") or {}).get("runs") or []:
                if run.get("trial") != 1 and run.get("verdict") == ERROR:
                    found.setdefault(f"{where[:-1]}, trial {run.get('trial')})", _error_kind(run))
    return found


def _error_kind(entry: dict) -> str:
    """An ERROR's kind ('timeout'), or the first reason of an ERROR that has no error object."""
    error = entry.get("error")
    if isinstance(error, dict) and error.get("kind"):
        return str(error["kind"])
    reasons = entry.get("reasons") or []
    return f"{ERROR} ({reasons[0]})" if reasons else ERROR


def _scenario_reason(report: dict) -> tuple[int, str] | None:
    """The scenarios' own part of the exit rule beyond ERRORs and later findings: a KV finding the fixture did
    not state, an acceptance not matched, or without the acceptance suite a verdict other than PASS or SKIPPED
    (None: nothing)."""
    pairs = scenario_arms(report)
    if not pairs:
        return None
    found = _scenario_kv_reason(report)
    if found is not None:
        return found
    acc = (report.get("acceptance") or {}).get("scenarios") or {"matched": None}
    if acc.get("matched") is None:
        bad = [
            f"{sc['name']} {arm['arm']} {arm['verdict']}" for sc, arm in pairs if arm["verdict"] not in (PASS, SKIPPED)
        ]
        return (EXIT_MISMATCH, "no acceptance suite, and scenario verdicts not PASS: " + _some(bad)) if bad else None
    if acc["matched"]:
        return None
    return EXIT_MISMATCH, "scenario acceptance not matched: " + _some(_acceptance_misses(acc, "scenario"))


def _scenario_kv_reason(report: dict) -> tuple[int, str] | None:
    """A scenario KV finding (CORRUPT, FOREIGN, MISPLACED) that the fixture did not state, as an exit and its reason;
    None: none."""
    acc = (report.get("acceptance") or {}).get("scenarios") or {"matched": None}
    excused = excused_scenario_kv(acc)
    found = [
        (f"{sc['name']} {arm['arm']}", str(scenario_kv_verdict(arm)))
        for sc, arm in scenario_arms(report)
        if scenario_kv_verdict(arm) in KV_FINDINGS and (sc["name"], arm["arm"]) not in excused
    ]
    return (EXIT_MISMATCH, "scenario " + _kv_reason(found)) if found else None


def scenario_exit(report: dict) -> int | None:
    """The scenarios' part of the exit code (None: they have none, or all are good): the exit rule
    (exit_reason) applied to the scenarios section alone."""
    if not scenario_arms(report):
        return None
    if _scenario_errors(report):
        return EXIT_RUNTIME
    if scenario_trial_findings(report) or upstream_changes(report, scenarios_only=True):
        return EXIT_MISMATCH
    if any(at.startswith("scenario ") for _, at, _ in unexcused_findings(report)):
        return EXIT_MISMATCH
    found = _scenario_reason(report)
    return found[0] if found else None


def _some(items: list[str], n: int = 3) -> str:
    return "; ".join(items[:n]) + (f"; and {len(items) - n} more" if len(items) > n else "")


def _kv_reason(found: list[tuple[str, str]], stated: set[str] = frozenset()) -> str:
    """'KV CORRUPT that the fixture does not state: A p; B q' from (where, KV finding) pairs; with more than one
    class, each where says its own: 'KV CORRUPT and MISPLACED that …: A p (CORRUPT); B q (MISPLACED)'. stated: the
    wheres whose finding the fixture does state, unexcused only because its acceptance did not match; named so
    where every finding is one of them, never called unstated."""
    unstated = [(where, kind) for where, kind in found if where not in stated]
    shown = unstated or found
    classes = [v for v in KV_FINDINGS if any(kind == v for _, kind in shown)]
    named = " and ".join(classes) if len(classes) < 3 else f"{', '.join(classes[:-1])} and {classes[-1]}"
    items = [where if len(classes) == 1 else f"{where} ({kind})" for where, kind in shown]
    if unstated:
        return f"KV {named} that the fixture does not state: " + _some(items)
    return f"KV {named} that the fixture states, not excused while its acceptance does not match: " + _some(items)


def _stated_kv(acceptance: dict) -> set[str]:
    """'arm probe' of every KV finding the fixture's expectation states, whether or not the acceptance matched."""
    return {
        f"{c['arm']} {c['probe']}"
        for c in acceptance.get("checked", [])
        if c.get("check") == "kv"
        and c.get("observed") in KV_FINDINGS
        and expectation_states(c.get("expected"), str(c.get("observed")))
    }


def _acceptance_misses(acc: dict, what: str) -> list[str]:
    """What kept an acceptance from matching, as short phrases."""
    key = "scenario" if what == "scenario" else "probe"
    out = [
        f"{c.get('arm')} {c.get(key)} {c.get('check', 'tokens')}: expected {expectation_text(c.get('expected'))}, observed {c.get('observed')}"
        for c in acc.get("checked", [])
        if not c.get("ok")
    ]
    out += [f"{a} not listed by the fixture" for a in acc.get("unchecked_arms", [])]
    out += [
        f"{u['arm']} {u.get(key)} {u.get('check')} not listed by the fixture (observed {u.get('observed')})"
        for u in acc.get("unchecked_probes" if what != "scenario" else "unchecked", [])
    ]
    return out or ["nothing was checked"]


def exit_reason(report: dict) -> tuple[int, str]:
    """The exit code and why, one rule for plain arms and scenarios alike (docs/verdicts.md#exit-codes):
    3 for any ERROR anywhere (an arm, a trial, the re-run alone, a scenario's control or run; run_errors);
    1 for any FAIL or KV finding that a later run made and trial 1 did not already show of the same kind
    (later_findings), for a request the judge gave a finding no fixture's FAIL excuses (a tenant-isolation failure, an
    answer changed with no hit reported: unexcused_findings), for a KV finding (CORRUPT, FOREIGN, MISPLACED) the
    fixture did not state (plain arms or
    scenarios), for an upstream bound that is a change to look at (fixed upstream, a wrong bound, one that cannot be
    decided: repro.judge.upstream; with or without the suite), for a MultiConnector member never exercised
    (INCONCLUSIVE, which no fixture states: idle_members), for an acceptance not matched, and without the
    acceptance suite for a verdict other than PASS; else 0. The reason is the first of these that holds; an upstream
    bound to look at is named after it where another reason came first, so that no other reason hides it."""
    code, why = _first_reason(report)
    changed = _some([str(u.get("text")) for u in upstream_changes(report)])
    if changed and why != changed:
        why += f"; and {changed}"
    return code, why


def _first_reason(report: dict) -> tuple[int, str]:
    """exit_reason's code and the first reason of its order."""
    errors = run_errors(report)
    if errors:
        return EXIT_RUNTIME, f"{len(errors)} ERROR{'s' if len(errors) > 1 else ''}: " + _some(errors)
    later = later_findings(report)
    if later:
        found = [f"{arm} {run}: {what} {kind}" for arm, run, what, kind in later]
        return EXIT_MISMATCH, "a later run found what the arm's own run did not show: " + _some(found)
    found = unexcused_findings(report)
    if found:  # stated by a fixture or not: a matched acceptance is the kit's self-check, not the stack's verdict
        return EXIT_MISMATCH, findings_reason(found)
    kv = [(f"{a['name']} {p['name']}", str(kv_verdict(p))) for a, p in unexpected_kv_findings(report)]
    if kv:
        return EXIT_MISMATCH, _kv_reason(kv, _stated_kv(report.get("acceptance") or {}))
    scen_kv = _scenario_kv_reason(report)
    if scen_kv is not None:
        return scen_kv
    changed = upstream_changes(report)
    if changed:
        return EXIT_MISMATCH, _some([str(u.get("text")) for u in changed])
    idle = idle_members(report)
    if idle:
        named = [f"{arm} {member}" for arm, member in idle]
        return EXIT_MISMATCH, f"{INCONCLUSIVE}: MultiConnector member not exercised (served no reuse): " + _some(named)
    scen = _scenario_reason(report)
    if scen is not None:
        return scen
    acc = report["acceptance"]
    if acc["matched"] is None:
        bad = [f"{a['name']} {a['verdict']}" for a in report["arms"] if a["verdict"] != PASS]
        if bad:
            return EXIT_MISMATCH, "no acceptance suite, and verdicts not PASS: " + _some(bad)
        return EXIT_OK, "every verdict PASS (no acceptance suite)"
    if not acc["matched"]:
        return EXIT_MISMATCH, "acceptance not matched: " + _some(_acceptance_misses(acc, "arms"))
    unchecked = set(acc.get("unchecked_arms", []))
    bad = [f"{a['name']} {a['verdict']}" for a in report["arms"] if a["name"] in unchecked and a["verdict"] != PASS]
    if bad:
        return EXIT_MISMATCH, "verdicts no fixture expectation covers: " + _some(bad)
    return EXIT_OK, "acceptance matched: every verdict as the fixture states"


def exit_code(report: dict) -> int:
    """0 all good; 1 a finding the fixture does not state, an upstream bound to look at, or acceptance not matched;
    3 an ERROR anywhere (exit_reason says why)."""
    return exit_reason(report)[0]
