"""The detection study's scenario cells, pure: what one (planted fault row, column) cell says from its requests.

A column is `plain` (the study's own probes: the decoy, then each prompt cold and once reused) or a workload
scenario (repro.run.scenarios over the study's prompts). Every request of a cell's arm becomes one record
(`plain_records`, `scenario_records`), and `fault_cell` decides the cell from them:

- not exercised: no load of the arm faulted (a gated fault whose gate never opened; the `always` row is never
  gated). Kept apart from a miss: the column never planted the fault, so it could not have caught it.
- faulted: a request one of whose loads faulted (its own blocks), or whose loaded block another request's load
  overwrote (land_elsewhere's victim: `overwritten_by`; the loader itself loaded faithfully and is not faulted).
- caught: a request whose load faulted FAILs by tokens (the verifier's own rule: it reported a hit and its
  tokens differ from its probe's cache-off baseline) within the window. A scenario request whose schedule
  control diverges too (schedule-numerics) is never counted as caught: it is counted apart.
- missed: some load faulted, and no faulted request FAILs within the window.
- inconclusive: the scenario asks for preemption and the engine's counter stayed 0 (or unreadable), or every
  faulted request is schedule-numerics.
- error: the arm did not run or could not be compared.

The hypothesis of a cell (written before any run) is "catch", "likely catch" or "miss"; `held` says
whether the outcome agrees: a catch must be caught, a miss must be not exercised or missed.
"""

from __future__ import annotations

from repro.detection.plan import WINDOWS
from repro.judge.scenario_verdict import SCHEDULE_NUMERICS
from repro.judge.trials import kv_counts
from repro.judge.verdict import CORRUPT, FAIL, KV_FINDINGS, hit_count

# The study's report (written by repro.detection.scenarios, read by its page and the site's catalog, which must
# not import the study's runner): its kind and version.
KIND = "kvkit-detection-scenarios"
# 1: first version (rows x columns, per cell: status, hypothesis, held, caught per window, gate opened,
#    KV CORRUPT, the judged requests; the no-fault controls per column). Additions without a bump (a file written
#    before them has none: read as 0): per cell and per control, kv_foreign and kv_misplaced beside kv_corrupt
#    (repro.judge.trials.KV_RATE_FIELDS); a control's false blame of another KV finding than CORRUPT names it
#    after its label ("step 1 alpha (MISPLACED)"); per record, overwritten_by (land_elsewhere's victim, faulted
#    though its own load was faithful); the production-load column (repro.detection.load_column), whose cells keep
#    only the records that decide them and count the rest in `records_left_out`, and whose section keeps its arms'
#    rates and their requests that are not PASS.
SCHEMA_VERSION = 1

CAUGHT, MISSED, NOT_EXERCISED, INCONCLUSIVE, ERROR = "caught", "missed", "not exercised", "inconclusive", "error"
CATCH_HYPOTHESES = ("catch", "likely catch")
MISS_HYPOTHESIS = "miss"


def planted(kv_transfer_params: dict | None) -> dict:
    """What the planted connector reported for one request (kv_transfer_params["planted_fault"])."""
    return (kv_transfer_params or {}).get("planted_fault") or {}


def gate_open(gate: dict | None) -> bool:
    """Whether a load's gates let its fault apply (the connector's `gate.apply`: every gate of the load
    agreed); a load with no gate (when: always) faults every time."""
    return not gate or bool(gate.get("apply"))


def loads_of(kv_transfer_params: dict | None) -> list[dict]:
    """Every load the planted connector made for one request, in order: {loaded_tokens, faulted, opened,
    resumed}. A request loaded more than once (a resume after preemption) lists `loads`; one load otherwise;
    none when it loaded nothing."""
    pf = planted(kv_transfer_params)
    raw = pf.get("loads")
    if raw is None:
        raw = [pf] if pf.get("loaded_tokens") else []
    return [
        {
            "loaded_tokens": load.get("loaded_tokens") or 0,
            "faulted": bool(load.get("faulted_blocks")),
            "opened": bool(load.get("loaded_tokens")) and gate_open(load.get("gate")),
            "resumed": bool(load.get("resumed")),
        }
        for load in raw
        if load.get("loaded_tokens")
    ]


