"""Near-tie classes: every divergence is decisive or near-tie by the baseline's top-1/top-2 gap at
its index (repro.judge.verdict.classify_divergence), worded once (repro.readmodel) for the text summary,
the site's table and index, and the issue Markdown. The verdict never changes: a FAIL stays a FAIL.

The reports here are synthetic: tests/data/render-selftest.json (a real CPU self-test, schema 1;
every divergence decisive) with the PlantedFault arm's reuses given other first diffs and margins,
the fields repro.judge.evaluate writes (repro.judge.compare.margin_at(...).as_dict()).
"""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import pytest
from conftest import ROOT
from test_issue_md import html_tables
from test_render import Page

from repro.judge.compare import NEAR_TIE_NATS, margin_at
from repro.judge.verdict import (
    DECISIVE,
    FAIL,
    INCONCLUSIVE,
    NEAR_TIE,
    UNCLASSED,
    DivergenceTally,
    classify_divergence,
    tally_divergences,
)
from repro.judge.wording import gap_text
from repro.publish.issue_md import format_issue_md
from repro.publish.site import render_index, render_report_page, render_site
from repro.publish.site_index import build_index_row
from repro.publish.summary import format_summary
from repro.readmodel import Arm, Probe, Request, margin_class
from repro.record.report import load_report


# The read model's records, built from the dicts these tests make (repro.readmodel is the one door).
def _probe(p):
    return Probe.from_json(p, None)


def _arm(a):
    return Arm.from_json(a, None)


def diff_cell(p):
    return _probe(p).diff_cell


def diff_class_cell(p):
    return _probe(p).diff_class_cell


def probe_divergences(p):
    return _probe(p).divergences


def divergence_class(r):
    return Request.from_json(r).divergence_class


def arm_class_text(a):
    return _arm(a).class_text


def arm_divergences(a):
    return _arm(a).divergences


def arm_verdict_text(a):
    return _arm(a).verdict_text


DATA = ROOT / "tests" / "data"
SELFTEST = DATA / "render-selftest.json"
V2_EXAMPLE = DATA / "report-v2-example.json"
PLANTED = "PlantedFault (PlantedFaultConnector)"


def margin(index: int, gap: float | None) -> dict:
    """A margin as repro.judge.compare writes it, with the baseline's top-1/top-2 gap at the divergence."""
    top = [] if gap is None else [[7, -0.5], [9, -0.5 - gap]]
    return margin_at(index, [7] * 16, [7] * index + [9] * (16 - index), top, [[9, -0.4], [7, -1.9]]).as_dict()


def with_divergences(
    report: dict, arm_name: str, divergences: dict[str, list[tuple[int | None, float | None]]]
) -> dict:
    """The report with each listed probe's reuses diverging at (first_diff, baseline top-2 gap); None: no divergence."""
    report = copy.deepcopy(report)
    arm = next(a for a in report["arms"] if a["name"] == arm_name)
    for probe in arm["probes"]:
        if probe["name"] not in divergences:
            continue
        for req, (index, gap) in zip(probe["requests"][1:], divergences[probe["name"]], strict=True):
            req["first_diff"] = index
            req["margin"] = None if index is None else margin(index, gap)
    return report


def selftest() -> dict:
    return json.loads(SELFTEST.read_text(encoding="utf-8"))


# The PlantedFault arm's four probes (fixture: three reuses; chat-511/512/513: one each).
NEAR_TIES_ONLY = {
    "fixture": [(13, 0.0)] * 3,
    "chat-511": [(2, 0.031)],
    "chat-512": [(2, 0.031)],
    "chat-513": [(5, 0.09)],
}
MIXED = {"fixture": [(4, 2.1), (15, 0.031), (4, 2.1)]}


@pytest.fixture
def near_ties_only() -> dict:
    return with_divergences(selftest(), "PlantedFault", NEAR_TIES_ONLY)


@pytest.fixture
def mixed() -> dict:
    return with_divergences(selftest(), "PlantedFault", MIXED)


def planted(report: dict) -> dict:
    return next(a for a in report["arms"] if a["name"] == "PlantedFault")


# --- the decision (repro.judge.verdict) ---


