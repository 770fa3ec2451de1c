import json
import struct

import jinja2

from repro.models.tiny import digest_dir, digest_files, make_tiny_model, model_files


def test_same_seed_same_bytes(tmp_path):
    a = make_tiny_model(tmp_path / "a")
    b = make_tiny_model(tmp_path / "b")
    assert a == b == digest_dir(tmp_path / "a")
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()


def test_different_seed_different_model():
    assert digest_files(model_files(1)) != digest_files(model_files(2))


def test_qwen3_architecture_and_chat_template():
    """What vLLM and the tokenizer will read from the written files, not the module's constants."""
    files = model_files()
    assert set(files) >= {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    config = json.loads(files["config.json"])
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
    header_len = struct.unpack("<Q", files["model.safetensors"][:8])[0]
    tensors = json.loads(files["model.safetensors"][8 : 8 + header_len])
    layers = config["num_hidden_layers"]
    # Qwen3's per-head q/k norms, in every layer: what makes vLLM pick its Qwen3 attention
    assert {f"model.layers.{i}.self_attn.k_norm.weight" for i in range(layers)} <= set(tensors)
    assert {f"model.layers.{i}.self_attn.q_norm.weight" for i in range(layers)} <= set(tensors)
    assert tensors["model.embed_tokens.weight"]["shape"] == [config["vocab_size"], config["hidden_size"]]
    template = json.loads(files["tokenizer_config.json"])["chat_template"]
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    rendered = jinja2.Environment().from_string(template).render(messages=messages, add_generation_prompt=True)
    assert rendered == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    specials = {t["content"] for t in json.loads(files["tokenizer.json"])["added_tokens"]}
    assert {"<|im_start|>", "<|im_end|>"} <= specials
