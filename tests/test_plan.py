"""Arm planning and job building (repro.plan.arms, repro.contract.job.build_job): pure, no engine."""

from __future__ import annotations

import json

import pytest

from repro.contract.job import Job
from repro.errors import UsageError
from repro.plan.arms import PLANTED_FAULT_MODULE, TMPDIR_TOKEN, arm_job, materialize, plan_arms, preflight_for
from repro.plan.fixtures import load_fixture
from repro.plan.options import parse_args
from repro.plan.run_plan import build_plan
from repro.plan.suite import build_probes

SELFTEST = "fixtures/selftest-cpu.json"


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    return str(path)


def _plan(model, tmp_path, *extra):
    argv = ["--model", model, "--fixture", SELFTEST, "--report", str(tmp_path / "r.json"), *extra]
    return build_plan(parse_args(argv), argv)


def test_fixture_arms_in_order_baseline_connectors_native(model, tmp_path):
    rp = _plan(model, tmp_path, "--compare-native")
    arms = plan_arms(rp.asked, load_fixture(SELFTEST))
    assert [(a.name, a.spec.mode) for a in arms] == [
        ("baseline", "baseline"),
        ("ExampleConnector", "connector"),
        ("PlantedFault", "connector"),
        ("PlantedFault-none", "connector"),
        ("native", "native"),
        ("native-matched", "native"),
    ]
    assert arms[-1].match_arm == "ExampleConnector"  # the first connector arm's reuse lengths
    assert arms[1].skip_probes and "chat-513" in arms[1].skip_probes
    assert arms[2].spec.connector.module_path == PLANTED_FAULT_MODULE
    assert arms[0].spec.connector is None and arms[5].spec.connector is None


def test_a_command_line_connector_replaces_the_fixture_arms_and_gets_a_scratch_dir(model, tmp_path):
    rp = _plan(model, tmp_path, "--kv-connector", "ExampleConnector")
    arms = plan_arms(rp.asked, load_fixture(SELFTEST))
    assert [a.name for a in arms] == ["baseline", "ExampleConnector"]
    assert arms[1].spec.connector.extra_config == {"shared_storage_path": TMPDIR_TOKEN}
    scratch: list[str] = []
    real = materialize(arms[1], scratch)
    assert real.spec.connector.extra_config["shared_storage_path"] == scratch[0] != TMPDIR_TOKEN
    assert materialize(arms[1], []).spec.connector.extra_config != real.spec.connector.extra_config  # fresh per arm


def test_nothing_to_compare_is_a_usage_error(model, tmp_path):
    fixture = load_fixture(SELFTEST)
    rp = _plan(model, tmp_path)
    with pytest.raises(UsageError, match="nothing to compare"):
        plan_arms(rp.asked, type(fixture)(**{**fixture.__dict__, "arms": ()}))


def test_jobs_baseline_runs_once_reuse_arms_cold_plus_reuses_skips_dropped(model, tmp_path):
    rp = _plan(model, tmp_path, "--compare-native", "--suite", "acceptance", "--reuses", "2")
    fixture = load_fixture(SELFTEST)
    arms = plan_arms(rp.asked, fixture)
    probes = build_probes(fixture.probes, "acceptance")
    jobs = {a.name: arm_job(rp.engine, rp.inputs.reuses, a, probes, fixture.sha256) for a in arms}
    assert [(p.name, p.requests) for p in jobs["baseline"].probes] == [
        ("fixture", 1),
        ("chat-511", 1),
        ("chat-512", 1),
        ("chat-513", 1),
    ]
    assert [(p.name, p.requests) for p in jobs["native"].probes] == [
        ("fixture", 3),
        ("chat-511", 3),
        ("chat-512", 3),
        ("chat-513", 3),
    ]
    assert [p.name for p in jobs["ExampleConnector"].probes] == ["fixture", "chat-511", "chat-512"]
    assert {j.fixture_sha256 for j in jobs.values()} == {fixture.sha256}
    assert {j.engine for j in jobs.values()} == {jobs["baseline"].engine}  # one engine config for every arm
    assert jobs["baseline"].engine.model == str((tmp_path / "model").resolve())


def test_the_job_round_trips_through_json_and_only_the_first_child_gets_the_preflight(model, tmp_path):
    rp = _plan(model, tmp_path, "--compare-native")
    fixture = load_fixture(SELFTEST)
    arms = plan_arms(rp.asked, fixture)
    pre = preflight_for(arms, rp.engine.device, rp.children.engine_module)
    assert [(c.arm, c.name) for c in pre.connectors] == [
        ("ExampleConnector", "ExampleConnector"),
        ("PlantedFault", "PlantedFaultConnector"),
        ("PlantedFault-none", "PlantedFaultConnector"),
    ]
    job = arm_job(rp.engine, rp.inputs.reuses, arms[0], list(fixture.probes), fixture.sha256, pre)
    assert Job.from_json(json.loads(json.dumps(job.to_json()))) == job
    other = arm_job(rp.engine, rp.inputs.reuses, arms[1], list(fixture.probes), fixture.sha256)
    assert "preflight" not in other.to_json()


