"""The production-load scenario's plan and judging, engine-free: what a fixture's `load` object generates (prompts
sharing prefixes, shuffled rounds, cancellations: the same every time), its bad input (one line, exit 2), the jobs
and results that carry it, and the rule that a request differs only when it differs from its cache-off answer and
from the reuse control's answer. The real engine runs it in tests/test_e2e_load_only_fault.py."""

from __future__ import annotations

import pytest
from conftest import run_cli
from planted_fixtures import PLANTED_MODULE, fixture_argv, write_arms_fixture

from repro.contract.job import ScenarioJob, StepJob
from repro.contract.result import RequestResult, StepRequest
from repro.errors import UsageError
from repro.judge.scenario_verdict import REUSE_NUMERICS, SCHEDULE_NUMERICS, decide_load_request
from repro.judge.verdict import FAIL, INCONCLUSIVE, PASS, Request
from repro.plan import load
from repro.plan.fixtures import parse_scenario

LOAD = {"prefixes": 3, "suffixes": 4, "prefix_tokens": 40, "suffix_tokens": 8, "rounds": 3, "seed": 5,
        "cancel_in_prefill": 2, "cancel_at_last_step": 1}  # fmt: skip


def _scenario(**over):
    return parse_scenario({"name": "production-load", "load": {**LOAD, **over}}, "scenarios[0]", "f.json")


def test_prompts_share_prefixes_and_are_drawn_by_the_seed():
    sc = _scenario()
    assert len(sc.generated) == 12 and sc.widest == 12 and len(sc.steps) == 3
    by_name = {p.name: p.token_ids for p in sc.generated}
    assert all(len(ids) == 48 for ids in by_name.values())
    for i in range(3):
        group = [by_name[load.probe_name(i, j)] for j in range(4)]
        assert len({ids[:40] for ids in group}) == 1  # one prefix per group
        assert len({ids[40:] for ids in group}) == 4  # each its own suffix
    assert len({by_name[load.probe_name(i, 0)][:40] for i in range(3)}) == 3
    assert all(3 <= t < 317 for ids in by_name.values() for t in ids)
    again = _scenario()
    assert again.generated == sc.generated and again.steps == sc.steps
    assert _scenario(seed=6).generated != sc.generated


def test_rounds_send_every_prompt_together_in_their_own_order_with_their_cancellations():
    sc = _scenario()
    names = {p.name for p in sc.generated}
    orders = [s.submit for s in sc.steps]
    assert all(set(o) == names and len(o) == 12 for o in orders) and len(set(orders)) == 3
    for step in sc.steps:
        assert step.together and step.expect is None
        assert sorted(step.cancel.values()) == ["last-step", "prefill", "prefill"]
        assert set(step.cancel) <= names


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"rounds": 1}, "rounds: at least 2"),
        ({"prefixes": 0}, "prefixes: must be at least 1"),
        ({"cancel_in_prefill": 12}, "more cancellations a round than prompts"),
        ({"token_range": [5, 5]}, "token_range: must be [low, high]"),
        ({"seed": True}, "seed: must be an integer"),
        ({"wave": 1}, "unknown field 'wave'"),
    ],
)
def test_bad_load_objects_are_one_line(over, message):
    with pytest.raises(UsageError) as err:
        _scenario(**over)
    assert message in str(err.value) and "\n" not in str(err.value) and str(err.value).startswith("fixture f.json:")


def test_load_and_steps_together_are_refused():
    with pytest.raises(UsageError, match="give load or steps, not both"):
        parse_scenario({"name": "x", "load": LOAD, "steps": [{"submit": ["a"]}]}, "scenarios[0]", "f.json")


def test_the_reuse_control_pool_holds_every_prompt_twice_over():
    spec = _scenario().load
    assert load.control_kv_tokens(spec, 16, 16, 2048) == 2048  # at least one request of the window
    assert load.control_kv_tokens(spec, 16, 16, 256) == 2 * 64 * 12  # (48 + 16) tokens in whole blocks, twice
    assert (
        load.control_kv_tokens(load.LoadSpec(**{**spec.__dict__, "control_kv_cache_tokens": 5000}), 16, 16, 2048)
        == 5000
    )


