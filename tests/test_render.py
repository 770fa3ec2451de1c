"""The static report site: content, order, escaping, determinism and pruning (repro.publish.site, repro.publish.site_model)."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import jinja2
import pytest
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.errors import UsageError
from repro.publish.site import make_environment, render_report_page, render_site, render_writeup
from repro.publish.site_model import visible_text

DATA = ROOT / "tests" / "data"
STEM = "render-selftest"
GOLD = DATA / f"{STEM}.gold.html"
XSS = ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>']


class Page(HTMLParser):
    """Tags, attributes and text of a page, plus the cell texts of every table row by table id (else class)."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.rows: dict[str, list[list[str]]] = {}
        self._table: list[str] = []
        self._cell: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "table":
            self._table.append(dict(attrs).get("id") or dict(attrs).get("class") or "")
        elif tag == "tr" and self._table:
            self.rows.setdefault(self._table[-1], []).append([])
        elif tag in ("td", "th") and self._table:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "table" and self._table:
            self._table.pop()
        elif tag in ("td", "th") and self._cell is not None:
            self.rows[self._table[-1]][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def all_text(self) -> str:
        return "".join(self.text)


def load_fixture() -> dict:
    return json.loads((DATA / f"{STEM}.json").read_text(encoding="utf-8"))


@pytest.fixture
def reports(tmp_path: Path) -> Path:
    """A reports/ directory as `make repro` leaves it: the report, its writeup and (some of) its logs."""
    d = tmp_path / "reports"
    d.mkdir()
    for name in (f"{STEM}.json", f"{STEM}.md"):
        shutil.copy(DATA / name, d / name)
    shutil.copytree(DATA / f"{STEM}.logs", d / f"{STEM}.logs")
    return d


def test_site_files_pages_first_index_last(reports, tmp_path):
    out = tmp_path / "site"
    written = render_site(reports, out)
    rel = [p.relative_to(out).as_posix() for p in written]
    assert rel[-1] == "index.html"
    assert set(rel) == {
        f"raw/{STEM}.json",
        f"raw/{STEM}.logs/PlantedFault.log",
        f"raw/{STEM}.logs/baseline.log",
        f"{STEM}.html",
        "index.html",
    }
    assert (out / "raw" / f"{STEM}.json").read_bytes() == (reports / f"{STEM}.json").read_bytes()
    assert (out / "raw" / f"{STEM}.logs" / "PlantedFault.log").read_bytes() == (
        reports / f"{STEM}.logs" / "PlantedFault.log"
    ).read_bytes()


def test_report_page_sections_in_order(reports, tmp_path):
    render_site(reports, tmp_path / "site")
    html = (tmp_path / "site" / f"{STEM}.html").read_text(encoding="utf-8")
    marks = [
        'id="headline"',
        'id="acceptance"',
        'id="claim-banner"',
        'id="table"',
        'id="writeup"',
        'id="details"',
        'id="warnings"',
        'id="provenance"',
        'id="reproduce"',
    ]
    positions = [html.index(m) for m in marks]
    assert positions == sorted(positions)
    assert html.index("<title>Planted-fault self-test (vLLM 0.28.0, CPU Intel(R) Xeon(R) Processor, tiny): ") > 0
    assert "acceptance.matched = true (the kit&#39;s self-check against the fixture&#39;s expectations" in html
    page = Page(html)
    assert "claim_eligible=false: no speed, cost, throughput or latency claim" in " ".join(page.all_text().split())


def test_connector_vs_native_table_cells(reports, tmp_path):
    render_site(reports, tmp_path / "site")
    rows = Page((tmp_path / "site" / f"{STEM}.html").read_text(encoding="utf-8")).rows["cmp"]
    body = [r[:5] for r in rows[1:]]
    assert ["ExampleConnector: PASS"] in body
    assert ["PlantedFault (PlantedFaultConnector): FAIL (decisive: 6)"] in body
    assert ["native prefix caching: PASS"] in body
    assert ["fixture", "1502", "0→1488×3", "FAIL", "@9 (decisive ×3, gap 0.682 nats)"] in body
    assert ["chat-513", "513", "0→512", "FAIL", "@2 (decisive, gap 7.606 nats)"] in body
    skipped = body.index(["chat-513", "", "—", "SKIPPED", ""])  # ExampleConnector's skipped probe is shown, not dropped
    assert body[skipped + 1][0].startswith("ExampleConnector matches whole prompts only when (L-1) % block_size != 0")
    assert not any(r and r[0].startswith("baseline") for r in body)  # a PASS baseline is a line above, not a block
    planted = body.index(["PlantedFault (PlantedFaultConnector): FAIL (decisive: 6)"])
    assert body[planted + 1 : planted + 5] == [
        ["fixture", "1502", "0→1488×3", "FAIL", "@9 (decisive ×3, gap 0.682 nats)"],
        ["chat-511", "511", "0→496", "FAIL", "@2 (decisive, gap 8.376 nats)"],
        ["chat-512", "512", "0→496", "FAIL", "@2 (decisive, gap 9.219 nats)"],
        ["chat-513", "513", "0→512", "FAIL", "@2 (decisive, gap 7.606 nats)"],
    ]


def test_probe_details_tokens_margin_cached(reports, tmp_path):
    render_site(reports, tmp_path / "site")
    html = (tmp_path / "site" / f"{STEM}.html").read_text(encoding="utf-8")
    ai = [a["name"] for a in load_fixture()["arms"]].index("PlantedFault")
    section = html[html.index(f'id="d{ai}-0"') : html.index(f'id="d{ai}-1"')]
    page = Page(section)
    req_rows = page.rows["req"]
    assert [r[:3] for r in req_rows[1:]] == [
        ["baseline", "0", ""],
        ["cold", "0", ""],
        ["reuse 1", "1488", "@9"],
        ["reuse 2", "1488", "@9"],
        ["reuse 3", "1488", "@9"],
    ]
    assert req_rows[3][4].startswith("@9: baseline 152 (margin 0.682, top-2 gap 0.682) · reuse 228 (margin 5.998)")
    tok_rows = page.rows["tok"]
    assert tok_rows[1][:11] == ["baseline", "210", "192", "179", "249", "231", "61", "123", "311", "219", "152"]
    assert tok_rows[3][10] == "228"
    first = re.findall(r'<td class="first">(\d+)</td>', section)
    assert first == ["228", "228", "228"]  # one highlighted first difference per reuse, at index 9


def test_warnings_provenance_reproduce_links(reports, tmp_path):
    render_site(reports, tmp_path / "site")
    report = load_fixture()
    page = Page((tmp_path / "site" / f"{STEM}.html").read_text(encoding="utf-8"))
    text = " ".join(page.all_text().split())
    w = report["warnings"][0]
    assert f"{w['arm']} {w['count']} {w['message']}" in " ".join(
        " ".join(r) for rows in page.rows.values() for r in rows
    )
    assert f"{sum(x['count'] for x in report['warnings'])} warning line(s)" in text
    kv = page.rows["kv"]
    assert ["kit.commit", "unavailable: git exited 128 (dirty: unknown)"] in kv
    assert ["started_utc", "2026-11-29T19:59:58Z"] in kv and ["packages.vllm", "0.28.0"] in kv
    assert ["hardware.cpu", "Intel(R) Xeon(R) Processor"] in kv and ["enable_prefix_caching", "true"] in kv
    assert "Effective engine config: PlantedFault (PlantedFaultConnector)" in text
    assert "python -m repro.verify_kv_reuse --model MODEL_DIR --dtype float32" in text and "/tmp" not in text
    hrefs = [a.get("href") for tag, a in page.tags if tag == "a"]
    assert f"raw/{STEM}.json" in hrefs and f"raw/{STEM}.logs/PlantedFault.log" in hrefs
    assert f"raw/{STEM}.logs/native.log" not in hrefs and f"{STEM}.logs/native.log (not beside the report)" in text


def test_index_row(reports, tmp_path):
    second = load_fixture()
    second["hardware_label"] = "NVIDIA H200"
    second["provenance"]["kit"] = {"commit": "0123456789abcdef0123456789abcdef01234567", "dirty": True, "source": "git"}
    (reports / "a-h200.json").write_text(json.dumps(second), encoding="utf-8")
    render_site(reports, tmp_path / "site")
    page = Page((tmp_path / "site" / "index.html").read_text(encoding="utf-8"))
    rows = page.rows["reports"]
    assert rows[0] == ["finding", "verdicts", "stack", "self-check"]  # no KV column: the reports predate the audit
    # the same stack and start: by file name; each row led by its headline, the file under it
    headline = (
        "Planted-fault self-test (vLLM 0.28.0, {hw}, tiny): PlantedFault (planted fault: zero_blocks) answered "
        "differently after a reported cache hit on 4 of 4 probes; ExampleConnector PASS; native prefix caching PASS; "
        "KV not audited (the report predates the audit)"
    )
    assert rows[1][0] == headline.format(hw="NVIDIA H200") + "a-h200"  # the file on the line under it
    assert rows[2][0] == headline.format(hw="CPU Intel(R) Xeon(R) Processor") + STEM
    assert rows[1][2] == "vLLM 0.28.0 · LMCache not installedNVIDIA H200 · 2026-11-29kit 0123456789ab+dirty"
    assert rows[2][1] == (
        "baseline PASS ExampleConnector PASS PlantedFault (PlantedFaultConnector) FAIL (decisive: 6) "
        "native prefix caching PASS"
    )
    assert rows[2][3] == "true"
    assert [a["href"] for t, a in page.tags if t == "a"] == ["a-h200.html", f"{STEM}.html"]
    assert "self-check</strong> is <code>acceptance.matched</code>, the kit&#39;s self-check against the fixture" in (
        (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    )


def test_rerender_is_byte_identical(reports, tmp_path):
    first = {p.relative_to(tmp_path / "one"): p.read_bytes() for p in render_site(reports, tmp_path / "one")}
    second = {p.relative_to(tmp_path / "two"): p.read_bytes() for p in render_site(reports, tmp_path / "two")}
    assert first == second
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "one").rglob("*") if p.is_file()}
    again = render_site(reports, tmp_path / "one")
    assert {p.relative_to(tmp_path / "one"): p.read_bytes() for p in again} == first
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "one").rglob("*") if p.is_file()} == mtimes