@pytest.mark.parametrize(
    "gap, cls",
    [
        (0.0, NEAR_TIE),
        (0.045, NEAR_TIE),
        (math.nextafter(NEAR_TIE_NATS, 0), NEAR_TIE),
        (NEAR_TIE_NATS, DECISIVE),  # the threshold itself is decisive: near-tie is strictly under it
        (11.125, DECISIVE),
        (3, DECISIVE),
        (None, UNCLASSED),  # no gap recorded is never assumed decisive
        (float("nan"), UNCLASSED),
        (float("inf"), UNCLASSED),
        (True, UNCLASSED),
        ("0.01", UNCLASSED),
    ],
)
def test_classify_divergence_by_the_baseline_top_gap(gap, cls):
    assert classify_divergence(gap) == cls


def test_the_class_agrees_with_the_near_tie_flag_the_report_already_carries():
    for gap in (0.0, 0.03, 0.0999, 0.1, 0.10000001, 0.5, 7.6):
        m = margin(3, gap)
        assert (margin_class(m) == NEAR_TIE) is m["near_tie"]
    # -0.5 - (-0.6) is 0.09999999999999998: a near-tie the report rounds onto the threshold; its flag settles it
    m = margin(3, 0.1)
    assert m["baseline_top_gap"] == 0.1 and m["near_tie"] is True
    assert classify_divergence(0.1) == DECISIVE and margin_class(m) == NEAR_TIE
    assert gap_text(0.1, NEAR_TIE) == "gap <0.1 nats"  # never "0.100" beside "near-tie"
    assert margin_class({k: v for k, v in m.items() if k != "near_tie"}) == DECISIVE  # no flag: the gap alone
    assert margin_class(None) == UNCLASSED


def test_tally_divergences():
    tally = tally_divergences([NEAR_TIE, DECISIVE, NEAR_TIE, UNCLASSED])
    assert tally == DivergenceTally(decisive=1, near_tie=2, unclassed=1) and tally.total == 4
    assert not tally.near_ties_only
    assert tally_divergences([NEAR_TIE, NEAR_TIE]).near_ties_only
    assert not tally_divergences([]).near_ties_only  # no divergence is not "near-ties only"
    assert not tally_divergences([NEAR_TIE, UNCLASSED]).near_ties_only  # an unknown gap may be decisive
    with pytest.raises(ValueError, match="not a divergence class"):
        tally_divergences([FAIL])


# --- the wording (repro.readmodel, repro.judge.wording) ---


def test_gap_text_never_prints_a_number_of_the_other_class():
    assert gap_text(0.045) == "gap 0.045 nats"
    assert gap_text(0.0) == "gap 0.000 nats"
    assert gap_text(11.125) == "gap 11.125 nats"
    assert gap_text(0.0996) == "gap 0.0996 nats"  # not 0.100: that would read as decisive
    assert gap_text(0.1) == "gap 0.100 nats"
    assert gap_text(None) == "no top-2 gap recorded"


def test_probe_cells_decisive_near_tie_mixed(near_ties_only, mixed):
    probes = {p["name"]: p for p in planted(near_ties_only)["probes"]}
    assert diff_class_cell(probes["fixture"]) == "@13 (near-tie ×3, gap 0.000 nats)"
    assert diff_class_cell(probes["chat-511"]) == "@2 (near-tie, gap 0.031 nats)"
    fixture = planted(mixed)["probes"][0]
    assert diff_cell(fixture) == "@4,15"  # the unclassed cell as before
    assert diff_class_cell(fixture) == "@4 (decisive ×2, gap 2.100 nats), @15 (near-tie, gap 0.031 nats)"
    assert [(g.index, g.cls, g.count) for g in probe_divergences(fixture)] == [(4, DECISIVE, 2), (15, NEAR_TIE, 1)]
    decisive = planted(selftest())["probes"][0]
    assert diff_class_cell(decisive) == "@9 (decisive ×3, gap 0.682 nats)"


def test_only_a_fail_shows_classes_and_other_verdicts_keep_their_cell():
    probe = copy.deepcopy(planted(selftest())["probes"][1])
    probe["verdict"] = INCONCLUSIVE  # e.g. a reuse that differed with zero cached tokens
    assert diff_class_cell(probe) == "@2"
    assert divergence_class(probe["requests"][1]) == DECISIVE  # the request still has its class
    assert divergence_class(probe["requests"][0]) is None  # the cold request did not diverge


