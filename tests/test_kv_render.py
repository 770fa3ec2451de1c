"""The KV audit (report schema 2) in every view: the schema, the loader, the text summary, the
site's KV column and heatmaps, and the issue Markdown; a schema-1 report shows none of it.

The v2 reports here are synthetic: tests/data/render-selftest.json (a real CPU self-test, schema 1)
with the KV audit's fields added the way repro.judge.kvaudit writes them (build_v2_report)."""

from __future__ import annotations

import html as html_lib
import json
import re

import jsonschema
import pytest
from conftest import ROOT
from test_issue_md import html_tables
from test_render import Page

from repro.errors import UsageError
from repro.judge.kv_verdict import CELL_CORRUPT, CELL_EXACT, CELL_NUMERIC
from repro.judge.verdict import CORRUPT, EXACT, NUMERIC, UNAVAILABLE
from repro.judge.wording import spans
from repro.publish.heatmap import cell_fill
from repro.publish.issue_md import format_issue_md
from repro.publish.site import render_report_page, render_site
from repro.publish.summary import format_summary
from repro.readmodel import Probe, kv_blame_text
from repro.record.acceptance import check_acceptance
from repro.record.report import REPORT_SCHEMA_VERSION, ReportInvalid, load_report, validate_report

DATA = ROOT / "tests" / "data"
SELFTEST = DATA / "render-selftest.json"
V2_EXAMPLE = DATA / "report-v2-example.json"
LAYERS = 4  # the tiny model's
PLANTED = list(range(16))  # the planted-fault connector zeroes the first 16 reused blocks
FLOOR_REL = 2.4e-07
BLAME_TEXT = "blocks 0–15 (tokens 0–255), K+V, layers 0–3"
EXPECTED = {
    "ExampleConnector": {"fixture": "PASS", "chat-511": "PASS", "chat-512": "PASS"},
    "PlantedFault": {"fixture": "FAIL", "chat-511": "FAIL", "chat-512": "FAIL", "chat-513": "FAIL"},
    "native": {"fixture": "PASS", "chat-511": "PASS", "chat-512": "PASS", "chat-513": "PASS"},
}
EXPECTED_KV = {
    "ExampleConnector": {"fixture": EXACT, "chat-511": EXACT, "chat-512": UNAVAILABLE},
    "PlantedFault": {"fixture": CORRUPT, "chat-511": CORRUPT, "chat-512": CORRUPT, "chat-513": CORRUPT},
    "native": {"fixture": EXACT, "chat-511": EXACT, "chat-512": EXACT, "chat-513": NUMERIC},
}


def plane(num_blocks: int, cells: dict[tuple[int, int], tuple[str, float | None]]) -> dict:
    """One plane's grid: every cell exact (rel 0) except cells {(layer, block): (class, rel)}."""
    classes, rel, max_abs = [], [], []
    for layer in range(LAYERS):
        row = [cells.get((layer, b), (CELL_EXACT, 0.0)) for b in range(num_blocks)]
        classes.append("".join(c for c, _ in row))
        rel.append([r for _, r in row])
        max_abs.append([None if r is None else r * 3.5 for _, r in row])
    return {"class": classes, "rel": rel, "max_abs": max_abs}


def audited(num_blocks: int, cells: dict[tuple[str, int, int], tuple[str, float | None]], matches=()) -> dict:
    """A reuse's kv_audit; cells {(plane, layer, block): (class, rel)}, the rest exact."""
    planes = {
        name: plane(num_blocks, {(la, b): v for (p, la, b), v in cells.items() if p == name}) for name in ("K", "V")
    }
    every = "".join("".join(pl["class"]) for pl in planes.values())
    return {
        "status": "audited",
        "reason": None,
        "origin": "external",
        "first_block": 0,
        "num_blocks": num_blocks,
        "layers": LAYERS,
        "planes": planes,
        "matches": list(matches),
        "counts": {
            "exact": every.count(CELL_EXACT),
            "numeric": every.count(CELL_NUMERIC),
            "corrupt": every.count(CELL_CORRUPT),
        },
    }


def unavailable(reason: str) -> dict:
    return {
        "status": "unavailable",
        "reason": reason,
        "origin": None,
        "first_block": 0,
        "num_blocks": 0,
        "layers": 0,
        "planes": None,
        "matches": [],
        "counts": {"exact": 0, "numeric": 0, "corrupt": 0},
    }


