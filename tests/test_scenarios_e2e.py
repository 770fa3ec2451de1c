"""Scenarios end to end on the real vLLM CPU engine (the tiny model): fixtures/scenarios-cpu.json's four
scenarios under native prefix caching and ExampleConnector, and a planted fault that a scenario catches
(exit 1). Run under `flock /tmp/kvkit-e2e.lock`: they start many engines."""

from __future__ import annotations

import json

import pytest
from conftest import have_vllm, run_cli

from repro.plan.options import CPU_ENGINE_FLAGS
from repro.record.exit_rule import scenario_exit
from repro.record.report import validate_report

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

FIXTURE = "fixtures/scenarios-cpu.json"
SCENARIOS = ["a-b-a", "eviction", "preemption", "in-flight"]


@pytest.fixture(scope="module")
def scenarios_run(tiny_model, tmp_path_factory):
    report = tmp_path_factory.mktemp("scenarios") / "scenarios.json"
    argv = ["--model", tiny_model, *CPU_ENGINE_FLAGS, "--suite", "acceptance", "--compare-native", "--fixture",
            FIXTURE, "--scenarios", "all", "--jobs", "2", "--quiet", "--report", str(report)]  # fmt: skip
    proc = run_cli(argv, timeout=3000)
    return proc, report


def _arms(report: dict) -> dict[tuple[str, str], dict]:
    return {(sc["name"], arm["arm"]): arm for sc in report["scenarios"] for arm in sc["arms"]}


def test_native_and_example_connector_under_every_scenario(scenarios_run):
    proc, path = scenarios_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(path.read_text())
    validate_report(report)
    assert report["config"]["scenarios"] == SCENARIOS
    assert [sc["name"] for sc in report["scenarios"]] == SCENARIOS
    arms = _arms(report)
    for name in SCENARIOS:
        # bit-exact where each prompt is prefilled alone, as the baseline's; where prompts are prefilled beside
        # one another, EXACT or NUMERIC, whichever this CPU's kernels give (the fixture says why)
        kv_ok = ("EXACT",) if name in ("a-b-a", "eviction") else ("EXACT", "NUMERIC")
        assert arms[(name, "native")]["verdict"] == "PASS", arms[(name, "native")]["reasons"]
        assert arms[(name, "native")]["kv"]["verdict"] in kv_ok, (name, arms[(name, "native")]["kv"])
        example = arms[(name, "ExampleConnector")]
        if name == "preemption":  # the fixture's skip_scenarios: it crashes the engine there, and says why
            assert example["verdict"] == "SKIPPED" and "FileNotFoundError" in example["reasons"][0]
        else:
            assert example["verdict"] == "PASS" and example["kv"]["verdict"] in kv_ok, (name, example["reasons"])
        assert arms[(name, "native-matched")]["verdict"] == "SKIPPED"
    acc = report["acceptance"]["scenarios"]
    assert acc["matched"] is True and acc["unchecked"] == []
    assert "Scenarios" in proc.stdout and "a-b-a · native: PASS" in proc.stdout


def test_every_request_matches_its_control_and_the_control_the_plain_baseline(scenarios_run):
    _, path = scenarios_run
    report = json.loads(path.read_text())
    for sc in report["scenarios"]:
        assert sc["control"]["status"] == "ok"
        assert all(r["matches_plain"] and r["cached_tokens"] == 0 for r in sc["control"]["requests"])
        for arm in sc["arms"]:
            for r in arm["requests"]:
                assert r["first_diff"] is None and r["control_matches"] is True, (sc["name"], arm["arm"], r)


def test_the_scenarios_do_what_they_say(scenarios_run):
    """a-b-a: A's second request reuses part of it (native) or all of it (ExampleConnector); eviction: chat-511
    lost from native's cache; preemption: vLLM preempted (its counter, in every run, the control included);
    in-flight: the reused step hits on all four probes in native."""
    _, path = scenarios_run
    report = json.loads(path.read_text())
    arms = _arms(report)
    aba = arms[("a-b-a", "native")]["requests"]
    assert 0 < aba[3]["cached_tokens"] < 1488 and aba[3]["role"] == "reuse"  # a partial hit: A's tail evicted
    assert arms[("a-b-a", "ExampleConnector")]["requests"][3]["cached_tokens"] == 1488
    evicted = arms[("eviction", "native")]["requests"][3]
    assert (evicted["probe"], evicted["cached_tokens"]) == ("chat-511", 0)
    pre = next(sc for sc in report["scenarios"] if sc["name"] == "preemption")
    assert pre["control"]["preemptions"] > 0
    for arm in pre["arms"]:
        if arm["verdict"] != "SKIPPED":
            assert arm["preemptions"] > 0 and arm["preemptions_source"].startswith("vllm:num_preemptions")
    flight = arms[("in-flight", "native")]["requests"]
    assert [r["step"] for r in flight] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(r["cached_tokens"] > 0 for r in flight[4:])


@pytest.fixture(scope="module")
def planted_run(tiny_model, tmp_path_factory):
    """The planted connector zeroing 256 tokens of KV on every load, under a-b-a alone."""
    report = tmp_path_factory.mktemp("planted") / "planted.json"
    extra = {"fault": "zero_blocks", "first_block": 0, "num_blocks": 16}
    argv = ["--model", tiny_model, *CPU_ENGINE_FLAGS, "--suite", "acceptance", "--fixture", FIXTURE,
            "--kv-connector", "PlantedFaultConnector", "--kv-connector-module-path",
            "repro.engine.connectors.planted_fault", "--kv-connector-extra-config", json.dumps(extra),
            "--scenarios", "a-b-a", "--jobs", "2", "--quiet", "--report", str(report)]  # fmt: skip
    return run_cli(argv, timeout=3000), report


def test_a_scenario_fail_exits_1(planted_run):
    proc, path = planted_run
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(path.read_text())
    validate_report(report)
    (arm,) = report["scenarios"][0]["arms"]
    assert arm["verdict"] == "FAIL"
    reload = arm["requests"][3]
    assert (reload["probe"], reload["role"], reload["verdict"]) == ("fixture", "reuse", "FAIL")
    assert reload["first_diff"] is not None and reload["kv"]["verdict"] == "CORRUPT"
    assert arm["kv"]["verdict"] == "CORRUPT" and arm["kv"]["blame"]["blocks"] == list(range(16))
    assert scenario_exit(report) == 1  # the scenarios alone exit 1
    assert "a-b-a · PlantedFaultConnector: FAIL" in proc.stdout
