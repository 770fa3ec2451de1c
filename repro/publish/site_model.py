"""The report site's view models: small frozen objects built from a report dict, so templates only loop and print.

Pure: no file, clock or environment access. Every date shown comes from the report itself.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from repro.display import (
    DIVERGENCE_LEGEND,
    REPLAY_LEGEND,
    acceptance_label,
    arm_class_text,
    arm_copy_paths,
    arm_divergences,
    arm_kv_text,
    arm_title,
    baseline_arm,
    baseline_probes,
    cached_cell,
    classed_divergences,
    commit_label,
    conditions_pairs,
    conditions_warning,
    confirmation_reason,
    confirmation_text,
    day,
    diff_cell,
    divergence_class,
    finding_class_text,
    flatten,
    gpu_text,
    has_arm_conditions,
    headline,
    is_commit_hash,
    kv_audit_state,
    kv_cell,
    kv_tally,
    kv_verdict,
    margin_class,
    number,
    probe_condition_marks,
    probe_replay_lines,
    qualified,
    rate_cell,
    replay_indices,
    run_probe_text,
    sharing_overlaps,
    sharing_text,
    sharing_window,
    show,
    trial_diffs_text,
    trial_rate_text,
    trial_rates,
)
from repro.publish.heatmap import Heatmap, Legend, build_heatmap, build_legend

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
    kv_verdict: str = ""  # EXACT, NUMERIC, CORRUPT, UNAVAILABLE; "" when the probe was not audited
    # a FAIL's divergences with their classes, ("@13 (near-tie, gap 0.045 nats)", "near-tie") each; then
    # the cell shows these instead of diff
    classes: tuple[tuple[str, str], ...] = ()
    # what qualifies a FAIL (or KV CORRUPT): ("intermittent 3/5", True), ("5/5 trials", False); () without trials
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
    condition: str = ""  # "contention-dependent: clean when re-run alone, …" (repro.display.finding_class_text)
    qualified: bool = False  # the finding was intermittent or needed the shared device: shown as a warning


@dataclass(frozen=True)
class TokenCell:
    text: str
    css: str  # "" same as baseline, "diff" differs, "first" the recorded first difference, "gap" absent;
    # "diff replay" / "first replay": inside a run the reuse replays from another answer (repro.replays)


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
    replays: tuple[str, ...] = ()  # a line per reuse that replays another answer (repro.display.probe_replay_lines)


@dataclass(frozen=True)
class KVDetail:
    """A probe's KV audit: its verdict and reasons, a line per request without a heatmap, a heatmap per audited reuse."""

    verdict: str
    cell: str
    reasons: tuple[str, ...]
    lines: tuple[str, ...]
    heatmaps: tuple[Heatmap, ...]


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
    run: tuple[tuple[str, str], ...]  # trials, re-run alone, lmcache-ops, gpu-load
    arms: tuple[ArmConditions, ...]


@dataclass(frozen=True)
class ArmLog:
    arm: str
    path: str
    href: str | None  # None: the log was not beside the report


@dataclass(frozen=True)
class ReportPage:
    stem: str
    title: str
    claim: str
    headline: str
    subline: str
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
    divergence_legend: str = DIVERGENCE_LEGEND
    conditions: Conditions | None = None  # None: the report records none of the conditions (issue 18)
    conditions_warning: str = ""  # a finding that was intermittent or needed the shared device, by arm
    replay_legend: str = ""  # what a replay is, on a page that shows one; "" otherwise


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


def visible_text(text: object) -> str:
    """Decoded model text with control characters spelled out (\\x11, \\n): HTML cannot show them."""
    if not isinstance(text, str):
        return "—"
    return _CONTROL.sub(lambda m: _ESCAPES.get(m.group(), f"\\x{ord(m.group()):02x}"), text)


def package_version(report: dict, name: str) -> str:
    prov = report["provenance"]
    value = (prov.get("packages") or {}).get(name) or (prov.get("engine_versions") or {}).get(name)
    return "—" if value is None else str(value)


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


