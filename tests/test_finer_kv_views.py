"""The finer KV findings (MISPLACED: this prompt's own KV from another block or plane; FOREIGN: another prompt's
KV) in every view, as CORRUPT is: a finding everywhere (never green, never a pass), named by its class. The read
model, the text summary, the site (its KV column, the heatmaps' own colours and legend keys), the issue Markdown,
the index, the matrix picture and the catalog's line, the trials' rates. A report without those classes (every
committed one) reads as it always did: pinned here on the v2 example, and byte for byte on the committed reports
by rendering them before and after (tests/test_kv_render.py pins the v2 example's views)."""

from __future__ import annotations

import copy
import re
from types import SimpleNamespace

import pytest
from markupsafe import escape
from test_kv_render import LAYERS, PLANTED, audited, build_v2_report, planted_blame

from repro.errors import EXIT_MISMATCH
from repro.judge.kv_verdict import CELL_CORRUPT, CELL_EXACT, CELL_FOREIGN, CELL_MISPLACED, CELL_NUMERIC
from repro.judge.verdict import CORRUPT, EXACT, FAIL, FOREIGN, MISPLACED, NUMERIC, PASS, UNAVAILABLE
from repro.publish.catalog import _tally
from repro.publish.heatmap import (
    EXACT_FILL,
    FOREIGN_FILL,
    MISPLACED_FILL,
    build_legend,
    cell_fill,
)
from repro.publish.issue_md import format_issue_md
from repro.publish.matrix_picture import OUTLINES, build_picture
from repro.publish.site import render_report_page
from repro.publish.site_index import build_index_row
from repro.publish.summary import format_summary
from repro.readmodel import KV_FINER_LEGEND, TrialRate, as_report
from repro.readmodel.conditions import run_probe_text
from repro.record.acceptance import check_acceptance
from repro.record.exit_rule import exit_code
from repro.record.report import validate_report

SHAPE = "slots 0–15 hold this prompt's blocks 16…31 (a shift)"
BLAME = planted_blame()["text"]


def _finer(cells_class: str, source) -> dict:
    """A reuse's kv_audit whose planted blocks are all `cells_class` (every layer and plane), their bytes equal
    to source(block), and its counts with every class."""
    cells = {(p, la, b): (cells_class, 1.0) for p in "KV" for la in range(LAYERS) for b in PLANTED}
    matches = [
        {"layer": la, "plane": p, "block": b, "source": source(b)} for p in "KV" for la in range(2) for b in PLANTED
    ]
    audit = audited(len(PLANTED) + 8, cells, matches)
    every = "".join("".join(audit["planes"][p]["class"]) for p in "KV")
    audit["counts"] = {n: every.count(c) for c, n in ((CELL_EXACT, "exact"), (CELL_NUMERIC, "numeric"),
                       (CELL_MISPLACED, "misplaced"), (CELL_FOREIGN, "foreign"), (CELL_CORRUPT, "corrupt"))}  # fmt: skip
    audit["shape"] = SHAPE if cells_class == CELL_MISPLACED else "slots 0–15 hold probe fixture's blocks 0…15"
    return audit


def finer_report(stated: bool = True) -> dict:
    """The v2 example with PlantedFault's fixture MISPLACED (its own blocks 16..31 in slots 0..15) and chat-511
    FOREIGN (fixture's blocks); stated: the fixture expects those classes (else CORRUPT, as for the others)."""
    report = build_v2_report()
    planted = next(a for a in report["arms"] if a["name"] == "PlantedFault")
    for probe in planted["probes"]:
        finding = {"fixture": MISPLACED, "chat-511": FOREIGN}.get(probe["name"])
        if finding is None:
            continue
        cls, source = (CELL_MISPLACED, lambda b: f"block {b + 16}") if finding == MISPLACED else (
            CELL_FOREIGN, lambda b: f"probe fixture block {b}")  # fmt: skip
        for req in probe["requests"][1:]:
            req["kv_audit"] = _finer(cls, source)
        probe["kv"] = {"verdict": finding, "blame": planted_blame(), "reasons": [f"reuse 1: 256 of 384 cells: {SHAPE}"]}
    expected_kv = {
        "ExampleConnector": {"fixture": EXACT, "chat-511": EXACT, "chat-512": UNAVAILABLE},
        "PlantedFault": {"fixture": CORRUPT, "chat-511": CORRUPT, "chat-512": CORRUPT, "chat-513": CORRUPT},
        "native": {"fixture": EXACT, "chat-511": EXACT, "chat-512": EXACT, "chat-513": NUMERIC},
    }
    if stated:
        expected_kv["PlantedFault"].update({"fixture": MISPLACED, "chat-511": FOREIGN})
    tokens = {
        a["name"]: {p["name"]: p["verdict"] for p in a["probes"]} for a in report["arms"] if a["mode"] != "baseline"
    }
    report["acceptance"] = check_acceptance(report["arms"], tokens, "acceptance", expected_kv)
    return report


