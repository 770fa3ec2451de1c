"""The detection study's production-load column: the kit's production-load scenario (repro.plan.load) re-declared
over the study's engine, with prompts of its own.

The study's five chat prompts cannot make production load: the column runs the load scenario's own generated
prompts, sized as fixtures/scenarios-load-cpu-planted.json sizes them (its description gives the arithmetic): 16
shared prefixes of 192 tokens x 4 suffixes of 32 = 64 prompts a round, three rounds in shuffled orders, each round
cancelling 3 requests in prefill and 3 at their last step (each sent again), in a pool of 5120 tokens (320 blocks of
16) with vLLM's long_prefill_token_threshold 32. At the study's 32 tokens a request takes 256 tokens, so the pool
holds 20 requests unshared: above the land_elsewhere row's gate of 16 in flight.

It runs through the verifier's own machinery (repro.run.scenarios, repro.run.load_scenario): its reference (every
prompt alone, cache off, the study's engine: each request's cache-off answer and the reference KV), the baseline's
rounds cache-off (the schedule control), the reuse control (native prefix caching with a pool that holds every
prompt), and one fresh engine per row and no-fault control. A request differs only when it differs from its cache-off
answer and from the reuse control's answer to it; its KV is audited against the reference's KV (its own comparison
child, as the verifier runs a load scenario's: repro.detection.scenarios.audit_columns). Its cells keep the records that decide them (split_records), its
section each arm's rates and its first 8 requests that are not PASS: 192 requests an arm would multiply the report's
size.
"""

from __future__ import annotations

from repro.contract.result import ArmResult
from repro.detection.scenario_cells import scenario_records, split_records
from repro.judge.verdict import PASS
from repro.plan import load
from repro.plan.fixtures import Probe, Scenario, ScenarioStep
from repro.plan.load import LoadSpec
from repro.run import load_scenario

NAME = "production-load"
# fixtures/scenarios-load-cpu-planted.json's production-load, unchanged (chosen there by arithmetic, before any run)
SPEC = LoadSpec(
    prefixes=16,
    suffixes=4,
    prefix_tokens=192,
    suffix_tokens=32,
    rounds=3,
    seed=5,
    cancel_in_prefill=3,
    cancel_at_last_step=3,
)
ENGINE = {"kv_cache_tokens": 5120, "long_prefill_token_threshold": 32}
DESCRIPTION = (
    "64 prompts a round in flight (16 shared prefixes of 192 tokens x 4 suffixes of 32), 3 shuffled rounds, 3 + 3 "
    "cancellations a round (in prefill, at the last step; each sent again), a 5120-token pool (20 requests of 256 "
    "tokens unshared), long_prefill_token_threshold 32; judged against its own cache-off reference and reuse control"
)


# requests that are not PASS kept per arm in the section, as the verifier's summary prints them (the cells keep every
# faulted request's record; the arm's rates count them all)
KEPT_REQUESTS = 8


def scenario() -> Scenario:
    """The load scenario as repro.plan.fixtures makes one from a fixture's `load` object."""
    made = load.prompts(SPEC)
    probes = tuple(Probe(name, ids) for name, ids in made)
    rounds = load.rounds(SPEC, [name for name, _ in made])
    steps = tuple(ScenarioStep(order, True, None, 0.0, cancel) for order, cancel in rounds)
    return Scenario(NAME, DESCRIPTION, dict(ENGINE), None, None, steps, SPEC, probes)


SCENARIO = scenario()


def is_load(section: dict) -> bool:
    return section.get("load") is not None


def reference_of(done: list) -> ArmResult | None:
    """The reference run's result among a column's runs (original arm, run arm, outcome, record); None if it failed."""
    out = next((o for _, run, o, _ in done if load_scenario.is_reference(run.name)), None)
    return load_scenario.reference(out)


def cell_records(entry: dict) -> tuple[list[dict], dict]:
    """A load arm's records a cell keeps, and the counts of the rest (repro.detection.scenario_cells.split_records)."""
    return split_records(scenario_records(entry))


def _request(r: dict) -> dict:
    """A request that is not PASS, as the section keeps it: what its line in the summary says."""
    kv = r.get("kv") or {}
    keep = ("step", "probe", "verdict", "class", "first_diff", "cached_tokens", "control_cached_tokens")
    cancel = r.get("cancel")
    return {k: r.get(k) for k in keep} | {
        "cancel": None if not cancel else {k: v for k, v in cancel.items() if k != "output_tokens"},
        "reasons": list(r.get("reasons") or [])[:2],
        "kv": kv.get("verdict"),
        "replays": [{k: x.get(k) for k in ("probe", "request", "from", "tokens")} for x in r.get("replays") or []],
        "overwritten_by": ((r.get("kv_transfer_params") or {}).get("planted_fault") or {}).get("overwritten_by"),
    }


def slim(section: dict) -> dict:
    """The column's section as the report keeps it: the load spec and its controls' entries, the schedule control
    without its requests, and each arm's verdict, rates, KV verdict and its first KEPT_REQUESTS requests that are not
    PASS (a cancelled one without the tokens its aborted attempt made)."""
    control = {k: v for k, v in section["control"].items() if k != "requests"}
    control["requests_total"] = len(section["control"]["requests"])
    arms = []
    for a in section["arms"]:
        kv = a.get("kv") or {}
        keep = ("arm", "mode", "verdict", "class", "preemptions", "preemptions_source", "error", "wall_s", "timing")
        arms.append(
            {k: a.get(k) for k in keep}
            | {
                "reasons": list(a.get("reasons") or [])[:4],
                "kv": {"verdict": kv.get("verdict"), "reasons": list(kv.get("reasons") or [])[:3]},
                "load": a.get("load"),
                "requests_total": len(a.get("requests") or []),
                "requests_not_pass": len(not_pass := [r for r in a.get("requests") or [] if r.get("verdict") != PASS]),
                "requests": [_request(r) for r in not_pass[:KEPT_REQUESTS]],
            }
        )
    keep = ("name", "description", "engine", "load")
    return {k: section.get(k) for k in keep} | {"control": control, "arms": arms}