def record(
    label: str,
    hit: bool,
    first_diff: int | None,
    fail_windows: list[int],
    schedule_numerics: bool,
    kv: str | None,
    kv_transfer_params: dict | None,
) -> dict:
    """One request of a cell: whether it hit, where it diverged, the windows at which the verifier says FAIL,
    whether its schedule control diverged too, its KV verdict, and the planted connector's loads."""
    loads = loads_of(kv_transfer_params)
    return {
        "label": label,
        "hit": hit,
        "first_diff": first_diff,
        "fail_windows": sorted(fail_windows),
        "schedule_numerics": schedule_numerics,
        "kv": kv,
        "loads": loads,
        "faulted_blocks": planted(kv_transfer_params).get("faulted_blocks"),
        "overwritten_by": planted(kv_transfer_params).get("overwritten_by"),
    }


def is_faulted(rec: dict) -> bool:
    """Whether a request read KV its load did not put there: a load of it faulted, or another request's load
    landed in its loaded block (land_elsewhere's victim; a record written before that field has none)."""
    return any(load["faulted"] for load in rec["loads"]) or bool(rec.get("overwritten_by"))


def scenario_records(arm_entry: dict, windows: tuple[int, ...] = WINDOWS) -> list[dict]:
    """The records of one (scenario, arm) entry of repro.run.scenarios.section (after annotate_kv). A request
    FAILs at window w iff the verifier's verdict over the full run is FAIL and its first diff is below w
    (greedy and causal; for preemption see the study's method: whether a request is preempted depends on how
    long the batch decodes, so there it is only "first diff < w within the 32-token run")."""
    out = []
    for r in arm_entry.get("requests") or []:
        diff = r.get("first_diff")
        fails = [w for w in windows if r.get("verdict") == FAIL and diff is not None and diff < w]
        out.append(
            record(
                f"step {r['step']} {r['probe']}",
                r.get("role") == "reuse",
                diff,
                fails,
                r.get("class") == SCHEDULE_NUMERICS,
                (r.get("kv") or {}).get("verdict"),
                r.get("kv_transfer_params"),
            )
        )
    return out


def plain_records(entry: dict, result: dict | None) -> list[dict]:
    """The records of one plain arm: its matrix entry (repro.detection.matrix.fault_entry or control_entry,
    after the audit column) and its result, one record per reuse request of each probe; the decoy (never
    reused) is not one. The probe-level verdict per window applies to its reuses (a fault row has one)."""
    if result is None:
        return []
    by_name = {p["name"]: p for p in result["probes"]}
    out = []
    for row in entry.get("probes") or []:
        reuses = by_name[row["name"]]["requests"][1:]
        fails = [int(w) for w, v in row["verdicts"].items() if v == FAIL]
        kv = (row.get("kv") or {}).get("verdict")
        for k, req in enumerate(reuses):
            diff = row["reuse_first_diffs"][k]
            hit = bool(hit_count(row["reuse_cached_tokens"][k]))  # -1 or a non-integer is no hit
            mine = [w for w in fails if hit and diff is not None and diff < w]
            out.append(
                record(f"{row['name']} reuse {k + 1}", hit, diff, mine, False, kv, req.get("kv_transfer_params"))
            )
    return out


