"""The kit's seeded LoRA adapters on the real vLLM CPU engine (groundwork for key-identity probes): two adapters
of the tiny model answer differently from the base model and from each other, and native prefix caching keys its
blocks on the adapter, so a reuse under the same adapter hits and gives that adapter's answer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, have_vllm

from repro.models.lora import make_adapter

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

SCRIPT = r"""
import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"; os.environ["OMP_NUM_THREADS"] = "1"
from vllm import LLM, SamplingParams, TokensPrompt
from vllm.lora.request import LoRARequest
model, a, b, prompts = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=2048, block_size=16, seed=0,
          enable_prefix_caching=True, enable_lora=True, max_lora_rank=8, max_loras=2,
          kv_cache_memory_bytes=256 * 1024 * 1024)
sp = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
out = {}
for label, req in (("base", None), ("A", LoRARequest("a", 1, a)), ("B", LoRARequest("b", 2, b)),
                   ("A-again", LoRARequest("a", 1, a)), ("B-again", LoRARequest("b", 2, b))):
    for name, ids in prompts.items():
        o = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, lora_request=req, use_tqdm=False)[0]
        out[f"{label} {name}"] = [o.num_cached_tokens, list(o.outputs[0].token_ids)]
print("RESULT " + json.dumps(out))
"""


def test_two_adapters_answer_apart_and_native_reuse_keys_on_the_adapter(tiny_model, tmp_path):
    make_adapter(tiny_model, tmp_path / "a", seed=1)
    make_adapter(tiny_model, tmp_path / "b", seed=2)
    fixture = json.loads((ROOT / "fixtures" / "selftest-cpu.json").read_text(encoding="utf-8"))
    prompts = {"fixture": fixture["probes"][0]["prompt"]["token_ids"], "short": [(i * 7) % 300 + 3 for i in range(300)]}
    argv = [sys.executable, "-c", SCRIPT, tiny_model, str(tmp_path / "a"), str(tmp_path / "b"), json.dumps(prompts)]
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    for name in prompts:
        base, a, b = (out[f"{k} {name}"][1] for k in ("base", "A", "B"))
        assert base != a and base != b and a != b, name  # the probe would prove nothing otherwise
        for first in ("base", "A", "B"):
            assert out[f"{first} {name}"][0] == 0, (first, name)  # each first request under its key is a miss
        for again, own in (("A-again", a), ("B-again", b)):
            cached, tokens = out[f"{again} {name}"]
            assert cached > 0 and tokens == own, (again, name, cached)
