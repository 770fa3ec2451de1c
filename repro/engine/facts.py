"""What an arm ran with, for its result: the packages' versions, the LMCache wheel's build, the
engine's effective configuration as vLLM reports it, and the facts its processes recorded (each
worker's, through the KV audit, and whether vLLM's batch-invariant kernels were active).
"""

from __future__ import annotations

import json
import os
import platform

from repro.contract.result import ProbeResult, ScenarioResult
from repro.engine.audit_records import AuditRecords
from repro.engine.frontend import frontend_name, vllm_config_of
from repro.engine.preflight import batch_invariant_requested
from repro.judge.batch_invariance import batch_invariance_state
from repro.record.provenance import package_version


def collect_versions() -> dict:
    """What the child runs: Python, torch, vLLM, LMCache and transformers, and the GPUs torch sees."""
    import torch

    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "vllm": package_version("vllm"),
        "lmcache": package_version("lmcache"),
        "transformers": package_version("transformers"),
        "cuda_available": bool(torch.cuda.is_available()),
        "torch_cuda": torch.version.cuda or "none",
    }
    if torch.cuda.is_available():
        out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        out["gpu_capabilities"] = [
            "{}.{}".format(*torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())
        ]
    return out


def lmcache_build() -> dict:
    """The installed LMCache wheel's build, for an LMCache arm: its version, the CUDA runtime its
    compiled ops link and the nvcc that built them (read from lmcache/cuda_ops*.so), and whether
    those ops import in this environment (the worker imports the same file): `copy_path` "compiled"
    or "fallback" (LMCache's torch fallback), `ops_source` "wheel" or "kit build" (with
    `ops_build_dir`; repro.lmcache.ops), `ops_import_error` when they do not import. The wheel records
    no torch build: its metadata requires an unpinned torch, so only the import tells a mismatch."""
    import importlib
    import importlib.util
    import re

    spec = importlib.util.find_spec("lmcache")
    if spec is None or not spec.submodule_search_locations:
        return {"version": None, "problem": "lmcache is not importable"}
    out: dict = {"version": package_version("lmcache"), "torch_build": "not recorded in the wheel"}
    folder = next(iter(spec.submodule_search_locations))
    ops = sorted(n for n in os.listdir(folder) if n.startswith("cuda_ops") and n.endswith(".so"))
    if ops:
        with open(os.path.join(folder, ops[0]), "rb") as fh:
            data = fh.read()
        nvcc = re.search(rb"Cuda compilation tools, release [\d.]+, V([\d.]+)", data)
        out.update(
            cuda_ops_file=ops[0],
            cuda_runtime=sorted({m.decode() for m in re.findall(rb"libcudart\.so\.\d+", data)}),
            nvcc=nvcc.group(1).decode() if nvcc else None,
        )
    else:
        out["cuda_ops_file"] = None
    try:
        module = importlib.import_module("lmcache.cuda_ops")
    except Exception as exc:  # noqa: BLE001 - ImportError (an undefined torch symbol, say) or worse: record it
        first = (str(exc).strip().splitlines() or [""])[0]
        error = f"{type(exc).__name__}: {first[:300]}"
        shipped = f"not loaded: {error}" if ops else "not shipped in this wheel"
        return {**out, "cuda_ops": shipped, "copy_path": "fallback", "ops_source": None, "ops_import_error": error}
    # A kit build is an unpacked source tree beside the kit's manifest (repro.lmcache.ops.MANIFEST_NAME).
    tree = os.path.dirname(os.path.dirname(os.path.abspath(module.__file__ or folder)))
    build_dir = os.path.dirname(tree)
    kit = os.path.isfile(os.path.join(build_dir, "kvkit-lmcache-ops.json"))
    out.update(cuda_ops="loaded", copy_path="compiled", ops_source="kit build" if kit else "wheel")
    if kit:
        out["ops_build_dir"] = build_dir
    return out


def model_runner(cfg) -> str:
    """'v2' or 'v1': which model runner vLLM chose (VllmConfig.use_v2_model_runner; vLLM 0.28 takes v2 by default
    for a dense model where Triton is present, and then sends a request resumed after preemption to the
    connector as new); 'unavailable: ...' where this vLLM does not say."""
    try:
        return "v2" if cfg.use_v2_model_runner else "v1"
    except Exception as exc:  # noqa: BLE001 - an older vLLM without the property
        return f"unavailable: {type(exc).__name__}: {exc}"[:200]


