"""The index's opening picture: stacks down (vLLM, LMCache or none, the GPU or CPU, the model), reuse paths across
(native prefix caching, LMCacheConnectorV1, LMCache MP, offloading, MultiConnector, P→D, served, adapters, images,
the planted and example connectors, other), each cell coloured by what its reports' arms show and linked to its
report (or to the list of its reports); under it one short line per finding (what, where, how often) and one per
stack whose self-test caught its planted fault as the fixture expects.

Nothing here decides a verdict: each arm's verdict and KV verdicts are the read model's, what a later run, a member
or a scenario counts against it is the exit rule's (repro.publish.headline.later_facts,
repro.record.exit_rule.scenario_later_findings), and a planted fault caught as intended is the summary's reading of
the acceptance record (repro.publish.summary). The columns come from the arms the reports hold: a connector the
table below does not know goes under "other", never dropped. Pure: no file, clock or environment access.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from repro.judge.verdict import ERROR, FAIL, INCONCLUSIVE, KV_FINDINGS, PASS, SKIPPED
from repro.publish.headline import and_text, later_facts, model_label, run_label, uses_lmcache, version_key
from repro.publish.summary import planted_fault_caught
from repro.readmodel import Arm, Report
from repro.record.exit_rule import scenario_later_errors, scenario_later_findings

NATIVE, V1, MP, OFFLOADING, MULTI = (
    "native prefix caching",
    "LMCacheConnectorV1",
    "LMCache MP",
    "offloading",
    "MultiConnector",
)
PD, SERVED, ADAPTERS, IMAGES = "P→D", "served", "LoRA adapters", "images"
SELF_TEST, OTHER = "planted / example connectors", "other"
COLUMNS = (NATIVE, V1, MP, OFFLOADING, MULTI, PD, SERVED, ADAPTERS, IMAGES, SELF_TEST, OTHER)  # the picture's order
# What each column holds, on hover over its heading.
COLUMN_WORDS = {
    NATIVE: "vLLM's own prefix caching, no connector (a control)",
    V1: "LMCache through LMCacheConnectorV1, in the engine's process",
    MP: "LMCache through LMCacheMPConnector and its own server process",
    OFFLOADING: "vLLM's CPU offloading connectors (OffloadingConnector, SimpleCPUOffloadConnector)",
    MULTI: "MultiConnector: several connectors in one",
    PD: "disaggregated prefill: a producer and a consumer server over NixlConnector",
    SERVED: "every reuse arm of a run driven over HTTP (vllm serve, or a server the kit did not start)",
    ADAPTERS: "every reuse arm of a run whose probes ran under LoRA adapters",
    IMAGES: "every reuse arm of a run whose prompts carried images",
    SELF_TEST: "the kit's planted-fault connectors and vLLM's ExampleConnector: the kit checking itself",
    OTHER: "a connector this picture has no column for",
}
CONNECTOR_COLUMNS = {
    "LMCacheConnectorV1": V1,
    "LMCacheMPConnector": MP,
    "OffloadingConnector": OFFLOADING,
    "SimpleCPUOffloadConnector": OFFLOADING,
    "MultiConnector": MULTI,
    "NixlConnector": PD,
    "PlantedFaultConnector": SELF_TEST,
    "PlantedKeyConnector": SELF_TEST,
    "ExampleConnector": SELF_TEST,
}
_CAMEL = re.compile(r"(?<=[a-z])(?=Connector)")  # 'LMCache|ConnectorV1': where a heading may break on a phone
SERVED_FRONTENDS = ("server", "endpoint")  # config.frontend of a run over HTTP
# A cell's state, worst first: its colour (the css class s-<state>) and the order a mixed cell is read in.
FINDING, CAUGHT, STATE_ERROR, STATE_INCONCLUSIVE, STATE_PASS, STATE_SKIPPED = (
    "finding", "caught", "error", "inconclusive", "pass", "skipped",
)  # fmt: skip
STATES = (FINDING, STATE_ERROR, STATE_INCONCLUSIVE, CAUGHT, STATE_PASS, STATE_SKIPPED)
TALLY_WORDS = {FINDING: "finding", STATE_ERROR: ERROR, STATE_INCONCLUSIVE: INCONCLUSIVE, CAUGHT: "caught",
               STATE_PASS: PASS, STATE_SKIPPED: SKIPPED}  # fmt: skip
STATE_WORDS = {
    FINDING: f"a finding: a {FAIL}, or reused KV {', '.join(KV_FINDINGS)}",
    STATE_ERROR: f"{ERROR}: no verdict",
    STATE_INCONCLUSIVE: f"{INCONCLUSIVE}: nothing to judge by (no verified hit or cold miss)",
    CAUGHT: "a planted fault caught, as the fixture expects (the kit checking itself)",
    STATE_PASS: f"{PASS}: every reuse matched caching off token for token",
    STATE_SKIPPED: SKIPPED,
}


@dataclass(frozen=True)
class Stack:
    """One row of the picture."""

    vllm: str  # '0.28.0', '—' when unrecorded
    lmcache: str  # 'LMCache 0.5.4' where an arm used LMCache; '' otherwise
    hardware: str  # 'NVIDIA H200', 'CPU AMD EPYC'
    model: str
    engine: str = ""  # another engine than vLLM, as the report names it (Report.engine_text); '' for vLLM

    @property
    def text(self) -> str:
        """'vLLM 0.28.0 + LMCache 0.5.4 · NVIDIA H200 · kvkit-tiny-qwen3-seed6'."""
        return (
            (self.engine or f"vLLM {self.vllm}")
            + (f" + {self.lmcache}" if self.lmcache else "")
            + f" · {self.hardware} · {self.model}"
        )

    @property
    def order(self) -> tuple:
        """Newest vLLM, then LMCache, first (as the index's table), then by hardware and model."""
        return (version_key(self.vllm), version_key(self.lmcache.removeprefix("LMCache ")), self.hardware, self.model)


@dataclass(frozen=True)
class PathFact:
    """One reuse arm of one report as the picture reads it."""

    column: str
    arm: str  # its title: 'LMCacheConnectorV1', 'native prefix caching', 'PlantedFault (PlantedFaultConnector)'
    verdict: str  # the arm's own verdict
    state: str  # FINDING, CAUGHT, STATE_ERROR, …
    kv: str = ""  # its worst KV verdict; "" when not audited
    failed: int = 0  # probes whose verdict is FAIL
    compared: int = 0  # probes not SKIPPED
    kv_found: tuple[tuple[str, int], ...] = ()  # (KV finding, probes) worst first
    kv_audited: int = 0  # probes with a KV verdict
    later: tuple[str, ...] = ()  # the later runs with a finding the exit rule counts ('trial 2', 'the re-run alone')
    later_errors: tuple[str, ...] = ()  # the later runs (or its scenario runs) that ended in ERROR
    scenario_found: int = 0  # its scenario runs with a finding (in their own run or a later trial)
    scenario_runs: int = 0
    idle: tuple[str, ...] = ()  # MultiConnector members never exercised
    note: str = ""  # what else the exit rule counts against it, in its words (a P→D control that did not hold)

    @property
    def label(self) -> str:
        """What the cell says of it: 'FAIL', 'KV CORRUPT' (tokens PASS over corrupt KV), 'later finding', 'PASS'."""
        if self.state == FINDING and self.verdict != FAIL:
            if self.kv_found:
                return f"KV {self.kv_found[0][0]}"
            return "later finding" if self.later else "scenario finding"
        if self.state == STATE_ERROR and self.verdict != ERROR:
            return "scenario ERROR" if self.later_errors == ("a scenario run",) else "ERROR later"
        if self.state == STATE_INCONCLUSIVE and self.verdict != INCONCLUSIVE:
            return "member idle" if self.idle else INCONCLUSIVE
        return self.verdict

    @property
    def kv_label(self) -> str:
        """'KV CORRUPT' under the verdict where the label does not say it already; '' when not audited."""
        return f"KV {self.kv}" if self.kv and self.label == self.verdict else ""


@dataclass(frozen=True)
class Overview:
    """What the picture reads of one report (carried on repro.publish.site_index.IndexRow)."""

    stack: Stack
    paths: tuple[PathFact, ...]


@dataclass(frozen=True)
class Cell:
    state: str  # "" when no report ran this path on this stack
    label: str = ""
    kv: str = ""
    # ('16 findings', '2 PASS') where its arms differ in more than a planted fault caught beside PASSes; () otherwise
    tally: tuple[str, ...] = ()
    note: str = ""  # what the exit rule counts against a PASS (a P→D negative control that did not hold)
    reports: int = 0
    href: str = ""
    title: str = ""  # the cell in words, on hover


@dataclass(frozen=True)
class PictureRow:
    stack: Stack
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class Line:
    """One finding (or one stack's self-test) under the picture."""

    what: str  # 'LMCacheConnectorV1 answered differently on 2 of 4 probes, KV CORRUPT on 4 of 4'
    where: str  # the stack
    often: str  # 'in 3 of 3 reports'
    href: str


@dataclass(frozen=True)
class CellReports:
    """A cell of several reports: the list its link goes to."""

    anchor: str
    title: str  # 'LMCacheConnectorV1 · vLLM 0.28.0 + LMCache 0.5.4 · NVIDIA H200 · kvkit-tiny-qwen3-seed6'
    reports: tuple[tuple[str, str, str, str], ...]  # (href, name, state, what its arms show)


@dataclass(frozen=True)
class Picture:
    columns: tuple[tuple[tuple[str, ...], str], ...]  # (name in parts a line may break between, what it holds)
    rows: tuple[PictureRow, ...]
    findings: tuple[Line, ...]
    self_tests: tuple[Line, ...]
    lists: tuple[CellReports, ...]
    states: tuple[tuple[str, str], ...]  # the key: (state, words) of each state the picture shows


def _report_column(report: Report) -> str | None:
    """A column every reuse arm of the run goes under: the way the run differs from a plain offline one."""
    if report.adapters:
        return ADAPTERS
    if report.data.get("images"):
        return IMAGES
    if str(report.config.get("frontend") or "") in SERVED_FRONTENDS:
        return SERVED
    return None


def column_of(report: Report, arm: Arm) -> str:
    connector = str(arm.connector_name or "")
    if CONNECTOR_COLUMNS.get(connector) == SELF_TEST:
        return SELF_TEST
    if found := _report_column(report):
        return found
    if arm.mode == "native":
        return NATIVE
    return CONNECTOR_COLUMNS.get(connector, OTHER)


def _scenario_facts(report: Report, arm: Arm) -> tuple[int, int, bool]:
    """How many of the arm's scenario runs have a finding (their own, or a later trial's the exit rule counts), of
    how many, and whether one ended in ERROR."""
    later = {(sc, a) for sc, a, _, _ in scenario_later_findings(report.data)}
    errors = {(sc, a) for sc, a, _, _ in scenario_later_errors(report.data)}
    runs = [(sc.name, run) for sc in report.scenarios for run in sc.arms if run.name == arm.name]
    found = sum(run.is_finding or (name, arm.name) in later for name, run in runs)
    crashed = any(run.verdict == ERROR or (name, arm.name) in errors for name, run in runs)
    return found, len(runs), crashed


def path_fact(report: Report, arm: Arm) -> PathFact:
    compared = [p for p in arm.probes if p.verdict != SKIPPED]
    kv = [p.kv_verdict for p in arm.probes if p.kv_verdict is not None]
    kv_found = tuple((c, kv.count(c)) for c in KV_FINDINGS if c in kv)
    found, errors, idle = later_facts(report, arm.name)
    scenario_found, scenario_runs, crashed = _scenario_facts(report, arm)
    if arm.verdict == FAIL or kv_found or found or scenario_found:
        caught = not scenario_found and planted_fault_caught(report, arm) is not None  # None after a later finding
        state = CAUGHT if caught else FINDING
    elif arm.verdict == ERROR or errors or crashed:
        state = STATE_ERROR
    elif arm.verdict == INCONCLUSIVE or idle:
        state = STATE_INCONCLUSIVE
    else:
        state = STATE_PASS if arm.verdict == PASS else STATE_SKIPPED if arm.verdict == SKIPPED else STATE_INCONCLUSIVE
    return PathFact(
        column=column_of(report, arm),
        arm=arm.title,
        verdict=str(arm.verdict),
        state=state,
        kv=(arm.kv_worst or "") if report.kv_audit_state else "",
        failed=sum(p.verdict == FAIL for p in compared),
        compared=len(compared),
        kv_found=kv_found,
        kv_audited=len(kv),
        later=tuple(dict.fromkeys(run_label(run) for run, _, _ in found)),
        later_errors=tuple(dict.fromkeys([*(run_label(run) for run, _ in errors), *(["a scenario run"] * crashed)])),
        scenario_found=scenario_found,
        scenario_runs=scenario_runs,
        idle=tuple(idle),
    )


def stack_of(report: Report) -> Stack:
    lmcache = any(uses_lmcache(a) for a in report.arms)
    return Stack(
        vllm=report.vllm_version or report.package_version("vllm"),
        engine=report.engine_text if report.engine != "vLLM" else "",
        lmcache=f"LMCache {report.package_version('lmcache')}" if lmcache else "",
        hardware=report.hardware_label,
        model=model_label(report),
    )


def overview(report: Report) -> Overview:
    """What the picture reads of one report, from the read model once (repro.publish.site_index.build_index_row)."""
    return Overview(stack_of(report), tuple(path_fact(report, a) for a in report.reuse_arms))


def pd_overview(*, vllm: str, hardware: str, model: str, verdict: str, condition: str) -> Overview:
    """A P→D report's one arm (repro.disagg.page.index_row): its verdict as the P→D judge gave it; a run whose exit
    rule counts something against it (a negative control that did not hold) is marked in its words."""
    state = {FAIL: FINDING, ERROR: STATE_ERROR, PASS: STATE_PASS}.get(verdict, STATE_INCONCLUSIVE)
    fact = PathFact(PD, "NixlConnector P→D", verdict, state, note=condition)
    return Overview(Stack(vllm, "", hardware, model), (fact,))


@dataclass(frozen=True)
class _Run:
    fact: PathFact
    href: str
    name: str


def _rank(state: str) -> int:
    return STATES.index(state) if state in STATES else len(STATES)


def _said(fact: PathFact) -> str:
    """'FAIL · KV CORRUPT', 'PASS', 'FAIL (planted, caught)'."""
    text = fact.label + (f" · {fact.kv_label}" if fact.kv_label else "")
    return text + (" (planted, caught)" if fact.state == CAUGHT else "")


def _cell(runs: list[_Run], anchor: str, column: str, stack: Stack) -> Cell:
    if not runs:
        return Cell("")
    worst = min(runs, key=lambda r: _rank(r.fact.state)).fact
    reports = list(dict.fromkeys(r.href for r in runs))
    tally = Counter(r.fact.state for r in runs)
    shown = tuple(
        f"{tally[s]} {TALLY_WORDS[s]}" + ("s" if s == FINDING and tally[s] > 1 else "") for s in STATES if tally[s]
    )
    arms = ", ".join(dict.fromkeys(r.fact.arm for r in runs))
    said = Counter(_said(r.fact) for r in runs)
    words = ", ".join(f"{n} {t}" for t, n in sorted(said.items(), key=lambda t: (-t[1], t[0])))
    title = f"{column} on {stack.text}: {arms}; {words}; {len(reports)} report{'s' if len(reports) > 1 else ''}"
    return Cell(
        state=worst.state,
        label=worst.label,
        kv=worst.kv_label,
        tally=shown if set(tally) - {CAUGHT, STATE_PASS, STATE_SKIPPED} and len(tally) > 1 else (),
        note=next((r.fact.note for r in runs if r.fact.note), "") if worst.state == STATE_PASS else "",
        reports=len(reports),
        href=reports[0] if len(reports) == 1 else f"#{anchor}",
        title=title,
    )


def _often(found: int, of: int, what: str = "report") -> str:
    return f"in {found} of {of} {what}s" if of > 1 else f"in its one {what}"


def _what(arm: str, column: str, facts: list[PathFact]) -> str:
    """'LMCacheConnectorV1 answered differently on 2 of 4 probes, KV CORRUPT on 4 of 4' over facts, summed."""
    name = f"{arm} ({column})" if column in (SERVED, ADAPTERS, IMAGES) else arm
    parts = []
    failed, compared = sum(f.failed for f in facts), sum(f.compared for f in facts)
    if failed:
        parts.append(f"answered differently on {failed} of {compared} probes")
    audited = sum(f.kv_audited for f in facts)
    for cls in KV_FINDINGS:
        n = sum(dict(f.kv_found).get(cls, 0) for f in facts)
        if n:
            parts.append(f"KV {cls} on {n} of {audited}")
    later = list(dict.fromkeys(r for f in facts for r in f.later))
    if later:
        parts.append(f"a finding in {and_text(later[:3])}" + (f" and {len(later) - 3} more" if len(later) > 3 else ""))
    scenario_found, scenario_runs = sum(f.scenario_found for f in facts), sum(f.scenario_runs for f in facts)
    if scenario_found:
        parts.append(f"a finding {_often(scenario_found, scenario_runs, 'scenario run')}")
    idle = list(dict.fromkeys(m for f in facts for m in f.idle))
    if idle:
        parts.append(f"{and_text(idle)} not exercised")
    if not parts:
        return f"{name} {facts[0].label}"
    return f"{name}{'' if failed else ':'} {', '.join(parts)}"


def _cell_reports(anchor: str, title: str, runs: list[_Run]) -> CellReports:
    """The list a cell of several reports links to: each report, the worst its arms show, and what each arm shows."""
    listed: dict[tuple[str, str], list[PathFact]] = {}
    for r in runs:
        listed.setdefault((r.href, r.name), []).append(r.fact)
    reports = tuple(
        (href, name, min((f.state for f in facts), key=_rank), "; ".join(f"{f.arm} {_said(f)}" for f in facts))
        for (href, name), facts in listed.items()
    )
    return CellReports(anchor, title, reports)


def _finding_lines(runs: list[_Run], column: str, stack: Stack, cell: Cell) -> list[Line]:
    """One line per arm of the cell with a finding: what it showed over its reports, where, how often."""
    by_arm: dict[str, list[_Run]] = {}
    for r in runs:
        by_arm.setdefault(r.fact.arm, []).append(r)
    lines = []
    for arm, arm_runs in by_arm.items():
        found = [r for r in arm_runs if r.fact.state == FINDING]
        if found:
            reports = {r.href for r in found}
            often = _often(len(reports), len({r.href for r in arm_runs}))
            href = found[0].href if len(reports) == 1 else cell.href
            lines.append(Line(_what(arm, column, [r.fact for r in found]), stack.text, often, href))
    return lines


def _self_test_line(runs: dict[str, list[_Run]], stack: Stack, cells: dict[str, Cell]) -> Line | None:
    """The stack's self-tests whose planted fault was caught as the fixture expects, in one line; several reports
    link to the list of their column's cell (cells: by column), whatever state a worse arm beside them gives it."""
    caught = [r for by in runs.values() for r in by if r.fact.state == CAUGHT]
    if not caught:
        return None
    faults = ", ".join(dict.fromkeys(r.fact.arm for r in caught))
    reports = sorted({r.href for r in caught})
    href = reports[0] if len(reports) == 1 else cells[caught[0].fact.column].href  # a planted arm's: SELF_TEST
    return Line(f"the planted fault caught: {faults}", stack.text, _often(len(reports), len(reports)), href)


def build_picture(rows: list) -> Picture | None:
    """The picture of the index's rows (repro.publish.site_index.IndexRow) that carry an overview; None when none
    does (the index then opens with its table)."""
    runs: dict[Stack, dict[str, list[_Run]]] = {}
    for row in sorted(rows, key=lambda r: (r.stem, r.href)):
        if row.overview is None:
            continue
        for fact in row.overview.paths:
            runs.setdefault(row.overview.stack, {}).setdefault(fact.column, []).append(_Run(fact, row.href, row.stem))
    if not runs:
        return None
    columns = tuple(c for c in COLUMNS if any(c in by for by in runs.values()))
    picture_rows, findings, self_tests, lists = [], [], [], []
    for si, stack in enumerate(sorted(runs, key=lambda s: s.order, reverse=True)):
        cells = []
        for ci, column in enumerate(columns):
            mine, anchor = runs[stack].get(column, []), f"cell-{si}-{ci}"
            cell = _cell(mine, anchor, column, stack)
            cells.append(cell)
            if cell.reports > 1:
                lists.append(_cell_reports(anchor, f"{column} · {stack.text}", mine))
            findings += _finding_lines(mine, column, stack, cell)
        if line := _self_test_line(runs[stack], stack, dict(zip(columns, cells))):
            self_tests.append(line)
        picture_rows.append(PictureRow(stack, tuple(cells)))
    shown = {c.state for r in picture_rows for c in r.cells if c.state}
    return Picture(
        columns=tuple((tuple(_CAMEL.split(c)), COLUMN_WORDS[c]) for c in columns),
        rows=tuple(picture_rows),
        findings=tuple(findings),
        self_tests=tuple(self_tests),
        lists=tuple(lists),
        states=tuple((s, STATE_WORDS[s]) for s in STATES if s in shown),
    )