def test_arm_counts(near_ties_only, mixed):
    assert arm_class_text(planted(selftest())) == "decisive: 6"
    assert arm_verdict_text(planted(selftest())) == "FAIL (decisive: 6)"
    assert arm_divergences(planted(near_ties_only)) == DivergenceTally(near_tie=6)
    assert arm_verdict_text(planted(near_ties_only)) == "FAIL (near-ties only: 6)"
    assert arm_verdict_text(planted(mixed)) == "FAIL (decisive: 5, near-tie: 1)"
    unknown = with_divergences(selftest(), "PlantedFault", {"chat-511": [(2, None)]})
    assert arm_verdict_text(planted(unknown)) == "FAIL (decisive: 5, unclassed: 1)"
    native = next(a for a in selftest()["arms"] if a["mode"] == "native")
    assert arm_verdict_text(native) == "PASS" and arm_class_text(native) == ""


def test_an_arm_that_is_not_fail_shows_no_counts(near_ties_only):
    arm = copy.deepcopy(planted(near_ties_only))
    arm["verdict"] = "ERROR"  # e.g. LMCache degraded: the ERROR is the arm's verdict, its FAIL probes keep classes
    assert arm_verdict_text(arm) == "ERROR"
    assert diff_class_cell(arm["probes"][0]) == "@13 (near-tie ×3, gap 0.000 nats)"


# --- the text summary ---


CAUGHT = " — the planted fault (zero_blocks) caught, as the fixture expects"  # its FAIL is what the fixture states


def test_summary_of_a_near_ties_only_arm(near_ties_only):
    lines = format_summary(near_ties_only).splitlines()
    i = lines.index(f"{PLANTED}: FAIL (near-ties only: 6){CAUGHT}")
    assert lines[i + 1 : i + 5] == [
        "  fixture     1502  0→1488×3     FAIL @13 (near-tie ×3, gap 0.000 nats)",
        "  chat-511     511  0→496        FAIL @2 (near-tie, gap 0.031 nats)",
        "  chat-512     512  0→496        FAIL @2 (near-tie, gap 0.031 nats)",
        "  chat-513     513  0→512        FAIL @5 (near-tie, gap 0.090 nats)",
    ]
    assert "native prefix caching: PASS" in lines and "ExampleConnector: PASS" in lines


def test_summary_of_a_mixed_arm_says_which_divergence_is_the_near_tie(mixed):
    lines = format_summary(mixed).splitlines()
    i = lines.index(f"{PLANTED}: FAIL (decisive: 5, near-tie: 1){CAUGHT}")
    assert lines[i + 1] == (
        "  fixture     1502  0→1488×3     FAIL @4 (decisive ×2, gap 2.100 nats), @15 (near-tie, gap 0.031 nats)"
    )
    assert lines[i + 2] == "  chat-511     511  0→496        FAIL @2 (decisive, gap 8.376 nats)"


def test_summary_with_the_kv_column_keeps_it_aligned():
    report = with_divergences(load_report(V2_EXAMPLE), "PlantedFault", {"fixture": [(13, 0.0)] * 3})
    rows = [line for line in format_summary(report).splitlines() if line.startswith("  ") and line.find(" KV ") > 20]
    assert len({line.index(" KV ") for line in rows}) == 1  # one column, after the widest token verdict
    assert any("FAIL @13 (near-tie ×3, gap 0.000 nats) KV CORRUPT" in line for line in rows)


# --- the site ---


