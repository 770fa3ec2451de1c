"""What a worker process runs with, read in the worker (where it takes effect) and recorded with each
request by the KV audit: vLLM's batch-invariant flags, the attention backends, the device's compute
capability and PYTHONHASHSEED (the engine child gathers them into its result: repro.engine.facts).
"""

from __future__ import annotations

import os

import torch


def _fact(problems: list[str], what: str, read):
    """One fact of worker_facts, or None with the reason in problems (a fact never fails the audit)."""
    try:
        return read()
    except Exception as exc:  # noqa: BLE001 - a fact that cannot be read is recorded as such
        problems.append(f"{what}: {type(exc).__name__}: {str(exc).strip()[:160]}")
        return None


def _batch_invariant_mode() -> bool:
    """vLLM's own flag, set in this process by init_batch_invariance (the worker's
    init_worker_distributed_environment) once it installed its batch-invariant kernel overrides; its module moved
    in vLLM 0.32 (repro.engine.capabilities.BATCH_INVARIANT_MODULES)."""
    from repro.engine.capabilities import batch_invariant_module

    return bool(batch_invariant_module()._batch_invariant_MODE)


def _attention_layers(vllm_config) -> dict:
    """Layer name -> attention layer, as the model registered them (vLLM's static forward context)."""
    layers = dict(getattr(getattr(vllm_config, "compilation_config", None), "static_forward_context", None) or {})
    if not layers:
        from vllm.forward_context import get_forward_context, is_forward_context_available

        if is_forward_context_available():
            layers = dict(get_forward_context().no_compile_layers or {})
    return {name: layer for name, layer in layers.items() if getattr(layer, "attn_backend", None) is not None}


def _attention_backends(vllm_config) -> list[dict]:
    """The attention backends this worker's layers run, each once: its name and whether vLLM says it
    supports batch invariance."""
    seen: dict[str, dict] = {}
    for layer in _attention_layers(vllm_config).values():
        backend = layer.attn_backend
        name = str(backend.get_name())
        supports = getattr(backend, "supports_batch_invariance", None)
        seen.setdefault(name, {"name": name, "supports_batch_invariance": bool(supports()) if supports else None})
    if not seen:
        raise LookupError("no attention layer registered in the static forward context")
    return [seen[k] for k in sorted(seen)]


def _compute_capability(platform) -> str | None:
    """'9.0' on a CUDA device (ROCm reports its own numbers), None where there is none."""
    if platform.device_type != "cuda" or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(torch.cuda.current_device())
    return f"{major}.{minor}"


def worker_facts(vllm_config) -> dict:
    """What a maintainer asks about the process that ran the model: vLLM's batch-invariant flags, the
    attention backend, the device's compute capability, PYTHONHASHSEED. Read in the worker, where they
    take effect; each fact that cannot be read is None with its reason in `problems`."""
    problems: list[str] = []

    def env_flag() -> bool:
        from vllm import envs

        return bool(envs.VLLM_BATCH_INVARIANT)

    from vllm.platforms import current_platform

    return {
        "pid": os.getpid(),
        "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
        "platform": _fact(problems, "platform", lambda: str(current_platform.device_name)),
        "compute_capability": _fact(problems, "compute capability", lambda: _compute_capability(current_platform)),
        "batch_invariant": {
            "env": _fact(problems, "VLLM_BATCH_INVARIANT", env_flag),
            "mode": _fact(problems, "batch-invariant mode", _batch_invariant_mode),
        },
        "attention_backends": _fact(problems, "attention backend", lambda: _attention_backends(vllm_config)),
        "problems": problems,
    }
