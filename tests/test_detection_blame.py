"""The detection matrix's KV audit column on synthetic results and comparison figures: exact, over and missing
blame, a control's false blame, an unaudited control, and a version 1 matrix (no audit) still loading."""

from __future__ import annotations

import json

import pytest

from repro.contract.result import ArmResult, ProbeResult, RequestResult
from repro.detection import plan
from repro.detection.blame import blame_outcome, control_blame, drop_unreferenced, fault_blame, summarize_blame
from repro.detection.matrix import summarize
from repro.detection.page import load_matrix, page_model, render_page
from repro.judge.verdict import CORRUPT, EXACT, FAIL, FOREIGN, KV_VERDICTS, MISPLACED, PASS, UNAVAILABLE

BLOCKS, LAYERS = 3, 2
WINDOWS = [str(w) for w in plan.WINDOWS]


def _record(seq: int, cold: bool) -> dict:
    """What repro.engine.kvaudit writes for one request (<seq>.json), as the child hands it back."""
    return {
        "seq": seq,
        "computed_blocks": BLOCKS if cold else 0,
        "reused_blocks": 0 if cold else BLOCKS,
        "local_tokens": 0,
        "block_size": 16,
        "layers": [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)],
        "layout": "cpu-rows",
        "kv_shape": [64, 2, 16, 128],
        "dtype": "float32",
    }


def _result(arm: str, probes: list[str], faulted: list[int] | None = None, reuses: int = 1) -> dict:
    """An audited arm's result (repro.contract.result.ArmResult's JSON): each probe cold, then `reuses` reuses."""
    seq, out = 0, []
    for name in probes:
        reqs = []
        for i in range(1 + reuses):
            params = None if faulted is None or i == 0 else {"planted_fault": {"faulted_blocks": faulted}}
            reqs.append(
                RequestResult(
                    role="cold" if i == 0 else "reuse",
                    cached_tokens=0 if i == 0 else BLOCKS * 16,
                    token_ids=(1, 2, 3),
                    logprobs=(),
                    finish_reason="length",
                    kv_transfer_params=params,
                    text=None,
                    kv_audit_record=_record(seq, i == 0),
                )
            )
            seq += 1
        out.append(ProbeResult(name, tuple(range(60)), None, tuple(reqs)))
    return ArmResult(arm=arm, probes=tuple(out), kv_audit={"dir": f"/kv/{arm}", "errors": []}).to_json()


def _figures(kind: str, corrupt: set[tuple[int, int]] = frozenset()) -> dict:
    """repro.engine.kvcompare's figures for one request: (block, layer) in `corrupt` differs by 100%, the rest is
    bit-identical."""
    plane = {
        "identical": [[(b, li) not in corrupt for b in range(BLOCKS)] for li in range(LAYERS)],
        "max_abs": [[1.0 if (b, li) in corrupt else 0.0 for b in range(BLOCKS)] for li in range(LAYERS)],
        "rel": [[1.0 if (b, li) in corrupt else 0.0 for b in range(BLOCKS)] for li in range(LAYERS)],
    }
    return {
        "kind": kind,
        "num_blocks": BLOCKS,
        "layers": LAYERS,
        "planes": {"K": plane, "V": plane},
        "matches": [],
        "error": None,
    }


def _raw(arm: str, per_probe: dict[str, list[set]]) -> dict:
    """The comparison's output: per probe, the corrupt (block, layer) cells of each reuse (the cold one is exact)."""
    return {
        "arms": {
            arm: {
                p: {"0": _figures("computed"), **{str(i): _figures("reused", c) for i, c in enumerate(reuses, 1)}}
                for p, reuses in per_probe.items()
            }
        }
    }


def _fault_entry(verdicts: dict[str, str]) -> dict:
    """A fault entry as repro.detection.matrix.fault_entry makes it (only what the audit column reads)."""
    return {
        "fault": "zero_blocks",
        "position": "head",
        "error": None,
        "probes": [{"name": n, "verdicts": {w: v for w in WINDOWS}} for n, v in verdicts.items()],
    }


