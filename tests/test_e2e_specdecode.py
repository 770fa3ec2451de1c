"""Speculative decoding on the real vLLM CPU engine: fixtures/selftest-cpu-specdecode.json (the CPU self-test's arms,
probes and expectations) with --speculative-config in every arm, the baseline's too, the tiny model drafting for
itself ("model": "@model"). One verifier run; every assertion on its report: the expectations hold (reuse under
speculative decoding gives the baseline's tokens, the planted fault is still caught and blamed), every arm's engine
took the config and drafted and accepted tokens (its counters, not the flag, say so), and the report keeps "@model",
never the machine's folder."""

from __future__ import annotations

import json

import pytest
from conftest import have_vllm
from e2e_runs import shared_run, verify
from planted_fixtures import fixture_argv

from repro.contract.job import SPECULATIVE_SELF

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

FIXTURE = "fixtures/selftest-cpu-specdecode.json"
CONFIG = {"method": "draft_model", "model": SPECULATIVE_SELF, "num_speculative_tokens": 3}


def _run(model: str, tmp):
    report = tmp / "specdecode.json"
    extra = ["--suite", "acceptance", "--compare-native", "--no-confirm", "--quiet"]
    return verify(fixture_argv(model, FIXTURE, report, *extra, "--speculative-config", json.dumps(CONFIG)), report)


specdecode_run = shared_run("specdecode_run", _run)


def test_the_self_tests_expectations_hold_under_speculative_decoding(specdecode_run):
    data = specdecode_run.data
    assert data is not None, specdecode_run.proc.stderr[-3000:]
    assert data["acceptance"]["matched"] is True, [c for c in data["acceptance"]["checked"] if not c["ok"]]
    assert specdecode_run.proc.returncode == 0, specdecode_run.proc.stderr[-3000:]
    assert data["config"]["speculative_config"] == CONFIG


def test_every_arm_drafted_and_the_target_accepted_some(specdecode_run):
    data = specdecode_run.data
    for arm in data["arms"]:
        cfg = arm["effective_config"]
        assert cfg["speculative_config"]["method"] == "draft_model", arm["name"]
        assert cfg["speculative_config"]["num_speculative_tokens"] == 3, arm["name"]
        counts = cfg["speculative_decoding"]
        assert counts["draft_tokens"] > 0 and 0 < counts["accepted_tokens"] <= counts["draft_tokens"], (
            arm["name"], counts)  # fmt: skip
        assert not [w for w in data["warnings"] if "speculative decoding" in w["message"]]


def test_the_report_names_no_machine_folder_for_the_draft_model(specdecode_run):
    model = specdecode_run.data["config"]["model"]
    assert model not in json.dumps(specdecode_run.data["config"]["speculative_config"])
