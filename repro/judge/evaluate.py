"""Turning arm results into judged report entries: per-request diffs and margins, with every verdict
taken from repro.judge.verdict (the one authority)."""

from __future__ import annotations

from collections.abc import Mapping

from repro.contract.result import ArmResult, ProbeResult, RequestResult
from repro.judge import adapters, prompt_logprobs, salts
from repro.judge.compare import margin_at
from repro.judge.replays import find_replays, request_label
from repro.judge.verdict import (
    ArmVerdict,
    ProbeVerdict,
    Request,
    decide_arm,
    decide_baseline_probe,
    decide_incomparable,
    decide_missing_baseline_probe,
    decide_missing_probe,
    decide_no_baseline,
    decide_probe,
    decide_shared_first_block,
    decide_skipped,
)

# Keys that must match between arms before any comparison is made.
COMPARABLE_CONFIG_KEYS = ("model", "revision", "dtype", "block_size", "max_model_len", "seed", "enforce_eager")
COMPARABLE_VERSION_KEYS = ("vllm", "torch", "lmcache")
ENDPOINT = "endpoint"  # the effective config's frontend of a server the kit did not start (repro.engine.served)


def shared_first_blocks(submitted: dict[str, list[int]], block_size: int) -> list[tuple[str, str]]:
    """Pairs of probes whose first block is identical: they could feed each other's cache."""
    pairs, seen = [], {}
    for name, ids in submitted.items():
        key = tuple(ids[:block_size])
        if key in seen:
            pairs.append((seen[key], name))
        else:
            seen[key] = name
    return pairs


def comparability_problems(baseline: ArmResult, other: ArmResult) -> list[str]:
    """Why two arm results must not be compared (empty when they may)."""
    problems = []
    bc, oc = baseline.effective_config or {}, other.effective_config or {}
    for key in COMPARABLE_CONFIG_KEYS:
        if bc.get(key) != oc.get(key):
            problems.append(f"{key} differs: baseline {bc.get(key)!r} vs {other.arm} {oc.get(key)!r}")
    if baseline.fixture_sha256 != other.fixture_sha256:  # stamped from the job
        problems.append(
            f"fixture hash differs: baseline {baseline.fixture_sha256!r} vs {other.arm} {other.fixture_sha256!r}"
        )
    bv, ov = baseline.versions or {}, other.versions or {}
    for key in COMPARABLE_VERSION_KEYS:
        if bv.get(key) != ov.get(key):
            problems.append(f"{key} version differs: baseline {bv.get(key)!r} vs {other.arm} {ov.get(key)!r}")
    # The GPU each ran on: the first its child saw (its slot's CUDA_VISIBLE_DEVICES, else the first
    # visible, which a child that sees them all uses); nothing on the CPU.
    for label, key in (("GPU", "gpus"), ("GPU compute capability", "gpu_capabilities")):
        b, o = (bv.get(key) or [None])[0], (ov.get(key) or [None])[0]
        if b != o:
            problems.append(f"{label} differs: baseline {b!r} vs {other.arm} {o!r}")
    bp = {p.name: p.prompt_token_ids for p in baseline.probes}
    for p in other.probes:
        if p.name in bp and bp[p.name] != p.prompt_token_ids:
            problems.append(f"probe {p.name}: submitted token IDs differ from the baseline's")
    return problems


def _view(req: RequestResult, counts_external: bool = False) -> Request:
    return Request(tuple(req.token_ids), req.cached_tokens, req.external_tokens, counts_external)


def margin_of(index: int | None, base: RequestResult, req: RequestResult) -> dict | None:
    """The margins at a divergence (None: no divergence): the baseline's and the request's top logprobs."""
    if index is None:
        return None
    blp, rlp = base.logprobs, req.logprobs
    return margin_at(
        index,
        list(base.token_ids),
        list(req.token_ids),
        blp[index] if index < len(blp) else [],
        rlp[index] if index < len(rlp) else [],
    ).as_dict()