def _scrub(html: str) -> str:
    """The page without its stylesheet: the gold file pins content and structure, not colours."""
    return re.sub(r"<style>.*?</style>", "<style>…</style>", html, flags=re.DOTALL)


def test_report_page_matches_gold(reports, tmp_path):
    render_site(reports, tmp_path / "site")
    got = _scrub((tmp_path / "site" / f"{STEM}.html").read_text(encoding="utf-8"))
    if os.environ.get("KVKIT_UPDATE_GOLD"):
        GOLD.write_text(got, encoding="utf-8")
    assert got == GOLD.read_text(encoding="utf-8"), "re-run with KVKIT_UPDATE_GOLD=1 if the change is intended"


def test_pages_are_self_contained(reports, tmp_path):
    render_site(reports, tmp_path / "site")
    for name in ("index.html", f"{STEM}.html"):
        html = (tmp_path / "site" / name).read_text(encoding="utf-8")
        page = Page(html)
        tags = {t for t, _ in page.tags}
        assert not tags & {"script", "link", "img", "iframe", "object", "embed", "video", "audio", "source", "base"}
        assert not any(k in ("src", "srcset") or k.startswith("on") for _, attrs in page.tags for k in attrs)
        assert all(not re.match(r"^[a-z]+:|//", a.get("href", "")) for t, a in page.tags if t == "a")
        style = re.search(r"<style>(.*?)</style>", html, re.DOTALL).group(1)
        assert "url(" not in style and "@import" not in style and "@font-face" not in style


