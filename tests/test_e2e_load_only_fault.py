"""A planted fault only load shows, and the production-load scenario that catches it, on the real vLLM CPU engine:
fixtures/scenarios-load-cpu-planted.json (its description gives the sizes and why) with --compare-native, one run, several
files' worth of assertions on its report.

PlantedFaultConnector's `land_elsewhere`: every load is faithful, but in a scheduler step that loads for two or more
requests the step's last load also writes its first block into the first loaded block of the step's first load, a
block that request then reads (vLLM #47282's shape). Gated `in_flight` with `in_flight_min` 16: only a step with at
least 16 requests in flight opens it. Plain probes (one request at a time) and four requests in flight keep the gate
shut and PASS; the production-load scenario (64 prompts a round in a pool that holds 21 unshared) opens it and FAILs,
where native PASSes, the same connector without a fault PASSes, and vLLM's ExampleConnector is ERROR naming the
engine's error, the other arms judged all the same."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, have_vllm, run_cli
from e2e_runs import shared_run
from planted_fixtures import fixture_argv

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

FIXTURE = ROOT / "fixtures" / "scenarios-load-cpu-planted.json"
ARM, FAITHFUL, EXAMPLE = "PlantedFault-land-elsewhere", "PlantedFault-none", "ExampleConnector"
PLAIN, LOAD = 4, 64  # plain probes; requests a round of the load scenario


def _run(model: str, tmp) -> tuple:
    report = tmp / "load-report.json"
    argv = fixture_argv(model, str(FIXTURE), report, "--compare-native", "--no-native-matched", "--scenarios", "all")
    return run_cli([*argv, "--quiet"]), report


# one run: the plain probes, in-flight-4 and production-load for every arm; made ahead by the tests' lane
load_only_run = shared_run("load_only_run", _run, lane=True)


def _planted(req: dict) -> dict:
    return (req.get("kv_transfer_params") or {}).get("planted_fault") or {}


def _data(run) -> dict:
    return json.loads(run[1].read_text())


def _scenario(data: dict, name: str) -> dict:
    return next(s for s in data["scenarios"] if s["name"] == name)


def _scenario_arm(data: dict, scenario: str, arm: str) -> dict:
    return next(a for a in _scenario(data, scenario)["arms"] if a["arm"] == arm)


def test_plain_probes_never_open_the_gate_and_pass(load_only_run):
    arm = next(a for a in _data(load_only_run)["arms"] if a["name"] == ARM)
    assert len(arm["probes"]) == PLAIN
    for probe in arm["probes"]:
        reuse = probe["requests"][1]
        assert reuse["cached_tokens"] > 0, probe["name"]
        gate = _planted(reuse)["gate"]["in_flight"]
        assert gate["in_flight"] == 1 and gate["min"] == 16 and gate["open"] is False
        assert probe["verdict"] == "PASS" and "overwritten_by" not in _planted(reuse), probe["name"]


def test_four_requests_in_flight_keep_the_gate_shut(load_only_run):
    arm = _scenario_arm(_data(load_only_run), "in-flight-4", ARM)
    reused = [r for r in arm["requests"] if r["cached_tokens"]]
    assert len(reused) == PLAIN
    for r in reused:
        gate = _planted(r)["gate"]["in_flight"]
        assert gate["in_flight"] <= 4 and gate["open"] is False, gate
        assert "overwritten_by" not in _planted(r)
    assert arm["verdict"] == "PASS", arm.get("reasons")


def test_production_load_opens_it_and_names_each_differing_request(load_only_run):
    arm = _scenario_arm(_data(load_only_run), "production-load", ARM)
    assert arm["verdict"] == "FAIL" and arm["kv"]["verdict"] in ("FOREIGN", "CORRUPT", "MISPLACED"), arm["reasons"]
    assert any(_planted(r).get("gate", {}).get("in_flight", {}).get("open") for r in arm["requests"])
    rounds = arm["load"]["rounds"]
    assert [r["requests"] for r in rounds] == [LOAD] * 3 and arm["load"]["reuse_control"] is True
    assert sum(r["differ"] for r in rounds) >= 1 and all(r["differ"] == r["fail"] for r in rounds)
    differing = [r for r in arm["requests"] if r["verdict"] == "FAIL"]
    assert len(differing) == sum(r["fail"] for r in rounds)
    for r in differing:  # its first diff, its reuse length, the reuse control's, and its KV where it reused
        assert r["first_diff"] is not None and isinstance(r["cached_tokens"], int)
        assert isinstance(r["control_cached_tokens"], int) and "replays" in r
        assert r["kv"] is not None or not r["cached_tokens"]


def test_native_and_the_faithful_connector_pass_production_load(load_only_run):
    data = _data(load_only_run)
    for name in ("native", FAITHFUL):
        arm = _scenario_arm(data, "production-load", name)
        assert arm["verdict"] == "PASS", (name, arm["reasons"])
        assert all(r["differ"] == 0 and r["requests"] == LOAD for r in arm["load"]["rounds"]), name
        assert sum(r["reused"] for r in arm["load"]["rounds"][1:]) > 0, name  # later rounds reuse
    native = _scenario_arm(data, "production-load", "native")
    # the pool (320 blocks) is below a round's 384 shared blocks: native evicts, so some later hits are partial
    later = [r["cached_tokens"] for r in native["requests"] if r["step"] > 0]
    assert min(later) < max(later), later


def test_the_controls_and_the_cancellations(load_only_run):
    data = _data(load_only_run)
    load = _scenario(data, "production-load")["load"]
    assert load["reference"]["status"] == "ok" and load["reuse_control"]["status"] == "ok"
    control = load["reuse_control"]["rounds"]
    assert [r["reused"] for r in control[1:]] == [LOAD, LOAD]  # its pool holds every prompt: every later request hits
    baseline_rounds = _scenario(data, "production-load")["control"]["requests"]
    assert len(baseline_rounds) == 3 * LOAD and all(r["cached_tokens"] == 0 for r in baseline_rounds)
    arm = _scenario_arm(data, "production-load", FAITHFUL)
    cancels = [r["cancel"] for r in arm["requests"] if r["cancel"]]
    assert len(cancels) == 3 * 6  # three in prefill and three at their last step, every round
    landed = [c for c in cancels if not c.get("missed")]
    assert any(
        c["when"] == "prefill" and c["observed"] and 0 < c["computed_tokens"] < c["prompt_tokens"] for c in landed
    )
    assert any(c["when"] == "last-step" and c["generated"] == 15 for c in landed)


def test_example_connector_is_error_naming_the_engines_error_and_the_others_are_judged(load_only_run):
    data = _data(load_only_run)
    arm = _scenario_arm(data, "production-load", EXAMPLE)
    assert arm["verdict"] == "ERROR" and "shape mismatch" in arm["error"]["detail"], arm.get("error")
    verdicts = {a["arm"]: a["verdict"] for a in _scenario(data, "production-load")["arms"]}
    assert verdicts[ARM] == "FAIL" and verdicts["native"] == "PASS" and verdicts[FAITHFUL] == "PASS"
    assert _scenario_arm(data, "in-flight-4", EXAMPLE)["verdict"] == "PASS"
    proc = load_only_run[0]
    assert proc.returncode == 3, proc.stderr[-2000:]  # an ERROR outranks the finding (exit 1)
