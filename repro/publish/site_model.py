"""The report page's view model: small frozen objects built from the read model (repro.readmodel), so
templates only loop and print. Its sections beside it: repro.publish.site_kv (KV audit details),
repro.publish.site_conditions (conditions) and repro.publish.site_scenarios (scenarios); the index's rows are
repro.publish.site_index.

Pure: no file, clock or environment access. Every date shown comes from the report itself.
"""

import re
from dataclasses import dataclass, replace

from repro.judge.verdict import KV_FINDINGS
from repro.judge.wording import flatten, machine_path_name, show
from repro.publish.headline import EXPLORATORY, acceptance_text, headline
from repro.publish.heatmap import Heatmap, Legend, build_legend
from repro.publish.site_conditions import Conditions, page_conditions
from repro.publish.site_kv import KVDetail, kv_detail, kv_note
from repro.publish.site_scenarios import ScenarioBlock, scenario_block, scenarios_note
from repro.readmodel import (
    DIVERGENCE_LEGEND,
    KV_FINER_LEGEND,
    REPLAY_LEGEND,
    Arm,
    Probe,
    Report,
    Request,
    as_report,
    margin_class,
)

TOKENS_PER_ROW = 16  # token-ID grid width: wide enough for the usual 16-token window, narrow enough for a phone
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


@dataclass(frozen=True)
class TableRow:
    """One probe in the connector-vs-native table: name · prompt tokens · cached · verdict · @first diff."""

    probe: str
    tokens: str
    cached: str
    verdict: str
    diff: str
    note: str
    anchor: str
    kv: str = ""  # the KV verdict's cell (schema 2 with the audit on), e.g. "CORRUPT: blocks 0–15 (…)"
    kv_verdict: str = ""  # EXACT, NUMERIC, MISPLACED, FOREIGN, CORRUPT, UNAVAILABLE; "" when not audited
    # a FAIL's divergences with their classes, ("@13 (near-tie, gap 0.045 nats)", "near-tie") each; then
    # the cell shows these instead of diff
    classes: tuple[tuple[str, str], ...] = ()
    # what qualifies a FAIL (or KV finding): ("intermittent 3/5", True), ("5/5 trials", False); () without trials
    marks: tuple[tuple[str, bool], ...] = ()
    replays: str = ""  # "reuse 1: replays fixture's answer from @0, 7 tokens"; "" when no reuse replays anything


@dataclass(frozen=True)
class ArmBlock:
    title: str
    verdict: str
    rows: tuple[TableRow, ...]
    error: tuple[str, str, str] | None  # kind, detail, log tail
    findings: tuple[str, ...]
    kv_status: str = ""  # "KV audit: ok · floor rel …" (schema 2 with the audit on)
    divergences: str = ""  # a FAIL arm's divergences by class: "decisive: 6", "near-ties only: 2"
    near_ties_only: bool = False  # every divergence of this FAIL arm is a near-tie: its own badge
    condition: str = (
        ""  # "contention-dependent: clean when re-run alone, …" (repro.readmodel.ArmConditions.finding_class_text)
    )
    qualified: bool = False  # the finding was intermittent or needed the shared device: shown as a warning


@dataclass(frozen=True)
class TokenCell:
    text: str
    css: str  # "" same as baseline, "diff" differs, "first" the recorded first difference, "gap" absent;
    # "diff replay" / "first replay": inside a run the reuse replays from another answer (repro.judge.replays)


@dataclass(frozen=True)
class TokenChunk:
    indices: tuple[int, ...]
    lines: tuple[tuple[str, tuple[TokenCell, ...]], ...]


@dataclass(frozen=True)
class RequestLine:
    label: str
    cached: str
    first_diff: str
    finish: str
    margin: str
    text: str
    divergence: str = ""  # the divergence's class (decisive, near-tie, unclassed); "" when it did not diverge


