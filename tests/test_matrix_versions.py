"""The version matrix's vLLM axis (issue 20, item 5): each row's vLLM and LMCache versions and LMCache copy
path, rows that differ only in vLLM side by side, the axes above the table and in the summary, and a matrix
where only one vLLM ran saying so rather than showing a row for a version that did not run."""

from __future__ import annotations

import json
import re

import pytest
from kvkit_testutil import ROOT

from repro.matrix import commands, page, status
from repro.matrix.page import REFERENCE_VLLM, render_matrix_page
from repro.matrix.spec import parse_matrix

COMMITTED = ROOT / "reports" / "matrix"
needs_committed = pytest.mark.skipif(
    not COMMITTED.exists() and not (ROOT / ".git").exists(),
    reason="the committed reports are not part of this copy (the kit)",
)

MATRIX = {
    "name": "v",
    "defaults": {
        "connector": "LMCacheConnectorV1",
        "model": "m/x",
        "fixture": "fixtures/selftest-gpu-lmcache.json",
        "flags": ["--device", "cuda"],
    },
    # the matrix file's order: every 0.26.0 cell, then the 0.28.0 ones
    "cells": [
        {"name": "lmcache-0.5.4", "environment": "/envs/a/bin/python"},
        {"name": "lmcache-0.5.5rc5", "environment": "/envs/b/bin/python"},
        {"name": "vllm-0.28.0-lmcache-0.5.4", "environment": "/envs/c/bin/python"},
        {"name": "vllm-0.28.0-lmcache-0.5.5rc5", "environment": "/envs/d/bin/python"},
    ],
}
STACKS = {  # cell -> (vLLM, LMCache)
    "lmcache-0.5.4": ("0.26.0", "0.5.4"),
    "lmcache-0.5.5rc5": ("0.26.0", "0.5.5rc5"),
    "vllm-0.28.0-lmcache-0.5.4": ("0.28.0", "0.5.4"),
    "vllm-0.28.0-lmcache-0.5.5rc5": ("0.28.0", "0.5.5rc5"),
}
COMPILED = [{"process": "engine", "path": "compiled", "source": "wheel", "detail": "lmcache/cuda_ops.so"}]


def _report(cell, vllm: str, lmcache: str) -> dict:
    """A cell's report: on vLLM 0.26.0 made before copy paths were recorded (the older cuda_ops signal only),
    on 0.28.0 with them (the wheel's compiled ops)."""
    arm = {"name": "LMCacheConnectorV1", "mode": "connector", "verdict": "FAIL",
           "connector": {"name": "LMCacheConnectorV1"},
           "probes": [{"name": "fixture", "verdict": "FAIL", "kv": {"verdict": "CORRUPT"}, "requests": []}]}  # fmt: skip
    if vllm == "0.26.0":
        arm["lmcache"] = {"cuda_ops": "not loaded: fell back to torch ops"}
    else:
        arm["copy_paths"] = COMPILED
    base = {
        "name": "baseline",
        "mode": "baseline",
        "verdict": "PASS",
        "probes": [{"name": "fixture", "verdict": "PASS"}],
    }
    return {"complete": True, "errors": [], "arms": [base, arm], "acceptance": {"matched": None}, "hardware_label": "NVIDIA H200",
            "provenance": {"argv": cell.verifier_argv("r.json"),
                           "engine_versions": {"vllm": vllm, "lmcache": lmcache, "torch": "2.13.0"}}}  # fmt: skip


def _summary(names: list[str]) -> dict:
    matrix = parse_matrix(MATRIX, "fixtures/matrix-v.yaml")
    cells = []
    for cell in matrix.cells:
        if cell.name in names:
            report = _report(cell, *STACKS[cell.name])
            cells.append(status.cell_record(cell, report_rel=f"v/{cell.name}.json", report=report, error=None,
                                            ran=True, outcome=None, page_rel=f"{cell.name}.html"))  # fmt: skip
    return {"name": "v", "cells": cells, "probes": status.probe_names(cells), "axes": status.axes(cells),
            "started_utc": "2027-01-02T00:00:00Z", "cluster": {"ray_version": "2.60.0"}}  # fmt: skip


def _rows(html: str) -> list[tuple[str, str, str, str]]:
    """(cell, vLLM, LMCache, copy path) per table row, in the page's order."""
    body = html.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    found = re.findall(r'<a href="[^"]+">([^<]+)</a>.*?</td>\n<td>([^<]*)</td>\n<td>([^<]*)</td>\n<td class="note">(.*?)</td>',
                       body, re.DOTALL)  # fmt: skip
    return [(c, v, lm, re.sub(r"</?div>", " ", path).strip()) for c, v, lm, path in found]