def fault_cell(
    records: list[dict],
    hypothesis: str,
    error: str | None = None,
    preemption_missing: bool = False,
    windows: tuple[int, ...] = WINDOWS,
    left_out: dict | None = None,
) -> dict:
    """One (fault row, column) cell from its requests' records. `error`: why its arm could not be judged;
    `preemption_missing`: the scenario asks for preemption and the engine preempted nothing; `left_out`: the
    counts of the records a cell did not keep (split_records), added to its load figures."""
    rest = left_out or {}
    opened = sum(load["opened"] for r in records for load in r["loads"]) + rest.get("gate_opened", 0)
    loads = sum(len(r["loads"]) for r in records) + rest.get("loads", 0)
    faulted = [r for r in records if is_faulted(r)]
    excluded = [r["label"] for r in faulted if r["schedule_numerics"]]
    judged = [r for r in faulted if not r["schedule_numerics"]]
    caught = {str(w): sum(w in r["fail_windows"] for r in judged) for w in windows}
    top = str(max(windows))
    if error is not None:
        status = ERROR
    elif preemption_missing:
        status = INCONCLUSIVE
    elif not faulted:
        status = NOT_EXERCISED
    elif caught[top]:
        status = CAUGHT
    elif not judged:  # every faulted request's schedule control diverged too: nothing left to judge
        status = INCONCLUSIVE
    else:
        status = MISSED
    return {
        "status": status,
        "hypothesis": hypothesis,
        "held": held(hypothesis, status),
        "faulted_requests": len(judged),
        "caught_by_window": caught,
        "gate_opened": opened,
        "loads": loads,
        "resumed_loads": sum(load["resumed"] for r in records for load in r["loads"]) + rest.get("resumed_loads", 0),
        **kv_counts(r["kv"] for r in judged),
        "schedule_numerics": excluded,
        # a request that FAILs though no load of it faulted: the row's false positive (none expected)
        "unplanted_fails": [r["label"] for r in records if r["fail_windows"] and r not in faulted],
        "first_diffs": [r["first_diff"] for r in judged],
        "error": error,
    }


def split_records(records: list[dict]) -> tuple[list[dict], dict]:
    """The records a cell must keep to be decided again (faulted, failing, schedule-numerics, or with a KV finding)
    and the counts of the rest (each a request whose loads, if any, were faithful and whose tokens and KV held):
    a column of hundreds of requests (production load) keeps what its cell says, not every request."""
    keep, rest = [], {"records": 0, "loads": 0, "gate_opened": 0, "resumed_loads": 0}
    for r in records:
        if is_faulted(r) or r["fail_windows"] or r["schedule_numerics"] or r["kv"] in KV_FINDINGS:
            keep.append(r)
            continue
        rest["records"] += 1
        rest["loads"] += len(r["loads"])
        rest["gate_opened"] += sum(load["opened"] for load in r["loads"])
        rest["resumed_loads"] += sum(load["resumed"] for load in r["loads"])
    return keep, rest


def held(hypothesis: str, status: str) -> bool | None:
    """Whether the outcome agrees with the hypothesis; None when the cell decided nothing (error, inconclusive)."""
    if status in (ERROR, INCONCLUSIVE):
        return None
    if hypothesis in CATCH_HYPOTHESES:
        return status == CAUGHT
    if hypothesis == MISS_HYPOTHESIS:
        return status in (NOT_EXERCISED, MISSED)
    return None


def control_cell(records: list[dict], error: str | None = None, windows: tuple[int, ...] = WINDOWS) -> dict:
    """One no-fault arm in one column: every FAIL is a false positive (per window), every KV finding (CORRUPT,
    FOREIGN, MISPLACED) a false blame; schedule-numerics requests are counted apart."""
    judged = [r for r in records if not r["schedule_numerics"]]
    return {
        "status": ERROR if error is not None else "ok",
        "requests": len(records),
        "hits": sum(r["hit"] for r in records),
        "false_positives_by_window": {str(w): sum(w in r["fail_windows"] for r in judged) for w in windows},
        "false_blames": [
            r["label"] + ("" if r["kv"] == CORRUPT else f" ({r['kv']})") for r in judged if r["kv"] in KV_FINDINGS
        ],
        **kv_counts(r["kv"] for r in judged),
        "kv_audited": sum(r["kv"] is not None for r in judged),
        "schedule_numerics": [r["label"] for r in records if r["schedule_numerics"]],
        "error": error,
    }
