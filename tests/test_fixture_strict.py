"""Fixtures refuse what they do not know: an unknown key at any level of a fixture, and an expectation name that
matches no probe, arm or scenario any run of it could have, are one line and exit 2 before any engine starts
(repro.plan.fixture_keys, repro.plan.expectation_names); the JSON Schema says the same; the P→D cases file and the
matrix file name the nearest known key alike. The two newcomer cases (a fixture with "expcted", a probe "fixtur")
once ran to the end and exited 1 blaming a KV finding the fixture did not state."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from kvkit_testutil import ROOT

from repro.disagg.cases import load_cases
from repro.errors import UsageError
from repro.matrix.spec import parse_matrix
from repro.plan.fixtures import load_fixture, parse_fixture
from repro.plan.options import parse_args, selftest_cpu_argv
from repro.plan.run_plan import build_plan

SELFTEST = ROOT / "fixtures" / "selftest-cpu.json"
FIXTURES = sorted((ROOT / "fixtures").glob("*.json")) + [ROOT / "tests" / "data" / "fixture-contended.json"]
SCHEMA = json.loads((ROOT / "schemas" / "fixture.schema.json").read_text(encoding="utf-8"))
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
FAKE = ["--engine-module", "tests.fake_engine"]  # a stand-in engine: no vLLM asked, and none is started here


def _selftest() -> dict:
    return json.loads(SELFTEST.read_text(encoding="utf-8"))


def _model(tmp: Path) -> Path:
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"vocab_size": 100000}))
    return model


def _write(tmp: Path, doc: dict, name: str = "fixture.json") -> Path:
    path = tmp / name
    path.write_text(json.dumps(doc, indent=2))
    return path


# --- the newcomer's two cases, through the verifier's own command line --------------------------------------------


def _expcted(doc: dict) -> None:
    doc["expcted"] = doc.pop("expected")


def _fixtur(doc: dict) -> None:
    doc["expected"]["native"]["fixtur"] = doc["expected"]["native"].pop("fixture")


@pytest.mark.parametrize(
    "mutate, said",
    [
        (_expcted, "top level: unknown field 'expcted' (did you mean 'expected'"),
        (_fixtur, "expected.native.fixtur: no probe named 'fixtur' (did you mean 'fixture'?"),
    ],
    ids=["expcted", "fixtur"],
)
def test_a_misspelt_key_or_probe_in_the_selftest_fixture_is_one_line_and_exit_2_before_any_engine(
    tmp_path, mutate, said
):
    """The self-test's own flags (make repro on the CPU) on a copy of its fixture with one typo; a stand-in engine
    that fails at once (exit 7) would make any arm an ERROR (exit 3): exit 2 says none started."""
    doc = _selftest()
    mutate(doc)
    fixture = _write(tmp_path, doc)
    report = tmp_path / "out" / "report.json"
    argv = [*selftest_cpu_argv(str(_model(tmp_path)), str(report), str(fixture)), *FAKE]
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path), KVKIT_WARM_IMPORT="0",
               KVKIT_FAKE=json.dumps({"modes": {"*": "exit7"}}))  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "repro.verify_kv_reuse", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0] == f"error: fixture {fixture}: {lines[0].split(': ', 2)[2]}", lines
    assert said in lines[0], lines[0]
    assert not report.exists() and not report.parent.exists(), "nothing is written for a refused fixture"
    assert time.monotonic() - started < 60


# --- every level of the fixture refuses a key it does not know ---------------------------------------------------


def _at(doc: dict, where: str) -> dict:
    """The object at a dotted path of a document ('probes.0.prompt')."""
    for part in where.split(".") if where else ():
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


SCENARIO = {"name": "s", "engine": {"max_num_seqs": 2}, "mp_server": {"chunk_size": 16},
            "steps": [{"submit": ["fixture"], "together": False}]}  # fmt: skip
LOAD_SCENARIO = {"name": "l", "load": {"prefixes": 1, "suffixes": 2, "prefix_tokens": 16, "suffix_tokens": 4,
                                       "rounds": 2, "seed": 0}}  # fmt: skip
MULTI = {"name": "M", "connector": "MultiConnector",
         "extra_config": {"connectors": [{"kv_connector": "ExampleConnector"}]}}  # fmt: skip
BOUND = {"verdict": "FAIL", "upstream": {"issue": "vllm-project/vllm#1", "package": "vllm", "versions": "<0.31"}}
IMAGE_PROBE = {"name": "img", "prompt": {"token_ids": [1, 2, 3], "image": {"seed": 1, "size": [8, 8],
                                                                           "processor": {"do_normalize": False}}}}  # fmt: skip


def _with(**top) -> dict:
    doc = _selftest()
    doc.update(top)
    return doc


CHAT_PROBE = {"name": "c", "prompt": {"chat": {"messages": [{"role": "user", "content": "x"}], "length": 8,
                                                "filler": "y"}}}  # fmt: skip
CHAT, IMAGE = _with(probes=[CHAT_PROBE]), _with(schema_version=4, probes=[IMAGE_PROBE])
MULTI_ARM, BOUND_ENTRY = (
    _with(arms=[MULTI], expected={}, expected_kv={}),
    _with(expected={"native": {"fixture": BOUND}}),
)
SCENARIOS, LOADS = _with(scenarios=[SCENARIO]), _with(scenarios=[LOAD_SCENARIO])
ADAPTERS = _with(schema_version=2, adapters={"A": {"seed": 1}}, lora={})
# (the document, the object the typo goes into, the typo, the path the refusal names, the key it should suggest)
NESTED = [
    (_selftest(), "", "probs", "top level", "probes"),
    (_selftest(), "tokenizer", "nmae", "tokenizer", "name"),
    (_selftest(), "probes.0", "reuse", "probes[0]", "reuses"),
    (_selftest(), "probes.0.prompt", "token_id", "probes[0].prompt", "token_ids"),
    (CHAT, "probes.0.prompt.chat", "filer", "probes[0].prompt.chat", "filler"),
    (CHAT, "probes.0.prompt.chat.messages.0", "contnet", "probes[0].prompt.chat.messages[0]", "content"),
    (IMAGE, "probes.0.prompt.image", "sizes", "probes[0].prompt.image", "size"),
    (IMAGE, "probes.0.prompt.image.processor", "do_normalise", "probes[0].prompt.image.processor", "do_normalize"),
    (_selftest(), "arms.0", "skip_probe", "arms[0]", "skip_probes"),
    (MULTI_ARM, "arms.0.extra_config", "connector", "arms[0].extra_config", "connectors"),
    (MULTI_ARM, "arms.0.extra_config.connectors.0", "kv_rol", "arms[0].extra_config.connectors[0]", "kv_role"),
    (BOUND_ENTRY, "expected.native.fixture", "verdit", "expected.native.fixture", "verdict"),
    (BOUND_ENTRY, "expected.native.fixture.upstream", "isue", "expected.native.fixture.upstream", "issue"),
    (SCENARIOS, "scenarios.0", "step", "scenarios[0]", "steps"),
    (SCENARIOS, "scenarios.0.steps.0", "togeter", "scenarios[0].steps[0]", "together"),
    (SCENARIOS, "scenarios.0.engine", "max_num_seq", "scenarios[0].engine", "max_num_seqs"),
    (SCENARIOS, "scenarios.0.mp_server", "chunksize", "scenarios[0].mp_server", "chunk_size"),
    (LOADS, "scenarios.0.load", "round", "scenarios[0].load", "rounds"),
    (ADAPTERS, "adapters.A", "rnak", "adapters.A", "rank"),
    (ADAPTERS, "lora", "max_lora", "lora", "max_loras"),
]


@pytest.mark.parametrize("doc, where, typo, path, suggested", NESTED, ids=[f"{n[1] or 'top'}:{n[2]}" for n in NESTED])
def test_an_unknown_key_at_any_level_is_one_line_naming_its_path_and_the_nearest_key(doc, where, typo, path,
                                                                                      suggested):  # fmt: skip
    doc = copy.deepcopy(doc)
    parse_fixture(doc, "f.json", "0" * 64)  # loads as it is
    assert VALIDATOR.is_valid(doc), next(VALIDATOR.iter_errors(doc)).message
    _at(doc, where)[typo] = 1
    with pytest.raises(UsageError) as info:
        parse_fixture(doc, "f.json", "0" * 64)
    text = str(info.value)
    what = "setting" if where.endswith("processor") else "field"
    assert text.startswith(f"fixture f.json: {path}: unknown {what} {typo!r} (did you mean {suggested!r}"), text
    assert "\n" not in text
    assert not VALIDATOR.is_valid(doc), "the schema refuses it too"
    with pytest.raises(
        UsageError, match=r"schema_version 99 is newer than this kit understands \(\d+\): upgrade the kit"
    ):
        parse_fixture({**doc, "schema_version": 99}, "f.json", "0" * 64)  # a newer kit's key: the version says so


def test_what_the_kit_passes_on_as_it_is_is_not_walked_into_and_a_typo_beside_it_is_refused():
    """A connector's extra_config, a scenario's LMCache keys and the reference are the connector's, LMCache's and
    the reader's own: the loader and the schema take any keys there, and still refuse a typo in the arm beside."""
    doc = _selftest()
    doc["arms"][0]["extra_config"] = {"anything": 1}
    doc["scenarios"] = [{**SCENARIO, "lmcache": {"any_lmcache_key": 1}}]
    doc["reference"] = {"free": {"text": 1}}
    parse_fixture(doc, "f.json", "0" * 64)
    assert VALIDATOR.is_valid(doc)
    doc["arms"][0]["extra_confg"] = doc["arms"][0].pop("extra_config")
    with pytest.raises(UsageError, match=r"arms\[0\]: unknown field 'extra_confg' \(did you mean 'extra_config'\?"):
        parse_fixture(doc, "f.json", "0" * 64)


