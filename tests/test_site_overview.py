"""The index's opening picture (repro.publish.site_overview) and the pages' show-before-tell fixes, on committed
reports: a cell per stack × reuse path coloured by what the arms show and linked to the report, one line per finding,
the planted fault caught listed as a self-test, a .json.xz report on the site, "exploratory run" where the fixture
states no expectation, P→D negative controls that held in the pass colour, no word broken inside, a CPU page that
says "the CPU", the table's legend from the page's own figures and a heatmap that scrolls on a phone. Engine-free."""

from __future__ import annotations

import copy
import json
import lzma
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import ROOT
from kvkit_testutil import committed_or_skip

from repro.judge.verdict import FAIL, KV_FINDINGS, SKIPPED
from repro.publish.site import render_site
from repro.publish.site_index import EXPLORATORY, build_index_row
from repro.publish.site_overview import OTHER, SELF_TEST, V1, build_picture
from repro.readmodel import read_report
from repro.readmodel.files import json_files, stem_of

REPORTS = ROOT / "reports"
KVAUDIT = REPORTS / "h200-kvaudit-lmcache-0.5.4.json"  # LMCacheConnectorV1 FAIL with corrupt KV, native PASS
DEGRADED = REPORTS / "h200-lmcache-degraded.json"  # LMCacheConnectorV1 ERROR
SELFTEST = REPORTS / "versions" / "cpu-vllm-0.32.0-selftest.json"  # CPU: the planted fault caught, as expected
EXPLORING = REPORTS / "conditions" / "h200-conditions-mp-compiled-alone.json"  # the fixture states no expectation
ADAPTERS = REPORTS / "adapters" / "h200-adapters-lmcache-tiny-v028.json.xz"  # committed xz-compressed
PD = REPORTS / "pd" / "h200-pd-tiny-v026.json"  # one negative control held, one did not
SOURCES = (KVAUDIT, DEGRADED, SELFTEST, EXPLORING, ADAPTERS, PD)


class Tags(HTMLParser):
    """Every start tag with its attributes, the text inside each element with an id, and each table's rows of
    (tag, attributes, text) cells by table id."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.tables: dict[str, list[list[tuple[str, dict, str]]]] = {}
        self._tables: list[str] = []
        self._cell: tuple[str, dict, list[str]] | None = None
        self._ids: list[tuple[str, str, list[str]]] = []
        self.by_id: dict[str, str] = {}
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag in ("br", "wbr"):
            if tag == "br":
                self.handle_data(" ")
            return
        if tag == "table":
            self._tables.append(a.get("id") or "")
        elif tag == "tr" and self._tables:
            self.tables.setdefault(self._tables[-1], []).append([])
        elif tag in ("td", "th") and self._tables:
            self._cell = (tag, a, [])
        if "id" in a:
            self._ids.append((tag, a["id"], []))
        if tag == "a" and self._cell is not None and "href" in a:
            self._cell[1].setdefault("_href", a["href"])
            self._cell[1].setdefault("_title", a.get("title", ""))

    def handle_endtag(self, tag):
        if tag == "table" and self._tables:
            self._tables.pop()
        elif tag in ("td", "th") and self._cell is not None:
            kind, attrs, text = self._cell
            self.tables[self._tables[-1]][-1].append((kind, attrs, " ".join("".join(text).split())))
            self._cell = None
        if self._ids and self._ids[-1][0] == tag:
            _, ident, text = self._ids.pop()
            self.by_id[ident] = " ".join("".join(text).split())

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[2].append(data)
        for _, _, text in self._ids:
            text.append(data)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site of a few committed reports, laid out as under reports/ (a folder each for the others)."""
    committed_or_skip(*SOURCES)
    root = tmp_path_factory.mktemp("overview")
    reports = root / "reports"
    for src in SOURCES:
        dest = reports / src.relative_to(REPORTS)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dest)
        md = src.parent / f"{stem_of(src)}.md"
        if md.is_file():
            shutil.copy(md, dest.parent / md.name)
    render_site(reports, root / "site", versions=True)
    return root / "site"


def _index(site: Path) -> Tags:
    return Tags((site / "index.html").read_text(encoding="utf-8"))


def _picture(site: Path) -> tuple[list[str], dict[str, dict[str, dict]]]:
    """The picture's columns and, by the stack's text, each column's cell attributes."""
    rows = _index(site).tables["picture"]
    columns = [text for _, _, text in rows[0][1:]]
    cells = {}
    for row in rows[1:]:
        (_, _, stack), *rest = row
        assert len(rest) == len(columns), f"{stack}: {len(rest)} cells for {len(columns)} columns"
        cells[stack] = {column: {**attrs, "text": text} for column, (_, attrs, text) in zip(columns, rest, strict=True)}
    return columns, cells


