"""The planted-fault connector against vLLM's real CPU KV layout: what it stores, and what swap_kv swaps."""

from __future__ import annotations

import os

import pytest
from conftest import have_vllm
from e2e_runs import shared_run

from repro.detection import plan
from repro.plan.settings import engine_layout_env
from repro.run.runner import child_env, run_arm

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]


def _stored_blocks(model: str, work) -> list:
    """One faithful arm (fault none): the engine stores real KV blocks; the reuse must match the cold run. Another
    prompt is sent whole between them (ProbeJob.between, as the detection study's after-another rows do): the reuse
    is then given the blocks it freed, and a faithful load must still give the cold request's answer."""
    conn = plan.planted_connector(work, "none", "none", {})
    job = plan.arm_job("layout-none", "connector", conn, model, [("alpha", 389, 2)], max_tokens=8, between=True)
    out = run_arm(
        job,
        workdir=work,
        log_path=work / "arm.log",
        env=child_env(dict(os.environ), hashseed="0", extra=engine_layout_env("one-process")),  # the kit's CPU layout
        timeout_s=900,
    )
    assert out.failure is None, out.failure
    cold, reuse = out.result.probes[0].requests
    assert reuse.cached_tokens == 384 and reuse.token_ids == cold.token_ids
    (between,) = out.result.effective_config["between_requests"]  # sent once, before the one reuse, and kept
    _, length = plan.BETWEEN["alpha"]
    assert (between["probe"], between["reuse"], between["role"], len(between["prompt_token_ids"])) == (
        "alpha", 1, "between", length)  # fmt: skip
    assert len(between["token_ids"]) == 8 and between["cached_tokens"] == 0  # never stored before: a cold prefill
    return sorted((work / "none.store").glob("*.pt"))


# one engine: made ahead by the tests' lane (tests/e2e_runs.py), in its thread as the kit runs arms
stored_blocks = shared_run("stored_blocks", _stored_blocks, lane=True)


def test_each_head_holds_k_rows_then_v_rows(stored_blocks):
    """Qwen3's k_norm (weight 1 in the tiny model) gives every cached K vector a mean square of
    exactly 1, and RoPE (a rotation) keeps it; V has no such constraint. So, per head, the mean
    square over the block's K region is 1 whatever order the kernel keeps inside it. In the
    (heads, 2*block_size, head_size) view that region is the first block_size rows."""
    import torch

    for path in stored_blocks[:4]:
        blob = torch.load(path)  # [layers, kv_heads, block_size, 2*head_size]
        layers, heads, block, two_d = blob.shape
        rows = blob.reshape(layers, heads, 2 * block, two_d // 2)
        k_ms, v_ms = rows[:, :, :block].pow(2).mean((-1, -2)), rows[:, :, block:].pow(2).mean((-1, -2))
        assert torch.allclose(k_ms, torch.ones_like(k_ms), atol=1e-4), k_ms
        assert not torch.allclose(v_ms, torch.ones_like(v_ms), atol=1e-2), v_ms
        # the first half of the last dimension is not the K region: it mixes K and V rows
        naive = blob[..., : two_d // 2].pow(2).mean((-1, -2))
        assert not torch.allclose(naive, torch.ones_like(naive), atol=1e-2), naive


def test_swap_kv_exchanges_k_and_v(stored_blocks):
    import types

    import torch

    from repro.engine.connectors.planted_fault import PlantedFaultConnector

    blob = torch.load(stored_blocks[0])
    swapped = PlantedFaultConnector._corrupt(types.SimpleNamespace(fault="swap_kv"), blob, 0)
    layers, heads, block, two_d = blob.shape
    a = blob.reshape(layers, heads, 2 * block, two_d // 2)
    b = swapped.reshape(layers, heads, 2 * block, two_d // 2)
    assert torch.equal(b[:, :, :block], a[:, :, block:]) and torch.equal(b[:, :, block:], a[:, :, :block])
