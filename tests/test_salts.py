"""Tenant salts without an engine: a fixture probe's cache_salt read strictly (repro/plan/salts.py), sent in the
served body, probed of vLLM (a stand-in module, never vLLM), and judged (repro/judge/salts.py): a request of one salt
that reported a hit of KV only another salt had sent is a FAIL with the finding tenant-isolation, named in its
reasons, the exit reason, the headline and the summary, and exit 1 even where a fixture states the FAIL."""

from __future__ import annotations

import json
import re
import sys
import types

import pytest

from repro.contract.result import ArmResult, ProbeResult, RequestResult
from repro.engine.capabilities import cache_salt_support
from repro.engine.served import completion_body
from repro.errors import EXIT_MISMATCH, UsageError
from repro.judge import salts
from repro.judge.evaluate import judge_arm
from repro.judge.scenario_verdict import decide_scenario_request, decide_scenario_tenant_isolation
from repro.judge.verdict import FAIL, INCONCLUSIVE, PASS, TENANT_ISOLATION, Request
from repro.plan.fixtures import load_fixture, parse_fixture
from repro.publish.headline import headline
from repro.publish.repro_min import make_repro_min
from repro.publish.summary import format_summary
from repro.record.acceptance import check_acceptance
from repro.record.exit_rule import exit_reason

PROMPT = tuple((i * 7) % 250 + 3 for i in range(300))
ANSWER = tuple(range(40, 56))  # 16 tokens: the same under every salt (a salt changes no answer)
HIT = 288  # ExampleConnector's load of a 300-token prompt: align_to_block_size(299, 16)


def _probe(name: str, salt: str | None, cached: list[int | None], prompt=PROMPT) -> ProbeResult:
    reqs = tuple(
        RequestResult("cold" if i == 0 else "reuse", c, ANSWER, (), "length", None, None) for i, c in enumerate(cached)
    )
    return ProbeResult(name, tuple(prompt), None, reqs, cache_salt=salt)


def _arm(name: str, probes: list[ProbeResult], frontend: str = "sync") -> ArmResult:
    config = {"model": "m", "revision": None, "dtype": "float32", "block_size": 16, "max_model_len": 2048,
              "seed": 0, "enforce_eager": True, "frontend": frontend}  # fmt: skip
    return ArmResult(arm=name, probes=tuple(probes), effective_config=config, versions={}, fixture_sha256="x")


BASELINE = _arm("baseline", [_probe("tenant-a", "a", [0]), _probe("tenant-b", "b", [0]), _probe("no-salt", None, [0])])


def _judged(cached: dict[str, list[int | None]], frontend: str = "sync") -> tuple[dict, str]:
    salt_of = {"tenant-a": "a", "tenant-b": "b", "no-salt": None}
    arm = _arm("ExampleConnector", [_probe(n, salt_of[n], c) for n, c in cached.items()], frontend)
    probes, verdict = judge_arm(arm, BASELINE, "connector", 16)
    return {p["name"]: p for p in probes}, verdict.verdict


# ---- the fixture


def _doc(version: int = 5, **probe) -> dict:
    return {"kind": "kvkit-fixture", "schema_version": version, "name": "t", "tokenizer": {"name": "t"},
            "probes": [{"name": "p", "prompt": {"token_ids": [1, 2, 3]}, **probe}]}  # fmt: skip


