"""The detection study's scenario columns, planned: rows (planted faults under gates), columns (plain, the shipped
scenarios over the study's prompts, production load over its own) and the hypothesis of every cell, written before
its run. Run by repro.detection.scenarios; what a cell says is repro.detection.scenario_cells'."""

from __future__ import annotations

from repro.detection import load_column, plan
from repro.plan.fixtures import Scenario, ScenarioStep

FAULT, POSITION = "zero_blocks", "head"  # the study's most detected single-block row: a miss is about the gate

PLAIN = "plain"
# Rows: (name, what it plants, its gate params). N = 32 blocks: at least the longest reused study prompt (28),
# so the plain order never reloads; fewer than alpha + bravo (24 + 26), so A, B, A does.
LOCAL_CAPACITY_BLOCKS = 32
ROWS = (
    ("always", "ungated: every load faults (the sanity row)", {}),
    ("in_flight", "a load faults only while another request is in flight with it", {"when": "in_flight"}),
    (
        "after_eviction",
        f"a load faults only when some of its blocks were evicted from a {LOCAL_CAPACITY_BLOCKS}-block local tier",
        {"when": "after_eviction", "local_capacity_blocks": LOCAL_CAPACITY_BLOCKS},
    ),
    # the load-only fault, gated as fixtures/scenarios-load-cpu-planted.json gates it (and written before any run)
    (
        "land_elsewhere",
        (
            "land_elsewhere (a step's last load also writes its first block into the step's first load's first "
            "block, which that request reads) only in a step with at least 16 requests in flight"
        ),
        {"when": "in_flight", "in_flight_min": 16},
    ),
)
# A row's fault where it is not the study's FAULT at POSITION (land_elsewhere has no block position of its own)
ROW_FAULTS = {"land_elsewhere": "land_elsewhere"}
CONTROLS = ("PlantedFault-none", "native")


def _steps(*groups: tuple[str, ...]) -> tuple[ScenarioStep, ...]:
    return tuple(ScenarioStep(tuple(g), together=len(g) > 1) for g in groups)


