"""The matrix page: rows are cells (stacks: vLLM, LMCache and its copy path, torch, hardware), columns are
probes, each arm's verdict with its KV verdict and divergence class, then the scenarios any cell ran, each
arm's scenario verdict; above them the version axes the cells ran; each row links its cell's report page
(rendered by repro.publish.site)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import quote

from repro.judge.verdict import ERROR
from repro.judge.wording import machine_path_name
from repro.matrix import status
from repro.publish.environment import make_environment
from repro.publish.matrix_picture import build_picture
from repro.publish.writeup import render_writeup

GENERATOR = "kvkit-matrix"  # not the site's mark: the site never prunes this page
# The reference stack's vLLM (requirements/gpu-lmcache-*.txt pin it; a test holds them equal): a matrix
# that has not run it says so above its table.
REFERENCE_VLLM = "0.28.0"


@dataclass(frozen=True)
class ArmMark:
    arm: str
    verdict: str
    kv: str | None
    divergence: str | None
    conditions: str | None = None  # what qualifies a FAIL: "intermittent 3/5, contention-dependent"


@dataclass(frozen=True)
class ScenarioMark:
    """One reuse arm's run of one scenario in a cell: 'PlantedFault FAIL · step 2 chat-511 FAIL'."""

    arm: str
    verdict: str
    cls: str | None = None  # "schedule-numerics"
    requests: tuple[str, ...] = ()  # the requests that are not a PASS: "step 2 chat-511 FAIL"
    kv: str | None = None  # the arm's KV verdict over the scenario's reuses; None when not audited


@dataclass(frozen=True)
class MatrixRow:
    name: str
    href: str | None
    status: str  # "done" or "ERROR"
    error: str | None
    stack: str  # torch and hardware: what the vLLM, LMCache and copy path columns leave out
    setup: str
    marks: tuple[tuple[ArmMark, ...], ...]  # per probe column: the reuse arms' verdicts
    baseline: str | None
    arm_notes: tuple[str, ...] = ()  # per arm with a class: "LMCacheMPConnector: intermittent 3/5, …"
    vllm: str = ""
    lmcache: str = ""  # "none" for a cell without LMCache
    copy_paths: tuple[str, ...] = ()  # per LMCache arm: "LMCacheConnectorV1: engine compiled (wheel)"
    scenarios: tuple[tuple[ScenarioMark, ...], ...] = ()  # per scenario column: the reuse arms' verdicts


@dataclass(frozen=True)
class MatrixPage:
    name: str
    headline: str
    probes: tuple[str, ...]
    rows: tuple[MatrixRow, ...]
    axes: tuple[str, ...] = ()  # one line per axis: the versions and copy paths the cells ran
    scenarios: tuple[str, ...] = ()  # the scenario columns after the probes; () when no cell ran one


def _stack(cell: dict) -> str:
    """torch and the hardware label (the vLLM and LMCache versions have their own columns)."""
    torch = status.version(cell, "torch")
    parts = [f"torch {torch}" if torch else "", cell.get("hardware") or ""]
    return " · ".join(p for p in parts if p) or "—"


def _axis_values(values: dict[str, list[str]]) -> str:
    return ", ".join(f"{v} ({len(cells)} cell{'s' if len(cells) != 1 else ''})" for v, cells in values.items())


def axis_lines(cells: list[dict]) -> tuple[str, ...]:
    """What the done cells ran, per axis; a matrix whose cells all ran one vLLM says so, and names the
    reference stack's vLLM when no cell ran it (a row is never made up for a version that did not run)."""
    found = status.axes(cells)
    if not found["vllm"]:
        return ("no cell finished: no versions to show",)
    vllm = found["vllm"]
    if len(vllm) == 1:
        (only,) = vllm
        line = f"vLLM: only {only} ran in this matrix ({len(vllm[only])} of {len(cells)} cells)"
    else:
        line = f"vLLM: {_axis_values(vllm)}"
    if REFERENCE_VLLM not in vllm:
        line += f"; no cell has run vLLM {REFERENCE_VLLM} (the reference stack's): it has no row"
    lines = [line, f"LMCache: {_axis_values(found['lmcache'])}"]
    paths = found["copy_path"]
    lines.append(f"LMCache copy path: {_axis_values(paths)}" if paths else "LMCache copy path: no LMCache arm")
    return tuple(lines)


def _vllm_key(cell: dict) -> tuple:
    """A vLLM version as numbers where it has them ('0.26.0' < '0.28.0' < '0.100.0'); unknown last."""
    v = status.version(cell, "vllm")
    if v is None:
        return (1, ())
    return (0, tuple(int(p) if p.isdigit() else -1 for p in v.replace("+", ".").split(".")), v)


