"""vLLM's MultiConnector as a fixture arm, end to end on the real vLLM CPU engine (issue 36, item 5).

MultiConnector saves to every member and loads each request from the first member that reports hits; the KV audit
reads which member it chose. Two arms of the same two members in either order: ExampleConnector first serves every
reuse, the faithful planted member none ("not exercised": the arm's PASS is not its PASS); the planted member with
a zero_blocks fault first serves every reuse and the arm FAILs naming it, while ExampleConnector behind it is the
one not exercised. vLLM #46865 (an offload tier inside MultiConnector that silently stored almost nothing) is the
case this answers: a member's zero hits are shown, never folded into the arm's PASS."""

from __future__ import annotations

import json

import pytest
from conftest import have_vllm, run_cli
from e2e_runs import shared_run
from planted_fixtures import PLANTED_MODULE, fixture_argv, write_arms_fixture

from repro.judge.verdict import CORRUPT, FAIL, INCONCLUSIVE, PASS

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

EXAMPLE_FIRST, PLANTED_FIRST = "Multi-example-first", "Multi-planted-first"
EXAMPLE = {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {"shared_storage_path": "@tmpdir"}}  # fmt: skip


def _planted(fault: str, **extra) -> dict:
    # no store_dir and no kv_role: the kit fills both (a fresh store per run, the arm's kv_both)
    return {"kv_connector": "PlantedFaultConnector", "kv_connector_module_path": PLANTED_MODULE,
            "kv_connector_extra_config": {"fault": fault, **extra}}  # fmt: skip


def _fixture(tmp) -> str:
    faulty = _planted("zero_blocks", first_block=0, num_blocks=16)
    arms = [
        {"name": EXAMPLE_FIRST, "connector": "MultiConnector", "extra_config": {"connectors": [EXAMPLE, _planted("none")]}},
        {"name": PLANTED_FIRST, "connector": "MultiConnector", "extra_config": {"connectors": [faulty, EXAMPLE]}},
    ]  # fmt: skip
    return write_arms_fixture(tmp / "multi.json", "multi-connector", "MultiConnector arms, hits per member", arms)


def _run(model: str, tmp) -> tuple:
    report = tmp / "multi-report.json"
    return run_cli(fixture_argv(model, _fixture(tmp), report, "--reuses", "2")), report


# one fixture probe, two MultiConnector arms and the baseline; made ahead by the tests' lane (tests/e2e_runs.py)
multi_connector_run = shared_run("multi_connector_run", _run, lane=True)


def _arm(report: dict, name: str) -> dict:
    return next(a for a in report["arms"] if a["name"] == name)


def _reuses(arm: dict) -> list[dict]:
    (probe,) = [p for p in arm["probes"] if p["name"] == "fixture"]
    return probe["requests"][1:]


def test_each_member_gets_its_own_fresh_store_and_the_report_records_the_members(multi_connector_run):
    proc, report = multi_connector_run
    assert proc.returncode == 1, proc.stderr[-3000:]  # the planted member's fault is a finding
    data = json.loads(report.read_text())
    for name in (EXAMPLE_FIRST, PLANTED_FIRST):
        arm = _arm(data, name)
        members = arm["connector"]["extra_config"]["connectors"]
        assert {m["kv_role"] for m in members} == {"kv_both"}
        assert arm["store"]["fresh"] is True
        rewritten = " ".join(arm["store"]["rewritten"])
        assert "connectors[0]." in rewritten and "connectors[1]." in rewritten, arm["store"]
        assert [m["connector"] for m in arm["members"]] == [m["kv_connector"] for m in members]


def test_the_member_that_served_each_reuse_is_recorded_with_its_tokens(multi_connector_run):
    data = json.loads(multi_connector_run[1].read_text())
    for name, served in ((EXAMPLE_FIRST, "ExampleConnector"), (PLANTED_FIRST, "PlantedFaultConnector")):
        arm = _arm(data, name)
        (probe,) = [p for p in arm["probes"] if p["name"] == "fixture"]
        cold = probe["requests"][0]
        assert cold["connector_member"] == {"index": None, "connector": None, "tokens": 0}  # a miss: nobody loaded
        for r in _reuses(arm):  # MultiConnector asks its members in order: the first one serves
            assert r["connector_member"] == {"index": 0, "connector": served, "tokens": r["cached_tokens"]}, r
            assert r["cached_tokens"] > 0


def test_a_member_that_served_no_reuse_is_not_exercised_beside_a_pass(multi_connector_run):
    data = json.loads(multi_connector_run[1].read_text())
    arm = _arm(data, EXAMPLE_FIRST)
    assert arm["verdict"] == PASS, arm["reasons"]  # what served (ExampleConnector) matched the baseline
    example, planted = arm["members"]
    hits = sum(r["cached_tokens"] for r in _reuses(arm))
    assert (example["verdict"], example["hits"], len(example["reuses_served"])) == (PASS, hits, 2)
    assert (planted["verdict"], planted["hits"], planted["reuses_served"]) == (INCONCLUSIVE, 0, [])
    assert "member 1 PlantedFaultConnector never served a reuse: not exercised" in arm["reasons"]
    out = multi_connector_run[0].stdout
    # the idle member counts against the arm (exit 1, repro.record.exit_rule), so its line leads with it, never PASS
    assert (
        f"{EXAMPLE_FIRST} (MultiConnector): member 1 PlantedFaultConnector not exercised (INCONCLUSIVE) · its tokens: PASS"
        in out
    )
    assert f"member 0 ExampleConnector: served 2 reuses, {hits} tokens · PASS" in out


def test_a_faulty_member_that_serves_fails_the_arm_by_name(multi_connector_run):
    data = json.loads(multi_connector_run[1].read_text())
    arm = _arm(data, PLANTED_FIRST)
    assert arm["verdict"] == FAIL
    planted, example = arm["members"]
    assert planted["verdict"] == FAIL and len(planted["reuses_served"]) == 2
    assert example["verdict"] == INCONCLUSIVE and example["reuses_served"] == []
    assert any(r.startswith("member 0 PlantedFaultConnector served fixture reuse 1") for r in arm["reasons"])
    (probe,) = [p for p in arm["probes"] if p["name"] == "fixture"]
    assert probe["kv"]["verdict"] == CORRUPT  # the KV audit blames the bytes the planted member loaded
