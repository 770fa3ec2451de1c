"""vLLM's own offloading as vLLM ships it, and connectors beneath the GPU prefix cache, in the plan (issue 36,
item 1): what `--kv-offloading-size` and a fixture's kv_offloading_size arm become, which arms run with the GPU
prefix cache on, and the engine arguments each gets. No engine runs here (the CPU refuses these connectors;
tests/test_e2e_beneath_gpu_cache.py runs the same handling with connectors the CPU runs)."""

from __future__ import annotations

import pytest
from conftest import ROOT

from repro.contract.job import ArmSpec, ConnectorSpec, ContractError, EngineConfig, build_job
from repro.engine.engine_args import engine_kwargs
from repro.errors import UsageError
from repro.plan import offloading
from repro.plan.arms import plan_arms
from repro.plan.fixtures import load_fixture, parse_fixture
from repro.plan.settings import ArmsAsked

FIXTURE = load_fixture(ROOT / "fixtures" / "selftest-cpu.json")


def _doc(arms: list) -> dict:
    return {"kind": "kvkit-fixture", "schema_version": 1, "name": "t", "tokenizer": {"name": "x"},
            "probes": [{"name": "p", "prompt": {"token_ids": [1, 2, 3]}}], "arms": arms}  # fmt: skip


def test_the_flag_spells_out_what_vllm_makes_of_it():
    for backend, name in (("native", "OffloadingConnector"), ("simple", "SimpleCPUOffloadConnector")):
        arms = plan_arms(ArmsAsked(None, None, offloading_size=8, offloading_backend=backend), FIXTURE)
        conn = arms[1].spec.connector
        assert arms[1].name == name and conn.name == name and conn.module_path is None
        # vLLM's _post_init_kv_transfer_config: size * 2**30 bytes, the GPU prefix cache left on
        assert conn.extra_config == {"cpu_bytes_to_use": 8 * 2**30}
        assert conn.gpu_prefix_cache is True and conn.gpu_cache_reset == "before-reuse"
        assert conn.shipped_as.startswith("--kv-offloading-size 8")
        assert ("VLLM_USE_SIMPLE_KV_OFFLOAD=1" in conn.shipped_as) == (backend == "simple")
        # the flag replaces the fixture's arms, as --kv-connector does
        assert [a.name for a in arms] == ["baseline", name]


def test_vllms_switch_picks_the_simple_connector_as_vllm_reads_it():
    assert offloading.simple_from_env({"VLLM_USE_SIMPLE_KV_OFFLOAD": "1"})
    assert offloading.simple_from_env({"VLLM_USE_SIMPLE_KV_OFFLOAD": "True"})
    assert not offloading.simple_from_env({"VLLM_USE_SIMPLE_KV_OFFLOAD": "0"})
    assert not offloading.simple_from_env({})


def test_a_fixture_arm_written_as_vllm_ships_it():
    fx = parse_fixture(_doc([{"name": "off", "kv_offloading_size": 0.5, "kv_offloading_backend": "simple"}]), "f", "d")
    (arm,) = fx.arms
    assert arm.connector == "SimpleCPUOffloadConnector" and arm.extra_config == {"cpu_bytes_to_use": 2**29}
    planned = plan_arms(ArmsAsked(None, None), fx)[1].spec.connector
    assert planned.gpu_prefix_cache is True and planned.shipped_as.startswith("--kv-offloading-size 0.5")


def test_which_connectors_run_beneath_the_gpu_cache():
    arms = [
        {"name": "lm", "connector": "LMCacheConnectorV1"},
        {"name": "ex", "connector": "ExampleConnector"},
        {"name": "off", "connector": "OffloadingConnector", "extra_config": {"cpu_bytes_to_use": 1}},
        {"name": "ex-on", "connector": "ExampleConnector", "gpu_prefix_cache": True, "gpu_cache_reset": "never"},
        {"name": "off-off", "connector": "OffloadingConnector", "gpu_prefix_cache": False},
    ]
    planned = {
        a.name: a.spec.connector for a in plan_arms(ArmsAsked(None, None), parse_fixture(_doc(arms), "f", "d"))[1:]
    }
    assert [n for n, c in planned.items() if c.gpu_prefix_cache] == ["off", "ex-on"]
    assert planned["off"].gpu_cache_reset == "before-reuse" and planned["ex-on"].gpu_cache_reset == "never"
    # every report before this had the GPU prefix cache off for a connector: the keys appear only when on
    assert "gpu_prefix_cache" not in planned["lm"].to_json() and planned["off"].to_json()["gpu_prefix_cache"] is True
    # a reset asked for where the GPU cache is off is refused, not ignored
    with pytest.raises(UsageError, match="needs the GPU prefix cache on"):
        plan_arms(ArmsAsked(None, None), parse_fixture(_doc([{**arms[1], "gpu_cache_reset": "never"}]), "f", "d"))


def test_the_engine_gets_the_gpu_prefix_cache_for_native_and_connectors_beneath_it():
    engine = EngineConfig("m", None, "float32", 0, 0.1, 2048, 16, "cpu")
    on = ConnectorSpec("OffloadingConnector", None, {"cpu_bytes_to_use": 1}, True, "before-reuse")
    off = ConnectorSpec("LMCacheConnectorV1")
    for spec, want in ((ArmSpec("b", "baseline"), False), (ArmSpec("n", "native"), True),
                       (ArmSpec("c", "connector", off), False), (ArmSpec("o", "connector", on), True)):  # fmt: skip
        kwargs = engine_kwargs(build_job(spec, engine, [], max_tokens=4, logprobs=2))
        assert kwargs["enable_prefix_caching"] is want, spec.name
    ktc = engine_kwargs(build_job(ArmSpec("o", "connector", on), engine, [], max_tokens=4, logprobs=2))[
        "kv_transfer_config"
    ]
    assert ktc.kv_connector == "OffloadingConnector" and ktc.kv_connector_extra_config == {"cpu_bytes_to_use": 1}


def test_the_connector_spec_round_trips_and_refuses_a_reset_without_the_cache():
    on = ConnectorSpec("OffloadingConnector", None, {"cpu_bytes_to_use": 1}, True, "never", "--kv-offloading-size 1")
    assert ConnectorSpec.from_json(on.to_json()) == on
    assert ConnectorSpec.from_json(ConnectorSpec("X").to_json()) == ConnectorSpec("X")
    with pytest.raises(ContractError):
        ConnectorSpec("X", gpu_cache_reset="never")
    with pytest.raises(ContractError):
        ConnectorSpec("X", gpu_prefix_cache=True, gpu_cache_reset="sometimes")


def test_the_connectors_count_comes_from_the_audits_record_before_vllms_counter():
    from repro.engine.outputs import connector_tokens

    # the scheduler's num_external_tokens as the KV audit recorded it wins: on vLLM 0.26 (H200) the counter
    # stayed at 0 while every reuse was loaded by OffloadingConnector
    assert connector_tokens({"external_tokens": 1488}, 10, 10) == 1488
    assert connector_tokens({"external_tokens": 0}, 0, 1488) == 0
    # no audit record (--no-kv-audit) or none for this request: the counter's difference, else nothing
    assert connector_tokens(None, 100, 1588) == 1488
    assert connector_tokens({"seq": None, "unavailable": "x"}, 5, 5) == 0
    assert connector_tokens(None, None, 7) is None and connector_tokens({"external_tokens": True}, None, None) is None
