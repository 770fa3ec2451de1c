"""The headline (repro.publish.headline): one generated sentence per report, honest in every case, on committed
reports and synthetic read models."""

from __future__ import annotations

import copy
import json

import pytest
from conftest import ROOT
from kvkit_testutil import committed_or_skip

from repro.judge.verdict import ERROR, FAIL, FOREIGN, INCONCLUSIVE, MISPLACED, PASS
from repro.publish.headline import acceptance_text, headline, stack_key, version_key
from repro.publish.site_index import build_index_row, sort_rows
from repro.readmodel import read_report

DATA = ROOT / "tests" / "data"
SMOLLM2 = ROOT / "reports" / "conditions" / "h200-conditions-smollm2-five-v028.json"
PREEMPTION = ROOT / "reports" / "conditions" / "h200-conditions-tiny-preemption-v028.json"
DEGRADED = ROOT / "reports" / "h200-lmcache-degraded.json"
CPU_SELFTEST = ROOT / "reports" / "kernels" / "cpu-amd-epyc-default.json"


def _v2() -> dict:
    return json.loads((DATA / "report-v2-example.json").read_text(encoding="utf-8"))


def test_the_smollm2_finding_names_its_stack_model_and_strength():
    committed_or_skip(SMOLLM2)
    assert headline(read_report(SMOLLM2)) == (
        "LMCacheConnectorV1 (LMCache 0.5.4, vLLM 0.28.0, NVIDIA H200, SmolLM2-135M-Instruct) answered differently "
        "after a reported cache hit on 1 of 4 probes and loaded corrupt KV on 4 of 4; LMCacheMPConnector bit-exact; "
        "native prefix caching bit-exact; shape-matched native PASS, KV within its floor"
    )


def test_scenario_errors_are_in_the_headline():
    """The run whose LMCache engines both timed out in the preemption scenario: the ERROR is said, never PASS, and
    what a later trial found that the run's own did not (LMCacheConnectorV1's trial 2 loaded corrupt KV) beside it
    (issue 55, D4: the headline reads every trial)."""
    committed_or_skip(PREEMPTION)
    text = headline(read_report(PREEMPTION))
    assert "scenario preemption: LMCacheConnectorV1 ERROR, CORRUPT KV in trial 2 (trials: 1 of 2 ERROR)" in text
    assert "scenario preemption: LMCacheMPConnector ERROR (trials: 1 of 2 ERROR)" in text
    assert "scenario preemption: native prefix caching ERROR (trials: 2 of 2 ERROR)" in text


def test_an_error_arm_and_a_report_before_the_audit():
    committed_or_skip(DEGRADED)
    assert headline(read_report(DEGRADED)) == (
        "LMCacheConnectorV1 (LMCache 0.5.4, vLLM 0.26.0, NVIDIA H200, kvkit-tiny-qwen3-seed6) ended in ERROR "
        "(lmcache-degraded), no verdict; KV not audited (the report predates the audit)"
    )


def test_the_cpu_self_test_says_it_is_planted():
    committed_or_skip(CPU_SELFTEST)
    text = headline(read_report(CPU_SELFTEST))
    assert text.startswith("Planted-fault self-test (vLLM 0.28.0, CPU AMD EPYC, kvkit-tiny-qwen3): PlantedFault ")
    assert "(planted fault: zero_blocks) answered differently after a reported cache hit on 4 of 4 probes" in text
    assert "PlantedFault-none (planted connector, no fault) bit-exact" in text and "LMCache" not in text


def test_pass_inconclusive_and_audit_off_on_synthetic_reports():
    report = _v2()
    for arm in report["arms"]:
        arm["verdict"] = PASS
        for p in arm["probes"]:
            p["verdict"] = PASS if p["verdict"] != "SKIPPED" else p["verdict"]
            if p.get("kv"):
                p["kv"] = {"verdict": "EXACT", "reasons": []}
    text = headline(report)
    assert "matched caching off token for token on 3 of 3 probes with bit-exact KV" in text  # a SKIPPED not counted
    assert "answered differently" not in text and "loaded" not in text
    inconclusive = copy.deepcopy(report)
    lead = next(a for a in inconclusive["arms"] if a["mode"] == "connector")
    lead["verdict"] = INCONCLUSIVE
    lead["probes"][0]["verdict"] = INCONCLUSIVE
    assert f"was {INCONCLUSIVE} on 1 of " in headline(inconclusive)
    off = copy.deepcopy(report)
    off["config"]["kv_audit"] = False
    assert headline(off).endswith("; KV audit off")


