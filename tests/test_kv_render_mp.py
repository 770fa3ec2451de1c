"""LMCacheMPConnector arms in the KV views (issue 19 item 3): the site's heatmaps and the issue Markdown's
blamed chunks, from a real H200 report whose MP arm the KV audit read at its asynchronous loads.

Why MP arms had no heatmap and no chunk rows: nothing in the site or the issue Markdown picks connectors.
Both draw every reuse whose kv_audit has status "audited" and say any other in words; before the audit
read asynchronous loads, every MP reuse was "unavailable" (the connector loads asynchronously), so there
was nothing to draw. tests/data/h200-mp-kvaudit-trimmed.json is mp-fallback-gpu-load.json from the H200
conditions run (tests/gpu/h200_conditions.sh, kit 32fae5e+dirty, LMCache 0.5.4 torch fallback under
--gpu-load) trimmed to two probes (chat-511, chat-513) with the logprobs dropped."""

from __future__ import annotations

import copy

import pytest
from conftest import ROOT
from test_issue_md import html_tables

from repro.publish.issue_md import CHUNK_HEADER, chunk_rows, format_issue_md
from repro.publish.site_model import build_report_page
from repro.publish.summary import format_summary
from repro.record.report import load_report, validate_report

MP_REPORT = ROOT / "tests" / "data" / "h200-mp-kvaudit-trimmed.json"
MP = "LMCacheMPConnector"
ASYNC_REASON = "the connector loads asynchronously: the audit cannot tell when the load completed"


@pytest.fixture
def report() -> dict:
    data = load_report(MP_REPORT)
    validate_report(data)  # a real report, trimmed: still one the kit would write
    return data


def _mp_details(report: dict) -> dict:
    page = build_report_page(report, stem="mp", raw_href="raw/mp.json", log_hrefs={})
    return {d.probe: d for d in page.details if d.arm == MP}


def test_an_mp_arms_audited_reuses_each_get_a_heatmap_with_the_blamed_blocks(report):
    details = _mp_details(report)
    assert set(details) == {"chat-511", "chat-513"}
    (h511,) = details["chat-511"].kv.heatmaps
    (h513,) = details["chat-513"].kv.heatmaps
    assert "blamed: blocks 0–15 (tokens 0–255)" in h511.caption
    assert "blamed: blocks 0–31 (tokens 0–511)" in h513.caption
    assert h511.counts.startswith("0 exact · 0 numeric · 128 corrupt of 128 cells")  # 16 blocks x 4 layers x K, V
    outlined = [c for c in h511.cells if c.css == "kv-c"]
    assert len(outlined) == 128
    # what the wrong bytes equal, from the audit: another probe's KV (the fixture probe's, a later part of it)
    assert any("bytes equal probe fixture block 48" in c.title for c in outlined)
    cold = "cold: its prefill KV (31 blocks × 4 layers) is bit-identical to the baseline's; max rel 0, max abs 0"
    assert details["chat-511"].kv.lines == (cold,)  # the floor: its own cold prefill, every block


def test_an_mp_arm_is_drawn_exactly_as_a_v1_arm_with_the_same_audit(report):
    """Nothing in the views depends on which connector ran: the same arm renamed LMCacheConnectorV1 gives the
    same heatmaps and the same chunk rows but for the arm's name."""
    v1 = copy.deepcopy(report)
    arm = next(a for a in v1["arms"] if a["name"] == MP)
    arm["name"] = arm["connector"]["name"] = "LMCacheConnectorV1"
    page_mp = build_report_page(report, stem="mp", raw_href="raw/mp.json", log_hrefs={})
    page_v1 = build_report_page(v1, stem="mp", raw_href="raw/mp.json", log_hrefs={})
    maps_mp, maps_v1 = ([(d.probe, d.kv.heatmaps) for d in page.details if d.kv] for page in (page_mp, page_v1))
    assert maps_mp == maps_v1 and maps_mp
    assert [r[1:] for r in chunk_rows(report)] == [r[1:] for r in chunk_rows(v1)]


def test_an_mp_arms_blamed_chunks_are_in_the_issue_markdown(report):
    rows = chunk_rows(report)
    assert [r[:6] for r in rows] == [
        (MP, "chat-511", "1", "blocks 0–15 (tokens 0–255)", "0–3", "K+V"),
        (MP, "chat-513", "1", "blocks 0–31 (tokens 0–511)", "0–3", "K+V"),
    ]
    assert rows[0][7].startswith("probe fixture block 48 (")
    body = format_issue_md(report)
    assert "Blamed chunks (runs of adjacent blocks with a corrupt cell):" in body
    table = next(t for t in html_tables(body) if tuple(t[0]) == CHUNK_HEADER)
    assert [row[0] for row in table[1:]] == [MP, MP]
    assert f"{MP} / chat-511: blocks 0–15 (tokens 0–255), K+V, layers 0–3" in format_summary(report)


def test_an_mp_reuse_the_audit_could_not_read_is_said_in_words_not_drawn(report):
    """What every MP arm looked like before the audit read asynchronous loads: no heatmap, no chunk row."""
    for arm in report["arms"]:
        for probe in arm["probes"]:
            for r in probe["requests"][1:]:
                if arm["name"] == MP:
                    r["kv_audit"] = {"status": "unavailable", "reason": ASYNC_REASON}
    details = _mp_details(report)
    assert all(d.kv.heatmaps == () for d in details.values())
    assert f"reuse 1: KV audit unavailable: {ASYNC_REASON}" in details["chat-511"].kv.lines
    assert [r for r in chunk_rows(report) if r[0] == MP] == []