def cold(prompt_tokens: int, max_rel: float | None, identical: bool) -> dict:
    return {
        "status": "floor",
        "reason": None,
        "first_block": 0,
        "num_blocks": prompt_tokens // 16,
        "layers": LAYERS,
        "max_rel": max_rel,
        "max_abs": None if max_rel is None else max_rel * 3.5,
        "identical": identical,
    }


def kv_verdict(verdict: str, reasons=(), blame: dict | None = None) -> dict:
    return {"verdict": verdict, "reasons": list(reasons), "blame": blame}


def planted_blame() -> dict:
    return {"blocks": PLANTED, "layers": [0, 1, 2, 3], "planes": ["K", "V"], "tokens": [0, 256], "text": BLAME_TEXT}


# chat-511 also has a corrupt cell outside the planted blocks (block 20, V, layer 3, its error not finite).
CHAT_511_BLAME = {
    "blocks": [*PLANTED, 20],
    "layers": [0, 1, 2, 3],
    "planes": ["K", "V"],
    "tokens": [0, 336],
    "text": "blocks 0–15, 20 (tokens 0–335), K+V, layers 0–3",
}


def arm_audit(status: str, floor: dict | None, reason: str | None = None) -> dict:
    return {
        "status": status,
        "reason": reason,
        "floor": floor,
        "layout": "NHD (blocks, 2, block_size, kv_heads, head_dim)",
        "kv_shape": [4096, 2, 16, 2, 32],
        "dtype": "float32",
        "layers": LAYERS,
    }


def _audit_arm(arm: dict) -> None:
    """Add the KV audit's fields to one arm of the self-test report, by its name."""
    name = arm["name"]
    identical = name == "ExampleConnector"
    floor = {"rel": 0.0 if identical else FLOOR_REL, "max_abs": 0.0 if identical else 8e-07, "cells": 0}
    floor["identical"] = identical
    arm["kv_audit"] = arm_audit("reference", None) if arm["mode"] == "baseline" else arm_audit("ok", floor)
    for probe in arm["probes"]:
        probe["kv"] = None
        for i, req in enumerate(probe["requests"]):
            req["kv_audit"] = None
            if arm["mode"] == "baseline":
                continue
            if i == 0:
                req["kv_audit"] = cold(probe["prompt_tokens"], floor["rel"], identical)
                floor["cells"] += 2 * LAYERS * (probe["prompt_tokens"] // 16)
                continue
            blocks = req["cached_tokens"] // 16
            if name == "PlantedFault":
                fault = req["kv_transfer_params"]["planted_fault"]
                fault["faulted_blocks"] = PLANTED
                cells = {(p, la, b): (CELL_CORRUPT, 1.0) for p in "KV" for la in range(LAYERS) for b in PLANTED}
                if probe["name"] == "chat-511":
                    cells[("V", 3, 20)] = (CELL_CORRUPT, None)  # a non-finite relative error
                matches = [{"layer": 0, "plane": "K", "block": b, "source": "zeros"} for b in PLANTED[:3]]
                req["kv_audit"] = audited(blocks, cells, matches)
            elif name == "ExampleConnector" and probe["name"] == "chat-512":
                req["kv_audit"] = unavailable("the connector saved no KV for this request")
            elif name == "native" and probe["name"] == "chat-513":
                req["kv_audit"] = audited(blocks, {("K", 1, 4): (CELL_NUMERIC, 1.1e-07)})
            else:
                req["kv_audit"] = audited(blocks, {})
        if probe["requests"] and arm["mode"] != "baseline":
            probe["kv"] = kv_verdict(EXPECTED_KV[name][probe["name"]])
            if probe["kv"]["verdict"] == CORRUPT:
                probe["kv"]["blame"] = planted_blame() if probe["name"] != "chat-511" else CHAT_511_BLAME
                probe["kv"]["reasons"] = ["reuse 1: 128 of 744 block x layer x plane cells differ beyond the floor"]
            elif probe["kv"]["verdict"] == UNAVAILABLE:
                probe["kv"]["reasons"] = ["reuse 1: the connector saved no KV for this request"]


def build_v2_report(audit: bool = True) -> dict:
    """The CPU self-test report as schema 2: KV audited on every arm (audit=False: the audit off)."""
    report = json.loads(SELFTEST.read_text(encoding="utf-8"))
    report["schema_version"] = 2
    report["config"].update(kv_audit=audit, keep_kv=None)
    for arm in report["arms"]:
        if audit:
            _audit_arm(arm)
        else:
            arm["kv_audit"] = None
            for probe in arm["probes"]:
                probe["kv"] = None
                for req in probe["requests"]:
                    req["kv_audit"] = None
    report["acceptance"] = check_acceptance(report["arms"], EXPECTED, "acceptance", EXPECTED_KV if audit else None)
    return report


@pytest.fixture
def v2() -> dict:
    return build_v2_report()


# --- the schema and the loader ---

SCHEMA = jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / "report.schema.json").read_text()))


