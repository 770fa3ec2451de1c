"""The report page's Conditions section (issue 18): what the run and each arm were measured under (GPU,
sharing, LMCache's copy paths, trials, the re-run alone). Pure, as repro.publish.site_model.
"""

from __future__ import annotations

from dataclasses import dataclass

from repro.judge.wording import machine_path_name
from repro.readmodel import Arm, Report


@dataclass(frozen=True)
class RateRow:
    """One probe of an arm across its trials: 'FAIL 3/5', its class, and each trial's verdict and first diffs."""

    probe: str
    rate: str
    cls: str
    trials: str


@dataclass(frozen=True)
class ArmConditions:
    """What one arm was measured under: its GPU, who shared it, LMCache's copy path per process,
    its trials and its re-run alone (each "" or () when the report does not record it)."""

    arm: str
    gpu: str
    sharing: str
    window: str
    overlaps: tuple[str, ...]
    copy_paths: tuple[tuple[str, str, str, str], ...]  # process, path, source, detail
    trials: str
    rates: tuple[RateRow, ...]
    confirmation: str
    confirmation_reason: str
    confirmation_run: tuple[tuple[str, str], ...]  # probe, 'FAIL @6,7' in the run alone


@dataclass(frozen=True)
class Conditions:
    run: tuple[tuple[str, str], ...]  # trials, re-run alone, lmcache-ops, gpu-load, cpu-load
    arms: tuple[ArmConditions, ...]


def _arm_conditions(arm: Arm) -> ArmConditions:
    c = arm.conditions
    return ArmConditions(
        arm=arm.title,
        gpu=c.gpu_text,
        sharing=c.sharing_text,
        window=c.sharing_window,
        overlaps=c.sharing_overlaps,
        copy_paths=tuple(
            tuple(machine_path_name(x) for x in (p.process, p.path, p.source, p.detail)) for p in c.copy_paths
        ),
        trials=c.trial_rate_text,
        rates=tuple(RateRow(str(r.probe), r.cell, str(r.cls), c.trial_diffs_text(str(r.probe))) for r in c.rates),
        confirmation=c.confirmation_text,
        confirmation_reason=machine_path_name(c.confirmation_reason),
        confirmation_run=c.alone_probes,
    )


def page_conditions(report: Report) -> Conditions | None:
    """The page's Conditions section; None for a report that records none of them (its page is as it was)."""
    run = tuple((k, machine_path_name(v)) for k, v in report.run_conditions.pairs)
    arms = tuple(_arm_conditions(a) for a in report.arms if a.conditions.recorded)
    return Conditions(run=run, arms=arms) if run or arms else None
