"""PlantedKeyConnector: PlantedFaultConnector's store, faithful by default (fault "none"), whose block keys either
leave the request's LoRA adapter out or hold it. A positive control for key-identity probes (repro.plan.adapters).

Configure through `kv_connector_extra_config`, beside PlantedFaultConnector's settings (store_dir, fault, gates):
  key   "tokens" (the default): a block's key is its prompt's tokens alone, as vLLM's ExampleConnector keys its
        files. The planted fault: the KV a prompt was computed with under adapter A is served to the same tokens
        under adapter B, whose answer is then computed on A's KV.
        "tokens+adapter": the key also holds the request's adapter (lora_name, lora_int_id and the adapter's
        path): KV is served only to the adapter that computed it, a reload under the same name and id from
        another folder included. The control that must pass where "tokens" fails.
"""

from __future__ import annotations

from repro.engine.connectors.planted_fault import PlantedFaultConnector

KEYS = ("tokens", "tokens+adapter")


class PlantedKeyConnector(PlantedFaultConnector):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        self.key = str((extra or {}).get("key", "tokens"))
        if self.key not in KEYS:  # before the store is set up: a bad setting stops the engine at once
            raise ValueError(f"unknown planted key {self.key!r}; choose one of {', '.join(KEYS)}")
        if extra is not None:
            extra.setdefault("fault", "none")  # a faithful store: only the key is planted
        super().__init__(vllm_config, role, kv_cache_config)

    def _salt(self, request) -> str:
        lora = getattr(request, "lora_request", None)
        if self.key == "tokens" or lora is None:
            return ""
        return "\0".join(("lora", str(lora.lora_name), str(lora.lora_int_id), str(lora.lora_path)))