def order_cells(cells: list[dict], distinct: dict[str, list[str]]) -> list[dict]:
    """Cells that differ only in their vLLM version side by side, older vLLM first; otherwise the matrix
    file's order (groups in the order first seen)."""
    groups: dict[tuple, list[dict]] = {}
    for cell in cells:
        key = (status.version(cell, "lmcache"), cell.get("connector"), cell.get("model"), cell.get("fixture"),
               cell.get("seed"), tuple(distinct.get(cell["name"], ())))  # fmt: skip
        groups.setdefault(key, []).append(cell)
    return [c for group in groups.values() for c in sorted(group, key=_vllm_key)]


def _distinct_flags(cells: list[dict]) -> dict[str, list[str]]:
    """Per cell, the verifier flags (and values) not every cell has, in the cell's order: what sets
    one row apart from another (--batch-invariant, say)."""
    lists = [[str(f) for f in c.get("flags") or []] for c in cells]
    common = set.intersection(*(set(x) for x in lists)) if lists else set()
    return {c["name"]: [f for f in flags if f not in common] for c, flags in zip(cells, lists)}


def _scenario_marks(reuse_arms: list[dict], scenarios: list[str]) -> tuple[tuple[ScenarioMark, ...], ...]:
    found = [(a["name"], a.get("scenarios") or {}) for a in reuse_arms]
    return tuple(
        tuple(
            ScenarioMark(
                name, runs[s]["verdict"], runs[s].get("class"), tuple(runs[s].get("requests") or ()), runs[s].get("kv")
            )
            for name, runs in found
            if s in runs
        )
        for s in scenarios
    )


def _row(
    cell: dict, probes: list[str], cells_dir: str, distinct: list[str] = (), scenarios: list[str] = ()
) -> MatrixRow:
    reuse_arms = [a for a in cell["arms"] if a["mode"] != "baseline"]
    base = next((a for a in cell["arms"] if a["mode"] == "baseline"), None)
    marks = tuple(
        tuple(
            ArmMark(
                a["name"],
                a["probes"][p]["verdict"],
                a["probes"][p].get("kv"),
                a["probes"][p].get("divergence"),
                a["probes"][p].get("conditions"),
            )
            for a in reuse_arms
            if p in a["probes"]
        )
        for p in probes
    )
    error = cell.get("error")
    parts = [machine_path_name(cell["environment"]), cell["connector"] or "fixture arms"]
    parts += [f"model {PurePosixPath(cell['model']).name}"] if cell.get("model") else []
    parts += [f"fixture {PurePosixPath(cell['fixture']).name}"] if cell.get("fixture") else []
    setup = " · ".join([*parts, f"seed {cell['seed']}", *([" ".join(distinct)] if distinct else [])])
    return MatrixRow(
        name=cell["name"],
        href=f"{quote(cells_dir)}/{quote(cell['page'])}" if cell.get("page") else None,
        status="done" if error is None else ERROR,
        error=None if error is None else machine_path_name(f"{error['kind']}: {error['detail']}"),
        stack=_stack(cell) if error is None else "",
        setup=setup,
        marks=marks,
        baseline=base["verdict"] if base else None,
        arm_notes=tuple(f"{a['name']}: {a['class']}" for a in reuse_arms if a.get("class")),
        vllm=status.version(cell, "vllm") or "?",
        lmcache=status.version(cell, "lmcache") or "none",
        copy_paths=tuple(f"{a['name']}: {a['copy_path']}" for a in reuse_arms if a.get("copy_path")),
        scenarios=_scenario_marks(reuse_arms, scenarios),
    )


def build_matrix_page(summary: dict, cells_dir: str) -> MatrixPage:
    """cells_dir: the cell pages' folder relative to the matrix page."""
    probes = list(summary["probes"])
    done = sum(1 for c in summary["cells"] if c["status"] == "done")
    headline = (
        f"{len(summary['cells'])} cells, {done} done, {len(summary['cells']) - done} ERROR · "
        f"{summary['started_utc'][:10]} · Ray {summary['cluster'].get('ray_version', '—')}"
    )
    distinct = _distinct_flags(summary["cells"])
    cells = order_cells(summary["cells"], distinct)
    scenarios = status.scenario_names(summary["cells"])
    rows = tuple(_row(c, probes, cells_dir, distinct[c["name"]], scenarios) for c in cells)
    return MatrixPage(
        name=summary["name"],
        headline=headline,
        probes=tuple(probes),
        rows=rows,
        axes=axis_lines(summary["cells"]),
        scenarios=tuple(scenarios),
    )


def render_matrix_page(summary: dict, cells_dir: str, writeup_md: str | None = None) -> str:
    """writeup_md: the matrix's writeup (`reports/matrix/<name>.md`), shown under the table."""
    page = build_matrix_page(summary, cells_dir)
    writeup = render_writeup(writeup_md) if writeup_md is not None else None
    picture = build_picture(page)  # the compact picture above the table (repro.publish.matrix_picture)
    return (
        make_environment()
        .get_template("matrix.html.j2")
        .render(page=page, picture=picture, writeup=writeup, generator=GENERATOR)
    )
