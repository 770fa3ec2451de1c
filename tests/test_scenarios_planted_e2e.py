"""Issue 23's CPU "done when", end to end on the real vLLM CPU engine: a planted fault that corrupts only a
load made while another request is in flight is caught by the in-flight scenario and missed by the plain
probes; one that corrupts only reloads after eviction is caught by the eviction scenario; native prefix
caching passes both. fixtures/scenarios-cpu-planted.json says why its local tier is 100 blocks (arithmetic
from the probes' block counts, chosen before any run) and holds the expectations (measured first).

It runs `--scenarios in-flight,eviction`: the two scenarios the claim is about. a-b-a and preemption add
nothing to what is asserted here (the fixture's expectations for them were measured with `--scenarios all`,
4 min 8 s, and native under every scenario is tests/test_scenarios_e2e.py's). Measured on 2026-12-01 (2
shared cores, --jobs 2, under the e2e lock, another helper's engines running meanwhile): 211 s and 229 s
in two runs (plain arms 77 / 88 s, scenarios 125 / 134 s). Run under `flock /tmp/kvkit-e2e.lock`. The run is the
session's (tests/e2e_runs.py): tests/test_e2e_planted_scenario_gates.py reads its plain probes too."""

from __future__ import annotations

import pytest
from conftest import have_vllm

from repro.record.report import validate_report

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

IN_FLIGHT = "PlantedFault-in-flight"
EVICTION = "PlantedFault-after-eviction"
CAPACITY = 100  # the fixture's local_capacity_blocks
BLOCK = 16
PROBES = ("fixture", "chat-511", "chat-512", "chat-513")
ZEROED = list(range(16))  # zero_blocks, first_block 0, num_blocks 16


@pytest.fixture
def planted_run(planted_scenarios_run):
    """The CPU self-test's command line (the CPU engine flags, the acceptance suite, native) on this fixture."""
    run = planted_scenarios_run
    assert run.data is not None, run.proc.stdout[-3000:] + run.proc.stderr[-3000:]
    return run.proc, run.data


def _plain(report: dict, name: str) -> dict:
    return next(a for a in report["arms"] if a["name"] == name)


def _scenario_arm(report: dict, scenario: str, arm: str) -> dict:
    sc = next(s for s in report["scenarios"] if s["name"] == scenario)
    return next(a for a in sc["arms"] if a["arm"] == arm)


def _gate(request: dict) -> dict:
    return request["kv_transfer_params"]["planted_fault"]["gate"]


def test_the_run_matches_the_fixture(planted_run):
    """Exit 0: every verdict, FAILs and CORRUPTs of the planted arms included, is the one the fixture states."""
    proc, report = planted_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    validate_report(report)
    assert report["config"]["scenarios"] == ["in-flight", "eviction"]
    assert report["acceptance"]["matched"] is True, report["acceptance"]
    acc = report["acceptance"]["scenarios"]
    assert acc["matched"] is True and acc["unchecked"] == [], acc
    assert "in-flight · PlantedFault-in-flight: FAIL" in proc.stdout
    assert "eviction · PlantedFault-after-eviction: FAIL" in proc.stdout


def test_plain_probes_miss_both_faults_and_their_gates_never_open(planted_run):
    _, report = planted_run
    for name, figures_key in ((IN_FLIGHT, "in_flight"), (EVICTION, "after_eviction")):
        arm = _plain(report, name)
        assert arm["verdict"] == "PASS" and tuple(p["name"] for p in arm["probes"]) == PROBES
        for probe in arm["probes"]:
            assert (probe["verdict"], probe["kv"]["verdict"]) == ("PASS", "EXACT"), (name, probe["name"])
            for reuse in probe["requests"][1:]:
                planted = reuse["kv_transfer_params"]["planted_fault"]
                assert reuse["cached_tokens"] > 0 and planted["faulted_blocks"] == [], (name, probe["name"])
                gate = planted["gate"]
                assert gate["apply"] is False and gate[figures_key]["open"] is False, gate
                figures = gate[figures_key]
                if figures_key == "in_flight":
                    assert figures["in_flight"] == 1, figures
                else:  # every loaded block came from the local tier
                    assert figures["capacity_blocks"] == CAPACITY and figures["evicted_blocks"] == []
                    assert (
                        figures["local_blocks"] == planted["loaded_tokens"] // BLOCK
                        and figures["next_tier_blocks"] == 0
                    )