def _hostile(report: dict) -> dict:
    report = copy.deepcopy(report)
    planted = next(a for a in report["arms"] if a["name"] == "PlantedFault")
    probe = planted["probes"][0]
    probe["name"] = XSS[1]
    for req in probe["requests"]:
        req["text"] = XSS[0] + "\x11" + XSS[1]
    planted["findings"] = [XSS[0]]
    planted["connector"]["name"] = XSS[1]
    report["warnings"][0]["message"] = XSS[0]
    report["hardware_label"] = XSS[1]
    report["provenance"]["argv"].append(XSS[0])
    report["arms"][0]["effective_config"]["model"] = XSS[1]
    return report


def test_model_text_is_escaped():
    html = render_report_page(_hostile(load_fixture()), stem=XSS[1])
    page = Page(html)
    assert not {t for t, _ in page.tags} & {"script", "img"}
    assert not any(k.startswith("on") for _, attrs in page.tags for k in attrs)
    text = page.all_text()
    assert XSS[0] + "\\x11" + XSS[1] in text  # the decoded text, shown as text with the control char spelled out
    assert text.count(XSS[1]) >= 5 and text.count(XSS[0]) >= 3
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in html


def test_writeup_markdown_is_rendered_and_raw_html_shown_as_text():
    html = str(
        render_writeup(
            "# T\n\n**b** <script>alert(1)</script> [x](javascript:alert(1)) [ok](https://ex.org) "
            "![pic](https://ex.org/p.png)\n\n" + XSS[1]
        )
    )
    page = Page(html)
    assert ("h1", {}) in page.tags and ("strong", {}) in page.tags
    assert not {t for t, _ in page.tags} & {"script", "img"}
    hrefs = [a.get("href") for t, a in page.tags if t == "a"]
    assert hrefs == [None, "https://ex.org"]
    assert XSS[0] in page.all_text() and XSS[1] in page.all_text() and "[image not embedded: pic]" in page.all_text()


