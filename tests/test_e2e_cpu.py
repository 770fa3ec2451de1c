"""End to end on the real vLLM CPU engine: the self-test's five arms and the report contract, on the self-test
run that tests/test_e2e_kernels.py reads too (tests/e2e_runs.py: under ATen's portable kernels)."""

from __future__ import annotations

import json

import pytest
from conftest import have_vllm
from kvkit_testutil import SELFTEST_VERDICTS, engine_block_size, run_test_connector

from repro.record.atomic import dumps_json
from repro.record.report import REPORT_SCHEMA_VERSION

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

REQUIRED_TOP = {
    "kind",
    "schema_version",
    "tool_version",
    "claim_eligible",
    "generations",
    "acceptance",
    "arms",
    "warnings",
    "errors",
    "provenance",
}


@pytest.fixture
def selftest(selftest_run):
    """The self-test with two arms at a time (what `make repro KERNELS=generic` does on two cores)."""
    return selftest_run.proc, selftest_run.report


def _comparable(report: dict) -> dict:
    """A report without what may differ between two runs of the same configuration: times, scratch
    paths, request IDs, the KV pool's size (from the memory at start-up)."""
    arms = []
    for a in report["arms"]:
        probes = []
        for p in a["probes"]:
            reqs = [{k: v for k, v in r.items() if k != "request_id"} for r in p["requests"]]
            probes.append({**p, "requests": reqs})
        audit = a["kv_audit"] and {k: v for k, v in a["kv_audit"].items() if k != "kv_shape"}
        arms.append(
            {"name": a["name"], "verdict": a["verdict"], "reasons": a["reasons"], "probes": probes, "kv_audit": audit}
        )
    return {"arms": arms, "acceptance": report["acceptance"], "generations": report["generations"]}


def test_arms_at_the_same_time_give_the_report_of_arms_one_after_another(selftest, selftest_sequential_run):
    """--jobs 2 (the shared self-test, its arm children forked by the warm launcher) against --jobs 1 (every arm
    child spawned), both in the CPU's one-process engine layout: every verdict, token ID, logprob, hit counter and
    KV audit figure the same; only timings, paths and request IDs differ. Neither the arms running at once nor
    how their children started changes one bit. (vLLM's own layout against this one: the served self-test,
    tests/test_e2e_served.py; --engine-layout vllm offline: tests/test_lifeline_e2e.py.)"""
    _, concurrent = selftest
    proc, report = selftest_sequential_run.proc, selftest_sequential_run.report
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "arm baseline" not in proc.stderr  # --quiet: the summary alone
    one, own = json.loads(concurrent.read_text()), json.loads(report.read_text())
    assert (one["config"]["jobs"], own["config"]["jobs"]) == (2, 1)
    for data in (one, own):
        assert data["config"]["engine_layout"] == "one-process"
        ran = {(a["effective_config"]["engine_layout"], a["effective_config"]["executor"]) for a in data["arms"]}
        assert ran == {("one-process", "uni")}
    assert _comparable(own) == _comparable(one)


def test_selftest_exit_code_and_summary(selftest):
    proc, _ = selftest
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("Planted-fault self-test (")  # the headline sentence, as the site leads with it
    at = next(i for i, line in enumerate(lines) if line.startswith("# "))
    assert " · " in lines[at - 1] and "generations · acceptance.matched = true" in lines[at]
    planted = next(line for line in lines if line.startswith("PlantedFault (PlantedFaultConnector): FAIL"))
    assert planted.endswith(" — the planted fault (zero_blocks) caught, as the fixture expects"), planted
    assert lines[-1] == "claim_eligible=false; no performance claim"
    assert any(l.split()[:4] == ["fixture", "1502", "0→1488×3", "FAIL"] for l in lines)