@dataclass(frozen=True)
class ProbeDetail:
    anchor: str
    arm: str
    probe: str
    verdict: str
    reasons: tuple[str, ...]
    skipped: str
    requests: tuple[RequestLine, ...]
    chunks: tuple[TokenChunk, ...]
    kv: KVDetail | None = None  # schema 2 with the audit on, for an audited probe
    replays: tuple[str, ...] = ()  # a line per reuse that replays another answer (repro.readmodel.Probe.replay_lines)


@dataclass(frozen=True)
class LeadMap:
    """The page's first picture, under its headline: one heatmap of the first probe with a KV finding."""

    arm: str
    probe: str
    anchor: str  # the probe's details, where its other reuses' heatmaps are
    heatmap: Heatmap
    more: int  # the heatmaps the page draws in all


@dataclass(frozen=True)
class ArmLog:
    arm: str
    path: str
    href: str | None  # None: the log was not beside the report


@dataclass(frozen=True)
class ReportPage:
    stem: str
    title: str  # the headline (repro.publish.headline), also the page's <title>
    claim: str
    headline: str
    subline: str  # hardware · kit commit · date · generations · the exit code and why
    acceptance: str  # acceptance.matched and what it is (the kit's self-check, not the stack's verdict)
    baseline: str
    blocks: tuple[ArmBlock, ...]
    details: tuple[ProbeDetail, ...]
    warnings: tuple[tuple[str, int, str], ...]
    warning_total: int
    provenance: tuple[tuple[str, str], ...]
    configs: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    reproduce: str
    raw_href: str
    logs: tuple[ArmLog, ...]
    kv: bool = False  # a KV column and heatmaps (schema 2 with the audit on)
    kv_note: str = ""  # the audit's state near the table; "" for a report made before the audit
    kv_legend: Legend | None = None
    kv_finer_legend: str = ""  # what MISPLACED and FOREIGN mean, on a page that shows one; "" otherwise
    divergence_legend: str = DIVERGENCE_LEGEND
    conditions: Conditions | None = None  # None: the report records none of the conditions (issue 18)
    conditions_warning: str = ""  # a finding that was intermittent or needed the shared device, by arm
    replay_legend: str = ""  # what a replay is, on a page that shows one; "" otherwise
    scenarios: tuple[ScenarioBlock, ...] = ()  # () for a report without scenarios (its page is as it was)
    scenarios_note: str = ""  # scenarios asked for (config.scenarios) but none in the report; "" otherwise
    lead_map: LeadMap | None = None  # None: no probe with a KV finding has a heatmap
    # a MultiConnector arm's members: (arm title, each member's line: what it served, its hits, its verdict)
    members: tuple[tuple[str, tuple[str, ...]], ...] = ()
    adapters: tuple[str, ...] = ()  # the LoRA adapters probes ran under, a line each; () without them
    raw_name: str = ""  # the raw report's file name ('NAME.json', 'NAME.json.xz')
    # the table's legend, from this page's own cells: ('0→1488×3', its words), ('@9', its words); "" where none has one
    cached_example: tuple[str, str] = ("", "")
    diff_example: tuple[str, str] = ("", "")
    device: str = "device"  # what the engine ran on, as the Conditions section names it: 'GPU', 'CPU'


def visible_text(text: object) -> str:
    """Decoded model text with control characters spelled out (\\x11, \\n): HTML cannot show them."""
    if not isinstance(text, str):
        return "—"
    return _CONTROL.sub(lambda m: _ESCAPES.get(m.group(), f"\\x{ord(m.group()):02x}"), text)


