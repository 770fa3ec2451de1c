"""The preflight child: connector and device problems become a usage error before any engine
starts. These tests import the real vLLM (a few seconds each) but start no engine."""

from __future__ import annotations

import os

import pytest
from kvkit_testutil import have_vllm, run_cli

from repro.contract.job import ArmSpec, EngineConfig, Preflight, PreflightConnector, build_job
from repro.run.runner import child_env, run_arm

pytestmark = pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")


def test_every_connector_and_device_problem_is_named(tmp_path):
    (tmp_path / "broken_conn.py").write_text("import no_such_package_kvkit\n")
    connectors = [
        {"arm": "a-ok", "name": "ExampleConnector", "module_path": None},
        {"arm": "b-ok", "name": "PlantedFaultConnector", "module_path": "repro.engine.connectors.planted_fault"},
        {"arm": "c", "name": "NoSuchConnector", "module_path": None},
        {"arm": "d", "name": "Broken", "module_path": "broken_conn"},
        {"arm": "e", "name": "NoSuchClass", "module_path": "repro.engine.connectors.planted_fault"},
    ]
    env = child_env(dict(os.environ, PYTHONPATH=str(tmp_path)), hashseed="0", extra={})
    # the first arm's engine child makes these checks before it builds an engine; with problems
    # it builds none and hands them back
    engine = EngineConfig("unused", None, "float32", 0, 0.1, 256, 16, "cuda")
    preflight = Preflight(tuple(PreflightConnector(**c) for c in connectors), device="cuda")
    job = build_job(ArmSpec("baseline", "baseline"), engine, [], max_tokens=1, logprobs=2, preflight=preflight)
    outcome = run_arm(job, workdir=tmp_path, log_path=tmp_path / "preflight.log", env=env, timeout_s=300)
    assert outcome.failure is None, outcome.failure
    problems = outcome.result.preflight_problems
    text = "\n".join(problems)
    assert not any(p.startswith(("arm a-ok", "arm b-ok")) for p in problems), text
    assert any(p.startswith("--device cuda: this machine's vLLM runs on 'cpu'") for p in problems), text
    assert any(
        p.startswith("arm c: unknown connector 'NoSuchConnector'") and "ExampleConnector" in p for p in problems
    ), text
    assert any(
        p.startswith("arm d: connector module 'broken_conn' does not import (ModuleNotFoundError") for p in problems
    ), text
    assert any(
        p.startswith("arm e: connector module 'repro.engine.connectors.planted_fault' has no class 'NoSuchClass'")
        for p in problems
    ), text
    assert len(problems) == 4, text


def test_unknown_connector_is_exit_2_before_any_arm(tmp_path, tiny_model):
    report = tmp_path / "r.json"
    report.write_bytes(b"old\n")
    proc = run_cli(
        [
            "--model",
            tiny_model,
            "--device",
            "cpu",
            "--kv-connector",
            "NoSuchConnector",
            "--fixture",
            "fixtures/selftest-cpu.json",
            "--report",
            str(report),
            "--force",  # the old report passes the path's check; the connector's refusal must still keep it
        ],
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    # the first child checks every connector once vLLM is imported, before it builds an engine
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "unknown connector 'NoSuchConnector'" in last
    # no arm got a verdict and no engine was built: an arm started while the first child made the
    # preflight only imported vLLM, then read "stop" at the gate (repro.engine.child.wait_for_preflight)
    assert "done:" not in proc.stderr and "building the engine" not in proc.stderr
    assert "Traceback" not in proc.stderr
    assert report.read_bytes() == b"old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_batch_invariant_on_a_platform_without_its_kernels_is_named(tmp_path):
    # what --batch-invariant hands every child; this machine's vLLM runs on the CPU, where vLLM has
    # no batch-invariant kernels (the CLI refuses --device cpu itself; this is --device cuda on a CPU build)
    env = child_env(dict(os.environ), hashseed="0", extra={"VLLM_BATCH_INVARIANT": "1"})
    engine = EngineConfig("unused", None, "float32", 0, 0.1, 256, 16, "auto")
    job = build_job(
        ArmSpec("baseline", "baseline"), engine, [], max_tokens=1, logprobs=2, preflight=Preflight((), device="auto")
    )
    outcome = run_arm(job, workdir=tmp_path, log_path=tmp_path / "preflight.log", env=env, timeout_s=300)
    assert outcome.failure is None, outcome.failure
    assert outcome.result.preflight_problems == (
        "--batch-invariant: vLLM has batch-invariant kernels for CUDA and XPU only, and this runs on cpu",
    )