def test_report_page_table_badge_and_margin(near_ties_only, mixed):
    html = render_report_page(near_ties_only, stem="nt")
    page = Page(html)
    rows = page.rows["cmp"]
    assert [f"{PLANTED}: FAIL near-ties only: 6"] in rows
    assert ["fixture", "1502", "0→1488×3", "FAIL", "@13 (near-tie ×3, gap 0.000 nats)"] in [r[:5] for r in rows]
    assert '<span class="verdict v-near-ties">near-ties only: 6</span>' in html  # a badge of its own
    assert html.count('<span class="dc dc-near-tie">') == 4
    text = " ".join(page.all_text().split())
    assert "@13: baseline 7 (margin 0.000, top-2 gap 0.000) · reuse 9 (margin 1.500) · near-tie" in text
    assert "near-tie under 0.1 nats" in text  # the legend says what the classes mean
    page = Page(render_report_page(mixed, stem="m"))
    assert [f"{PLANTED}: FAIL (decisive: 5, near-tie: 1)"] in page.rows["cmp"]
    cells = [r[4] for r in page.rows["cmp"] if r and r[0] == "fixture" and r[3] == "FAIL"]
    assert cells == ["@4 (decisive ×2, gap 2.100 nats), @15 (near-tie, gap 0.031 nats)"]


def test_index_shows_the_class_at_a_glance(near_ties_only, mixed):
    rows = [
        build_index_row(near_ties_only, stem="nt", href="nt.html"),
        build_index_row(mixed, stem="m", href="m.html"),
        build_index_row(selftest(), stem="d", href="d.html"),
    ]
    html = render_index(rows)
    found = Page(html).rows["reports"][1:]  # each row's finding cell ends with its stem; then the verdicts column
    cells = [next(r[1] for r in found if r[0].endswith(f"){stem}")) for stem in ("nt", "m", "d")]
    assert f"{PLANTED} FAIL near-ties only: 6" in cells[0]
    assert f"{PLANTED} FAIL (decisive: 5, near-tie: 1)" in cells[1]
    assert f"{PLANTED} FAIL (decisive: 6)" in cells[2]
    assert html.count('class="verdict v-near-ties"') == 1
    assert ".v-near-ties {" in html  # the badge's style is on the index too


def test_rendered_site_of_near_tie_reports(near_ties_only, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "nt.json").write_text(json.dumps(near_ties_only), encoding="utf-8")
    render_site(reports, tmp_path / "site")
    assert "near-ties only: 6" in (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "@13 (near-tie ×3, gap 0.000 nats)" in (tmp_path / "site" / "nt.html").read_text(encoding="utf-8")


# --- the issue Markdown ---


def test_issue_markdown(near_ties_only, mixed):
    body = format_issue_md(near_ties_only)
    table = html_tables(body)[0]
    assert [PLANTED, "fixture", "1502", "0→1488×3", "FAIL", "@13 (near-tie ×3, gap 0.000 nats)"] in table
    assert f"- **{PLANTED}**: FAIL (near-ties only: 6) — " in body
    assert "baseline top-1/top-2 gap 0.000 · **near-tie**" in body
    assert "near-tie under 0.1 nats" in body
    body = format_issue_md(mixed)
    assert f"- **{PLANTED}**: FAIL (decisive: 5, near-tie: 1) — " in body
    row = next(r for r in html_tables(body)[0] if r[:2] == [PLANTED, "fixture"])
    assert row[5] == "@4 (decisive ×2, gap 2.100 nats), @15 (near-tie, gap 0.031 nats)"
    assert "baseline top-1/top-2 gap 2.100 · decisive" in body


# --- every committed report (schema 1 and 2) ---


def committed_reports() -> list[Path]:
    return sorted((ROOT / "reports").glob("*.json")) + [SELFTEST, V2_EXAMPLE, DATA / "report-v1-example.json"]


@pytest.mark.parametrize("path", committed_reports(), ids=lambda p: p.name)
def test_every_committed_fail_shows_its_class(path):
    """Derived from the margin each report already carries: no schema change, every version classed."""
    report = load_report(path)
    summary = format_summary(report)
    for arm in report["arms"]:
        for probe in arm["probes"]:
            if probe["verdict"] != FAIL:
                assert "(" not in diff_class_cell(probe)
                continue
            cell = diff_class_cell(probe)
            assert re.fullmatch(r"@\d+ \((decisive|near-tie|unclassed)( ×\d+)?, [^)]*\)(, @.*)?", cell), cell
            assert f"FAIL {cell}" in summary
        if arm["verdict"] == FAIL:
            assert f": {arm_verdict_text(arm)}" in summary and arm_class_text(arm)
