"""The engine a job's arm builds: vLLM's keyword arguments, the arm's connector (wrapped by the KV
audit when the job asks for it) and a KV cache sized in tokens where arms share a GPU.
"""

from __future__ import annotations

from repro.contract.job import MULTI_CONNECTOR, Job
from repro.engine.adapters import lora_kwargs
from repro.engine.images import mm_kwargs

_DTYPE_BYTES = {"float16": 2, "half": 2, "bfloat16": 2, "float32": 4, "float": 4}


def kv_bytes_per_token(model: str, revision: str | None, dtype: str) -> int:
    """Bytes of K and V one token takes over all layers, from the model's config (full attention,
    the KV cache in the model's dtype): what a KV cache of N tokens costs in kv_cache_memory_bytes."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model, revision=revision)
    cfg = getattr(cfg, "text_config", None) or cfg
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    if dtype == "auto":
        dtype = str(getattr(cfg, "torch_dtype", None) or getattr(cfg, "dtype", None) or "float16")
    size = _DTYPE_BYTES.get(dtype.replace("torch.", ""), 2)
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * size


def engine_kwargs(job: Job) -> dict:
    """vLLM's keyword arguments for the job's engine: the same for every arm of a run but for the arm's own
    settings (prefix caching for native, its connector, the KV audit's connector when the job audits)."""
    e, arm = job.engine, job.arm
    if e.kv_unified is not None:  # a scenario's setting for llama-server: never dropped and run as if
        raise ValueError(f"kv_unified {e.kv_unified} is llama-server's --kv-unified: vLLM has no such setting")
    kwargs = {
        "model": e.model,
        "tokenizer": e.model,
        "revision": e.revision,
        "dtype": e.dtype,
        "seed": e.seed,
        "enforce_eager": True,
        "gpu_memory_utilization": e.gpu_memory_utilization,
        "max_model_len": e.max_model_len,
        "block_size": e.block_size,
        # The whole prompt is prefilled in one step: connectors such as ExampleConnector store
        # only on a request's first scheduling step.
        "max_num_batched_tokens": e.max_num_batched_tokens or max(e.max_model_len, 2048),
        # one request at a time, but for a scenario's requests in flight together (repro.run.scenarios)
        "max_num_seqs": e.max_num_seqs or 1,
        # native, and a connector beneath the GPU prefix cache (repro.plan.offloading); any other arm's hits are
        # the connector's alone
        "enable_prefix_caching": arm.mode == "native" or bool(arm.connector and arm.connector.gpu_prefix_cache),
        "disable_log_stats": False,
    }
    if e.long_prefill_token_threshold is not None:  # a load scenario's: prefills over several steps
        kwargs["long_prefill_token_threshold"] = e.long_prefill_token_threshold
    kwargs.update(lora_kwargs(e))  # probes under LoRA adapters (repro.engine.adapters); nothing otherwise
    kwargs.update(mm_kwargs(job))  # probes with images (repro.engine.images); nothing otherwise
    if e.async_scheduling is not None:  # a scenario's engine; else vLLM's default (on for CUDA, off on the CPU)
        kwargs["async_scheduling"] = e.async_scheduling
    if e.speculative_config is not None:  # --speculative-config, every arm alike (repro.plan.speculative)
        kwargs["speculative_config"] = e.speculative_kwargs()
    if e.kv_cache_tokens:
        kwargs["kv_cache_memory_bytes"] = e.kv_cache_tokens * kv_bytes_per_token(e.model, e.revision, e.dtype)
    ktc = None
    if arm.connector is not None:
        ktc = {
            "kv_connector": arm.connector.name,
            "kv_role": "kv_both",
            "kv_connector_extra_config": dict(arm.connector.extra_config),
        }
        if arm.connector.module_path:
            ktc["kv_connector_module_path"] = arm.connector.module_path
    if job.kv_audit_dir:
        from repro.engine import kvaudit

        if ktc is None:  # baseline and native: a connector that only records
            ktc = {"kv_connector": kvaudit.OBSERVER, "kv_role": kvaudit.OBSERVER_ROLE}
        else:  # the arm's connector, wrapped in the auditing subclass (see repro.engine.kvaudit)
            if arm.connector.name == MULTI_CONNECTOR and not _members_support_hma(ktc):
                # vLLM turns the hybrid KV cache manager off for a MultiConnector whose members lack HMA by its name
                # (KVConnectorFactory.supports_hma_config); under the audit's class name it would keep it on and
                # MultiConnector's own assertion would stop the engine: the kit does what vLLM does unaudited
                kwargs["disable_hybrid_kv_cache_manager"] = True
            ktc["kv_connector"] = kvaudit.WRAPPED
        ktc["kv_connector_module_path"] = kvaudit.MODULE
    if ktc is not None:
        from vllm.config import KVTransferConfig

        kwargs["kv_transfer_config"] = KVTransferConfig(**ktc)
    return kwargs


def _members_support_hma(ktc: dict) -> bool:
    """Whether every member of a MultiConnector's kv_transfer_config supports the hybrid KV cache manager."""
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector

    return MultiConnector.all_children_support_hma(KVTransferConfig(**ktc))
