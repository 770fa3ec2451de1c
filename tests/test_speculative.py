"""--speculative-config without an engine (repro.plan.speculative): the flag read into every arm's engine alike (the
baseline's too), the verified model named "@model" in what is kept and resolved only where vLLM is built, served
flags vLLM's own parser reads back the same, a method or a vLLM that cannot take it refused in one line before any
arm runs, an arm whose counters show no drafted token warned about, and a reproducer that would decode plainly
refused. tests/test_e2e_specdecode.py runs it on the CPU engine."""

from __future__ import annotations

import argparse
import json
from typing import Literal

import pytest
from conftest import have_vllm

from repro.contract.job import SPECULATIVE_SELF, ArmSpec, ConnectorSpec, EngineConfig, build_job
from repro.engine import served
from repro.engine.capabilities import _literal_values
from repro.engine.engine_args import engine_kwargs
from repro.errors import UsageError
from repro.plan import options as cli
from repro.plan import speculative
from repro.publish.repro_min import make_repro_min
from repro.run.entries import speculative_note

DRAFT = {"method": "draft_model", "model": SPECULATIVE_SELF, "num_speculative_tokens": 3}


@pytest.mark.parametrize(
    "text, problem",
    [
        ("{", "not valid JSON"),
        ("[1]", "must be a JSON object, got list"),
        ('{"num_speculative_tokens": 3}', 'must name its "method"'),
        ('{"method": ""}', 'must name its "method"'),
        ('{"method": "ngram", "num_speculative_tokens": 0}', '"num_speculative_tokens" must be a positive integer'),
        ('{"method": "ngram", "num_speculative_tokens": true}', '"num_speculative_tokens" must be a positive integer'),
        ('{"method": "draft_model", "model": ""}', '"model" must be a non-empty string'),
    ],
)
def test_a_bad_flag_is_one_line_naming_what_is_wrong(text, problem):
    with pytest.raises(argparse.ArgumentTypeError, match=problem):
        speculative.from_flag(text)


def test_the_flag_is_read_by_the_verifiers_parser(tmp_path):
    argv = ["--model", str(tmp_path), "--fixture", "fixtures/selftest-cpu.json", "--report", str(tmp_path / "r.json")]
    args = cli.build_parser().parse_args([*argv, "--speculative-config", json.dumps(DRAFT)])
    assert args.speculative_config == DRAFT
    assert cli.build_parser().parse_args(argv).speculative_config is None
    with pytest.raises(UsageError, match='argument --speculative-config: must name its "method"'):
        cli.build_parser().parse_args([*argv, "--speculative-config", '{"method": 3}'])


def test_every_arm_builds_the_same_speculative_engine_with_the_verified_model_resolved_there_only():
    engine = EngineConfig("/models/tiny", None, "float32", 0, 0.1, 2048, 16, "cpu", speculative_config=DRAFT)
    assert EngineConfig.from_json(json.loads(json.dumps(engine.to_json()))) == engine
    assert engine.to_json()["speculative_config"]["model"] == SPECULATIVE_SELF  # what a job file and report keep
    arms = (ArmSpec("baseline", "baseline"), ArmSpec("native", "native"),
            ArmSpec("c", "connector", ConnectorSpec("ExampleConnector", None, {"shared_storage_path": "/tmp/x"})))  # fmt: skip
    seen = [engine_kwargs(build_job(a, engine, [], max_tokens=4, logprobs=2))["speculative_config"] for a in arms]
    assert seen == [{**DRAFT, "model": "/models/tiny"}] * 3
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    assert (
        EngineConfig("m", None, "float32", 0, 0.1, 2048, 16, "cpu", speculative_config=ngram).speculative_kwargs()
        == ngram
    )
    plain = EngineConfig("m", None, "float32", 0, 0.1, 2048, 16, "cpu")
    assert "speculative_config" not in plain.to_json()
    assert "speculative_config" not in engine_kwargs(build_job(arms[0], plain, [], max_tokens=4, logprobs=2))


@pytest.mark.skipif(not have_vllm(), reason="vLLM's own parser reads the flags back")
def test_a_served_arm_gets_the_same_speculative_config_through_vllm_serve_flags():
    kwargs = {"model": "/m", "dtype": "float32", "enforce_eager": True, "speculative_config": {**DRAFT, "model": "/m"}}
    argv = served.serve_argv(kwargs)
    at = argv.index("--speculative-config")
    assert json.loads(argv[at + 1]) == {**DRAFT, "model": "/m"}
    served.check_argv(argv, kwargs)  # vLLM's parser reads it back as given: no ServerFailed


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"speculative_config": DRAFT, "frontend": "sync", **kw})


def test_what_cannot_take_it_is_refused_before_any_arm_runs():
    with pytest.raises(UsageError, match="the servers repro endpoint is given run their own engine"):
        speculative.check(_args(frontend="endpoint"), None)
    with pytest.raises(UsageError, match=r"vLLM 0\.1 cannot take it \(no speculative_config\)"):
        speculative.check(
            _args(), lambda: {"vllm": "0.1", "speculative_config": {"unavailable": "no speculative_config"}}
        )
    with pytest.raises(UsageError, match="an older kit's answer"):
        speculative.check(_args(), lambda: {"vllm": "0.28.0"})
    with pytest.raises(UsageError, match=r"method 'draft_model' is none that vLLM 0\.28\.0 names \(ngram, suffix\)"):
        speculative.check(_args(), lambda: {"vllm": "0.28.0", "speculative_config": {"methods": ["ngram", "suffix"]}})
    asked = []
    speculative.check(_args(), lambda: asked.append(1) or {"speculative_config": {"methods": ["draft_model"]}})
    speculative.check(_args(speculative_config=None), lambda: asked.append(2) or {})  # not asked: no flag
    speculative.check(_args(), None)  # a stand-in engine (tests) is not asked
    assert asked == [1]


def test_the_methods_are_read_off_vllms_nested_literal():
    inner = Literal["eagle", "mtp"]
    assert sorted(_literal_values(Literal["ngram", inner, "draft_model"] | None)) == [
        "draft_model",
        "eagle",
        "mtp",
        "ngram",
    ]


@pytest.mark.parametrize(
    "counts, warned",
    [
        (None, None),
        ({"drafts": 4, "draft_tokens": 12, "accepted_tokens": 12, "sources": {}}, None),
        ({"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "sources": {}}, "(0 draft tokens)"),
        ({"draft_tokens": None, "sources": {"draft_tokens": "unavailable: no such metric"}}, "(unavailable: no such"),
    ],
)
def test_an_arm_that_drafted_nothing_is_warned_about_and_absent_counters_are_not_drafts(counts, warned):
    cfg = {} if counts is None else {"speculative_decoding": counts}
    note = speculative_note(cfg)
    if warned is None:
        assert note is None
    else:
        assert note.startswith("kvkit: speculative decoding was asked for and drafted no token") and warned in note


def test_a_reproducer_that_would_decode_plainly_is_refused():
    from kvkit_testutil import ROOT

    report = json.loads((ROOT / "reports/versions/cpu-vllm-0.28.0-selftest.json").read_text(encoding="utf-8"))
    make_repro_min(report, "PlantedFault")  # the committed report, as it is: built
    report["config"]["speculative_config"] = DRAFT
    with pytest.raises(UsageError, match="its engine decoded speculatively, which repro_min.py does not set"):
        make_repro_min(report, "PlantedFault")
