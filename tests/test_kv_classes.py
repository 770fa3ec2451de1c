"""KV classes that say what the bytes are (issue 35 item 1), without an engine: a reused cell that is not its own
position's KV is MISPLACED when it is this prompt's KV from another block or plane, FOREIGN when it is another
prompt's, CORRUPT when it is nothing known; equal, or within the arm's floor (the comparison's nearest block);
a probe takes the worst class; and the mapping's shape is said in one sentence (repro.judge.kv_shape)."""

from __future__ import annotations

import json

import pytest
import torch
from test_kvaudit import _entries, _record, _reference, _results, _write

from repro.engine import kvcompare
from repro.judge.kv_shape import describe
from repro.judge.kv_verdict import (
    CELL_CORRUPT,
    CELL_EXACT,
    CELL_FOREIGN,
    CELL_MISPLACED,
    CELL_NUMERIC,
    KVRequestAudit,
    Source,
    classify_kv_cell,
    decide_kv_probe,
    decide_scenario_kv,
)
from repro.judge.kvaudit import annotate, match_source
from repro.judge.verdict import CORRUPT, FOREIGN, KV_FINDINGS, MISPLACED, NUMERIC


@pytest.mark.parametrize(
    "identical, rel, floor, source, want",
    [
        (True, 0.0, None, None, CELL_EXACT),
        (False, 1e-4, 1e-3, Source("p", 4, "K", 0.0), CELL_NUMERIC),  # within the floor at its own position first
        (False, 0.5, 1e-3, Source("p", 4, "K", 0.0), CELL_MISPLACED),  # equal to its own prompt's block 4
        (False, 0.5, 1e-3, Source("p", 4, "K", 5e-4), CELL_MISPLACED),  # within the floor of it
        (False, 0.5, 1e-3, Source("q", 4, "K", 0.0), CELL_FOREIGN),  # another probe's block
        (False, 0.5, 1e-3, Source("q", 4, "K", 2e-3), CELL_CORRUPT),  # nearest, but beyond the floor
        (False, 0.5, None, Source("q", 4, "K", 1e-6), CELL_CORRUPT),  # no floor measured: only equal bytes count
        (False, 0.5, None, Source("q", 4, "K", 0.0), CELL_FOREIGN),
        (False, 1.0, 1e-3, Source(None), CELL_CORRUPT),  # zeros are garbage
        (False, 0.5, 1e-3, None, CELL_CORRUPT),
    ],
)
def test_a_cell_is_classed_by_what_its_bytes_equal(identical, rel, floor, source, want):
    assert classify_kv_cell(identical, rel, floor, source, "p") == want


def test_the_source_words_every_comparison_wrote_read_back_as_a_source():
    """Reports keep a match's words; they read back as what the comparison found (old reports included)."""
    assert match_source({"block": 3, "plane": "K", "source": "block 92"}, "fixture") == Source("fixture", 92, "K")
    assert match_source({"block": 3, "plane": "V", "source": "probe chat-511 block 30"}, "chat-512") == Source(
        "chat-511", 30, "V"
    )
    assert match_source({"block": 3, "plane": "V", "source": "its K plane"}, "p") == Source("p", 3, "K")
    assert match_source({"block": 3, "plane": "V", "source": "block 5 (K plane)"}, "p") == Source("p", 5, "K")
    assert match_source({"block": 3, "plane": "V", "source": "zeros"}, "p") == Source(None)
    assert match_source({"block": 3, "plane": "V", "source": "block 5", "rel": 0.001}, "p").rel == 0.001
    assert match_source({"block": 3, "plane": "V", "source": "something else"}, "p") is None


