"""The site index's rows: one per report, its hardware, date, versions, each arm's verdict, the KV tallies and
the scenario runs that are not a plain PASS. Pure, as repro.publish.site_model.
"""

from __future__ import annotations

from dataclasses import dataclass

from repro.judge.verdict import PASS
from repro.readmodel import Arm, Report, ScenarioArm, as_report


@dataclass(frozen=True)
class IndexVerdict:
    """One arm on the index: its verdict and, for a FAIL, its divergences by class."""

    arm: str
    verdict: str
    divergences: str = ""  # "decisive: 6", "near-ties only: 2"; "" unless a FAIL
    near_ties_only: bool = False
    condition: str = ""  # "contention-dependent: …" when the verdict was qualified by its conditions


@dataclass(frozen=True)
class IndexRow:
    href: str
    stem: str
    hardware: str
    date: str
    commit: str
    vllm: str
    lmcache: str
    verdicts: tuple[IndexVerdict, ...]
    acceptance: str
    kv: tuple[tuple[str, str], ...] | None = None  # each reuse arm's KV verdicts tallied; None before the audit
    scenarios: tuple[tuple[str, str], ...] = ()  # ("a-b-a · PlantedFault", "FAIL") per scenario run not a plain PASS
    scenario_passes: int = 0  # the scenario runs that are a plain PASS (counted, not listed)


def build_index_row(report: Report | dict, *, stem: str, href: str) -> IndexRow:
    report = as_report(report)
    return IndexRow(
        href=href,
        stem=stem,
        hardware=report.hardware_label,
        date=report.day,
        commit=report.commit,
        vllm=report.package_version("vllm"),
        lmcache=report.package_version("lmcache"),
        verdicts=tuple(_index_verdict(a) for a in report.arms),
        acceptance=report.acceptance_label(short=True),
        kv=_index_kv(report),
        scenarios=tuple(
            (f"{s.name} · {a.title}", _index_scenario_text(a))
            for s in report.scenarios
            for a in s.arms
            if not _plain_pass(a)
        ),
        scenario_passes=sum(_plain_pass(a) for s in report.scenarios for a in s.arms),
    )


def _plain_pass(arm: ScenarioArm) -> bool:
    """A scenario run with nothing to say: PASS, no class, no KV finding (CORRUPT, FOREIGN, MISPLACED), no finding
    or ERROR in a later trial."""
    later = arm.trials and (arm.trials.found or arm.trials.errors)
    return arm.verdict == PASS and not arm.cls and not arm.is_finding and not later


def _index_scenario_text(arm: ScenarioArm) -> str:
    """The index's word on a scenario run: its verdict, and how many of its trials ended in ERROR."""
    if arm.trials and arm.trials.errors:
        return f"{arm.verdict_text}, {arm.trials.errors} of {arm.trials.n} trials ERROR"
    return arm.verdict_text


def _index_verdict(arm: Arm) -> IndexVerdict:
    return IndexVerdict(
        arm=arm.title,
        verdict=str(arm.verdict),
        divergences=arm.class_text,
        near_ties_only=arm.near_ties_only,
        condition=arm.conditions.finding_class_text if arm.conditions.qualified else "",
    )


def _index_kv(report: Report) -> tuple[tuple[str, str], ...] | None:
    audit = report.kv_audit_state
    if audit is None:
        return None
    if not audit:
        return (("KV audit", "off"),)
    return tuple((a.title, a.kv_tally) for a in report.reuse_arms)
