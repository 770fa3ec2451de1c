"""Connectors beneath vLLM's GPU prefix cache, and vLLM's own KV offloading as vLLM ships it.

An LMCache connector arm runs with the GPU prefix cache off (every hit is then the connector's). vLLM's offloading
connectors sit beneath the GPU prefix cache: vLLM ships them with it on (`--kv-offloading-size N` turns neither
off), so the kit runs them that way, counts the connector's own hits (vLLM's vllm:external_prefix_cache_hits), and
makes the connector serve by resetting the GPU prefix cache before each reuse while the connector's tier stays
(repro.engine.child). A reuse the GPU cache alone served is "connector not exercised", never a PASS of it.

`--kv-offloading-size GiB` spells out what vLLM's VllmConfig._post_init_kv_transfer_config does with the same flag
(vLLM 0.26 and 0.28): OffloadingConnector, or SimpleCPUOffloadConnector when VLLM_USE_SIMPLE_KV_OFFLOAD=1, with
kv_connector_extra_config {"cpu_bytes_to_use": GiB * 2**30} and kv_role kv_both. The kit passes the spelled-out
kv_transfer_config (the KV audit wraps the connector it names), and records what it stands for (`shipped_as`).
"""

from __future__ import annotations

from collections.abc import Mapping

from repro.contract.job import GPU_CACHE_RESETS, ConnectorSpec
from repro.errors import UsageError

OFFLOADING = "OffloadingConnector"
SIMPLE_OFFLOADING = "SimpleCPUOffloadConnector"
# vLLM's switch between the two (vllm/envs.py VLLM_USE_SIMPLE_KV_OFFLOAD)
SIMPLE_ENV = "VLLM_USE_SIMPLE_KV_OFFLOAD"
BACKENDS = {"native": OFFLOADING, "simple": SIMPLE_OFFLOADING}
# Connectors that sit beneath the GPU prefix cache: their arm runs with it on unless a fixture says otherwise.
BENEATH_GPU_CACHE = (OFFLOADING, SIMPLE_OFFLOADING)
# Connectors whose workers refuse vLLM's CPU backend (CUDA or XPU only: CPUOffloadingSpec.get_worker, and
# SimpleCPUOffload's torch.cuda streams).
GPU_ONLY = (OFFLOADING, SIMPLE_OFFLOADING)


def simple_from_env(environ: Mapping[str, str]) -> bool:
    """Whether vLLM would pick SimpleCPUOffloadConnector for --kv-offloading-size (its env flag, read as vLLM does:
    "1" or "true")."""
    return environ.get(SIMPLE_ENV, "").strip().lower() in ("1", "true")


def size_problem(size_gib: object) -> str | None:
    """Why a --kv-offloading-size (or a fixture arm's kv_offloading_size) is not a size, or None."""
    if isinstance(size_gib, bool) or not isinstance(size_gib, (int, float)) or not size_gib > 0:
        return f"must be a positive number of GiB, not {size_gib!r}"
    if size_gib > 4096:
        return f"{size_gib!r} GiB is more than any host holds (the size is in GiB)"
    return None


def offloading_connector(size_gib: float, backend: str, reset: str = "before-reuse") -> ConnectorSpec:
    """The connector vLLM makes of `--kv-offloading-size size_gib` (backend "native", or "simple": with
    VLLM_USE_SIMPLE_KV_OFFLOAD=1), beneath the GPU prefix cache."""
    name = BACKENDS[backend]
    shipped = f"--kv-offloading-size {size_gib:g}" + (f" with {SIMPLE_ENV}=1" if backend == "simple" else "")
    return ConnectorSpec(
        name,
        None,
        {"cpu_bytes_to_use": int(size_gib * 2**30)},
        gpu_prefix_cache=True,
        gpu_cache_reset=reset,
        shipped_as=shipped,
    )


def beneath_gpu_cache(name: str) -> bool:
    return name in BENEATH_GPU_CACHE


def reset_problem(value: object) -> str | None:
    if value not in GPU_CACHE_RESETS:
        return f"must be one of {', '.join(GPU_CACHE_RESETS)}, not {value!r}"
    return None


def gpu_only_problem(connector: str, device_is_cpu: bool) -> str | None:
    """Why a connector cannot run on this device, or None."""
    if device_is_cpu and connector in GPU_ONLY:
        return f"{connector} runs only on CUDA or XPU GPUs (vLLM's CPU backend refuses it); this run is on the CPU"
    return None


def fixture_arm(obj: dict, where: str):
    """A fixture arm written as vLLM ships its offloading ({"kv_offloading_size": GiB, "kv_offloading_backend":
    "native"|"simple"}): the connector vLLM makes of it, or None for a connector arm; a problem is a UsageError
    (the fixture's reader adds its path)."""
    if "kv_offloading_size" not in obj:
        if "kv_offloading_backend" in obj:
            raise UsageError(f"{where}.kv_offloading_backend: needs kv_offloading_size")
        return None
    if "connector" in obj or "extra_config" in obj:
        raise UsageError(
            f"{where}: kv_offloading_size names vLLM's offloading connector; drop connector and extra_config"
        )
    size = obj["kv_offloading_size"]
    if (problem := size_problem(size)) is not None:
        raise UsageError(f"{where}.kv_offloading_size: {problem}")
    backend = obj.get("kv_offloading_backend", "native")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise UsageError(f"{where}.kv_offloading_backend: must be one of {', '.join(BACKENDS)}")
    return offloading_connector(size, backend)
