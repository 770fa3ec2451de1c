"""Engine side of the model calibration: greedy steps' top-1/top-2 logit gaps, on the baseline.

`python -m repro.engine.margins SEED FIXTURE` builds that seed's tiny model, decodes the
self-test prompts greedily with caching off (float32) and prints one JSON line: the seed's smallest
relative top-1/top-2 logit gap. `python -m repro.engine.margins steps MODEL FIXTURE DTYPE` decodes
the fixture's probes (and the acceptance suite's boundary probes) on MODEL with caching off and
prints every step's token and top two raw logits, one JSON line after STEPS_MARK. The parent half
(repro.measure.margins) runs one such child per seed or per kernel variant.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

STEPS_MARK = "kvkit-steps "  # repro.measure.margins reads the line that starts with it
MAX_TOKENS = 16  # the verifier's default window


def _baseline_llm(model: str, dtype: str):
    """A cache-off engine as the verifier's CPU baseline builds it, returning raw logits."""
    from vllm import LLM

    from repro.engine.capabilities import cpu_block_size

    return LLM(
        model=model,
        dtype=dtype,
        enforce_eager=True,
        gpu_memory_utilization=0.1,
        max_model_len=2048,
        block_size=cpu_block_size(),  # as the self-test's --block-size auto picks it
        enable_prefix_caching=False,
        logprobs_mode="raw_logits",
        max_num_seqs=1,
    )


def measure_seed(seed: int, fixture: str) -> dict:
    from transformers import AutoTokenizer
    from vllm import SamplingParams, TokensPrompt

    from repro.contract.chat import build_chat_prompt
    from repro.models.tiny import make_tiny_model
    from repro.plan.suite import BOUNDARY_LENGTHS, boundary_probe

    model = Path(tempfile.mkdtemp(prefix=f"kvkit-margins-{seed}-"))
    make_tiny_model(model, seed=seed)
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [p["prompt"]["token_ids"] for p in json.loads(Path(fixture).read_text())["probes"]]
    prompts += [build_chat_prompt(tok, boundary_probe(n).chat)[0] for n in BOUNDARY_LENGTHS]
    llm = _baseline_llm(str(model), "float32")
    sp = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=2)
    ratios = []
    for ids in prompts:
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0].outputs[0]
        for step in out.logprobs:
            top = sorted((lp.logprob for lp in step.values()), reverse=True)
            ratios.append((top[0] - top[1]) / abs(top[0]))
    ratios.sort()
    return {
        "seed": seed,
        "steps": len(ratios),
        "min_relative_gap": round(ratios[0], 6),
        "smallest": [round(r, 6) for r in ratios[:4]],
    }


def measure_steps(model: str, fixture: str, dtype: str) -> dict:
    """Per probe: the greedy tokens and, per step, the top two [token, raw logit], best first."""
    import torch
    from transformers import AutoTokenizer
    from vllm import SamplingParams, TokensPrompt

    from repro.contract.chat import build_chat_prompt
    from repro.plan.fixtures import load_fixture
    from repro.plan.suite import build_probes

    tok = AutoTokenizer.from_pretrained(model)
    llm = _baseline_llm(model, dtype)
    sp = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=2)
    probes = {}
    for probe in build_probes(load_fixture(fixture).probes, "acceptance"):
        ids = list(probe.token_ids) if probe.token_ids is not None else build_chat_prompt(tok, probe.chat)[0]
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0].outputs[0]
        top = [sorted(([t, lp.logprob] for t, lp in step.items()), key=lambda e: -e[1])[:2] for step in out.logprobs]
        probes[probe.name] = {"tokens": list(out.token_ids), "top": top}
    # what the kernels' environment actually gave: ATen's vector ISA as torch chose it
    return {"dtype": dtype, "cpu_capability": torch.backends.cpu.get_cpu_capability(), "probes": probes}


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "steps":
        print(STEPS_MARK + json.dumps(measure_steps(argv[1], argv[2], argv[3])), flush=True)
    elif len(argv) == 2:
        print(json.dumps(measure_seed(int(argv[0]), argv[1])), flush=True)
    else:
        print("usage: python -m repro.engine.margins SEED FIXTURE | steps MODEL FIXTURE DTYPE", file=sys.stderr)
        return 2
    os._exit(0)  # no engine teardown: the parent reaps this process group


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
