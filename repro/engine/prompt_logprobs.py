"""Prompt logprobs in the engine child: the SamplingParams a prompt's requests are sent with (its prompt spec's
"prompt_logprobs": k, repro.plan.prompt_logprobs) and the compact record of what vLLM returned for them.

The record keeps, for each prompt position from the second token on (vLLM returns None for the first), the prompt
token's logprob and the top-1 token ID (the alternative of rank 1; None where k is 0 and the prompt token is not
it). A value that is no JSON number (NaN, an infinity: what uninitialized memory can hold) is kept as None, and
`nonfinite` counts them, so that writing the result never fails on it. `prompt_tokens` is the prompt's length as the
engine saw it: a record with fewer positions than it has from the second token on holds none for the rest (a
stream carries no prompt logprobs, an endpoint may ignore the field), which the judge reads as missing.
"""

from __future__ import annotations

import math


def sampling_for(sp, prompts: list[dict]):
    """The sampling parameters for these prompts in order: `sp` itself where none asks for prompt logprobs (the
    call is then as it always was), else one per prompt: `sp`, or where it asks a SamplingParams built afresh with
    sp's settings and prompt_logprobs=k, so that vLLM's own __post_init__ decides the rest (skip_reading_prefix_cache
    among them: the kit sets nothing of its own), and detokenize=False: the kit reads token IDs only, and vLLM
    decodes every prompt-logprob alternative's ID to text, where an ID that is no token (what an uninitialized
    tensor holds, a negative int32) raises OverflowError in the tokenizer and ends the generate call (measured on
    ExampleConnector's first reuse with them, vLLM 0.28.0 on the CPU): with it off the IDs come back as they are."""
    ks = [p.get("prompt_logprobs") for p in prompts]
    if all(k is None for k in ks):
        return sp
    keep = {a: getattr(sp, a) for a in ("temperature", "max_tokens", "ignore_eos", "logprobs", "seed")}
    return [sp if k is None else type(sp)(**keep, prompt_logprobs=k, detokenize=False) for k in ks]


def record(out, k: int | None) -> dict | None:
    """The compact record of a RequestOutput's prompt logprobs (None where it asked for none)."""
    if k is None:
        return None
    logprobs, top1, nonfinite = [], [], 0
    prompt_ids = list(out.prompt_token_ids or [])
    for pos, step in enumerate(out.prompt_logprobs or []):
        if pos == 0 and step is None:
            continue  # the first prompt token has no logprob
        token = prompt_ids[pos] if pos < len(prompt_ids) else None
        entry = None if step is None or token is None else step.get(token)
        value = None if entry is None else float(entry.logprob)
        if value is not None and not math.isfinite(value):
            value, nonfinite = None, nonfinite + 1
        logprobs.append(value)
        ranked = [int(t) for t, lp in (step or {}).items() if getattr(lp, "rank", None) == 1]
        top1.append(ranked[0] if ranked else None)
    return {"k": k, "logprobs": logprobs, "top1": top1, "nonfinite": nonfinite, "prompt_tokens": len(prompt_ids)}