# --- the schema and the loader know the same keys ---------------------------------------------------------------


def _node(ref: dict) -> dict:
    while "$ref" in ref:
        node: object = SCHEMA
        for part in ref["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        ref = node
    return ref


def _object_node(node: dict) -> dict:
    """The object alternative of a node (an expectation entry is a verdict, a set or an object)."""
    node = _node(node)
    if "properties" in node:
        return node
    return next(_node(alt) for alt in node.get("oneOf", []) if "properties" in _node(alt))


def _levels(shape, node: dict, where: str):
    """(where, the loader's keys, the schema's properties, its additionalProperties) for every object the loader
    reads, walking its shape (repro.plan.fixture_keys) and the schema side by side."""
    from repro.plan.fixture_keys import ListOf, MapOf, Obj

    if isinstance(shape, ListOf):
        yield from _levels(shape.item, _node(node)["items"], f"{where}[]")
    elif isinstance(shape, MapOf):
        yield from _levels(shape.value, _node(node)["additionalProperties"], f"{where}.*")
    elif isinstance(shape, Obj):
        node = _object_node(node)
        yield where, set(shape.keys), set(node["properties"]), node.get("additionalProperties")
        for key, child in shape.children.items():
            yield from _levels(child, node["properties"][key], f"{where}.{key}")
        for _, _, more in shape.when:  # the schema's if/then: its "then" properties
            for key, child in more.items():
                yield from _levels(child, _node(node["then"])["properties"][key], f"{where}.{key}(when)")


def test_the_schema_and_the_loader_know_the_same_keys_at_every_level():
    from repro.plan.fixture_keys import FIXTURE_SHAPE

    levels = list(_levels(FIXTURE_SHAPE, SCHEMA, "fixture"))
    assert len(levels) >= 20
    for where, code, schema, extra in levels:
        assert code == schema, (where, code ^ schema)
        assert extra is False, f"{where}: the schema must refuse other keys"


def test_every_object_of_the_schema_refuses_keys_it_does_not_name():
    def walk(node, parent=""):
        if isinstance(node, dict):
            if "properties" in node and parent not in ("if", "then"):  # a condition, or a part of one object
                yield node
            for key, value in node.items():
                yield from walk(value, key)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value, parent)

    objects = list(walk(SCHEMA))
    assert len(objects) >= 20
    assert [sorted(o["properties"]) for o in objects if o.get("additionalProperties") is not False] == []


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_every_committed_fixture_validates_loads_and_names_only_what_a_run_can_have(path):
    from repro.plan.expectation_names import check_expectation_names

    VALIDATOR.validate(json.loads(path.read_text(encoding="utf-8")))
    fixture = load_fixture(path)
    check_expectation_names(fixture, ["baseline"])  # a plain run of it: its own arms, native and native-matched


