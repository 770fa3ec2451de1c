"""The text summary the verifier prints at the end of a run: the headline sentence the site and the kit lead with
(repro.publish.headline), then one line per arm and probe, read from the read model (repro.readmodel). Every
INCONCLUSIVE (a probe, an arm, the baseline, a scenario run or request) says why on its line or the lines under it,
an acceptance that did not match names what it did not check, and a planted fault caught as the fixture expects
says so in words on its arm's line."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

from repro.judge.expectations import expectation_states, expectation_text
from repro.judge.verdict import CORRUPT, ERROR, FAIL, INCONCLUSIVE, KV_FINDINGS, PASS, SKIPPED
from repro.publish.headline import (
    NO_FAULT,
    headline,
    later_facts,
    later_text,
    planted_fault_of,
    scenario_later_text,
)
from repro.readmodel import Arm, Probe, Report, Scenario, ScenarioArm, StepRequest, as_report
from repro.readmodel.scenario_load import SUMMARY_REQUESTS, arm_rates_text, controls_text, spec_text
from repro.record.report import CLAIM_LINE

VERDICT_COLUMN = 20  # the summary's token-verdict column before the KV column, at least
LINE_CHARS = 400  # a summary line, at most: a longer line is cut, but an INCONCLUSIVE's reasons wrap instead
NO_REASON = "no reason recorded"  # an INCONCLUSIVE whose record gives none says so, never nothing
LISTED = 5  # acceptance items named before "and N more"
AS_EXPECTED = "as the fixture expects"  # said of a planted fault's finding only where the acceptance record says it


def why_lines(reasons: Iterable[object], indent: str, head: str = "why: ") -> list[str]:
    """'    why: cold request reported 1408 cached tokens: not a verified miss': a verdict's reasons under its line, each
    once and in order, wrapped at LINE_CHARS (a reason is never cut); NO_REASON when it has none."""
    text = "; ".join(dict.fromkeys(str(r) for r in reasons)) or NO_REASON
    return textwrap.wrap(text, LINE_CHARS, initial_indent=indent + head, subsequent_indent=indent + "  ",
                         break_on_hyphens=False)  # fmt: skip


def acceptance_lines(acceptance: Mapping[str, Any]) -> list[str]:
    """What kept the acceptance from matching, by name: the checks the run did not meet (a misspelled probe shows
    as observed None), the arms the fixture states no verdict for, and the probes its expectations do not list;
    [] when it matched or no suite ran."""
    if acceptance.get("matched") is not False:
        return []
    failed = [f"{c.get('arm')} {c.get('probe')} {c.get('check', 'tokens')}: expected "
              f"{expectation_text(c.get('expected'))}, observed {c.get('observed')}"
              for c in acceptance.get("checked") or [] if isinstance(c, Mapping) and not c.get("ok")]  # fmt: skip
    arms = [str(a) for a in acceptance.get("unchecked_arms") or []]
    probes = [f"{u.get('arm')} {u.get('probe')} ({u.get('check')}, observed {u.get('observed')})"
              for u in acceptance.get("unchecked_probes") or [] if isinstance(u, Mapping)]  # fmt: skip
    said = [
        ("acceptance: not as the fixture states: ", failed),
        ("acceptance: unchecked arms (the fixture states no verdict for them): ", arms),
        ("acceptance: unchecked probes (the fixture's expectations for their arm do not list them): ", probes),
    ]
    return [line for head, items in said if items for line in why_lines([_some(items)], "", head)]


def _some(items: list[str]) -> str:
    return "; ".join(items[:LISTED]) + (f"; and {len(items) - LISTED} more" if len(items) > LISTED else "")


def _arm_why(arm: Arm) -> list[str]:
    """An INCONCLUSIVE arm's reasons that no line under it gives (its INCONCLUSIVE probes' and its members' do);
    NO_REASON when nothing under it says why either."""
    if arm.verdict != INCONCLUSIVE:
        return []
    probes = [p.name for p in arm.probes if p.verdict == INCONCLUSIVE]
    members = [str(r) for m in arm.members for r in m.data.get("reasons") or []]
    own = [r for r in arm.reasons if r not in members and not any(r.startswith(f"{n}: ") for n in probes)]
    return why_lines(own, "  ") if own or not (probes or any(m.verdict != PASS for m in arm.members)) else []


def _undecided_lines(requests: list[StepRequest]) -> list[str]:
    """The INCONCLUSIVE requests past a load scenario's listed ones: every reason once, with how many gave it."""
    if not requests:
        return []
    counts: dict[str, int] = {}
    for r in requests:
        for reason in r.reasons or (NO_REASON,):
            counts[reason] = counts.get(reason, 0) + 1
    head = f"{len(requests)} of them INCONCLUSIVE: "
    return why_lines([f"{reason} (×{n})" for reason, n in counts.items()], "        ", head)


