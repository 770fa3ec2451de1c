"""The text summary the verifier prints at the end of a run: one line per arm and probe, read from the
read model (repro.readmodel)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from repro.judge.verdict import CORRUPT, ERROR, PASS, SKIPPED
from repro.publish.headline import later_facts, later_text, scenario_later_text
from repro.readmodel import Arm, Probe, Report, Scenario, as_report
from repro.readmodel.scenario_load import SUMMARY_REQUESTS, controls_text, spec_text
from repro.record.report import CLAIM_LINE

VERDICT_COLUMN = 20  # the summary's token-verdict column before the KV column, at least


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
        return arm.verdict_text
    found, errors, idle = later_facts(report, arm.name)
    own = "its own run (trial 1)" if found or errors else "its tokens"
    text = arm.verdict_text.split(" · not exercised: ")[0] if idle else arm.verdict_text  # said in `later`
    return f"{later} · {own}: {text}" if arm.verdict == PASS else f"{text} · {later}"


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
        line = arm.summary_line
        if later:  # a later trial counts against it: said first, never behind a bare PASS
            line = f"{later} · its own run (trial 1): {line}" if arm.verdict == PASS else f"{line} · {later}"
        lines.append(f"  {scenario.name} · {arm.name}: {line}")
        if arm.verdict in (ERROR, SKIPPED) or not arm.requests:
            why = [arm.error_text] if arm.error_text else []
            lines += [f"      {r}" for r in why + [r for r in arm.reasons[:3] if r not in arm.error_text]]
            continue
        failing = arm.failing
        if scenario.load is not None and len(failing) > SUMMARY_REQUESTS:  # the report and the page list them all
            more = len(failing) - SUMMARY_REQUESTS
            failing = failing[:SUMMARY_REQUESTS]
            lines += [f"      {r.line}" for r in failing] + [f"      … and {more} more requests that are not PASS"]
        else:
            lines += [f"      {r.line}" for r in failing]
        lines += [f"      {r}" for r in arm.reasons if not r.startswith("step ")]  # a request's reason is on its line
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


def format_summary(report: Report | Mapping[str, Any]) -> str:
    report = as_report(report)
    audit = report.kv_audit_state
    lines = [
        report.headline,
        f"# {report.data['generations']} generations · acceptance.matched = {report.acceptance_label()} · "
        + report.exit_text,
    ]
    if report.run_conditions.line:
        lines.append(report.run_conditions.line[:400])
    lines += [f"LoRA {line}"[:400] for line in report.adapter_lines]  # the adapters probes ran under, if any
    # the KV column starts after the widest token verdict (a classed FAIL is wider than the usual 20)
    width = max([VERDICT_COLUMN] + [len(p.tokens_verdict) for a in report.arms for p in a.probes])
    for arm in report.arms:
        if arm.is_baseline:
            if arm.verdict != PASS:
                lines.append(f"baseline: {arm.verdict} — " + "; ".join(arm.reasons)[:300])
            continue
        lines.append(f"{arm.title}: {_arm_verdict(report, arm)}")
        if arm.error:
            lines.append(f"  ERROR {arm.error['kind']}: {arm.error['detail']}"[:400])
        lines += _condition_lines(arm)
        lines += [f"  {m.line}"[:400] for m in arm.members]
        if audit:
            lines.append(f"  {arm.kv_text}"[:400])
        for p in arm.probes:
            lines.append(_probe_line(p, p.kv_cell if audit else None, width))
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
