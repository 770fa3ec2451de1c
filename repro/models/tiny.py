"""A tiny, seeded Qwen3-architecture model with a byte-level tokenizer and a chat template.

Written with numpy and hand-serialized safetensors so that the same seed gives the same bytes
on every machine, and so that making it never imports torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

from repro.record.atomic import write_bytes_atomic

MODEL_SEED = 1234
# The seed of the float16 model used on GPUs. fp16 rounds logits to about 1/2048 of their size,
# so a greedy step whose top-1/top-2 gap is that small relative to the top logit is a coin flip
# between a cached and an uncached prefill: seed 1234 has one such step (gap 0.027% of the top
# logit) and on an H200 native prefix caching flipped exactly there (a flagged near-tie). This
# seed was chosen, by `python -m repro.measure.margins --seeds 1-8` (float32, CPU, the self-test prompts),
# as the one whose smallest relative gap over all 64 greedy steps is widest (1.27%, about 26 fp16
# ULPs; seed 1234's is 0.027%). The choice looks only at the baseline's own margins, never at a cached run.
FP16_MODEL_SEED = 6
# Small enough to load in seconds on two CPU cores; head_dim 64 is a size every CPU attention
# kernel supports.
CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 256,
    "eos_token_id": 258,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 256,
    "initializer_range": 0.02,
    "intermediate_size": 512,
    "max_position_embeddings": 4096,
    "max_window_layers": 4,
    "num_attention_heads": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "transformers_version": "4.57.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 320,
}
# Argmax margins must be wide, so that legitimate floating-point differences between a cached
# and an uncached prefill never flip a greedy token: scale lm_head well above the usual init.
LM_HEAD_SCALE = 3.0
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MODEL_NAME = "kvkit-tiny-qwen3"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte-to-printable-character map, used by ByteLevel tokenizers."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def build_tokenizer_json() -> dict:
    """Byte-level BPE with no merges: every byte is a token, so any text tokenizes."""
    byte_map = _bytes_to_unicode()
    vocab = {byte_map[b]: b for b in range(256)}
    specials = SPECIAL_TOKENS + [f"<|reserved_{i}|>" for i in range(CONFIG["vocab_size"] - 256 - len(SPECIAL_TOKENS))]
    added = []
    for i, tok in enumerate(specials):
        vocab[tok] = 256 + i
        added.append(
            {
                "id": 256 + i,
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def build_tokenizer_config() -> dict:
    return {
        "added_tokens_decoder": {},
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "model_max_length": CONFIG["max_position_embeddings"],
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def decoder_layer(p: str, h: int, nq: int, nkv: int, inter: int, qk_norm: int = 0) -> list:
    """(name, shape, init std) of one Llama-style decoder layer's weights (0.0: ones, a norm's), in a fixed order;
    qk_norm: Qwen3's per-head q/k norms of that size (0: none)."""
    norms = [("self_attn.q_norm.weight", (qk_norm,), 0.0), ("self_attn.k_norm.weight", (qk_norm,), 0.0)]
    return [(p + name, shape, std) for name, shape, std in [
        ("input_layernorm.weight", (h,), 0.0),
        ("post_attention_layernorm.weight", (h,), 0.0),
        ("self_attn.q_proj.weight", (nq, h), h**-0.5),
        ("self_attn.k_proj.weight", (nkv, h), h**-0.5),
        ("self_attn.v_proj.weight", (nkv, h), h**-0.5),
        ("self_attn.o_proj.weight", (h, nq), nq**-0.5),
        *(norms if qk_norm else []),
        ("mlp.gate_proj.weight", (inter, h), h**-0.5),
        ("mlp.up_proj.weight", (inter, h), h**-0.5),
        ("mlp.down_proj.weight", (h, inter), inter**-0.5),
    ]]  # fmt: skip


def _tensor_shapes() -> list[tuple[str, tuple[int, ...], float]]:
    """(name, shape, init std) for every weight, in a fixed order."""
    c = CONFIG
    h, hd, inter, v = c["hidden_size"], c["head_dim"], c["intermediate_size"], c["vocab_size"]
    nq, nkv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", (v, h), 1.0)]
    for i in range(c["num_hidden_layers"]):
        out += decoder_layer(f"model.layers.{i}.", h, nq, nkv, inter, qk_norm=hd)
    out += [("model.norm.weight", (h,), 0.0), ("lm_head.weight", (v, h), LM_HEAD_SCALE)]
    return out


def build_safetensors(seed: int = MODEL_SEED) -> bytes:
    """Serialize the weights by hand: a sorted JSON header and little-endian float32 data."""
    return seeded_safetensors(_tensor_shapes(), seed, f"repro.tinymodel seed={seed}")


def seeded_safetensors(shapes: list[tuple[str, tuple[int, ...], float]], seed: int, generator: str) -> bytes:
    """The weights of (name, shape, init std) drawn in that order from one seeded normal (std 0.0: ones, as an
    RMSNorm's weight starts), serialized by serialize_f32."""
    import numpy as np

    rng = np.random.default_rng(seed)
    blobs: list[tuple[str, tuple[int, ...], bytes]] = []
    for name, shape, std in shapes:
        if std == 0.0:  # norm weights: ones, as an RMSNorm starts
            arr = np.ones(shape, dtype="<f4")
        else:
            arr = (rng.standard_normal(shape) * std).astype("<f4")
        blobs.append((name, shape, arr.tobytes()))
    return serialize_f32(blobs, generator)