def test_rows_for_each_vllm_sit_side_by_side_each_with_its_copy_path():
    summary = _summary(list(STACKS))
    html = render_matrix_page(summary, cells_dir="v/site")
    assert _rows(html) == [
        ("lmcache-0.5.4", "0.26.0", "0.5.4", "LMCacheConnectorV1: engine fallback"),
        ("vllm-0.28.0-lmcache-0.5.4", "0.28.0", "0.5.4", "LMCacheConnectorV1: engine compiled (wheel)"),
        ("lmcache-0.5.5rc5", "0.26.0", "0.5.5rc5", "LMCacheConnectorV1: engine fallback"),
        ("vllm-0.28.0-lmcache-0.5.5rc5", "0.28.0", "0.5.5rc5", "LMCacheConnectorV1: engine compiled (wheel)"),
    ]
    assert "<li>vLLM: 0.26.0 (2 cells), 0.28.0 (2 cells)</li>" in html and "no cell has run" not in html
    assert "<li>LMCache copy path: engine fallback (2 cells), engine compiled (wheel) (2 cells)</li>" in html
    # the summary says the same, for a reader of the JSON
    assert summary["axes"]["vllm"] == {"0.26.0": ["lmcache-0.5.4", "lmcache-0.5.5rc5"],
                                       "0.28.0": ["vllm-0.28.0-lmcache-0.5.4", "vllm-0.28.0-lmcache-0.5.5rc5"]}  # fmt: skip
    assert summary["axes"]["copy_path"]["engine compiled (wheel)"] == ["vllm-0.28.0-lmcache-0.5.4",
                                                                       "vllm-0.28.0-lmcache-0.5.5rc5"]  # fmt: skip


def test_where_only_one_vllm_ran_the_page_says_so_and_shows_no_other_row():
    summary = _summary(["lmcache-0.5.4", "lmcache-0.5.5rc5"])
    html = render_matrix_page(summary, cells_dir="v/site")
    assert [r[1] for r in _rows(html)] == ["0.26.0", "0.26.0"]
    assert (
        f"<li>vLLM: only 0.26.0 ran in this matrix (2 of 2 cells); no cell has run vLLM {REFERENCE_VLLM} "
        "(the reference stack&#39;s): it has no row</li>"
    ) in html


def test_an_older_reports_copy_path_comes_from_its_cuda_ops_signal():
    v1 = {"name": "LMCacheConnectorV1", "connector": {"name": "LMCacheConnectorV1"},
          "lmcache": {"cuda_ops": "not loaded: fell back to torch ops"}}  # fmt: skip
    mp = {"name": "LMCacheMPConnector", "connector": {"name": "LMCacheMPConnector"}, "lmcache": {"cuda_ops": "loaded"}}
    assert status.copy_path_text(v1) == "engine fallback"
    assert status.copy_path_text(mp) == "engine compiled, MP server not recorded"
    assert status.copy_path_text({**v1, "copy_paths": COMPILED}) == "engine compiled (wheel)"  # recorded wins
    assert status.copy_path_text({"name": "native", "mode": "native"}) == ""


def test_the_reference_vllm_is_the_gpu_profiles_pin():
    for req in sorted((ROOT / "requirements").glob("gpu-lmcache-*.txt")):
        assert f"vllm=={REFERENCE_VLLM}" in req.read_text(encoding="utf-8").splitlines(), req


@needs_committed
@pytest.mark.parametrize("name", ["h200-controls", "h200-lmcache-versions"])
def test_each_committed_summary_is_what_the_kit_reads_from_its_cell_reports(name):
    """--refresh of a committed summary changes nothing: its rows, copy paths and axes are its reports'."""
    summary = json.loads((COMMITTED / f"{name}.json").read_text(encoding="utf-8"))
    assert commands.refresh_summary(summary, COMMITTED) == summary
    assert all(a.get("copy_path") for c in summary["cells"] for a in c["arms"] if "LMCache" in a["name"])


@needs_committed
def test_the_committed_version_matrix_ran_vllm_0_26_0_alone_and_says_so():
    html = (COMMITTED / "h200-lmcache-versions.html").read_text(encoding="utf-8")
    rows = _rows(html)
    assert [r[1] for r in rows] == ["0.26.0"] * 4 and [r[2] for r in rows] == ["0.5.4", "0.5.5rc5", "0.5.5", "0.5.6"]
    assert all(r[3] == "LMCacheConnectorV1: engine fallback" for r in rows)
    assert "vLLM: only 0.26.0 ran in this matrix (4 of 4 cells); no cell has run vLLM 0.28.0" in html


def test_resume_needs_only_the_environments_of_the_cells_it_runs(tmp_path, monkeypatch):
    """A new stack added to a matrix on a host without the kept cells' environments: the kept cells keep
    their reports and nothing asks for their interpreters."""
    data = {**MATRIX, "cells": MATRIX["cells"][:2]}
    matrix = parse_matrix(data, "fixtures/matrix-v.yaml")
    folder = tmp_path / "v"
    folder.mkdir()
    for cell in matrix.cells:
        arg = commands._report_arg(folder / f"{cell.name}.json")
        report = {**_report(cell, *STACKS[cell.name]), "kind": "kvkit-report", "schema_version": 1}
        report["provenance"]["argv"] = cell.verifier_argv(arg)
        (folder / f"{cell.name}.json").write_text(json.dumps(report))
    asked: list[str] = []
    monkeypatch.setattr(commands, "engine_python_problem", lambda py, lm: asked.append(py) or "missing")
    monkeypatch.setattr(commands, "publish", lambda summary, reports, cell_pages=True: None)
    assert commands.run_matrix(matrix, tmp_path, resume=True, one_at_a_time=False) == 1  # both kept: FAIL findings
    assert asked == []
    with pytest.raises(Exception, match="environment /envs/a/bin/python"):  # a cell to run still needs its own
        commands.run_matrix(matrix, tmp_path / "fresh", resume=False, one_at_a_time=False)


def test_order_keeps_the_matrix_files_order_where_vllm_does_not_vary():
    cells = [
        {"name": n, "versions": {"vllm": "0.26.0", "lmcache": "0.5.4"}, "seed": s} for n, s in (("b", 1), ("a", 0))
    ]
    assert [c["name"] for c in page.order_cells(cells, {})] == ["b", "a"]
