"""Key identity on the real vLLM CPU engine: fixtures/scenarios-cpu-adapters.json, one verifier run per stack (its plain
probes and both scenarios, native beside its three connector arms), every assertion on its report: the pinned vLLM
(the kit's environment) and the newest CPU vLLM (.venvs/cpu-vllm-0.32, skipped where it was not built).

The same two prompts under the kit's seeded LoRA adapters A, B, A's lora_name under another lora_int_id (A-id3)
and A reloaded in place (A-reloaded; both of seed 3's weights, from seed 3's folder). A reuse across adapters must
miss or give its own adapter's baseline. PlantedTokenKeys (a faithful store keyed on the tokens alone) fails, its B
request answering as adapter A on the 300-token prompt; PlantedAdapterKeys (the adapter in the key) passes; vLLM's
ExampleConnector (files named by the tokens) fails as the planted store does; native prefix caching passes a-then-b.
Same-name depends on the engine's vLLM, as the report records it: up to 0.30 vLLM keys its blocks on lora_name alone
and native fails (vLLM #30931, the expectation the fixture binds to it); from 0.31 the key holds the adapter's path,
A-id3 misses A's blocks, native passes, and the report says 'fixed upstream' and exits 1."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, have_vllm
from e2e_runs import shared_run, verify
from kvkit_testutil import need_newest_cpu_python
from planted_fixtures import fixture_argv

from repro.judge.expectations import expectation_met
from repro.judge.upstream import FIXED_UPSTREAM, REPRODUCES, read_version
from repro.plan.fixtures import load_fixture
from repro.publish.issue_md import format_issue_md
from repro.publish.summary import format_summary

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

FIXTURE = "fixtures/scenarios-cpu-adapters.json"
OTHER_WEIGHTS = {"A": 1, "B": 2, "A-id3": 3, "A-reloaded": 3}  # each adapter's seed: the weights it answers with
ISSUE = "vllm-project/vllm#30931"
# vLLM's first release whose block key holds the adapter's path (kv_cache_utils._gen_lora_extra_hash_keys returns
# ("lora", lora_name, lora_path) from 0.31.0; read in the released wheels, notes/upstream-2026-12-05.md section 1.2)
PATH_KEYED_FROM = (0, 31)
SCENARIO_FLAGS = ["--compare-native", "--no-native-matched", "--no-confirm", "--scenarios", "all", "--quiet"]


def _run(model: str, tmp):
    report = tmp / "adapters.json"
    return verify(fixture_argv(model, FIXTURE, report, *SCENARIO_FLAGS), report)


def _run_newest(model: str, tmp):
    """The same run with the newest CPU vLLM's engines (the parent stays the kit's own interpreter)."""
    python = need_newest_cpu_python()
    report = tmp / "adapters.json"
    extra = [*SCENARIO_FLAGS, "--python", python]  # --block-size auto: 32 there (its backend takes multiples of 32)
    return verify(fixture_argv(model, FIXTURE, report, *extra), report)


adapters_run = shared_run("adapters_run", _run)
adapters_newest_run = shared_run("adapters_newest_run", _run_newest)


@pytest.fixture(params=["pinned", pytest.param("newest", marks=pytest.mark.extended)])
def stack_run(request):
    """The run on the pinned vLLM, then on the newest CPU vLLM: the tests that hold on either stack read both (the
    newest's in `make test-extended`: a repeat of the pinned run on another vLLM, about 3 minutes of make test's 20)."""
    return request.getfixturevalue({"pinned": "adapters_run", "newest": "adapters_newest_run"}[request.param])


def _keyed_on_path(data: dict) -> bool:
    """Whether the engine's vLLM, as its report records it, keys blocks on the adapter's path (0.31 on)."""
    version = read_version((data["provenance"].get("engine_versions") or {}).get("vllm"))
    assert version is not None, data["provenance"].get("engine_versions")
    return version.release[:2] >= PATH_KEYED_FROM


def _fixture() -> dict:
    return json.loads((ROOT / FIXTURE).read_text(encoding="utf-8"))


def _arm(data: dict, name: str) -> dict:
    return next(a for a in data["arms"] if a["name"] == name)


def _scenario_arm(data: dict, scenario: str, arm: str) -> dict:
    return next(a for a in next(s for s in data["scenarios"] if s["name"] == scenario)["arms"] if a["arm"] == arm)


def _requests(arm: dict, step: int) -> list[dict]:
    return [r for r in arm["requests"] if r["step"] == step]


def test_it_runs_to_a_report_whose_findings_exit_1(stack_run):
    """The connector arms' findings exit 1 on either stack (no acceptance suite: nothing excuses them); from vLLM 0.31
    the exit reason also names native same-name as fixed upstream."""
    assert stack_run.data is not None, stack_run.proc.stderr[-3000:]
    assert stack_run.proc.returncode == 1, stack_run.proc.stderr[-3000:]
    why = next(line for line in stack_run.proc.stdout.splitlines() if line.startswith("# "))
    assert "exit 1: KV FOREIGN that the fixture does not state: PlantedTokenKeys fixture-B" in why, why
    fixed = f"; and fixed upstream: {ISSUE} does not reproduce on vllm "
    assert (fixed in why) is _keyed_on_path(stack_run.data), why


def test_the_bound_on_native_same_name_says_what_holds_on_the_engines_vllm(stack_run):
    """Up to vLLM 0.30 the bound reproduces (the expectation met); from 0.31 it is fixed upstream, in the report, its
    summary and its issue text."""
    data = stack_run.data
    [bound] = data["upstream"]
    version = data["provenance"]["engine_versions"]["vllm"]
    assert (bound["arm"], bound["scenario"], bound["issue"], bound["versions"]) == (
        "native",
        "same-name",
        ISSUE,
        "<0.31",
    )
    assert bound["engine_version"] == version
    if _keyed_on_path(data):
        assert (bound["state"], bound["observed"]) == (FIXED_UPSTREAM, "PASS")
        text = (f"fixed upstream: {ISSUE} does not reproduce on vllm {version} (native same-name PASS where the "
                "fixture expects FAIL; its range: vllm <0.31)")  # fmt: skip
    else:
        assert (bound["state"], bound["observed"]) == (REPRODUCES, "FAIL")
        text = f"{ISSUE} reproduces on vllm {version}, inside its range <0.31 (native same-name FAIL)"
    assert bound["text"] == text
    assert f"\nUpstream bounds\n  {text}\n" in format_summary(data)
    assert f"- upstream bound: {text}" in format_issue_md(data)


def test_the_adapters_baselines_differ_on_every_probe(adapters_run):
    """Each prompt's four probes: the baseline's answers differ wherever the weights do, so every probe can tell
    whose KV a reuse read (none says it cannot)."""
    base = _arm(adapters_run.data, "baseline")
    assert base["verdict"] == "PASS"
    by_prompt: dict[tuple, dict[str, list[int]]] = {}
    for p in base["probes"]:
        by_prompt.setdefault(tuple(p["submitted_token_ids"]), {})[p["adapter"]] = p["requests"][0]["token_ids"]
    assert sorted(len(v) for v in by_prompt.values()) == [4, 4]
    for answers in by_prompt.values():
        for x in answers:
            for y in answers:
                assert (answers[x] == answers[y]) == (OTHER_WEIGHTS[x] == OTHER_WEIGHTS[y]), (x, y)
    text = json.dumps(adapters_run.data)
    assert "cannot tell the adapters apart" not in text


def test_the_adapters_answer_apart_from_the_base_model(adapters_run, planted_scenarios_run):
    """The base model's answer on the 1502-token prompt (the planted scenarios run's cache-off baseline: the same
    model, engine flags and kernels, no adapter) differs from every adapter's, so the adapters are applied: an
    adapter the engine dropped would answer as the base model. (Merged from the former tests/test_e2e_lora.py,
    whose own engine run asked the same of both prompts; A and B apart on both is the test above.)"""
    prompt = next(p for p in _fixture()["probes"] if p["name"] == "fixture-A")["prompt"]["token_ids"]
    base_probe = next(p for p in _arm(planted_scenarios_run.data, "baseline")["probes"] if p["name"] == "fixture")
    assert base_probe["submitted_token_ids"] == prompt
    base = base_probe["requests"][0]["token_ids"]
    for p in _arm(adapters_run.data, "baseline")["probes"]:
        if p["submitted_token_ids"] == prompt:
            assert p["requests"][0]["token_ids"] != base, p["name"]


def test_reuse_under_each_adapter_hits_and_gives_its_own_answer(stack_run):
    """Native prefix caching under adapters A and B, both prompts: each probe's first request is a miss, and each
    reuse under the same adapter hits and gives that adapter's baseline tokens (merged from the former
    tests/test_e2e_lora.py; that a reuse across adapters misses is the a-then-b scenario's test below)."""
    base = {p["name"]: p["requests"][0]["token_ids"] for p in _arm(stack_run.data, "baseline")["probes"]}
    native = _arm(stack_run.data, "native")
    for p in native["probes"]:
        if p["adapter"] not in ("A", "B"):
            continue
        first, *reuses = p["requests"]
        assert first["cached_tokens"] == 0, p["name"]
        assert reuses and all(r["cached_tokens"] > 0 and r["token_ids"] == base[p["name"]] for r in reuses), p["name"]