def _table_row(arm: dict, probe: dict, anchor: str, kv: bool, block_size: int | None) -> TableRow:
    tokens = "" if probe.get("prompt_tokens") is None else str(probe["prompt_tokens"])
    note = str(probe.get("skipped") or "")
    return TableRow(
        probe=str(probe["name"]),
        tokens=tokens,
        cached=cached_cell(probe),
        verdict=str(probe["verdict"]),
        diff=diff_cell(probe),
        note=note,
        anchor=anchor,
        kv=kv_cell(probe, block_size) if kv else "",
        kv_verdict=(kv_verdict(probe) or "") if kv else "",
        classes=tuple((g.text, g.cls) for g in classed_divergences(probe)),
        marks=tuple((m.text, m.qualifies) for m in probe_condition_marks(arm, probe)),
        replays="; ".join(probe_replay_lines(probe)),
    )


def _arm_block(arm: dict, arm_index: int, kv: bool, block_size: int | None) -> ArmBlock:
    err = arm.get("error")
    error = (str(err.get("kind", "?")), str(err.get("detail", "")), str(err.get("log_tail") or "")) if err else None
    rows = tuple(_table_row(arm, p, f"d{arm_index}-{i}", kv, block_size) for i, p in enumerate(arm.get("probes") or []))
    return ArmBlock(
        title=arm_title(arm),
        verdict=str(arm["verdict"]),
        rows=rows,
        error=error,
        findings=tuple(str(f) for f in arm.get("findings") or []),
        kv_status=arm_kv_text(arm) if kv else "",
        divergences=arm_class_text(arm),
        near_ties_only=bool(arm_class_text(arm)) and arm_divergences(arm).near_ties_only,
        condition=finding_class_text(arm),
        qualified=qualified(arm),
    )


def _arm_conditions(arm: dict) -> ArmConditions:
    conf = arm.get("confirmation") if isinstance(arm.get("confirmation"), dict) else {}
    alone = conf.get("run") if isinstance(conf.get("run"), dict) else {}
    return ArmConditions(
        arm=arm_title(arm),
        gpu=gpu_text(arm),
        sharing=sharing_text(arm),
        window=sharing_window(arm),
        overlaps=tuple(sharing_overlaps(arm)),
        copy_paths=tuple(
            tuple(str(p.get(k) or "") for k in ("process", "path", "source", "detail")) for p in arm_copy_paths(arm)
        ),
        trials=trial_rate_text(arm),
        rates=tuple(
            RateRow(str(r.get("probe")), rate_cell(r), str(r.get("class")), trial_diffs_text(arm, str(r.get("probe"))))
            for r in trial_rates(arm)
        ),
        confirmation=confirmation_text(arm),
        confirmation_reason=confirmation_reason(arm),
        confirmation_run=tuple((str(p.get("name")), run_probe_text(p)) for p in alone.get("probes") or []),
    )


def _conditions(report: dict) -> Conditions | None:
    """The page's Conditions section; None for a report that records none of them (its page is as it was)."""
    run = tuple(conditions_pairs(report))
    arms = tuple(_arm_conditions(a) for a in report["arms"] if has_arm_conditions(a))
    return Conditions(run=run, arms=arms) if run or arms else None


def _kv_request_line(label: str, audit: object) -> str | None:
    """A request the heatmap does not show, in words; None for an audited reuse (it gets a heatmap)."""
    if not isinstance(audit, dict):
        return f"{label}: not audited"
    status = audit.get("status")
    if status == "floor":
        same = "bit-identical to the baseline's" if audit.get("identical") else "not bit-identical to the baseline's"
        return (
            f"{label}: its prefill KV ({audit.get('num_blocks')} blocks × {audit.get('layers')} layers) is {same}; "
            f"max rel {number(audit.get('max_rel'))}, max abs {number(audit.get('max_abs'))}"
        )
    if status == "audited":
        return None
    return f"{label}: KV audit {status}" + (f": {audit['reason']}" if audit.get("reason") else "")