@pytest.fixture
def finer() -> dict:
    report = finer_report()
    validate_report(copy.deepcopy(report))  # the schema and the loader take the new classes
    return report


def test_the_read_model_counts_every_kv_finding_and_names_its_class(finer):
    report = as_report(finer)
    planted = next(a for a in report.arms if a.name == "PlantedFault")
    assert planted.kv_tally == "CORRUPT×2 · FOREIGN×1 · MISPLACED×1"
    assert [p.name for _, p in report.kv_findings] == ["fixture", "chat-511", "chat-512", "chat-513"]
    fixture = planted.probe("fixture")
    assert fixture.is_finding and fixture.kv_finding and fixture.kv_cell == f"MISPLACED: {BLAME}"
    assert fixture.kv_shapes == tuple(f"reuse {n}: {SHAPE}" for n in (1, 2, 3))
    audit = fixture.requests[1].kv_audit
    assert audit.blamed_blocks == tuple(PLANTED) and audit.corrupt_blocks == () and audit.shape == SHAPE
    (chunk,) = audit.blamed_chunks
    assert chunk.classes == ((CELL_MISPLACED, 2 * LAYERS * 16),) and not chunk.only_corrupt
    assert report.shows_finer_kv and not as_report(build_v2_report()).shows_finer_kv
    assert report.unexpected_kv_findings == () and exit_code(finer) == 0  # stated by the fixture: excused


def test_an_unstated_misplaced_or_foreign_exits_1_and_the_headline_names_it():
    report = finer_report(stated=False)
    assert exit_code(report) == EXIT_MISMATCH
    text = format_summary(report)
    assert (  # the CORRUPT of chat-512 and chat-513 is what the fixture states: not named as unstated
        "exit 1: KV FOREIGN and MISPLACED that the fixture does not state: PlantedFault fixture (MISPLACED); "
        "PlantedFault chat-511 (FOREIGN)"
    ) in text
    assert "| chat-511 | 511 | 0→496 | FAIL | @2 (decisive, gap 8.376 nats) | FOREIGN: blocks 0–15" in format_issue_md(
        report
    )


def test_the_summary_names_the_class_and_says_the_shape(finer):
    lines = format_summary(finer).splitlines()
    caught = " — the planted fault (zero_blocks) caught, as the fixture expects"  # the fixture states these classes
    lines = lines[lines.index(f"PlantedFault (PlantedFaultConnector): FAIL (decisive: 6){caught}") :]
    row = next(line for line in lines if line.startswith("  fixture     1502"))
    assert row.endswith(f"KV MISPLACED: {BLAME}")
    assert next(line for line in lines if line.startswith("  chat-511")).endswith(f"KV FOREIGN: {BLAME}")
    findings = lines[lines.index("KV findings:") + 1 :]
    assert (
        findings[0] == f"  PlantedFault (PlantedFaultConnector) / fixture: MISPLACED: {BLAME} (expected by the fixture)"
    )
    assert findings[1:4] == [f"    reuse {n}: {SHAPE}" for n in (1, 2, 3)]
    assert findings[4].startswith("  PlantedFault (PlantedFaultConnector) / chat-511: FOREIGN: ")
    assert f"/ chat-512: {BLAME} (expected by the fixture)" in findings[6]  # CORRUPT: the line as it always was


def _figures(html: str) -> dict[str, str]:
    return dict(re.findall(r'<figure class="kvmap" id="([^"]+)">(.*?)</figure>', html, re.DOTALL))


