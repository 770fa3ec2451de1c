"""The kit refuses to compare arms that differ in what must match, and names the key."""

from __future__ import annotations

import copy

import pytest

from repro.evaluate import comparability_problems, judge_arm

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
    assert comparability_problems(BASE, _other()) == []
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
    problems = comparability_problems(BASE, other)
    assert len(problems) == 1 and problems[0].startswith(named), problems
    probes, verdict, reasons = judge_arm(other, BASE, "connector", 16)
    assert probes == [] and verdict == "ERROR"
    assert reasons == ["refusing to compare: " + problems[0]]


def test_a_missing_fixture_hash_on_one_side_is_a_difference():
    other = _other()
    del other["fixture_sha256"]
    assert comparability_problems(BASE, other)[0].startswith("fixture hash differs")
