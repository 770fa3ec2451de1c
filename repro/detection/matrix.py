"""The detection matrix's arithmetic: window verdicts, cells, entries and the summary (pure, no I/O)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from repro.contract.result import ArmResult, ProbeResult
from repro.detection.blame import planted_fault, summarize_blame
from repro.detection.expected import summarize_expectations
from repro.detection.plan import DECOY, WINDOWS
from repro.judge import evaluate
from repro.judge.replays import BASELINE
from repro.judge.verdict import FAIL, INCONCLUSIVE, PASS, ProbeVerdict, Request, decide_probe, hit_count


def decide_at(baseline: list[int], cold: Request, reuses: list[Request], w: int) -> ProbeVerdict:
    """The verifier's probe verdict had it generated only w tokens."""
    cut = [Request(tuple(r.token_ids[:w]), r.cached_tokens) for r in reuses]
    return decide_probe(tuple(baseline[:w]), Request(tuple(cold.token_ids[:w]), cold.cached_tokens), cut)


def window_verdicts(
    baseline: list[int], cold: Request, reuses: list[Request], windows: tuple[int, ...] = WINDOWS
) -> dict[int, str]:
    """The verifier's probe verdict had it generated only w tokens, for each window w."""
    return {w: decide_at(baseline, cold, reuses, w).verdict for w in windows}


@dataclass(frozen=True)
class Cell:
    """One (fault, position, window) over its probes."""

    status: str  # detected | partial | missed | inconclusive | error
    detected: int
    probes: int


def summarize_cell(verdicts: list[str]) -> Cell:
    """detected: every probe FAIL; partial: some; missed: all PASS; else inconclusive (or error)."""
    n, fails = len(verdicts), sum(v == FAIL for v in verdicts)
    if n == 0 or any(v not in (PASS, FAIL, INCONCLUSIVE) for v in verdicts):
        return Cell("error", fails, n)
    if fails == n:
        return Cell("detected", fails, n)
    if fails:
        return Cell("partial", fails, n)
    if all(v == PASS for v in verdicts):
        return Cell("missed", 0, n)
    return Cell("inconclusive", 0, n)


def false_positives_by_window(controls: list[dict]) -> dict[str, int]:
    """Every control's false positives summed per window (keys in window order).

    Verdicts are not monotonic across windows (a reuse can FAIL at 8 tokens and be INCONCLUSIVE at
    32, when the cold request diverges in between), so no single window stands for the others.
    """
    out: dict[str, int] = {}
    for c in controls:
        for w, n in c["false_positives"].items():
            out[w] = out.get(w, 0) + n
    return dict(sorted(out.items(), key=lambda item: int(item[0])))


def summarize(faults: list[dict], controls: list[dict], prefix_ok: bool) -> dict:
    """Whether every fault kind is detected somewhere, the misses, the false positives, and the KV audit.

    A kind is detected when, at some position and window, the verifier's arm verdict is FAIL: an
    arm takes its worst probe, so one diverging probe is enough. It is reliably detected when
    every probe of some cell diverged. A false positive at any window fails the study, and so does
    an audit (schema 2) that did not blame exactly the planted blocks of every fault probe, or
    blamed a block of a control (repro.detection.blame.summarize_blame). Replays (summarize_replays)
    say what the divergent reuses' tokens were; they pass or fail nothing. A catalogue row (one with an
    `expectation`, repro.detection.catalogue) is judged by its own expectation instead (repro.detection.expected): none
    of the figures above counts it, and the study is ok only when every such row held.
    """
    catalogued = [f for f in faults if "expectation" in f]
    faults = [f for f in faults if "expectation" not in f]
    detected: dict[str, bool] = {}
    reliable: dict[str, bool] = {}
    missed = []
    for f in faults:
        cells = f["windows"].values()
        detected[f["fault"]] = detected.get(f["fault"], False) or any(c["detected"] > 0 for c in cells)
        reliable[f["fault"]] = reliable.get(f["fault"], False) or any(c["status"] == "detected" for c in cells)
        missed += [
            f"{f['fault']}/{f['position']}@{w}:{c['status']}"
            for w, c in sorted(f["windows"].items(), key=lambda x: int(x[0]))
            if c["status"] != "detected"
        ]
    fp = false_positives_by_window(controls)
    exercised = sum(c["reuses_exercised"] for c in controls)
    errors = [f"{f['fault']}/{f['position']}" for f in faults + catalogued if f["error"]] + [
        c["arm"] for c in controls if c["error"]
    ]
    every = bool(detected) and all(detected.values())
    kv = summarize_blame(faults, controls)
    replays = summarize_replays(faults, controls)
    ok = every and all(n == 0 for n in fp.values()) and exercised > 0 and prefix_ok and not errors and kv["ok"]
    out = {
        "fault_kinds_detected": detected,
        "every_fault_detected": every,
        "fault_kinds_reliably_detected": reliable,
        "every_fault_reliably_detected": bool(reliable) and all(reliable.values()),
        "not_fully_detected_cells": missed,
        "false_positives": sum(fp.values()),
        "false_positives_by_window": fp,
        "control_reuses_exercised": exercised,
        "arm_errors": errors,
        "prefix_check_ok": prefix_ok,
        "kv_audit": kv,
        "replays": replays,
        "ok": ok,
    }
    if catalogued:  # additive: a matrix without the catalogue's rows is summarized as it always was
        out["expectations"] = summarize_expectations(catalogued)
        out["ok"] = ok and out["expectations"]["ok"]
    return out