def probe_verdict(
    probe: ProbeResult,
    baseline_probe: ProbeResult | None,
    mode: str,
    counts_external: bool = False,
    max_tokens: int | None = None,
) -> ProbeVerdict:
    """The verdict for one probe (a baseline probe alone, or a reuse probe against the baseline's).
    counts_external: the arm's connector sits beneath the GPU prefix cache (its own hits are the ones that count).
    max_tokens: what every request was asked for (greedy, ignore_eos): an answer of another length is none
    (repro.judge.answer); None where not known."""
    if mode == "baseline":
        return decide_baseline_probe(_view(probe.requests[0]), asked=max_tokens)
    if baseline_probe is None:
        return decide_missing_baseline_probe()
    base = baseline_probe.requests[0]
    reqs = probe.requests
    return decide_probe(
        tuple(base.token_ids),
        _view(reqs[0]),
        [_view(r, counts_external) for r in reqs[1:]],
        baseline_verdict=decide_baseline_probe(_view(base), asked=max_tokens).verdict,
        asked=max_tokens,
    )


def _replays(
    probe: ProbeResult, index: int, own: list[int], answers: Mapping[str, list[int]], same: Mapping[str, str]
) -> list[dict]:
    """What a divergent reuse replays (repro.judge.replays): other probes' answers (same: those that are its prompt
    under other LoRA adapters, repro.judge.adapters), its probe's earlier requests."""
    earlier = [(request_label(i), list(r.token_ids)) for i, r in enumerate(probe.requests[:index])]
    found = find_replays(probe.name, list(probe.requests[index].token_ids), own, answers, earlier, same)
    return [r.as_dict() for r in found]


def served_prompts(names, between_requests, base_prompts: Mapping[str, object]) -> set[str]:
    """The baseline's probes whose prompt an arm's engine was sent: its own probes (names), and those sent between
    a cold request and its reuse (its effective_config's between_requests, matched to base_prompts, probe name ->
    prompt token IDs). Only their answers can be what a divergent reuse replays: a probe the arm never ran left no
    KV in it."""
    sent = {tuple(b.get("prompt_token_ids") or ()) for b in between_requests or ()}
    return set(names) | {name for name, ids in base_prompts.items() if tuple(ids or ()) in sent}


def judge_probe(
    probe: ProbeResult,
    baseline_probe: ProbeResult | None,
    mode: str,
    answers: Mapping[str, list[int]] | None = None,
    counts_external: bool = False,
    same: Mapping[str, str] | None = None,
    max_tokens: int | None = None,
) -> tuple[dict, ProbeVerdict]:
    """The report entry for one probe (requests annotated with diffs and margins) and its verdict.

    answers: every probe's baseline continuation by name; each reuse that differs from its own baseline
    gets `replays` (a list, empty when it replays nothing), one that does not gets None. same: the probes
    that are its prompt under other LoRA adapters (repro.judge.adapters.siblings; key identity)."""
    pv = probe_verdict(probe, baseline_probe, mode, counts_external, max_tokens)
    reqs = [r.to_json() for r in probe.requests]
    for r in reqs:
        del r["kv_audit_record"]  # the child's bookkeeping; the report carries repro.judge.kvaudit's kv_audit
    if mode == "baseline" or baseline_probe is None:
        for r in reqs:
            r.update(first_diff=None, first_diff_vs_cold=None, margin=None)
    else:
        base = baseline_probe.requests[0]
        reqs[0].update(
            first_diff=pv.cold_first_diff,
            first_diff_vs_cold=None,
            margin=margin_of(pv.cold_first_diff, base, probe.requests[0]),
        )
        pairs = zip(reqs[1:], probe.requests[1:], pv.reuse_first_diffs, pv.reuse_first_diffs_vs_cold)
        for i, (r, req, d, dc) in enumerate(pairs, start=1):
            r.update(first_diff=d, first_diff_vs_cold=dc, margin=margin_of(d, base, req))
            r["replays"] = None if d is None else _replays(probe, i, list(base.token_ids), answers or {}, same or {})
        pv = adapters.judge_probe(pv, probe.name, answers or {}, same or {}, reqs)
    entry = {
        "name": probe.name,
        "prompt_tokens": len(probe.prompt_token_ids),
        "submitted_token_ids": list(probe.prompt_token_ids),
        "messages": probe.messages,
        "requests": reqs,
        "skipped": None,
    }
    reuse_arm = mode != "baseline" and baseline_probe is not None and bool(baseline_probe.requests)
    base_cold = baseline_probe.requests[0] if reuse_arm else None  # prompt logprobs, where the probe asked for them
    pv = prompt_logprobs.judge_probe(pv, probe.requests, base_cold, reqs, reuse_arm)
    if probe.adapter is not None:  # the LoRA adapter it ran under (repro.plan.adapters); absent otherwise, as before
        entry["adapter"] = probe.adapter["label"]
    if probe.cache_salt is not None:  # the tenant salt it was sent with (repro.plan.salts); absent otherwise
        entry["cache_salt"] = probe.cache_salt
    return entry, pv


