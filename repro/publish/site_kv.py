"""The report page's KV audit views: a probe's KV detail (its verdict, a line per request the heatmap does not
show, a heatmap per audited reuse) and the audit's state near the table. Pure, as repro.publish.site_model.
"""

from __future__ import annotations

from dataclasses import dataclass

from repro.judge.wording import machine_path_name, number
from repro.publish.heatmap import Heatmap, build_heatmap
from repro.readmodel import Arm, Probe, Report, RequestAudit


@dataclass(frozen=True)
class KVDetail:
    """A probe's KV audit: its verdict and reasons, a line per request without a heatmap, a heatmap per audited reuse."""

    verdict: str
    cell: str
    reasons: tuple[str, ...]
    lines: tuple[str, ...]
    heatmaps: tuple[Heatmap, ...]


def _kv_request_line(label: str, audit: RequestAudit | None) -> str | None:
    """A request the heatmap does not show, in words; None for an audited reuse (it gets a heatmap)."""
    if audit is None:
        return f"{label}: not audited"
    status = audit.status
    if status == "floor":
        same = "bit-identical to the baseline's" if audit.get("identical") else "not bit-identical to the baseline's"
        return (
            f"{label}: its prefill KV ({audit.get('num_blocks')} blocks × {audit.get('layers')} layers) is {same}; "
            f"max rel {number(audit.get('max_rel'))}, max abs {number(audit.get('max_abs'))}"
        )
    if status == "audited":
        return None
    return f"{label}: KV audit {status}" + (f": {audit.get('reason')}" if audit.get("reason") else "")


def kv_detail(arm: Arm, probe: Probe, anchor: str, block_size: int | None) -> KVDetail | None:
    if probe.kv is None:
        return None
    lines, heatmaps = [], []
    for reuse_no, req in probe.numbered_requests():
        label = probe.request_label(reuse_no, req)
        line = _kv_request_line(label, req.kv_audit)
        if line is None:
            heatmaps.append(
                build_heatmap(
                    req, label=label, anchor=f"{anchor}-kv{reuse_no}", floor=arm.kv_floor, block_size=block_size
                )
            )
        else:
            lines.append(line)
    return KVDetail(
        verdict=probe.kv_verdict or "",
        cell=probe.kv_cell,
        reasons=probe.kv.reasons,
        lines=tuple(lines),
        heatmaps=tuple(heatmaps),
    )


def kv_note(report: Report, audit: bool | None) -> str:
    """The KV audit's state for the whole report, near the table ("" for a report made before the audit)."""
    if audit is None:
        return ""
    if not audit:
        return "KV audit: off for this run (token verdicts only)."
    base = report.baseline
    keep = report.config.get("keep_kv")
    text = f"baseline {base.kv_text}" if base else "baseline: absent, no reference KV"
    return text + (f"; KV tensors kept in {machine_path_name(str(keep))}" if keep else "") + "."
