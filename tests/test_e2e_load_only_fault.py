"""A planted fault only load shows, on the real vLLM CPU engine (issue 36, item 3; groundwork for the production-load
scenario of item 2, which does not exist yet).

PlantedFaultConnector's `land_elsewhere`: every load is faithful, but in a scheduler step that loads for two or more
requests the step's last load also writes its first block into the first loaded block of the step's first load, a
block that request then reads (vLLM #47282's shape). Gated `in_flight` with `in_flight_min` 16: only a step with at
least 16 requests in flight opens it. Twenty prompts of 200 tokens (a fixed seed, distinct first blocks), each a
plain probe (a cold request, then one reuse: one request at a time), and two scenarios: the first four prompts in
flight together, cold then reused (the kit's four-request in-flight shape), and all twenty together, cold then
reused. Measured here: which of them open the gate, and what the kit says where it opens."""

from __future__ import annotations

import json
import random

import pytest
from conftest import have_vllm, run_cli
from e2e_runs import shared_run
from planted_fixtures import PLANTED_MODULE, fixture_argv, write_arms_fixture

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

ARM = "PlantedFault-land-elsewhere"
PROMPTS, LENGTH, SEED, VOCAB = 20, 200, 36, 320  # the tiny model's vocabulary: 320 token IDs


def _prompts() -> list[dict]:
    rng = random.Random(SEED)
    return [
        {"name": f"load-{i:02d}", "prompt": {"token_ids": [rng.randrange(3, VOCAB - 3) for _ in range(LENGTH)]},
         "reuses": 1}
        for i in range(PROMPTS)
    ]  # fmt: skip


def _fixture(tmp) -> str:
    probes = _prompts()
    names = [p["name"] for p in probes]
    arm = {"name": ARM, "connector": "PlantedFaultConnector", "module_path": PLANTED_MODULE,
           "extra_config": {"store_dir": "@tmpdir", "fault": "land_elsewhere", "when": "in_flight",
                            "in_flight_min": 16}}  # fmt: skip
    scenarios = [
        {"name": "in-flight-4", "description": "four prompts in flight together, cold, then reused",
         "engine": {"max_num_seqs": 4},
         "steps": [{"submit": names[:4], "together": True, "expect": "miss"},
                   {"submit": names[:4], "together": True, "expect": "reuse"}]},
        {"name": "load-20", "description": "twenty prompts in flight together, cold, then reused in another order",
         "engine": {"max_num_seqs": PROMPTS},
         "steps": [{"submit": names, "together": True, "expect": "miss"},
                   {"submit": list(reversed(names)), "together": True, "expect": "reuse"}]},
    ]  # fmt: skip
    return write_arms_fixture(tmp / "load-only.json", "load-only-fault", "a planted fault only load shows", [arm],
                              probes=probes, scenarios=scenarios)  # fmt: skip


def _run(model: str, tmp) -> tuple:
    report = tmp / "load-only-report.json"
    return run_cli(fixture_argv(model, _fixture(tmp), report, "--scenarios", "all", "--quiet")), report


# the baseline and one planted arm, plain and in two scenarios; made ahead by the tests' lane (tests/e2e_runs.py)
load_only_run = shared_run("load_only_run", _run, lane=True)


def _planted(req: dict) -> dict:
    return (req.get("kv_transfer_params") or {}).get("planted_fault") or {}


def test_plain_probes_never_open_the_gate_and_pass(load_only_run):
    _proc, report = load_only_run
    data = json.loads(report.read_text())
    arm = next(a for a in data["arms"] if a["name"] == ARM)
    assert len(arm["probes"]) == PROMPTS
    for probe in arm["probes"]:
        reuse = probe["requests"][1]
        assert reuse["cached_tokens"] > 0, probe["name"]
        gate = _planted(reuse)["gate"]["in_flight"]
        assert gate["in_flight"] == 1 and gate["min"] == 16 and gate["open"] is False
        assert probe["verdict"] == "PASS" and "overwritten_by" not in _planted(reuse), probe["name"]


def _scenario_arm(data: dict, name: str) -> dict:
    scenario = next(s for s in data["scenarios"] if s["name"] == name)
    return next(a for a in scenario["arms"] if a["arm"] == ARM)


def test_four_requests_in_flight_keep_the_gate_shut(load_only_run):
    data = json.loads(load_only_run[1].read_text())
    arm = _scenario_arm(data, "in-flight-4")
    reused = [r for r in arm["requests"] if r["cached_tokens"]]
    assert len(reused) == 4
    for r in reused:
        gate = _planted(r)["gate"]["in_flight"]
        assert gate["in_flight"] <= 4 and gate["open"] is False, gate
        assert "overwritten_by" not in _planted(r)
    assert arm["verdict"] == "PASS", arm.get("reasons")


def test_twenty_in_flight_open_it_and_the_overwritten_request_is_a_finding(load_only_run):
    proc, report = load_only_run
    data = json.loads(report.read_text())
    arm = _scenario_arm(data, "load-20")
    reused = [r for r in arm["requests"] if r["cached_tokens"]]
    assert len(reused) == PROMPTS
    assert any(_planted(r)["gate"]["in_flight"]["open"] for r in reused)
    victims = [r for r in reused if "overwritten_by" in _planted(r)]
    assert victims, "no load landed elsewhere although the gate opened"
    for v in victims:  # its first loaded block holds another prompt's first block: tokens or bytes show it
        kv = v.get("kv") or {}
        assert v["verdict"] == "FAIL" or kv.get("verdict") in ("FOREIGN", "CORRUPT", "MISPLACED"), v
    assert arm["verdict"] == "FAIL" or (arm.get("kv") or {}).get("verdict") in ("FOREIGN", "CORRUPT", "MISPLACED"), arm
    assert proc.returncode == 1, proc.stderr[-2000:]
