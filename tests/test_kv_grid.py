"""The KV grid's two stored forms (repro.judge.kv_grid): version 2's dense rows and version 3's runs of the cells
whose figures are not 0, read back into one view; and the loader's strictness about which form a version uses."""

from __future__ import annotations

import json

import pytest
from kvkit_testutil import ROOT

from repro.errors import UsageError
from repro.judge.kv_grid import compact_plane, dense_plane, dense_planes, run_problems
from repro.readmodel import read_report
from repro.record.compact import compact_report
from repro.record.report import load_report

V2_EXAMPLE = ROOT / "tests" / "data" / "report-v2-example.json"
# One plane of a reuse, 2 layers x 6 blocks: layer 0 has blocks 2-3 wrong and block 5 bit-identical but not a
# number; layer 1 is bit-identical throughout.
CLASSES = ["eeccee", "eeeeee"]
MAX_ABS = [[0.0, 0.0, 12.5, 3.0, 0.0, None], [0.0] * 6]
REL = [[0.0, 0.0, 1.25, 0.5, 0.0, None], [0.0] * 6]


def test_runs_hold_the_figures_that_are_not_zero_and_read_back_as_the_rows():
    plane = compact_plane(CLASSES, MAX_ABS, REL)
    assert plane == {
        "class": CLASSES,
        "runs": [
            {"layer": 0, "first_block": 2, "max_abs": [12.5, 3.0], "rel": [1.25, 0.5]},
            {"layer": 0, "first_block": 5, "max_abs": [None], "rel": [None]},
        ],
    }
    assert dense_plane(plane) == {"class": CLASSES, "max_abs": MAX_ABS, "rel": REL}
    dense = {"class": CLASSES, "max_abs": MAX_ABS, "rel": REL}
    assert dense_plane(dense) is dense  # version 2's rows are read as they are
    assert dense_planes({"K": plane, "V": dense}) == {"K": dense, "V": dense} and dense_planes(None) == {}


def test_a_negative_zero_or_an_integer_zero_is_kept_in_a_run_so_nothing_changes_on_the_way_back():
    plane = compact_plane(["ee"], [[-0.0, 0]], [[0.0, 0.0]])
    assert plane["runs"] == [{"layer": 0, "first_block": 0, "max_abs": [-0.0, 0], "rel": [0.0, 0.0]}]
    assert json.dumps(dense_plane(plane)["max_abs"]) == "[[-0.0, 0]]"


@pytest.mark.parametrize(
    "runs, problem",
    [
        ("no", "runs must be a list"),
        ([{"layer": 0, "first_block": 0, "rel": [1.0]}], "must have exactly"),
        ([{"layer": 2, "first_block": 0, "max_abs": [1.0], "rel": [1.0]}], "outside the grid"),
        ([{"layer": 0, "first_block": 5, "max_abs": [1.0, 1.0], "rel": [1.0, 1.0]}], "outside the grid"),
        ([{"layer": 0, "first_block": 0, "max_abs": [], "rel": []}], "outside the grid"),
        ([{"layer": 0, "first_block": 0, "max_abs": [1.0], "rel": [1.0, 2.0]}], "lists of 2 numbers"),
        ([{"layer": 0, "first_block": 0, "max_abs": ["1"], "rel": [1.0]}], "lists of 1 numbers"),
        (
            [
                {"layer": 0, "first_block": 0, "max_abs": [1.0, 1.0], "rel": [1.0, 1.0]},
                {"layer": 0, "first_block": 1, "max_abs": [1.0], "rel": [1.0]},
            ],
            "overlaps or precedes",
        ),
        (
            [
                {"layer": 1, "first_block": 0, "max_abs": [1.0], "rel": [1.0]},
                {"layer": 0, "first_block": 3, "max_abs": [1.0], "rel": [1.0]},
            ],
            "overlaps or precedes",
        ),
    ],
)
def test_runs_outside_the_grid_out_of_order_or_uneven_are_named(runs, problem):
    found = run_problems(runs, layers=2, blocks=6)
    assert len(found) == 1 and problem in found[0]


def test_good_runs_have_no_problem():
    assert run_problems(compact_plane(CLASSES, MAX_ABS, REL)["runs"], layers=2, blocks=6) == []


def _first_audited(report: dict) -> dict:
    return next(
        r["kv_audit"]
        for a in report["arms"]
        for p in a["probes"]
        for r in p["requests"]
        if (r.get("kv_audit") or {}).get("status") == "audited" and r["kv_audit"]["counts"].get("corrupt")
    )


def test_each_version_must_use_its_own_form_and_bad_runs_are_refused_on_load(tmp_path):
    v3 = compact_report(load_report(V2_EXAMPLE))
    path = tmp_path / "r.json"
    v2_with_runs = dict(v3, schema_version=2)
    path.write_text(json.dumps(v2_with_runs))
    with pytest.raises(UsageError, match=r"must store its figures as max_abs and rel rows \(schema_version 2\)"):
        load_report(path)
    both = json.loads(json.dumps(v3))
    _first_audited(both)["planes"]["K"]["rel"] = []
    path.write_text(json.dumps(both))
    with pytest.raises(UsageError, match="must store its figures as runs"):
        load_report(path)
    bad = json.loads(json.dumps(v3))
    _first_audited(bad)["planes"]["V"]["runs"][0]["layer"] = 99
    path.write_text(json.dumps(bad))
    with pytest.raises(UsageError, match=r"planes\.V\.runs\[0\] lies outside the grid"):
        load_report(path)


def test_the_read_model_gives_both_forms_the_same_cells(tmp_path):
    compacted = tmp_path / "v3.json"
    compacted.write_text(json.dumps(compact_report(load_report(V2_EXAMPLE))))
    old, new = read_report(V2_EXAMPLE), read_report(compacted)
    audits = [
        (a.kv_audit, b.kv_audit)
        for pa, pb in zip(old.arms, new.arms, strict=True)
        for qa, qb in zip(pa.probes, pb.probes, strict=True)
        for a, b in zip(qa.requests, qb.requests, strict=True)
        if a.kv_audit is not None and a.kv_audit.audited
    ]
    assert audits and all(a.planes == b.planes and a.blamed_chunks == b.blamed_chunks for a, b in audits)
    assert any(any(v for row in a.planes["K"]["rel"] for v in row) for a, _ in audits)  # figures, not all 0
