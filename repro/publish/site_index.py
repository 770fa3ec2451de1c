"""The site index's rows: one per report, led by its headline (repro.publish.headline), then its hardware, date,
versions, each arm's verdict, the KV tallies and the scenario runs that are not a plain PASS (an ERROR among them),
and what the verdicts-by-vLLM-version grid reads of it (repro.publish.site_versions). Sorted newest stack first
(sort_rows). Pure, as repro.publish.site_model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from repro.judge.verdict import ERROR, KV_FINDINGS, PASS
from repro.publish.headline import EXPLORATORY, headline, later_text, stack_key
from repro.publish.site_overview import Overview, overview
from repro.publish.site_versions import VersionFacts, version_facts
from repro.readmodel import Arm, Report, ScenarioArm, as_report

_HELD = re.compile(r"\d+")
_VERSION = re.compile(r"^\d+(\.\d+)*")


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
    # ("preemption · LMCacheMPConnector", "ERROR", "1 of 2 trials ERROR") per scenario run not a plain PASS
    scenarios: tuple[tuple[str, str, str], ...] = ()
    scenario_passes: int = 0  # the scenario runs that are a plain PASS (counted, not listed)
    headline: str = ""  # the report's finding in one sentence (repro.publish.headline)
    stack: tuple = ()  # the index's order: newest vLLM, LMCache and start time first (repro.publish.headline.stack_key)
    # a P→D report's negative controls (repro.disagg.page.index_row): (case, verdicts over the trials, "held n of m")
    controls: tuple[tuple[str, str, str], ...] = ()
    stack_note: str = ""  # what the stack column adds for a report that is not the verifier's ("NIXL 1.2.0 · …")
    versions: VersionFacts | None = None  # what the verdicts-by-vLLM-version grid reads (repro.publish.site_versions)
    overview: Overview | None = None  # what the index's opening picture reads (repro.publish.site_overview)

    @property
    def commit_parts(self) -> tuple[str, ...]:
        """'8b5497c98684', '+dirty': the kit commit and its mark, each kept whole on the page (a line may break
        between them, never inside a hash)."""
        head, mark, tail = self.commit.partition("+")
        return (head, mark + tail) if mark else (head,)

    @property
    def kv_parts(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Each reuse arm's KV tally as its parts ('CORRUPT×4', 'EXACT×1'), each kept whole on the page."""
        return tuple((name, tuple(tally.split(" · "))) for name, tally in self.kv or ())

    @property
    def control_cells(self) -> tuple[tuple[str, str, bool, str], ...]:
        """A P→D report's negative controls as the index shows them: (case, 'held 3 of 3', whether every trial held,
        its verdicts over the trials). A control holds when its answers differ as a control's must: a held
        control reads as a pass, its FAIL verdicts the expected ones."""
        cells = []
        for case, verdicts, held in self.controls:
            numbers = [int(n) for n in _HELD.findall(held)]
            every = len(numbers) == 2 and numbers[0] == numbers[1] and numbers[1] > 0
            cells.append((case, held, every, verdicts))
        return tuple(cells)


def build_index_row(report: Report | dict, *, stem: str, href: str) -> IndexRow:
    report = as_report(report)
    return IndexRow(
        href=href,
        stem=stem,
        hardware=report.hardware_label,
        date=report.day,
        commit=report.commit,
        vllm=report.package_version("vllm") if report.engine == "vLLM" else f"— ({report.engine_text})",
        lmcache=_lmcache(report.package_version("lmcache")),
        verdicts=tuple(_index_verdict(report, a) for a in report.arms),
        acceptance=report.acceptance_label(short=True) if report.states_expectations else EXPLORATORY,
        kv=_index_kv(report),
        scenarios=tuple(
            (f"{s.name} · {a.title}", str(a.verdict), _index_scenario_note(a))
            for s in report.scenarios
            for a in s.arms
            if not _plain_pass(a)
        ),
        scenario_passes=sum(_plain_pass(a) for s in report.scenarios for a in s.arms),
        headline=headline(report),
        stack=stack_key(report),
        versions=version_facts(report),
        overview=overview(report),
    )


def _lmcache(version: str) -> str:
    """'0.5.4'; 'not installed' for 'unavailable: not installed' (the probe's words are on the report's page)."""
    if _VERSION.match(version) or version == "—":
        return version
    return version.removeprefix("unavailable: ")


def sort_rows(rows: list[IndexRow]) -> list[IndexRow]:
    """Newest stack first (vLLM, then LMCache, then the run's start), then by name: the order the index lists."""
    by_name = sorted(rows, key=lambda r: r.stem)
    return sorted(by_name, key=lambda r: r.stack, reverse=True)


def _plain_pass(arm: ScenarioArm) -> bool:
    """A scenario run with nothing to say: PASS, no class, no KV finding (CORRUPT, FOREIGN, MISPLACED), no finding
    or ERROR in a later trial."""
    later = arm.trials and (arm.trials.found or arm.trials.errors)
    return arm.verdict == PASS and not arm.cls and not arm.is_finding and not later


def _index_scenario_note(arm: ScenarioArm) -> str:
    """What qualifies a scenario run's verdict on the index: its class, how many of its trials ended in ERROR."""
    notes = [arm.cls] if arm.cls else []
    if arm.kv_verdict in KV_FINDINGS:
        notes.append(f"KV {arm.kv_verdict}")
    if arm.trials and arm.trials.errors:
        notes.append(f"{arm.trials.errors} of {arm.trials.n} trials {ERROR}")
    return ", ".join(notes)


def _index_verdict(report: Report, arm: Arm) -> IndexVerdict:
    """An arm's cell: its verdict, and beside it its condition, or what the exit rule counts against it beyond its
    own run (a later trial's ERROR, a member never exercised: repro.publish.headline.later_text), so that no cell
    reads a bare PASS over what the exit code counts."""
    condition = arm.conditions.finding_class_text if arm.conditions.qualified else ""
    later = later_text(report, arm.name, words=False) if not arm.is_baseline else ""
    return IndexVerdict(
        arm=arm.title,
        verdict=str(arm.verdict),
        divergences=arm.class_text,
        near_ties_only=arm.near_ties_only,
        condition=condition or later,
    )


def _index_kv(report: Report) -> tuple[tuple[str, str], ...] | None:
    audit = report.kv_audit_state
    if audit is None:
        return None
    if not audit:
        return (("KV audit", "off"),)
    return tuple((a.title, a.kv_tally) for a in report.reuse_arms)