def test_the_connectors_vllm_registers_are_known_names():
    """KNOWN_CONNECTORS holds every connector the installed vLLMs register (read from their factory's source)."""
    from repro.plan.expectation_names import KNOWN_CONNECTORS

    factories = sorted(
        ROOT.glob(".venvs/*/lib/python*/site-packages/vllm/distributed/kv_transfer/kv_connector/factory.py")
    )
    if not factories:
        pytest.skip("no vLLM installed under .venvs/")
    for factory in factories:
        names = set(re.findall(r'register_connector\(\s*"(\w+)"', factory.read_text(encoding="utf-8")))
        assert names and names <= set(KNOWN_CONNECTORS), (factory, names - set(KNOWN_CONNECTORS))


# --- expectation names against the run: arms from the fixture and the command line ----------------------------------


def _plan(tmp: Path, doc: dict, *flags: str):
    fixture = _write(tmp, doc)
    report = tmp / "reports" / f"r{len(list(tmp.glob('reports/*')))}.json"
    argv = ["--model", str(_model(tmp)), "--device", "cpu", "--max-model-len", "2048", "--max-tokens", "16",
            "--fixture", str(fixture), "--report", str(report), *FAKE, *flags]  # fmt: skip
    return build_plan(parse_args(argv), argv)


@pytest.mark.parametrize(
    "mutate, flags, said",
    [
        (
            lambda d: d["expected_kv"].update(PlantedFualt=d["expected_kv"].pop("PlantedFault")),
            ("--compare-native",),
            "expected_kv.PlantedFualt: no arm named 'PlantedFualt' (did you mean 'PlantedFault'",
        ),
        (
            lambda d: d["expected"].update(LMCacheConectorV1={"fixture": "PASS"}),
            ("--kv-connector", "ExampleConnector"),
            "expected.LMCacheConectorV1: no arm named 'LMCacheConectorV1' (did you mean 'LMCacheConnectorV1'",
        ),
        (
            lambda d: d["expected"].update(MyConn={"fixture": "PASS"}),
            ("--compare-native",),
            "expected.MyConn: no arm named 'MyConn' (arms: the fixture's ExampleConnector, PlantedFault",
        ),
        (
            lambda d: d["expected_kv"]["native"].update({"chat-514": "EXACT"}),
            ("--suite", "acceptance", "--compare-native"),
            "expected_kv.native.chat-514: no probe named 'chat-514' (did you mean 'chat-513'",
        ),
        (
            lambda d: d["arms"][0]["skip_probes"].update({"fixtur": "why"}),
            (),
            "arms[0].skip_probes: no probe named 'fixtur' (did you mean 'fixture'?",
        ),
    ],
    ids=["arm-typo", "connector-typo", "arm-of-no-run", "probe-typo", "skip-typo"],
)
def test_an_expectation_naming_nothing_a_run_could_have_is_refused_before_any_engine(tmp_path, mutate, flags, said):
    doc = _selftest()
    mutate(doc)
    with pytest.raises(UsageError) as info:
        _plan(tmp_path, doc, *flags)
    text = str(info.value)
    assert text.startswith(f"fixture {tmp_path / 'fixture.json'}: ") and said in text and "\n" not in text, text