def _caught(arm: dict) -> list[dict]:
    """The arm's requests that caught the fault: a hit, a FAIL, KV CORRUPT, and not the schedule's doing."""
    caught = [r for r in arm["requests"] if r["verdict"] == "FAIL"]
    for r in caught:
        assert r["role"] == "reuse" and r["cached_tokens"] > 0, r
        assert r["kv"]["verdict"] == "CORRUPT" and r["first_diff"] is not None, r
        assert r["control_matches"] is True and r["class"] is None, r  # the cache-off control matched the baseline
        assert r["kv_transfer_params"]["planted_fault"]["faulted_blocks"] == ZEROED
    assert (arm["verdict"], arm["kv"]["verdict"]) == ("FAIL", "CORRUPT"), arm["reasons"]
    assert arm["kv"]["blame"]["blocks"] == ZEROED
    return caught


def test_the_in_flight_scenario_catches_the_in_flight_fault(planted_run):
    _, report = planted_run
    caught = _caught(_scenario_arm(report, "in-flight", IN_FLIGHT))
    assert caught and all(r["step"] == 1 for r in caught)  # the together-step of reuses, not the cold one
    for r in caught:
        figures = _gate(r)["in_flight"]
        assert figures["open"] is True and figures["in_flight"] >= 2, figures
    # the same fault under eviction (one request at a time): missed, the gate shut at every load
    missed = _scenario_arm(report, "eviction", IN_FLIGHT)
    assert (missed["verdict"], missed["kv"]["verdict"]) == ("PASS", "EXACT"), missed["reasons"]
    reuses = [r for r in missed["requests"] if r["role"] == "reuse"]
    assert reuses and all(_gate(r)["in_flight"]["open"] is False for r in reuses)


def test_the_eviction_scenario_catches_the_after_eviction_fault(planted_run):
    _, report = planted_run
    arm = _scenario_arm(report, "eviction", EVICTION)
    caught = _caught(arm)
    assert [(r["step"], r["probe"]) for r in caught] == [(3, "chat-511"), (4, "fixture")]
    reload = _gate(caught[0])["after_eviction"]
    # chat-511's 31 blocks were pushed out by the fixture probe's 93 and chat-512's 32 (125 > 100)
    assert reload["open"] is True and reload["evicted_blocks"] == list(range(31)), reload
    assert (reload["local_blocks"], reload["next_tier_blocks"], reload["never_local_blocks"]) == (0, 31, 0)
    # its cold requests loaded nothing; they are misses and PASS
    assert all(r["verdict"] == "PASS" and r["cached_tokens"] == 0 for r in arm["requests"][:3])


def test_native_passes_every_scenario_it_ran(planted_run):
    _, report = planted_run
    for sc in report["scenarios"]:
        assert sc["control"]["status"] == "ok"
        assert all(r["matches_plain"] for r in sc["control"]["requests"]), sc["name"]
        native = _scenario_arm(report, sc["name"], "native")
        # EXACT where each prompt is prefilled alone; in-flight prefills them together: EXACT or NUMERIC by CPU
        kv_ok = ("EXACT",) if sc["name"] in ("a-b-a", "eviction") else ("EXACT", "NUMERIC")
        assert native["verdict"] == "PASS" and native["kv"]["verdict"] in kv_ok, (sc["name"], native["reasons"])
        assert all(r["first_diff"] is None for r in native["requests"])
