"""End to end on the real vLLM CPU engine: a verdict names its conditions. A planted fault that needs a
busy machine is classed contention-dependent (found while arms shared the cores, clean when the kit
re-runs it alone); a planted fault in one engine of three is intermittent, 1 of 3, with its rate."""

from __future__ import annotations

import json

import pytest
from conftest import have_vllm, run_cli
from e2e_runs import shared_run
from planted_fixtures import CONTENDED_ARM, CONTENDED_FIXTURE, INTERMITTENT_ARM, write_intermittent_fixture

from repro.plan.options import CPU_ENGINE_FLAGS

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]


def _argv(model: str, fixture, report, *extra: str) -> list[str]:
    return ["--model", model, *CPU_ENGINE_FLAGS, "--fixture", str(fixture), "--report", str(report), "--quiet",
            *extra]  # fmt: skip


def _arm(report: dict, name: str) -> dict:
    return next(a for a in report["arms"] if a["name"] == name)


def test_a_fault_that_needs_a_busy_machine_is_contention_dependent(tiny_model, tmp_path, machine_alone):
    """Five arms at once beside the --cpu-load neighbour (a spinning process on every core): the contended
    arm's loads wait on a run queue and fault, however quiet the machine; the kit stops and reaps the
    neighbour, then re-runs the arm alone (nothing of the kit's running), where it is clean:
    contention-dependent, both results kept. Without the neighbour the shared run was busy only if the
    other arms happened to hold the copy's core, which a quiet machine often did not. machine_alone: no run
    of the tests' lane (tests/e2e_runs.py) goes on beside it, which would load the run alone."""
    report = tmp_path / "contended.json"
    proc = run_cli(_argv(tiny_model, CONTENDED_FIXTURE, report, "--compare-native", "--jobs", "5", "--cpu-load"))
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    data = json.loads(report.read_text())
    arm = _arm(data, CONTENDED_ARM)
    assert arm["sharing"]["shared"] is True and arm["sharing"]["resource"] == "CPU cores"
    # the neighbour ran through the shared run, and was gone, its group reaped, before the run alone began
    load = data["conditions"]["cpu_load"]
    assert load["ended"] == "stopped by the kit" and "failure" not in load and load["left_running"] == [], load
    assert len(load["workers"]) == len(load["cores"]) and all(w["iterations"] > 0 for w in load["workers"]), load
    assert any(o["kind"] == "cpu-load" and o["overlap_s"] > 0 for o in arm["sharing"]["others"]), arm["sharing"]
    assert arm["verdict"] == "FAIL" or any((p.get("kv") or {}).get("verdict") == "CORRUPT" for p in arm["probes"])
    conf = arm["confirmation"]
    assert conf["status"] == "ran" and conf["run"]["shared"] is False, conf
    assert conf["sharing"]["others"] == [] and conf["sharing"]["window_s"][0] >= load["ended_s"] - 0.05, conf
    assert conf["run"]["verdict"] == "PASS" and all(p["kv"] in ("EXACT", None) for p in conf["run"]["probes"]), conf
    assert conf["class"] == "contention-dependent", conf
    # the claim names its condition wherever the verdict is, and the load it was found under
    assert "contention-dependent" in proc.stdout and "cpu-load on cores" in proc.stdout
    # the faithful arms stayed clean, and their verdicts needed no confirming
    for name in ("PlantedFault-none", "native"):
        assert _arm(data, name)["verdict"] == "PASS" and _arm(data, name)["confirmation"]["status"] == "not needed"


def _intermittent_run(model: str, tmp) -> tuple:
    fixture = write_intermittent_fixture(tmp)
    report = tmp / "intermittent.json"
    return run_cli(_argv(model, fixture, report, "--trials", "3", "--jobs", "1")), report


# one arm at a time: made ahead by the tests' lane (tests/e2e_runs.py)
intermittent_run = shared_run("intermittent_run", _intermittent_run, lane=True)


def test_a_fault_in_one_engine_of_three_is_intermittent_with_its_rate(intermittent_run):
    """--trials 3 --jobs 1: the engine that wins the claim faults, the other two load faithfully."""
    proc, report = intermittent_run
    assert proc.returncode == 1, proc.stderr[-3000:]  # a finding, though two runs in three were clean
    arm = _arm(json.loads(report.read_text()), INTERMITTENT_ARM)
    trials = arm["trials"]
    assert trials["n"] == 3 and trials["class"] == "intermittent"
    faulted = [r for r in trials["runs"] if any(p["verdict"] == "FAIL" or p["kv"] == "CORRUPT" for p in r["probes"])]
    assert len(faulted) == 1, trials["runs"]
    for rate in trials["rates"]:
        assert rate["of"] == 3 and max(rate["failed"], rate["kv_corrupt"]) <= 1
    assert any(rate["class"] == "intermittent" for rate in trials["rates"])
    assert "intermittent" in proc.stdout
    # one at a time: nothing shared, so nothing to confirm alone
    assert arm["sharing"]["shared"] is False and arm["confirmation"]["status"] != "ran"