def test_the_v2_example_is_a_complete_audited_report():
    data = load_report(V2_EXAMPLE)
    assert data["schema_version"] == 2 and data["config"]["kv_audit"] is True
    SCHEMA.validate(data)
    validate_report(data)
    verdicts = {(a["name"], p["name"]): Probe.from_json(p, None).kv_cell for a in data["arms"] for p in a["probes"]}
    assert verdicts[("PlantedFault", "fixture")] == f"CORRUPT: {BLAME_TEXT}"
    assert verdicts[("native", "chat-513")] == "NUMERIC" and verdicts[("baseline", "fixture")] == "—"


@pytest.mark.parametrize("audit", [True, False])
def test_a_built_v2_report_matches_the_schema(audit):
    report = build_v2_report(audit)
    validate_report(report)
    assert SCHEMA.is_valid(report)


def _edit(report: dict, path: str, value) -> dict:
    """Set (or with value ... delete) one field by a dotted path; list indices are numbers."""
    *keys, last = [int(k) if k.isdigit() else k for k in path.split(".")]
    node = report
    for k in keys:
        node = node[k]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return report


# arms[2] is PlantedFault (a CORRUPT probe at probes[0]); requests[1] is its first reuse.
MALFORMED = {
    "config.kv_audit missing": ("config.kv_audit", ...),
    "config.kv_audit a string": ("config.kv_audit", "yes"),
    "config.keep_kv missing": ("config.keep_kv", ...),
    "arm kv_audit missing": ("arms.2.kv_audit", ...),
    "arm kv_audit status unknown": ("arms.2.kv_audit.status", "fine"),
    "arm floor without cells": ("arms.2.kv_audit.floor.cells", ...),
    "arm floor rel negative": ("arms.2.kv_audit.floor.rel", -1.0),
    "probe kv missing": ("arms.2.probes.0.kv", ...),
    "probe kv verdict a token verdict": ("arms.2.probes.0.kv.verdict", "FAIL"),
    "CORRUPT without blame": ("arms.2.probes.0.kv.blame", None),
    "blame planes not K or V": ("arms.2.probes.0.kv.blame.planes", ["Q"]),
    "blame tokens not a pair": ("arms.2.probes.0.kv.blame.tokens", [0]),
    "request kv_audit missing": ("arms.2.probes.0.requests.1.kv_audit", ...),
    "request status unknown": ("arms.2.probes.0.requests.1.kv_audit.status", "seen"),
    "cell class outside e/n/c": ("arms.2.probes.0.requests.1.kv_audit.planes.K.class.0", "x" * 93),
    "origin unknown": ("arms.2.probes.0.requests.1.kv_audit.origin", "remote"),
    "match plane unknown": ("arms.2.probes.0.requests.1.kv_audit.matches.0.plane", "Q"),
    "counts missing": ("arms.2.probes.0.requests.1.kv_audit.counts", ...),
    "unavailable with planes": ("arms.1.probes.2.requests.1.kv_audit.planes", {"K": {}, "V": {}}),
    "unavailable with counts": ("arms.1.probes.2.requests.1.kv_audit.counts.exact", 3),
    "cold floor identical missing": ("arms.2.probes.0.requests.0.kv_audit.identical", ...),
    "checked item without its check": ("acceptance.checked.0.check", ...),
    "checked item check unknown": ("acceptance.checked.0.check", "bytes"),
}


@pytest.mark.parametrize("edit", MALFORMED.values(), ids=MALFORMED.keys())
def test_the_schema_rejects_malformed_kv_fields(v2, edit):
    bad = _edit(v2, *edit)
    assert not SCHEMA.is_valid(bad)
    with pytest.raises(ReportInvalid, match="does not match schemas/report.schema.json"):
        validate_report(bad)


