"""The report: assembling the versioned JSON, acceptance, exit codes and the text summary.

Report schema (kind "kvkit-report"; JSON Schema in schemas/report.schema.json):
  schema_version 1: first version (example kept forever: tests/data/report-v1-example.json).
    Additions that old readers may ignore and old files lack (no version bump): acceptance
    .unchecked_probes, the failure kind result-version-mismatch.
  schema_version 2: the KV audit (example: tests/data/report-v2-example.json). config.kv_audit and
    config.keep_kv; per arm kv_audit (status, the measured floor, the KV layout); per probe kv (the
    KV verdict and its blame); per request kv_audit (the cold request's floor, each reuse's cells by
    block x layer x K/V plane, and what a non-exact cell's bytes equal); acceptance.checked items
    say which check they are ("tokens" or "kv"). All four kv fields are required in version 2
    (null where there is nothing to say).
    Additions to version 2 that old readers may ignore and old files lack (no version bump): the
    run's conditions (trials, confirm, lmcache_ops, gpu_load; cpu_load later) and provenance.lmcache_ops; per arm
    gpu, sharing (the other processes on its device and their overlap), copy_paths (each LMCache
    process: compiled ops or the torch fallback), trials (each run, rates per probe, the class) and
    confirmation (the same job re-run alone, and the class of the finding); diagnostics
    arms_wall_s, trials_wall_s and confirm_wall_s. Per reuse request replays (issue 19: null when it
    matched the baseline, else the runs of its tokens that are another probe's answer or an earlier
    request's, repro.judge.replays); a file without them shows no replays. provenance.model.source: where a
    model folder the kit converted from a packaged GGUF came from (repro.models: package and version,
    the GGUF's SHA-256, dequantized_from); absent for other models. config.frontend (--frontend: sync
    or async; absent: sync) and per arm effective_config.frontend (the front end that drove its engine).
    The failure kinds disk-runaway and disk-low (repro.run.diskwatch: a child stopped, or not started, to
    keep the disk from filling). Per connector arm and per (scenario, connector arm) store (repro.plan.arms: how
    its run's connector state was made fresh, each setting it rewrote to a directory of the run's own, or
    fresh false and why when a store may persist between runs), and in a confirmation that ran, independent
    (false when the run alone's store persisted; its reason then says so) and the run alone's store.
The schema is authoritative: validate_report checks every report before it is written (and the
cross-field shape of the KV audit, which JSON Schema cannot say).
A newer file is refused ("upgrade the kit"). A version 1 file loads as it is: version 2 only added
fields, and a report without them is shown as one made before the KV audit (no KV column, no
heatmap); no migration is needed or done.
"""

from __future__ import annotations

import json
from pathlib import Path

from repro.errors import EXIT_MISMATCH, EXIT_OK, EXIT_RUNTIME, UsageError
from repro.judge.verdict import (
    CELL_CORRUPT,
    CELL_EXACT,
    CELL_NUMERIC,
    CORRUPT,
    ERROR,
    FAIL,
    PASS,
    SKIPPED,
    expectation_met,
    expectation_states,
    expectation_text,
)
from repro.paths import SCHEMAS_DIR

REPORT_KIND = "kvkit-report"
REPORT_SCHEMA_VERSION = 2
# Every version load_report reads; older ones are refused (no migration exists).
READABLE_VERSIONS = (1, 2)
CLAIM_LINE = "claim_eligible=false; no performance claim"


def kv_verdict(probe: dict) -> str | None:
    """A probe's KV verdict as written (None: not audited)."""
    kv = probe.get("kv")
    return str(kv.get("verdict")) if isinstance(kv, dict) else None


def kv_findings(report: dict) -> list[tuple[dict, dict]]:
    """(arm, probe) of every probe whose KV verdict is CORRUPT, in report order."""
    return [
        (arm, probe)
        for arm in report["arms"]
        if arm["mode"] != "baseline"
        for probe in arm.get("probes") or []
        if kv_verdict(probe) == CORRUPT
    ]


def generations(arms: list[dict]) -> int:
    return sum(len(p["requests"]) for a in arms for p in a.get("probes", []))


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
    of them (repro.judge.verdict.expectation_met); each checked item keeps it as the fixture wrote it. Each
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
    """(arm, probe) of every CORRUPT KV verdict the acceptance did not expect: an expected CORRUPT
    is excused only when the fixture stated it for that arm and probe and acceptance matched."""
    excused = excused_kv_findings(report["acceptance"])
    return [(a, p) for a, p in kv_findings(report) if (a["name"], p["name"]) not in excused]


