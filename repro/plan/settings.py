"""The run's settings, read once from the command line (repro.plan.run_plan.build_plan) into frozen parts,
one per stage that uses them: the engine every child builds, how a child is started and bounded, the
arms the command line asks for, the trials and confirmations, the load neighbours, LMCache's copy path
and YAML, the KV audit, the report. A stage gets its part, never the options."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from repro.contract.job import EngineConfig

# The cap on what one child's files may grow by (its log, KV audit files, result, connector scratch),
# from the largest legitimate output: the KV audit writes each request's full prompt blocks once per
# layer (repro/engine/kvaudit_hooks.py's docstring), K and V, in the model's dtype.
#   per token: an 8B-class float16 model with grouped KV heads, 32 layers x 2 planes x 8 KV heads x 128
#     x 2 B = 128 KiB (Qwen3-0.6B, the largest model docs/kv-audit.md names: 112 KiB; the tiny model: 2 KiB)
#   per request: at most --max-model-len's default 2048 tokens, 2048 x 128 KiB = 256 MiB
#   per child: at most 16 requests (the acceptance suite's reuse arm makes 4 + 2 + 2 + 2 = 10, a scenario
#     child at most 2 steps x 4 probes = 8): 16 x 256 MiB = 4 GiB (4.3 GB)
# Twice that for headroom (the logs are a few MB: the largest of the 201 kept under reports/ is 59 KB)
# is 8.6 GB; 10 GB. The run that filled a 64 GiB disk grew at about 450 MB/s: stopped at 10 GB in ~22 s.
# More reuses (--reuses), a longer --max-model-len or a larger model: raise --max-child-disk-gb.
# (repro.run.diskwatch enforces it.)
DEFAULT_MAX_CHILD_DISK_GB = 10.0
HASHSEED = "0"  # every child's PYTHONHASHSEED (the report's provenance says it)


@dataclass(frozen=True)
class EngineSettings:
    """What every arm's child runs: its engine and sampling (each job's EngineConfig), and the kernels and
    front end its environment names."""

    model: str  # as given: the report's config and provenance
    model_is_local: bool
    revision: str | None
    dtype: str
    seed: int
    gpu_memory_utilization: float
    max_model_len: int
    block_size: int
    device: str
    max_tokens: int
    logprobs: int
    batch_invariant: bool
    frontend: str
    engine_layout: str = "vllm"  # --engine-layout, resolved (repro.plan.run_plan): see engine_layout_env
    stream: bool = False  # --stream: a served arm's requests streamed (repro.engine.served)
    lora: dict | None = None  # the engine's LoRA settings where probes run under adapters (repro.plan.adapters)
    kv_cache_tokens: int | None = None  # --kv-cache-tokens (None: vLLM sizes the KV cache)
    block_size_chosen: str | None = None  # --block-size auto: how it was chosen (repro.plan.options.resolve_block_size)
    speculative_config: dict | None = None  # --speculative-config (repro.plan.speculative)

    def config(self) -> EngineConfig:
        """The job's engine (a local model by its resolved path)."""
        return EngineConfig(
            model=str(Path(self.model).resolve()) if self.model_is_local else self.model,
            revision=self.revision,
            dtype=self.dtype,
            seed=self.seed,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_model_len=self.max_model_len,
            block_size=self.block_size,
            device=self.device,
            kv_cache_tokens=self.kv_cache_tokens,
            lora=self.lora,
            speculative_config=self.speculative_config,
        )


def engine_layout_env(layout: str) -> dict[str, str]:
    """What an engine layout sets in every engine child's environment (the flag decides, not the caller's shell).

    vllm: vLLM's own layout, the engine core in a process of its own and, on the CPU, its worker in a third
    (vLLM's CPU platform forces its multiprocess executor while VLLM_ENABLE_V1_MULTIPROCESSING is on). Each of the
    two imports vLLM and torch again: on a two-core machine about 13 of an arm's 20 seconds of start-up.
    one-process (the CPU only): VLLM_ENABLE_V1_MULTIPROCESSING=0, so the engine core and the in-process executor's
    worker run inside the arm's child (served: inside the engine core's process, which `vllm serve` always starts
    beside its API server's; the server inherits the child's environment and cores), and one OpenMP thread
    (OMP_NUM_THREADS=1), pinned to the arm's core where arms run at once (the slot's VLLM_CPU_OMP_THREADS_BIND;
    repro.engine.child pins it): the kernels' thread count is then one on any machine. vLLM's own layout runs its
    CPU worker on the slot's cores (one when arms run at once; all but one reserved core when an arm runs alone),
    so on a two-core machine both run one thread, and the same requests give the same bits (tests/test_e2e_cpu.py
    compares the two layouts' reports)."""
    if layout == "one-process":
        return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}


@dataclass(frozen=True)
class ChildSettings:
    """How each child process of the run is started and bounded (repro.run): the engine's interpreter and
    module, its time and disk limits, and the MP server's module (a stand-in in the tests)."""

    python: str
    engine_module: str
    timeout_s: float
    max_disk_gb: float
    lmcache_server_module: str | None = None
    # the KV comparison's interpreter (repro.engine.kvcompare, torch) where the engine's has no torch (llama.cpp's
    # .venvs/llamacpp: the verifier's own); None: the engine's
    compare_python: str | None = None


@dataclass(frozen=True)
class ArmsAsked:
    """The arms the command line asks for (repro.plan.arms.plan_arms): a connector of its own, else the
    fixture's; native prefix caching beside them, and native-matched with it unless left out."""

    kv_connector: str | None
    module_path: str | None
    extra_config: dict = field(default_factory=dict)
    compare_native: bool = False
    native_matched: bool = True
    # --kv-offloading-size GiB: vLLM's own offloading as its flag makes it (repro.plan.offloading), instead of a
    # connector; offloading_backend "native" or "simple" (VLLM_USE_SIMPLE_KV_OFFLOAD=1 in the kit's environment)
    offloading_size: float | None = None
    offloading_backend: str = "native"


@dataclass(frozen=True)
class Repeats:
    """Each reuse arm's trials (--trials) and whether a finding made while sharing is re-run alone."""

    trials: int
    confirm: bool


@dataclass(frozen=True)
class Loads:
    """The load neighbour the reuse arms run beside (--gpu-load, --cpu-load), if any."""

    gpu: bool
    cpu: bool


@dataclass(frozen=True)
class LMCacheSettings:
    """LMCache's copy path in every LMCache process (--lmcache-ops) and the YAML its processes read."""

    ops: str
    config: str | None


@dataclass(frozen=True)
class KVAuditSettings:
    """The KV audit: on unless --no-kv-audit; where its tensors are kept (--keep-kv), else deleted."""

    enabled: bool
    keep_dir: str | None


@dataclass(frozen=True)
class OutputSettings:
    """The report (its logs beside it, <stem>.logs) and the progress display."""

    report: Path
    quiet: bool

    @property
    def logs_rel(self) -> str:
        """The logs' folder as the report names it, beside the report."""
        return f"{self.report.stem}.logs"