def judge_probe(base_probe: dict, probe: dict, answers: dict[str, list[int]] | None = None) -> dict:
    """One probe of a reuse arm against the baseline's, at every window; the per-request first
    diffs, margins and replays are the verifier's own (repro.judge.evaluate.judge_probe over the full run;
    answers: every other prompt's answer by name, what a divergent reuse may replay)."""
    judged, _ = evaluate.judge_probe(
        ProbeResult.from_json(probe, probe["name"]),
        ProbeResult.from_json(base_probe, base_probe["name"]),
        "connector",
        answers,
    )
    cold, *reuses = judged["requests"]
    view = [Request(tuple(r["token_ids"]), r.get("cached_tokens")) for r in judged["requests"]]
    baseline = base_probe["requests"][0]["token_ids"]
    decided = {w: decide_at(baseline, view[0], view[1:], w) for w in WINDOWS}  # window_verdicts, with the reasons
    last = decided[max(WINDOWS)]
    diffs = [r["first_diff"] for r in reuses]
    first = min((d for d in diffs if d is not None), default=None)
    margin = next((r["margin"] for r in reuses if r["first_diff"] == first and first is not None), None)
    return {
        "name": probe["name"],
        "prompt_tokens": len(probe["prompt_token_ids"]),
        "cold_cached_tokens": cold.get("cached_tokens"),
        "cold_first_diff": cold["first_diff"],
        "reuse_cached_tokens": [r.get("cached_tokens") for r in reuses],
        "reuse_first_diffs": diffs,
        "reuse_replays": [r["replays"] for r in reuses],
        "first_diff": first,
        "margin": margin,
        "verdicts": {str(w): d.verdict for w, d in decided.items()},
        "reasons": list(last.reasons),  # the token verdict's reasons at the largest window
        "finding": last.finding,  # the finding its FAIL carries there (repro.judge.verdict.FINDINGS)
    }


def answers_of(baseline: dict, result: dict) -> dict[str, list[int]]:
    """What a divergent reuse of `result`'s arm may replay: the baseline answer of every prompt its engine was sent
    (the decoy's included where it ran; repro.judge.evaluate.served_prompts)."""
    seen = evaluate.served_prompts(
        [p["name"] for p in result["probes"]],
        (result.get("effective_config") or {}).get("between_requests"),
        {p["name"]: p.get("prompt_token_ids") for p in baseline["probes"]},
    )
    return {
        p["name"]: list(p["requests"][0]["token_ids"])
        for p in baseline["probes"]
        if p["requests"] and p["name"] in seen
    }


def replay_tally(probes: list[dict]) -> dict | None:
    """A row's replays over its 32-token runs (repro.judge.replays): reuses that differed from the baseline,
    those whose tokens replay another prompt's answer (each with its first such replay, and `served`:
    whether the KV audit found that prompt's blocks in what the reuse read; None where the row has no
    audit), and those that replay only an earlier request of their own prompt. None for rows made before
    replays were counted."""
    if not probes or any("reuse_replays" not in p for p in probes):
        return None
    divergent, another, own = 0, [], 0
    for p in probes:
        served = (p.get("kv") or {}).get("served_from")
        for reuse, found in enumerate(p["reuse_replays"], start=1):
            if found is None:
                continue
            divergent += 1
            theirs = [r for r in found if r["request"] == BASELINE]
            if theirs:
                truth = served[reuse - 1] if isinstance(served, list) and reuse <= len(served) else None
                named = {"name": p["name"], "reuse": reuse, **theirs[0]}
                served_ok = None if truth is None else theirs[0]["probe"] in truth
                another.append({**named, "served": served_ok, "served_from": truth})
            own += bool(found) and not theirs
    return {"divergent_reuses": divergent, "replaying_another": another, "replaying_own_earlier": own}


def summarize_replays(faults: list[dict], controls: list[dict]) -> dict:
    """The replays column's totals; `present` is false for a matrix made before replays were counted."""
    rows = [(f"{f['fault']}/{f['position']}", replay_tally(f.get("probes") or [])) for f in faults if not f["error"]]
    checks = [replay_tally(c.get("probes") or []) for c in controls if not c["error"]]
    if any(t is None for _, t in rows) or any(t is None for t in checks) or not rows:
        return {"present": False}
    return {
        "present": True,
        "divergent_reuses": sum(t["divergent_reuses"] for _, t in rows),
        "replaying_another": sum(len(t["replaying_another"]) for _, t in rows),
        # of those, the replays naming the prompt whose KV the audit found in the reuse (the served prompt)
        "naming_the_served_prompt": sum(r["served"] is True for _, t in rows for r in t["replaying_another"]),
        "replaying_own_earlier": sum(t["replaying_own_earlier"] for _, t in rows),
        "by_fault": {k: [len(t["replaying_another"]), t["divergent_reuses"]] for k, t in rows},
        "control_replaying": sum(len(t["replaying_another"]) + t["replaying_own_earlier"] for t in checks),
    }