def _row(cells: dict, *words: str) -> dict:
    found = [v for k, v in cells.items() if all(w in k for w in words)]
    assert len(found) == 1, f"{words}: {list(cells)}"
    return found[0]


def _probes(path: Path, arm: str) -> tuple[int, int, dict[str, int], int]:
    """An arm's FAIL probes, compared probes, KV findings and audited probes, read from the raw JSON."""
    raw = path.read_bytes()
    data = json.loads(lzma.decompress(raw) if path.name.endswith(".xz") else raw)
    probes = next(a for a in data["arms"] if a["name"] == arm)["probes"]
    kv = [(p.get("kv") or {}).get("verdict") for p in probes]
    found = {c: kv.count(c) for c in KV_FINDINGS if c in kv}
    compared = [p for p in probes if p["verdict"] != SKIPPED]
    return sum(p["verdict"] == FAIL for p in compared), len(compared), found, sum(v is not None for v in kv)


def test_the_index_opens_with_one_cell_per_stack_and_reuse_path(site):
    html = (site / "index.html").read_text(encoding="utf-8")
    assert html.index('id="picture"') < html.index('id="reports"'), "the picture comes before the table"
    columns, cells = _picture(site)
    # the columns are the paths these reports hold, in the picture's order
    assert columns == ["native prefix caching", V1, "LMCache MP", "P→D", "LoRA adapters", SELF_TEST]
    kvaudit = _row(cells, "vLLM 0.26.0", "LMCache 0.5.4", "NVIDIA H200", "kvkit-tiny-qwen3-seed6")
    # LMCacheConnectorV1 FAILs with corrupt KV (here) and ends in ERROR (the degraded start): a finding, never a pass
    assert kvaudit[V1]["class"] == "cell s-finding" and kvaudit[V1]["text"].startswith("FAIL KV CORRUPT")
    assert kvaudit["native prefix caching"]["class"] == "cell s-pass"
    assert "2 reports" in kvaudit[V1]["text"] and kvaudit[V1]["_href"].startswith("#cell-")
    assert kvaudit["P→D"]["class"] == "cell s-none" and kvaudit["P→D"]["text"] == "—"
    cpu = _row(cells, "vLLM 0.32.0", "CPU")
    assert cpu[SELF_TEST]["class"] == "cell s-caught" and "planted, caught" in cpu[SELF_TEST]["text"]
    assert cpu[SELF_TEST]["_href"] == "versions/cpu-vllm-0.32.0-selftest.html"
    mp = _row(cells, "vLLM 0.26.0", "LMCache 0.5.4", "NVIDIA H200", "kvkit-tiny-qwen3-seed6")["LMCache MP"]
    assert mp["class"] == "cell s-pass" and mp["_href"] == "conditions/h200-conditions-mp-compiled-alone.html"
    adapters = _row(cells, "vLLM 0.28.0", "LMCache 0.5.4")["LoRA adapters"]
    assert (
        adapters["class"] == "cell s-finding" and adapters["_href"] == "adapters/h200-adapters-lmcache-tiny-v028.html"
    )
    # the several reports of a cell are listed where its link goes, each linked
    index = _index(site)
    anchor = kvaudit[V1]["_href"][1:]
    assert V1 in index.by_id[anchor]
    linked = [a["href"] for t, a in index.tags if t == "a" and "href" in a]
    assert "h200-kvaudit-lmcache-0.5.4.html" in linked and "h200-lmcache-degraded.html" in linked


def test_a_finding_is_one_line_a_planted_fault_caught_a_self_test(site):
    index = _index(site)
    findings, self_tests = index.by_id["findings-list"], index.by_id["self-tests-list"]
    failed, compared, kv, audited = _probes(KVAUDIT, "LMCacheConnectorV1")
    assert failed and kv.get("CORRUPT")
    line = (
        f"LMCacheConnectorV1 answered differently on {failed} of {compared} probes, KV CORRUPT on {kv['CORRUPT']} of "
        f"{audited} · vLLM 0.26.0 + LMCache 0.5.4 · NVIDIA H200 · kvkit-tiny-qwen3-seed6 · in 1 of 2 reports"
    )
    assert line in findings
    assert "PlantedFault" not in findings, "a planted fault caught as the fixture expects is no finding"
    assert "the planted fault caught: PlantedFault (PlantedFaultConnector) · vLLM 0.32.0 · CPU" in self_tests


def test_verdict_states_look_apart(site):
    """A finding, an ERROR, an INCONCLUSIVE, a caught planted fault and a pass each have their own colours."""
    css = (site / "index.html").read_text(encoding="utf-8")
    rules = {s: re.search(rf"\.s-{s} {{([^}}]*)}}", css).group(1) for s in ("finding", "error", "inconclusive",
                                                                           "caught", "pass")}  # fmt: skip
    assert len(set(rules.values())) == len(rules)
    assert "var(--fail)" in rules["finding"] and "var(--pass" in rules["pass"] and "var(--fail)" not in rules["pass"]


