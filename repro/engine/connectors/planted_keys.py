"""PlantedKeyConnector: PlantedFaultConnector's store, faithful by default (fault "none"), whose block keys either
leave what else shapes a request's KV out (its LoRA adapter, its images) or hold it. A positive control for
key-identity probes (repro.plan.adapters, repro.plan.images).

Configure through `kv_connector_extra_config`, beside PlantedFaultConnector's settings (store_dir, fault, gates):
  key   "tokens" (the default): a block's key is its prompt's tokens alone, as vLLM's ExampleConnector keys its
        files. The planted fault: the KV a prompt was computed with under adapter A (or with image A) is served to
        the same tokens under adapter B (or with image B, whose placeholder tokens are the same), whose answer is
        then computed on A's KV.
        "tokens+adapter": the key also holds the request's adapter (lora_name, lora_int_id and the adapter's
        path): KV is served only to the adapter that computed it, a reload under the same name and id from
        another folder included. The control that must pass where "tokens" fails.
        "tokens+image": the key also holds the identifiers of the request's images (its mm_features, the hashes
        vLLM keys its own blocks on): the image control.
        "tokens+image16": the key holds each identifier's low 16 bits alone, as LMCache 0.5.4 writes
        hex_hash_to_int16 of it over the image's placeholder tokens (repro.plan.images.int16): two images whose
        identifiers collide there share KV.
"""

from __future__ import annotations

from repro.engine.connectors.planted_fault import PlantedFaultConnector
from repro.plan.images import int16

KEYS = ("tokens", "tokens+adapter", "tokens+image", "tokens+image16")


def image_ids(request) -> list[str]:
    """The identifiers of a request's images, in prompt order (vLLM 0.28's Request.mm_features)."""
    features = getattr(request, "mm_features", None) or ()
    return [str(f.identifier) for f in sorted(features, key=lambda f: f.mm_position.offset)]


def salt(key: str, lora, images: list[str]) -> str:
    """What a block's key holds besides its tokens under each key setting."""
    if key == "tokens+adapter" and lora is not None:
        return "\0".join(("lora", str(lora.lora_name), str(lora.lora_int_id), str(lora.lora_path)))
    if key == "tokens+image" and images:
        return "\0".join(("image", *images))
    if key == "tokens+image16" and images:
        return "\0".join(("image16", *(str(int16(i)) for i in images)))
    return ""


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
        return salt(self.key, getattr(request, "lora_request", None), image_ids(request))