def test_the_worst_kv_classes_are_counted_and_an_error_arm_leads_nothing_it_did_not_do():
    report = _v2()
    planted = next(a for a in report["arms"] if a["name"] == "PlantedFault")
    planted["probes"][0]["kv"]["verdict"] = FOREIGN
    planted["probes"][1]["kv"]["verdict"] = MISPLACED
    text = headline(report)
    assert "loaded corrupt KV on 2 and foreign KV on 1 and misplaced KV on 1 of 4" in text
    planted.update(verdict=ERROR, error={"kind": "timeout"})
    for p in planted["probes"]:
        p["verdict"], p["kv"] = ERROR, None
    assert f"PlantedFault (planted fault: zero_blocks) ended in {ERROR} (timeout), no verdict" in headline(report)


def test_version_order_and_newest_stack_first():
    assert version_key("0.5.5rc5") < version_key("0.5.5") < version_key("0.5.6") < version_key("0.28.0")
    assert version_key("—") < version_key("0.1")
    old, new = _v2(), _v2()
    for recorded in ("packages", "engine_versions"):  # the engine's record is read first (what ran)
        if isinstance(new["provenance"].get(recorded), dict):
            new["provenance"][recorded]["vllm"] = "0.29.0"
    assert stack_key(read_like(new)) > stack_key(read_like(old))
    rows = sort_rows([build_index_row(old, stem="a", href="a.html"), build_index_row(new, stem="b", href="b.html")])
    assert [r.stem for r in rows] == ["b", "a"] and rows[0].headline == headline(new)


def read_like(data: dict):
    from repro.readmodel import as_report

    return as_report(data)


@pytest.mark.parametrize("matched", [True, False, None])
def test_acceptance_is_explained_where_shown(matched):
    report = _v2()
    report["acceptance"]["matched"] = matched
    report["acceptance"]["unchecked_arms"] = ["native"] if matched is False else []
    text = acceptance_text(read_like(report))
    assert "the kit's self-check against the fixture's expectations" in text and "not the stack's verdict" in text
    if matched is False:
        assert "the fixture states nothing for native" in text
    assert FAIL not in text


def test_a_llamacpp_run_names_llamacpp_where_vllm_stands_never_the_parents_vllm():
    """The verifier of a llama.cpp run runs in the kit's CPU environment, which has vLLM: the headline, the index and
    the stack name the engine that ran (the child's engine_versions), and its vLLM is none."""
    report = _v2()
    report["provenance"]["engine_versions"] = {"engine": "llama.cpp", "llama_cpp_python": "0.3.36"}
    report["provenance"].setdefault("packages", {})["vllm"] = "0.28.0"
    read = read_like(report)
    assert read.engine == "llama.cpp" and read.package_version("vllm") == "—"
    assert read.engine_text == "llama.cpp (llama-cpp-python 0.3.36)"
    assert "(llama.cpp (llama-cpp-python 0.3.36), " in headline(report) and "vLLM" not in headline(report)
    assert build_index_row(report, stem="a", href="a.html").vllm == "— (llama.cpp (llama-cpp-python 0.3.36))"
    assert read_like(_v2()).engine == "vLLM"


def test_a_reuse_its_engine_documents_as_approximate_is_named_so_never_corruption():
    """An arm on llama-server's --cache-reuse (KV shifting, approximate by design: repro.judge.approximate) keeps its
    verdicts, FAIL and the audit's class, but the headline and its title name the approximation and never call its KV
    corrupt; the same connector with the setting at 0 is a plain arm."""
    from repro.judge.approximate import CACHE_REUSE

    data = _v2()
    arm = next(a for a in data["arms"] if a["name"] == "PlantedFault")
    arm["name"], arm["connector"] = "CacheReuse", {"name": CACHE_REUSE, "extra_config": {"min_chunk": 16}}
    text = headline(data)
    assert text.startswith("CacheReuse (approximate by design: --cache-reuse 16, cached KV shifted to new positions) (")
    assert "answered differently after a reported cache hit on 4 of 4 probes and loaded KV other than a cold " in text
    assert "(CORRUPT on 4) of 4" in text and "corrupt KV" not in text
    from repro.readmodel import as_report

    report = as_report(data)
    cache_reuse = next(a for a in report.arms if a.name == "CacheReuse")
    assert cache_reuse.verdict == FAIL and cache_reuse.title.endswith(", approximate by design (--cache-reuse 16)")
    arm["connector"]["extra_config"]["min_chunk"] = 0  # its control: no shifting, nothing approximate to name
    text = headline(data)
    assert "approximate" not in text and "loaded corrupt KV on 4 of 4" in text
