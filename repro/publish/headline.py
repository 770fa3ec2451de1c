"""The headline: one generated sentence per report that states its finding, its stack and its strength, e.g.
'LMCacheConnectorV1 (LMCache 0.5.4, vLLM 0.28.0, NVIDIA H200, SmolLM2-135M-Instruct) answered differently after a
reported cache hit on 2 of 4 probes and loaded corrupt KV on 4 of 4; LMCacheMPConnector PASS; native prefix
caching bit-exact'. It leads the index, every report page's title, the issue's title and the kit's README.

Pure: read from the read model (repro.readmodel), never hard-coded, and honest for every case: a FAIL, a PASS, an
INCONCLUSIVE or an ERROR arm, scenario runs that are not a plain PASS (an ERROR included), a report without the
KV audit, a CPU report and the planted-fault self-test (which says it is one).
"""

from __future__ import annotations

import re
from pathlib import PurePath

from repro.judge.verdict import (
    CORRUPT,
    ERROR,
    EXACT,
    FAIL,
    FINDING_WORDS,
    FINDINGS,
    FOREIGN,
    INCONCLUSIVE,
    KV_FINDINGS,
    MISPLACED,
    NO_HIT_DIFFERS,
    NUMERIC,
    PASS,
    SKIPPED,
    TENANT_ISOLATION,
    UNAVAILABLE,
)
from repro.readmodel import Arm, Report, ScenarioArm, as_report
from repro.record.exit_rule import (
    idle_members,
    later_errors,
    plain_later_findings,
    scenario_later_errors,
    scenario_later_findings,
)

PLANTED_CONNECTOR = "PlantedFaultConnector"  # repro.engine.connectors.planted_fault's connector class
NO_FAULT = "none"  # its `fault` setting that plants nothing (the self-test's control)
# What acceptance.matched is, wherever it is shown: the kit checking itself, not the stack's verdict.
ACCEPTANCE_MEANS = "the kit's self-check against the fixture's expectations"
EXPLORATORY = "exploratory run"  # a run whose fixture states no expected verdict, where acceptance would stand
# How the headline names a finding no fixture's FAIL excuses (repro.judge.verdict.FINDINGS): a salt changes no
# answer, so a tenant-isolation failure is said by what was served, never as "answered differently".
FINDING_HEADLINE = {
    TENANT_ISOLATION: f"served another tenant's KV across cache salts ({FINDING_WORDS[TENANT_ISOLATION]})",
    NO_HIT_DIFFERS: f"reported no cache hit yet answered differently ({FINDING_WORDS[NO_HIT_DIFFERS]})",
}
# How the headline names what a reuse loaded, by KV class (repro.judge.verdict), worst first.
KV_WORDS = {CORRUPT: "corrupt", FOREIGN: "foreign", MISPLACED: "misplaced"}
_VERSION_PART = re.compile(r"(\d+)|([a-z]+)")


def version_key(text: str) -> tuple:
    """'0.5.5rc5' < '0.5.5' < '0.5.6' < '0.28.0': numbers compared as numbers, a pre-release before its release;
    an unknown version ('—', '?') sorts below every known one."""
    parts: list[tuple[int, int | str]] = []
    for number, word in _VERSION_PART.findall(str(text).lower()):
        parts.append((1, int(number)) if number else (0, word))
    return (bool(parts), tuple(parts + [(1, -1)]))  # a release ends higher than its rc ('rc' sorts as 0 < 1)


def stack_key(report: Report) -> tuple:
    """The index's order, newest stack first when sorted descending: vLLM, then LMCache, then the start time."""
    return (
        version_key(report.package_version("vllm")),
        version_key(report.package_version("lmcache")),
        str(report.provenance.get("started_utc", "")),
    )


def model_label(report: Report) -> str:
    """'SmolLM2-135M-Instruct' (a packaged model's title), else the model folder's name: never a machine path."""
    model = report.provenance.get("model")
    model = model if isinstance(model, dict) else {}
    source = model.get("source") if isinstance(model.get("source"), dict) else {}
    name = source.get("title") or PurePath(str(model.get("name") or report.config.get("model") or "")).name
    return str(name) or "model not recorded"


def uses_lmcache(arm: Arm) -> bool:
    """The arm's connector names LMCache (LMCacheConnectorV1, LMCacheMPConnector, …)."""
    return "lmcache" in str(arm.connector_name or "").lower()


def stack_text(report: Report) -> str:
    """'LMCache 0.5.4, vLLM 0.28.0, NVIDIA H200, SmolLM2-135M-Instruct': LMCache only where an arm used it (llama.cpp's
    runs name llama.cpp where vLLM stands)."""
    parts = [f"LMCache {report.package_version('lmcache')}"] if any(uses_lmcache(a) for a in report.arms) else []
    parts += [report.engine_text, report.hardware_label, model_label(report)]
    return ", ".join(parts)


