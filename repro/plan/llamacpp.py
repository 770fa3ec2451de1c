"""The verifier's --engine llamacpp: what it checks before any arm starts (one line each, exit 2), without importing
llama.cpp in the parent. Standard library only."""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

from repro.errors import UsageError

ENGINE = "llamacpp"
ENGINES = ("vllm", ENGINE)
MODULE = "repro.llamacpp"
# vLLM's settings that mean nothing to llama.cpp's child: refused, never silently dropped
VLLM_ONLY = (
    ("kv_connector", "--kv-connector: llama.cpp's reuse paths are the fixture's arms (repro.llamacpp.arms)"),
    ("kv_offloading_size", "--kv-offloading-size is vLLM's offloading connector"),
    ("lmcache_config", "--lmcache-config is LMCache's, a vLLM connector"),
    ("scenarios", "--scenarios: llama.cpp's scenarios run on llama-server (--frontend server)"),
    ("batch_invariant", "--batch-invariant is vLLM's kernels"),
    ("gpu_load", "--gpu-load: llama.cpp runs on the CPU here"),
    ("stream", "--stream: llama-server is sent whole requests"),
)


def check(args: argparse.Namespace, default_module: str) -> None:
    """--engine llamacpp: a GGUF file, an interpreter with llama_cpp, no vLLM-only flag; the child becomes
    repro.llamacpp (a test's stand-in module is kept)."""
    model = Path(args.model)
    if not model.is_file():
        raise UsageError(f"--model {args.model}: llama.cpp reads a GGUF file, and there is no such file")
    with model.open("rb") as fh:
        if fh.read(4) != b"GGUF":
            raise UsageError(f"--model {args.model}: not a GGUF file (it does not start with GGUF)")
    served = args.frontend == "server"
    for key, why in VLLM_ONLY:
        if getattr(args, key, None) and not (served and key == "scenarios"):
            raise UsageError(f"--engine llamacpp: {why}")
    if args.frontend not in ("sync", "server"):
        raise UsageError(f"--engine llamacpp: --frontend {args.frontend} is vLLM's (llama.cpp's: sync, server)")
    if args.device == "cuda":
        raise UsageError("--engine llamacpp: the kit builds llama.cpp for the CPU (--device cpu or auto)")
    if args.engine_module == default_module:
        args.engine_module = MODULE
        problem = llamacpp_problem(args.python)
        if problem is None and served:
            problem = llamaserver_problem(args.python)
        if problem:
            raise UsageError(f"--python {args.python}: {problem}")


def llamaserver_problem(python: str) -> str | None:
    """--frontend server: llama-server beside the interpreter (repro.llamacpp.server.binary_path), or why not."""
    binary = Path(python).parent / "llama-server"
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        return f"has no llama-server beside it ({binary}; `make repro ENGINE=llamaserver` builds it there)"
    return None


def llamacpp_problem(python: str) -> str | None:
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('llama_cpp') else 3)"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot be run ({type(exc).__name__}: {exc})"
    if done.returncode == 3:
        return "has no llama_cpp (`make repro ENGINE=llamacpp` makes .venvs/llamacpp with it)"
    if done.returncode != 0:
        return f"exited {done.returncode}: {done.stderr.decode(errors='replace').strip()[-200:]}"
    return None