ALL_FIVE = tuple(name for name, _ in plan.PROMPTS)
# The shipped scenarios over the study's prompts (alpha 389 / bravo 421 / charlie 453 / delta 300 / echo 350
# tokens). Preemption differs from the plan: the plan's kv_cache_tokens 1344 needs max_model_len 1024, which the
# verifier's machinery refuses (repro.plan.scenarios.select: kv_cache_tokens below --max-model-len) and which would make
# every run incomparable with the 2048 baseline (repro.judge.evaluate.COMPARABLE_CONFIG_KEYS). So, by arithmetic and
# before any run: the five prompts together in a 2048-token cache (127 usable blocks): 122 blocks at prefill,
# 132 after 32 tokens each, so vLLM must preempt while they decode.
SCENARIOS = (
    Scenario(
        "a-b-a",
        "alpha; alpha; bravo; alpha; alpha, one at a time",
        {"max_num_seqs": 1},
        None,
        None,
        _steps(("alpha",), ("alpha",), ("bravo",), ("alpha",), ("alpha",)),
    ),
    Scenario(
        "eviction",
        "alpha; bravo; charlie; alpha, one at a time",
        {},
        None,
        None,
        _steps(("alpha",), ("bravo",), ("charlie",), ("alpha",)),
    ),
    Scenario(
        "preemption",
        "the five prompts together in a 2048-token KV cache (122 blocks at prefill, 132 after 32 tokens each, "
        "127 usable): cold, then together again",
        {"kv_cache_tokens": 2048, "max_num_seqs": 5, "preemption": True},
        None,
        None,
        _steps(ALL_FIVE, ALL_FIVE),
    ),
    Scenario(
        "in-flight",
        "the five prompts together (1913 tokens, one prefill step), cold, then together again",
        {"max_num_seqs": 5},
        None,
        None,
        _steps(ALL_FIVE, ALL_FIVE),
    ),
    load_column.SCENARIO,
)
COLUMNS = (PLAIN, *(sc.name for sc in SCENARIOS))
# Written before any run (.notes/h2-detection-plan.md); the study reports whether it held, cell by cell.
# The production-load column and the land_elsewhere row were added later, their cells written before their run
# (docs/detection.md gives the reasoning): every load of the column faults under always; in_flight opens in rounds of
# 64; after_eviction's 32-block tier is never overflowed there (the planted connector stores a prompt's blocks only in
# the step that first schedules it, under long_prefill_token_threshold 32 two blocks of its shared prefix: 16 x 2 = 32
# blocks in all), so it is not exercised; land_elsewhere's gate of 16 stays shut wherever at most 5 are in flight.
HYPOTHESIS = {
    "always": dict.fromkeys(COLUMNS, "catch"),
    "in_flight": {
        PLAIN: "miss",
        "a-b-a": "miss",
        "eviction": "miss",
        "preemption": "catch",
        "in-flight": "catch",
        load_column.NAME: "catch",
    },
    "after_eviction": {
        PLAIN: "miss",
        "a-b-a": "catch",
        "eviction": "catch",
        "preemption": "likely catch",
        "in-flight": "likely catch",
        load_column.NAME: "miss",
    },
    "land_elsewhere": dict.fromkeys(COLUMNS, "miss") | {load_column.NAME: "catch"},
}
METHOD = (
    "Rows: the planted connector's zero_blocks fault on the first loaded block, under a gate (always, in_flight, "
    f"after_eviction with a {LOCAL_CAPACITY_BLOCKS}-block local tier). Columns: plain (the detection study's fault "
    "arm: the decoy, then each prompt cold and once reused) and each scenario over the study's prompts, run through "
    "the verifier's scenario machinery (repro.run.scenarios): one fresh engine per (scenario, arm), the baseline's "
    "cache-off run of the same steps as the schedule control, every request compared with its prompt's cache-off "
    "baseline (the plain baseline's cold request), exact token IDs, greedy, 32 tokens. A cell is caught when a "
    "request whose load faulted FAILs by the verifier's rule (a hit, tokens differ) within the window; not "
    "exercised when no load faulted (the gate never opened), which is not a miss; missed when loads faulted and "
    "no such request FAILs. A request whose schedule control diverges too is schedule-numerics, never caught. "
    "Windows: greedy decoding is causal, so a request FAILs at window w iff its first diff is below w; in the "
    "preemption column whether and when a request is preempted depends on how long the batch decodes, so there "
    "it only says the first diff fell below w within the 32-token run. KV: each reuse's blocks against the plain "
    "baseline's KV (repro.judge.kvaudit), each KV finding (CORRUPT, FOREIGN, MISPLACED) counted per cell by its "
    "class. One model seed for every arm (the controls too). The land_elsewhere row's faulted requests are the "
    "victims (a load of another request landed in their loaded block: overwritten_by), not the loaders. The "
    "production-load column runs the kit's load scenario over prompts of its own (64 a round, 3 rounds, "
    "cancellations, a pool below the working set): each request is compared with its prompt's answer alone with "
    "caching off (the column's reference run) and counts as differing only if the reuse control (native prefix "
    "caching with a pool that holds every prompt) does not give the same answer; its KV is audited against the "
    "reference's. Batching and preemption there depend on how long requests decode, so as in preemption a window "
    "says only that the first diff fell below it within the 32-token run."
)


def row_fault(row: str) -> str:
    return ROW_FAULTS.get(row, FAULT)


def row_params(row: str) -> dict:
    gate = next(params for name, _, params in ROWS if name == row)
    if row in ROW_FAULTS:
        return dict(gate)
    return dict(plan.FAULT_PARAMS[FAULT], first_block=plan.POSITIONS[POSITION], **gate)
