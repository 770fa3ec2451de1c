"""Key identity for images on the real vLLM CPU engine: fixtures/scenarios-cpu-images.json on the kit's tiny
Idefics3 model (repro.models.vlm), one verifier run (its plain probes and three scenarios, native beside four
connector arms), every assertion on its report.

One text prompt with images the kit draws from seeds: A and B (seeds 1 and 2), C and D (seeds 26 and 421, whose
identifiers share their low 16 bits), and A's bytes under another processor setting. A reuse across images must miss
or give its own image's baseline. PlantedTokenKeys (a faithful store keyed on the tokens alone) fails every scenario,
answering as the first image; PlantedImageKeys (the image identifiers in the key) passes; PlantedImage16Keys (their
low 16 bits, as LMCache 0.5.4) passes a-then-b and processor and fails collide; vLLM's ExampleConnector (files named
by tokens and identifiers) and native prefix caching (identifiers in the block hash) pass."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, have_vllm
from e2e_runs import shared_run, verify
from planted_fixtures import fixture_argv

from repro.judge.expectations import expectation_met
from repro.models.registry import MODELS_DIR
from repro.models.vlm import MODEL_NAME, make_vlm
from repro.record.report import validate_report

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

FIXTURE = "fixtures/scenarios-cpu-images.json"
SCENARIOS = {"a-then-b": ("img-A", "img-B"), "collide": ("img-C", "img-D"), "processor": ("img-A", "img-A-raw")}
FIRST_SEEN = {"a-then-b": "image seed 1", "collide": "image seed 26", "processor": "image seed 1"}


def _run(_tiny_model: str, tmp):
    model = MODELS_DIR / MODEL_NAME
    make_vlm(model)  # as `make model MODEL=tiny-vlm` does
    report = tmp / "images.json"
    extra = ["--compare-native", "--no-native-matched", "--no-confirm", "--scenarios", "all", "--quiet"]
    return verify(fixture_argv(str(model), FIXTURE, report, *extra), report)


images_run = shared_run("images_run", _run)


def _fixture() -> dict:
    return json.loads((ROOT / FIXTURE).read_text(encoding="utf-8"))


def _arm(data: dict, name: str) -> dict:
    return next(a for a in data["arms"] if a["name"] == name)


def _scenario_arm(data: dict, scenario: str, arm: str) -> dict:
    return next(a for a in next(s for s in data["scenarios"] if s["name"] == scenario)["arms"] if a["arm"] == arm)


def _requests(arm: dict, step: int) -> list[dict]:
    return [r for r in arm["requests"] if r["step"] == step]


def test_it_runs_to_a_report_whose_findings_exit_1(images_run):
    assert images_run.data is not None, images_run.proc.stderr[-3000:]
    assert images_run.proc.returncode == 1, images_run.proc.stderr[-3000:]


def test_the_images_baselines_differ_on_every_probe(images_run):
    """The same tokens with other images (or another processor setting) answer differently with caching off, so
    every scenario can tell whose KV a reuse read (none says it cannot)."""
    base = {p["name"]: p["requests"][0]["token_ids"] for p in _arm(images_run.data, "baseline")["probes"]}
    for first, second in SCENARIOS.values():
        assert base[first] != base[second], (first, second)
    assert "cannot tell the images apart" not in json.dumps(images_run.data)


def test_every_verdict_is_the_fixtures(images_run):
    data, fixture = images_run.data, _fixture()
    for arm, table in fixture["expected"].items():
        got = {p["name"]: p["verdict"] for p in _arm(data, arm)["probes"]}
        for probe, want in table.items():
            assert expectation_met(want, got[probe]), (arm, probe, got[probe])
    for arm, table in fixture["expected_scenarios"].items():
        for scenario, want in table.items():
            entry = _scenario_arm(data, scenario, arm)
            assert expectation_met(want, entry["verdict"]), (arm, scenario, entry["verdict"], entry["reasons"])


def test_the_token_keyed_store_serves_the_first_images_kv_to_the_second(images_run):
    for scenario, (first, second) in SCENARIOS.items():
        arm = _scenario_arm(images_run.data, scenario, "PlantedTokenKeys")
        (r,) = _requests(arm, 1)
        assert r["probe"] == second and r["cached_tokens"] > 0 and r["verdict"] == "FAIL", (scenario, r["reasons"])
        assert r["kv"]["verdict"] == "FOREIGN", r["kv"]
        assert any(f"answers as {FIRST_SEEN[scenario]} ({first}'s baseline" in x for x in r["reasons"]), r["reasons"]


def test_the_16_bit_key_serves_c_to_d_and_tells_a_from_b(images_run):
    collide = _scenario_arm(images_run.data, "collide", "PlantedImage16Keys")
    (d,) = _requests(collide, 1)
    assert d["probe"] == "img-D" and d["cached_tokens"] > 0 and d["verdict"] == "FAIL", d["reasons"]
    assert (
        "answers as image seed 26 (img-C's baseline tokens @2-15)" in d["reasons"] and d["kv"]["verdict"] == "FOREIGN"
    )
    for scenario in ("a-then-b", "processor"):
        arm = _scenario_arm(images_run.data, scenario, "PlantedImage16Keys")
        assert [r["cached_tokens"] for r in _requests(arm, 1)] == [0], scenario
        assert all(r["cached_tokens"] > 0 for r in _requests(arm, 2)), scenario


def test_native_and_the_image_keyed_stores_miss_across_images_and_reuse_their_own(images_run):
    for name in ("native", "PlantedImageKeys", "ExampleConnector"):
        for scenario in SCENARIOS:
            arm = _scenario_arm(images_run.data, scenario, name)
            assert [r["cached_tokens"] for r in _requests(arm, 1)] == [0], (name, scenario)
            assert all(r["cached_tokens"] > 0 and r["verdict"] == "PASS" for r in _requests(arm, 2)), (name, scenario)


def test_the_report_names_each_image_and_its_16_bits(images_run):
    validate_report(images_run.data)  # its `images` and probes' images as the report schema says
    shown = images_run.data["images"]
    assert set(shown) == {"img-A", "img-B", "img-C", "img-D", "img-A-raw"}
    assert shown["img-C"]["int16"] == shown["img-D"]["int16"] and shown["img-C"]["uuid"] != shown["img-D"]["uuid"]
    assert shown["img-A"]["uuid"] == shown["img-A-raw"]["uuid"]  # the same bytes; vLLM rehashes with the setting
