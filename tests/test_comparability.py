"""The kit refuses to compare arms that differ in what must match, and names the key."""

from __future__ import annotations

import copy

import pytest

from repro.contract.result import ARM_RESULT_KIND, ARM_RESULT_SCHEMA_VERSION, ArmResult
from repro.judge.evaluate import comparability_problems, shared_first_blocks
from repro.judge.evaluate import judge_arm as _judge_arm

BASE = {
    "arm": "baseline",
    "fixture_sha256": "a" * 64,
    "effective_config": {
        "model": "/m",
        "revision": "r1",
        "dtype": "float32",
        "block_size": 16,
        "max_model_len": 256,
        "seed": 0,
        "enforce_eager": True,
    },
    "versions": {"vllm": "0.28.0", "torch": "2.13.0+cpu", "lmcache": "unavailable: not installed"},
    "probes": [{"name": "p", "prompt_token_ids": [1, 2, 3], "requests": [{"token_ids": [5, 6], "cached_tokens": 0}]}],
}


def typed(data: dict) -> ArmResult:
    """A result as the child's file would hold it, read through the contract."""
    data = copy.deepcopy(data)
    for p in data["probes"]:
        for i, r in enumerate(p["requests"]):
            r.setdefault("role", "cold" if i == 0 else "reuse")
    return ArmResult.from_json({"kind": ARM_RESULT_KIND, "schema_version": ARM_RESULT_SCHEMA_VERSION, **data})


def comparability(base: dict, other: dict) -> list[str]:
    return comparability_problems(typed(base), typed(other))


def judge_arm(other: dict, base: dict, mode: str, block_size: int):
    probes, verdict = _judge_arm(typed(other), typed(base), mode, block_size)
    return probes, verdict.verdict, list(verdict.reasons)


def _other(**changes) -> dict:
    other = copy.deepcopy(BASE)
    other["arm"] = "conn"
    other["probes"][0]["requests"].append({"token_ids": [5, 6], "cached_tokens": 2})
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        target = other
        for p in parents:
            target = target[p]
        target[leaf] = value
    return other


def test_identical_setups_compare():
    assert comparability(BASE, _other()) == []
    _, verdict, _ = judge_arm(_other(), BASE, "connector", 16)
    assert verdict == "PASS"


@pytest.mark.parametrize(
    "change, named",
    [
        ({"effective_config__model": "/other"}, "model differs"),
        ({"effective_config__revision": "r2"}, "revision differs"),
        ({"effective_config__dtype": "float16"}, "dtype differs"),
        ({"effective_config__block_size": 32}, "block_size differs"),
        ({"fixture_sha256": "b" * 64}, "fixture hash differs"),
        ({"versions__vllm": "0.27.0"}, "vllm version differs"),
        ({"versions__torch": "2.12.0"}, "torch version differs"),
        ({"versions__lmcache": "0.5.4"}, "lmcache version differs"),
    ],
)
def test_each_key_that_differs_is_named_and_the_arm_is_not_compared(change, named):
    other = _other(**change)
    problems = comparability(BASE, other)
    assert len(problems) == 1 and problems[0].startswith(named), problems
    probes, verdict, reasons = judge_arm(other, BASE, "connector", 16)
    assert probes == [] and verdict == "ERROR"
    assert reasons == ["refusing to compare: " + problems[0]]


def _on_gpu(result: dict, name: str, capability: str, *others: str) -> dict:
    """A result whose child saw this GPU first (the one it ran on), as repro.engine.child records it."""
    result = copy.deepcopy(result)
    result["versions"].update(gpus=[name, *others], gpu_capabilities=[capability] * (1 + len(others)))
    return result


@pytest.mark.parametrize(
    "gpu, named",
    [
        (("NVIDIA L4", "8.9"), ["GPU differs: baseline 'NVIDIA H200' vs conn 'NVIDIA L4'",
                                "GPU compute capability differs: baseline '9.0' vs conn '8.9'"]),
        (("NVIDIA H100 80GB HBM3", "9.0"), ["GPU differs: baseline 'NVIDIA H200' vs conn 'NVIDIA H100 80GB HBM3'"]),
    ],
)  # fmt: skip
def test_arms_on_different_gpu_models_are_not_compared(gpu, named):
    """Issue 21 (5): the check covered engine settings and package versions, not the GPU: arms spread
    over a box's GPUs (or a trial on another) were compared without a word across GPU models."""
    base = _on_gpu(BASE, "NVIDIA H200", "9.0")
    other = _on_gpu(_other(), *gpu)
    assert comparability(base, other) == named
    probes, verdict, reasons = judge_arm(other, base, "connector", 16)
    assert probes == [] and verdict == "ERROR" and reasons == ["refusing to compare: " + n for n in named]
    # the same model on another GPU of the box compares; so do two CPU arms (no GPU recorded)
    assert comparability(base, _on_gpu(_other(), "NVIDIA H200", "9.0", "NVIDIA L4")) == []
    assert comparability(BASE, _other()) == []


def test_a_missing_fixture_hash_on_one_side_is_a_difference():
    other = _other()
    del other["fixture_sha256"]
    assert comparability(BASE, other)[0].startswith("fixture hash differs")


def test_a_baseline_probe_that_is_not_pass_makes_the_reuse_probe_inconclusive():
    """Bug a: the baseline reported cached tokens with caching off; the matching reuse arm used to PASS."""
    bad_base = copy.deepcopy(BASE)
    bad_base["probes"][0]["requests"][0]["cached_tokens"] = 16
    base_probes, base_verdict = _judge_arm(typed(bad_base), None, "baseline", 16)
    assert base_probes[0]["verdict"] == base_verdict.verdict == "INCONCLUSIVE"
    probes, verdict, reasons = judge_arm(_other(), bad_base, "connector", 16)
    assert verdict == "INCONCLUSIVE" and probes[0]["verdict"] == "INCONCLUSIVE"
    assert reasons == ["p: the baseline's own probe is INCONCLUSIVE: it is not a reference"]


def test_probes_sharing_a_first_block_are_found_and_the_later_one_is_not_trusted():
    assert shared_first_blocks({"a": [1] * 16 + [2], "b": [1] * 16 + [3], "c": [1] * 15 + [4, 5]}, 16) == [("a", "b")]
    assert shared_first_blocks({"a": [1] * 16, "b": [1] * 16}, 32) == [("a", "b")]  # a short prompt is its own block
    base, other = copy.deepcopy(BASE), _other()
    second = {"name": "q", "prompt_token_ids": [1, 2, 3], "requests": []}
    base["probes"].append(dict(second, requests=copy.deepcopy(base["probes"][0]["requests"])))
    other["probes"].append(dict(second, requests=copy.deepcopy(other["probes"][0]["requests"])))
    probes, verdict, reasons = judge_arm(other, base, "connector", 16)
    assert [(p["name"], p["verdict"]) for p in probes] == [("p", "PASS"), ("q", "INCONCLUSIVE")]
    assert verdict == "INCONCLUSIVE"
    assert reasons == ["q: shares its first block with probe p: probes are not isolated"]