def test_the_comparison_names_the_nearest_block_where_the_bytes_equal_none(tmp_path):
    """A block loaded from another position and drifted (as a prefill of another shape drifts): no exact match,
    its nearest block named with the relative error; a block that drifted in place names nothing."""
    ref, other = _reference(1), _reference(2)
    _write(tmp_path / "base", 0, "computed", ref)
    _write(tmp_path / "base", 1, "computed", other)
    loaded = [t.clone() for t in ref]
    g = torch.Generator().manual_seed(7)
    loaded[0][1] = (ref[0][4].float() * (1 + 1e-3 * torch.randn(ref[0][4].shape, generator=g))).half()
    loaded[0][2] = (other[0][0].float() * (1 + 1e-3 * torch.randn(ref[0][4].shape, generator=g))).half()
    loaded[1][0] = (ref[1][0].float() * (1 + 1e-3 * torch.randn(ref[1][0].shape, generator=g))).half()
    _write(tmp_path / "arm", 7, "reused", loaded)
    job = {
        "reference": {"dir": str(tmp_path / "base"), "probes": {"p": 0, "q": 1}},
        "arms": [{"name": "A", "dir": str(tmp_path / "arm"), "requests": [
            {"probe": "p", "index": 1, "seq": 7, "kind": "reused", "layers": 2}]}],
    }  # fmt: skip
    got = kvcompare.run(json.loads(json.dumps(job)))["arms"]["A"]["p"]["1"]
    found = {(m["layer"], m["plane"], m["block"]): m for m in got["matches"]}
    assert set(found) == {(0, "K", 1), (0, "V", 1), (0, "K", 2), (0, "V", 2)}  # layer 1 block 0: its own, nearest
    for plane in ("K", "V"):
        near = found[(0, plane, 1)]
        assert (near["source"], near["probe"], near["src_block"], near["src_plane"]) == ("block 4", "p", 4, plane)
        assert 0 < near["rel"] < 0.01 < got["planes"][plane]["rel"][0][1]
        assert found[(0, plane, 2)]["source"] == "probe q block 0" and 0 < found[(0, plane, 2)]["rel"] < 0.01


def test_the_comparison_names_only_prompts_the_arms_engine_was_sent(tmp_path):
    """A block equal to probe q's and one nearest q's: named after q where the arm ran q, after nothing (or its own
    prompt) where it never did (the job's sources, repro.judge.kvaudit.compare_job): no prompt the engine was never
    sent is a source."""
    ref, other = _reference(1), _reference(2)
    _write(tmp_path / "base", 0, "computed", ref)
    _write(tmp_path / "base", 1, "computed", other)
    loaded = [t.clone() for t in ref]
    g = torch.Generator().manual_seed(7)
    loaded[0][1] = other[0][3].clone()
    loaded[0][2] = (other[0][0].float() * (1 + 1e-3 * torch.randn(ref[0][4].shape, generator=g))).half()
    _write(tmp_path / "arm", 7, "reused", loaded)

    def matches(sources):
        arm = {"name": "A", "dir": str(tmp_path / "arm"), "requests": [
            {"probe": "p", "index": 1, "seq": 7, "kind": "reused", "layers": 2}]}  # fmt: skip
        if sources is not None:
            arm["sources"] = sources
        job = {"reference": {"dir": str(tmp_path / "base"), "probes": {"p": 0, "q": 1}}, "arms": [arm]}
        got = kvcompare.run(json.loads(json.dumps(job)))["arms"]["A"]["p"]["1"]
        return {(m["layer"], m["plane"], m["block"]): m.get("probe") for m in got["matches"]}

    assert matches(None) == matches(["p", "q"]) == {(0, pl, b): "q" for pl in ("K", "V") for b in (1, 2)}
    assert "q" not in set(matches(["p"]).values())


def _raw_reuse(n, classes_for, matches):
    """A reuse's raw comparison: n blocks, one layer; classes_for(plane) -> (identical, rel) per block."""
    planes = {}
    for p in ("K", "V"):
        ident, rel = classes_for(p)
        planes[p] = {"identical": [ident], "rel": [rel], "max_abs": [[0.0 if i else 1.0 for i in ident]]}
    return {"kind": "reused", "num_blocks": n, "layers": 1, "planes": planes, "matches": matches, "error": None}