@settings(max_examples=40, deadline=None)
@given(st.text())
def test_any_model_text_renders_as_itself(text):
    report = load_fixture()
    report["arms"][2]["probes"][0]["requests"][1]["text"] = text
    assert visible_text(text) in Page(render_report_page(report, stem="x")).all_text()
    assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]", visible_text(text))


def test_environment_is_strict():
    env = make_environment()
    assert env.autoescape is True and env.undefined is jinja2.StrictUndefined
    with pytest.raises(jinja2.UndefinedError):
        env.get_template("report.html.j2").render(writeup=None, generator="x")


def test_error_arm_and_missing_baseline_render():
    report = load_fixture()
    report["arms"][0].update(
        verdict="ERROR", probes=[], error={"kind": "timeout", "detail": "no result in 600 s", "log_tail": "Killed"}
    )
    report["arms"][2].update(
        verdict="ERROR", probes=[], error={"kind": "crash", "detail": "exit code -9", "log_tail": "x"}
    )
    page = Page(render_report_page(report, stem="e"))
    text = " ".join(page.all_text().split())
    assert "baseline (prefix caching off, no connector): ERROR" in text
    assert "ERROR crash: exit code -9" in text
    assert ["PlantedFault (PlantedFaultConnector): ERROR"] in page.rows["cmp"]


def test_removed_report_is_pruned_and_foreign_files_kept(reports, tmp_path):
    out = tmp_path / "site"
    out.mkdir()
    (out / "README.md").write_text("keep\n")
    (out / "mine.html").write_text("<p>not generated</p>\n")
    render_site(reports, out)
    (reports / f"{STEM}.json").unlink()
    written = render_site(reports, out)
    assert [p.name for p in written] == ["index.html"]
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["README.md", "index.html", "mine.html"]