def format_margin(margin: object) -> str:
    """The logprob margin at the divergence on both sides, e.g. '@9: baseline 152 (margin 0.682) · reuse 228 …',
    ending with the divergence's class, which the top-2 gap decides ('· near-tie')."""
    if not isinstance(margin, dict):
        return "—"

    def num(key: str) -> str:
        v = margin.get(key)
        return "?" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    text = (
        f"@{num('index')}: baseline {num('baseline_token')} (margin {num('baseline_margin')}, "
        f"top-2 gap {num('baseline_top_gap')}) · reuse {num('reuse_token')} (margin {num('reuse_margin')})"
    )
    if margin.get("baseline_gap_lower_bound") is not None:
        text += f" · gap ≥ {num('baseline_gap_lower_bound')}"
    return f"{text} · {margin_class(margin)}"


def _cell_text(value: object) -> str:
    return "?" if value is None else str(value)


def _table_row(arm: Arm, probe: Probe, anchor: str, kv: bool) -> TableRow:
    return TableRow(
        probe=probe.title,
        tokens=probe.tokens_text,
        cached=probe.cached_cell,
        verdict=str(probe.verdict),
        diff=probe.diff_cell,
        note=probe.skipped,
        anchor=anchor,
        kv=probe.kv_cell if kv else "",
        kv_verdict=(probe.kv_verdict or "") if kv else "",
        classes=tuple((g.text, g.cls) for g in probe.classed_divergences),
        marks=tuple((m.text, m.qualifies) for m in arm.marks(probe)),
        replays="; ".join(probe.replay_lines() + probe.prompt_logprob_lines()),  # and what prompt logprobs show
    )


def _arm_block(arm: Arm, arm_index: int, kv: bool) -> ArmBlock:
    err = arm.error
    error = (
        tuple(
            machine_path_name(str(x)) for x in (err.get("kind", "?"), err.get("detail", ""), err.get("log_tail") or "")
        )
        if err
        else None
    )
    rows = tuple(_table_row(arm, p, f"d{arm_index}-{i}", kv) for i, p in enumerate(arm.probes))
    return ArmBlock(
        title=arm.title,
        verdict=str(arm.verdict),
        rows=rows,
        error=error,
        findings=tuple(machine_path_name(f) for f in arm.findings),
        kv_status=arm.kv_text if kv else "",
        divergences=arm.class_text,
        near_ties_only=arm.near_ties_only,
        condition=arm.conditions.finding_class_text,
        qualified=arm.conditions.qualified,
    )


def _token_chunks(baseline: list | None, probe: Probe) -> tuple[TokenChunk, ...]:
    """Baseline and every request's token IDs aligned by index, TOKENS_PER_ROW to a row."""
    lines: list[tuple[str, list, int | None, set[int]]] = []
    if baseline is not None:
        lines.append(("baseline", baseline, None, set()))
    for reuse_no, req in probe.numbered_requests():
        ids = list(req.token_ids or [])
        lines.append((probe.request_label(reuse_no, req), ids, req.first_diff, req.replay_indices))
    width = max((len(ids) for _, ids, _, _ in lines), default=0)
    chunks = []
    for start in range(0, width, TOKENS_PER_ROW):
        idx = tuple(range(start, min(start + TOKENS_PER_ROW, width)))
        rows = []
        for label, ids, first, replayed in lines:
            cells = []
            for i in idx:
                replay = " replay" if i in replayed else ""
                if i >= len(ids):
                    cells.append(TokenCell("", "first" if i == first else "gap"))
                elif i == first:
                    cells.append(TokenCell(str(ids[i]), "first" + replay))
                elif baseline is not None and (i >= len(baseline) or ids[i] != baseline[i]):
                    cells.append(TokenCell(str(ids[i]), "diff" + replay))
                else:
                    cells.append(TokenCell(str(ids[i]), ""))
            rows.append((label, tuple(cells)))
        chunks.append(TokenChunk(indices=idx, lines=tuple(rows)))
    return tuple(chunks)


def _request_line(label: str, req: Request) -> RequestLine:
    first = req.first_diff
    return RequestLine(
        label,
        _cell_text(req.cached_tokens),
        "" if first is None else f"@{first}",
        str(req.finish_reason or ""),
        format_margin(req.margin),
        visible_text(req.text),
        req.divergence_class or "",
    )