def test_a_probe_takes_the_worst_class_and_its_reasons_say_the_shape():
    misplaced = KVRequestAudit(
        True, None, (), 0, 2, misplaced=((0, 0, "K"),), shape="slot 0 holds this prompt's block 1"
    )
    foreign = KVRequestAudit(True, None, (), 0, 2, foreign=((1, 0, "V"),))
    corrupt = KVRequestAudit(True, None, ((2, 0, "K"),), 0, 2)
    assert decide_kv_probe([misplaced], 0.0).verdict == MISPLACED
    v = decide_kv_probe([misplaced, foreign], 0.0)
    assert v.verdict == FOREIGN and v.blocks == (0, 1) and v.planes == ("K", "V")
    assert "slot 0 holds this prompt's block 1" in v.reasons[0] and "another prompt's KV" in v.reasons[1]
    assert decide_kv_probe([foreign, corrupt, misplaced], 0.0).verdict == CORRUPT
    assert decide_kv_probe([KVRequestAudit(True, None, (), 3, 1)], 1e-3).verdict == NUMERIC
    assert KV_FINDINGS == (CORRUPT, FOREIGN, MISPLACED)
    by = [("a", decide_kv_probe([misplaced], 0.0)), ("b", decide_kv_probe([foreign], 0.0))]
    assert decide_scenario_kv(by).verdict == FOREIGN and decide_scenario_kv(by[:1]).verdict == MISPLACED


def test_the_audit_classes_a_reversed_prefix_misplaced_and_says_so():
    """Four reused blocks, each holding the block at 3 - i of its own prompt exactly: MISPLACED, a permutation."""
    n = 4
    results = _results(_record(1, reused=n))
    matches = [
        {"layer": 0, "plane": p, "block": b, "source": f"block {n - 1 - b}"} for b in range(n) for p in ("K", "V")
    ]
    raw = {"arms": {"A": {"p": {
        "0": _raw_reuse(n, lambda p: ([True] * n, [0.0] * n), []) | {"kind": "computed"},
        "1": _raw_reuse(n, lambda p: ([False] * n, [0.9] * n), matches),
    }}}}  # fmt: skip
    entries = _entries()
    annotate(entries, results, raw, None, 16)
    probe = entries[1]["probes"][0]
    audit = probe["requests"][1]["kv_audit"]
    assert audit["planes"]["K"]["class"] == ["mmmm"] and audit["counts"]["misplaced"] == 8
    assert audit["shape"] == "slots 0–3 hold this prompt's blocks 3…0 in reverse; the reused prefix then holds a " \
        "permutation of its own blocks"  # fmt: skip
    assert probe["kv"]["verdict"] == MISPLACED and probe["kv"]["blame"]["blocks"] == [0, 1, 2, 3]
    assert probe["verdict"] == "PASS"  # the token verdict is its own


SHAPES = [
    # LMCacheConnectorV1's fixture reuse on the H200 (reports/conditions/h200-conditions-five-compiled.json): slots
    # 2-46 held the prompt's own blocks 92...48, 80 blocks reused
    (
        {(s, 0, p): (CELL_MISPLACED, Source("fixture", 94 - s, p)) for s in range(2, 47) for p in "KV"},
        "fixture",
        80,
        (
            "slots 2–46 hold this prompt's blocks 92…48 in reverse; the reused prefix then holds 13 block(s) from "
            "beyond the reused prefix (80–92), block(s) 48–79 twice, block(s) 2–46 missing"
        ),
    ),
    # chat-512's reuse there: slots 2-15 held chat-511's blocks 30...17
    (
        {(s, 0, p): (CELL_FOREIGN, Source("chat-511", 32 - s, p)) for s in range(2, 16) for p in "KV"},
        "chat-512",
        32,
        "slots 2–15 hold chat-511's blocks 30…17 in reverse",
    ),
    # the planted shift_beyond: the first 16 slots hold blocks 16-31
    (
        {(s, 3, p): (CELL_MISPLACED, Source("p", s + 16, p)) for s in range(16) for p in "KV"},
        "p",
        16,
        (
            "slots 0–15 hold this prompt's blocks 16–31 (shifted by +16); the reused prefix then holds 16 block(s) "
            "from beyond the reused prefix (16–31), block(s) 0–15 missing"
        ),
    ),
    # K and V exchanged in place
    (
        {(3, 0, "K"): (CELL_MISPLACED, Source("p", 3, "V")), (3, 0, "V"): (CELL_MISPLACED, Source("p", 3, "K"))},
        "p",
        8,
        "slot 3 holds its own KV with K and V exchanged",
    ),
    # another prompt at the same positions (the planted other_prompt)
    (
        {(s, 0, p): (CELL_FOREIGN, Source("q", s, p)) for s in range(4) for p in "KV"},
        "p",
        4,
        "slots 0–3 hold q's blocks 0–3 (the same positions)",
    ),
    # a slot whose cells name two sources says nothing; corrupt cells say nothing
    (
        {
            (0, 0, "K"): (CELL_MISPLACED, Source("p", 2, "K")),
            (0, 1, "K"): (CELL_MISPLACED, Source("p", 3, "K")),
            (1, 0, "K"): (CELL_CORRUPT, None),
        },
        "p",
        4,
        None,
    ),
]


