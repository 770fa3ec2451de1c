"""Prompt-logprob probes: a fixture probe's `prompt_logprobs` (k: the top-k alternatives vLLM returns beside each
prompt token's own logprob) read and checked, one line and exit 2 on bad input.

vLLM's SamplingParams(prompt_logprobs=k) makes a request skip reading the prefix cache (vLLM 0.28
sampling_params.py: skip_reading_prefix_cache defaults to `prompt_logprobs is not None`), so a probe that asks for
them checks both what reuse does to its prompt logprobs and whether the arm reused at all (repro.judge.prompt_logprobs).
"""

from __future__ import annotations

from dataclasses import replace

from repro.errors import UsageError

# vLLM's ModelConfig.max_logprobs default (vllm/config/model.py, vLLM 0.28): the engine refuses a request for more,
# and the kit never raises it. -1 (all of the vocabulary) is refused here too: a report keeps the top-1 alone.
MAX_PROMPT_LOGPROBS = 20
KEY = "prompt_logprobs"


def prompt_logprobs_problem(value: object) -> str | None:
    """Why a probe's prompt_logprobs is no k the kit sends (None: it is one)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PROMPT_LOGPROBS:
        return f"must be an integer from 0 to {MAX_PROMPT_LOGPROBS} (vLLM's max_logprobs), got {value!r}"
    return None


def parse_prompt_logprobs(data: dict, probes: tuple, path) -> tuple:
    """The fixture's probes with each one's prompt_logprobs (None where it asks for none); data is the fixture's
    object (parse_probe has checked its probes are objects, in the same order). A file that asks for them says
    schema_version 3: a kit older than them would send those probes without and judge them as plain ones."""
    out = []
    for i, (raw, probe) in enumerate(zip(data["probes"], probes)):
        if KEY not in raw:
            out.append(probe)
            continue
        if data.get("schema_version", 0) < 3:
            raise UsageError(f"fixture {path}: probes[{i}].{KEY}: a probe's {KEY} needs schema_version 3")
        problem = prompt_logprobs_problem(raw[KEY])
        if problem is not None:
            raise UsageError(f"fixture {path}: probes[{i}].{KEY}: {problem}")
        out.append(replace(probe, prompt_logprobs=raw[KEY]))
    return tuple(out)