def test_native_matched_copies_the_connector_arms_reuse_lengths_aligned_down(model, tmp_path):
    from repro.contract.result import ArmResult, ProbeResult, RequestResult
    from repro.plan.arms import matched_probes

    rp = _plan(model, tmp_path, "--compare-native")
    fixture = load_fixture(SELFTEST)
    arm = plan_arms(rp.asked, fixture)[-1]
    probes = build_probes(fixture.probes, "acceptance")

    def probe(name, counts):
        reqs = tuple(
            RequestResult("cold" if i == 0 else "reuse", c, (1,), (), "length", None, "") for i, c in enumerate(counts)
        )
        return ProbeResult(name, (1, 2), None, reqs)

    conn = ArmResult(
        "ExampleConnector",
        (
            probe("fixture", [0, 1280, 1280, 1280]),
            probe("chat-511", [0, 256]),
            probe("chat-512", [0, 511]),
            probe("chat-513", [0, 0]),
        ),
    )
    jobs, skipped, info = matched_probes(arm, probes, conn, 16)
    assert {j.name: (j.requests, j.match_tokens) for j in jobs} == {
        "fixture": (4, (1280, 1280, 1280)),
        "chat-511": (2, (256,)),
        "chat-512": (2, (496,)),  # 511 is not block-aligned: the nearest block below
    }
    assert info["chat-512"]["aligned_down"] == [True] and info["chat-512"]["connector_tokens"] == [511]
    assert "reused nothing" in skipped["chat-513"]
    _, skipped, _ = matched_probes(arm, probes, None, 16)  # the connector arm failed
    assert set(skipped) == {"fixture", "chat-511", "chat-512", "chat-513"}


def test_arms_sharing_a_gpu_get_a_fixed_kv_cache_and_the_job_carries_it(model, tmp_path, monkeypatch):
    """vLLM's free-memory profiling fails when another process frees GPU memory meanwhile (arms
    building at once on one H200 did): arms that share a GPU get kv_cache_memory_bytes instead."""
    from dataclasses import replace

    from repro.plan import arms as plan
    from repro.plan import devices

    rp = _plan(model, tmp_path, "--device", "cuda", "--max-model-len", "2048", "--gpu-memory-utilization", "0.5")
    monkeypatch.setattr(devices, "visible_gpus", lambda: ["0"])
    shared = plan.arm_slots(rp.engine, 3, 3)
    assert [s.kv_cache_tokens for s in shared] == [plan.SHARED_GPU_KV_MAX_MODEL_LENS * 2048] * 3
    assert [s.gpu_memory_utilization for s in shared] == [0.3] * 3
    # one arm per GPU, or one at a time: vLLM sizes the cache as before
    monkeypatch.setattr(devices, "visible_gpus", lambda: ["0", "1", "2"])
    assert [s.kv_cache_tokens for s in plan.arm_slots(rp.engine, 3, 3)] == [None] * 3
    assert [(s.kv_cache_tokens, s.gpu_memory_utilization) for s in plan.arm_slots(rp.engine, 3, 1)] == [(None, 0.5)]
    assert len(plan.arm_slots(rp.engine, 5, 3)) == 3  # a slot per arm at once, taken at launch (SlotPool)
    fixture = load_fixture(SELFTEST)
    job = arm_job(rp.engine, rp.inputs.reuses, plan_arms(rp.asked, fixture)[0], list(fixture.probes), fixture.sha256)
    assert "kv_cache_tokens" not in job.to_json()["engine"]
    job = replace(job, engine=replace(job.engine, kv_cache_tokens=8192))
    assert Job.from_json(json.loads(json.dumps(job.to_json()))) == job


def test_kv_bytes_per_token_reads_the_models_attention_shape(tmp_path):
    from repro.engine.engine_args import kv_bytes_per_token

    cfg = {
        "model_type": "qwen3",
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_size": 1024,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    # Qwen3-0.6B: 2 (K, V) x 28 layers x 8 KV heads x 128 x 2 bytes
    assert kv_bytes_per_token(str(tmp_path), None, "float16") == 2 * 28 * 8 * 128 * 2
    assert kv_bytes_per_token(str(tmp_path), None, "float32") == 2 * 28 * 8 * 128 * 4
    assert kv_bytes_per_token(str(tmp_path), None, "auto") == 2 * 28 * 8 * 128 * 2


def test_no_native_matched_leaves_the_three_arm_reference_run(model, tmp_path):
    fixture = load_fixture(SELFTEST)
    names = [a.name for a in plan_arms(_plan(model, tmp_path, "--compare-native").asked, fixture)]
    assert names[-2:] == ["native", "native-matched"]
    rp = _plan(model, tmp_path, "--compare-native", "--no-native-matched", "--kv-connector", "ExampleConnector")
    assert [a.name for a in plan_arms(rp.asked, fixture)] == ["baseline", "ExampleConnector", "native"]


def test_cpu_arms_bind_to_the_cores_this_process_may_use(model, tmp_path, monkeypatch):
    """Issue 21 (6): the cores came from os.cpu_count(), so a cpuset-limited container (or a matrix
    cell pinned to its own cores) ran more arms than it had cores and bound them to cores 0..n-1,
    which it may not use. They come from the process's affinity set."""
    from repro.plan import arms as plan
    from repro.plan import devices

    monkeypatch.setattr(devices.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: {5, 2})
    monkeypatch.setattr(plan, "_memory_gib", lambda: (8.0, 64.0))  # memory for 11 arms
    rp = _plan(model, tmp_path, "--device", "cpu")
    assert plan.default_jobs(rp.engine, 6) == 2
    assert [s.env for s in plan.arm_slots(rp.engine, 6, 2)] == [
        {"VLLM_CPU_OMP_THREADS_BIND": "2"},
        {"VLLM_CPU_OMP_THREADS_BIND": "5"},
    ]
    assert [s.env for s in plan.arm_slots(rp.engine, 6, 1)] == [{}]  # one at a time: no binding