def _probe_detail(
    arm: Arm, probe: Probe, baseline_probe: Probe | None, anchor: str, kv: bool = False, block_size: int | None = None
) -> ProbeDetail:
    base = baseline_probe.requests[0] if baseline_probe is not None and baseline_probe.requests else None
    lines = []
    if base is not None:
        b = base
        lines.append(
            RequestLine(
                "baseline", _cell_text(b.cached_tokens), "", str(b.finish_reason or ""), "—", visible_text(b.text)
            )
        )
    lines += [_request_line(probe.request_label(no, req), req) for no, req in probe.numbered_requests()]
    base_ids = list(base.token_ids or []) if base is not None else None
    return ProbeDetail(
        anchor=anchor,
        arm=arm.title,
        probe=probe.title,
        verdict=str(probe.verdict),
        reasons=tuple(machine_path_name(r) for r in probe.reasons),
        skipped=probe.skipped,
        requests=tuple(lines),
        chunks=_token_chunks(base_ids, probe) if probe.requests else (),
        kv=kv_detail(arm, probe, anchor, block_size) if kv else None,
        replays=probe.replay_lines(whole=True),
    )


def _baseline_line(report: Report) -> str:
    base = report.baseline
    if base is None:
        return "baseline: absent"
    reasons = machine_path_name("; ".join(str(r) for r in base.reasons))
    return f"baseline (prefix caching off, no connector): {base.verdict}" + (f" — {reasons}" if reasons else "")


def _provenance(report: Report) -> tuple[tuple[str, str], ...]:
    """The provenance as (dotted key, value): a path of the machine that made the report shown by its
    name (the full value is in the raw JSON)."""
    prov = report.provenance
    pairs = [("kit.commit", report.commit), ("hardware_label", report.hardware_label)]
    pairs += [kv for kv in flatten({k: v for k, v in prov.items() if k not in ("argv", "kit")}) if kv[0]]
    pairs += [(f"kit.{k}", v) for k, v in flatten(prov.get("kit") or {}) if k not in ("commit", "dirty")]
    return tuple((k, machine_path_name(v)) for k, v in pairs)


def _cached_example(report: Report) -> tuple[str, str]:
    """The table's first cached cell with reuses ('0→1488×3') and what it says, in this page's own figures."""
    for arm in report.reuse_arms:
        for probe in arm.probes:
            reuses = probe.reuses
            if not probe.requests or not reuses:
                continue
            cell = probe.cached_cell
            cold = probe.requests[0].cached_tokens
            counts = ["?" if r.cached_tokens is None else str(r.cached_tokens) for r in reuses]
            said = f"the cold request reported {'?' if cold is None else cold} cached tokens, "
            if len(set(counts)) == 1:
                said += f"each of the {len(reuses)} reuses {counts[0]}" if len(reuses) > 1 else f"the reuse {counts[0]}"
            else:
                said += "the reuses " + ", ".join(counts) + " in turn"
            return cell, said + " (?: not reported)"
    return "", ""


def _diff_example(report: Report) -> tuple[str, str]:
    """The table's first first-diff cell ('@9', '@4,15') and what it says, in this page's own figures."""
    for arm in report.reuse_arms:
        for probe in arm.probes:
            if probe.diff_cell:
                many = "," in probe.diff_cell
                where = "the indices where a reuse first differs" if many else "the first index where a reuse differs"
                return probe.diff_cell, f"{where} from the baseline's answer"
    return "", ""


def _acceptance(report: Report) -> str:
    """acceptance.matched where the fixture states expected verdicts; elsewhere the run is exploratory, said so."""
    if report.states_expectations:
        return acceptance_text(report)
    return (
        f"{EXPLORATORY}: the fixture states no expected verdict for this run, so there is no self-check "
        "(acceptance.matched) to show; the verdicts are the stack's"
    )