def test_a_probe_names_its_salt_and_sends_it_in_its_prompt():
    fixture = parse_fixture(_doc(cache_salt="tenant-a"), "f.json", "0" * 64)
    assert fixture.probes[0].cache_salt == "tenant-a"
    assert fixture.probes[0].prompt_spec() == {"token_ids": [1, 2, 3], "cache_salt": "tenant-a"}
    assert "cache_salt" not in parse_fixture(_doc(), "f.json", "0" * 64).probes[0].prompt_spec()


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (_doc(4, cache_salt="a"), "probes[0].cache_salt: a probe's cache_salt needs schema_version 5"),
        (_doc(cache_salt=""), "probes[0].cache_salt: must be a non-empty string"),
        (_doc(cache_salt=7), "probes[0].cache_salt: must be a non-empty string"),
        (_doc(cache_salt=" a"), "probes[0].cache_salt: must be printable, with no leading or trailing space"),
        (_doc(cache_salt="x" * 129), "at most 128 characters"),
        (_doc(cache_salts="a"), "unknown field 'cache_salts'"),
    ],
)
def test_a_bad_salt_is_one_line(doc, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        parse_fixture(doc, "f.json", "0" * 64)


def test_the_salts_fixture_names_two_salts_over_one_prompt_and_states_its_expectations():
    fixture = load_fixture("fixtures/scenarios-cpu-salts.json")
    by_name = {p.name: p for p in fixture.probes}
    assert {n: p.cache_salt for n, p in by_name.items()} == {"tenant-a": "tenant-a", "tenant-b": "tenant-b",
                                                             "no-salt": None}  # fmt: skip
    assert len({p.token_ids for p in fixture.probes}) == 1
    assert fixture.expected["native"] == dict.fromkeys(by_name, PASS)
    assert fixture.expected["ExampleConnector"] == {"tenant-a": PASS, "tenant-b": FAIL, "no-salt": FAIL}
    assert fixture.expected_scenarios == {"native": {"cross-salt": PASS, "unsalted-first": PASS},
                                          "ExampleConnector": {"cross-salt": FAIL, "unsalted-first": FAIL}}  # fmt: skip


# ---- sending it


class _SP:
    max_tokens, temperature, ignore_eos, logprobs, seed, prompt_logprobs = 16, 0.0, True, 1, 0, None


def test_a_served_request_carries_its_salt_in_the_body_and_an_unsalted_one_none():
    body = completion_body([5, 6], _SP(), "tenant-a")
    assert body["cache_salt"] == "tenant-a" and body["prompt"] == [5, 6] and body["logprobs"] == 1
    assert "cache_salt" not in completion_body([5, 6], _SP()) and "prompt_logprobs" not in completion_body([5], _SP())


def _stand_in_vllm(monkeypatch, annotations: dict, keys_of) -> None:
    """A stand-in for the vLLM modules the probe asks (never vLLM itself)."""
    vllm = types.ModuleType("vllm")
    vllm.TokensPrompt = type("TokensPrompt", (dict,), {"__annotations__": annotations})
    utils = types.ModuleType("vllm.v1.core.kv_cache_utils")
    utils.generate_block_hash_extra_keys = lambda request, start, end, mm: (keys_of(request), 0)
    protocol = types.ModuleType("vllm.entrypoints.openai.completion.protocol")
    protocol.CompletionRequest = type("CompletionRequest", (), {"model_fields": {"cache_salt": None}})
    for name, module in (("vllm", vllm), ("vllm.v1.core.kv_cache_utils", utils),
                         ("vllm.entrypoints.openai.completion.protocol", protocol)):  # fmt: skip
        monkeypatch.setitem(sys.modules, name, module)


def test_the_probe_asks_vllm_whether_the_salt_reaches_the_first_blocks_key(monkeypatch):
    _stand_in_vllm(monkeypatch, {"prompt_token_ids": list, "cache_salt": str}, lambda r: (r.cache_salt,))
    assert cache_salt_support() == "available" and cache_salt_support("server") == "available"
    _stand_in_vllm(monkeypatch, {"cache_salt": str}, lambda r: (("cache_salt", r.cache_salt),))  # vLLM 0.32's pair
    assert cache_salt_support() == "available"
    _stand_in_vllm(monkeypatch, {"prompt_token_ids": list, "cache_salt": str}, lambda r: None)  # hashed without it
    assert cache_salt_support().startswith("unavailable: vLLM's block hashing leaves the salt out")
    _stand_in_vllm(monkeypatch, {"prompt_token_ids": list}, lambda r: (r.cache_salt,))
    assert cache_salt_support() == "unavailable: vLLM's TokensPrompt has no cache_salt"


# ---- judging it


def test_a_store_keyed_on_tokens_alone_serves_another_tenant_and_fails_naming_it():
    probes, verdict = _judged({"tenant-a": [0, HIT], "tenant-b": [HIT, HIT], "no-salt": [HIT, HIT]})
    assert verdict == FAIL
    assert probes["tenant-a"]["verdict"] == PASS and "finding" not in probes["tenant-a"]
    for name in ("tenant-b", "no-salt"):
        assert probes[name]["verdict"] == FAIL and probes[name]["finding"] == TENANT_ISOLATION
        first = probes[name]["reasons"][0]
        assert first.startswith("cold request: tenant isolation: ") and "another tenant's KV served" in first
        assert "probe tenant-a cold request (cache_salt 'a') had sent 288" in first, first
    assert (
        "cache_salt 'b' reported 288 cached tokens, of which its own salt had sent 0"
        in probes["tenant-b"]["reasons"][0]
    )
    assert "no cache_salt reported 288 cached tokens" in probes["no-salt"]["reasons"][0]


def test_native_prefix_caching_misses_across_salts_and_hits_within_one():
    probes, verdict = _judged({"tenant-a": [0, HIT], "tenant-b": [0, HIT], "no-salt": [0, HIT]})
    assert verdict == PASS and all(p["verdict"] == PASS and "finding" not in p for p in probes.values())


def test_a_hit_within_a_salt_never_counts_and_a_missing_counter_is_no_hit():
    # tenant-b's reuse hits what its own cold request sent: its own tenant's KV
    probes, _ = _judged({"tenant-a": [0, HIT], "tenant-b": [0, HIT]})
    assert probes["tenant-b"]["verdict"] == PASS
    probes, _ = _judged({"tenant-a": [0, HIT], "tenant-b": [None, HIT]})  # a cold counter that is missing
    assert probes["tenant-b"]["verdict"] == INCONCLUSIVE and "finding" not in probes["tenant-b"]


def test_a_server_the_kit_did_not_start_is_not_judged_for_salts():
    """Its cache holds traffic the run did not send: a cold hit there is INCONCLUSIVE (not a verified miss), never
    blamed on another tenant."""
    probes, _ = _judged({"tenant-a": [0, HIT], "tenant-b": [HIT, HIT]}, frontend="endpoint")
    assert probes["tenant-b"]["verdict"] == INCONCLUSIVE and "finding" not in probes["tenant-b"]


def test_tenants_follow_what_each_salt_sent_before_a_request():
    tenants = salts.Tenants([_probe("a", "a", []), _probe("b", "b", []), _probe("a-half", "a", [], PROMPT[:160])])
    assert tenants.cross("step 0 a-half", "a-half", 144) is None  # nothing sent before: not a question of salts
    assert tenants.cross("step 1 b", "b", 144) is not None  # a's first 160 tokens, b's 144 hit: another tenant's
    why = tenants.cross("step 2 a", "a", 288)  # a's own salt had sent 160 of its tokens; b had sent all 300
    assert why is not None and "its own salt had sent 160 before it; step 1 b (cache_salt 'b') had sent 288" in why
    assert tenants.cross("step 3 a", "a", 288) is None  # a's own request at step 2 sent the whole prompt
    assert salts.Tenants([_probe("a", None, []), _probe("b", None, [])]).cross("x", "b", 288) is None  # one tenant


def test_a_scenario_request_across_salts_fails_whatever_its_tokens():
    matched = decide_scenario_request(ANSWER, Request(ANSWER, HIT), None, True)
    assert matched.verdict == PASS
    crossed = decide_scenario_tenant_isolation(matched, "tenant isolation: x")
    assert (crossed.verdict, crossed.finding, crossed.reasons) == (FAIL, TENANT_ISOLATION, ("tenant isolation: x",))
    assert decide_scenario_tenant_isolation(matched, None) is matched


# ---- the exit rule and the views


def _report(expect: bool) -> dict:
    entries = []
    arm = _arm("ExampleConnector", [_probe("tenant-a", "a", [0, HIT]), _probe("tenant-b", "b", [HIT, HIT])])
    for res, mode, base in ((BASELINE, "baseline", None), (arm, "connector", BASELINE)):
        probes, v = judge_arm(res, base, mode, 16)
        entries.append({"name": res.arm, "mode": mode, "connector": None, "verdict": v.verdict,
                        "reasons": list(v.reasons), "error": None, "log": "x.log", "probes": probes})  # fmt: skip
    entries[0]["probes"] = [p for p in entries[0]["probes"] if p["name"] != "no-salt"]
    stated = {"ExampleConnector": {"tenant-a": PASS, "tenant-b": FAIL}}
    acc = check_acceptance(entries, stated if expect else {}, "acceptance" if expect else None)
    return {"kind": "kvkit-report", "schema_version": 3, "complete": True, "errors": [], "arms": entries,
            "acceptance": acc, "generations": 4, "config": {"block_size": 16, "kv_audit": False}, "warnings": [],
            "provenance": {"argv": [], "started_utc": "2026-12-05T00:00:00Z"}}  # fmt: skip


@pytest.mark.parametrize("stated", [False, True])
def test_a_tenant_isolation_failure_exits_1_even_where_the_fixture_states_the_fail(stated):
    report = _report(stated)
    assert report["acceptance"]["matched"] is (True if stated else None)
    code, why = exit_reason(json.loads(json.dumps(report)))
    assert code == EXIT_MISMATCH and why == "tenant-isolation failure: ExampleConnector tenant-b"
    text = headline(report)
    assert (
        "ExampleConnector" in text
        and "served another tenant's KV across cache salts (tenant-isolation failure)" in text
    )
    assert "on 1 of 2 probes" in text and "answered differently" not in text  # its tokens were the baseline's
    summary = format_summary(report)
    (line,) = [x for x in summary.splitlines() if x.startswith("ExampleConnector (") and ": FAIL" in x]
    assert line.endswith(": FAIL · tenant-isolation failure on tenant-b"), line


def test_repro_min_refuses_a_salted_probe_it_could_not_send():
    """Its script sends no salt: every tenant would be one, and the crossing would not show."""
    with pytest.raises(UsageError, match="probe tenant-b is sent with a cache_salt, which repro_min.py does not send"):
        make_repro_min(_report(False))