def _kv_detail(arm: dict, probe: dict, anchor: str, block_size: int | None) -> KVDetail | None:
    if not isinstance(probe.get("kv"), dict):
        return None
    floor = (arm.get("kv_audit") or {}).get("floor")
    lines, heatmaps, reuse_no = [], [], 0
    for req in probe.get("requests") or []:
        reuse_no += req.get("role") == "reuse"
        label = _request_label(req, reuse_no)
        line = _kv_request_line(label, req.get("kv_audit"))
        if line is None:
            heatmaps.append(
                build_heatmap(req, label=label, anchor=f"{anchor}-kv{reuse_no}", floor=floor, block_size=block_size)
            )
        else:
            lines.append(line)
    return KVDetail(
        verdict=kv_verdict(probe) or "",
        cell=kv_cell(probe, block_size),
        reasons=tuple(str(r) for r in probe["kv"].get("reasons") or []),
        lines=tuple(lines),
        heatmaps=tuple(heatmaps),
    )


def _request_label(req: dict, reuse_no: int) -> str:
    return f"reuse {reuse_no}" if req.get("role") == "reuse" else str(req.get("role", "?"))


def _token_chunks(baseline: list | None, requests: list[dict]) -> tuple[TokenChunk, ...]:
    """Baseline and every request's token IDs aligned by index, TOKENS_PER_ROW to a row."""
    lines: list[tuple[str, list, int | None, set[int]]] = []
    if baseline is not None:
        lines.append(("baseline", baseline, None, set()))
    reuse_no = 0
    for req in requests:
        reuse_no += req.get("role") == "reuse"
        ids = list(req.get("token_ids") or [])
        lines.append((_request_label(req, reuse_no), ids, req.get("first_diff"), replay_indices(req)))
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


def _probe_detail(
    arm: dict, probe: dict, baseline_probe: dict | None, anchor: str, kv: bool = False, block_size: int | None = None
) -> ProbeDetail:
    requests = list(probe.get("requests") or [])
    base_reqs = (baseline_probe or {}).get("requests") or []
    base_ids = list(base_reqs[0].get("token_ids") or []) if base_reqs else None
    lines = []
    if base_reqs:
        b = base_reqs[0]
        lines.append(
            RequestLine(
                "baseline",
                _cell_text(b.get("cached_tokens")),
                "",
                str(b.get("finish_reason") or ""),
                "—",
                visible_text(b.get("text")),
            )
        )
    reuse_no = 0
    for req in requests:
        reuse_no += req.get("role") == "reuse"
        first = req.get("first_diff")
        lines.append(
            RequestLine(
                _request_label(req, reuse_no),
                _cell_text(req.get("cached_tokens")),
                "" if first is None else f"@{first}",
                str(req.get("finish_reason") or ""),
                format_margin(req.get("margin")),
                visible_text(req.get("text")),
                divergence_class(req) or "",
            )
        )
    return ProbeDetail(
        anchor=anchor,
        arm=arm_title(arm),
        probe=str(probe["name"]),
        verdict=str(probe["verdict"]),
        reasons=tuple(str(r) for r in probe.get("reasons") or []),
        skipped=str(probe.get("skipped") or ""),
        requests=tuple(lines),
        chunks=_token_chunks(base_ids, requests) if requests else (),
        kv=_kv_detail(arm, probe, anchor, block_size) if kv else None,
        replays=tuple(probe_replay_lines(probe, whole=True)),
    )


def reproduce_command(provenance: dict) -> str:
    """The exact command that made the report, preceded by the checkout of its commit when known."""
    cmd = "python -m repro.verify_kv_reuse " + shlex.join(str(a) for a in provenance.get("argv") or [])
    commit = str((provenance.get("kit") or {}).get("commit", ""))
    return (f"git checkout {commit}\n" if is_commit_hash(commit) else "") + cmd.rstrip()


def _baseline_line(report: dict) -> str:
    base = baseline_arm(report)
    if base is None:
        return "baseline: absent"
    reasons = "; ".join(str(r) for r in base.get("reasons") or [])
    return f"baseline (prefix caching off, no connector): {base['verdict']}" + (f" — {reasons}" if reasons else "")


