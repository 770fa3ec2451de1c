"""Child side: the cheap checks that need vLLM imported, made before any engine is built.

The first arm's engine child (repro.engine) calls run_preflight for every arm's connector: each
must resolve the way vLLM will resolve it (an importable module that has the class, or a name in
vLLM's connector registry whose module loads), --device must match vLLM's platform, and with
--batch-invariant (VLLM_BATCH_INVARIANT=1 in the children's environment) the device must be one
vLLM has batch-invariant kernels for. The parent turns the problems into a one-line usage error
(exit 2).
"""

from __future__ import annotations

import importlib
import os

from repro.contract.job import Preflight
from repro.judge.batch_invariance import batch_invariant_device_problem
from repro.record.provenance import package_version

BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"  # what --batch-invariant sets for every child (repro.verify)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def check_connector(conn: dict, factory) -> str | None:
    """Why the connector named in conn cannot be loaded, or None when it can."""
    where, name, module_path = f"arm {conn['arm']}", conn["name"], conn.get("module_path")
    if module_path:
        try:
            module = importlib.import_module(module_path)
        except BaseException as exc:  # noqa: BLE001 - any import-time failure (SyntaxError, SystemExit, ...) is the user's
            return f"{where}: connector module {module_path!r} does not import ({_first_line(exc)})"
        if not isinstance(getattr(module, name, None), type):
            return f"{where}: connector module {module_path!r} has no class {name!r}"
        return None
    known = sorted(factory._registry)
    if name not in known:
        return (
            f"{where}: unknown connector {name!r} (vLLM {package_version('vllm')} knows {', '.join(known)}; "
            "for your own class add --kv-connector-module-path)"
        )
    try:
        factory.get_connector_class_by_name(name)
    except BaseException as exc:  # noqa: BLE001 - e.g. LMCacheConnectorV1 without lmcache installed
        return f"{where}: connector {name!r} is registered in vLLM but does not load ({_first_line(exc)})"
    return None


def check_device(device: str, platform_type: str) -> str | None:
    if device == "auto" or device == platform_type:
        return None
    return f"--device {device}: this machine's vLLM runs on {platform_type!r} (use --device {platform_type} or auto)"


def batch_invariant_requested(environ) -> bool:
    """vLLM's own reading of VLLM_BATCH_INVARIANT (an integer, 0 off); what is not an integer is not on."""
    value = str(environ.get(BATCH_INVARIANT_ENV, "0")).strip()
    return value.lstrip("+-").isdigit() and int(value) != 0


def check_batch_invariant(requested: bool, platform_name: str, capability: tuple[int, int] | None) -> str | None:
    """Why --batch-invariant cannot run on this machine's vLLM platform and device, or None."""
    if not requested:
        return None
    problem = batch_invariant_device_problem(platform_name, capability)
    return f"--batch-invariant: {problem}" if problem else None


def _capability(platform) -> tuple[int, int] | None:
    """The first visible GPU's compute capability as vLLM reads it (NVML on CUDA: no CUDA context)."""
    try:
        cap = platform.get_device_capability()
    except Exception:  # noqa: BLE001 - unreadable is reported as such by check_batch_invariant
        return None
    return None if cap is None else (int(cap.major), int(cap.minor))


def run_preflight(spec: Preflight) -> list[str]:
    """Every problem with spec's connectors and device, each naming the flag or arm."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.platforms import current_platform

    platform_type = str(current_platform.device_type)
    problems = [p for p in [check_device(spec.device, platform_type)] if p]
    if batch_invariant_requested(os.environ):
        name = str(current_platform.device_name)
        problem = check_batch_invariant(True, name, _capability(current_platform) if name == "cuda" else None)
        problems += [problem] if problem else []
    return problems + [p for p in (check_connector(c.to_json(), KVConnectorFactory) for c in spec.connectors) if p]
