"""--frontend async against sync, end to end on the real vLLM CPU engine (issue 23 item 3): the self-test's
probes (its fixture probe and the acceptance suite's chat probes), on the baseline and native prefix
caching arms, once through vLLM's LLM and once through a bare AsyncLLM, give the same record request by
request: token IDs, logprobs, cached-token counts, kv_transfer_params, request IDs, text. The sync side is the
session's self-test one arm after another (tests/e2e_runs.py; its kernels: ATen's portable ones, which the async
run takes too; both in the CPU's one-process engine layout), read on its baseline and native arms; the async run
leaves the self-test's connector arms out to keep the cost down: the front end is the same code for every arm."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, have_vllm, run_cli
from e2e_runs import SELFTEST_KERNELS, shared_run

from repro.plan.options import CPU_ENGINE_FLAGS, SELFTEST_CPU_FIXTURE
from repro.record.provenance import KERNEL_VARIANTS

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

ARMS = ("baseline", "native")
# what each request's record must hold the same under both front ends
SAME = ("role", "request_id", "token_ids", "logprobs", "cached_tokens", "kv_transfer_params", "finish_reason", "text")


def _arms_of(report: dict, arms=ARMS) -> dict:
    """The report with only these arms (the sync side's self-test has its connector arms too)."""
    return {**report, "arms": [a for a in report["arms"] if a["name"] in arms]}


def _async_run(model: str, tmp) -> tuple:
    """The self-test's probes on baseline and native alone, one arm at a time, through a bare AsyncLLM."""
    data = json.loads((ROOT / SELFTEST_CPU_FIXTURE).read_text())
    data.pop("arms")  # baseline and native only (--compare-native), with the self-test's expectations for native
    for key in ("expected", "expected_kv"):
        data[key] = {arm: verdicts for arm, verdicts in data[key].items() if arm in ARMS}
    fixture = tmp / "selftest-native.json"
    fixture.write_text(json.dumps(data))
    report = tmp / "async.json"
    argv = ["--model", model, *CPU_ENGINE_FLAGS, "--suite", "acceptance", "--compare-native",
            "--fixture", str(fixture), "--jobs", "1", "--quiet", "--report", str(report), "--frontend", "async"]  # fmt: skip
    proc = run_cli(argv, env=KERNEL_VARIANTS[SELFTEST_KERNELS])
    assert report.exists(), proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc, json.loads(report.read_text())


frontend_async_run = shared_run("frontend_async_run", _async_run, lane=True)


@pytest.fixture(scope="module")
def runs(selftest_sequential_run, frontend_async_run):
    """The self-test's probes on baseline and native, one arm at a time, under each front end: sync, the
    session's self-test with --jobs 1 (its baseline and native arms); async, those two arms alone."""
    sync = selftest_sequential_run
    assert sync.data is not None, sync.proc.stdout[-2000:] + sync.proc.stderr[-3000:]
    return {"sync": (sync.proc, _arms_of(sync.data)), "async": frontend_async_run}


def _requests(report: dict) -> dict:
    """(arm, probe, request index) -> the request's record, every arm's every probe."""
    return {
        (a["name"], p["name"], i): r for a in report["arms"] for p in a["probes"] for i, r in enumerate(p["requests"])
    }


def test_both_front_ends_pass_and_the_report_says_which_ran(runs):
    for name, (proc, report) in runs.items():
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        assert [a["name"] for a in report["arms"]] == list(ARMS)
        assert all(a["verdict"] == "PASS" for a in report["arms"]), [(a["name"], a["reasons"]) for a in report["arms"]]
        assert report["config"]["frontend"] == name
        assert [a["effective_config"]["frontend"] for a in report["arms"]] == [name, name]
        # no deprecated path of vLLM's (AsyncLLM is handed rendered prompts, as the OpenAI server hands them)
        assert not [w for a in report["arms"] for w in a["warnings"] if "deprecated" in w], report["arms"][0][
            "warnings"
        ]


def test_async_gives_the_same_tokens_as_sync_request_by_request(runs):
    sync, asyn = _requests(runs["sync"][1]), _requests(runs["async"][1])
    assert sorted(sync) == sorted(asyn)
    # 4 probes on baseline (cold only); on native the fixture probe's cold + 3 reuses, each chat probe's cold + 1
    assert len(sync) == 4 + 4 + 3 * 2
    for key, request in sync.items():
        assert {k: request[k] for k in SAME} == {k: asyn[key][k] for k in SAME}, key
    reuses = [r for (arm, _, i), r in sync.items() if arm == "native" and i > 0]
    assert reuses and all(r["cached_tokens"] > 0 for r in reuses)  # native did reuse, under both
    prompts = {
        name: {
            (a["name"], p["name"]): (p["submitted_token_ids"], p["messages"])
            for a in report["arms"]
            for p in a["probes"]
        }
        for name, (_, report) in runs.items()
    }
    assert prompts["sync"] == prompts["async"]  # the chat probes built from either front end's tokenizer


def test_the_kv_audit_sees_the_same_blocks_under_both(runs):
    verdicts = {
        name: {(a["name"], p["name"]): (p.get("kv") or {}).get("verdict") for a in report["arms"] for p in a["probes"]}
        for name, (_, report) in runs.items()
    }
    assert verdicts["sync"] == verdicts["async"]
    assert {v for (arm, _), v in verdicts["async"].items() if arm == "native"} == {"EXACT"}