GRIDS = {
    "a class row short of a block": ("arms.2.probes.0.requests.1.kv_audit.planes.K.class.0", "c" * 92),
    "a layer row missing": ("arms.2.probes.0.requests.1.kv_audit.planes.V.rel", [[0.0] * 93] * 3),
    "counts that do not add up": ("arms.2.probes.0.requests.1.kv_audit.counts.corrupt", 1),
}


@pytest.mark.parametrize("edit", GRIDS.values(), ids=GRIDS.keys())
def test_grids_the_schema_cannot_shape_are_checked_on_write_and_load(v2, edit, tmp_path):
    bad = _edit(v2, *edit)
    assert SCHEMA.is_valid(bad)  # JSON Schema cannot say "layers rows of num_blocks entries"
    with pytest.raises(ReportInvalid, match="KV audit is malformed"):
        validate_report(bad)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(UsageError, match=r"arms\[2\]\.probes\[0\]\.requests\[1\]\.kv_audit"):
        load_report(path)


def test_a_v1_report_loads_and_v1_reports_still_match_the_schema(tmp_path):
    for name in ("report-v1-example.json", "render-selftest.json", "kit-sample-report.json"):
        data = load_report(DATA / name)
        assert data["schema_version"] == 1 and "kv_audit" not in data["config"]
        SCHEMA.validate(data)
        validate_report(data)


def test_a_newer_version_is_refused_and_version_2_without_kv_fields_too(tmp_path, v2):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(dict(v2, schema_version=REPORT_SCHEMA_VERSION + 1)))
    with pytest.raises(UsageError, match="upgrade the kit"):
        load_report(path)
    path.write_text(json.dumps(dict(v2, schema_version=3)))  # version 2's dense grids are not version 3's runs
    with pytest.raises(UsageError, match=r"planes\.K must store its figures as runs"):
        load_report(path)
    v1_as_v2 = json.loads(SELFTEST.read_text())
    v1_as_v2["schema_version"] = 2
    assert not SCHEMA.is_valid(v1_as_v2)
    path.write_text(json.dumps(v1_as_v2))
    with pytest.raises(UsageError, match="config.kv_audit missing"):
        load_report(path)


# --- the text summary ---


def test_summary_has_a_kv_column_the_floor_and_the_findings(v2):
    text = format_summary(v2)
    lines = text.splitlines()
    caught = " — the planted fault (zero_blocks) caught, as the fixture expects"  # the acceptance states its FAIL
    planted = lines.index(f"PlantedFault (PlantedFaultConnector): FAIL (decisive: 6){caught}")
    assert lines[planted + 1].startswith("  KV audit: ok · floor rel 2.4e-07 (max abs 8e-07) over ")
    row = lines[planted + 2]
    assert row.startswith("  fixture     1502  0→1488×3     FAIL") and row.endswith(f"KV CORRUPT: {BLAME_TEXT}")
    assert re.search(
        r"chat-512 +512  0→496 +PASS +KV UNAVAILABLE \(reuse 1: the connector saved no KV for this request\)$",
        text,
        re.MULTILINE,
    )
    assert re.search(r"chat-513 +513  0→512 +PASS +KV NUMERIC$", text, re.MULTILINE)
    findings = lines[lines.index("KV findings:") + 1 : -1]
    assert findings == [
        f"  PlantedFault (PlantedFaultConnector) / {p}: {CHAT_511_BLAME['text'] if p == 'chat-511' else BLAME_TEXT}"
        " (expected by the fixture)"
        for p in ("fixture", "chat-511", "chat-512", "chat-513")
    ]


def test_summary_of_a_v1_report_is_unchanged_and_says_nothing_of_kv():
    headline, *rest = format_summary(load_report(SELFTEST)).splitlines()
    assert headline.endswith("; KV not audited (the report predates the audit)")  # the headline says so, once
    assert not any("KV" in line for line in rest)
    assert "  fixture     1502  0→1488×3     FAIL @9 (decisive ×3, gap 0.682 nats)" in rest


def test_summary_with_the_audit_off_says_so():
    headline, *rest = format_summary(build_v2_report(audit=False)).splitlines()
    assert headline.endswith("; KV audit off")
    text = "\n".join(rest)
    assert rest[-2] == "KV audit: off" and "KV findings" not in text and " KV " not in text


