"""The KV audit of scenario requests, parent side: the comparison's job for (scenario, arm) runs and their report
entries' KV fields (repro.run.scenarios makes the entries; this fills their `kv`).

Every request that reused (its hit counter above 0, or its audit record says it reused blocks) is classed against the
plain baseline's KV for the same tokens; the run's floor is its own misses' computed KV against the baseline's. A miss
whose answer changed with no hit reported (repro.judge.verdict's NO_HIT_DIFFERS) is no part of that floor: its
computed blocks are classed as a reuse's are, so the audit says whether they hold its own prefill's KV or another's
(a load the engine did not count).
"""

from __future__ import annotations

from repro.contract.result import ArmResult
from repro.judge import kvaudit
from repro.judge.kv_verdict import KVVerdict, decide_kv_probe, decide_kv_unavailable, decide_scenario_kv
from repro.judge.verdict import NO_HIT_DIFFERS
from repro.run import load_scenario


def request_label(step: int, probe: str, load: bool = False) -> str:
    """'step 2 chat-511'; a production-load request 'round 3 load-p011-s02' (rounds count from 1, as its rates)."""
    return f"round {step + 1} {probe}" if load else f"step {step} {probe}"


def compare_job(baseline: ArmResult, results: dict[str, ArmResult]) -> dict:
    """repro.engine.kvcompare's job for scenario runs: the plain baseline's reference KV, and per run every
    request with a usable record (index: its position in the scenario): reused blocks of a hit, computed
    blocks of a miss (the run's floor)."""
    job = kvaudit.compare_job(baseline, {})
    for name, res in results.items():
        reqs = []
        for i, sr in enumerate(res.scenario.requests if res.scenario else ()):
            rec = sr.request.kv_audit_record
            if kvaudit._record_ok(rec) is not None:
                continue
            kind = "reused" if rec.get("reused_blocks", 0) > 0 else "computed"
            if kind == "computed" and rec.get("computed_blocks", 0) == 0:
                continue
            reqs.append({"probe": sr.probe, "index": i, "seq": rec["seq"], "kind": kind, "layers": len(rec["layers"])})
        job["arms"].append({"name": name, "dir": (res.kv_audit or {}).get("dir"), "requests": reqs})
    return job


def annotate_kv(entry: dict, result: ArmResult | None, raw: dict | None, problem: str | None, block_size: int) -> None:
    """Fill one (scenario, arm) entry's KV fields: per request that reused (its hit counter above 0, or its audit
    record says it reused blocks) its KV verdict against the plain baseline's KV (cells classed against the run's
    own floor: its misses' KV against the baseline's), and the arm's. A NO_HIT_DIFFERS request's computed blocks are
    classed the same way, and kept out of the floor."""
    if result is None or result.scenario is None or result.kv_audit is None:
        return
    runs = (raw or {}).get("arms", {}).get(result.arm)
    errors = result.kv_audit.get("errors") or []
    if errors:
        last = errors[0].get("error", "").strip().splitlines()
        problem = f"the audit failed in {errors[0].get('where', '?')}: {last[-1][:200] if last else '?'}"
    elif runs is None:
        problem = problem or "the comparison has no figures for this run"
    per_index = {k: v for per_probe in (runs or {}).values() for k, v in per_probe.items()}
    unowned = {str(i) for i, r in enumerate(entry["requests"]) if r.get("finding") == NO_HIT_DIFFERS}
    floor = kvaudit.arm_floor(
        {
            k: {"0": v}
            for k, v in per_index.items()
            if v and not v.get("error") and v.get("kind") == "computed" and k not in unowned
        }
    )
    judged: list[tuple[str, KVVerdict]] = []
    for i, (r, sr) in enumerate(zip(entry["requests"], result.scenario.requests)):
        rec = sr.request.kv_audit_record
        own = str(i) in unowned  # its own computed blocks, read against the baseline's
        # every request the hit counter calls a reuse, and every one whose audit record says it reused blocks
        # (a counter that is missing, or 0 where a connector loaded blocks, must not keep them from being classed)
        if r["role"] != "reuse" and not _reused_blocks(rec) and not own:
            continue
        got = per_index.get(str(i))
        why = problem or kvaudit._record_ok(rec) or (got or {}).get("error")
        if why is None and not _reused_blocks(rec) and not own:
            why = "no full block was reused: nothing to audit"
        if why is None and (got is None or got.get("kind") not in ("reused", "computed" if own else "reused")):
            why = "the comparison has no figures for this request"
        if why is not None:
            v = decide_kv_unavailable(why)
            counts, origin = None, None
        else:
            audited, audit = kvaudit.reuse_entry(got, rec, floor, r["probe"])
            v = decide_kv_probe([audit], floor["rel"])
            counts, origin = audited["counts"], None if got.get("kind") == "computed" else audited["origin"]
        r["kv"] = {**_kv(v, block_size), "counts": counts, "origin": origin}
        if own and why is None and got.get("kind") == "computed":
            r["kv"]["reasons"] = [kvaudit.COMPUTED_NOTE, *r["kv"]["reasons"]]
        judged.append((request_label(r["step"], r["probe"], "load" in entry), v))
    v = decide_scenario_kv(judged)
    entry["kv"] = {**_kv(v, block_size), "floor": {"rel": floor["rel"], "cells": floor["cells"]}}
    if "load" in entry:  # a load arm's rates again, now with its requests' KV verdicts (load_scenario.rates)
        entry["load"]["rounds"] = load_scenario.rates(entry)


def _reused_blocks(record: dict | None) -> int:
    """The blocks an audit record says its request reused (0: none, or no record)."""
    n = (record or {}).get("reused_blocks") if isinstance(record, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


def _kv(v: KVVerdict, block_size: int) -> dict:
    return {"verdict": v.verdict, "reasons": list(v.reasons), "blame": kvaudit.blame(v, block_size)}