def _probe_line(probe: Probe, kv: str | None, width: int = VERDICT_COLUMN) -> str:
    head = f"  {probe.title:<10} {probe.tokens_text:>5}  {probe.cached_cell:<12} "
    if kv is None:  # a report without the KV audit keeps the line it always had
        return f"{head}{probe.tokens_verdict}"
    return f"{head}{probe.tokens_verdict:<{width}} KV {kv}"


def _arm_verdict(report: Report, arm: Arm) -> str:
    """'PASS', 'FAIL (decisive: 6)'; where a later run or a member counts against the arm (the exit rule's
    later findings, later ERRORs, members never exercised), that first: 'FAIL in trial 2 on a · its own run
    (trial 1): PASS · …', never a bare PASS over what the exit code counts."""
    later = later_text(report, arm.name, words=False)
    if not later:
        kv = _own_kv_findings(arm) if arm.verdict == PASS else ""
        return f"{kv} · its tokens: {arm.verdict_text}" if kv else arm.verdict_text
    found, errors, idle = later_facts(report, arm.name)
    own = "its own run (trial 1)" if found or errors else "its tokens"
    text = arm.verdict_text.split(" · not exercised: ")[0] if idle else arm.verdict_text  # said in `later`
    return f"{later} · {own}: {text}" if arm.verdict == PASS else f"{text} · {later}"


def planted_fault_caught(report: Report, arm: Arm) -> str | None:
    """The fault ('zero_blocks') a planted-fault arm's own run caught as intended, read from the acceptance record,
    never from the arm's name: the acceptance matched, every check of the arm is met, each finding of its own run (a
    FAIL, a KV finding) is one a check states for that probe, and no later run or member counts against it; None
    otherwise, so that an unexpected finding never reads as expected. The summary's arm line says it in words
    (_caught_text), the index's picture colours its cell by it (repro.publish.site_overview)."""
    acc = report.acceptance
    if acc.get("matched") is not True or any(later_facts(report, arm.name)):
        return None
    found = [(p.name, "tokens", FAIL) for p in arm.probes if p.verdict == FAIL]
    found += [(p.name, "kv", p.kv_verdict) for p in arm.probes if p.kv_finding]
    checks = [c for c in acc.get("checked") or [] if isinstance(c, Mapping) and c.get("arm") == arm.name]
    return _caught_fault(planted_fault_of(arm), arm.verdict, found, checks, "probe")


def _scenario_fault_caught(report: Report, scenario: Scenario, arm: ScenarioArm) -> str | None:
    """planted_fault_caught for a planted-fault arm's run of a scenario, read from the scenarios' acceptance."""
    acc = report.scenario_acceptance
    if acc.get("matched") is not True or scenario_later_text(report, scenario.name, arm.name):
        return None
    plain = next((a for a in report.arms if a.name == arm.name), None)
    found = [(scenario.name, "tokens", FAIL)] if arm.verdict == FAIL else []
    found += [(scenario.name, "kv", arm.kv_verdict)] if arm.kv_verdict in KV_FINDINGS else []
    checks = [c for c in acc.get("checked") or []
              if isinstance(c, Mapping) and (c.get("arm"), c.get("scenario")) == (arm.name, scenario.name)]  # fmt: skip
    return _caught_fault(planted_fault_of(plain) if plain else None, arm.verdict, found, checks, "scenario")


def _caught_fault(fault: str | None, verdict: str, found: list[tuple], checks: list[Mapping], key: str) -> str | None:
    """fault, where every finding, (probe or scenario, check, observed), is one a met check states; else None."""
    if fault in (None, NO_FAULT) or verdict not in (FAIL, PASS) or not found or not all(c.get("ok") for c in checks):
        return None
    stated = {(c.get(key), c.get("check", "tokens"), c.get("observed")) for c in checks
              if expectation_states(c.get("expected"), str(c.get("observed")))}  # fmt: skip
    return fault if set(found) <= stated else None


def _caught_text(fault: str | None) -> str:
    """' — the planted fault (zero_blocks) caught, as the fixture expects': what an arm's line adds for a planted
    fault caught as intended; '' for none."""
    return f" — the planted fault ({fault}) caught, {AS_EXPECTED}" if fault else ""


