"""The detection matrix's page: load the matrix, build its view model, render it with the site's environment."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from repro.atomic import write_bytes_atomic
from repro.detection.matrix import summarize
from repro.detection.plan import KIND, SCHEMA_VERSION
from repro.errors import UsageError
from repro.publish.environment import make_environment

TEMPLATE = "detection.html.j2"
GENERATOR = "kvkit-detection"  # not the site's marker: the report site never prunes this page


@dataclass(frozen=True)
class CellView:
    status: str
    text: str


@dataclass(frozen=True)
class FaultRow:
    fault: str
    position: str
    params: str
    cells: tuple[CellView, ...]
    error: str
    kv_changed: str
    min_margin: str


@dataclass(frozen=True)
class ControlRow:
    arm: str
    seed: int
    compared: int
    exercised: int
    false_positives: tuple[tuple[int, str], ...]  # (count, cell class): none is good news, any is bad
    inconclusive: tuple[int, ...]
    error: str


@dataclass(frozen=True)
class KindLine:
    fault: str
    detected: bool
    reliable: bool


@dataclass(frozen=True)
class DetectionPage:
    """What the template prints: strings, numbers and flags, no logic left for the template."""

    tool_version: str
    commit: str
    started: str
    method: str
    windows: tuple[str, ...]
    rows: tuple[FaultRow, ...]
    controls: tuple[ControlRow, ...]
    control_span: int
    kinds: tuple[KindLine, ...]
    every_fault_detected: bool
    false_positives: int
    false_positives_by_window: tuple[tuple[str, int], ...]
    control_reuses_exercised: int
    prefix_window: int
    prefix_requests: int
    prefix_ok: bool
    arm_errors: tuple[str, ...]


def load_matrix(path: Path) -> dict:
    """The matrix report at `path`; a file that is not one this kit reads is a one-line UsageError."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except ValueError as exc:  # invalid JSON or UTF-8
        raise UsageError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise UsageError(f"{path} is not a {KIND} report")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        newer = isinstance(version, int) and version > SCHEMA_VERSION
        raise UsageError(
            f"{path} has schema_version {version!r}; this kit reads {SCHEMA_VERSION}"
            + (" (upgrade the kit)" if newer else "")
        )
    return data


def _fault_row(f: dict, windows: tuple[str, ...]) -> FaultRow:
    audits = [p["kv_audit"] for p in f["probes"] if p.get("kv_audit")]
    diffs = [d for a in audits for _, d in a["faulted_max_abs_diff"]]
    cells = []
    for w in windows:
        c = f["windows"][w]
        shown = ",".join(str(d) for d in c.get("first_diffs", []) if d is not None)
        cells.append(CellView(c["status"], f"{c['detected']}/{c['probes']}" + (f" @{shown}" if shown else "")))
    margins = [
        p["margin"]["baseline_margin"]
        for p in f["probes"]
        if p.get("margin") and p["margin"]["baseline_margin"] is not None
    ]
    return FaultRow(
        fault=f["fault"],
        position=f["position"],
        params=", ".join(f"{k}={v}" for k, v in sorted(f["params"].items()) if k != "fault"),
        cells=tuple(cells),
        error=f"{f['error']['kind']}: {f['error']['detail']}" if f["error"] else "",
        kv_changed=f"{sum(1 for d in diffs if d > 0)}/{len(diffs)} blocks, min max|Δ| {min(diffs):.3g}"
        if diffs
        else "no faulted block",
        min_margin=f"{min(margins):.3f}" if margins else "–",
    )


def _control_row(c: dict, windows: tuple[str, ...]) -> ControlRow:
    return ControlRow(
        arm=c["arm"],
        seed=c["model_seed"],
        compared=c["reuses_compared"],
        exercised=c["reuses_exercised"],
        false_positives=tuple(
            (n, "detected" if n == 0 else "missed") for n in (c["false_positives"][w] for w in windows)
        ),
        inconclusive=tuple(c["inconclusive"][w] for w in windows),
        error=f"{c['error']['kind']}: {c['error']['detail']}" if c["error"] else "",
    )


def page_model(report: dict) -> DetectionPage:
    """The page's view model. The summary is recomputed from the entries (the per-window counts),
    never taken from the report's stored `summary`, which older runs computed differently."""
    windows = tuple(str(w) for w in report["config"]["windows"])
    prefix = report["prefix_check"]
    s = summarize(report["faults"], report["controls"], bool(prefix.get("ok")))
    return DetectionPage(
        tool_version=report["tool_version"],
        commit=report["provenance"]["kit"].get("commit", "unavailable")[:12],
        started=report["provenance"]["started_utc"],
        method=report["method"],
        windows=windows,
        rows=tuple(_fault_row(f, windows) for f in report["faults"]),
        controls=tuple(_control_row(c, windows) for c in report["controls"]),
        control_span=2 + 2 * len(windows),
        kinds=tuple(
            KindLine(k, v, s["fault_kinds_reliably_detected"][k]) for k, v in sorted(s["fault_kinds_detected"].items())
        ),
        every_fault_detected=s["every_fault_detected"],
        false_positives=s["false_positives"],
        false_positives_by_window=tuple(s["false_positives_by_window"].items()),
        control_reuses_exercised=s["control_reuses_exercised"],
        prefix_window=prefix["window"],
        prefix_requests=prefix["requests_compared"],
        prefix_ok=s["prefix_check_ok"],
        arm_errors=tuple(s["arm_errors"]),
    )


def render_page(report: dict) -> str:
    return make_environment().get_template(TEMPLATE).render(m=page_model(report), generator=GENERATOR)


def write_page(report: dict, site_path: Path) -> None:
    site_path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(site_path, render_page(report).encode("utf-8"))
