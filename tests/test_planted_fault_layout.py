"""The planted-fault connector against vLLM's real CPU KV layout: what it stores, and what swap_kv swaps."""

from __future__ import annotations

import os

import pytest

from conftest import have_vllm
from repro import detection
from repro.runner import child_env, run_arm

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]


@pytest.fixture(scope="module")
def stored_blocks(tiny_model, tmp_path_factory):
    """One faithful arm (fault none): the engine stores real KV blocks; the reuse must match the cold run."""
    work = tmp_path_factory.mktemp("layout")
    conn = detection._planted(work, "none", "none", {})
    job = detection._job("layout-none", "connector", conn, tiny_model, [("alpha", 389, 2)], max_tokens=8)
    out = run_arm(job, workdir=work, log_path=work / "arm.log", env=child_env(dict(os.environ), hashseed="0", extra={}),
                  timeout_s=900)
    assert out.failure is None, out.failure
    cold, reuse = out.result["probes"][0]["requests"]
    assert reuse["cached_tokens"] == 384 and reuse["token_ids"] == cold["token_ids"]
    return sorted((work / "none.store").glob("*.pt"))


def test_each_head_holds_k_rows_then_v_rows(stored_blocks):
    """Qwen3's k_norm (weight 1 in the tiny model) gives every cached K row RMS 1; V rows have no
    such constraint. In the (heads, 2*block_size, head_size) view the first block_size rows are K."""
    import torch

    blob = torch.load(stored_blocks[0])  # [layers, kv_heads, block_size, 2*head_size]
    layers, heads, block, two_d = blob.shape
    rows = blob.reshape(layers, heads, 2 * block, two_d // 2)
    rms = rows.pow(2).mean(-1).sqrt()
    assert torch.allclose(rms[:, :, :block], torch.ones_like(rms[:, :, :block]), atol=1e-3)
    assert not torch.allclose(rms[:, :, block:], torch.ones_like(rms[:, :, block:]), atol=1e-2)
    # the first half of the last dimension is *not* K: halving it mixes K rows of two tokens
    naive_first_half = blob[..., : two_d // 2].pow(2).mean(-1).sqrt()
    assert not torch.allclose(naive_first_half, torch.ones_like(naive_first_half), atol=1e-2)


def test_swap_kv_exchanges_k_and_v(stored_blocks):
    import types

    import torch

    from repro.connectors.planted_fault import PlantedFaultConnector

    blob = torch.load(stored_blocks[0])
    swapped = PlantedFaultConnector._corrupt(types.SimpleNamespace(fault="swap_kv"), blob, 0)
    layers, heads, block, two_d = blob.shape
    a = blob.reshape(layers, heads, 2 * block, two_d // 2)
    b = swapped.reshape(layers, heads, 2 * block, two_d // 2)
    assert torch.equal(b[:, :, :block], a[:, :, block:]) and torch.equal(b[:, :, block:], a[:, :, :block])