def _own_kv_findings(arm: Arm) -> str:
    """'KV FOREIGN on b; KV CORRUPT on a, c': the KV findings of the arm's own run, by class ('' when none), so that
    an arm whose tokens PASSed over a KV finding never reads as a bare PASS."""
    parts = []
    for cls in KV_FINDINGS:
        probes = [p.name for p in arm.probes if p.kv_verdict == cls]
        if probes:
            parts.append(
                f"KV {cls} on {', '.join(probes[:3])}" + (f" and {len(probes) - 3} more" if len(probes) > 3 else "")
            )
    return "; ".join(parts)


def _condition_lines(arm: Arm) -> list[str]:
    """What the arm's verdict was measured under, one fact a line; none for a report that records none."""
    c = arm.conditions
    device = " · ".join(t for t in (c.gpu_text, c.sharing_text) if t)
    reason = c.confirmation_reason
    lines = [
        f"copy path: {c.copy_path_text}" if c.copy_path_text else "",
        device,
        f"trials: {c.trial_rate_text}" if c.trial_rate_text else "",
        c.confirmation_text + (f" — {reason}" if reason else ""),
    ]
    return [f"  {line}"[:400] for line in lines if line]


def _scenario_lines(report: Report, scenario: Scenario) -> list[str]:
    """The control's line where it failed or differs from the plain baseline, then per arm a line (verdict,
    class, KV, preemptions, hits, what its trials found), why where it has no requests, a line per request
    that is not a PASS (in how many trials), and one per request only a later trial did not pass."""
    control = scenario.control.summary_line if scenario.control is not None else ""
    lines = [f"  {scenario.name} · {control}"] if control else []
    if scenario.load is not None:  # what it generated, and its reference and reuse control
        lines += [
            f"  {scenario.name} · {spec_text(scenario.load)}",
            f"  {scenario.name} · {controls_text(scenario.load)}",
        ]
    for arm in scenario.arms:
        later = scenario_later_text(report, scenario.name, str(arm.data.get("arm")), arm.verdict == PASS)
        line, rates = arm.summary_line, arm_rates_text(arm.load) if arm.load is not None else ""
        if rates:  # a load arm: its rates a round a line under it, never cut (a round also counts its KV findings)
            line = line.replace(f" · {rates}", "")
        if later:  # a later trial counts against it: said first, never behind a bare PASS
            line = f"{later} · its own run (trial 1): {line}" if arm.verdict == PASS else f"{line} · {later}"
        caught = _caught_text(_scenario_fault_caught(report, scenario, arm))
        lines.append(f"  {scenario.name} · {arm.name}: {line}{caught}")
        lines += [f"      {part}" for part in rates.split("; ") if part]
        if arm.verdict == INCONCLUSIVE and not arm.requests:  # every reason: it decides the exit as any INCONCLUSIVE
            lines += why_lines(arm.reasons, "      ", "")
            continue
        if arm.verdict in (ERROR, SKIPPED) or not arm.requests:
            why = [arm.error_text] if arm.error_text else []
            lines += [f"      {r}" for r in why + [r for r in arm.reasons[:3] if r not in arm.error_text]]
            continue
        failing, more = arm.failing, []
        if scenario.load is not None and len(failing) > SUMMARY_REQUESTS:  # the report and the page list them all
            failing, more = failing[:SUMMARY_REQUESTS], failing[SUMMARY_REQUESTS:]
        for r in failing:  # an INCONCLUSIVE request's line carries its reasons: wrapped, never cut
            lines += why_lines([r.line], "      ", "") if r.verdict == INCONCLUSIVE else [f"      {r.line}"]
        if more:
            lines.append(f"      … and {len(more)} more requests that are not PASS")
            lines += _undecided_lines([r for r in more if r.verdict == INCONCLUSIVE])
        lines += [
            f"      {r}" for r in arm.reasons if not r.startswith(("step ", "round "))
        ]  # a request's reason: its line
        lines += [f"      trials: {r.line}" for r in arm.later_rates]
    return [line[:400] for line in lines]


def scenario_block(report: Report) -> list[str]:
    """The summary's Scenarios block, set apart by blank lines; [] for a report without scenarios."""
    if not report.scenarios:
        return []
    lines = ["", "Scenarios"] + [line for s in report.scenarios for line in _scenario_lines(report, s)]
    acceptance = report.scenario_acceptance_text
    return lines + ([f"  {acceptance}"[:400]] if acceptance else []) + [""]