def planted_fault_of(arm: Arm) -> str | None:
    """The fault a planted-fault arm plants ('zero_blocks', 'none'); None for any other arm."""
    if arm.connector_name != PLANTED_CONNECTOR:
        return None
    extra = (arm.data.get("connector") or {}).get("extra_config") or {}
    return str(extra.get("fault") or "?")


def _name(arm: Arm) -> str:
    """The arm as the headline names it: the connector, or the planted fault it is."""
    fault = planted_fault_of(arm)
    if arm.approximation:  # a documented approximation, run as a positive control: named so, never as corruption
        return f"{arm.name} ({arm.approximation})"
    if fault is None:
        return arm.name if arm.mode != "native" else "shape-matched native" if arm.matched_to else arm.title
    return f"{arm.name} (planted fault: {fault})" if fault != NO_FAULT else f"{arm.name} (planted connector, no fault)"


def _compared(arm: Arm) -> list:
    return [p for p in arm.probes if p.verdict != SKIPPED]


def _token_clause(arm: Arm, lead: bool) -> str:
    """What the arm's answers did: 'answered differently after a reported cache hit on 2 of 4 probes'."""
    probes = _compared(arm)
    n = len(probes)
    if arm.verdict == ERROR:
        kind = (arm.error or {}).get("kind")
        return f"ended in {ERROR}" + (f" ({kind})" if kind else "") + ", no verdict"
    if arm.verdict == FAIL:
        k = sum(p.verdict == FAIL and not p.finding for p in probes)
        hit = " after a reported cache hit" if lead else ""
        ties = " (near-ties only)" if arm.near_ties_only else ""
        qualified = arm.conditions.finding_class_text.split(":")[0] if arm.conditions.qualified else ""
        said = [f"{FINDING_HEADLINE[f]} on {m} of {n} probes" for f in FINDINGS if (m := _found(probes, f))]
        if k or not said:
            said.append(
                f"answered differently{hit} on {k} of {n} probes{ties}" + (f" ({qualified})" if qualified else "")
            )
        return " and ".join(said)
    if arm.verdict == INCONCLUSIVE:
        k = sum(p.verdict == INCONCLUSIVE for p in probes)
        return f"was {INCONCLUSIVE} on {k} of {n} probes (no verified hit or cold miss to judge by)"
    if arm.verdict == PASS and n:
        return f"matched caching off token for token on {n} of {n} probes" if lead else PASS
    return str(arm.verdict)


def _found(probes: list, finding: str) -> int:
    return sum(p.finding == finding for p in probes)


def _kv_clause(arm: Arm) -> str:
    """What the arm's reuses loaded: 'loaded corrupt KV on 4 of 4', 'bit-exact KV'; '' when nothing was audited."""
    verdicts = [p.kv_verdict for p in arm.probes if p.kv_verdict is not None]
    if not verdicts:
        return ""
    n = len(verdicts)
    found = [(KV_WORDS.get(v, v.lower()), verdicts.count(v)) for v in KV_FINDINGS if v in verdicts]
    if found and arm.approximation:  # the audit's class kept, the word 'corrupt' not: the engine documents it
        return (
            "loaded KV other than a cold prefill's ("
            + ", ".join(f"{v} on {verdicts.count(v)}" for v in KV_FINDINGS if v in verdicts)
            + f") of {n}"
        )
    if found:
        return "loaded " + " and ".join(f"{word} KV on {k}" for word, k in found) + f" of {n}"
    if set(verdicts) == {EXACT}:
        return "bit-exact KV"
    if set(verdicts) <= {EXACT, NUMERIC}:
        return "KV within its floor"
    k = verdicts.count(UNAVAILABLE)
    return f"KV unreadable ({UNAVAILABLE}) on {k} of {n}" if k else ""


def run_label(run: str) -> str:
    """A later run as the words name it: 'trial 2', 'the re-run alone'."""
    return "the re-run alone" if run == "alone" else run


def _runs_text(runs: list[str]) -> str:
    """'trial 2', 'trials 3, 4 and 5', 'trial 2 and the re-run alone'."""
    runs = list(dict.fromkeys(runs))
    numbers = [r.removeprefix("trial ") for r in runs if r.startswith("trial ")]
    said = [f"trial{'s' if len(numbers) > 1 else ''} {and_text(numbers)}"] if numbers else []
    return and_text(said + [run_label(r) for r in runs if not r.startswith("trial ")])