def excused_kv_findings(acceptance: dict) -> set[tuple[str, str]]:
    """(arm, probe) names whose CORRUPT KV verdict the fixture stated and a matched acceptance checked:
    observed CORRUPT, and CORRUPT is what the expectation (a verdict or a set) states."""
    return _excused(acceptance, "probe")


def _excused(acceptance: dict, what: str) -> set[tuple[str, str]]:
    """(arm, probe) ("probe") or (scenario, arm) ("scenario") of every KV item a matched acceptance checked
    whose observed CORRUPT its expectation states."""
    if not acceptance.get("matched"):
        return set()
    return {
        (c["arm"], c["probe"]) if what == "probe" else (c["scenario"], c["arm"])
        for c in acceptance.get("checked", [])
        if c.get("check") == "kv"
        and c.get("observed") == CORRUPT
        and expectation_states(c.get("expected"), CORRUPT)
        and c.get("ok")
    }


def _kinds(verdict: object, kv: object) -> set[str]:
    """The kinds of finding one probe (or one scenario run) shows: FAIL, CORRUPT."""
    return ({FAIL} if verdict == FAIL else set()) | ({CORRUPT} if kv == CORRUPT else set())


def _later_runs(arm: dict) -> list[tuple[str, dict]]:
    """(label, run summary) of every run of a plain arm beyond its own: trials 2..N, then the re-run alone."""
    runs = [(f"trial {r.get('trial')}", r) for r in (arm.get("trials") or {}).get("runs") or [] if r.get("trial") != 1]
    alone = (arm.get("confirmation") or {}).get("run")
    return runs + ([("alone", alone)] if isinstance(alone, dict) else [])


def later_findings(report: dict) -> list[tuple[str, str, str, str]]:
    """(arm, run, probe or "scenario <name>", kind) of every FAIL or CORRUPT that a later run (a trial 2..N, the
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
        own = _kinds(arm.get("verdict"), _scenario_kv(arm))
        for run in (arm.get("trials") or {}).get("runs") or []:
            if run.get("trial") == 1:
                continue
            for kind in sorted(_kinds(run.get("verdict"), run.get("kv")) - own):
                out.append((str(sc.get("name")), str(arm.get("arm")), f"trial {run.get('trial')}", kind))
    return out


def trial_findings(report: dict) -> list[tuple[str, str]]:
    """(arm, probe) of a plain arm's finding that only a later run made (later_findings), once each."""
    return list(dict.fromkeys((arm, probe) for arm, _, probe, _ in _plain_later(report)))


def scenario_arms(report: dict) -> list[tuple[dict, dict]]:
    """(scenario, arm entry) of every (scenario, arm) of a report's scenarios section, in report order."""
    return [(sc, arm) for sc in report.get("scenarios") or [] for arm in sc.get("arms") or []]


