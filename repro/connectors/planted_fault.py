"""PlantedFaultConnector: stores KV faithfully, corrupts it on load, and says it loaded it all.

A positive control for the verifier. It behaves like a working external KV cache (block-granular
prefix keys, counted hits, `kv_transfer_params` saying how many tokens were loaded) while the
load path applies one configured fault. Blocks are copied whole (`kv[block_id]`), so the fault is
independent of the backend's within-block layout.

Configure through `kv_connector_extra_config`:
  store_dir    directory for stored blocks (a fresh one per arm; the runner makes it)
  fault        none | zero_blocks | shift_blocks | stale | swap_kv | corrupt_layer |
               overwrite_tail | drop_tail
  first_block  first loaded block the fault touches (default 0)
  num_blocks   how many blocks it touches (default 16, i.e. 256 tokens at block size 16)
  layer        layer index for corrupt_layer (default 0)
  scale        magnitude of the noise for corrupt_layer / overwrite_tail (default 1.0)
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

FAULTS = ("none", "zero_blocks", "shift_blocks", "stale", "swap_kv", "corrupt_layer", "overwrite_tail", "drop_tail")


@dataclass
class _Op:
    req_id: str
    kind: str  # "store" | "load"
    keys: list[str]
    block_ids: list[int]
    first_loaded_block: int = 0  # index of keys[0] within the prompt's blocks


@dataclass
class PlantedFaultMetadata(KVConnectorMetadata):
    ops: list[_Op] = field(default_factory=list)


class PlantedFaultConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        if "store_dir" not in extra:
            raise ValueError("PlantedFaultConnector needs kv_connector_extra_config.store_dir")
        self.store_dir = str(extra["store_dir"])
        self.fault = str(extra.get("fault", "zero_blocks"))
        if self.fault not in FAULTS:
            raise ValueError(f"unknown planted fault {self.fault!r}; choose one of {', '.join(FAULTS)}")
        self.first_block = int(extra.get("first_block", 0))
        self.num_blocks = int(extra.get("num_blocks", 16))
        self.layer = int(extra.get("layer", 0))
        self.scale = float(extra.get("scale", 1.0))
        self.block_size = vllm_config.cache_config.block_size
        os.makedirs(self.store_dir, exist_ok=True)
        self._external: dict[str, int] = {}
        self._loaded: dict[str, int] = {}
        self._kv: dict[str, torch.Tensor] = {}

    # ---- shared helpers
    def _keys(self, tokens: list[int], n_blocks: int) -> list[str]:
        """Chained per-block prefix hashes: block i's key covers tokens[: (i+1)*block_size]."""
        h, out = hashlib.sha256(), []
        for i in range(n_blocks):
            h.update(repr(tokens[i * self.block_size:(i + 1) * self.block_size]).encode())
            out.append(h.copy().hexdigest())
        return out

    def _path(self, key: str) -> str:
        return os.path.join(self.store_dir, key + ".pt")

    def _have(self, key: str) -> bool:
        return os.path.exists(self._path(key))

    # ---- scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        tokens = list(request.prompt_token_ids or [])
        hit = 0
        for key in self._keys(tokens, (len(tokens) - 1) // self.block_size):  # never the last prompt token
            if not self._have(key):
                break
            hit += 1
        return max(hit * self.block_size - num_computed_tokens, 0), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            self._external[request.request_id] = num_external_tokens

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = PlantedFaultMetadata()
        for req in scheduler_output.scheduled_new_reqs:
            tokens = list(req.prompt_token_ids or [])
            block_ids = list(req.block_ids[0])
            external = self._external.pop(req.req_id, 0)
            if external:
                local = req.num_computed_tokens - external
                b0, b1 = local // self.block_size, (local + external) // self.block_size
                meta.ops.append(_Op(req.req_id, "load", self._keys(tokens, b1)[b0:], block_ids[b0:b1], b0))
                self._loaded[req.req_id] = external
            else:
                done = min(len(tokens), req.num_computed_tokens + scheduler_output.num_scheduled_tokens[req.req_id])
                n = done // self.block_size
                todo = [(k, b) for k, b in zip(self._keys(tokens, n), block_ids[:n]) if not self._have(k)]
                if todo:
                    meta.ops.append(_Op(req.req_id, "store", [k for k, _ in todo], [b for _, b in todo]))
        return meta

    def request_finished(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        loaded = self._loaded.pop(request.request_id, 0)
        return False, {"planted_fault": {"loaded_tokens": loaded, "fault": self.fault}}

    # ---- worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._kv = dict(sorted(kv_caches.items()))

    def _stale_source(self, key: str) -> str | None:
        """A stored block of some other prompt, for the stale-chunk fault."""
        for name in sorted(os.listdir(self.store_dir)):
            if name.endswith(".pt") and name[:-3] != key:
                return name[:-3]
        return None

    def _fault_applies(self, j: int, n: int) -> bool:
        if self.fault in ("overwrite_tail", "drop_tail"):
            return j >= n - self.num_blocks
        return self.first_block <= j < self.first_block + self.num_blocks

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        layers = list(self._kv.items())
        for op in self._get_connector_metadata().ops:
            if op.kind != "load":
                continue
            blobs = [torch.load(self._path(k)) for k in op.keys]  # each: [num_layers, *block_shape]
            if self.fault == "shift_blocks":
                # off by one block inside the faulted window: block j gets block j+1's KV
                lo, hi = self.first_block, min(self.first_block + self.num_blocks, len(blobs))
                window = blobs[lo:hi]
                blobs[lo:hi] = window[1:] + window[:1]
            for j, (block_id, blob) in enumerate(zip(op.block_ids, blobs)):
                hit = self._fault_applies(j, len(blobs))
                if hit and self.fault == "drop_tail":
                    continue  # counted as loaded, never written
                if hit and self.fault == "stale":
                    other = self._stale_source(op.keys[j])
                    if other is not None:
                        blob = torch.load(self._path(other))
                for li, (_, kv) in enumerate(layers):
                    src = blob[li].to(kv.device)
                    if hit and self.fault == "zero_blocks":
                        src = torch.zeros_like(src)
                    elif hit and self.fault == "swap_kv":
                        half = src.shape[-1] // 2
                        src = torch.cat([src[..., half:], src[..., :half]], dim=-1)
                    elif hit and self.fault == "corrupt_layer" and li == self.layer:
                        g = torch.Generator().manual_seed(j)
                        src = src + self.scale * torch.randn(src.shape, generator=g).to(src.dtype)
                    elif hit and self.fault == "overwrite_tail":
                        g = torch.Generator().manual_seed(1000 + j)
                        src = (self.scale * torch.randn(src.shape, generator=g)).to(src.dtype)
                    kv[block_id].copy_(src)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        return

    def wait_for_save(self) -> None:
        for op in self._get_connector_metadata().ops:
            if op.kind != "store":
                continue
            for key, block_id in zip(op.keys, op.block_ids):
                blob = torch.stack([kv[block_id].detach().cpu().clone() for kv in self._kv.values()])
                tmp = self._path(key) + f".{os.getpid()}.tmp"
                torch.save(blob, tmp)
                os.replace(tmp, self._path(key))  # visible to lookups only once whole