def upstream_block(report: Report) -> list[str]:
    """The summary's Upstream bounds block: what the run says of each expectation the fixture bound to a known
    upstream bug ('fixed upstream: … does not reproduce on vllm 0.32.0 (native same-name PASS …)'); [] for a report
    without bounds."""
    if not report.upstream:
        return []
    return ["Upstream bounds"] + [f"  {u.text}"[:600] for u in report.upstream] + [""]


def headline_lines(report: Report) -> list[str]:
    """The headline sentence the site, the issue and the kit lead with (repro.publish.headline), wrapped at LINE_CHARS
    as a reason is: never cut, its later lines indented."""
    return textwrap.wrap(headline(report), LINE_CHARS, subsequent_indent="  ", break_on_hyphens=False)


def format_summary(report: Report | Mapping[str, Any]) -> str:
    """The summary, led by the report's headline sentence, then its hardware, commit and date, then the generations,
    acceptance.matched and the exit code with why."""
    report = as_report(report)
    audit = report.kv_audit_state
    lines = [
        *headline_lines(report),
        report.headline,  # the read model's 'NVIDIA L4 · 1a2b3c4d5e6f · 2026-11-29', not the sentence
        f"# {report.data['generations']} generations · acceptance.matched = {report.acceptance_label()} · "
        + report.exit_text,
    ]
    lines += acceptance_lines(report.acceptance)  # what acceptance.matched = false did not check, by name
    if report.run_conditions.line:
        lines.append(report.run_conditions.line[:400])
    lines += [f"LoRA {line}"[:400] for line in report.adapter_lines]  # the adapters probes ran under, if any
    # the KV column starts after the widest token verdict (a classed FAIL is wider than the usual 20)
    width = max([VERDICT_COLUMN] + [len(p.tokens_verdict) for a in report.arms for p in a.probes])
    for arm in report.arms:
        if arm.is_baseline:
            if arm.verdict != PASS:
                lines += why_lines(arm.reasons, "", f"baseline: {arm.verdict} — ")
            continue
        lines.append(f"{arm.title}: {_arm_verdict(report, arm)}{_caught_text(planted_fault_caught(report, arm))}")
        lines += _arm_why(arm)
        if arm.error:
            lines.append(f"  ERROR {arm.error['kind']}: {arm.error['detail']}"[:400])
        lines += _condition_lines(arm)
        for m in arm.members:  # an INCONCLUSIVE member's line gives its first reason: the rest, wrapped, never cut
            rest = list(m.data.get("reasons") or [])[1:] if m.verdict == INCONCLUSIVE else []
            lines += why_lines([m.line, *rest], "  ", "") if m.verdict == INCONCLUSIVE else [f"  {m.line}"[:400]]
        if audit:
            lines.append(f"  {arm.kv_text}"[:400])
        for p in arm.probes:
            lines.append(_probe_line(p, p.kv_cell if audit else None, width))
            lines += why_lines(p.reasons, "    ") if p.verdict == INCONCLUSIVE else []
            lines += [f"    {line}"[:400] for line in p.replay_lines()]
            lines += [f"    {line}"[:400] for line in p.prompt_logprob_lines()]  # where it asked for them
        for note in arm.findings:
            lines.append(f"  note: {note}")
    for err in report.errors:
        lines.append(f"ERROR {err['arm']}: {err['kind']}: {err['detail']}"[:400])
    if audit is False:
        lines.append("KV audit: off")
    elif audit:
        unexpected = {(a.name, p.name) for a, p in report.unexpected_kv_findings}
        lines.append("KV findings:" + ("" if report.kv_findings else " none"))
        for a, p in report.kv_findings:
            expected = "" if (a.name, p.name) in unexpected else " (expected by the fixture)"
            # CORRUPT, the one KV finding before FOREIGN and MISPLACED, is the line as it always was
            cls = "" if p.kv_verdict == CORRUPT else f"{p.kv_verdict}: "
            lines.append(f"  {a.title} / {p.name}: {cls}{p.kv.blame_text}{expected}")
            lines += [f"    {shape}"[:400] for shape in p.kv_shapes]
    lines += scenario_block(report)
    upstream = upstream_block(report)
    lines += ([""] if upstream and lines[-1] else []) + upstream  # set apart, as the Scenarios block is
    lines.append(CLAIM_LINE)
    return "\n".join(lines)