def test_bad_report_is_a_usage_error(tmp_path):
    (tmp_path / "r.json").write_text('{"kind": "kvkit-report", "schema_version": 99}')
    with pytest.raises(UsageError, match="upgrade the kit"):
        render_site(tmp_path, tmp_path / "site")


def test_log_path_outside_the_reports_dir_is_not_copied(reports, tmp_path):
    report = load_fixture()
    report["arms"][0]["log"] = "../secret.log"
    (tmp_path / "secret.log").write_text("secret\n")
    (reports / f"{STEM}.json").write_text(json.dumps(report), encoding="utf-8")
    written = render_site(reports, tmp_path / "site")
    assert not any("secret" in p.name for p in written)
    assert not list((tmp_path / "site").rglob("secret.log"))


def test_cli_site_command(reports, tmp_path):
    from repro.__main__ import main

    assert main(["site", "--reports", str(reports), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "index.html").is_file()
    assert main(["site", "--reports", str(tmp_path / "nope"), "--out", str(tmp_path / "o2")]) == 2


def test_gpu_shaped_probe_cells_margin_near_tie_and_short_output():
    """What an LMCache run can produce: distinct first diffs, an unreported counter, a near tie, a short reuse."""
    report = load_fixture()
    planted = next(a for a in report["arms"] if a["name"] == "PlantedFault")
    reqs = planted["probes"][0]["requests"]
    reqs[1].update(
        first_diff=4,
        margin={
            "index": 4,
            "baseline_token": 61,
            "reuse_token": 7,
            "baseline_margin": 0.05,
            "reuse_margin": 1.5,
            "baseline_top_gap": 0.05,
            "near_tie": True,
            "baseline_gap_lower_bound": 0.04,
        },
    )
    reqs[2].update(first_diff=15, token_ids=reqs[2]["token_ids"][:15])
    reqs[3]["cached_tokens"] = None
    page = Page(render_report_page(report, stem="g"))
    # reuse 2 keeps its margin at @9 (gap 0.682): its class comes from the margin it carries
    classed = "@4 (near-tie, gap 0.050 nats), @15 (decisive, gap 0.682 nats), @9 (decisive, gap 0.682 nats)"
    assert ["fixture", "1502", "0→1488,1488,?", "FAIL", classed] in [r[:5] for r in page.rows["cmp"]]
    text = page.all_text()
    assert "@4: baseline 61 (margin 0.050, top-2 gap 0.050) · reuse 7 (margin 1.500) · gap ≥ 0.040 · near-tie" in text
    html = render_report_page(report, stem="g")
    assert '<td class="first"></td>' in html  # reuse 2 ended before index 15: the first difference is its absence


def test_a_list_under_a_paragraph_line_renders_as_a_list():
    html = str(render_writeup("Para line\n- a\n  more of a\n- b\n\nText\n1. one\n2. two\n\n```\nx\n- y\n```\n"))
    assert "<p>Para line</p>\n<ul>\n<li>a\n  more of a</li>\n<li>b</li>\n</ul>" in html
    assert "<p>Text</p>\n<ol>\n<li>one</li>\n<li>two</li>\n</ol>" in html
    assert "<pre><code>x\n- y\n</code></pre>" in html  # a fence's text is left as it is


def test_committed_writeups_have_no_run_on_lists():
    """Every writeup's bullet lists are lists (issue 35: ten ran into the paragraph above them)."""
    writeups = sorted((ROOT / "reports").rglob("*.md"))
    if not writeups:
        pytest.skip("no committed writeups in this copy (the kit)")
    run_on = re.compile(r"<p>[^<]*\n(?:[-*+]|\d+\.) ")
    assert [p.name for p in writeups if run_on.search(str(render_writeup(p.read_text(encoding="utf-8"))))] == []
    lists = sum(str(render_writeup(p.read_text(encoding="utf-8"))).count("<ul>") for p in writeups)
    assert lists >= 10