def test_five_arms_verdicts(selftest):
    _, report = selftest
    data = json.loads(report.read_text())
    verdicts = {a["name"]: a["verdict"] for a in data["arms"]}
    assert verdicts == SELFTEST_VERDICTS
    assert data["acceptance"]["matched"] is True
    planted = next(a for a in data["arms"] if a["name"] == "PlantedFault")
    for probe in planted["probes"]:
        assert probe["verdict"] == "FAIL"
        cold, *reuses = probe["requests"]
        assert cold["cached_tokens"] == 0 and cold["first_diff"] is None
        for r in reuses:
            assert r["cached_tokens"] > 0
            assert isinstance(r["first_diff"], int)
            assert r["margin"]["index"] == r["first_diff"]
            assert r["kv_transfer_params"]["planted_fault"]["loaded_tokens"] == r["cached_tokens"]
    native = next(a for a in data["arms"] if a["name"] == "native")
    cached = {p["name"]: [r["cached_tokens"] for r in p["requests"]] for p in native["probes"]}
    assert cached == {
        "fixture": [0, 1488, 1488, 1488],
        "chat-511": [0, 496],
        "chat-512": [0, 496],
        "chat-513": [0, 512],
    }
    example = next(a for a in data["arms"] if a["name"] == "ExampleConnector")
    skipped = [p for p in example["probes"] if p["verdict"] == "SKIPPED"]
    assert [p["name"] for p in skipped] == ["chat-513"] and skipped[0]["skipped"]


def test_kv_audit_verdicts_and_blame(selftest):
    """ExampleConnector, the planted connector with no fault and native bit-exact on every reused
    block; the planted fault blamed at
    exactly the blocks it corrupted, request by request."""
    _, report = selftest
    data = json.loads(report.read_text())
    arms = {a["name"]: a for a in data["arms"]}
    assert arms["baseline"]["kv_audit"]["status"] == "reference"
    for name in ("ExampleConnector", "PlantedFault-none", "native"):
        for probe in arms[name]["probes"]:
            if probe["skipped"]:
                assert probe["kv"] is None
                continue
            assert probe["kv"]["verdict"] == "EXACT", (name, probe["name"], probe["kv"])
            for r in probe["requests"][1:]:
                assert r["kv_audit"]["counts"]["corrupt"] == r["kv_audit"]["counts"]["numeric"] == 0
                assert r["kv_audit"]["counts"]["exact"] == r["kv_audit"]["num_blocks"] * 4 * 2 > 0
    for probe in arms["PlantedFault"]["probes"]:
        assert probe["kv"]["verdict"] == "CORRUPT"
        for r in probe["requests"][1:]:
            planted = r["kv_transfer_params"]["planted_fault"]["faulted_blocks"]
            blamed = sorted(
                {
                    b
                    for plane in ("K", "V")
                    for row in r["kv_audit"]["planes"][plane]["class"]
                    for b, c in enumerate(row)
                    if c == "c"
                }
            )
            assert planted and blamed == planted, (probe["name"], planted, blamed)
            assert {m["source"] for m in r["kv_audit"]["matches"]} == {"zeros"}
    assert all(c["ok"] for c in data["acceptance"]["checked"] if c.get("check") == "kv")
    assert sum(c.get("check") == "kv" for c in data["acceptance"]["checked"]) == 18


def test_native_matched_reuses_what_the_connector_reused(selftest):
    """native-matched, primed before every reuse, reports the connector arm's cached counts on
    every block-aligned probe (here all of them) and passes; ExampleConnector's skipped probe is
    skipped there too, with the reason. Its KV is EXACT or NUMERIC, whichever this CPU's kernels give
    for a prefill of another length, and never CORRUPT."""
    _, report = selftest
    arms = {a["name"]: a for a in json.loads(report.read_text())["arms"]}
    matched, conn = arms["native-matched"], arms["ExampleConnector"]
    assert matched["matched_to"] == "ExampleConnector" and matched["verdict"] == "PASS"
    conn_probes = {p["name"]: p for p in conn["probes"]}
    for p in matched["probes"]:
        if p["name"] == "chat-513":
            assert p["skipped"] and "ExampleConnector" in p["skipped"]
            continue
        want = [r["cached_tokens"] for r in conn_probes[p["name"]]["requests"]]
        assert [r["cached_tokens"] for r in p["requests"]] == want  # 0 then the connector's counts
        assert p["match"]["matched_tokens"] == want[1:] and not any(p["match"]["aligned_down"])
        assert p["verdict"] == "PASS"
        # the priming prefill is shorter than the baseline's: bit-exact or within the floor it measures,
        # depending on the CPU (one gave EXACT on the chat probes, another NUMERIC: about 6e-7 relative)
        assert p["kv"]["verdict"] in ("EXACT", "NUMERIC"), p["kv"]
        for r in p["requests"][1:]:
            assert r["kv_audit"]["counts"]["corrupt"] == 0, (p["name"], r["kv_audit"]["counts"])
        if p["kv"]["verdict"] == "NUMERIC":
            assert matched["kv_audit"]["floor"]["identical"] is False
    assert matched["kv_audit"]["floor"]["rel"] < 1e-5  # 0 where every priming prefill was bit-exact


