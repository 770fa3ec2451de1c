"""Engine side: how decisive the tiny model's greedy steps are, per seed (model calibration).

`python -m repro.margins --seeds 1-8` builds each seed's model, decodes the self-test prompts
greedily with caching off (float32, CPU or GPU) and prints, per seed, the smallest gap between
the top two raw logits relative to the top logit. A small relative gap is a step that float16
rounding can flip between a cached and an uncached prefill. Looks at the baseline only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

KIT_ROOT = Path(__file__).resolve().parent.parent


def _one_seed(seed: int, fixture: str) -> None:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams, TokensPrompt

    from repro.engine import build_chat_prompt
    from repro.suite import BOUNDARY_LENGTHS, boundary_probe
    from repro.tinymodel import make_tiny_model

    model = Path(tempfile.mkdtemp(prefix=f"kvkit-margins-{seed}-"))
    make_tiny_model(model, seed=seed)
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [p["prompt"]["token_ids"] for p in json.loads(Path(fixture).read_text())["probes"]]
    prompts += [build_chat_prompt(tok, boundary_probe(n).chat)[0] for n in BOUNDARY_LENGTHS]
    llm = LLM(model=str(model), dtype="float32", enforce_eager=True, gpu_memory_utilization=0.1, max_model_len=2048,
              block_size=16, enable_prefix_caching=False, logprobs_mode="raw_logits", max_num_seqs=1)
    sp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
    ratios = []
    for ids in prompts:
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0].outputs[0]
        for step in out.logprobs:
            top = sorted((lp.logprob for lp in step.values()), reverse=True)
            ratios.append((top[0] - top[1]) / abs(top[0]))
    ratios.sort()
    print(json.dumps({"seed": seed, "steps": len(ratios), "min_relative_gap": round(ratios[0], 6),
                      "smallest": [round(r, 6) for r in ratios[:4]]}), flush=True)
    os._exit(0)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m repro.margins")
    p.add_argument("--seeds", default="1-8", help="a range like 1-8")
    p.add_argument("--fixture", default=str(KIT_ROOT / "fixtures" / "selftest-cpu.json"))
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one is not None:
        _one_seed(args.one, args.fixture)
    from repro.runner import child_env, run_child

    lo, _, hi = args.seeds.partition("-")
    env = child_env(dict(os.environ), hashseed="0", extra={})
    with tempfile.TemporaryDirectory(prefix="kvkit-margins-") as tmp:
        for seed in range(int(lo), int(hi or lo) + 1):  # one process per seed: a fresh engine each
            log = Path(tmp) / f"seed{seed}.log"
            # run_child reaps the engine's own processes, which would otherwise hold a pipe open
            run_child([sys.executable, "-m", "repro.margins", "--one", str(seed), "--fixture", args.fixture],
                      log_path=log, env=env, timeout_s=900)
            lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith('{"seed"')]
            print(lines[-1] if lines else json.dumps({"seed": seed, "error": "no result; see the engine log"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