def later_facts(report: Report, arm: str) -> tuple[list[tuple[str, str, str]], list[tuple[str, str]], list[str]]:
    """What the exit rule counts against a plain arm beyond its own run (repro.record.exit_rule): (run, probe, kind)
    of each finding a later run made that trial 1 did not show, (run, kind) of each later run that ended in ERROR,
    and each MultiConnector member never exercised."""
    found = [(run, probe, kind) for a, run, probe, kind in plain_later_findings(report.data) if a == arm]
    errors = [(run, kind) for a, run, kind in later_errors(report.data) if a == arm]
    idle = [member for a, member in idle_members(report.data) if a == arm]
    return found, errors, idle


def later_text(report: Report, arm: str, words: bool = True) -> str:
    """What a plain arm's later runs and members count against it, as the headline says it ('answered differently
    in trial 2 on chat-511, ended in ERROR in trial 3 (timeout), member 1 OffloadingConnector not exercised') or,
    with words=False, as the summary does ('FAIL in trial 2 on chat-511, ERROR in trial 3 (timeout), …'); ''
    when nothing is. A later ERROR is named where the arm's own run was no ERROR (one that was says so already)."""
    found, errors, idle = later_facts(report, arm)
    parts = []
    for kind in [FAIL, *KV_FINDINGS]:
        mine = [(run, probe) for run, probe, k in found if k == kind]
        if not mine:
            continue
        probes = list(dict.fromkeys(p for _, p in mine))
        on = ", ".join(probes[:3]) + (f" and {len(probes) - 3} more" if len(probes) > 3 else "")
        runs = _runs_text([r for r, _ in mine])
        if words:
            what = "answered differently" if kind == FAIL else f"loaded {KV_WORDS[kind]} KV"
        else:
            what = FAIL if kind == FAIL else f"KV {kind}"
        parts.append(f"{what} in {runs} on {on}")
    own = next((a.verdict for a in report.arms if a.name == arm), None)
    # an ERROR arm says ERROR already; kind: 'timeout', or 'ERROR (its first reason)' for one without an error object
    for run, kind in errors if own != ERROR else []:
        why = kind.removeprefix(ERROR) if kind.startswith(ERROR) else f" ({kind})"
        parts.append(f"{'ended in ' if words else ''}{ERROR} in {run_label(run)}{why}")
    if idle:
        parts.append(f"{and_text(idle)} not exercised ({INCONCLUSIVE})")
    return ", ".join(parts)


def _arm_clause(arm: Arm, lead: bool, later: str = "") -> str:
    if later:  # a later run or a member counts against it: never 'matched', 'PASS' or 'bit-exact'
        if arm.verdict == PASS:
            kv = _kv_clause(arm)
            return later + (f", and its own run {kv}" if kv.startswith("loaded") else "")
        return f"{_arm_clause(arm, lead)}, and {later}"
    tokens, kv = _token_clause(arm, lead), _kv_clause(arm)
    if not lead and arm.verdict == PASS and kv == "bit-exact KV":
        return "bit-exact"  # 'native prefix caching bit-exact': PASS on every probe, every block bit-identical
    if not kv:
        return tokens
    if not lead and arm.verdict == PASS:
        return f"{tokens}, {kv}"
    return f"{tokens} {'and' if kv.startswith('loaded') else 'with'} {kv}"


def _severity(arm: Arm, later: str = "") -> int:
    """The lead arm is the one with the most to say: a finding, then an ERROR, INCONCLUSIVE, PASS (a PASS that a
    later run or a member counts against after the plain verdicts of its kind)."""
    finding = arm.verdict == FAIL or any(p.kv_finding for p in arm.probes)
    return 0 if finding else {ERROR: 1, INCONCLUSIVE: 2}.get(arm.verdict, 3 if later else 4)


def scenario_later_text(report: Report, scenario: str, arm: str, errors: bool = True) -> str:
    """What a (scenario, arm)'s later trials count against it (repro.record.exit_rule): 'FAIL in trial 2',
    'CORRUPT KV in trial 2 and trial 3', 'ERROR in trial 2' (with errors: where the run's own verdict is no ERROR,
    so that no text says the trials' ERRORs twice); '' when nothing is."""
    found = [(run, kind) for s, a, run, kind in scenario_later_findings(report.data) if (s, a) == (scenario, arm)]
    parts = []
    for kind in [FAIL, *KV_FINDINGS]:
        runs = [run for run, k in found if k == kind]
        if runs:
            parts.append(f"{kind if kind == FAIL else f'{kind} KV'} in {_runs_text(runs)}")
    crashed = [run for s, a, run, _ in scenario_later_errors(report.data) if (s, a) == (scenario, arm)]
    if crashed and errors:
        parts.append(f"{ERROR} in {_runs_text(crashed)}")
    return ", ".join(parts)


