"""The detection study's scenario page: rows x columns, each cell "caught k/n · gate opened m" with the
hypothesis beside it, and the no-fault controls per column; rendered with the site's environment."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from repro.detection.scenario_cells import CAUGHT, ERROR, INCONCLUSIVE, KIND, MISSED, NOT_EXERCISED, SCHEMA_VERSION
from repro.errors import UsageError
from repro.judge.trials import kv_rate_counts
from repro.judge.verdict import CORRUPT
from repro.publish.environment import make_environment
from repro.record.atomic import write_bytes_atomic

TEMPLATE = "detection-scenarios.html.j2"
GENERATOR = "kvkit-detection"  # not the site's marker: the report site never prunes this page
STATUS_CSS = {
    CAUGHT: "detected",
    MISSED: "missed",
    NOT_EXERCISED: "absent",
    INCONCLUSIVE: "inconclusive",
    ERROR: "error",
}


@dataclass(frozen=True)
class CellView:
    css: str
    status: str
    text: str  # caught k/n · gate opened m
    detail: str  # per window, KV, schedule-numerics, the arm verdict
    hypothesis: str
    held: str  # "held", "did not hold", "undecided"


@dataclass(frozen=True)
class RowView:
    row: str
    plants: str
    params: str
    cells: tuple[CellView, ...]


@dataclass(frozen=True)
class ControlView:
    arm: str
    cells: tuple[str, ...]
    css: tuple[str, ...]


@dataclass(frozen=True)
class ScenarioPage:
    tool_version: str
    commit: str
    started: str
    wall_s: float
    method: str
    columns: tuple[tuple[str, str], ...]  # (name, description)
    rows: tuple[RowView, ...]
    controls: tuple[ControlView, ...]
    held: int
    cells: int
    did_not_hold: tuple[str, ...]
    undecided: tuple[str, ...]
    schedule_controls: tuple[str, ...]
    top_window: str
    # some cell or control counts a FOREIGN or MISPLACED KV verdict: the page then says every KV finding is a false
    # blame (a report made before those classes has none, and its page reads as it always did)
    kv_finer: bool = False


def cell_view(cell: dict, top: str) -> CellView:
    n, k = cell["faulted_requests"], cell["caught_by_window"][top]
    if cell["status"] == ERROR:
        text = "error"
    elif cell["status"] == NOT_EXERCISED:
        text = f"not exercised · gate opened {cell['gate_opened']}"
    else:
        text = f"caught {k}/{n} · gate opened {cell['gate_opened']}"
    parts = []
    if cell["status"] == ERROR:
        parts.append(cell["error"] or "")
    else:
        by_window = sorted(cell["caught_by_window"].items(), key=lambda item: int(item[0]))
        parts.append("by window " + ", ".join(f"{w}: {c}/{n}" for w, c in by_window))
        parts.append(f"KV CORRUPT {cell['kv_corrupt']}/{n}")
        parts += [f"KV {v} {k}/{n}" for v, k in kv_rate_counts(cell) if v != CORRUPT]
        if cell["resumed_loads"]:
            parts.append(f"{cell['resumed_loads']} resumed loads")
        if cell["schedule_numerics"]:
            parts.append(f"schedule-numerics (not counted): {', '.join(cell['schedule_numerics'])}")
        if cell["unplanted_fails"]:
            parts.append(f"FAIL with no fault planted: {', '.join(cell['unplanted_fails'])}")
    if cell.get("arm"):
        arm = cell["arm"]
        parts.append(f"arm {arm['verdict']}, KV {arm['kv']}, preemptions {arm['preemptions']}")
    held = {True: "held", False: "did not hold", None: "undecided"}[cell["held"]]
    return CellView(STATUS_CSS[cell["status"]], cell["status"], text, " · ".join(parts), cell["hypothesis"], held)


def control_text(c: dict, top: str) -> tuple[str, str]:
    if c["status"] == ERROR:
        return c["error"] or "error", "error"
    fp, fb = c["false_positives_by_window"][top], len(c["false_blames"])
    text = f"false positives {fp} · false blames {fb} · hits {c['hits']}/{c['requests']}"
    if c["schedule_numerics"]:
        text += f" · schedule-numerics {len(c['schedule_numerics'])}"
    return text, "detected" if fp == 0 and fb == 0 else "missed"


def page_model(report: dict) -> ScenarioPage:
    cfg = report["config"]
    top = str(max(cfg["windows"]))
    columns = tuple((c["column"], c["description"]) for c in cfg["columns"])
    names = [c for c, _ in columns]
    by = {(c["row"], c["column"]): c for c in report["cells"]}
    rows = tuple(
        RowView(
            r["row"],
            r["plants"],
            json.dumps(r["params"], sort_keys=True),
            tuple(cell_view(by[(r["row"], col)], top) for col in names if (r["row"], col) in by),
        )
        for r in cfg["rows"]
    )
    ctl = {(c["arm"], c["column"]): c for c in report["controls"]}
    controls = []
    for arm in cfg["controls"]:
        views = [control_text(ctl[(arm, col)], top) for col in names if (arm, col) in ctl]
        controls.append(ControlView(arm, tuple(t for t, _ in views), tuple(css for _, css in views)))
    cells = report["cells"]
    kit = report["provenance"]["kit"]
    return ScenarioPage(
        tool_version=report["tool_version"],
        commit=f"{kit.get('commit', '?')[:12]}{'+dirty' if kit.get('dirty') else ''}",
        started=report["provenance"]["started_utc"],
        wall_s=report["diagnostics"]["wall_s"],
        method=report["method"],
        columns=columns,
        rows=rows,
        controls=tuple(controls),
        held=sum(c["held"] is True for c in cells),
        cells=len(cells),
        did_not_hold=tuple(
            f"{c['row']} × {c['column']}: expected {c['hypothesis']}, {c['status']}"
            for c in cells
            if c["held"] is False
        ),
        undecided=tuple(f"{c['row']} × {c['column']}: {c['status']}" for c in cells if c["held"] is None),
        schedule_controls=tuple(
            f"{name}: control {s['status']}, preemptions {s['preemptions']}"
            + (
                f", differs from the plain baseline at {', '.join(s['differs_from_plain'])}"
                if s["differs_from_plain"]
                else ""
            )
            for name, s in sorted(report["schedule_controls"].items(), key=lambda item: _order(names, item[0]))
        ),
        top_window=top,
        kv_finer=any(v != CORRUPT for c in [*cells, *report["controls"]] for v, _ in kv_rate_counts(c)),
    )


def _order(names: list[str], name: str) -> int:
    """A column's place in the report's column order (the JSON file's keys are sorted)."""
    return names.index(name) if name in names else len(names)


def load_report(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable detection-scenarios report ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND or data.get("schema_version") != SCHEMA_VERSION:
        raise UsageError(f"{path}: not a {KIND} report of schema version {SCHEMA_VERSION}")
    return data


def render_page(report: dict) -> str:
    return make_environment().get_template(TEMPLATE).render(m=page_model(report), generator=GENERATOR)


def write_page(report: dict, site_path: Path) -> None:
    site_path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(site_path, render_page(report).encode("utf-8"))
