"""Image probes without an engine: the tiny vision-language model's bytes, the seeded images (a pinned digest), the
collision pair fixtures/scenarios-cpu-images.json pins (recomputed), the planted connector's key salts, and the
fixture loader's one-line errors (exit 2) for bad input."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from kvkit_testutil import ROOT, run_cli

from repro.engine.connectors.planted_keys import KEYS, image_ids, salt
from repro.errors import UsageError
from repro.judge import adapters as key_identity
from repro.models import tiny, vlm
from repro.plan import images
from repro.plan.fixtures import load_fixture

FIXTURE = ROOT / "fixtures" / "scenarios-cpu-images.json"
# numpy's default_rng(1).integers(0, 256, (64, 64, 3), uint8): the same on every machine (numpy pins its
# generator's stream: PCG64 and the integers method)
SEED1_PIXELS_SHA256 = "54fa72f530002d6630c2ceb2c7fb73abb3ecaeb0f7135e534895ddb83b4a5d40"


def _images_of(fixture: dict) -> dict[str, dict]:
    return {p["name"]: p["prompt"]["image"] for p in fixture["probes"] if "image" in p["prompt"]}


# ---- the model


def test_the_vlm_is_the_same_bytes_for_a_seed_and_holds_the_image_tokens():
    one, again = vlm.model_files(), vlm.model_files()
    assert one == again and vlm.model_files(seed=7)["model.safetensors"] != one["model.safetensors"]
    config = json.loads(one["config.json"])
    assert config["architectures"] == ["Idefics3ForConditionalGeneration"]
    assert config["image_token_id"] == vlm.IMAGE_TOKEN_ID == tiny.CONFIG["vocab_size"]
    vocab = json.loads(one["tokenizer.json"])["model"]["vocab"]
    assert vocab["<image>"] == 320 and vocab["<row_2_col_2>"] == 327 and max(vocab.values()) < vlm.VOCAB
    processor = json.loads(one["processor_config.json"])["image_processor"]
    # the recipe the CPU engine runs (the module's docstring: no torchvision; one tile counts 0 patches)
    assert processor["image_processor_type"] == "Idefics3ImageProcessorPil" and processor["do_image_splitting"]
    assert processor["size"]["longest_edge"] == 2 * processor["max_image_size"]["longest_edge"] == 128


def test_make_vlm_is_idempotent(tmp_path):
    digest = vlm.make_vlm(tmp_path / "m")
    assert vlm.make_vlm(tmp_path / "m") == digest == tiny.digest_dir(tmp_path / "m")
    assert images.image_token_id(str(tmp_path / "m")) == 320 and vlm.is_vlm(str(tmp_path / "m"))


# ---- the images


def test_a_seeded_image_is_the_same_pixels_on_every_machine():
    data = images.pixels({"seed": 1, "size": [64, 64]})
    assert data.shape == (64, 64, 3) and str(data.dtype) == "uint8"
    assert hashlib.sha256(data.tobytes()).hexdigest() == SEED1_PIXELS_SHA256
    assert images.pixels({"seed": 1, "size": [32, 16]}).shape == (16, 32, 3)  # [width, height]
    assert images.image_uuid({"seed": 1, "size": [64, 64]}) != images.image_uuid({"seed": 2, "size": [64, 64]})


def test_lmcaches_reduction_keeps_the_low_16_bits():
    assert images.int16("ab12cd34") == 0xCD34 and images.int16("0" * 63 + "1") == 1


def test_the_fixtures_collision_pair_collides_in_16_bits_and_is_the_first():
    shown = _images_of(json.loads(FIXTURE.read_text(encoding="utf-8")))
    c, d = shown["img-C"], shown["img-D"]
    uc, ud = images.image_uuid(c), images.image_uuid(d)
    assert uc != ud and images.int16(uc) == images.int16(ud)
    assert images.find_collision((64, 64), range(3, 1000)) == (c["seed"], d["seed"]) == (26, 421)
    a, b = images.image_uuid(shown["img-A"]), images.image_uuid(shown["img-B"])
    assert images.int16(a) != images.int16(b)  # a-then-b: the 16-bit key tells A from B
    assert shown["img-A-raw"] == {**shown["img-A"], "processor": {"do_normalize": False}}


# ---- the planted keys


def _request(*identifiers: str, lora=None):
    features = [
        SimpleNamespace(identifier=i, mm_position=SimpleNamespace(offset=10 * n)) for n, i in enumerate(identifiers)
    ]
    return SimpleNamespace(mm_features=list(reversed(features)), lora_request=lora)


def test_the_planted_keys_salt_what_each_names():
    assert KEYS == ("tokens", "tokens+adapter", "tokens+image", "tokens+image16")
    a, b = "f" * 60 + "1234", "e" * 60 + "1234"  # other identifiers, the same low 16 bits
    assert image_ids(_request(a, b)) == [a, b]  # in prompt order
    assert salt("tokens", None, [a]) == salt("tokens", None, [b]) == ""
    assert salt("tokens+image", None, [a]) != salt("tokens+image", None, [b])
    assert salt("tokens+image16", None, [a]) == salt("tokens+image16", None, [b]) == "image16\x004660"
    assert salt("tokens+image16", None, ["0" * 64]) != salt("tokens+image16", None, [a])
    lora = SimpleNamespace(lora_name="A", lora_int_id=1, lora_path="/x")
    assert salt("tokens+adapter", lora, [a]) == "lora\x00A\x001\x00/x" and salt("tokens+image", lora, []) == ""
    assert image_ids(SimpleNamespace()) == []


def test_a_probes_image_is_what_key_identity_tells_apart():
    def probe(name, image):
        return SimpleNamespace(name=name, prompt_token_ids=(1, 2, 320), adapter=None, image=image)

    a, b = probe("A", {"seed": 1, "size": [64, 64]}), probe("B", {"seed": 2, "size": [64, 64]})
    a2 = probe("A2", {"seed": 1, "size": [64, 64]})
    raw = probe("R", {"seed": 1, "size": [64, 64], "processor": {"do_normalize": False}})
    sibs = key_identity.siblings([a, b, a2, raw])
    assert sibs["A"] == {"B": "image seed 2", "R": "image seed 1 (do_normalize=False)"}
    assert "A2" not in sibs["A"] and key_identity.identity(a) == key_identity.identity(a2) != key_identity.identity(b)
    assert key_identity.siblings([probe("x", None), probe("y", None)]) == {}
    assert "cannot tell the images apart" in key_identity.alike_reason(["image seed 2"])
    assert "cannot tell the adapters apart" in key_identity.alike_reason(["adapter B"])


# ---- the fixture


def _fixture(tmp: Path, image: object, version: int = 4, **prompt) -> Path:
    body = {"token_ids": [257, 85, 320, 68, 10]} | prompt
    if image is not ...:
        body["image"] = image
    data = {"kind": "kvkit-fixture", "schema_version": version, "name": "t", "tokenizer": {"name": "t"},
            "probes": [{"name": "p", "prompt": body}]}  # fmt: skip
    path = tmp / "fixture.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_the_shipped_fixture_loads_with_its_images():
    probes = {p.name: p for p in load_fixture(FIXTURE).probes}
    assert probes["img-A"].image == {"seed": 1, "size": [64, 64]}
    assert probes["img-A-raw"].prompt_spec()["image"]["processor"] == {"do_normalize": False}
    assert len({p.token_ids for p in probes.values()}) == 1  # one text, other images


@pytest.mark.parametrize(
    ("image", "version", "message"),
    [
        ({"seed": 1, "size": [64, 64]}, 3, "a prompt's image needs schema_version 4"),
        ({"seed": 1, "size": [64, 64], "colour": 1}, 4, "unknown field 'colour'"),
        ({"seed": -1, "size": [64, 64]}, 4, "seed: must be an integer of at least 0"),
        ({"seed": 1}, 4, r"size: must be \[width, height\]"),
        ({"seed": 1, "size": [0, 64]}, 4, r"size: must be \[width, height\]"),
        ({"seed": 1, "size": [64, 64], "processor": {"gamma": 2}}, 4, "unknown setting 'gamma'"),
        ({"seed": 1, "size": [64, 64], "processor": {"do_normalize": 0}}, 4, "no value the image processor takes"),
        ({"seed": 1, "size": [64, 64], "processor": {}}, 4, "non-empty object of mm_processor_kwargs"),
        (None, 4, "prompt.image: must be an object"),
    ],
)
def test_a_bad_image_is_one_line(tmp_path, image, version, message):
    with pytest.raises(UsageError, match=message):
        load_fixture(_fixture(tmp_path, image, version))


def test_an_image_needs_a_token_ids_prompt(tmp_path):
    path = _fixture(tmp_path, ...)
    data = json.loads(path.read_text())
    data["probes"][0]["prompt"] = {"chat": {"messages": [{"role": "user", "content": "x"}], "length": 9, "filler": "a"},
                                   "image": {"seed": 1, "size": [8, 8]}}  # fmt: skip
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match="an image goes with a token_ids prompt"):
        load_fixture(path)


def test_the_model_must_take_images_and_the_prompt_hold_its_placeholder_once(tmp_path):
    probes = load_fixture(_fixture(tmp_path, {"seed": 1, "size": [64, 64]})).probes
    tiny.make_tiny_model(tmp_path / "tiny")
    with pytest.raises(UsageError, match="names an image and --model .* takes none"):
        images.check_images(probes, str(tmp_path / "tiny"), True)
    with pytest.raises(UsageError, match="takes none"):
        images.check_images(probes, "org/hub-model", False)
    vlm.make_vlm(tmp_path / "vlm")
    images.check_images(probes, str(tmp_path / "vlm"), True)
    twice = load_fixture(_fixture(tmp_path, {"seed": 1, "size": [64, 64]}, token_ids=[320, 5, 320])).probes
    with pytest.raises(UsageError, match="hold the image placeholder 320 2 times"):
        images.check_images(twice, str(tmp_path / "vlm"), True)


def test_an_image_probe_on_a_model_without_images_is_one_line_exit_2(tmp_path):
    tiny.make_tiny_model(tmp_path / "tiny")
    report = tmp_path / "r.json"
    proc = run_cli(["--model", str(tmp_path / "tiny"), "--device", "cpu", "--fixture", str(FIXTURE),
                    "--report", str(report)], timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().count("\n") == 0 and "names an image and --model" in proc.stderr
    assert not report.exists()


def test_image_probes_refuse_the_native_matched_control(tmp_path):
    probes = load_fixture(_fixture(tmp_path, {"seed": 1, "size": [64, 64]})).probes
    images.check_native_matched(probes, False)
    with pytest.raises(UsageError, match="pass --no-native-matched"):
        images.check_native_matched(probes, True)


def test_image_probes_served_are_one_line_exit_2(tmp_path):
    """The served front end sends token IDs without the image: an image probe there is refused before any server."""
    vlm.make_vlm(tmp_path / "vlm")
    report = tmp_path / "r.json"
    proc = run_cli(["--model", str(tmp_path / "vlm"), "--device", "cpu", "--fixture", str(FIXTURE), "--frontend",
                    "server", "--no-native-matched", "--report", str(report)], timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().count("\n") == 0 and "image probes cannot run served" in proc.stderr
    assert not report.exists()