def _skipped_entry(name: str, why: str | None) -> dict:
    """The entry of a probe with no result: skipped (why), or asked for and missing from the result (None)."""
    return {
        "name": name,
        "prompt_tokens": None,
        "submitted_token_ids": None,
        "messages": None,
        "requests": [],
        "skipped": why,
    }


def judge_arm(
    result: ArmResult,
    baseline: ArmResult | None,
    mode: str,
    block_size: int,
    skip_probes: dict[str, str] | None = None,
    asked: Mapping[str, int] | None = None,
    counts_external: bool = False,
    max_tokens: int | None = None,
) -> tuple[list[dict], ArmVerdict]:
    """(probe entries, arm verdict) for an arm whose child delivered a result.

    asked: what its job asked for, probe name -> requests (cold + reuses). A probe asked for that the result
    lacks is INCONCLUSIVE, and so is one with fewer requests than asked: an arm is judged on what it was
    asked to run, never on the part of it that came back (None: not known, as for an old caller). max_tokens:
    what each request was asked for; an answer of another length is none (repro.judge.answer)."""
    if mode != "baseline":
        if baseline is None:
            return [], decide_no_baseline()
        problems = comparability_problems(baseline, result)
        if problems:
            return [], decide_incomparable(problems)
    base_probes = {p.name: p for p in (baseline.probes if baseline else ())}
    between = (result.effective_config or {}).get("between_requests")
    seen = served_prompts(
        [p.name for p in result.probes], between, {n: p.prompt_token_ids for n, p in base_probes.items()}
    )
    answers = {name: list(p.requests[0].token_ids) for name, p in base_probes.items() if p.requests and name in seen}
    sibs = adapters.siblings(base_probes.values()) if mode != "baseline" else {}
    judged = [
        judge_probe(p, base_probes.get(p.name), mode, answers, counts_external, sibs.get(p.name), max_tokens)
        for p in result.probes
    ]
    judged += [(_skipped_entry(name, why), decide_skipped(why)) for name, why in sorted((skip_probes or {}).items())]
    verdicts = {entry["name"]: pv for entry, pv in judged}
    got = {p.name: len(p.requests) for p in result.probes}
    for name, n in (asked or {}).items():
        if name in (skip_probes or {}):
            continue
        if name not in got:
            judged.append((_skipped_entry(name, None), decide_missing_probe(None, n)))
            verdicts[name] = judged[-1][1]
        elif got[name] < n:
            verdicts[name] = decide_missing_probe(verdicts[name], n, got[name])
    if mode != "baseline":  # a hit of KV only another tenant salt sent (repro.judge.salts); not on a server not ours
        verdicts = salts.judge_probes(
            result.probes, verdicts, (result.effective_config or {}).get("frontend") != ENDPOINT
        )
    for key in {adapters.identity(p) for p in result.probes}:  # another adapter's or image's KV is no probe's to reuse
        these = {p.name: list(p.prompt_token_ids) for p in result.probes if adapters.identity(p) == key}
        for first, second in shared_first_blocks(these, block_size):
            verdicts[second] = decide_shared_first_block(verdicts[second], first)
    entries = []
    for entry, _ in judged:
        pv = verdicts[entry["name"]]
        entries.append({**entry, "verdict": pv.verdict, "reasons": list(pv.reasons)}
                       | ({"finding": pv.finding} if pv.finding else {}))  # fmt: skip
    return entries, decide_arm([(e["name"], verdicts[e["name"]]) for e in entries])