def _scenario_clause(report: Report) -> str:
    """'scenario preemption: ERROR for LMCacheConnectorV1 and LMCacheMPConnector'; the runs that are a plain PASS
    in every trial counted; '' for a report without scenarios. A SKIPPED run (the fixture says it cannot run) is
    left out."""
    said: dict[tuple[str, str], list[str]] = {}
    passes = 0
    for scenario in report.scenarios:
        for arm in scenario.arms:
            if arm.verdict == SKIPPED:
                continue
            later = scenario_later_text(report, scenario.name, str(arm.data.get("arm")), arm.verdict == PASS)
            text = _scenario_verdict(arm, later)
            if text == PASS:
                passes += 1
            else:
                said.setdefault((scenario.name, text), []).append(arm.title)
    parts = [f"scenario {name}: {and_text(arms)} {text}" for (name, text), arms in said.items()]
    if passes:
        parts.append(f"{passes} scenario run{'s' if passes > 1 else ''} {PASS}" + (" otherwise" if parts else ""))
    return "; ".join(parts)


def _scenario_verdict(arm: ScenarioArm, later: str = "") -> str:
    """'FAIL with corrupt KV', 'ERROR (trials: 2 of 2 ERROR)', 'PASS', 'FAIL in trial 2 (trials: …)': a scenario
    run's verdict and what qualifies it; a PASS that a later trial's finding or ERROR counts against is no PASS."""
    # with its findings no fixture's FAIL excuses, by request ('· tenant-isolation failure on …')
    text = arm.verdict_text
    if arm.kv_verdict in KV_FINDINGS:
        text += f" with {KV_WORDS[arm.kv_verdict]} KV"
    if later:
        text = later if arm.verdict == PASS else f"{text}, {later}"
    if arm.trials and arm.trials.errors:
        text += f" (trials: {arm.trials.errors} of {arm.trials.n} {ERROR})"
    return text


def and_text(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _audit_clause(report: Report) -> str:
    state = report.kv_audit_state
    if state is None:
        return "KV not audited (the report predates the audit)"
    return "" if state else "KV audit off"


def headline(report: Report | dict) -> str:
    """The report's finding in one sentence: the lead arm with its stack and its strength (how many probes of how
    many), every other reuse arm in a few words, the scenario runs that are not a plain PASS, the KV audit's absence,
    and each upstream bound that is a change to look at ('vllm-project/vllm#30931 fixed upstream: does not reproduce
    on vllm 0.32.0'). A planted-fault self-test says so first."""
    report = as_report(report)
    reuse = [a for a in report.reuse_arms if a.mode != "baseline"]
    planted = any(planted_fault_of(a) is not None for a in reuse)
    stack = stack_text(report)
    if not reuse:
        base = report.baseline
        return f"No reuse arm ran ({stack}); baseline {base.verdict if base else 'absent'}"
    later = {a.name: later_text(report, a.name) for a in reuse}
    connectors = sorted((a for a in reuse if a.mode != "native"), key=lambda a: _severity(a, later[a.name]))
    controls = [a for a in reuse if a.mode == "native"]
    ordered = connectors + controls if connectors else sorted(controls, key=lambda a: _severity(a, later[a.name]))
    lead, rest = ordered[0], ordered[1:]
    lead_later = later[lead.name]
    if planted:
        sentence = f"Planted-fault self-test ({stack}): {_name(lead)} {_arm_clause(lead, True, lead_later)}"
    else:
        sentence = f"{_name(lead)} ({stack}) {_arm_clause(lead, True, lead_later)}"
    parts = [sentence] + [f"{_name(a)} {_arm_clause(a, False, later[a.name])}" for a in rest]
    parts += [p for p in (_scenario_clause(report), _audit_clause(report)) if p]
    parts += [u.short for u in report.upstream_changes]  # an expected finding that no longer says what the run shows
    if report.data.get("complete") is False:
        parts.append("the run did not complete")
    return "; ".join(parts)


def acceptance_text(report: Report) -> str:
    """'acceptance.matched = false (the kit's self-check against the fixture's expectations: …)', saying what a
    false means so that it does not read as 'the run failed'."""
    label = report.acceptance_label()
    acc = report.acceptance
    unchecked = [str(a) for a in acc.get("unchecked_arms") or []]
    failed = [c for c in acc.get("checked") or [] if isinstance(c, dict) and not c.get("ok")]
    why = []
    if failed:
        why.append(f"{len(failed)} verdict(s) not as the fixture states")
    if unchecked:
        why.append(f"the fixture states nothing for {', '.join(unchecked)}")
    said = f": {'; '.join(why)}" if why and label == "false" else ""
    return f"acceptance.matched = {label} ({ACCEPTANCE_MEANS}{said}; not the stack's verdict)"
