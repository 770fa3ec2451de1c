"""What the detection study runs: windows, fault configurations, prompts, controls, and the arm jobs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from repro.contract.job import ArmSpec, ConnectorSpec, EngineConfig, Job, ProbeJob, build_job
from repro.detection import catalogue
from repro.models.tiny import MODEL_SEED
from repro.plan.arms import PLANTED_FAULT_MODULE
from repro.plan.prompts import DETECTION_FILLERS, chat_spec

KIND = "kvkit-detection-matrix"
# 1: first version (faults x positions x windows, controls, prefix check).
#    The `summary` block is derived from the entries and never read back: readers recompute it
#    (repro.detection.matrix.summarize). Files written before false positives were counted at every
#    window carry a summary whose `false_positives` is the count at the largest window only, and no
#    `false_positives_by_window`; their per-window counts (controls[].false_positives) are complete.
# 2: the KV audit column. Every arm but the prefix check's short re-run runs with repro.engine.kvaudit
#    and is compared with its model's baseline (repro.judge.kvaudit). New: faults[].kv_blame (probes whose
#    audit blamed exactly the planted blocks, and which blamed more, fewer or other blocks, or could
#    not be audited; probes whose tokens never changed), faults[].probes[].kv, controls[].kv_blame
#    (false blames: probes with a KV finding; probes UNAVAILABLE and why), controls[].probes[].kv,
#    the top-level kv_audit (each seed's reference and comparison), config.kv_audit, and the
#    summary's kv_audit. A version 1 file still loads and renders, its audit column shown as absent.
#    Additions to version 2 that older files lack (no bump; readers show them as not counted): the replays
#    column, faults[].probes[].reuse_replays and controls[].probes[].reuse_replays (per reuse, what the
#    verifier's repro.judge.replays found: null when it matched the baseline) and the summary's replays; the
#    other_prompt fault (a whole loaded prefix from another prompt, at its one position "prefix") and
#    config.fault_positions. With the KV classes FOREIGN and MISPLACED: a block is blamed for any finding cell
#    (corrupt, foreign, misplaced; a file written before them blamed corrupt cells, the only finding then);
#    probes[].kv.blamed_classes (per reuse, the finding cells' classes), controls[].kv_blame.verdicts counts
#    every KV verdict, and each false blame names its verdict.
#    The rows of failures reported as success (repro.detection.catalogue): faults[].expectation (what the row
#    expects, written before its run; a row without it expects what every other row does), faults[].kv_cache_tokens
#    (a row's own pool), faults[].probes[].reasons and .finding (the token verdict's at the largest window),
#    config.fault_rows, the control PlantedFault-none-async (run with late_load), and the summary's expectations. A
#    matrix made before them has none of these, and its summary and page read as they always did.
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
DEFAULT_REPORT = "reports/detection/detection-matrix.json"
# Beside the report, committed with it (site/ is the report site's generated, ignored output).
DEFAULT_SITE = "reports/detection/detection.html"


def default_paths(model: str | None) -> tuple[str, str]:
    """(report, page) of a study: the tiny model's committed pair, or a packaged model's own pair beside it
    (`--model smollm2` never overwrites the tiny model's files)."""
    if model is None:
        return DEFAULT_REPORT, DEFAULT_SITE
    return f"reports/detection/detection-matrix-{model}.json", f"reports/detection/detection-{model}.html"


# Greedy decoding is deterministic and causal, so one 32-token run per arm gives every window.
WINDOWS = (8, 16, 32)
MAX_TOKENS = max(WINDOWS)
PREFIX_CHECK_WINDOW = 8
LOGPROBS = 5
BLOCK_SIZE = 16
# Two models x five prompts = ten (model, prompt) pairs per control arm; each arm costs an engine
# start (about 50 s on two shared cores), which is what bounds this list. Fault arms run on MODEL_SEED.
CONTROL_MODEL_SEEDS = (MODEL_SEED, 1)
CONTROL_REUSES = 2
# first_block of each position: the first loaded block, and the last one.
POSITIONS = {"head": 0, "tail": -1}
# One block (16 tokens) per fault: the smallest unit a block-granular cache can get wrong.
FAULT_PARAMS = {
    "zero_blocks": {"num_blocks": 1},
    "shift_blocks": {"num_blocks": 1},
    "stale": {"num_blocks": 1},
    "swap_kv": {"num_blocks": 1},
    "corrupt_layer": {"num_blocks": 1, "layer": 0, "scale": 1.0},
    "overwrite_tail": {"num_blocks": 1, "scale": 1.0},
    "drop_tail": {"num_blocks": 1},
    # every loaded block from the most recently stored other prompt: a reuse served another prompt's KV,
    # whose answer it may replay (the replays column)
    "other_prompt": {},
}
# A fault whose blocks are not chosen by first_block has positions of its own (None: no first_block).
FAULT_POSITIONS: dict[str, dict[str, int | None]] = {"other_prompt": {"prefix": None}}
PREFIX_CHECK_FAULT = ("zero_blocks", "head")
# (name, prompt length in tokens); lengths avoid (L-1) % 16 == 0, where ExampleConnector cannot hit.
# The names lead the system message, so no two prompts share their first block.
PROMPTS = (("alpha", 389), ("bravo", 421), ("charlie", 453), ("delta", 300), ("echo", 350))
# Stored first, never reused: every fault probe then has an older *other* prompt for `stale`, and
# it is the longest, so it has a block at every index the probes load.
DECOY = ("decoy", 485)
# A catalogue row's prompt sent between each probe's cold request and its reuse (repro.detection.catalogue.Row.between),
# one per probe so that none is ever a reuse itself: each as long as the decoy, longer than any probe, so that it takes
# every block the cold request freed and the reuse is given only blocks it freed. The baseline runs them too where such
# a row runs, so that the KV audit can name them as the source of what a reuse read.
BETWEEN = {"alpha": ("foxtrot", 485), "bravo": ("golf", 485), "charlie": ("hotel", 485), "delta": ("india", 485),
           "echo": ("juliett", 485)}  # fmt: skip
METHOD = (
    "Greedy decoding is deterministic and causal: the first w tokens of a 32-token generation are "
    "exactly the w-token generation. So one 32-token run per arm gives every window: a probe is "
    "detected at window w iff the verifier's rule (repro.judge.verdict.decide_probe) on the first w tokens "
    "says FAIL, i.e. a reuse that reported a hit differs from the baseline at an index below w. "
    "prefix_check re-runs one arm with max_tokens 8 and compares it with the prefix. "
    "Every other arm runs with the KV audit (repro.engine.kvaudit), which records the KV blocks each request "
    "reused or computed; after the arms of one model ran, each reuse's blocks are compared with the KV its "
    "model's baseline computed for the same tokens (repro.judge.kvaudit)."
)


def model_tag(key: int | str) -> str:
    """What names a model's baseline and control arms: `seed1234` for a tiny model, the name of a packaged one."""
    return f"seed{key}" if isinstance(key, int) else key


def trained_method(source: dict) -> str:
    """METHOD, followed by what model a packaged-model study ran (its page shows the method)."""
    gguf = source.get("gguf") or {}
    package = source.get("package") or {}
    return (
        f"{METHOD} Model: {source.get('title', source.get('name'))}, a trained model from the registry package "
        f"{package.get('name')} {package.get('version')} (GGUF sha256 {gguf.get('sha256')}), "
        f"{source.get('dtype')} weights dequantized from {source.get('dequantized_from')}, run in float32 on the "
        "CPU; one model, so every control runs on it (no second model seed)."
    )


def positions_of(fault: str) -> dict[str, int | None]:
    """The positions a fault runs at, each with its first_block: head and tail, or the fault's own (a catalogue
    row's first_block, if any, is among its params)."""
    rows = catalogue.rows_of(fault)
    if rows:
        return {r.position: None for r in rows}
    return FAULT_POSITIONS.get(fault, POSITIONS)


def study_faults() -> tuple[str, ...]:
    """Every fault kind the study runs by default: the detection rows, then the catalogue's."""
    return (*FAULT_PARAMS, *catalogue.FAULTS)


def prompt_spec(name: str, length: int) -> dict:
    """A chat prompt of exactly `length` tokens, as the engine job's `prompt.chat`."""
    filler = DETECTION_FILLERS[sum(map(ord, name)) % len(DETECTION_FILLERS)]
    return chat_spec(name.capitalize(), length, filler)


def probe_plan(requests: int) -> list[tuple[str, int, int]]:
    """(name, length, requests) of every study prompt: 1 cold request, the rest reuses."""
    return [(n, length, requests) for n, length in PROMPTS]


def between_prompt(name: str) -> dict:
    """The prompt sent between probe `name`'s cold request and its reuse, as ProbeJob.between."""
    other, length = BETWEEN[name]
    return {"chat": prompt_spec(other, length)}


def needs_between(faults: tuple[str, ...]) -> bool:
    """Whether a catalogue row among `faults` sends a prompt between its cold requests and their reuses."""
    return any(r.between for f in faults for r in catalogue.rows_of(f))


def engine_config(model: str, kv_cache_tokens: int | None = None) -> EngineConfig:
    """The study's engine; kv_cache_tokens: a row's own pool (default: gpu_memory_utilization's)."""
    config = EngineConfig(
        model=model,
        revision=None,
        dtype="float32",
        seed=0,
        gpu_memory_utilization=0.1,
        max_model_len=2048,
        block_size=BLOCK_SIZE,
        device="cpu",
    )
    return config if kv_cache_tokens is None else replace(config, kv_cache_tokens=kv_cache_tokens)


def arm_job(
    name: str,
    mode: str,
    connector: ConnectorSpec | None,
    model: str,
    probes: list[tuple[str, int, int]],
    max_tokens: int = MAX_TOKENS,
    scratch: Path | None = None,
    kv_cache_tokens: int | None = None,
    between: bool = False,
) -> Job:
    """The engine job of one arm (repro.run.runner.run_arm's input); every job of the study is built here,
    through the verifier's own repro.contract.job.build_job. With `scratch`, the arm's KV audit records
    under it (kv_audit_dir)."""
    return build_job(
        ArmSpec(name, mode, connector),
        engine_config(model, kv_cache_tokens),
        [
            ProbeJob(
                n, {"chat": prompt_spec(n, length)}, k, between=between_prompt(n) if between and n in BETWEEN else None
            )
            for n, length, k in probes
        ],
        max_tokens=max_tokens,
        logprobs=LOGPROBS,
        kv_audit_dir=None if scratch is None else str(kv_audit_dir(scratch, name)),
    )


def kv_audit_dir(scratch: Path, arm: str) -> Path:
    return scratch / "kv" / arm


def planted_connector(scratch: Path, name: str, fault: str, params: dict) -> ConnectorSpec:
    """The planted-fault connector of arm `name`, its store and load audit under `scratch`."""
    return ConnectorSpec(
        "PlantedFaultConnector",
        PLANTED_FAULT_MODULE,
        {
            "store_dir": str(scratch / f"{name}.store"),
            "fault": fault,
            "audit_path": str(scratch / f"{name}.audit.jsonl"),
            **params,
        },
    )


def baseline_job(scratch: Path, seed: int | str, model: str, between: bool = False) -> Job:
    """The cache-off reference; its KV audit records the reference KV of its model's arms. It runs the
    decoy too: a fault that serves the decoy's KV then has the decoy's answer and blocks to be named by; with
    `between`, the prompts sent between (BETWEEN) too, after the study's own."""
    probes = [(DECOY[0], DECOY[1], 1)] + probe_plan(1) + ([(*BETWEEN[n], 1) for n, _ in PROMPTS] if between else [])
    return arm_job(f"baseline-{model_tag(seed)}", "baseline", None, model, probes, scratch=scratch)


def control_jobs(scratch: Path, seed: int | str, model: str, faults: tuple[str, ...] = ()) -> list[tuple[str, Job]]:
    """(control name, job): ExampleConnector, native prefix caching and the planted connector with fault none; with
    late_load among `faults`, the planted connector's asynchronous path with fault none too."""
    arms = [
        (
            "ExampleConnector",
            "connector",
            ConnectorSpec("ExampleConnector", None, {"shared_storage_path": str(scratch / f"example-{seed}")}),
        ),
        ("native", "native", None),
        ("PlantedFault-none", "connector", planted_connector(scratch, f"none-{seed}", "none", {})),
    ]
    if "late_load" in faults:
        name, params = catalogue.ASYNC_CONTROL
        arms.append((name, "connector", planted_connector(scratch, f"none-async-{seed}", "none", params)))
    return [
        (name, arm_job(f"{name}-{model_tag(seed)}", mode, conn, model, probe_plan(1 + CONTROL_REUSES), scratch=scratch))
        for name, mode, conn in arms
    ]


def fault_job(scratch: Path, fault: str, position: str, model: str, max_tokens: int = MAX_TOKENS) -> Job:
    """The decoy first (stored, never reused), then every prompt cold and once reused. The prefix
    check's short re-run (max_tokens below MAX_TOKENS) is not audited: only its tokens are read. A catalogue row
    brings its own settings and, where it has one, its own pool."""
    row = catalogue.row(fault, position)
    if row is not None:
        params, pool = dict(row.params), row.kv_cache_tokens
    else:
        first = positions_of(fault)[position]
        params, pool = dict(FAULT_PARAMS[fault], **({} if first is None else {"first_block": first})), None
    full = max_tokens == MAX_TOKENS
    name = f"{fault}-{position}" + ("" if full else f"-{max_tokens}tok")
    probes = [(DECOY[0], DECOY[1], 1)] + probe_plan(2)
    conn = planted_connector(scratch, name, fault, params)
    between = row is not None and row.between
    return arm_job(name, "connector", conn, model, probes, max_tokens, scratch if full else None, pool, between)
