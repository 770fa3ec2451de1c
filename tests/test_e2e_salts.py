"""Tenant salts on the real vLLM CPU engine: fixtures/scenarios-cpu-salts.json, one verifier run (its plain probes
and both scenarios, native beside ExampleConnector), every assertion on its report.

What vLLM 0.28.0's source says, written in the fixture before its first run: native prefix caching puts the salt in
the key of a prompt's first block, so the same tokens under another salt miss and under the same salt hit (PASS,
the control); ExampleConnector names its files by the tokens alone (vLLM #53495), so a request under another salt
loads the first salt's KV: a tenant-isolation failure, named in the reasons, the exit reason, the headline and the
summary, and exit 1."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, have_vllm
from e2e_runs import shared_run, verify
from planted_fixtures import fixture_argv

from repro.judge.expectations import expectation_met
from repro.judge.verdict import TENANT_ISOLATION
from repro.publish.headline import headline
from repro.publish.summary import format_summary

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

FIXTURE = "fixtures/scenarios-cpu-salts.json"
HIT = 288  # ExampleConnector's load of a 300-token prompt: align_to_block_size(299, 16)


def _run(model: str, tmp):
    report = tmp / "salts.json"
    extra = ["--compare-native", "--no-native-matched", "--no-confirm", "--scenarios", "all", "--quiet"]
    return verify(fixture_argv(model, FIXTURE, report, *extra), report)


salts_run = shared_run("salts_run", _run)


def _probe(data: dict, arm: str, name: str) -> dict:
    return next(p for a in data["arms"] if a["name"] == arm for p in a["probes"] if p["name"] == name)


def _scenario_arm(data: dict, scenario: str, arm: str) -> dict:
    return next(a for s in data["scenarios"] if s["name"] == scenario for a in s["arms"] if a["arm"] == arm)


def test_every_verdict_is_the_fixtures_and_the_finding_exits_1(salts_run):
    data = salts_run.data
    assert data is not None, salts_run.proc.stderr[-3000:]
    assert salts_run.proc.returncode == 1, salts_run.proc.stderr[-3000:]
    fixture = json.loads((ROOT / FIXTURE).read_text(encoding="utf-8"))
    for table, get in (("expected", _probe), ("expected_scenarios", _scenario_arm)):
        for arm, wants in fixture[table].items():
            for name, want in wants.items():
                got = get(data, arm, name) if table == "expected" else get(data, name, arm)
                assert expectation_met(want, got["verdict"]), (arm, name, got["verdict"], got["reasons"])


def test_native_misses_across_salts_and_hits_within_one(salts_run):
    data = salts_run.data
    for name in ("tenant-a", "tenant-b", "no-salt"):
        assert [r["cached_tokens"] for r in _probe(data, "native", name)["requests"]][1] > 0
    cross = _scenario_arm(data, "cross-salt", "native")["requests"]
    assert [r["cached_tokens"] == 0 for r in cross] == [True, True, False, False], [r["cached_tokens"] for r in cross]
    assert all("finding" not in r for r in cross)


def test_example_connector_serves_one_tenants_kv_to_another_and_the_views_name_it(salts_run):
    data = salts_run.data
    for name in ("tenant-b", "no-salt"):
        probe = _probe(data, "ExampleConnector", name)
        assert probe["finding"] == TENANT_ISOLATION and probe["requests"][0]["cached_tokens"] == HIT
        assert probe["reasons"][0].startswith("cold request: tenant isolation: "), probe["reasons"]
    second = _scenario_arm(data, "cross-salt", "ExampleConnector")["requests"][1]
    assert second["finding"] == TENANT_ISOLATION and second["cached_tokens"] == HIT and second["first_diff"] is None
    assert "tenant-isolation failure" in headline(data) and "tenant-isolation failure on" in format_summary(data)