def test_every_verdict_is_the_fixtures(stack_run):
    """Every expectation holds, but the one bound to #30931 where the engine's vLLM is outside its range: there the
    bound's own test above says what holds."""
    data, fixture = stack_run.data, load_fixture(ROOT / FIXTURE)
    outside = {(b.arm, b.item) for b in fixture.upstream} if _keyed_on_path(data) else set()
    for arm, table in fixture.expected.items():
        got = {p["name"]: p["verdict"] for p in _arm(data, arm)["probes"]}
        for probe, want in table.items():
            assert expectation_met(want, got[probe]), (arm, probe, got[probe])
    for arm, table in fixture.expected_scenarios.items():
        for scenario, want in table.items():
            entry = _scenario_arm(data, scenario, arm)
            met = expectation_met(want, entry["verdict"])
            assert met is ((arm, scenario) not in outside), (arm, scenario, entry["verdict"], entry["reasons"])


def test_the_token_keyed_store_fails_answering_as_adapter_a(stack_run):
    arm = _scenario_arm(stack_run.data, "a-then-b", "PlantedTokenKeys")
    b = _requests(arm, 1)
    assert [r["probe"] for r in b] == ["fixture-B", "short-B"]
    for r in b:  # A's blocks served to B: a hit, another answer, and the bytes fixture-A's / short-A's
        assert r["cached_tokens"] > 0 and r["verdict"] == "FAIL", r["reasons"]
        assert r["kv"]["verdict"] == "FOREIGN", r["kv"]
    assert "answers as adapter A (short-A's baseline tokens @0-3)" in b[1]["reasons"]
    # on the 1502-token prompt B's answer on A's KV is A's first token only: a FAIL that names no adapter (the
    # limit docs/usage.md states); the KV audit's FOREIGN above is what says whose blocks it read there
    assert not any("answers as" in reason for reason in b[0]["reasons"])
    assert any("answers as adapter A" in reason for reason in arm["reasons"])


