"""A connector beneath the GPU prefix cache, end to end on the real vLLM CPU engine (issue 36, item 1).

vLLM's offloading connectors run with the GPU prefix cache on, and refuse the CPU backend; the kit's handling of
such an arm (the GPU prefix cache on, the connector's own hits counted, the GPU cache reset before each reuse so
the connector serves) is tested here with connectors that run on the CPU, declared beneath the GPU cache by the
fixture: ExampleConnector left alone (the GPU cache serves every reuse: "connector not exercised", never a PASS),
ExampleConnector made to serve (PASS on the connector's own hits), and the planted fault made to serve (FAIL:
a fault beneath the GPU cache is still found)."""

from __future__ import annotations

import json

import pytest
from conftest import have_vllm, run_cli
from e2e_runs import shared_run
from planted_fixtures import PLANTED_MODULE, fixture_argv, write_arms_fixture

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

ALONE, SERVED, PLANTED = "Example-gpu-cache-only", "Example-beneath", "Planted-beneath"


def _fixture(tmp) -> str:
    example = {"connector": "ExampleConnector", "extra_config": {"shared_storage_path": "@tmpdir"},
               "gpu_prefix_cache": True}  # fmt: skip
    arms = [
        {**example, "name": ALONE, "gpu_cache_reset": "never"},
        {**example, "name": SERVED},  # the reset before each reuse is the default beneath the GPU cache
        {"name": PLANTED, "connector": "PlantedFaultConnector", "module_path": PLANTED_MODULE,
         "extra_config": {"store_dir": "@tmpdir", "fault": "zero_blocks", "first_block": 0, "num_blocks": 16},
         "gpu_prefix_cache": True},
    ]  # fmt: skip
    again = {"name": "again", "description": "the fixture probe cold, then again: nothing resets the GPU prefix cache",
             "steps": [{"submit": ["fixture"], "expect": "miss"}, {"submit": ["fixture"], "expect": "reuse"}]}  # fmt: skip
    return write_arms_fixture(tmp / "beneath.json", "beneath-gpu-cache", "connectors beneath the GPU prefix cache", arms,
                              scenarios=[again])  # fmt: skip


def _run(model: str, tmp) -> tuple:
    report = tmp / "beneath-report.json"
    argv = fixture_argv(model, _fixture(tmp), report, "--reuses", "2", "--scenarios", "all", "--quiet")
    return run_cli(argv), report


# one fixture probe, three arms and the baseline, plain and in one scenario; made ahead by the tests' lane
# (tests/e2e_runs.py)
beneath_run = shared_run("beneath_run", _run, lane=True)


def _arm(report: dict, name: str) -> dict:
    return next(a for a in report["arms"] if a["name"] == name)


def test_connectors_beneath_the_gpu_cache_run_with_it_on_and_count_their_own_hits(beneath_run):
    proc, report = beneath_run
    assert proc.returncode == 1, proc.stderr[-3000:]  # the planted fault is a finding
    data = json.loads(report.read_text())
    for name in (ALONE, SERVED, PLANTED):
        arm = _arm(data, name)
        assert arm["connector"]["gpu_prefix_cache"] is True
        assert arm["effective_config"]["enable_prefix_caching"] is True, name
    assert _arm(data, ALONE)["connector"]["gpu_cache_reset"] == "never"
    assert _arm(data, SERVED)["connector"]["gpu_cache_reset"] == "before-reuse"
    # the baseline stays a cache-off run
    assert _arm(data, "baseline")["effective_config"]["enable_prefix_caching"] is False


def test_a_reuse_the_gpu_cache_alone_served_is_connector_not_exercised(beneath_run):
    data = json.loads(beneath_run[1].read_text())
    arm = _arm(data, ALONE)
    (probe,) = [p for p in arm["probes"] if p["name"] == "fixture"]
    cold, *reuses = probe["requests"]
    assert cold["cached_tokens"] == 0 and cold["external_tokens"] == 0
    for r in reuses:  # the GPU cache holds the whole prompt's full blocks; the connector loads nothing
        assert r["cached_tokens"] > 0 and r["external_tokens"] == 0, r
    assert probe["verdict"] == "INCONCLUSIVE" and arm["verdict"] == "INCONCLUSIVE"
    assert all("connector not exercised" in reason for reason in probe["reasons"]), probe["reasons"]


def test_a_connector_made_to_serve_passes_on_its_own_hits(beneath_run):
    data = json.loads(beneath_run[1].read_text())
    arm = _arm(data, SERVED)
    (probe,) = [p for p in arm["probes"] if p["name"] == "fixture"]
    for r in probe["requests"][1:]:  # the GPU cache was reset: every hit is the connector's
        assert r["external_tokens"] > 0 and r["external_tokens"] == r["cached_tokens"], r
    assert probe["verdict"] == "PASS", probe["reasons"]
    assert arm["effective_config"]["gpu_cache_resets"] == [True, True]  # vLLM said each reset happened


def test_a_fault_beneath_the_gpu_cache_is_still_found(beneath_run):
    data = json.loads(beneath_run[1].read_text())
    arm = _arm(data, PLANTED)
    (probe,) = [p for p in arm["probes"] if p["name"] == "fixture"]
    assert probe["verdict"] == "FAIL", probe["reasons"]
    assert all(r["external_tokens"] > 0 for r in probe["requests"][1:])
    assert "from the connector" in " ".join(probe["reasons"])


def test_in_a_scenario_a_reuse_the_gpu_cache_served_is_no_pass_of_the_connector(beneath_run):
    """Scenarios keep the caches as they are (no reset): the second request of the fixture probe is served by the GPU
    prefix cache, which no arm's connector is: each arm says so rather than PASS, the planted fault included."""
    data = json.loads(beneath_run[1].read_text())
    (scenario,) = data["scenarios"]
    for name in (ALONE, SERVED, PLANTED):
        arm = next(a for a in scenario["arms"] if a["arm"] == name)
        cold, again = arm["requests"]
        assert cold["external_tokens"] == 0 and again["cached_tokens"] > 0 and again["external_tokens"] == 0, again
        assert again["verdict"] == "INCONCLUSIVE" and "connector not exercised" in again["reasons"][0]
        assert arm["verdict"] == "INCONCLUSIVE" and "served no request" in " ".join(arm["reasons"]), arm["reasons"]
