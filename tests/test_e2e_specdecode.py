"""Speculative decoding on the real vLLM CPU engine: fixtures/selftest-cpu-specdecode.json (the CPU self-test's
probes and expectations) with --speculative-config in every arm, the baseline's too, the tiny model drafting for
itself ("model": "@model"), its planted arms beside native (ARMS). One verifier run; every assertion on its report:
the expectations hold (reuse under speculative decoding gives the baseline's tokens, the planted fault is still
caught and blamed), every arm's engine took the config and drafted and accepted tokens (its counters, not the flag,
say so), and the report keeps "@model", never the machine's folder."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, have_vllm
from e2e_runs import shared_run, verify
from planted_fixtures import fixture_argv

from repro.contract.job import SPECULATIVE_SELF

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

FIXTURE = "fixtures/selftest-cpu-specdecode.json"
CONFIG = {"method": "draft_model", "model": SPECULATIVE_SELF, "num_speculative_tokens": 3}


# The fixture's arms this run keeps (with native beside them): the planted fault and the planted connector without it.
# Its other arms (ExampleConnector, native matched to it) run in the committed reports under reports/models/; the
# whole fixture costs about twice this run's engine time, which make test's budget does not hold.
ARMS = ("PlantedFault", "PlantedFault-none")


def _fixture(tmp) -> str:
    """The fixture with ARMS alone, and their expectations as written (native's too)."""
    data = json.loads((ROOT / FIXTURE).read_text(encoding="utf-8"))
    data["arms"] = [a for a in data["arms"] if a["name"] in ARMS]
    for table in ("expected", "expected_kv"):
        data[table] = {arm: wants for arm, wants in data[table].items() if arm in (*ARMS, "native")}
    path = tmp / "selftest-cpu-specdecode-e2e.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def _run(model: str, tmp):
    report = tmp / "specdecode.json"
    extra = ["--suite", "acceptance", "--compare-native", "--no-native-matched", "--no-confirm", "--quiet"]
    argv = fixture_argv(model, _fixture(tmp), report, *extra, "--speculative-config", json.dumps(CONFIG))
    return verify(argv, report)


specdecode_run = shared_run("specdecode_run", _run)


def test_the_self_tests_expectations_hold_under_speculative_decoding(specdecode_run):
    data = specdecode_run.data
    assert data is not None, specdecode_run.proc.stderr[-3000:]
    assert data["acceptance"]["matched"] is True, [c for c in data["acceptance"]["checked"] if not c["ok"]]
    assert specdecode_run.proc.returncode == 0, specdecode_run.proc.stderr[-3000:]
    assert data["config"]["speculative_config"] == CONFIG


def test_every_arm_drafted_and_the_target_accepted_some(specdecode_run):
    data = specdecode_run.data
    assert [a["name"] for a in data["arms"]] == ["baseline", *ARMS, "native"]
    for arm in data["arms"]:
        cfg = arm["effective_config"]
        assert cfg["speculative_config"]["method"] == "draft_model", arm["name"]
        assert cfg["speculative_config"]["num_speculative_tokens"] == 3, arm["name"]
        counts = cfg["speculative_decoding"]
        assert counts["draft_tokens"] > 0 and 0 < counts["accepted_tokens"] <= counts["draft_tokens"], (
            arm["name"], counts)  # fmt: skip
    # the kit's own warning for an arm that drafted nothing (vLLM's own warnings name speculative decoding too)
    assert not [w for w in data["warnings"] if w["message"].startswith("kvkit: speculative decoding")]


def test_the_report_names_no_machine_folder_for_the_draft_model(specdecode_run):
    model = specdecode_run.data["config"]["model"]
    assert model not in json.dumps(specdecode_run.data["config"]["speculative_config"])
