"""The matrix page: rows are cells (stacks), columns are probes, each arm's verdict with its KV verdict
and divergence class; each row links its cell's report page (rendered by repro.publish.site)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import quote

from repro.publish.environment import make_environment
from repro.publish.site import render_writeup
from repro.verdict import ERROR

GENERATOR = "kvkit-matrix"  # not the site's mark: the site never prunes this page


@dataclass(frozen=True)
class ArmMark:
    arm: str
    verdict: str
    kv: str | None
    divergence: str | None
    conditions: str | None = None  # what qualifies a FAIL: "intermittent 3/5, contention-dependent"


@dataclass(frozen=True)
class MatrixRow:
    name: str
    href: str | None
    status: str  # "done" or "ERROR"
    error: str | None
    stack: str
    setup: str
    marks: tuple[tuple[ArmMark, ...], ...]  # per probe column: the reuse arms' verdicts
    baseline: str | None
    arm_notes: tuple[str, ...] = ()  # per arm with one: "LMCacheConnectorV1: copy path engine compiled (wheel) · …"


@dataclass(frozen=True)
class MatrixPage:
    name: str
    headline: str
    probes: tuple[str, ...]
    rows: tuple[MatrixRow, ...]


def _stack(cell: dict) -> str:
    v = {k: x for k, x in (cell.get("versions") or {}).items() if x and not str(x).startswith("unavailable")}
    parts = [f"vLLM {v.get('vllm', '?')}", f"LMCache {v['lmcache']}" if v.get("lmcache") else "no LMCache"]
    if v.get("torch"):
        parts.append(f"torch {v['torch']}")
    return " · ".join(parts) + (f" · {cell['hardware']}" if cell.get("hardware") else "")


def _distinct_flags(cells: list[dict]) -> dict[str, list[str]]:
    """Per cell, the verifier flags (and values) not every cell has, in the cell's order: what sets
    one row apart from another (--batch-invariant, say)."""
    lists = [[str(f) for f in c.get("flags") or []] for c in cells]
    common = set.intersection(*(set(x) for x in lists)) if lists else set()
    return {c["name"]: [f for f in flags if f not in common] for c, flags in zip(cells, lists)}


def _row(cell: dict, probes: list[str], cells_dir: str, distinct: list[str] = ()) -> MatrixRow:
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
    parts = [cell["environment"], cell["connector"] or "fixture arms"]
    parts += [f"model {PurePosixPath(cell['model']).name}"] if cell.get("model") else []
    parts += [f"fixture {PurePosixPath(cell['fixture']).name}"] if cell.get("fixture") else []
    setup = " · ".join([*parts, f"seed {cell['seed']}", *([" ".join(distinct)] if distinct else [])])
    return MatrixRow(
        name=cell["name"],
        href=f"{quote(cells_dir)}/{quote(cell['page'])}" if cell.get("page") else None,
        status="done" if error is None else ERROR,
        error=None if error is None else f"{error['kind']}: {error['detail']}",
        stack=_stack(cell) if error is None else "",
        setup=setup,
        marks=marks,
        baseline=base["verdict"] if base else None,
        arm_notes=tuple(_arm_note(a) for a in reuse_arms if a.get("copy_path") or a.get("class")),
    )


def _arm_note(arm: dict) -> str:
    """'LMCacheConnectorV1: copy path engine compiled (wheel) · contention-dependent: …'."""
    parts = [f"copy path {arm['copy_path']}" if arm.get("copy_path") else "", arm.get("class") or ""]
    return f"{arm['name']}: " + " · ".join(p for p in parts if p)


def build_matrix_page(summary: dict, cells_dir: str) -> MatrixPage:
    """cells_dir: the cell pages' folder relative to the matrix page."""
    probes = list(summary["probes"])
    done = sum(1 for c in summary["cells"] if c["status"] == "done")
    headline = (
        f"{len(summary['cells'])} cells, {done} done, {len(summary['cells']) - done} ERROR · "
        f"{summary['started_utc'][:10]} · Ray {summary['cluster'].get('ray_version', '—')}"
    )
    distinct = _distinct_flags(summary["cells"])
    rows = tuple(_row(c, probes, cells_dir, distinct[c["name"]]) for c in summary["cells"])
    return MatrixPage(name=summary["name"], headline=headline, probes=tuple(probes), rows=rows)


def render_matrix_page(summary: dict, cells_dir: str, writeup_md: str | None = None) -> str:
    """writeup_md: the matrix's writeup (`reports/matrix/<name>.md`), shown under the table."""
    page = build_matrix_page(summary, cells_dir)
    writeup = render_writeup(writeup_md) if writeup_md is not None else None
    return make_environment().get_template("matrix.html.j2").render(page=page, writeup=writeup, generator=GENERATOR)