def _audit_fault(corrupt: dict[str, set], verdicts: dict[str, str] | None = None, planted=(0,)) -> dict:
    names = list(corrupt)
    entry = _fault_entry(verdicts or {n: FAIL for n in names})
    result = _result("zero_blocks-head", ["decoy", *names], faulted=list(planted))
    fault_blame(
        entry, result, "zero_blocks-head", _raw("zero_blocks-head", {n: [c] for n, c in corrupt.items()}), None, 16
    )
    return entry


def test_blame_outcome():
    assert blame_outcome({0}, {0}) == "exact"
    assert blame_outcome({0, 1}, {0}) == "over"
    assert blame_outcome(set(), {0}) == "under"
    assert blame_outcome({1}, {0}) == "other"
    assert blame_outcome({1, 2}, {0, 1}) == "other"


def test_the_audit_blames_exactly_the_planted_block():
    entry = _audit_fault({"alpha": {(0, 0), (0, 1)}})
    kv = entry["probes"][0]["kv"]
    assert kv["verdict"] == CORRUPT and kv["outcome"] == "exact"
    assert kv["blamed_blocks"] == [[0]] and kv["planted_blocks"] == [[0]]
    assert kv["blame"]["blocks"] == [0] and kv["blame"]["planes"] == ["K", "V"]
    cell = entry["kv_blame"]
    assert cell["cell"] == "detected" and (cell["blamed_exactly"], cell["probes"]) == (1, 1)
    assert cell["status"] == "ok" and cell["floor"]["rel"] == 0.0  # the cold prefill was bit-identical
    assert cell["over"] == cell["under"] == cell["other"] == cell["unavailable"] == []


def test_over_blame_missing_blame_and_other_blocks_are_not_exact():
    entry = _audit_fault({"alpha": {(0, 0), (1, 1)}, "bravo": set(), "charlie": {(2, 0)}, "delta": {(0, 1)}})
    outcomes = {p["name"]: p["kv"]["outcome"] for p in entry["probes"]}
    assert outcomes == {"alpha": "over", "bravo": "under", "charlie": "other", "delta": "exact"}
    assert entry["probes"][1]["kv"]["verdict"] == EXACT  # nothing blamed: the corruption went unseen
    cell = entry["kv_blame"]
    assert cell["cell"] == "partial" and cell["blamed_exactly"] == 1 and cell["probes"] == 4
    assert (cell["over"], cell["under"], cell["other"]) == (["alpha"], ["bravo"], ["charlie"])
    s = summarize_blame([entry], [])
    assert s["mismatches"] == [
        "zero_blocks/head:alpha:over",
        "zero_blocks/head:bravo:under",
        "zero_blocks/head:charlie:other",
    ]
    assert not s["ok"] and s["by_fault"] == {"zero_blocks/head": [1, 4]}


def test_a_faulted_block_its_connector_measured_unchanged_is_not_owed_a_blame():
    """A dropped load on the blocks its own cold request freed (vLLM's last-freed-first reuse): the middle block of
    the mirror already held the right KV, the connector's load audit says so (unchanged_blocks), and the audit's
    not blaming it is exact. Without that measurement the same audit is `under`."""
    corrupt = {(0, 0), (0, 1), (2, 0), (2, 1)}

    def run(line):
        entry = _fault_entry({"alpha": FAIL})
        entry["probes"][0]["kv_audit"] = line
        result = _result("dropped_load-fresh", ["alpha"], faulted=[0, 1, 2])
        result["probes"][0]["requests"][1]["kv_transfer_params"]["planted_fault"]["loaded_tokens"] = BLOCKS * 16
        fault_blame(entry, result, "dropped_load-fresh", _raw("dropped_load-fresh", {"alpha": [corrupt]}), None, 16)
        return entry["probes"][0]["kv"]

    kv = run({"faulted_blocks": [0, 1, 2], "unchanged_blocks": [1]})
    assert kv["outcome"] == "exact" and kv["planted_blocks"] == [[0, 2]] and kv["unchanged_blocks"] == [[1]]
    kv = run({"faulted_blocks": [0, 1, 2], "unchanged_blocks": []})
    assert kv["outcome"] == "under" and kv["planted_blocks"] == [[0, 1, 2]] and "unchanged_blocks" not in kv
    assert run(None)["outcome"] == "under"  # no load line: every faulted block is owed a blame


