"""Engine side of the model calibration: one seed's smallest relative top-1/top-2 logit gap.

`python -m repro.engine.margins SEED FIXTURE` builds that seed's tiny model, decodes the
self-test prompts greedily with caching off (float32) and prints one JSON line. The parent half
(repro.margins) runs one such child per seed.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path


def measure_seed(seed: int, fixture: str) -> dict:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams, TokensPrompt

    from repro.engine.child import build_chat_prompt
    from repro.suite import BOUNDARY_LENGTHS, boundary_probe
    from repro.tinymodel import make_tiny_model

    model = Path(tempfile.mkdtemp(prefix=f"kvkit-margins-{seed}-"))
    make_tiny_model(model, seed=seed)
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [p["prompt"]["token_ids"] for p in json.loads(Path(fixture).read_text())["probes"]]
    prompts += [build_chat_prompt(tok, boundary_probe(n).chat)[0] for n in BOUNDARY_LENGTHS]
    llm = LLM(
        model=str(model),
        dtype="float32",
        enforce_eager=True,
        gpu_memory_utilization=0.1,
        max_model_len=2048,
        block_size=16,
        enable_prefix_caching=False,
        logprobs_mode="raw_logits",
        max_num_seqs=1,
    )
    sp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
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


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m repro.engine.margins SEED FIXTURE", file=sys.stderr)
        return 2
    print(json.dumps(measure_seed(int(argv[0]), argv[1])), flush=True)
    os._exit(0)  # no engine teardown: the parent reaps this process group


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
