"""A user's own connector with a subtle load bug, written independently of the kit: it extends
vLLM's in-tree ExampleConnector and, after each load, rescales the third loaded block of every
layer by 1.001 (a 0.1 % error, the size of a wrong scale factor in a quantized or mixed-precision
copy). Small enough to leave a short greedy answer unchanged; the KV audit must still blame that
block. Used to show that the audit needs no cooperation from a connector loaded by module path."""

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector

BAD_BLOCK = 2  # index among the request's loaded blocks
SCALE = 1.001


class ScaledBlockConnector(ExampleConnector):
    def register_kv_caches(self, kv_caches):
        super().register_kv_caches(kv_caches)
        self._layers = dict(kv_caches)

    def start_load_kv(self, forward_context, **kwargs):
        super().start_load_kv(forward_context, **kwargs)
        for request in self._get_connector_metadata().requests:
            if request.is_store:
                continue
            blocks = (request.slot_mapping[:: self._block_size] // self._block_size).tolist()
            if len(blocks) > BAD_BLOCK:
                for kv in self._layers.values():
                    kv[blocks[BAD_BLOCK]] *= torch.tensor(SCALE, dtype=kv.dtype)
