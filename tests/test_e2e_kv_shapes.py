"""The four KV shapes a reuse can read, planted on the real vLLM CPU engine and classed from the bytes (issue 35
item 1): a complete permutation of the reused prefix (MISPLACED), a shift that reads blocks from beyond the reused
prefix (MISPLACED), another prompt's KV (FOREIGN), and garbage (CORRUPT); the faithful control stays EXACT.

The planted faults (repro.engine.connectors.planted_fault), each one arm, on the self-test's probes, one reuse each:
- reverse_blocks with num_blocks 1000: every loaded block gets the loaded block at the mirror position;
- shift_beyond with num_blocks 16: a hit on the first 16 stored blocks only, slot j holding block j + 16;
- other_prompt: every loaded block from the most recently stored other prompt (the first probe has none: nothing
  faulted, EXACT);
- overwrite_tail with num_blocks 16: the last 16 loaded blocks are Gaussian noise;
- none: the control.
What is asserted follows from the bytes each fault writes, whatever the tokens do: the class of every probe and the
shape the report says. What the tokens did (PASS or FAIL, and where) is recorded, not asserted: it depends on the
model's numbers (docs/kv-audit.md has the run this was committed with), and is left in tests/artifacts/.
"""

from __future__ import annotations

import json

import pytest
from conftest import ARTIFACTS, have_vllm, run_cli
from kvkit_testutil import engine_block_size
from planted_fixtures import _fixture, _planted_arm

from repro.judge.verdict import CORRUPT, EXACT, FOREIGN, MISPLACED
from repro.plan.options import CPU_ENGINE_FLAGS

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

ARMS = {
    "reverse": {"fault": "reverse_blocks", "num_blocks": 1000},
    "shift-beyond": {"fault": "shift_beyond", "num_blocks": 16},
    "foreign": {"fault": "other_prompt"},
    "garbage": {"fault": "overwrite_tail", "num_blocks": 16},
    "control": {"fault": "none"},
}


def shapes_fixture(path) -> None:
    """The self-test fixture's probes with the five planted arms and no expectations."""
    arms = [_planted_arm(name, **config) for name, config in ARMS.items()]
    fixture = _fixture("kv-shapes", "four planted KV shapes and a faithful control", arms)
    path.write_text(json.dumps(fixture, indent=2), encoding="utf-8")


@pytest.fixture(scope="module")
def shapes(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kv-shapes")
    shapes_fixture(tmp / "fixture.json")
    report = tmp / "shapes.json"
    flags = ["--suite", "acceptance", "--reuses", "1", "--no-confirm", "--jobs", "2", "--quiet"]
    proc = run_cli(["--model", tiny_model, *CPU_ENGINE_FLAGS, *flags, "--fixture", str(tmp / "fixture.json"),
                    "--report", str(report)])  # fmt: skip
    assert report.is_file(), proc.stderr[-3000:]
    data = json.loads(report.read_text(encoding="utf-8"))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "kv-shapes.txt").write_text(proc.stdout, encoding="utf-8")
    (ARTIFACTS / "kv-shapes.json").write_bytes(report.read_bytes())
    return proc, {a["name"]: a for a in data["arms"]}


def _kv(arm: dict) -> dict[str, tuple[str, str]]:
    """probe -> (KV verdict, the reuse's shape sentence or '')."""
    return {
        p["name"]: (p["kv"]["verdict"], (p["requests"][1].get("kv_audit") or {}).get("shape") or "")
        for p in arm["probes"]
    }


def test_a_permutation_of_the_reused_prefix_is_misplaced(shapes):
    _, arms = shapes
    for probe, (verdict, shape) in _kv(arms["reverse"]).items():
        assert verdict == MISPLACED, (probe, arms["reverse"]["probes"])
        assert " in reverse" in shape and "a permutation of its own blocks" in shape, (probe, shape)


def test_a_shift_from_beyond_the_reused_prefix_is_misplaced(shapes):
    _, arms = shapes
    for probe, (verdict, shape) in _kv(arms["shift-beyond"]).items():
        assert verdict == MISPLACED, probe
        assert shape.startswith("slots 0–") and "(shifted by +16)" in shape, (probe, shape)
        assert "from beyond the reused prefix" in shape and "block(s) 0–" in shape, (probe, shape)
        reuse = next(p for p in arms["shift-beyond"]["probes"] if p["name"] == probe)["requests"][1]
        assert reuse["cached_tokens"] == 16 * engine_block_size()  # the hit the connector reported: 16 blocks


def test_another_prompts_kv_is_foreign_and_named(shapes):
    _, arms = shapes
    kv = _kv(arms["foreign"])
    first, *later = [p["name"] for p in arms["foreign"]["probes"]]
    assert kv[first][0] == EXACT  # no other prompt was stored before the first: nothing faulted
    for probe in later:
        verdict, shape = kv[probe]
        assert verdict == FOREIGN, probe
        others = [p for p in (first, *later) if p != probe]
        assert any(f"{o}'s blocks" in shape or f"{o}'s block" in shape for o in others), (probe, shape)


def test_garbage_is_corrupt_and_the_control_exact(shapes):
    proc, arms = shapes
    assert {v for v, _ in _kv(arms["garbage"]).values()} == {CORRUPT}
    assert {v for v, _ in _kv(arms["control"]).values()} == {EXACT}
    assert arms["control"]["verdict"] == "PASS"
    # findings no fixture states: exit 1, and the summary names each class
    assert proc.returncode == 1, proc.stderr[-3000:]
    for word in (MISPLACED, FOREIGN, CORRUPT):
        assert word in proc.stdout


def test_what_the_tokens_did_is_recorded(shapes):
    """Recorded, not asserted (the model's numbers decide it): each planted arm's token verdict per probe and its
    first divergence, beside the KV class, in tests/artifacts/kv-shapes-tokens.json."""
    _, arms = shapes
    table = {
        name: {
            p["name"]: {
                "kv": p["kv"]["verdict"],
                "tokens": p["verdict"],
                "first_diff": p["requests"][1]["first_diff"],
                "cached_tokens": p["requests"][1]["cached_tokens"],
            }
            for p in arm["probes"]
        }
        for name, arm in arms.items()
        if name != "baseline"
    }
    (ARTIFACTS / "kv-shapes-tokens.json").write_text(json.dumps(table, indent=1), encoding="utf-8")
    assert set(table) == set(ARMS)
    assert all(row["tokens"] in ("PASS", "FAIL") for arm in table.values() for row in arm.values())