def serialize_f32(blobs: list[tuple[str, tuple[int, ...], bytes]], generator: str) -> bytes:
    """safetensors by hand: a sorted JSON header (its metadata naming the generator) and little-endian float32
    data in name order; the same blobs give the same bytes on every machine."""
    header: dict[str, object] = {"__metadata__": {"format": "pt", "generator": generator}}
    offset = 0
    for name, shape, data in sorted(blobs):
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    hbytes = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    hbytes += b" " * (-len(hbytes) % 8)
    return struct.pack("<Q", len(hbytes)) + hbytes + b"".join(d for _, _, d in sorted(blobs))


def json_file_bytes(obj: dict) -> bytes:
    """A model folder's JSON file as bytes: two-space indent, sorted keys, a trailing newline."""
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def model_files(seed: int = MODEL_SEED) -> dict[str, bytes]:
    return byte_model_files(CONFIG, build_safetensors(seed))


def byte_model_files(config: dict, safetensors: bytes) -> dict[str, bytes]:
    """A generated model's folder, by file name: its config and weights beside the byte-level tokenizer, chat
    template and generation settings every text model the kit generates shares (tiny, sliding, hybrid)."""
    return {
        "config.json": json_file_bytes(config),
        "generation_config.json": json_file_bytes({"bos_token_id": 256, "eos_token_id": 258, "do_sample": False}),
        "model.safetensors": safetensors,
        "special_tokens_map.json": json_file_bytes({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
        "tokenizer.json": json_file_bytes(build_tokenizer_json()),
        "tokenizer_config.json": json_file_bytes(build_tokenizer_config()),
    }


def digest_files(files: dict[str, bytes]) -> str:
    """One SHA-256 over the sorted (name, bytes) pairs: the model's identity."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).hexdigest().encode() + b"\n")
    return h.hexdigest()


def digest_dir(path: Path) -> str:
    """The same digest as digest_files, computed from a directory on disk."""
    files = {p.name: p.read_bytes() for p in sorted(Path(path).iterdir()) if p.is_file() and p.name != "SHA256"}
    return digest_files(files)


def make_tiny_model(dest: Path, seed: int = MODEL_SEED) -> str:
    """Write the model into dest (idempotent) and return its SHA-256."""
    return write_model(Path(dest), model_files(seed))


def write_model(dest: Path, files: dict[str, bytes]) -> str:
    """Write a generated model's files into dest with its digest beside them (idempotent); its SHA-256."""
    digest = digest_files(files)
    marker = dest / "SHA256"
    if marker.is_file() and marker.read_text().strip() == digest and digest_dir(dest) == digest:
        return digest
    os.makedirs(dest, exist_ok=True)
    for name, data in files.items():
        write_bytes_atomic(dest / name, data)
    write_bytes_atomic(marker, (digest + "\n").encode())
    return digest


def digest_line(folder: str | Path, digest: str) -> str:
    """'model kvkit-tiny-qwen3: sha256 of its files 1102c4…' (digest_files, in full): what a model command prints,
    never a bare digest that a reader of `make repro`'s setup cannot place."""
    return f"model {Path(folder).name}: sha256 of its files {digest}"


def model_main(argv: list[str], command: str, description: str, make, default_seed: int) -> int:
    """`python -m repro COMMAND DIR [--seed N]`: make(DIR, seed=N) writes a seeded model; its SHA-256 is printed,
    labelled (digest_line)."""
    from repro.commands import ArgumentParser

    parser = ArgumentParser(prog=f"python -m repro {command}", description=description)
    parser.add_argument("dir", help="where to write the model")
    parser.add_argument("--seed", type=int, default=default_seed, help=f"weight seed (default {default_seed})")
    args = parser.parse_args(argv)
    print(digest_line(args.dir, make(args.dir, seed=args.seed)))
    return 0


# The model kinds `make-model --kind` writes: the function that writes each (module:function, imported when asked,
# since those modules build on this one) and what it is. Every kind takes the same seeds and the same tokenizer.
MODEL_KINDS = {
    "tiny": ("repro.models.tiny:make_tiny_model", "the tiny Qwen3-architecture model, full attention"),
    "sliding": ("repro.models.sliding:make_sliding_model", "Llama architecture, three sliding-window layers, one full"),
    "hybrid": ("repro.models.hybrid:make_hybrid_model", "Nemotron-H architecture: Mamba-2, MLP, attention, MLP"),
}


def kind_maker(kind: str):
    """The function that writes a model of this kind (MODEL_KINDS)."""
    import importlib

    module, _, name = MODEL_KINDS[kind][0].partition(":")
    return getattr(importlib.import_module(module), name)


def main(argv: list[str]) -> int:
    """`python -m repro make-model DIR [--kind KIND] [--seed N]`: write the model and print its SHA-256."""
    from repro.commands import ArgumentParser

    parser = ArgumentParser(prog="python -m repro make-model", description=main.__doc__)
    parser.add_argument("dir", help="where to write the model")
    parser.add_argument(
        "--kind",
        choices=tuple(MODEL_KINDS),
        default="tiny",
        help="; ".join(f"{k}: {what}" for k, (_, what) in MODEL_KINDS.items()) + " (default tiny)",
    )
    parser.add_argument("--seed", type=int, default=MODEL_SEED, help=f"weight seed (default {MODEL_SEED})")
    args = parser.parse_args(argv)
    print(digest_line(args.dir, kind_maker(args.kind)(args.dir, seed=args.seed)))
    return 0