def test_probes_whose_tokens_never_changed_but_whose_audit_blamed_the_planted_blocks():
    entry = _audit_fault(
        {"alpha": {(0, 0)}, "bravo": {(0, 0)}, "charlie": set()}, {"alpha": FAIL, "bravo": PASS, "charlie": PASS}
    )
    cell = entry["kv_blame"]
    assert cell["tokens_unchanged"] == ["bravo", "charlie"]
    assert cell["tokens_unchanged_blamed_exactly"] == ["bravo"]
    s = summarize_blame([entry], [])
    assert (s["tokens_unchanged"], s["tokens_unchanged_blamed_exactly"]) == (2, 1)


def test_a_comparison_that_failed_makes_every_probe_unavailable_never_exact():
    entry = _fault_entry({"alpha": FAIL})
    result = _result("zero_blocks-head", ["alpha"], faulted=[0])
    fault_blame(entry, result, "zero_blocks-head", None, "the KV comparison timed out after 600 s", 16)
    assert entry["probes"][0]["kv"]["outcome"] == "unavailable"
    cell = entry["kv_blame"]
    assert cell["status"] == "unavailable" and cell["reason"] == "the KV comparison timed out after 600 s"
    assert cell["cell"] == "missed" and cell["unavailable"][0]["probe"] == "alpha"
    assert "timed out" in cell["unavailable"][0]["reason"]


def test_a_failed_fault_arm_has_no_audit_column_to_fill():
    entry = dict(_fault_entry({}), error={"kind": "timeout", "detail": "x", "log_tail": ""})
    fault_blame(entry, None, "zero_blocks-head", None, None, 16)
    assert entry["kv_blame"]["status"] == "error" and entry["kv_blame"]["probes"] == 0


def _control(corrupt: dict[str, list[set]], problem: str | None = None) -> dict:
    entry = {"arm": "native", "model_seed": 1, "error": None, "probes": [{"name": n} for n in corrupt]}
    result = _result("native-seed1", list(corrupt), reuses=2)
    raw = None if problem else _raw("native-seed1", corrupt)
    control_blame(entry, result, "native-seed1", "native", raw, problem, 16)
    return entry


def test_a_control_with_a_corrupt_cell_is_a_false_blame_and_fails_the_study():
    entry = _control({"alpha": [set(), set()], "bravo": [set(), {(1, 0)}]})
    kv = entry["kv_blame"]
    assert kv["verdicts"] == {v: 0 for v in KV_VERDICTS} | {EXACT: 1, CORRUPT: 1}
    assert kv["false_blames"] == [
        {"probe": "bravo", "verdict": CORRUPT, "blame": entry["probes"][1]["kv"]["blame"]["text"]}
    ]
    assert entry["probes"][1]["kv"]["blamed_blocks"] == [[], [1]]
    s = summarize_blame([], [entry])
    assert s["present"] and s["false_blames"] == 1 and not s["ok"]
    control = dict(entry, reuses_exercised=4, false_positives={w: 0 for w in WINDOWS})
    fault = dict(_audit_fault({"alpha": {(0, 0)}}), windows={w: {"status": "detected", "detected": 1} for w in WINDOWS})
    assert not summarize([fault], [control], True)["ok"]
    clean = dict(control, kv_blame=_control({"alpha": [set(), set()]})["kv_blame"])
    assert summarize([fault], [clean], True)["ok"]