def test_jobs_and_results_carry_the_load_round_trip():
    step = StepJob(("a", "b"), True, 0.0, {"a": "prefill"})
    assert StepJob.from_json(step.to_json()) == step
    job = ScenarioJob("production-load", (step,), load=True, reference=True)
    assert ScenarioJob.from_json(job.to_json()) == job
    plain = ScenarioJob("in-flight", (StepJob(("a",)),))
    assert "load" not in plain.to_json() and ScenarioJob.from_json(plain.to_json()) == plain
    req = RequestResult(
        role="cold",
        request_id="0",
        cached_tokens=0,
        token_ids=(1, 2),
        logprobs=(),
        finish_reason="length",
        kv_transfer_params=None,
        text="",
    )
    sr = StepRequest(0, "a", req, 0, {"when": "prefill", "computed_tokens": 32})
    assert StepRequest.from_json(sr.to_json(), "r") == sr
    assert "cancel" not in StepRequest(0, "a", req).to_json()


BASE = (5, 6, 7, 8)


def _req(tokens, cached=32):
    return Request(tuple(tokens), cached)


def test_a_request_equal_to_its_cache_off_answer_passes():
    v = decide_load_request(BASE, _req(BASE), True, False, ((9, 9, 9, 9), 32))
    assert v.verdict == PASS and v.first_diff is None and v.cls is None


def test_a_divergence_the_reuse_control_shows_token_for_token_is_reuse_numerics_not_a_finding():
    other = (5, 6, 1, 2)
    v = decide_load_request(BASE, _req(other, 48), True, False, (other, 48))
    assert v.verdict == PASS and v.cls == REUSE_NUMERICS and v.first_diff == 2
    assert "exactly as native prefix caching" in v.reasons[0] and "(48 cached tokens)" in v.reasons[0]


def test_a_divergence_the_reuse_control_does_not_show_is_a_finding_when_it_reused():
    v = decide_load_request(BASE, _req((5, 6, 1, 2)), True, False, ((5, 6, 3, 3), 32))
    assert v.verdict == FAIL and v.cls is None and "differs from baseline @2" in v.reasons[0]
    # without a reuse control (its run failed), the request is judged as any scenario request
    assert decide_load_request(BASE, _req((5, 6, 1, 2)), True, False, None).verdict == FAIL
    # the schedule control (cache-off under the same load) diverging too: schedule numerics, INCONCLUSIVE
    v = decide_load_request(BASE, _req((5, 6, 1, 2)), False, False, ((5, 6, 3, 3), 32))
    assert v.verdict == INCONCLUSIVE and v.cls == SCHEDULE_NUMERICS


def test_a_missing_hit_counter_stays_inconclusive_even_when_the_control_agrees():
    v = decide_load_request(BASE, _req((5, 6, 1, 2), None), True, False, ((5, 6, 1, 2), 32))
    assert v.verdict == INCONCLUSIVE and v.cls == REUSE_NUMERICS


def _fixture(tmp_path, **scenario) -> str:
    sc = {"name": "production-load", "load": LOAD, **scenario}
    arm = {"name": "PlantedFault-none", "connector": "PlantedFaultConnector", "module_path": PLANTED_MODULE,
           "extra_config": {"store_dir": "@tmpdir", "fault": "none"}}  # fmt: skip
    return write_arms_fixture(tmp_path / "f.json", "load", "a load scenario", [arm], scenarios=[sc])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ((), "a load scenario's reuse control is native prefix caching"),
        (("--compare-native", "--frontend", "async"), "drives vLLM's engine step by step"),
    ],
)
def test_the_run_refuses_a_load_scenario_it_cannot_judge(tiny_model, tmp_path, extra, message):
    report = tmp_path / "r.json"
    proc = run_cli(fixture_argv(tiny_model, _fixture(tmp_path), report, "--scenarios", "all", *extra))
    assert proc.returncode == 2 and message in proc.stderr and not report.exists()
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1, proc.stderr


def test_generated_prompts_outside_the_vocabulary_are_refused(tiny_model, tmp_path):
    report = tmp_path / "r.json"
    fixture = write_arms_fixture(tmp_path / "f.json", "load", "x", [], scenarios=[
        {"name": "production-load", "load": {**LOAD, "token_range": [3, 5000]}}])  # fmt: skip
    proc = run_cli(fixture_argv(tiny_model, fixture, report, "--scenarios", "all", "--compare-native"))
    assert proc.returncode == 2 and "outside the vocabulary (size 320)" in proc.stderr, proc.stderr
