"""A user's own faulty connector, written independently of the kit's planted one: it keeps every
full block of a prompt in one file per prompt prefix and adds noise to the keys and values when
it loads them back. Used to show that --kv-connector-module-path needs no kit change."""

import hashlib
import os
from dataclasses import dataclass, field

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata


@dataclass
class NoisyMeta(KVConnectorMetadata):
    loads: list = field(default_factory=list)  # (path, block_ids)
    stores: list = field(default_factory=list)  # (path, block_ids)


class NoisyReloadConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.dir = self._kv_transfer_config.kv_connector_extra_config["store_dir"]
        self.bs = vllm_config.cache_config.block_size
        os.makedirs(self.dir, exist_ok=True)
        self.pending, self.kv = {}, {}

    def _path(self, tokens, n_blocks):
        digest = hashlib.sha256(repr(list(tokens[: n_blocks * self.bs])).encode()).hexdigest()
        return os.path.join(self.dir, f"{digest}.pt")

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        tokens = list(request.prompt_token_ids)
        n = (len(tokens) - 1) // self.bs
        if n and os.path.exists(self._path(tokens, n)):
            return n * self.bs - num_computed_tokens, False
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if num_external_tokens:
            self.pending[request.request_id] = num_external_tokens

    def build_connector_meta(self, scheduler_output):
        meta = NoisyMeta()
        for req in scheduler_output.scheduled_new_reqs:
            tokens, ids = list(req.prompt_token_ids), list(req.block_ids[0])
            n = (len(tokens) - 1) // self.bs
            if self.pending.pop(req.req_id, 0):
                meta.loads.append((self._path(tokens, n), ids[:n]))
            elif n and not os.path.exists(self._path(tokens, n)):
                meta.stores.append((self._path(tokens, n), ids[:n]))
        return meta

    def register_kv_caches(self, kv_caches):
        self.kv = dict(sorted(kv_caches.items()))

    def start_load_kv(self, forward_context, **kwargs):
        for path, block_ids in self._get_connector_metadata().loads:
            saved = torch.load(path)
            for i, kv in enumerate(self.kv.values()):
                noise = 0.5 * torch.randn(saved[i].shape, generator=torch.Generator().manual_seed(i))
                kv[block_ids] = (saved[i] + noise.to(saved[i].dtype)).to(kv.device)

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        for path, block_ids in self._get_connector_metadata().stores:
            torch.save([kv[block_ids].cpu().clone() for kv in self.kv.values()], path + ".tmp")
            os.replace(path + ".tmp", path)
