"""The detection matrix: window logic over fake generations, the page, and the committed matrix."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT

from repro import detection
from repro.detection import Cell, prefix_check, render_page, summarize, summarize_cell, window_verdicts
from repro.verdict import FAIL, INCONCLUSIVE, PASS, Request

COMMITTED = ROOT / detection.DEFAULT_REPORT
COMMITTED_PAGE = ROOT / detection.DEFAULT_SITE
# The kit archive packs no reports/ subdirectories; in a checkout the committed matrix must be there.
needs_committed = pytest.mark.skipif(
    not COMMITTED.exists() and not (ROOT / ".git").exists(),
    reason="reports/detection/ is not in this tree (the kit does not pack it)",
)
BASE = list(range(100, 132))  # a 32-token baseline generation


def _diverge_at(i: int | None) -> tuple[int, ...]:
    return tuple(BASE) if i is None else tuple(BASE[:i] + [7] * (32 - i))


@pytest.mark.parametrize(
    "first_diff, expected",
    [
        (None, {8: PASS, 16: PASS, 32: PASS}),
        (0, {8: FAIL, 16: FAIL, 32: FAIL}),
        (7, {8: FAIL, 16: FAIL, 32: FAIL}),
        (8, {8: PASS, 16: FAIL, 32: FAIL}),  # index 8 is the 9th token: outside an 8-token window
        (15, {8: PASS, 16: FAIL, 32: FAIL}),
        (16, {8: PASS, 16: PASS, 32: FAIL}),
        (31, {8: PASS, 16: PASS, 32: FAIL}),
    ],
)
def test_detected_at_window_iff_first_diff_below_it(first_diff, expected):
    cold = Request(tuple(BASE), 0)
    assert window_verdicts(BASE, cold, [Request(_diverge_at(first_diff), 384)]) == expected


def test_unexercised_reuse_is_inconclusive_never_a_miss_or_detection():
    cold = Request(tuple(BASE), 0)
    assert set(window_verdicts(BASE, cold, [Request(_diverge_at(3), 0)]).values()) == {INCONCLUSIVE}
    assert set(window_verdicts(BASE, cold, [Request(_diverge_at(3), None)]).values()) == {INCONCLUSIVE}


def test_cold_divergence_inside_the_window_makes_it_inconclusive():
    verdicts = window_verdicts(BASE, Request(_diverge_at(12), 0), [Request(_diverge_at(12), 384)])
    assert verdicts == {8: PASS, 16: INCONCLUSIVE, 32: INCONCLUSIVE}


def test_cells():
    assert summarize_cell([FAIL, FAIL]) == Cell("detected", 2, 2)
    assert summarize_cell([FAIL, PASS]) == Cell("partial", 1, 2)
    assert summarize_cell([PASS, PASS]) == Cell("missed", 0, 2)
    assert summarize_cell([PASS, INCONCLUSIVE]) == Cell("inconclusive", 0, 2)
    assert summarize_cell([]).status == "error"


def _fault(kind: str, statuses: list[str]) -> dict:
    n = {"detected": 2, "partial": 1, "missed": 0, "inconclusive": 0}
    return {
        "fault": kind,
        "position": "head",
        "error": None,
        "windows": {str(w): {"status": s, "detected": n[s], "probes": 2} for w, s in zip(detection.WINDOWS, statuses)},
    }


def _control(fp: int, exercised: int = 4) -> dict:
    return {
        "arm": "native",
        "error": None,
        "reuses_exercised": exercised,
        "false_positives": {str(w): fp for w in detection.WINDOWS},
    }


def test_summary_needs_every_kind_detected_zero_false_positives_and_exercised_controls():
    ok = summarize([_fault("a", ["missed", "partial", "detected"]), _fault("b", ["detected"] * 3)], [_control(0)], True)
    assert (
        ok["ok"]
        and ok["every_fault_detected"]
        and ok["not_fully_detected_cells"] == ["a/head@8:missed", "a/head@16:partial"]
    )
    partial = summarize([_fault("a", ["missed", "partial", "partial"])], [_control(0)], True)
    assert partial["ok"] and not partial["every_fault_reliably_detected"]  # one diverging probe fails the arm
    assert not summarize([_fault("a", ["missed", "missed", "inconclusive"])], [_control(0)], True)["ok"]
    assert not summarize([_fault("a", ["detected"] * 3)], [_control(1)], True)["ok"]
    assert not summarize([_fault("a", ["detected"] * 3)], [_control(0, exercised=0)], True)["ok"]
    assert not summarize([_fault("a", ["detected"] * 3)], [_control(0)], False)["ok"]


def _run(tokens: list[list[int]]) -> dict:
    return {
        "probes": [
            {
                "name": "p",
                "requests": [{"token_ids": t, "logprobs": [[[x, -0.5], [0, -3.0]] for x in t]} for t in tokens],
            }
        ]
    }


def test_prefix_check():
    full = _run([list(range(32)), list(range(5)) + [9] * 27])
    assert prefix_check(_run([list(range(8)), list(range(5)) + [9] * 3]), full, 8)["ok"]
    bad = prefix_check(_run([list(range(8)), list(range(8))]), full, 8)
    assert not bad["ok"] and bad["mismatched"] == ["p#1"]


def _fake_report() -> dict:
    cell = {"status": "detected", "detected": 1, "probes": 1, "first_diffs": [3]}
    return {
        "kind": detection.KIND,
        "schema_version": detection.SCHEMA_VERSION,
        "tool_version": "0.1.0",
        "method": "m <script>",
        "config": {"windows": list(detection.WINDOWS)},
        "faults": [
            {
                "fault": "zero_blocks",
                "position": "head",
                "params": {"num_blocks": 1, "fault": "zero_blocks"},
                "error": None,
                "windows": {str(w): cell for w in detection.WINDOWS},
                "probes": [{"kv_audit": {"faulted_max_abs_diff": [[0, 3.5]]}, "margin": {"baseline_margin": 1.25}}],
            }
        ],
        "controls": [
            dict(_control(0), model_seed=1234, reuses_compared=4, inconclusive={str(w): 0 for w in detection.WINDOWS})
        ],
        "prefix_check": {"window": 8, "ok": True, "requests_compared": 3},
        "summary": summarize([_fault("zero_blocks", ["detected"] * 3)], [_control(0)], True),
        "provenance": {"started_utc": "2026-11-29T00:00:00Z", "kit": {"commit": "abc"}},
    }


def test_page_is_escaped_deterministic_and_self_contained():
    report = _fake_report()
    html = render_page(report)
    assert html == render_page(json.loads(json.dumps(report)))
    assert "<script>" not in html and "m &lt;script&gt;" in html
    assert "http://" not in html and "https://" not in html and "<link" not in html
    assert "1/1 @3" in html and "1.250" in html


@needs_committed
def test_committed_matrix_detects_every_fault_with_no_false_positive():
    report = detection.load_matrix(COMMITTED)
    kinds = {f["fault"] for f in report["faults"]}
    assert kinds == set(detection.FAULT_PARAMS) and len(kinds) >= 6
    assert {f["position"] for f in report["faults"]} == set(detection.POSITIONS)
    for kind in kinds:
        cells = [c for f in report["faults"] if f["fault"] == kind for c in f["windows"].values()]
        assert any(c["detected"] > 0 for c in cells), kind  # the arm verdict is FAIL somewhere
    assert not [f for f in report["faults"] if f["error"]] and not [c for c in report["controls"] if c["error"]]
    for c in report["controls"]:
        assert set(c["false_positives"].values()) == {0}, c["arm"]
        assert c["reuses_exercised"] == c["reuses_compared"] > 0, c["arm"]
    pairs = {(c["model_seed"], p["name"]) for c in report["controls"] for p in c["probes"]}
    assert len(pairs) >= 5
    assert {c["arm"] for c in report["controls"]} >= {"ExampleConnector", "native", "PlantedFault-none"}
    assert report["prefix_check"]["ok"] and report["prefix_check"]["requests_compared"] > 0
    # the summary is what the entries say, not something written beside them
    assert report["summary"] == summarize(report["faults"], report["controls"], report["prefix_check"]["ok"])
    assert report["summary"]["ok"]


@needs_committed
def test_committed_matrix_faults_really_changed_the_kv():
    report = detection.load_matrix(COMMITTED)
    for f in report["faults"]:
        for p in f["probes"]:
            audit = p["kv_audit"]
            assert audit["faulted_blocks"] == p["faulted_blocks"] and p["faulted_blocks"], (f["fault"], p["name"])
            assert all(d > 0 for _, d in audit["faulted_max_abs_diff"]), (f["fault"], p["name"])
            assert audit["clean_max_abs_diff"] == 0.0
    none = [c for c in report["controls"] if c["arm"] == "PlantedFault-none"]
    assert none and all(c["kv_audit"]["loads"] > 0 and c["kv_audit"]["max_abs_diff"] == 0.0 for c in none)


@needs_committed
def test_committed_page_is_the_rendering_of_the_committed_matrix():
    assert COMMITTED_PAGE.read_text(encoding="utf-8") == render_page(detection.load_matrix(COMMITTED))