def test_spans_and_blame_text_from_fields():
    assert spans([5, 0, 1, 2, 2, 7, 8]) == [(0, 2), (5, 5), (7, 8)]
    blame = dict(planted_blame(), text="")
    assert kv_blame_text(blame, 16) == BLAME_TEXT
    assert kv_blame_text({"blocks": [3], "layers": [1], "planes": ["V"]}, 16) == "block 3 (tokens 48–63), V, layers 1"


if __name__ == "__main__":  # write the v2 example once; it is then kept as it is
    V2_EXAMPLE.write_text(json.dumps(build_v2_report(), indent=2, sort_keys=True, ensure_ascii=False) + "\n")


# --- the site: KV column, floor, heatmaps ---


def _page(report: dict) -> tuple[str, Page]:
    html = render_report_page(report, stem="r")
    return html, Page(html)


def test_the_report_table_has_a_kv_column_with_each_arms_floor(v2):
    _, page = _page(v2)
    rows = page.rows["cmp"]
    assert rows[0] == ["probe", "tokens", "cached", "verdict", "first diff", "KV"]
    planted = rows.index(["PlantedFault (PlantedFaultConnector): FAIL (decisive: 6)"])
    assert rows[planted + 1] == ["KV audit: ok · floor rel 2.4e-07 (max abs 8e-07) over 1504 cells"]
    fixture = ["fixture", "1502", "0→1488×3", "FAIL", "@9 (decisive ×3, gap 0.682 nats)", f"CORRUPT: {BLAME_TEXT}"]
    assert rows[planted + 2] == fixture
    example = rows.index(["ExampleConnector: PASS"])
    assert rows[example + 1][0].startswith("KV audit: ok · floor 0: the cold prefill's KV is bit-identical")
    assert rows[example + 4][-1] == "UNAVAILABLE (reuse 1: the connector saved no KV for this request)"
    assert rows[example + 5] == ["chat-513", "", "—", "SKIPPED", "", "—"]
    assert all(len(r) == 6 for r in rows if len(r) > 1)
    assert {int(a["colspan"]) for t, a in page.tags if "colspan" in a} == {6}
    spans_ = [a["class"] for t, a in page.tags if t == "span" and "kvv" in a.get("class", "")]
    assert spans_.count("kvv kv-CORRUPT") >= 4 and "kvv kv-NUMERIC" in spans_


def test_the_baseline_reference_is_noted_near_the_table(v2):
    _, page = _page(v2)
    text = page.all_text()
    assert "baseline KV audit: reference KV recorded (4 layers, layout NHD" in text
    assert "dtype float32, shape 4096×2×16×2×32)." in text


def _figures(html: str) -> dict[str, str]:
    """Each heatmap figure's HTML by its id."""
    return dict(re.findall(r'<figure class="kvmap" id="([^"]+)">(.*?)</figure>', html, re.DOTALL))


def test_a_heatmap_per_audited_reuse_with_outlined_corrupt_cells_planted_bands_and_a_caption(v2):
    html, _ = _page(v2)
    figures = _figures(html)
    # arms[2] PlantedFault: fixture (3 reuses) and three chat probes (1 each); ExampleConnector's chat-512
    # reuse is unavailable (no heatmap) and chat-513 was skipped
    assert {k for k in figures if k.startswith("d2-")} == {
        "d2-0-kv1",
        "d2-0-kv2",
        "d2-0-kv3",
        "d2-1-kv1",
        "d2-2-kv1",
        "d2-3-kv1",
    }
    assert "d1-2-kv1" not in figures and "d1-3-kv1" not in figures
    fig = figures["d2-1-kv1"]  # chat-511: the planted blocks, and block 20 whose error is not finite
    caption = Page(fig).all_text()
    assert (
        "planted: blocks 0–15 (tokens 0–255); blamed: blocks 0–15, 20 (tokens 0–255, 320–335); floor rel 2.4e-07"
        in caption
    )
    assert "119 exact · 0 numeric · 129 corrupt of 248 cells" in caption
    outlined = re.findall(r'<rect [^>]*class="kv-c" stroke="#111111"[^>]*><title>([^<]*)</title>', fig)
    assert len(outlined) == 129
    assert "V · layer 3 · block 20 (tokens 320–335): corrupt · rel not finite · max abs —" in outlined
    assert (
        "K · layer 0 · block 0 (tokens 0–15): corrupt · rel 1 · max abs 3.5 · bytes equal zeros · planted fault"
        in outlined
    )
    darkest = re.search(r'fill="(#[0-9a-f]{6})" class="kv-c"[^>]*><title>V · layer 3 · block 20 ', fig).group(1)
    assert darkest == cell_fill(CELL_CORRUPT, 1.0) == cell_fill(CELL_CORRUPT, None)  # not finite: shown as corrupt
    bands = re.findall(r'class="planted" stroke="#7c3aed"[^>]*stroke-dasharray[^>]*><title>([^<]*)</title>', fig)
    assert bands == ["planted fault: blocks 0–15 (tokens 0–255)"] * 2  # the K panel and the V panel
    exact = [html_lib.unescape(t) for t in re.findall(r'class="kv-e"><title>([^<]*)</title>', fig)]
    assert "K · layer 0 · blocks 16–30 (tokens 256–495): exact (bit-identical to the baseline's KV)" in exact


