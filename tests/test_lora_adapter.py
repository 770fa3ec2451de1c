"""The kit's seeded LoRA adapters (repro/models/lora.py) without an engine: PEFT's layout, shapes from the base
model's config, the same bytes for the same seed, bad input one line."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest
from kvkit_testutil import ROOT

from repro.errors import UsageError
from repro.models import lora, tiny


def _header(data: bytes) -> dict:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n])


def test_an_adapter_has_peft_layout_and_the_base_models_shapes():
    files = lora.adapter_files(tiny.CONFIG, "kvkit-tiny-qwen3", seed=1)
    cfg = json.loads(files["adapter_config.json"])
    assert cfg["peft_type"] == "LORA" and cfg["r"] == cfg["lora_alpha"] == lora.DEFAULT_RANK
    assert cfg["target_modules"] == ["q_proj", "v_proj"] and cfg["base_model_name_or_path"] == "kvkit-tiny-qwen3"
    header = _header(files["adapter_model.safetensors"])
    layers, hidden = tiny.CONFIG["num_hidden_layers"], tiny.CONFIG["hidden_size"]
    kv_out = tiny.CONFIG["num_key_value_heads"] * tiny.CONFIG["head_dim"]
    assert len([k for k in header if k != "__metadata__"]) == layers * 2 * 2
    pre = "base_model.model.model.layers.3.self_attn"
    assert header[f"{pre}.v_proj.lora_A.weight"]["shape"] == [lora.DEFAULT_RANK, hidden]
    assert header[f"{pre}.v_proj.lora_B.weight"]["shape"] == [kv_out, lora.DEFAULT_RANK]
    assert header["__metadata__"]["generator"] == "repro.models.lora seed=1 rank=8 scale=0.1"


def test_the_same_seed_gives_the_same_bytes_and_another_seed_other_ones():
    one = lora.adapter_files(tiny.CONFIG, "m", seed=1)["adapter_model.safetensors"]
    assert one == lora.adapter_files(tiny.CONFIG, "m", seed=1)["adapter_model.safetensors"]
    assert one != lora.adapter_files(tiny.CONFIG, "m", seed=2)["adapter_model.safetensors"]


def test_bad_input_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="rank of at least 1"):
        lora.adapter_files(tiny.CONFIG, "m", seed=1, rank=0)
    with pytest.raises(UsageError, match="lacks what an adapter needs"):
        lora.adapter_files({"hidden_size": 8}, "m", seed=1)
    argv = [
        sys.executable,
        "-m",
        "repro",
        "make-adapter",
        str(tmp_path / "no-model"),
        str(tmp_path / "a"),
        "--seed",
        "1",
    ]
    proc = subprocess.run(argv, check=False, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (
        proc.returncode == 2 and proc.stderr.count("\n") == 1 and "cannot read the base model's config" in proc.stderr
    )
    assert not (tmp_path / "a").exists()
