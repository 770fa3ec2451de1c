"""The Hugging Face tokenizer files of a GGUF's byte-level BPE vocabulary (tokenizer.ggml.model "gpt2").

llama.cpp splits text before BPE by its pre-tokenizer type (tokenizer.ggml.pre; llama-vocab.cpp). The
ones written here, as the `tokenizers` pre-tokenizers that split the same way:
- "smollm" (also starcoder, refact, command-r, codeshell, exaone): every digit alone ("\\p{N}"), then
  GPT-2's regex: Digits(individual_digits) then ByteLevel with its regex, as SmolLM2's own tokenizer.json.
- "gpt2" (and "default"): GPT-2's regex alone.
Tokens llama.cpp marks CONTROL (type 3) are special added tokens, matched whole.
"""

from __future__ import annotations

from repro.models.gguf import GGUFError, GGUFFile

_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
PRE_TOKENIZERS = {
    "smollm": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, _BYTE_LEVEL]},
    "gpt2": _BYTE_LEVEL,
    "default": _BYTE_LEVEL,
}
CONTROL = 3


def _token(gg: GGUFFile, key: str) -> str | None:
    tokens = gg.field("tokenizer.ggml.tokens", list)
    index = gg.metadata.get(key)
    return tokens[index] if isinstance(index, int) and 0 <= index < len(tokens) else None


def tokenizer_files(gg: GGUFFile, max_length: int) -> dict[str, dict]:
    """tokenizer.json, tokenizer_config.json (with the chat template) and special_tokens_map.json."""
    if gg.field("tokenizer.ggml.model", str) != "gpt2":
        raise GGUFError(f"{gg.path}: tokenizer {gg.metadata['tokenizer.ggml.model']!r} (only byte-level BPE, gpt2)")
    pre = gg.metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise GGUFError(f"{gg.path}: pre-tokenizer {pre!r} not supported (known: {', '.join(PRE_TOKENIZERS)})")
    tokens = gg.field("tokenizer.ggml.tokens", list)
    types = gg.field("tokenizer.ggml.token_type", list)
    merges = gg.field("tokenizer.ggml.merges", list)
    strings = all(isinstance(x, str) for x in tokens + merges)
    if (
        not strings
        or len(types) != len(tokens)
        or len(set(tokens)) != len(tokens)
        or any(m.count(" ") != 1 for m in merges)
    ):
        raise GGUFError(f"{gg.path}: corrupt vocabulary ({len(tokens)} tokens, {len(types)} types, duplicates)")
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": True}
        for i, (t, kind) in enumerate(zip(tokens, types)) if kind == CONTROL
    ]  # fmt: skip
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": [m.split(" ", 1) for m in merges],
        },
    }
    special = {
        k: v
        for k, v in (
            ("bos_token", _token(gg, "tokenizer.ggml.bos_token_id")),
            ("eos_token", _token(gg, "tokenizer.ggml.eos_token_id")),
            ("unk_token", _token(gg, "tokenizer.ggml.unknown_token_id")),
            ("pad_token", _token(gg, "tokenizer.ggml.padding_token_id")),
        )
        if v is not None
    }
    config = {
        **special,
        "add_bos_token": bool(gg.metadata.get("tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    template = gg.metadata.get("tokenizer.chat_template")
    if isinstance(template, str):
        config["chat_template"] = template
    return {"tokenizer.json": tokenizer, "tokenizer_config.json": config, "special_tokens_map.json": special}