def compare_error(baseline: dict | None, result: dict | None, failure: dict | None) -> dict | None:
    """Why an arm's result cannot be judged against the baseline (None when it can)."""
    if failure is not None:
        return failure
    if baseline is None:
        return {"kind": "no-baseline", "detail": "the baseline arm failed: nothing to compare with", "log_tail": ""}
    # the verifier's check reads typed results (repro.contract); the matrix keeps their JSON form
    problems = evaluate.comparability_problems(ArmResult.from_json(baseline), ArmResult.from_json(result))
    if problems:
        return {"kind": "not-comparable", "detail": "; ".join(problems), "log_tail": ""}
    return None


def fault_entry(
    fault: str,
    position: str,
    params: dict,
    result: dict | None,
    error: dict | None,
    baseline: dict | None,
    audit: list[dict],
) -> dict:
    """The matrix row of one fault arm: per-probe evidence and one cell per window."""
    entry = {
        "fault": fault,
        "position": position,
        "params": params,
        "error": error,
        "probes": [],
        "windows": {str(w): asdict(Cell("error", 0, 0)) for w in WINDOWS},
    }
    if error is not None:
        return entry
    base = {p["name"]: p for p in baseline["probes"]}
    answers = answers_of(baseline, result)
    loading = [r for p in result["probes"] for r in p["requests"] if planted_fault(r).get("loaded_tokens")]
    # one audit line per request that loaded tokens, in request order; a request vLLM failed comes back without its
    # kv_transfer_params, and then no line is paired with a request it may not belong to
    loads = iter(audit if len(audit) == len(loading) else [])
    for probe in result["probes"]:
        loaded = [next(loads, None) for r in probe["requests"] if planted_fault(r).get("loaded_tokens")]
        if probe["name"] == DECOY[0]:
            continue
        row = judge_probe(base[probe["name"]], probe, answers)
        row["faulted_blocks"] = planted_fault(probe["requests"][-1]).get("faulted_blocks")
        row["kv_audit"] = loaded[-1] if loaded else None
        entry["probes"].append(row)
    for w in WINDOWS:
        entry["windows"][str(w)] = asdict(summarize_cell([p["verdicts"][str(w)] for p in entry["probes"]]))
        entry["windows"][str(w)]["first_diffs"] = [
            p["first_diff"] if p["verdicts"][str(w)] == FAIL else None for p in entry["probes"]
        ]
    return entry


def control_entry(arm: str, seed: int, result: dict | None, error: dict | None, baseline: dict | None) -> dict:
    """The matrix row of one no-fault arm: every FAIL is a false positive, counted per window."""
    entry = {
        "arm": arm,
        "model_seed": seed,
        "error": error,
        "probes": [],
        "reuses_compared": 0,
        "reuses_exercised": 0,
        "false_positives": {str(w): 0 for w in WINDOWS},
        "inconclusive": {str(w): 0 for w in WINDOWS},
    }
    if error is not None:
        return entry
    base = {p["name"]: p for p in baseline["probes"]}
    answers = answers_of(baseline, result)
    for probe in result["probes"]:
        row = judge_probe(base[probe["name"]], probe, answers)
        entry["probes"].append(row)
        entry["reuses_compared"] += len(row["reuse_cached_tokens"])
        entry["reuses_exercised"] += sum(1 for c in row["reuse_cached_tokens"] if hit_count(c))
        for w, v in row["verdicts"].items():
            entry["false_positives"][w] += v == FAIL
            entry["inconclusive"][w] += v == INCONCLUSIVE
    return entry


def prefix_check(short: dict | None, full: dict | None, window: int) -> dict:
    """Every request of the short run equals the first `window` tokens (and logprobs) of the full run."""
    if short is None or full is None:
        return {"window": window, "ok": False, "requests_compared": 0, "detail": "an arm failed"}
    full_reqs = {p["name"]: p["requests"] for p in full["probes"]}
    n, mismatched, lp_diff = 0, [], 0.0
    for p in short["probes"]:
        for i, (s, f) in enumerate(zip(p["requests"], full_reqs.get(p["name"], []))):
            n += 1
            if s["token_ids"] != f["token_ids"][:window]:
                mismatched.append(f"{p['name']}#{i}")
            for a, b in zip(s["logprobs"], f["logprobs"][:window]):
                if a and b and a[0][0] == b[0][0]:
                    lp_diff = max(lp_diff, abs(a[0][1] - b[0][1]))
    return {
        "window": window,
        "ok": n > 0 and not mismatched,
        "requests_compared": n,
        "mismatched": mismatched,
        "max_top1_logprob_abs_diff": round(lp_diff, 9),
        "detail": "token IDs of every request compared exactly",
    }
