"""How the KV audit reads blocks: the layouts K and V sit in, one block's K and V planes, layers in
model order, and the prompt hash that names a request in the audit's records.
"""

from __future__ import annotations

import re

import torch

from repro.record.child_io import prompt_sha256  # noqa: F401 - the audit's name for a request, here too

# How K and V sit in a layer's KV tensor (blocks on dim 0 unless said otherwise):
#   cpu-rows   (num_blocks, kv_heads, block_size, 2*head_size), per head all K rows then all V rows
#              (vLLM's CPU backend views it as (num_blocks, kv_heads, 2*block_size, head_size))
#   last-dim   (num_blocks, kv_heads, block_size, 2*head_size), K|V packed in the last dimension
#              (FlashAttention / FlashInfer since vLLM 0.26)
#   leading-2  (2, num_blocks, ...), K and V as the first dimension (older backends)
LAYOUTS = ("cpu-rows", "last-dim", "leading-2")


def layer_order(name: str) -> tuple:
    """Model order for layer names: 'layers.10' after 'layers.9' (plain sorting would not)."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def detect_layout(kv: torch.Tensor, num_blocks: int | None, head_size: int) -> str | None:
    shape = tuple(kv.shape)
    if len(shape) == 4 and shape[-1] == 2 * head_size and (num_blocks is None or shape[0] == num_blocks):
        return "cpu-rows" if kv.device.type == "cpu" else "last-dim"
    if len(shape) >= 3 and shape[0] == 2 and (num_blocks is None or shape[1] == num_blocks):
        return "leading-2"
    return None


def split_planes(kv: torch.Tensor, block_ids: list[int], layout: str) -> torch.Tensor:
    """[n_blocks, 2, elements] on the CPU: plane 0 K, plane 1 V, each block copied whole."""
    index = torch.tensor(block_ids, dtype=torch.long, device=kv.device)
    if layout == "leading-2":
        blocks = kv.index_select(1, index).transpose(0, 1)  # [n, 2, ...]
        return blocks.reshape(len(block_ids), 2, -1).cpu()
    blocks = kv.index_select(0, index)  # [n, heads, block_size, 2*head_size]
    n, heads, bs, cs = blocks.shape
    if layout == "cpu-rows":
        planes = blocks.reshape(n, heads, 2, bs * cs // 2).transpose(1, 2)
    else:  # last-dim
        planes = blocks.reshape(n, heads, bs, 2, cs // 2).permute(0, 3, 1, 2, 4)
    return planes.reshape(n, 2, -1).cpu()
