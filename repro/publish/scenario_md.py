"""A report's scenarios as issue Markdown: a verdict table with a row per scenario and arm, then each
scenario FAIL as a finding (what ran, the step, the first diff and its margins, the KV blame, the schedule
control, both token lists and, with trials, in how many it recurred), then why any other arm is not a PASS."""

from __future__ import annotations

from repro.judge.verdict import PASS
from repro.judge.wording import NOT_RECORDED
from repro.publish.markdown import format_tokens, margin_text, markdown_table
from repro.readmodel import Report, Scenario, ScenarioArm, StepRequest
from repro.readmodel.scenario_load import round_of, round_step_text

SCENARIO_HEADER = ("scenario", "arm", "verdict", "KV", "preemptions", "requests not PASS")
SCENARIO_LEGEND = (
    "Each scenario runs its steps in a fresh engine per arm, with its own engine settings; a step's prompts go "
    "one after another, or at once when they are in flight together. Every request, hit or miss, is compared "
    "exactly with its probe's plain cold baseline. The schedule control is the baseline arm's cache-off run of "
    "the same steps: where it differs from the plain baseline, the schedule alone changed the numerics, and a "
    "divergence it shares is classed `schedule-numerics`, not blamed on reuse."
)


def scenario_rows(report: Report) -> list[tuple[str, ...]]:
    """One row per scenario and arm: its verdict with its class, its preemptions, the requests that are not
    a PASS (or its error)."""
    rows = []
    for scenario in report.scenarios:
        for arm in scenario.arms:
            failing = ", ".join(f"{_where(r, scenario)} {r.probe} {r.verdict}" for r in arm.failing)
            count = NOT_RECORDED if arm.preemptions is None else str(arm.preemptions)
            kv = arm.kv.cell if arm.kv is not None else "—"
            rows.append((scenario.name, arm.title, arm.verdict_text, kv, count, failing or arm.error_text or "—"))
    return rows


def _where(request: StepRequest, scenario: Scenario) -> str:
    """'step 2'; a load scenario's request 'round 1' (its rounds count from 1)."""
    if scenario.load is not None:
        return round_of(request.step)
    return f"step {'?' if request.step is None else request.step}"


def _steps_text(scenario: Scenario) -> str:
    if scenario.load is not None:
        return "; ".join(round_step_text(s.index, len(s.submit), s.data.get("cancel") or {}) for s in scenario.steps)
    return "; ".join(f"{'?' if s.index is None else s.index}: {s.text}" for s in scenario.steps) or "none recorded"


def _request_lines(report: Report, scenario: Scenario, request: StepRequest, token_limit: int | None) -> list[str]:
    diff = (
        f", first diff @{request.first_diff}; {margin_text(request.margin)}" if request.first_diff is not None else ""
    )
    cls = f" ({request.cls})" if request.cls else ""
    trials = f" {request.trial_mark}" if request.trial_mark else ""
    lines = [
        (
            f"- **{_where(request, scenario)} {report.probe_title(request.probe)}** "
            f"({request.role or '?'}, {request.hit_cell} cached tokens, {request.expect_text}): "
            f"{request.verdict}{cls}{trials}{diff}"
        )
    ]
    lines += [f"  - {text}" for text in (*request.reasons, request.note, request.counter_note) if text]
    if request.kv is not None:
        lines.append(f"  - KV: {request.kv_cell}")
    lines.append(f"  - control: {request.control_text}")
    lines += [f"  - **{text}**" for text in request.replay_texts]
    if token_limit != 0 and request.first_diff is not None:
        lines.append(f"  - baseline: {format_tokens(report.baseline_token_ids(request.probe), token_limit)}")
        control = request.control
        if control is not None and control.differs:
            lines.append(f"  - control: {format_tokens(control.token_ids, token_limit)}")
        lines.append(f"  - this request: {format_tokens(request.token_ids, token_limit)}")
    return lines


def format_finding(report: Report, scenario: Scenario, arm: ScenarioArm, token_limit: int | None) -> list[str]:
    """One scenario FAIL: what ran, then every request that is not a PASS with what a maintainer needs."""
    settings = scenario.settings_text
    what = scenario.description or scenario.name
    return [
        f"**{scenario.name} · {arm.title}: {arm.verdict_text}**",
        "",
        f"- what ran: {what}" + (f" ({settings})" if settings else ""),
        f"- steps: {_steps_text(scenario)}",
        f"- {scenario.control_text}",
        f"- {arm.preemptions_text}",
        *([f"- {arm.copy_path_text}"] if arm.copy_path_text else []),
        *([f"- {arm.kv_text}"] if arm.kv is not None else []),
        *([f"- trials: {arm.trials_text}"] if arm.trials_text else []),
        *(line for r in arm.failing for line in _request_lines(report, scenario, r, token_limit)),
        *(f"- trials: {r.line}" for r in arm.later_rates),
    ]


def _other_line(scenario: Scenario, arm: ScenarioArm) -> str:
    """Why an arm that is no finding is not a PASS, or what only a later trial of it found."""
    why = [arm.error_text or "; ".join(arm.reasons)]
    if arm.later_rates:
        why += [f"trials: {arm.trials_text}", *(r.line for r in arm.later_rates)]
    return f"- **{scenario.name} · {arm.title}**: {arm.verdict_text} — {'; '.join(w for w in why if w) or 'no reason recorded'}"


def format_scenarios(report: Report, token_limit: int | None) -> str:
    """The Scenarios section: the legend, the verdict table, each FAIL as a finding, then why any other arm
    is not a PASS; scenarios asked for that are not in the report are said."""
    ran = {s.name for s in report.scenarios}
    missing = [name for name in report.requested_scenarios if name not in ran]
    parts = [SCENARIO_LEGEND]
    if report.scenario_acceptance_text:
        parts.append(f"- scenarios' {report.scenario_acceptance_text}")
    if report.scenarios:
        parts.append(markdown_table(SCENARIO_HEADER, scenario_rows(report)))
    parts += ["\n".join(format_finding(report, s, a, token_limit)) for s, a in report.scenario_findings]
    others = [
        _other_line(s, a)
        for s in report.scenarios
        for a in s.arms
        if not a.is_finding and (a.verdict != PASS or a.cls or a.later_rates)
    ]
    if others:
        parts.append("\n".join(others))
    if missing:
        parts.append(f"Asked for but not in this report: {', '.join(missing)}.")
    if token_limit == 0 and report.scenario_findings:
        parts.append("_Generated token lists left out to fit GitHub's size limit; they are in the report JSON._")
    return "\n\n".join(parts)
