"""Turning arm results into judged arms: per-request diffs, margins, probe and arm verdicts."""

from __future__ import annotations

from repro.compare import margin_at
from repro.suite import shared_first_blocks
from repro.verdict import ERROR, INCONCLUSIVE, Request, decide_baseline_probe, decide_probe, worst

# Keys that must match between arms before any comparison is made.
COMPARABLE_CONFIG_KEYS = ("model", "revision", "dtype", "block_size", "max_model_len", "seed", "enforce_eager")
COMPARABLE_VERSION_KEYS = ("vllm", "torch", "lmcache")
SKIPPED = "SKIPPED"


def comparability_problems(baseline: dict, other: dict) -> list[str]:
    """Why two arm results must not be compared (empty when they may)."""
    problems = []
    bc, oc = baseline.get("effective_config", {}), other.get("effective_config", {})
    for key in COMPARABLE_CONFIG_KEYS:
        if bc.get(key) != oc.get(key):
            problems.append(f"{key} differs: baseline {bc.get(key)!r} vs {other['arm']} {oc.get(key)!r}")
    if baseline.get("fixture_sha256") != other.get("fixture_sha256"):  # stamped by the runner from the job
        problems.append(
            f"fixture hash differs: baseline {baseline.get('fixture_sha256')!r} vs {other['arm']} "
            f"{other.get('fixture_sha256')!r}"
        )
    bv, ov = baseline.get("versions", {}), other.get("versions", {})
    for key in COMPARABLE_VERSION_KEYS:
        if bv.get(key) != ov.get(key):
            problems.append(f"{key} version differs: baseline {bv.get(key)!r} vs {other['arm']} {ov.get(key)!r}")
    bp = {p["name"]: p["prompt_token_ids"] for p in baseline.get("probes", [])}
    for p in other.get("probes", []):
        if p["name"] in bp and bp[p["name"]] != p["prompt_token_ids"]:
            problems.append(f"probe {p['name']}: submitted token IDs differ from the baseline's")
    return problems


def _request_view(req: dict) -> Request:
    return Request(token_ids=tuple(req["token_ids"]), cached_tokens=req.get("cached_tokens"))


def judge_probe(probe: dict, baseline_probe: dict | None, mode: str) -> dict:
    """The report entry for one probe: requests annotated with diffs and margins, and a verdict."""
    reqs = [dict(r) for r in probe["requests"]]
    entry = {
        "name": probe["name"],
        "prompt_tokens": len(probe["prompt_token_ids"]),
        "submitted_token_ids": probe["prompt_token_ids"],
        "messages": probe.get("messages"),
        "requests": reqs,
        "skipped": None,
    }
    if mode == "baseline":
        pv = decide_baseline_probe(_request_view(reqs[0]))
        entry.update(verdict=pv.verdict, reasons=list(pv.reasons))
        for r in reqs:
            r.update(first_diff=None, first_diff_vs_cold=None, margin=None)
        return entry
    if baseline_probe is None:
        entry.update(verdict=INCONCLUSIVE, reasons=["the baseline has no result for this probe"])
        return entry
    base = baseline_probe["requests"][0]
    pv = decide_probe(tuple(base["token_ids"]), _request_view(reqs[0]), [_request_view(r) for r in reqs[1:]])
    reqs[0].update(
        first_diff=pv.cold_first_diff, first_diff_vs_cold=None, margin=_margin(pv.cold_first_diff, base, reqs[0])
    )
    for r, d, dc in zip(reqs[1:], pv.reuse_first_diffs, pv.reuse_first_diffs_vs_cold):
        r.update(first_diff=d, first_diff_vs_cold=dc, margin=_margin(d, base, r))
    entry.update(verdict=pv.verdict, reasons=list(pv.reasons))
    return entry


def _margin(index: int | None, base: dict, req: dict) -> dict | None:
    if index is None:
        return None
    blp, rlp = base.get("logprobs") or [], req.get("logprobs") or []
    return margin_at(
        index,
        base["token_ids"],
        req["token_ids"],
        blp[index] if index < len(blp) else [],
        rlp[index] if index < len(rlp) else [],
    ).as_dict()


def judge_arm(
    result: dict, baseline: dict | None, mode: str, block_size: int, skip_probes: dict[str, str] | None = None
) -> tuple[list[dict], str, list[str]]:
    """(probe entries, arm verdict, arm reasons) for an arm whose child delivered a result."""
    skip_probes = skip_probes or {}
    reasons: list[str] = []
    if mode != "baseline":
        if baseline is None:
            return [], ERROR, ["the baseline arm failed: nothing to compare with"]
        problems = comparability_problems(baseline, result)
        if problems:
            return [], ERROR, ["refusing to compare: " + p for p in problems]
    base_probes = {p["name"]: p for p in (baseline or {}).get("probes", [])}
    entries = [judge_probe(p, base_probes.get(p["name"]), mode) for p in result["probes"]]
    for name, why in sorted(skip_probes.items()):
        entries.append(
            {
                "name": name,
                "prompt_tokens": None,
                "submitted_token_ids": None,
                "messages": None,
                "requests": [],
                "verdict": SKIPPED,
                "reasons": [why],
                "skipped": why,
            }
        )
    shared = shared_first_blocks({p["name"]: p["prompt_token_ids"] for p in result["probes"]}, block_size)
    for first, second in shared:
        for e in entries:
            if e["name"] == second and e["verdict"] != ERROR:
                e["verdict"] = INCONCLUSIVE
                e["reasons"].append(f"shares its first block with probe {first}: probes are not isolated")
    judged = [e["verdict"] for e in entries if e["verdict"] != SKIPPED]
    verdict = worst(judged)
    if not judged:
        reasons.append("no probe was run")
    for e in entries:
        if e["verdict"] not in ("PASS", SKIPPED):
            reasons += [f"{e['name']}: {r}" for r in e["reasons"]]
    return entries, verdict, reasons
