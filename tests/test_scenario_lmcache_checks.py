"""An LMCache (scenario, arm) gets its own process checks, as a plain LMCache arm does: the copy path each of
its own LMCache processes took (the scenario child is a fresh engine, an MP arm has its own server, so the
plain arm's path says nothing about it) and LMCache's degraded mode (ERROR, never a PASS). No engine: the
entry is judged from a result shaped as the child writes it (repro.run.scenarios.judge_run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvkit_testutil import ROOT

from repro.contract.job import ArmSpec, ConnectorSpec
from repro.contract.result import ArmResult, ProbeResult, RequestResult, ScenarioResult, StepRequest
from repro.judge.verdict import ERROR, FAIL, LMCACHE_DEGRADED, PASS
from repro.lmcache.ops import FALLBACK_WARNING
from repro.plan.arms import PlannedArm
from repro.plan.fixtures import parse_fixture
from repro.publish.scenario_md import format_finding
from repro.readmodel import as_report
from repro.readmodel.scenarios import ScenarioArm
from repro.record.report import ReportInvalid, validate_report
from repro.run.runner import ArmOutcome
from repro.run.scenarios import judge_run

BASE = (5, 6, 7, 8)
COMPILED = {"copy_path": "compiled", "ops_source": "wheel", "cuda_ops_file": "cuda_ops.cpython-312-x86_64-linux-gnu.so"}
SERVER = {"path": "fallback", "source": None, "detail": "lmcache.cuda_ops: ImportError: no module"}
DEGRADED_LINE = "[2026-12-01 16:00:00] LMCache WARNING: LMCache failed to start, entering degraded mode (recompute)"


def _scenario():
    """The CPU fixture with one scenario of two steps over its probe `fixture`: a miss, then a reuse."""
    doc = json.loads((ROOT / "fixtures" / "scenarios-cpu.json").read_text(encoding="utf-8"))
    doc["scenarios"] = [{"name": "s", "steps": [{"submit": ["fixture"], "expect": "miss"}, {"submit": ["fixture"]}]}]
    for key in ("expected_scenarios", "expected_scenarios_kv"):
        doc.pop(key)
    for arm in doc["arms"]:
        arm.pop("skip_scenarios", None)
    return parse_fixture(doc, "f.json", "0" * 64).scenarios[0]


def _baseline() -> ArmResult:
    cold = RequestResult("cold", 0, BASE, (), "length", None, "")
    return ArmResult("baseline", probes=(ProbeResult("fixture", BASE, None, (cold,)),))


def _outcome(name: str, second: tuple, log: str = "", build: dict | None = None, server: dict | None = None):
    reqs = (
        StepRequest(0, "fixture", RequestResult("cold", 0, BASE, (), "length", None, ""), 0),
        StepRequest(1, "fixture", RequestResult("reuse", 32, second, (), "length", None, ""), 0),
    )
    result = ArmResult(name, versions={"lmcache_build": build} if build else {},
                       scenario=ScenarioResult("s", reqs, 0, "vllm:num_preemptions"))  # fmt: skip
    return ArmOutcome(name, result, None, Path(f"/logs/{name}.log"), log, 1.0, server_copy_path=server)


def _control() -> dict:
    reqs = [{"step": i, "probe": "fixture", "matches_plain": True} for i in (0, 1)]
    return {"status": "ok", "requests": reqs}


def _judge(connector: str | None, second=BASE, **kw) -> dict:
    spec = ArmSpec(connector or "native", "connector" if connector else "native",
                   ConnectorSpec(connector) if connector else None)  # fmt: skip
    arm = PlannedArm(spec)
    return judge_run(_scenario(), arm, _outcome(spec.name, second, **kw), _baseline(), _control(), "logs")


def test_an_in_process_arm_records_its_own_engine_copy_path():
    entry = _judge("LMCacheConnectorV1", build=COMPILED)
    assert entry["verdict"] == PASS
    assert entry["copy_paths"] == [{"process": "engine", "path": "compiled", "source": "wheel",
                                    "detail": "cuda_ops.cpython-312-x86_64-linux-gnu.so"}]  # fmt: skip
    assert entry["lmcache_degraded"] == []
    # LMCache's own fallback warning in this child's log decides, whatever the import said
    fell = _judge("LMCacheConnectorV1", build=COMPILED, log=f"x WARNING {FALLBACK_WARNING}, using torch\n")
    assert [p["path"] for p in fell["copy_paths"]] == ["fallback"]


def test_an_mp_arm_records_its_engine_and_its_own_server_or_says_not_recorded():
    entry = _judge("LMCacheMPConnector", build=COMPILED, server=SERVER)
    assert [(p["process"], p["path"]) for p in entry["copy_paths"]] == [
        ("engine", "compiled"),
        ("MP server", "fallback"),
    ]
    bare = _judge("LMCacheMPConnector", build=COMPILED)
    assert bare["copy_paths"][1]["path"] == "not recorded"


def test_degraded_mode_makes_the_scenario_arm_an_error_even_when_its_tokens_match():
    entry = _judge("LMCacheConnectorV1", build=COMPILED, log=DEGRADED_LINE + "\n")
    assert entry["verdict"] == ERROR
    assert entry["error"]["kind"] == LMCACHE_DEGRADED
    assert entry["lmcache_degraded"] == [DEGRADED_LINE]
    # a FAIL found by tokens stays readable in the reasons, and the arm is still no PASS
    failed = _judge("LMCacheConnectorV1", second=(5, 6, 9, 9), build=COMPILED, log=DEGRADED_LINE)
    assert failed["verdict"] == ERROR and any("differs from baseline @2" in r for r in failed["reasons"])


def test_an_arm_without_lmcache_has_no_copy_path():
    entry = _judge(None)
    assert entry["verdict"] == PASS and entry["copy_paths"] is None and entry["lmcache_degraded"] is None


def test_the_views_show_a_scenario_runs_copy_path():
    entry = _judge("LMCacheMPConnector", second=(5, 6, 9, 9), build=COMPILED, server=SERVER)
    assert entry["verdict"] == FAIL
    arm = ScenarioArm.from_json(entry, 16, None, None)
    assert arm.copy_path_text == "copy path: engine compiled (wheel), MP server fallback"
    assert ScenarioArm.from_json(_judge(None), 16, None, None).copy_path_text == ""
    data = json.loads((ROOT / "tests" / "data" / "report-scenarios-example.json").read_text(encoding="utf-8"))
    data["scenarios"][0]["arms"] = [entry]
    validate_report(data)  # the schema knows the new fields
    data["scenarios"][0]["arms"] = [entry | {"copy_paths": "compiled"}]
    with pytest.raises(ReportInvalid):
        validate_report(data)
    data["scenarios"][0]["arms"] = [entry]
    report = as_report(data)
    lines = format_finding(report, report.scenarios[0], report.scenarios[0].arms[0], 0)
    assert "- copy path: engine compiled (wheel), MP server fallback" in lines