def test_the_site_draws_misplaced_and_foreign_cells_in_their_own_colours_and_keys_them(finer):
    html = render_report_page(finer, stem="r")
    assert '<span class="kvv kv-MISPLACED">MISPLACED: ' in html and '<span class="kvv kv-FOREIGN">FOREIGN: ' in html
    assert ".kv-MISPLACED {" in html and ".kv-FOREIGN {" in html and str(escape(KV_FINER_LEGEND)) + ".</p>" in html
    figures = _figures(html)
    fixture, chat = figures["d2-0-kv1"], figures["d2-1-kv1"]
    assert f'fill="{MISPLACED_FILL}" class="kv-m" stroke="#111111" stroke-width="1" stroke-dasharray="3 1"' in fixture
    assert f'fill="{FOREIGN_FILL}" class="kv-f" stroke="#111111" stroke-width="1" stroke-dasharray="1 1"' in chat
    assert "misplaced · rel 1 · max abs 3.5 · bytes equal block 16" in fixture
    assert "blamed: blocks 0–15 (tokens 0–255)" in fixture  # misplaced blocks are blamed as corrupt ones are
    assert "64 exact · 0 numeric · 128 misplaced · 0 corrupt of 192 cells" in fixture
    assert "0 foreign" not in fixture and "128 foreign" in chat
    legend = html[html.index('aria-label="KV heatmap legend"') :]
    legend = legend[: legend.index("</svg>")]
    assert "misplaced: this prompt&#39;s own KV from another block or plane (dashed outline)" in legend
    assert "foreign: another prompt&#39;s KV (dotted outline)" in legend
    assert 'class="kv-m"' in legend and 'class="kv-f"' in legend


def test_a_page_without_those_classes_keeps_its_legend_css_and_note():
    html = render_report_page(build_v2_report(), stem="r")
    assert "kv-MISPLACED" not in html and "kv-FOREIGN" not in html and escape(KV_FINER_LEGEND) not in html
    assert 'class="kv-m"' not in html and 'class="kv-f"' not in html and " misplaced" not in html


def test_the_legend_keys_only_the_classes_drawn_and_the_fills_stand_apart():
    base = build_legend()
    both = build_legend({CELL_MISPLACED, CELL_FOREIGN})
    one = build_legend({CELL_FOREIGN})
    assert both.cells[: len(base.cells)] == base.cells and both.labels[: len(base.labels)] == base.labels
    assert [c.css for c in both.cells[len(base.cells) :]] == ["kv-m", "kv-f"] and both.height == base.height + 48
    assert [c.css for c in one.cells[len(base.cells) :]] == ["kv-f"] and one.height == base.height + 24
    fills = {cell_fill(CELL_MISPLACED, 1.0), cell_fill(CELL_FOREIGN, 1.0), EXACT_FILL}
    ramps = {cell_fill(c, 10.0**e) for c in (CELL_NUMERIC, CELL_CORRUPT) for e in range(-8, 1)}
    assert len(fills) == 3 and not fills & ramps
    assert cell_fill(CELL_MISPLACED, 1e-8) == cell_fill(CELL_MISPLACED, None) == MISPLACED_FILL  # one colour each


def test_the_issue_names_the_classes_of_each_blamed_chunk_and_the_shapes(finer):
    body = format_issue_md(finer)
    audit = body[body.index("#### KV audit") : body.index("#### What maintainers ask for")]
    assert KV_FINER_LEGEND + "." in audit
    assert "Blamed chunks (runs of adjacent blocks with a finding cell: corrupt, foreign or misplaced):" in audit
    assert "| arm | probe | reuse | cells | blocks (tokens) |" in audit
    assert (
        "| PlantedFault (PlantedFaultConnector) | fixture | 1 | misplaced 128 | blocks 0–15 (tokens 0–255) |" in audit
    )
    assert "| chat-511 | 1 | foreign 128 |" in audit and "| chat-512 | 1 | corrupt 128 |" in audit
    assert f"- **PlantedFault (PlantedFaultConnector)** / `fixture` reuse 1: {SHAPE}" in audit
    assert "| MISPLACED: blocks 0–15" in body  # the verdict table's KV column
    plain = format_issue_md(build_v2_report())
    assert "| cells |" not in plain and "with a corrupt cell):" in plain and KV_FINER_LEGEND not in plain


def test_the_index_tallies_them_with_the_findings_first(finer):
    row = build_index_row(finer, stem="r", href="r.html")
    assert ("PlantedFault (PlantedFaultConnector)", "CORRUPT×2 · FOREIGN×1 · MISPLACED×1") in row.kv