def _reversed_with_a_repeat(slots: int, repeat_of: dict[int, int]) -> dict:
    """Slots 0..slots-1 holding blocks slots-1..0 in 4 layers, K and V; layer 0's V of a slot in repeat_of names
    another block (a block of the same tokens elsewhere: V carries no position in layer 0)."""
    cells = {}
    for s in range(slots):
        for layer in range(4):
            for p in "KV":
                block = repeat_of.get(s, slots - 1 - s) if (layer, p) == (0, "V") else slots - 1 - s
                cells[(s, layer, p)] = (CELL_MISPLACED, Source("p", block, p))
    return cells


SHAPES += [
    # one cell of eight naming another block (a repeated block's layer-0 V) does not hide the slot's source
    (
        _reversed_with_a_repeat(4, {1: 0}),
        "p",
        4,
        "slots 0–3 hold this prompt's blocks 3…0 in reverse; the reused prefix then holds a permutation of its own blocks",
    ),
    # a slot whose cells name no block most of the time holds something unknown: no permutation claimed
    (
        {**_reversed_with_a_repeat(4, {}), **{(1, layer, p): (CELL_CORRUPT, None) for layer in range(4) for p in "KV"}},
        "p",
        4,
        "slot 0 holds this prompt's block 3; slots 2–3 hold this prompt's blocks 1…0 in reverse",
    ),
]


@pytest.mark.parametrize("cells, probe, num_blocks, want", SHAPES)
def test_the_shape_of_misplaced_and_foreign_blocks_in_one_sentence(cells, probe, num_blocks, want):
    assert describe(cells, probe, num_blocks) == want


def test_each_cell_is_classed_against_its_own_layers_and_planes_floor():
    """Issue 35 item 2: one layer whose cold prefill drifted no longer raises the bar of the others. Layer 1's K
    drifted to 0.1; a reuse 0.05 off in layer 0 (which did not drift) is beyond its floor, in layer 1 within it."""
    n = 2
    results = _results(_record(1, reused=n))

    def computed(rel_l1_k):
        planes = {}
        for p in ("K", "V"):
            rows = [[0.0] * n, [rel_l1_k if p == "K" else 0.0] * n]
            planes[p] = {"identical": [[r == 0.0 for r in row] for row in rows], "rel": rows,
                         "max_abs": [[r for r in row] for row in rows]}  # fmt: skip
        return {"kind": "computed", "num_blocks": n, "layers": 2, "planes": planes, "matches": [], "error": None}

    reuse = computed(0.0) | {"kind": "reused"}
    reuse["planes"] = {p: {"identical": [[False] * n, [False] * n], "rel": [[0.05] * n, [0.05] * n],
                           "max_abs": [[1.0] * n, [1.0] * n]} for p in ("K", "V")}  # fmt: skip
    entries = _entries()
    annotate(entries, results, {"arms": {"A": {"p": {"0": computed(0.1), "1": reuse}}}}, None, 16)
    audit = entries[1]["probes"][0]["requests"][1]["kv_audit"]
    assert entries[1]["kv_audit"]["floor"]["by_layer"] == {"K": [0.0, 0.1], "V": [0.0, 0.0]}
    assert audit["planes"]["K"]["class"] == ["cc", "nn"] and audit["planes"]["V"]["class"] == ["cc", "cc"]
    assert entries[1]["probes"][0]["kv"]["verdict"] == CORRUPT and entries[1]["kv_audit"]["floor"]["rel"] == 0.1
