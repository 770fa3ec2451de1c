"""Prompt logprobs on the real vLLM CPU engine: fixtures/scenarios-cpu-prompt-logprobs.json, one verifier run (its
plain probes and both orders of its scenario, native beside ExampleConnector), every assertion on its report.

What vLLM 0.28.0's source says, written before the run (docs/verdicts.md, "Prompt logprobs"): a request that asks
for prompt logprobs skips reading the prefix cache, so native prefix caching reports 0 cached tokens on it (reuse
turned off by prompt_logprobs: INCONCLUSIVE, never a PASS) and returns the baseline's prompt logprobs bit for bit;
the scheduler still asks a KV connector, ExampleConnector loads, its generated tokens match, and the prompt
positions its load covered are never computed: the model runner returns them from an uninitialized tensor, so
their top-1 IDs are not the model's (FAIL)."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, have_vllm
from e2e_runs import shared_run, verify
from planted_fixtures import fixture_argv

from repro.judge.expectations import expectation_met
from repro.judge.prompt_logprobs import EXACT_VALUES, TOP1_DIFFERS, TURNED_OFF
from repro.publish.summary import format_summary

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

FIXTURE = "fixtures/scenarios-cpu-prompt-logprobs.json"
ASKING = ("shared-a", "shared-b")  # the probes that ask for prompt_logprobs=1 (control asks for none)
HIT = 288  # ExampleConnector's load of a 300-token prompt: align_to_block_size(299, 16)


def _run(model: str, tmp):
    report = tmp / "prompt-logprobs.json"
    extra = ["--compare-native", "--no-native-matched", "--no-confirm", "--scenarios", "all", "--quiet"]
    return verify(fixture_argv(model, FIXTURE, report, *extra), report)


prompt_logprobs_run = shared_run("prompt_logprobs_run", _run)


def _arm(data: dict, name: str) -> dict:
    return next(a for a in data["arms"] if a["name"] == name)


def _probe(data: dict, arm: str, name: str) -> dict:
    return next(p for p in _arm(data, arm)["probes"] if p["name"] == name)


def _scenario_arm(data: dict, scenario: str, arm: str) -> dict:
    return next(a for a in next(s for s in data["scenarios"] if s["name"] == scenario)["arms"] if a["arm"] == arm)


def test_it_runs_to_a_report_whose_findings_exit_1(prompt_logprobs_run):
    assert prompt_logprobs_run.data is not None, prompt_logprobs_run.proc.stderr[-3000:]
    assert prompt_logprobs_run.proc.returncode == 1, prompt_logprobs_run.proc.stderr[-3000:]


def test_every_verdict_is_the_fixtures(prompt_logprobs_run):
    data, fixture = prompt_logprobs_run.data, json.loads((ROOT / FIXTURE).read_text(encoding="utf-8"))
    for arm, table in fixture["expected"].items():
        for probe, want in table.items():
            got = _probe(data, arm, probe)
            assert expectation_met(want, got["verdict"]), (arm, probe, got["verdict"], got["reasons"])
    for arm, table in fixture["expected_scenarios"].items():
        for scenario, want in table.items():
            entry = _scenario_arm(data, scenario, arm)
            assert expectation_met(want, entry["verdict"]), (arm, scenario, entry["verdict"], entry["reasons"])


def test_native_reuse_is_turned_off_by_prompt_logprobs_and_says_so(prompt_logprobs_run):
    data = prompt_logprobs_run.data
    control = _probe(data, "native", "control")  # the same engine reuses a prompt that asks for none
    assert control["verdict"] == "PASS" and control["requests"][1]["cached_tokens"] > 0
    for name in ASKING:
        probe = _probe(data, "native", name)
        assert [r["cached_tokens"] for r in probe["requests"]] == [0, 0]
        assert any(TURNED_OFF in reason for reason in probe["reasons"]), probe["reasons"]
    for scenario in ("a-then-b", "b-then-a"):
        arm = _scenario_arm(data, scenario, "native")
        assert [r["cached_tokens"] for r in arm["requests"]] == [0, 0, 0, 0]
        assert all(any(TURNED_OFF in x for x in r["reasons"]) for r in arm["requests"] if r["expect"] == "reuse")


def test_native_prompt_logprobs_are_the_baselines_bit_for_bit(prompt_logprobs_run):
    data = prompt_logprobs_run.data
    requests = [r for n in ASKING for r in _probe(data, "native", n)["requests"]]
    requests += [r for s in ("a-then-b", "b-then-a") for r in _scenario_arm(data, s, "native")["requests"]]
    for r in requests:
        assert r["prompt_logprobs"]["vs_baseline"]["class"] == EXACT_VALUES, r["prompt_logprobs"]
        assert r["first_diff"] is None


def test_example_connector_loads_and_its_prompt_logprobs_are_not_the_models(prompt_logprobs_run):
    data = prompt_logprobs_run.data
    reuse = _probe(data, "ExampleConnector", "shared-a")["requests"][1]
    reuses = [reuse] + [r for s in ("a-then-b", "b-then-a") for r in _scenario_arm(data, s, "ExampleConnector")["requests"]
                        if r["expect"] == "reuse"]  # fmt: skip
    for r in reuses:
        assert r["cached_tokens"] == HIT and r["first_diff"] is None  # a hit, and the generated tokens match
        got = r["prompt_logprobs"]["vs_baseline"]
        assert got["class"] == TOP1_DIFFERS and got["top1_first_diff"] == 0, got  # within the positions it loaded
        assert r["prompt_logprobs"]["positions"] == got["baseline_positions"] == 299
    for s in ("a-then-b", "b-then-a"):
        arm = _scenario_arm(data, s, "ExampleConnector")
        assert arm["verdict"] == "FAIL" and any("prompt logprobs' top-1 IDs differ" in x for x in arm["reasons"])


def test_the_report_keeps_summaries_not_values(prompt_logprobs_run):
    data = prompt_logprobs_run.data
    summaries = [r["prompt_logprobs"] for a in data["arms"] for p in a["probes"] for r in p["requests"]
                 if "prompt_logprobs" in r]  # fmt: skip
    assert summaries and all(len(json.dumps(s)) < 600 for s in summaries)
    assert all("prompt_logprobs" not in r for p in _arm(data, "native")["probes"] if p["name"] == "control"
               for r in p["requests"])  # fmt: skip
    assert "reuse turned off by prompt_logprobs" in format_summary(data)
