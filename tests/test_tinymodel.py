from repro.tinymodel import CONFIG, digest_dir, digest_files, make_tiny_model, model_files


def test_same_seed_same_bytes(tmp_path):
    a = make_tiny_model(tmp_path / "a")
    b = make_tiny_model(tmp_path / "b")
    assert a == b == digest_dir(tmp_path / "a")
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()


def test_different_seed_different_model():
    assert digest_files(model_files(1)) != digest_files(model_files(2))


def test_qwen3_architecture_and_chat_template(tmp_path):
    files = model_files()
    assert CONFIG["architectures"] == ["Qwen3ForCausalLM"]
    assert b"chat_template" in files["tokenizer_config.json"]
    assert set(files) >= {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