def test_native_passes_a_then_b_missing_across_adapters(stack_run):
    arm = _scenario_arm(stack_run.data, "a-then-b", "native")
    assert arm["verdict"] == "PASS", arm["reasons"]
    assert [r["cached_tokens"] for r in _requests(arm, 1)] == [0, 0]  # B: a miss under its own name
    assert all(r["cached_tokens"] > 0 for r in _requests(arm, 2))  # A again: its own blocks


def test_native_serves_a_under_its_name_to_other_weights_up_to_vllm_0_30(stack_run):
    """Up to vLLM 0.30 a block is keyed on lora_name alone: A-id3 (another id) and A-reloaded (in place) hit A's
    blocks and answer wrong, with A's KV. From 0.31 the key holds the path: A-id3 (seed 3's folder) misses A's
    blocks, and A-reloaded (lora_name A from seed 3's folder too) hits A-id3's, computed with its own weights."""
    arm = _scenario_arm(stack_run.data, "same-name", "native")
    if not _keyed_on_path(stack_run.data):
        for step in (1, 2, 3):
            for r in _requests(arm, step):
                assert r["cached_tokens"] > 0 and r["verdict"] == "FAIL" and r["kv"]["verdict"] == "FOREIGN", r
        return
    assert arm["verdict"] == "PASS" and arm["kv"]["verdict"] == "EXACT", arm["reasons"]
    assert [r["cached_tokens"] for r in _requests(arm, 1)] == [0, 0]
    for step in (2, 3):
        for r in _requests(arm, step):
            assert r["cached_tokens"] > 0 and r["verdict"] == "PASS" and r["kv"]["verdict"] == "EXACT", r


def test_the_adapter_keyed_store_misses_across_adapters_and_reuses_its_own(stack_run):
    for scenario, misses, hits in (("a-then-b", (1,), (2,)), ("same-name", (1, 2), (3,))):
        arm = _scenario_arm(stack_run.data, scenario, "PlantedAdapterKeys")
        assert all(r["cached_tokens"] == 0 for s in misses for r in _requests(arm, s)), scenario
        assert all(r["cached_tokens"] > 0 and r["verdict"] == "PASS" for s in hits for r in _requests(arm, s))


def test_the_report_and_its_views_name_the_adapters(adapters_run):
    data = adapters_run.data
    described = data["adapters"]
    assert set(described) == set(OTHER_WEIGHTS)
    assert described["A-id3"]["sha256"] == described["A-reloaded"]["sha256"] != described["A"]["sha256"]
    assert described["A-reloaded"]["load_inplace"] is True and described["A-id3"]["lora_int_id"] == 3
    assert "  short-B · adapter B" in format_summary(data)
    issue = format_issue_md(data)
    assert "#### LoRA adapters" in issue and "adapter A-reloaded: lora_name 'A', lora_int_id 1" in issue