def build_report_page(
    report: Report | dict, *, stem: str, raw_href: str, log_hrefs: dict[str, str | None], raw_name: str = ""
) -> ReportPage:
    """The report page's view model; log_hrefs maps an arm's name to its copied log (None: not available)."""
    report = as_report(report)
    audit = report.kv_audit_state
    blocks, details = [], []
    for ai, arm in enumerate(report.arms):
        if arm.is_baseline:
            continue
        blocks.append(_arm_block(arm, ai, bool(audit)))
        for pi, probe in enumerate(arm.probes):
            base = report.baseline_probe(probe.name)
            details.append(_probe_detail(arm, probe, base, f"d{ai}-{pi}", bool(audit), report.block_size))
    warnings = tuple(
        (str(w.get("arm", "")), int(w.get("count", 0)), machine_path_name(str(w.get("message", ""))))
        for w in report.warnings
    )
    configs = tuple((a.title, _config_pairs(a)) for a in report.arms)
    sentence = headline(report)
    return ReportPage(
        stem=stem,
        title=sentence,
        claim=show(report.claim_eligible),
        headline=sentence,
        subline=f"{report.headline} · {report.generations} generations · {report.exit_text}",
        acceptance=_acceptance(report),
        baseline=_baseline_line(report),
        blocks=tuple(blocks),
        details=tuple(details),
        warnings=warnings,
        warning_total=sum(w[1] for w in warnings),
        provenance=_provenance(report),
        configs=configs,
        reproduce=machine_path_name(report.reproduce_command),
        raw_href=raw_href,
        logs=tuple(
            ArmLog(arm=a.name, path=machine_path_name(str(a.log or "—")), href=log_hrefs.get(a.name))
            for a in report.arms
        ),
        kv=bool(audit),
        kv_note=kv_note(report, audit),
        kv_legend=build_legend(_drawn_classes(details)) if audit else None,
        kv_finer_legend=KV_FINER_LEGEND if audit and report.shows_finer_kv else "",
        conditions=page_conditions(report),
        conditions_warning=report.conditions_warning,
        replay_legend=REPLAY_LEGEND if any(d.replays for d in details) else "",
        scenarios=tuple(scenario_block(sc, i, report.probe_title) for i, sc in enumerate(report.scenarios)),
        scenarios_note=scenarios_note(report),
        lead_map=_lead_map(details),
        members=tuple((a.title, tuple(m.line for m in a.members)) for a in report.arms if a.members),
        adapters=report.adapter_lines,
        raw_name=raw_name or f"{stem}.json",
        cached_example=_cached_example(report),
        diff_example=_diff_example(report),
        device=report.device_kind if report.device_kind in ("GPU", "CPU") else "device",
    )


def _lead_map(details: list[ProbeDetail]) -> LeadMap | None:
    """The first heatmap of the first probe with a KV finding (CORRUPT, FOREIGN, MISPLACED), with its own anchor (the
    same picture is drawn again in the probe's details)."""
    drawn = sum(len(d.kv.heatmaps) for d in details if d.kv is not None)
    for d in details:
        if d.kv is not None and d.kv.heatmaps and d.kv.verdict in KV_FINDINGS:
            h = d.kv.heatmaps[0]
            return LeadMap(d.arm, d.probe, d.anchor, replace(h, anchor=f"lead-{h.anchor}"), drawn)
    return None


def _drawn_classes(details: list[ProbeDetail]) -> frozenset[str]:
    """The KV cell classes the page's heatmaps draw (the legend keys the finer findings only where drawn)."""
    return frozenset(c for d in details if d.kv is not None for h in d.kv.heatmaps for c in h.classes)


def _config_pairs(arm: Arm) -> tuple[tuple[str, str], ...]:
    return tuple((k, machine_path_name(v)) for k, v in flatten(arm.effective_config or {}))