def _with_sources(raw: dict, arm: str, probe: str, reuse: int, source: str) -> dict:
    """The comparison found every differing cell of that reuse equal to `source` ('block 2': this prompt's own
    block 2, misplaced; 'probe bravo block 0': another prompt's, foreign)."""
    figures = raw["arms"][arm][probe][str(reuse)]
    figures["matches"] = [
        {"layer": li, "plane": plane, "block": b, "source": source}
        for plane in ("K", "V")
        for li, row in enumerate(figures["planes"][plane]["identical"])
        for b, same in enumerate(row)
        if not same
    ]
    return raw


def test_misplaced_cells_are_blamed_like_corrupt_ones_and_named():
    """A planted fault that serves the prompt's own KV from another block: its blocks are blamed (MISPLACED is a
    finding as CORRUPT is), blamed exactly, and the probe's verdict names the class."""
    entry = _fault_entry({"alpha": FAIL})
    result = _result("swap-head", ["decoy", "alpha"], faulted=[0])
    raw = _with_sources(_raw("swap-head", {"alpha": [{(0, 0), (0, 1)}]}), "swap-head", "alpha", 1, "block 2")
    fault_blame(entry, result, "swap-head", raw, None, 16)
    kv = entry["probes"][0]["kv"]
    assert (kv["verdict"], kv["outcome"], kv["blamed_blocks"], kv["blamed_classes"]) == (
        MISPLACED, "exact", [[0]], [["m"]]
    )  # fmt: skip
    assert entry["kv_blame"]["cell"] == "detected"


def test_a_control_with_a_foreign_cell_is_a_false_blame_that_names_its_class():
    entry = {"arm": "native", "model_seed": 1, "error": None, "probes": [{"name": "alpha"}]}
    corrupt = {"alpha": [set(), {(1, 0)}]}
    raw = _with_sources(_raw("native-seed1", corrupt), "native-seed1", "alpha", 2, "probe bravo block 0")
    control_blame(entry, _result("native-seed1", ["alpha"], reuses=2), "native-seed1", "native", raw, None, 16)
    kv = entry["kv_blame"]
    assert kv["verdicts"][FOREIGN] == 1 and [b["verdict"] for b in kv["false_blames"]] == [FOREIGN]
    assert not summarize_blame([], [entry])["ok"]
    control = dict(V1["controls"][0], **entry)
    report = dict(V1, schema_version=plan.SCHEMA_VERSION, faults=[], controls=[control])
    m = page_model(report)
    assert m.kv_finer and f"alpha: FOREIGN: {kv['false_blames'][0]['blame']}" in m.controls[0].false_blames.text
    html = render_page(report)
    assert "any finding (CORRUPT, FOREIGN or MISPLACED) cell" in html and "FOREIGN when\nthey are" in html


def test_an_unaudited_control_probe_is_listed_with_its_reason():
    entry = _control({"alpha": [set(), set()]}, problem="the baseline recorded no reference KV")
    kv = entry["kv_blame"]
    assert kv["false_blames"] == [] and kv["verdicts"][UNAVAILABLE] == 1
    assert kv["unavailable"] == [{"probe": "alpha", "reason": "the baseline recorded no reference KV"}]
    assert summarize_blame([], [entry])["control_unavailable"] == 1 and not summarize_blame([], [entry])["ok"]


def test_the_decoy_is_not_sent_to_the_comparison():
    job = {
        "reference": {"dir": "/kv/b", "probes": {"alpha": 0}},
        "arms": [{"name": "a", "dir": "/kv/a", "requests": [{"probe": "decoy"}, {"probe": "alpha"}]}],
    }
    assert drop_unreferenced(job, {"alpha"})["arms"][0]["requests"] == [{"probe": "alpha"}]