def _scenario_kv(arm: dict) -> str | None:
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
        if arm in expected_kv and _scenario_kv(entry) is not None and scenario not in expected_kv[arm]:
            unchecked.append({"arm": arm, "scenario": scenario, "observed": _scenario_kv(entry), "check": "kv"})
    ran = {sc["name"] for sc in sections}
    for check, table_of, observe in (
        ("tokens", expected, lambda e: e["verdict"]),
        ("kv", expected_kv, _scenario_kv),
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
    """(scenario, arm) whose CORRUPT KV verdict the fixture stated (expected_scenarios_kv: CORRUPT, or a set
    of findings holding it) and a matched scenario acceptance checked: a planted fault the scenario is meant
    to catch, as excused_kv_findings for the plain arms."""
    return _excused(acc, "scenario")


def scenario_trial_findings(report: dict) -> list[tuple[str, str]]:
    """(scenario, arm) where a later trial found a kind of finding (a FAIL, a CORRUPT KV verdict) that its own
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
    """The scenarios' own part of the exit rule beyond ERRORs and later findings: a CORRUPT KV verdict the
    fixture did not state, an acceptance not matched, or without the acceptance suite a verdict other than
    PASS or SKIPPED (None: nothing)."""
    pairs = scenario_arms(report)
    if not pairs:
        return None
    acc = (report.get("acceptance") or {}).get("scenarios") or {"matched": None}
    excused = excused_scenario_kv(acc)
    corrupt = [
        f"{sc['name']} {arm['arm']}"
        for sc, arm in pairs
        if _scenario_kv(arm) == CORRUPT and (sc["name"], arm["arm"]) not in excused
    ]
    if corrupt:
        return EXIT_MISMATCH, "scenario KV CORRUPT that the fixture does not state: " + _some(corrupt)
    if acc.get("matched") is None:
        bad = [
            f"{sc['name']} {arm['arm']} {arm['verdict']}" for sc, arm in pairs if arm["verdict"] not in (PASS, SKIPPED)
        ]
        return (EXIT_MISMATCH, "no acceptance suite, and scenario verdicts not PASS: " + _some(bad)) if bad else None
    if acc["matched"]:
        return None
    return EXIT_MISMATCH, "scenario acceptance not matched: " + _some(_acceptance_misses(acc, "scenario"))


def scenario_exit(report: dict) -> int | None:
    """The scenarios' part of the exit code (None: they have none, or all are good): the exit rule
    (exit_reason) applied to the scenarios section alone."""
    if not scenario_arms(report):
        return None
    if _scenario_errors(report):
        return EXIT_RUNTIME
    if scenario_trial_findings(report):
        return EXIT_MISMATCH
    found = _scenario_reason(report)
    return found[0] if found else None


def _some(items: list[str], n: int = 3) -> str:
    return "; ".join(items[:n]) + (f"; and {len(items) - n} more" if len(items) > n else "")


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
    1 for any FAIL or CORRUPT that a later run made and trial 1 did not already show of the same kind
    (later_findings), for a CORRUPT KV verdict the fixture did not state (plain arms or scenarios), for an
    acceptance not matched, and without the acceptance suite for a verdict other than PASS; else 0."""
    errors = run_errors(report)
    if errors:
        return EXIT_RUNTIME, f"{len(errors)} ERROR{'s' if len(errors) > 1 else ''}: " + _some(errors)
    later = later_findings(report)
    if later:
        found = [f"{arm} {run}: {what} {kind}" for arm, run, what, kind in later]
        return EXIT_MISMATCH, "a later run found what the arm's own run did not show: " + _some(found)
    kv = [f"{a['name']} {p['name']}" for a, p in unexpected_kv_findings(report)]
    if kv:
        return EXIT_MISMATCH, "KV CORRUPT that the fixture does not state: " + _some(kv)
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
    """0 all good; 1 a finding the fixture does not state, or acceptance not matched; 3 an ERROR anywhere
    (exit_reason says why)."""
    return exit_reason(report)[0]


def load_report(path: str | Path) -> dict:
    """Strict loading: the kind and version must be ones this kit writes."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"report {path}: cannot read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"report {path}: not valid JSON ({str(exc).splitlines()[0][:200]})") from None
    if not isinstance(data, dict) or data.get("kind") != REPORT_KIND:
        raise UsageError(f"report {path}: not a {REPORT_KIND} file")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise UsageError(f"report {path}: schema_version missing or not an integer")
    if version > REPORT_SCHEMA_VERSION:
        raise UsageError(
            f"report {path}: schema_version {version} is newer than this kit ({REPORT_SCHEMA_VERSION}): upgrade the kit"
        )
    if version not in READABLE_VERSIONS:
        raise UsageError(
            f"report {path}: schema_version {version} is older than any this kit wrote and no migration "
            f"exists: regenerate it (old versions are migrated only by an explicit command)"
        )
    for key, typ in (("arms", list), ("provenance", dict), ("acceptance", dict), ("errors", list)):
        if not isinstance(data.get(key), typ):
            raise UsageError(f"report {path}: field {key!r} missing or of the wrong type")
    for i, arm in enumerate(data["arms"]):
        if (
            not isinstance(arm, dict)
            or not all(isinstance(arm.get(k), str) for k in ("name", "mode", "verdict"))
            or not isinstance(arm.get("probes"), list)
            or not all(isinstance(p, dict) for p in arm["probes"])
        ):
            raise UsageError(f"report {path}: arms[{i}] is not an arm (name, mode, verdict, probes)")
    if version >= 2:
        problems = kv_audit_problems(data)
        if problems:
            raise UsageError(f"report {path}: {problems[0]}")
    return data


def kv_audit_problems(report: dict) -> list[str]:
    """What is wrong with a version-2 report's KV audit fields beyond what the schema says: each
    field an object or null, and every audited reuse's cell grids shaped layers x blocks, with
    counts that add up. Renderers index these grids, so the loader checks them too."""
    config = report.get("config")
    if not isinstance(config, dict) or not isinstance(config.get("kv_audit"), bool):
        return ["config.kv_audit missing or not true/false"]
    problems = []
    for i, arm in enumerate(report.get("arms") or []):
        if "kv_audit" not in arm or not isinstance(arm["kv_audit"], (dict, type(None))):
            problems.append(f"arms[{i}].kv_audit missing or not an object or null")
        for j, probe in enumerate(arm.get("probes") or []):
            where = f"arms[{i}].probes[{j}]"
            if "kv" not in probe or not isinstance(probe["kv"], (dict, type(None))):
                problems.append(f"{where}.kv missing or not an object or null")
            requests = probe.get("requests")
            for k, req in enumerate(requests if isinstance(requests, list) else []):
                if not isinstance(req, dict) or "kv_audit" not in req:
                    problems.append(f"{where}.requests[{k}].kv_audit missing")
                elif isinstance(req["kv_audit"], dict):
                    problems += [f"{where}.requests[{k}].kv_audit: {p}" for p in _grid_problems(req["kv_audit"])]
                elif req["kv_audit"] is not None:
                    problems.append(f"{where}.requests[{k}].kv_audit is not an object or null")
    return problems


def _grid_problems(audit: dict) -> list[str]:
    """An audited reuse: planes K and V, each with a class string, rel and max_abs row per layer,
    one entry per block; counts equal to the classes' tally. Other statuses have no grid."""
    if audit.get("status") != "audited":
        return []
    layers, blocks, planes = audit.get("layers"), audit.get("num_blocks"), audit.get("planes")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (layers, blocks)):
        return ["layers and num_blocks must be counts"]
    if not isinstance(planes, dict) or set(planes) != {"K", "V"}:
        return ["an audited reuse needs planes K and V"]
    tally = {CELL_EXACT: 0, CELL_NUMERIC: 0, CELL_CORRUPT: 0}
    for name in ("K", "V"):
        plane = planes[name]
        if not isinstance(plane, dict):
            return [f"plane {name} is not an object"]
        for key, row_type in (("class", str), ("rel", list), ("max_abs", list)):
            rows = plane.get(key)
            if not isinstance(rows, list) or len(rows) != layers or not all(_sized(r, row_type, blocks) for r in rows):
                return [f"planes.{name}.{key} must be {layers} rows (layers) of {blocks} entries (blocks)"]
        for row in plane["class"]:
            if set(row) - set(tally):
                return [f"planes.{name}.class rows must be strings of {', '.join(tally)}"]
            for c in row:
                tally[c] += 1
    counts = audit.get("counts")
    want = {"exact": tally[CELL_EXACT], "numeric": tally[CELL_NUMERIC], "corrupt": tally[CELL_CORRUPT]}
    if not isinstance(counts, dict) or {k: counts.get(k) for k in want} != want:
        return [f"counts {counts} do not match the cells' classes {want}"]
    return []


def _sized(row: object, row_type: type, n: int) -> bool:
    return isinstance(row, row_type) and len(row) == n


def validate_report(report: dict) -> None:
    """Check a report against schemas/report.schema.json before it is written: the schema is the
    authority on the report's shape, and a report that breaks it is a kit bug (ReportInvalid)."""
    import jsonschema  # a dependency of vLLM, so present wherever the verifier runs

    schema = json.loads((SCHEMAS_DIR / "report.schema.json").read_text(encoding="utf-8"))
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(report))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise ReportInvalid(f"the report does not match schemas/report.schema.json at {where}: {error.message[:300]}")
    problems = kv_audit_problems(report) if report.get("schema_version", 0) >= 2 else []
    if problems:
        raise ReportInvalid(f"the report's KV audit is malformed: {problems[0][:300]}")


class ReportInvalid(Exception):
    """A report the kit built breaks its own schema (a kit bug; nothing is written)."""
