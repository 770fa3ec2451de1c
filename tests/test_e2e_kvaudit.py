"""The KV audit end to end on the real vLLM CPU engine: the recorder leaves the baseline's output
alone, and a connector nobody tuned the kit for is blamed at the block it corrupts even when the
tokens do not change."""

from __future__ import annotations

import json
import os

import pytest
from conftest import ROOT, have_vllm
from e2e_runs import shared_run
from kvkit_testutil import engine_block_size, run_test_connector

from repro.contract.job import ArmSpec, EngineConfig, ProbeJob, build_job
from repro.plan.fixtures import load_fixture
from repro.plan.options import CPU_KV_CACHE_TOKENS
from repro.plan.settings import engine_layout_env
from repro.plan.suite import build_probes
from repro.run.runner import child_env, run_arm

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]


def _baseline(tiny_model, tmp_path, kv_audit_dir):
    fixture = load_fixture(ROOT / "fixtures" / "selftest-cpu.json")
    probes = [ProbeJob(p.name, p.prompt_spec(), 1) for p in build_probes(fixture.probes, "acceptance")]
    engine = EngineConfig(
        tiny_model, None, "float32", 0, 0.1, 2048, engine_block_size(), "cpu", CPU_KV_CACHE_TOKENS
    )  # the CPU self-test's pool and block size
    job = build_job(
        ArmSpec("baseline", "baseline"), engine, probes, max_tokens=16, logprobs=2, kv_audit_dir=kv_audit_dir
    )
    work = tmp_path / ("audit" if kv_audit_dir else "plain")
    work.mkdir()
    # in the kit's CPU engine layout (the engine core and its worker in the child), as the verifier's arms run
    env = child_env(dict(os.environ), hashseed="0", extra={"PYTHONPATH": str(ROOT), **engine_layout_env("one-process")})
    outcome = run_arm(job, workdir=work, log_path=work / "arm.log", env=env, timeout_s=900)
    assert outcome.failure is None, outcome.log_text[-3000:]
    return outcome.result


def _plain_and_audited(model: str, tmp) -> tuple:
    return _baseline(model, tmp, None), _baseline(model, tmp, str(tmp / "kv"))


# one engine at a time: made ahead by the tests' lane (tests/e2e_runs.py), in its thread as the kit runs arms
recorded_baselines = shared_run("recorded_baselines", _plain_and_audited, lane=True)


def test_the_reference_recorder_does_not_change_the_baseline(recorded_baselines):
    """The recorder adds a KV connector to the baseline's config: its output must not move."""
    plain, audited = recorded_baselines
    assert plain.effective_config["kv_transfer_config"] is None
    assert audited.effective_config["kv_transfer_config"]["kv_connector"] == "KVAuditObserver"
    # a producer, not kv_both: vLLM's scheduler treats a consumer differently (kvaudit.OBSERVER_ROLE)
    assert audited.effective_config["kv_transfer_config"]["kv_role"] == "kv_producer"
    assert audited.effective_config["async_scheduling"] is False  # the CPU platform turns it off
    assert (
        [p.name for p in plain.probes]
        == [p.name for p in audited.probes]
        == ["fixture", "chat-511", "chat-512", "chat-513"]
    )
    for a, b in zip(plain.probes, audited.probes):
        (ra,), (rb,) = a.requests, b.requests
        assert ra.token_ids == rb.token_ids
        assert ra.logprobs == rb.logprobs  # the top-2 logprobs of every position, bit for bit
        assert ra.cached_tokens == rb.cached_tokens == 0
        assert rb.kv_audit_record["computed_blocks"] == len(a.prompt_token_ids) // engine_block_size()
    assert audited.kv_audit["errors"] == []


def test_a_subtle_out_of_tree_connector_is_blamed_at_its_block(tiny_model, tmp_path):
    """ScaledBlockConnector (tests/connectors) rescales the third loaded block by 1.001: the tokens
    stay the same, the audit blames exactly block 2, K and V, every layer, and the run exits 1."""
    report = tmp_path / "subtle.json"
    proc = run_test_connector(
        tiny_model, "ScaledBlockConnector", {"shared_storage_path": str(tmp_path / "store")}, report
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    data = json.loads(report.read_text())
    arm = next(a for a in data["arms"] if a["name"] == "ScaledBlockConnector")
    (probe,) = arm["probes"]
    assert probe["verdict"] == "PASS"  # 16 greedy tokens unchanged
    assert probe["kv"]["verdict"] == "CORRUPT"
    assert probe["kv"]["blame"]["blocks"] == [2]
    assert probe["kv"]["blame"]["planes"] == ["K", "V"]
    assert probe["kv"]["blame"]["layers"] == [0, 1, 2, 3]
    for r in probe["requests"][1:]:
        audit = r["kv_audit"]
        # the fixture probe's full blocks below its last token (1502 tokens)
        assert audit["status"] == "audited" and audit["num_blocks"] == (1502 - 1) // engine_block_size()
        assert audit["counts"]["corrupt"] == 8  # one block x 4 layers x 2 planes
        for plane in ("K", "V"):
            for row in audit["planes"][plane]["class"]:
                assert row == "ee" + "c" + "e" * (len(row) - 3)
    assert arm["kv_audit"]["floor"]["identical"] is True
    assert "KV findings" in proc.stdout