def test_numeric_cells_are_blue_exact_grey_and_corrupt_red(v2):
    html, _ = _page(v2)
    fig = _figures(html)["d3-3-kv1"]  # native chat-513: one numeric cell, no planted fault
    assert "planted: none; blamed: none; floor rel 2.4e-07" in Page(fig).all_text()
    numeric = re.findall(r'fill="(#[0-9a-f]{6})" class="kv-n"><title>([^<]*)</title>', fig)
    assert numeric == [
        (
            cell_fill(CELL_NUMERIC, 1.1e-07),
            "K · layer 1 · block 4 (tokens 64–79): numeric · rel 1.1e-07 · max abs 3.85e-07",
        )
    ]
    assert 'class="kv-c"' not in fig and 'class="planted"' not in fig
    fills = {cell_fill(CELL_EXACT, 0.0), cell_fill(CELL_NUMERIC, 1.1e-07), cell_fill(CELL_CORRUPT, 1.1e-07)}
    assert len(fills) == 3  # the same error is blue when numeric and orange-red when corrupt
    assert cell_fill(CELL_CORRUPT, 1e-2) != cell_fill(CELL_CORRUPT, 1e-6)  # the fill follows the error


def test_requests_without_a_heatmap_are_said_in_words(v2):
    html, _ = _page(v2)
    section = re.search(r'<section class="probe" id="d1-2">(.*?)</section>', html, re.DOTALL).group(1)
    text = " ".join(Page(section).all_text().split())
    assert "KV audit: UNAVAILABLE (reuse 1: the connector saved no KV for this request)" in text
    assert "reuse 1: KV audit unavailable: the connector saved no KV for this request" in text
    assert "cold: its prefill KV (32 blocks × 4 layers) is bit-identical to the baseline's" in text
    assert "<svg" not in section


def test_the_legend_explains_the_scale_once(v2):
    html, page = _page(v2)
    assert html.count('class="kvmap kv-legend"') == 1
    text = page.all_text()
    assert all(t in text for t in ("1e-8", "1e-4", "≥ 1", "numeric (within the floor)", "corrupt (outlined)"))
    assert "exact (bit-identical)" in text and "blocks a planted fault corrupted" in text


def test_a_v1_report_page_has_no_kv_column_and_no_heatmap():
    html, page = _page(load_report(SELFTEST))
    assert page.rows["cmp"][0] == ["probe", "tokens", "cached", "verdict", "first diff"]
    assert "<svg" not in html and "kvmap" not in html and "KV audit" not in html and ".kvv" not in html


def test_a_v2_report_with_the_audit_off_says_so_and_has_no_kv_column():
    html, page = _page(build_v2_report(audit=False))
    assert page.rows["cmp"][0] == ["probe", "tokens", "cached", "verdict", "first diff"]
    assert "KV audit: off for this run (token verdicts only)." in page.all_text() and "<svg" not in html


def test_the_index_has_a_kv_column_once_a_report_has_the_audit(v2, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "a-v1.json").write_text(SELFTEST.read_text(encoding="utf-8"), encoding="utf-8")
    render_site(reports, tmp_path / "site1")
    only_v1 = Page((tmp_path / "site1" / "index.html").read_text(encoding="utf-8"))
    assert "KV" not in only_v1.rows["reports"][0]
    (reports / "b-v2.json").write_text(json.dumps(v2), encoding="utf-8")
    render_site(reports, tmp_path / "site2")
    rows = Page((tmp_path / "site2" / "index.html").read_text(encoding="utf-8")).rows["reports"]
    by_stem = {r[0][-4:]: r for r in rows[1:]}  # each row's finding cell ends with its file's stem
    assert rows[0][2] == "KV" and by_stem["a-v1"][2] == "—"  # the v1 report predates the audit
    assert by_stem["b-v2"][2] == (
        "ExampleConnector UNAVAILABLE×1 · EXACT×2 PlantedFault (PlantedFaultConnector) CORRUPT×4 "
        "native prefix caching NUMERIC×1 · EXACT×3"
    )