def _kv_note(report: dict, audit: bool | None) -> str:
    """The KV audit's state for the whole report, near the table ("" for a report made before the audit)."""
    if audit is None:
        return ""
    if not audit:
        return "KV audit: off for this run (token verdicts only)."
    base = baseline_arm(report)
    keep = (report.get("config") or {}).get("keep_kv")
    text = f"baseline {arm_kv_text(base)}" if base else "baseline: absent, no reference KV"
    return text + (f"; KV tensors kept in {keep}" if keep else "") + "."


def build_report_page(report: dict, *, stem: str, raw_href: str, log_hrefs: dict[str, str | None]) -> ReportPage:
    """The report page's view model; log_hrefs maps an arm's name to its copied log (None: not available)."""
    arms = report["arms"]
    base_probes = baseline_probes(report)
    audit = kv_audit_state(report)
    block_size = (report.get("config") or {}).get("block_size")
    blocks, details = [], []
    for ai, arm in enumerate(arms):
        if arm["mode"] == "baseline":
            continue
        blocks.append(_arm_block(arm, ai, bool(audit), block_size))
        for pi, probe in enumerate(arm.get("probes") or []):
            base = base_probes.get(probe["name"])
            details.append(_probe_detail(arm, probe, base, f"d{ai}-{pi}", bool(audit), block_size))
    warnings = tuple(
        (str(w.get("arm", "")), int(w.get("count", 0)), str(w.get("message", ""))) for w in report.get("warnings") or []
    )
    prov = report["provenance"]
    provenance = [("kit.commit", commit_label(prov)), ("hardware_label", str(report.get("hardware_label", "?")))]
    provenance += [kv for kv in flatten({k: v for k, v in prov.items() if k not in ("argv", "kit")}) if kv[0]]
    provenance += [(f"kit.{k}", v) for k, v in flatten(prov.get("kit") or {}) if k not in ("commit", "dirty")]
    configs = tuple((arm_title(a), tuple(flatten(a.get("effective_config") or {}))) for a in arms)
    return ReportPage(
        stem=stem,
        title=f"{report.get('hardware_label', '?')} · {day(report)}",
        claim=show(report.get("claim_eligible", False)),
        headline=headline(report),
        subline=f"{report.get('generations', '?')} generations · acceptance.matched = {acceptance_label(report)}",
        baseline=_baseline_line(report),
        blocks=tuple(blocks),
        details=tuple(details),
        warnings=warnings,
        warning_total=sum(w[1] for w in warnings),
        provenance=tuple(provenance),
        configs=configs,
        reproduce=reproduce_command(prov),
        raw_href=raw_href,
        logs=tuple(
            ArmLog(arm=str(a["name"]), path=str(a.get("log") or "—"), href=log_hrefs.get(a["name"])) for a in arms
        ),
        kv=bool(audit),
        kv_note=_kv_note(report, audit),
        kv_legend=build_legend() if audit else None,
        conditions=_conditions(report),
        conditions_warning=conditions_warning(report),
        replay_legend=REPLAY_LEGEND if any(d.replays for d in details) else "",
    )


def build_index_row(report: dict, *, stem: str, href: str) -> IndexRow:
    return IndexRow(
        href=href,
        stem=stem,
        hardware=str(report.get("hardware_label", "?")),
        date=day(report),
        commit=commit_label(report["provenance"]),
        vllm=package_version(report, "vllm"),
        lmcache=package_version(report, "lmcache"),
        verdicts=tuple(_index_verdict(a) for a in report["arms"]),
        acceptance=acceptance_label(report, short=True),
        kv=_index_kv(report),
    )


def _index_verdict(arm: dict) -> IndexVerdict:
    note = arm_class_text(arm)
    return IndexVerdict(
        arm=arm_title(arm),
        verdict=str(arm["verdict"]),
        divergences=note,
        near_ties_only=bool(note) and arm_divergences(arm).near_ties_only,
        condition=finding_class_text(arm) if qualified(arm) else "",
    )


def _index_kv(report: dict) -> tuple[tuple[str, str], ...] | None:
    audit = kv_audit_state(report)
    if audit is None:
        return None
    if not audit:
        return (("KV audit", "off"),)
    return tuple((arm_title(a), kv_tally(a)) for a in report["arms"] if a["mode"] != "baseline")
