"""The report page's Scenarios section: each scenario's steps, settings and schedule control, and each arm's
requests. Pure, as repro.publish.site_model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from repro.judge.verdict import PASS
from repro.judge.wording import machine_path_name
from repro.readmodel import Report, Scenario, ScenarioArm, StepRequest
from repro.readmodel.scenario_load import arm_rates_text, controls_text, round_step_text, spec_text


@dataclass(frozen=True)
class ScenarioRow:
    """One request of a scenario arm: step · probe · expectation · hit · verdict · first diff · KV · control."""

    step: str
    probe: str
    expect: str
    cached: str
    role: str
    verdict: str
    diff: str
    diff_class: str  # the divergence's class (decisive, near-tie, unclassed); "" when it did not diverge
    kv: str
    kv_verdict: str  # EXACT, NUMERIC, MISPLACED, FOREIGN, CORRUPT, UNAVAILABLE; "" when not audited
    control: str
    cls: str = ""  # the request's class ("schedule-numerics"); "" when none
    note: str = ""  # what qualifies its check, e.g. an expected reuse not enforced
    counts: str = ""  # where the connector's own hit count disagrees with vLLM's (StepRequest.counter_note)


@dataclass(frozen=True)
class ScenarioArmBlock:
    title: str
    verdict: str
    cls: str  # the class of its divergences ("schedule-numerics"); "" when none
    facts: str  # "preemptions 0 (llm.get_metrics(): …) · 12.4 s"
    reasons: tuple[str, ...]  # shown for any verdict but a plain PASS
    error: tuple[str, str] | None  # "kind: message", log tail
    rows: tuple[ScenarioRow, ...]


@dataclass(frozen=True)
class ScenarioBlock:
    """One scenario on the report page: what ran (steps, settings), the schedule control, each arm's rows."""

    anchor: str
    name: str
    description: str
    settings: str
    steps: tuple[str, ...]
    control: str
    control_differs: bool  # the schedule alone changed some request's tokens: the line is shown loud
    arms: tuple[ScenarioArmBlock, ...]
    step_label: str = "step"  # the rows' first column: a load scenario's rounds, counted from 1 as its rates are


def _scenario_row(req: StepRequest, title: Callable[[str], str], load: bool = False) -> ScenarioRow:
    return ScenarioRow(
        step=("?" if req.step is None else str(req.step + 1)) if load else ("?" if req.step is None else str(req.step)),
        probe=title(req.probe),
        expect=req.expect_text,
        cached=req.hit_cell,
        role=str(req.role or "?") + (f", {req.origin}" if req.origin else ""),
        verdict=req.verdict,
        diff=req.diff_cell,
        diff_class=req.divergence_class or "",
        kv=machine_path_name(req.kv_cell),
        kv_verdict=req.kv_verdict or "",
        control=req.control_cell,
        cls=req.cls,
        note=machine_path_name(req.note),
        counts=req.counter_note,
    )


def _scenario_arm(arm: ScenarioArm, title: Callable[[str], str] = str, load: bool = False) -> ScenarioArmBlock:
    plain_pass = arm.verdict == PASS and not arm.cls
    error = (machine_path_name(arm.error_text), machine_path_name(arm.log_tail)) if arm.error else None
    return ScenarioArmBlock(
        title=arm.title,
        verdict=arm.verdict,
        cls=arm.cls,
        facts=machine_path_name(" · ".join(f for f in _arm_facts(arm) if f)),
        reasons=() if plain_pass else tuple(machine_path_name(r) for r in arm.reasons),
        error=error,
        rows=tuple(_scenario_row(r, title, load) for r in arm.requests),
    )


def _arm_facts(arm: ScenarioArm) -> tuple[str, ...]:
    """KV, preemptions, copy path, wall time; with trials, what they found and each request's rate."""
    facts = (arm.kv_text, arm.preemptions_text, arm.copy_path_text, arm.wall_text)
    if arm.load is not None:  # a load scenario's rates per round first
        facts = (arm_rates_text(arm.load), *facts)
    if arm.trials is None:
        return facts
    return (*facts, f"trials: {arm.trials_text}", *(r.line for r in arm.trials.rates))


def scenario_block(scenario: Scenario, index: int, title: Callable[[str], str] = str) -> ScenarioBlock:
    """One scenario's block; title: a probe's name as shown (with the LoRA adapter it ran under, where it did)."""
    control = scenario.control
    return ScenarioBlock(
        anchor=f"s{index}",
        name=scenario.name,
        description=scenario.description,
        settings=scenario.settings_text + (f" · {spec_text(scenario.load)}" if scenario.load is not None else ""),
        steps=tuple(_step_text(s, scenario.load is not None) for s in scenario.steps),
        control=machine_path_name(
            scenario.control_text
            + _control_facts(scenario)
            + (f" · {controls_text(scenario.load)}" if scenario.load is not None else "")
        ),
        control_differs=control is not None and (bool(control.differing) or not control.ran),
        arms=tuple(_scenario_arm(a, title, scenario.load is not None) for a in scenario.arms),
        step_label="round" if scenario.load is not None else "step",
    )


def _step_text(step, load: bool) -> str:
    """'step 0: chat-511 · hit or miss'; a load round: 'round 1: 64 prompts in flight together, in a shuffled order,
    cancelling load-p004-s01 (prefill), …' (its 64 names are in the report)."""
    index = "?" if step.index is None else step.index
    if not load:
        return f"step {index}: {step.text}"
    return round_step_text(step.index, len(step.submit), step.data.get("cancel") or {})


def _control_facts(scenario: Scenario) -> str:
    """' · preemptions 2 · 9.5 s' after the control's line; '' when it recorded neither."""
    control = scenario.control
    if control is None:
        return ""
    facts = [f"preemptions {control.preemptions}" if control.preemptions is not None else ""]
    facts += [control.wall_text if control.data.get("wall_s") is not None else ""]
    return "".join(f" · {f}" for f in facts if f)


def scenarios_note(report: Report) -> str:
    """Scenarios asked for that are not in the report: said, never silently dropped."""
    ran = {s.name for s in report.scenarios}
    missing = [name for name in report.requested_scenarios if name not in ran]
    notes = [f"Scenarios' {report.scenario_acceptance_text}." if report.scenario_acceptance_text else ""]
    notes += [f"Asked for but not in this report: {', '.join(missing)}." if missing else ""]
    return " ".join(n for n in notes if n)