def _arm(data: dict, name: str) -> dict:
    return next(a for a in data["arms"] if a["name"] == name)


def test_an_unknown_connector_goes_under_other_and_every_state_is_read_not_decided():
    data = json.loads(SELFTEST.read_text(encoding="utf-8"))
    made = copy.deepcopy(data)
    made["provenance"]["started_utc"] = "2026-12-09T00:00:00Z"
    example = _arm(made, "ExampleConnector")
    example["connector"]["name"] = "MadeUpConnector"
    example["verdict"] = "INCONCLUSIVE"
    _arm(made, "native")["verdict"] = "ERROR"
    rows = [build_index_row(made, stem="made", href="made.html")]
    picture = build_picture(rows)
    columns = ["".join(parts) for parts, _ in picture.columns]
    assert OTHER in columns
    cells = dict(zip(columns, picture.rows[0].cells, strict=True))
    assert cells[OTHER].state == "inconclusive" and cells[OTHER].label == "INCONCLUSIVE"
    assert cells["native prefix caching"].state == "error"
    # the planted arm caught as the fixture expects is the acceptance record's word: unmatched, it is a finding
    assert cells[SELF_TEST].state == "caught"
    made["acceptance"]["matched"] = False
    cells = dict(
        zip(columns, build_picture([build_index_row(made, stem="m", href="m.html")]).rows[0].cells, strict=True)
    )
    assert cells[SELF_TEST].state == "finding"


def test_self_tests_caught_in_several_reports_link_to_their_cell_whatever_else_it_shows():
    """Two reports of one stack whose planted fault was caught, one with ExampleConnector INCONCLUSIVE in the same
    cell: the cell reads INCONCLUSIVE, and the self-test line links to its list of reports (it once raised
    StopIteration looking for a cell in the caught state)."""
    data = json.loads(SELFTEST.read_text(encoding="utf-8"))
    other = copy.deepcopy(data)
    _arm(other, "ExampleConnector")["verdict"] = "INCONCLUSIVE"
    picture = build_picture(
        [build_index_row(data, stem="a", href="a.html"), build_index_row(other, stem="b", href="b.html")]
    )
    columns = ["".join(parts) for parts, _ in picture.columns]
    cell = dict(zip(columns, picture.rows[0].cells, strict=True))[SELF_TEST]
    assert cell.state == "inconclusive" and cell.reports == 2 and cell.href.startswith("#cell-")
    assert [line.href for line in picture.self_tests] == [cell.href]
    assert cell.href.removeprefix("#") in {listed.anchor for listed in picture.lists}


def test_a_compressed_report_has_its_page_raw_copy_and_writeup(site):
    page = site / "adapters" / "h200-adapters-lmcache-tiny-v028.html"
    assert page.is_file()
    html = page.read_text(encoding="utf-8")
    assert 'href="raw/h200-adapters-lmcache-tiny-v028.json.xz"' in html
    assert (site / "adapters" / "raw" / "h200-adapters-lmcache-tiny-v028.json.xz").read_bytes() == ADAPTERS.read_bytes()
    assert 'id="writeup"' in html
    index = (site / "index.html").read_text(encoding="utf-8")
    assert 'href="adapters/h200-adapters-lmcache-tiny-v028.html"' in index


def test_every_committed_report_format_is_found_and_a_restored_copy_counts_once(tmp_path):
    for folder in (REPORTS / "adapters", REPORTS / "offloading"):
        committed = sorted({stem_of(p) for s in ("*.json", "*.json.xz") for p in folder.glob(s)})
        assert [stem_of(p) for p in json_files(folder)] == committed
    shutil.copy(ADAPTERS, tmp_path / ADAPTERS.name)
    (tmp_path / ADAPTERS.name.removesuffix(".xz")).write_bytes(lzma.decompress(ADAPTERS.read_bytes()))  # xz -dk
    assert [p.name for p in json_files(tmp_path)] == [ADAPTERS.name.removesuffix(".xz")]
    assert read_report(tmp_path / ADAPTERS.name).data == read_report(tmp_path / ADAPTERS.name[:-3]).data