def test_a_v2_site_is_byte_identical_on_rerender_and_self_contained(v2, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "r.json").write_text(json.dumps(v2), encoding="utf-8")
    render_site(reports, tmp_path / "site")
    first = (tmp_path / "site" / "r.html").read_bytes()
    render_site(reports, tmp_path / "site")
    assert (tmp_path / "site" / "r.html").read_bytes() == first
    page = Page(first.decode("utf-8"))
    assert not [t for t, _ in page.tags if t in ("script", "img", "link", "iframe", "object", "image", "use")]
    assert not [a for _, a in page.tags for k, v in a.items() if k in ("href", "src") and "//" in (v or "")]


def test_hostile_text_in_kv_fields_stays_text(v2):
    payload = '<script>alert(1)</script>"><img src=x>'
    arm = v2["arms"][2]
    arm["kv_audit"]["reason"] = payload
    arm["probes"][1]["kv"]["blame"]["text"] = payload
    arm["probes"][1]["requests"][1]["kv_audit"]["matches"][0]["source"] = payload
    html, page = _page(v2)
    assert "<script>" not in html and "<img" not in html
    assert payload in page.all_text()


# --- the issue Markdown ---


def test_issue_markdown_has_the_kv_verdicts_and_one_table_of_blamed_chunks(v2):
    body = format_issue_md(v2)
    tables = html_tables(body)
    verdicts = tables[0]
    assert verdicts[0][-1] == "KV"
    assert [
        "PlantedFault (PlantedFaultConnector)",
        "fixture",
        "1502",
        "0→1488×3",
        "FAIL",
        "@9 (decisive ×3, gap 0.682 nats)",
        f"CORRUPT: {BLAME_TEXT}",
    ] in verdicts
    assert ["native prefix caching", "chat-513", "513", "0→512", "PASS", "", "NUMERIC"] in verdicts
    chunks = tables[1]
    assert chunks[0] == ["arm", "probe", "reuse", "blocks (tokens)", "layers", "planes", "max rel error", "bytes equal"]
    planted_chunk = ["blocks 0–15 (tokens 0–255)", "0–3", "K+V", "1", "zeros (3 of 128 cells)"]
    arm = "PlantedFault (PlantedFaultConnector)"
    assert chunks[1:] == [
        *([arm, "fixture", str(n), *planted_chunk] for n in (1, 2, 3)),
        [arm, "chat-511", "1", *planted_chunk],
        [arm, "chat-511", "1", "block 20 (tokens 320–335)", "3", "V", "not finite", "—"],
        [arm, "chat-512", "1", *planted_chunk],
        [arm, "chat-513", "1", *planted_chunk],
    ]
    assert (
        "- **PlantedFault (PlantedFaultConnector)**: KV audit: ok · floor rel 2.4e-07 (max abs 8e-07) over 1504 cells"
        in body
    )
    assert body.index("#### KV audit") < body.index("#### First diffs and margins")


def test_issue_markdown_without_the_audit():
    v1 = format_issue_md(load_report(SELFTEST))
    assert "KV audit" not in v1 and "| KV |" not in v1 and len(html_tables(v1)) == 1
    headings = [line for line in v1.splitlines() if line.startswith("#### ")]
    assert headings == [
        "#### Expected vs actual",
        "#### How to reproduce",
        "#### Environment",
        "#### What maintainers ask for",
        "#### First diffs and margins",
        "#### Stack",
        "#### Warnings",
    ]
    off = format_issue_md(build_v2_report(audit=False))
    assert "#### KV audit\n\nKV audit: off for this run (token verdicts only)." in off
    assert html_tables(off)[0][0][-1] == "first diffs"


def test_issue_markdown_with_the_audit_and_no_finding_says_so(v2):
    v2["arms"] = [a for a in v2["arms"] if a["name"] != "PlantedFault"]
    body = format_issue_md(v2)
    assert "No block was blamed." in body and len(html_tables(body)) == 1
