"""A connector that loads asynchronously, the way LMCache's maintained MP connector does: it answers
get_num_new_matched_tokens with (n, True), vLLM parks the request in WAITING_FOR_REMOTE_KVS, the
worker copies the stored KV in start_load_kv of a step that computes nothing for the request, and
reports the load finished through get_finished one step later; only then does the scheduler promote
the request and prefill the rest. Storage is vLLM's ExampleConnector's (safetensors on disk, one
file per layer per prompt), so the stored KV is the cold prefill's, byte for byte.

A planted fault, from kv_connector_extra_config, applied after the copy to every layer (K and V):
  fault        "none" (default), "zero" (block fault_block zeroed) or "swap" (blocks fault_block
               and fault_block + 1 exchanged)
  fault_block  index among the request's loaded blocks (default 2)
  fault_loads  which loads to fault, numbered 0, 1, ... in the order this worker runs them
               (default: every load), so that one run has clean and faulted reuses side by side
"""

from __future__ import annotations

from dataclasses import dataclass, field

import safetensors.torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
    ReqMeta,
)

FAULTS = ("none", "zero", "swap")


@dataclass
class AsyncLoadMetadata(ExampleConnectorMetadata):
    loads: list = field(default_factory=list)  # (req_id, ReqMeta): loads to start in this step


class AsyncLoadConnector(ExampleConnector):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        cfg = self._kv_transfer_config
        self.fault = str(cfg.get_from_extra_config("fault", "none"))
        if self.fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, not {self.fault!r}")
        self.fault_block = int(cfg.get_from_extra_config("fault_block", 2))
        loads = cfg.get_from_extra_config("fault_loads", None)
        self.fault_loads = None if loads is None else {int(i) for i in loads}
        self._to_load: dict[str, tuple[list[int], list[int]]] = {}  # scheduler: req_id -> (prompt, block ids)
        self._layers: dict = {}
        self._loads = 0  # worker: loads run so far
        self._loaded_now: set[str] = set()  # worker: loaded in this step, reported in the next
        self._ready: set[str] = set()

    # ---- scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        n, _ = super().get_num_new_matched_tokens(request, num_computed_tokens)
        return (n, True) if n and n > 0 else (0, False)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        # the promotion after the load calls this again with 0: nothing to do then
        if num_external_tokens > 0:
            self._to_load[request.request_id] = (list(request.prompt_token_ids or []), list(blocks.get_block_ids()[0]))

    def build_connector_meta(self, scheduler_output):
        # ExampleConnector's own: stores of new requests (a promoted request is found: no store)
        base = super().build_connector_meta(scheduler_output)
        meta = AsyncLoadMetadata(requests=list(base.requests))
        for req_id, (tokens, block_ids) in self._to_load.items():
            meta.loads.append((req_id, ReqMeta.make_meta(tokens, block_ids, self._block_size, False, [])))
        self._to_load.clear()
        return meta

    # ---- worker side
    def register_kv_caches(self, kv_caches):
        super().register_kv_caches(kv_caches)
        self._layers = dict(kv_caches)

    def start_load_kv(self, forward_context, **kwargs):
        # a step that loads computes nothing for the request (often nothing at all: no attention
        # metadata), so the copy goes straight to the registered KV tensors, not through the layers
        for req_id, req in self._get_connector_metadata().loads:
            self._load(req)
            self._loaded_now.add(req_id)

    def _load(self, req) -> None:
        bs = self._block_size
        block_idx, offsets = req.slot_mapping // bs, req.slot_mapping % bs
        for name, kv in self._layers.items():
            path = self._generate_filename_debug(name, req.token_ids, [])
            kv[block_idx, :, offsets] = safetensors.torch.load_file(path)["kv_cache"].to(kv.device)
        blocks = block_idx[::bs].tolist()
        if self.fault != "none" and (self.fault_loads is None or self._loads in self.fault_loads):
            b = self.fault_block
            for kv in self._layers.values():
                if self.fault == "zero":
                    kv[blocks[b]].zero_()
                else:
                    first = kv[blocks[b]].clone()
                    kv[blocks[b]] = kv[blocks[b + 1]]
                    kv[blocks[b + 1]] = first
        self._loads += 1

    def get_finished(self, finished_req_ids):
        ready, self._ready, self._loaded_now = self._ready, self._loaded_now, set()
        return None, (ready or None)