def test_acceptance_matched_only_where_the_fixture_states_expectations(site):
    index = _index(site)
    rows = {cells[0][2].split()[-1]: cells[-1][2] for cells in index.tables["reports"][1:]}
    assert rows["conditions/h200-conditions-mp-compiled-alone"] == EXPLORATORY
    assert rows["versions/cpu-vllm-0.32.0-selftest"] == "true"
    assert rows["h200-kvaudit-lmcache-0.5.4"] == "false"  # the fixture states verdicts; not all were met
    exploring = Tags((site / "conditions" / "h200-conditions-mp-compiled-alone.html").read_text(encoding="utf-8"))
    assert exploring.by_id["acceptance"].startswith(EXPLORATORY) and "= false" not in exploring.by_id["acceptance"]
    stated = Tags((site / "versions" / "cpu-vllm-0.32.0-selftest.html").read_text(encoding="utf-8"))
    assert stated.by_id["acceptance"].startswith("acceptance.matched = true")


def test_pd_negative_controls_that_held_read_as_a_pass(site):
    index = _index(site)
    controls = [a for t, a in index.tags if t == "span" and "control" in a.get("class", "").split()]
    held = {a["data-held"]: a["class"] for a in controls}
    assert held == {"all": "verdict v-PASS control", "not all": "verdict v-FAIL control"}
    page = Tags((site / "pd" / "h200-pd-tiny-v026.html").read_text(encoding="utf-8"))
    rows = page.tables["requests-table"][1:]
    verdicts = {r[0][2]: r[3][2] for r in rows}
    assert verdicts["1 · consumed-reference"] == "control held (answer FAIL)"
    assert verdicts["1 · stale-reference"] == "control did not hold (answer FAIL)"
    badges = [a["class"] for t, a in page.tags if t == "span" and "control" in a.get("class", "").split()]
    assert "verdict v-PASS control" in badges and "verdict v-FAIL control" in badges


def _css_rule(html: str, selector: str) -> str:
    found = re.search(rf"(?m)^{re.escape(selector)} {{([^}}]*)}}", html)
    assert found, selector
    return found.group(1)


def test_no_badge_tally_or_hash_breaks_inside_a_word(site):
    html = (site / "index.html").read_text(encoding="utf-8")
    for selector in (".verdict", ".hash", ".nowrap", ".kvc"):
        assert "white-space: nowrap" in _css_rule(html, selector), selector
    assert "&nbsp;CORRUPT" not in html and "&nbsp;EXACT" not in html
    index = _index(site)
    tallies = [a for t, a in index.tags if t == "span" and "tally" in a.get("class", "").split()]
    assert tallies and all("nowrap" in a["class"].split() for a in tallies)
    hashes = [a for t, a in index.tags if t == "span" and "hash" in a.get("class", "").split()]
    assert any(a for a in hashes)
    assert 'LMCache</span> <span class="mono">not installed</span>' in html  # a CPU stack's cell wraps at its spaces
    report = (site / "h200-kvaudit-lmcache-0.5.4.html").read_text(encoding="utf-8")
    assert "white-space: nowrap" in _css_rule(report, ".verdict")


def test_a_cpu_page_names_the_cpu_and_each_page_explains_its_own_figures(site):
    cpu = Tags((site / "versions" / "cpu-vllm-0.32.0-selftest.html").read_text(encoding="utf-8"))
    assert "the CPU" in cpu.by_id["conditions-intro"] and "GPU" not in cpu.by_id["conditions-intro"]
    gpu = Tags((site / "conditions" / "h200-conditions-mp-compiled-alone.html").read_text(encoding="utf-8"))
    assert "the GPU" in gpu.by_id["conditions-intro"]
    kvaudit = Tags((site / "h200-kvaudit-lmcache-0.5.4.html").read_text(encoding="utf-8"))
    for page in (cpu, gpu, kvaudit):
        legend = page.by_id["table-legend"]
        rows = [r for r in page.tables["cmp"] if len(r) >= 5 and r[0][0] == "td"]
        cached = next(r[2][2] for r in rows if "→" in r[2][2])
        assert f"{cached}:" in legend, legend
        diffs = [r[4][2].split(" (")[0] for r in rows if r[4][2].startswith("@")]
        if diffs:  # the first of this page's own, never the README's
            assert f"{diffs[0]}:" in legend, legend
        else:
            assert "where a reuse first differs" in legend and not re.search(r"@\d", legend), legend
        for figure in ("0→1280×3", "@4,15"):
            if figure not in {c[2] for r in rows for c in r}:
                assert figure not in legend


def test_a_heatmap_scrolls_on_a_phone_and_the_headline_shrinks(site):
    html = (site / "h200-kvaudit-lmcache-0.5.4.html").read_text(encoding="utf-8")
    assert html.count('<div class="scroll kvscroll"><svg class="kvmap"') >= 2  # the lead map and the details'
    phone = html[html.index("@media (max-width: 700px)") :]
    assert re.search(r"\.kvscroll svg\.kvmap[^{]*{[^}]*max-width: none", html)
    assert re.search(r"h1\.headline { font-size: \.95rem", phone)