def test_names_another_run_of_the_fixture_has_are_kept_and_one_beside_them_that_none_has_is_refused(tmp_path):
    """A fixture arm while --kv-connector replaces them, native without --compare-native, a suite probe without the
    suite, a connector vLLM registers (LMCacheConnectorV1: a fixture may state its verdicts and declare no arm), and
    a connector only this run names: the acceptance check says what was not run; none of them is a typo."""
    doc = _selftest()
    doc["expected"]["LMCacheConnectorV1"] = {"fixture": "PASS"}
    doc["expected"]["MyConn"] = {"fixture": "PASS"}
    plan = _plan(tmp_path, doc, "--kv-connector", "MyConn")
    assert [arm.name for arm in plan.arms] == ["baseline", "MyConn"]
    doc["expected"]["MyConm"] = doc["expected"].pop("MyConn")
    with pytest.raises(UsageError, match=r"expected.MyConm: no arm named 'MyConm' \(did you mean 'MyConn'\?"):
        _plan(tmp_path, doc, "--kv-connector", "MyConn")


# --- the P→D cases file and the matrix file ----------------------------------------------------------------------


def test_a_pd_cases_file_names_the_nearest_key_and_reads_kind_and_version_first(tmp_path):
    doc = json.loads((ROOT / "fixtures" / "pd" / "cases-gpu.json").read_text(encoding="utf-8"))
    load_cases(ROOT / "fixtures" / "pd" / "cases-gpu.json")
    doc["cases"][0]["prompts"] = doc["cases"][0].pop("prompt")
    path = _write(tmp_path, doc, "cases.json")
    with pytest.raises(UsageError) as info:
        load_cases(path)
    assert str(info.value).startswith(f"cases file {path}: cases[0]: unknown key 'prompts' (did you mean 'prompt'?")
    newer = {**doc, "schema_version": 2, "new_key": 1}
    with pytest.raises(UsageError, match="schema_version 2: upgrade the kit"):
        load_cases(_write(tmp_path, newer, "newer.json"))


@pytest.mark.parametrize(
    "doc, said",
    [
        ({"cels": []}, "matrix m.yaml: unknown key 'cels' (did you mean 'cells'?"),
        (
            {"cells": [{"name": "a", "enviroment": "cpu"}]},
            "matrix m.yaml: cells[0]: unknown key 'enviroment' (did you mean 'environment'?",
        ),
        (
            {"defaults": {"fixtures": "x"}, "cells": [{"name": "a"}]},
            "matrix m.yaml: defaults: key 'fixtures' is not a shared cell key (did you mean 'fixture'?)",
        ),
    ],
)
def test_a_matrix_file_names_the_file_and_the_nearest_key(doc, said):
    with pytest.raises(UsageError) as info:
        parse_matrix(doc, "m.yaml")
    assert str(info.value).startswith(said), str(info.value)