def _mark(verdict: str, kv: str | None, arm: str = "A") -> SimpleNamespace:
    return SimpleNamespace(arm=arm, verdict=verdict, kv=kv, divergence="", conditions="")


def test_the_matrix_picture_outlines_each_class_apart_and_keys_it_where_seen():
    rows = [SimpleNamespace(name="cell", error=None, marks=[[_mark(PASS, MISPLACED)], [_mark(FAIL, CORRUPT)]])]
    page = SimpleNamespace(rows=rows, probes=["p", "q"])
    picture = build_picture(page)
    assert [s.stroke for s in picture.squares] == [OUTLINES[MISPLACED][0], OUTLINES[CORRUPT][0]]
    assert len({OUTLINES[v] for v in (CORRUPT, FOREIGN, MISPLACED, NUMERIC, EXACT, UNAVAILABLE)}) == 6
    assert [w.label for w in picture.outlines] == [
        "KV CORRUPT", "KV MISPLACED", "KV NUMERIC", "KV EXACT", "KV UNAVAILABLE", "not audited"
    ]  # fmt: skip
    plain = SimpleNamespace(rows=[SimpleNamespace(name="c", error=None, marks=[[_mark(FAIL, CORRUPT)]])], probes=["p"])
    assert [w.label for w in build_picture(plain).outlines] == [
        "KV CORRUPT", "KV NUMERIC", "KV EXACT", "KV UNAVAILABLE", "not audited"
    ]  # fmt: skip
    assert _tally(page) == "1 FAIL · 1 PASS, KV CORRUPT ×1, KV MISPLACED ×1 (reuse arm × probe)"
    assert _tally(plain) == "1 FAIL, KV CORRUPT ×1 (reuse arm × probe)"


def test_trial_rates_and_runs_name_each_kv_finding():
    rate = TrialRate({"probe": "p", "failed": 0, "kv_corrupt": 0, "kv_misplaced": 2, "kv_foreign": 1, "of": 5,
                      "class": "intermittent"})  # fmt: skip
    assert rate.cell == "FAIL 0/5, KV FOREIGN 1/5, KV MISPLACED 2/5" and rate.mark.text == "intermittent 3/5"
    assert TrialRate({"probe": "p", "failed": 1, "kv_corrupt": 1, "of": 2, "class": "every trial"}).cell == (
        "FAIL 1/2, KV CORRUPT 1/2"
    )  # a rate written before the finer classes
    assert run_probe_text({"verdict": PASS, "first_diffs": [None, None], "kv": FOREIGN}) == "PASS · KV FOREIGN"
    assert run_probe_text({"verdict": PASS, "first_diffs": [None], "kv": NUMERIC}) == "PASS"


def test_a_scenario_run_or_request_with_a_finer_kv_finding_is_a_finding_named_by_its_class():
    from test_scenario_views import scenario_report

    from repro.readmodel import StepRequest
    from repro.readmodel.scenario_trials import RequestRate

    rate = RequestRate({"verdicts": [PASS, PASS], "kv": [MISPLACED, None], "of": 2, "kv_corrupt": 0, "kv_misplaced": 1})
    kv = {"verdict": MISPLACED, "reasons": [], "blame": {"text": "blocks 0–1"}}
    req = StepRequest.from_scenario({"step": 1, "probe": "p", "verdict": PASS, "kv": kv}, 16, None, rate)
    assert req.trial_mark == "in 2 of 2 trials, KV MISPLACED in 1 of 2" and req.kv_cell == "MISPLACED: blocks 0–1"
    report = scenario_report()
    native = next(a for a in report["scenarios"][0]["arms"] if a["arm"] == "native")
    assert native["verdict"] == PASS
    native["kv"] = {"verdict": FOREIGN, "reasons": ["step 2 chat-511: another prompt's KV"], "blame": {"text": "x"}}
    read = as_report(report)
    assert ("a-b-a", "native") in {(s.name, a.name) for s, a in read.scenario_findings} and read.shows_finer_kv
    row = build_index_row(report, stem="r", href="r.html")
    assert ("a-b-a · native prefix caching", "PASS", "KV FOREIGN") in row.scenarios  # never a plain PASS
    assert "scenario a-b-a: native prefix caching PASS with foreign KV" in row.headline
    assert "  a-b-a · native: PASS · KV FOREIGN · " in format_summary(report)