def test_report_contract(selftest):
    _, report = selftest
    raw = report.read_text()
    data = json.loads(raw)
    assert REQUIRED_TOP <= set(data)
    assert (
        data["kind"] == "kvkit-report"
        and data["schema_version"] == REPORT_SCHEMA_VERSION
        and data["claim_eligible"] is False
    )
    # the kit's one JSON layout (sorted keys, indent 2, arrays of plain numbers on one line), byte for byte
    assert raw == dumps_json(data)
    assert data["generations"] == sum(len(p["requests"]) for a in data["arms"] for p in a["probes"])
    for arm in data["arms"]:
        assert {"name", "mode", "connector", "verdict", "reasons", "effective_config", "probes"} <= set(arm)
        cfg = arm["effective_config"]
        assert cfg["block_size"] == engine_block_size() and cfg["enforce_eager"] is True and cfg["dtype"] == "float32"
        assert cfg["enable_prefix_caching"] is (arm["mode"] == "native")
        assert cfg["model_runner"] == "v1"  # vLLM's CPU build has no Triton, so no model runner v2
        assert (report.parent / arm["log"]).is_file()
        for p in arm["probes"]:
            if p["verdict"] == "SKIPPED":
                continue
            assert {"name", "prompt_tokens", "submitted_token_ids", "requests", "verdict", "reasons"} <= set(p)
            assert len(p["submitted_token_ids"]) == p["prompt_tokens"]
            for r in p["requests"]:
                assert r["role"] in ("cold", "reuse")
                assert r["cached_tokens"] is None or isinstance(r["cached_tokens"], int)
                assert len(r["token_ids"]) == 16
                assert all(len(step) >= 2 for step in r["logprobs"])
                assert "first_diff" in r
    prov = data["provenance"]
    for key in (
        "kit",
        "started_utc",
        "ended_utc",
        "hardware",
        "python",
        "packages",
        "fixture",
        "model",
        "env",
        "pythonhashseed",
    ):
        assert key in prov
    assert prov["started_utc"].endswith("Z")
    assert len(prov["fixture"]["sha256"]) == 64 and len(prov["model"]["sha256"]) == 64
    assert prov["env"]["PYTHONHASHSEED"] == "0"
    assert prov["engine_versions"]["vllm"].startswith("0.")
    submitted = {
        p["name"]: p["submitted_token_ids"] for a in data["arms"] for p in a["probes"] if p["submitted_token_ids"]
    }
    assert {n: len(ids) for n, ids in submitted.items()} == {
        "fixture": 1502,
        "chat-511": 511,
        "chat-512": 512,
        "chat-513": 513,
    }


def test_out_of_tree_faulty_connector_fails_without_kit_changes(tiny_model, tmp_path):
    """Any faulty connector class, loaded by module path, is caught: here one written for the test."""
    report = tmp_path / "custom.json"
    proc = run_test_connector(tiny_model, "NoisyReloadConnector", {"store_dir": str(tmp_path / "store")}, report)
    assert proc.returncode == 1, proc.stderr[-3000:]
    data = json.loads(report.read_text())
    arm = next(a for a in data["arms"] if a["name"] == "NoisyReloadConnector")
    assert arm["verdict"] == "FAIL"
    (probe,) = arm["probes"]
    assert [r["cached_tokens"] for r in probe["requests"]] == [0, 1488, 1488]
    assert all(isinstance(r["first_diff"], int) for r in probe["requests"][1:])
    assert "FAIL @" in proc.stdout