# ---- a version 1 matrix (made before the audit) ----------------------------------------------------------------

V1 = {
    "kind": plan.KIND,
    "schema_version": 1,
    "tool_version": "0.1.0",
    "method": "m",
    "config": {"windows": list(plan.WINDOWS)},
    "faults": [
        {
            "fault": "zero_blocks",
            "position": "head",
            "params": {"num_blocks": 1},
            "error": None,
            "windows": {w: {"status": "detected", "detected": 1, "probes": 1, "first_diffs": [3]} for w in WINDOWS},
            "probes": [{"kv_audit": {"faulted_max_abs_diff": [[0, 3.5]]}, "margin": None}],
        }
    ],
    "controls": [
        {
            "arm": "native",
            "model_seed": 1,
            "error": None,
            "reuses_compared": 4,
            "reuses_exercised": 4,
            "false_positives": {w: 0 for w in WINDOWS},
            "inconclusive": {w: 0 for w in WINDOWS},
        }
    ],
    "prefix_check": {"window": 8, "ok": True, "requests_compared": 3},
    "summary": {"ok": True},
    "provenance": {"started_utc": "2026-11-29T00:00:00Z", "kit": {"commit": "abcdef0123456789"}},
}


def test_a_version_1_matrix_still_loads_and_renders_with_the_audit_absent(tmp_path):
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(V1), encoding="utf-8")
    report = load_matrix(path)
    s = summarize(report["faults"], report["controls"], True)
    assert s["kv_audit"] == {"present": False, "ok": True} and s["ok"]  # no audit: judged as before
    m = page_model(report)
    assert not m.kv_present and m.rows[0].kv.status == "absent" and m.controls[0].false_blames.status == "absent"
    html = render_page(report)
    assert "KV audit: absent (schema version 1" in html
    assert html.count('<td class="absent">') == 3  # the fault's KV column, the control's, the fault's replays
    assert m.rows[0].replays.status == "absent" and not m.replays_present
    assert "replays: not counted (this matrix was made before replays were counted)" in html


@pytest.mark.parametrize("version", [0, plan.SCHEMA_VERSION + 1, True])
def test_versions_it_cannot_read_are_refused(tmp_path, version):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(dict(V1, schema_version=version)), encoding="utf-8")
    with pytest.raises(Exception, match="this kit reads 1, 2"):
        load_matrix(path)


def test_the_page_shows_the_audit_column_and_the_false_blames():
    fault = dict(
        V1["faults"][0],
        **_audit_fault({"alpha": {(0, 0)}, "bravo": {(0, 0), (1, 0)}}, {"alpha": PASS, "bravo": FAIL}),
    )
    control = dict(V1["controls"][0], **_control({"alpha": [set(), {(2, 1)}]}))
    report = dict(V1, schema_version=plan.SCHEMA_VERSION, faults=[fault], controls=[control])
    html = render_page(report)
    assert '<td class="partial"><span class="mono">1/2 blamed exactly</span>' in html
    assert "bravo: over (blamed 0,1, planted 0)" in html
    assert "tokens never changed, blamed exactly: alpha" in html
    blame = control["kv_blame"]["false_blames"][0]["blame"]  # repro.judge.kvaudit.blame's wording
    assert blame and f'<td class="missed"><span class="mono">1/1; alpha: {blame}</span>' in html
    assert 'KV audit: <span class="bad">1 of 2</span> fault probes blamed exactly' in html
    assert (
        "(1 of the 1 whose tokens never changed)" in html
        and 'false blames in the controls:\n<span class="bad">1</span>' in html
    )
    assert "the largest relative error of the\narm's own cold prefills' KV against the baseline's" in html
    assert "The floors measured in this run: largest relative error 0 over 2 arms; 2 of them computed" in html
    # no foreign or misplaced cell: the page reads as it did before those classes
    assert not page_model(report).kv_finer and "with any CORRUPT cell equals the blocks" in html