def effective_config(llm) -> dict:
    if hasattr(llm, "endpoint_config"):  # a server the kit did not start: what it says of itself (repro endpoint)
        return llm.endpoint_config()
    cfg = vllm_config_of(llm)
    ktc = cfg.kv_transfer_config
    return {
        "frontend": frontend_name(llm),  # the front end that drove the engine (repro.engine.frontend)
        # the engine's processes (repro.plan.settings.engine_layout_env): its core in this process or its own,
        # and vLLM's executor (uni: the worker in the engine core's process; mp: a process of its own)
        "engine_layout": "vllm" if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0" else "one-process",
        "executor": str(getattr(cfg.parallel_config, "distributed_executor_backend", None)),
        "model": cfg.model_config.model,
        "revision": cfg.model_config.revision,
        "tokenizer": cfg.model_config.tokenizer,
        "dtype": str(cfg.model_config.dtype).replace("torch.", ""),
        "max_model_len": cfg.model_config.max_model_len,
        "seed": cfg.model_config.seed,
        "enforce_eager": cfg.model_config.enforce_eager,
        "block_size": cfg.cache_config.block_size,
        "enable_prefix_caching": bool(cfg.cache_config.enable_prefix_caching),
        "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
        "max_num_seqs": cfg.scheduler_config.max_num_seqs,
        # with a consumer connector, async scheduling defers block frees (repro.engine.kvaudit.OBSERVER_ROLE)
        "async_scheduling": getattr(cfg.scheduler_config, "async_scheduling", None),
        "kv_cache_memory_bytes": getattr(cfg.cache_config, "kv_cache_memory_bytes", None),
        # the KV cache's blocks as the engine sized them (a scenario's pool; None where vLLM does not say)
        "num_gpu_blocks": getattr(cfg.cache_config, "num_gpu_blocks", None),
        "kv_transfer_config": None
        if ktc is None
        else {
            "kv_connector": ktc.kv_connector,
            "kv_role": ktc.kv_role,
            "kv_connector_module_path": ktc.kv_connector_module_path,
            "kv_connector_extra_config": json.loads(json.dumps(ktc.kv_connector_extra_config, default=str)),
        },
        "device_type": str(cfg.device_config.device_type) if getattr(cfg, "device_config", None) else "unavailable",
        "model_runner": model_runner(cfg),
        # the connector the KV audit wrapped (kv_connector then names the audit's class)
        "kv_audit_target": os.environ.get("KVKIT_KV_AUDIT_TARGET"),
        "speculative_config": speculative_facts(getattr(cfg, "speculative_config", None)),
    }


def speculative_facts(spec) -> dict | None:
    """The engine's speculative decoding as it took it (None: off): method, tokens drafted a step, draft model."""
    if spec is None:
        return None
    return {
        "method": str(getattr(spec, "method", None)),
        "num_speculative_tokens": getattr(spec, "num_speculative_tokens", None),
        "model": getattr(spec, "model", None),
    }


def process_facts(probes: list[ProbeResult], audit: AuditRecords, scenario: ScenarioResult | None = None) -> dict:
    """What the arm's processes ran with, for its effective_config: each worker's facts as the KV audit
    recorded them (repro.engine.worker_facts; one entry per worker process), whether vLLM's
    batch-invariant kernels were asked for and active in every worker (repro.judge.batch_invariance decides), and
    this child's PYTHONHASHSEED (the workers' are in their facts)."""
    records = [r.kv_audit_record for p in probes for r in p.requests] + [p["record"] for p in audit.primes]
    records += [r.request.kv_audit_record for r in (scenario.requests if scenario else ())]
    workers: dict[str, dict] = {}
    for record in records:
        worker = (record or {}).get("worker")
        if isinstance(worker, dict):
            workers.setdefault(json.dumps(worker, sort_keys=True), worker)
    found = sorted(workers.values(), key=lambda w: (str(w.get("pid")), json.dumps(w, sort_keys=True)))
    state = batch_invariance_state(found)
    reasons = state.reasons if audit.directory else ("the KV audit is off: no worker recorded its facts",)
    return {
        "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
        "workers": found if audit.directory else None,
        "batch_invariant": {
            "requested": batch_invariant_requested(os.environ),
            "active": state.active,
            "reasons": list(reasons),
        },
    }
