"""A small Llama GGUF written with the `gguf` package, as llama.cpp's converter writes one: Q and K rows
permuted for its rope, weights quantized (Q4_1, the embedding Q8_0, one Q4_0 and one F16 tensor), a byte-level
BPE vocabulary with the smollm pre-tokenizer and a chat template. The original (Hugging Face layout) float32
weights come back with it, so a test knows what the conversion must give without reading the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN, HEADS, KV_HEADS, LAYERS, FFN = 64, 2, 1, 2, 96
HEAD_DIM = HIDDEN // HEADS
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# "12" is a merge the smollm pre-tokenizer must never apply: llama.cpp splits every digit alone.
MERGES = ["Ġ t", "h e", "1 2"]


def byte_chars() -> list[str]:
    """GPT-2's byte-to-character alphabet, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def vocabulary() -> list[str]:
    return SPECIALS + byte_chars() + ["Ġt", "he", "12"]


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute (HF rotate-half rows to interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    v = len(vocabulary())

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)

    out = {"model.embed_tokens.weight": mat(v, HIDDEN), "model.norm.weight": 1 + mat(1, HIDDEN)[0]}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out.update(
            {
                p + "input_layernorm.weight": 1 + mat(1, HIDDEN)[0],
                p + "post_attention_layernorm.weight": 1 + mat(1, HIDDEN)[0],
                p + "self_attn.q_proj.weight": mat(HEADS * HEAD_DIM, HIDDEN),
                p + "self_attn.k_proj.weight": mat(KV_HEADS * HEAD_DIM, HIDDEN),
                p + "self_attn.v_proj.weight": mat(KV_HEADS * HEAD_DIM, HIDDEN),
                p + "self_attn.o_proj.weight": mat(HIDDEN, HEADS * HEAD_DIM),
                p + "mlp.gate_proj.weight": mat(FFN, HIDDEN),
                p + "mlp.up_proj.weight": mat(FFN, HIDDEN),
                p + "mlp.down_proj.weight": mat(HIDDEN, FFN),
            }
        )
    return out


GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}  # fmt: skip


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{GGUF_NAMES[rest]}"


def quant_type(hf: str):
    from gguf import GGMLQuantizationType as T

    if hf.endswith("norm.weight"):
        return T.F32
    if hf == "model.embed_tokens.weight":
        return T.Q8_0
    if hf == "model.layers.1.mlp.up_proj.weight":
        return T.Q4_0
    if hf == "model.layers.1.self_attn.v_proj.weight":
        return T.F16
    return T.Q4_1


def roundtrip(hf: str, w: np.ndarray) -> np.ndarray:
    """What the file holds for a weight, dequantized, in HF row order (quantization runs along rows, so
    it commutes with llama.cpp's row permutation)."""
    from gguf import quants

    t = quant_type(hf)
    return np.asarray(quants.dequantize(quants.quantize(w, t), t), dtype=np.float32).reshape(w.shape)


def write_llama_gguf(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """Write the GGUF; return what each HF weight must convert to (float32, before the folder's rounding)."""
    import gguf
    from gguf import quants

    weights = hf_weights(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(vocabulary()))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(vocabulary())
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(vocabulary()) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(TEMPLATE)
    for hf, value in weights.items():
        stored = value
        if hf.endswith("q_proj.weight"):
            stored = llama_permute(value, HEADS)
        elif hf.endswith("k_proj.weight"):
            stored = llama_permute(value, KV_HEADS)
        t = quant_type(hf)
        data = quants.quantize(stored, t) if t not in (gguf.GGMLQuantizationType.F32,) else stored
        w.add_tensor(gguf_name(hf), data, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {hf: roundtrip(hf, value) for hf, value in weights.items()}
