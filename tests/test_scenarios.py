"""Scenarios without an engine: fixture validation (one line, exit 2), the verdict rules, the contract, the
acceptance and exit codes, the report schema and the summary block. The engine runs them in
tests/test_scenarios_e2e.py."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
from kvkit_testutil import ROOT, run_cli

from repro.contract.job import ArmSpec, EngineConfig, Job, ProbeJob, ScenarioJob, StepJob
from repro.contract.result import ArmResult, ProbeResult, RequestResult, ScenarioResult, StepRequest
from repro.errors import EXIT_MISMATCH, EXIT_OK, EXIT_RUNTIME, UsageError
from repro.judge.kv_verdict import KVVerdict, decide_scenario_kv
from repro.judge.scenario_verdict import SCHEDULE_NUMERICS, decide_scenario_arm, decide_scenario_request
from repro.judge.verdict import CORRUPT, EXACT, FAIL, INCONCLUSIVE, PASS, UNAVAILABLE, Request, counter_missing
from repro.plan.fixtures import load_fixture, parse_fixture
from repro.plan.scenarios import select
from repro.plan.suite import build_probes
from repro.publish.summary import format_summary, scenario_block
from repro.readmodel import as_report
from repro.record.acceptance import check_scenario_acceptance
from repro.record.exit_rule import exit_code
from repro.record.report import validate_report

CPU_FIXTURE = ROOT / "fixtures" / "scenarios-cpu.json"
BASE = (1, 2, 3, 4)


def _doc(scenarios=None, **extra) -> dict:
    doc = json.loads(CPU_FIXTURE.read_text(encoding="utf-8"))
    if scenarios is not None:  # the shipped scenarios' expectations and skips go with them
        doc["scenarios"] = scenarios
        doc.pop("expected_scenarios")
        doc.pop("expected_scenarios_kv")
        for arm in doc["arms"]:
            arm.pop("skip_scenarios", None)
    doc.update(extra)
    return doc


def _scenario(**over) -> dict:
    sc = {"name": "s", "steps": [{"submit": ["fixture"], "expect": "miss"}, {"submit": ["fixture"]}]}
    sc.update(over)
    return sc


# ---- fixtures ---------------------------------------------------------------------------------------------


def test_the_cpu_fixture_declares_the_four_shipped_scenarios():
    fixture = load_fixture(CPU_FIXTURE)
    assert [sc.name for sc in fixture.scenarios] == ["a-b-a", "eviction", "preemption", "in-flight"]
    pre = next(sc for sc in fixture.scenarios if sc.name == "preemption")
    assert pre.engine["preemption"] is True and pre.widest == 4
    assert pre.probe_names == ("fixture", "chat-511", "chat-512", "chat-513")


@pytest.mark.parametrize(
    ("scenario", "message"),
    [
        (_scenario(steps=[]), "scenario s.steps: empty"),
        (_scenario(steps=[{"submit": []}]), r"scenario s.steps\[0\].submit: empty"),
        (_scenario(steps=[{"submit": ["a b"]}]), r"scenario s.steps\[0\].submit\[0\]: 'a b' must be"),
        (_scenario(steps=[{"submit": ["fixture"], "expect": "hit"}]), r"expect: 'hit' is not one of miss, reuse"),
        (
            _scenario(steps=[{"submit": ["fixture"], "togther": True}]),
            r"scenarios\[0\]\.steps\[0\]: unknown field 'togther' \(did you mean 'together'\?",
        ),
        (_scenario(steps=[{"submit": ["fixture", "fixture"], "together": True}]), "names each probe once"),
        (_scenario(steps=[{"submit": ["fixture"], "together": "yes"}]), "together: must be true or false"),
        (
            _scenario(steps=[{"submit": ["fixture"], "wait_s": -1}]),
            r"steps\[0\].wait_s: must be a number of seconds from 0",
        ),
        (
            _scenario(steps=[{"submit": ["fixture"], "wait_s": 301}]),
            r"wait_s: must be a number of seconds from 0 to 300",
        ),
        (_scenario(steps=[{"submit": ["fixture"], "wait_s": "5"}]), r"wait_s: must be a number of seconds .*not '5'"),
        (_scenario(steps=[{"submit": ["fixture"], "wait_s": True}]), r"wait_s: must be a number of seconds"),
        (_scenario(engine={"kv_cache_tokens": 0}), "engine.kv_cache_tokens: must be positive"),
        (_scenario(engine={"kv_cache_tokens": "2048"}), "engine.kv_cache_tokens: wrong type str"),
        (_scenario(engine={"preemption": 1}), "engine.preemption: wrong type int"),
        (
            _scenario(engine={"gpu_blocks": 4}),
            r"scenarios\[0\]\.engine: unknown field 'gpu_blocks' \(known: kv_cache_tokens",
        ),
        (_scenario(mp_server={"cpu_pool_gb": 1}), r"scenarios\[0\]\.mp_server: unknown field 'cpu_pool_gb'"),
        (_scenario(mp_server={"l1_use_lazy": "no"}), "mp_server.l1_use_lazy: wrong type str"),
        (_scenario(lmcache={"x": [1]}), "lmcache: must be an object of LMCache YAML keys"),
        (
            _scenario(engine={"max_num_seqs": 1}, steps=[{"submit": ["fixture", "chat-511"], "together": True}]),
            r"max_num_seqs: 1 is fewer than its largest together step \(2\)",
        ),
        (_scenario(name="a/b"), r"scenarios\[0\].name: 'a/b' must be"),
        (_scenario(colour="red"), r"scenarios\[0\]: unknown field 'colour'"),
    ],
)
def test_a_bad_scenario_is_one_line(scenario, message):
    with pytest.raises(UsageError, match=message) as caught:
        parse_fixture(_doc([scenario]), "f.json", "0" * 64)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("fixture f.json: ")


def test_duplicate_scenarios_and_expectations_or_skips_of_unknown_ones_are_refused():
    with pytest.raises(UsageError, match="duplicate scenario name 's'"):
        parse_fixture(_doc([_scenario(), _scenario()]), "f.json", "0" * 64)
    with pytest.raises(UsageError, match="expected_scenarios.native: no scenario named nope"):
        parse_fixture(_doc([_scenario()], expected_scenarios={"native": {"nope": PASS}}), "f.json", "0" * 64)
    arms = [{"name": "X", "connector": "ExampleConnector", "skip_scenarios": {"t": "why"}}]
    with pytest.raises(UsageError, match=r"arms\[0\].skip_scenarios: no scenario named t"):
        parse_fixture(_doc([_scenario()], arms=arms), "f.json", "0" * 64)
    with pytest.raises(UsageError, match=r"expected_scenarios_kv.native.s: 'FINE' is not one of"):
        parse_fixture(_doc([_scenario()], expected_scenarios_kv={"native": {"s": "FINE"}}), "f.json", "0" * 64)


def test_the_run_checks_scenario_names_probes_and_cache_size():
    fixture = load_fixture(CPU_FIXTURE)
    with_suite = build_probes(fixture.probes, "acceptance")
    assert select(fixture, None, with_suite, 2048) == []
    assert [sc.name for sc in select(fixture, "all", with_suite, 2048)] == [sc.name for sc in fixture.scenarios]
    assert [sc.name for sc in select(fixture, "in-flight,a-b-a", with_suite, 2048)] == ["in-flight", "a-b-a"]
    with pytest.raises(
        UsageError, match=r"--scenarios: no scenario .nope. in fixture .* \(it declares a-b-a, eviction"
    ):
        select(fixture, "a-b-a,nope", with_suite, 2048)
    with pytest.raises(UsageError, match="submits 'chat-511', not a probe of this run .*add --suite acceptance"):
        select(fixture, "a-b-a", build_probes(fixture.probes, None), 2048)
    with pytest.raises(UsageError, match="kv_cache_tokens 2048 is below --max-model-len 4096"):
        select(fixture, "a-b-a", with_suite, 4096)
    bare = parse_fixture(_doc(scenarios=[]), "f.json", "0" * 64)
    with pytest.raises(UsageError, match="declares no scenarios"):
        select(bare, "all", with_suite, 2048)


def test_existing_fixtures_are_unchanged_by_scenarios():
    """Every shipped fixture loads as before (no scenarios where none are declared); their bytes are hashed in
    committed reports, so none may change."""
    born_with_scenarios = {"selftest-cpu-llamaserver.json"}  # llama-server's self-test: #27148's sequence
    for path in sorted((ROOT / "fixtures").glob("*.json")):
        fixture = load_fixture(path)
        if not path.name.startswith("scenarios-") and path.name not in born_with_scenarios:
            assert fixture.scenarios == () and fixture.expected_scenarios == {}, path


def test_bad_scenario_input_exits_2_with_one_line(tmp_path, tiny_model):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_doc([_scenario(steps=[{"submit": ["fixture"], "expect": "hit"}])])))
    proc = run_cli(["--model", tiny_model, "--device", "cpu", "--compare-native", "--fixture", str(bad),
                    "--scenarios", "all", "--report", str(tmp_path / "r.json")])  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "expect: 'hit' is not one of miss, reuse" in lines[0]
    proc = run_cli(["--model", tiny_model, "--device", "cpu", "--compare-native", "--fixture", str(CPU_FIXTURE),
                    "--scenarios", "nope", "--report", str(tmp_path / "r.json")])  # fmt: skip
    assert proc.returncode == 2 and "no scenario 'nope'" in proc.stderr
    assert not (tmp_path / "r.json").exists()


# ---- verdict rules ----------------------------------------------------------------------------------------


def _req(tokens=BASE, cached=0):
    return Request(tuple(tokens), cached)


def test_a_request_that_matches_passes_whether_hit_or_miss():
    for cached, role in ((0, "miss"), (992, "reuse")):
        v = decide_scenario_request(BASE, _req(cached=cached), None, True)
        assert (v.verdict, v.role, v.first_diff, v.reasons) == (PASS, role, None, ())


def test_a_hit_that_differs_fails():
    v = decide_scenario_request(BASE, _req((1, 2, 9, 9), 496), "reuse", True)
    assert v.verdict == FAIL and v.first_diff == 2 and v.reasons == ("496 cached tokens, differs from baseline @2",)


def test_expectations():
    hit_where_miss = decide_scenario_request(BASE, _req(cached=16), "miss", True)
    assert hit_where_miss.verdict == FAIL and "expected a miss, reported 16 cached tokens" in hit_where_miss.reasons
    no_hit = decide_scenario_request(BASE, _req(cached=0), "reuse", True)
    assert no_hit.verdict == INCONCLUSIVE and "reuse not exercised" in no_hit.reasons[0]
    missing = decide_scenario_request(BASE, _req(cached=None), None, True)
    assert missing.verdict == INCONCLUSIVE and missing.reasons == (counter_missing(None, cached=True),)


def test_a_divergence_the_control_shows_too_is_schedule_numerics_never_a_fail():
    v = decide_scenario_request(BASE, _req((1, 2, 9, 9), 496), "reuse", False)
    assert (v.verdict, v.cls) == (INCONCLUSIVE, SCHEDULE_NUMERICS)
    failed_control = decide_scenario_request(BASE, _req((1, 2, 9, 9), 496), "reuse", None)
    assert failed_control.verdict == INCONCLUSIVE and failed_control.cls is None
    assert "cache-off run failed" in failed_control.reasons[0]


def test_a_miss_that_differs_is_a_no_hit_finding_unless_its_counter_is_missing_or_its_call_preempted():
    """A miss whose counter says 0 and whose answer differs, where the control matched, is a FAIL with the finding
    no-hit-differs (tests/test_no_hit_differs.py has the rest); one with no counter stays INCONCLUSIVE."""
    quiet = decide_scenario_request(BASE, _req((1, 9, 9, 9), 0), None, True)
    assert quiet.verdict == FAIL and quiet.finding == "no-hit-differs" and "with no reported hit" in quiet.reasons[0]
    unread = decide_scenario_request(BASE, _req((1, 9, 9, 9), None), None, True)
    assert unread.verdict == INCONCLUSIVE and unread.finding is None and "no reuse to blame" in unread.reasons[-1]
    preempted = decide_scenario_request(BASE, _req((1, 9, 9, 9), 0), None, True, preempted=True)
    assert preempted.verdict == FAIL and "preempted" in preempted.reasons[0] and preempted.finding is None


def test_the_arm_takes_the_worst_and_needs_its_preemption():
    ok = decide_scenario_request(BASE, _req(cached=16), None, True)
    bad = decide_scenario_request(BASE, _req((9, 9, 9, 9), 16), None, True)
    assert decide_scenario_arm([("step 0 a", ok)], False, 0).verdict == PASS
    arm = decide_scenario_arm([("step 0 a", ok), ("step 1 a", bad)], True, 0)
    assert arm.verdict == FAIL
    assert arm.reasons == (
        "step 1 a: 16 cached tokens, differs from baseline @0",
        "the scenario needs preemption and the engine preempted no request",
    )
    none = decide_scenario_arm([("step 0 a", ok)], True, 0)
    assert none.verdict == INCONCLUSIVE
    unread = decide_scenario_arm([("step 0 a", ok)], True, None)
    assert unread.verdict == INCONCLUSIVE and "counter is unavailable" in unread.reasons[0]
    assert decide_scenario_arm([("step 0 a", ok)], True, 3).verdict == PASS
    assert decide_scenario_arm([], False, 0).verdict == INCONCLUSIVE


def test_an_arm_whose_requests_all_missed_compared_no_reuse_and_is_not_a_pass():
    miss = decide_scenario_request(BASE, _req(cached=0), None, True)
    assert miss.verdict == PASS  # a miss that matches is a correct miss
    arm = decide_scenario_arm([("step 0 a", miss), ("step 1 a", miss)], False, 0)
    assert arm.verdict == INCONCLUSIVE
    assert arm.reasons == ("no request reused cached tokens: the scenario compared no reuse",)


def test_the_kv_verdict_of_a_scenario_arm():
    exact, gap = KVVerdict(EXACT, ()), KVVerdict(UNAVAILABLE, ("no figures",))
    corrupt = KVVerdict(CORRUPT, ("bad",), (0, 1), (2,), ("K",))
    assert decide_scenario_kv([("step 1 a", exact)]).verdict == EXACT
    assert decide_scenario_kv([("step 1 a", exact), ("step 2 b", gap)]).reasons == ("step 2 b: no figures",)
    worst = decide_scenario_kv([("step 1 a", gap), ("step 2 b", corrupt)])
    assert (worst.verdict, worst.blocks, worst.layers, worst.planes) == (CORRUPT, (0, 1), (2,), ("K",))
    assert decide_scenario_kv([]).verdict == UNAVAILABLE


# ---- contract ---------------------------------------------------------------------------------------------


def test_a_scenario_job_and_result_round_trip():
    engine = EngineConfig("m", None, "float32", 0, 0.1, 2048, 16, "cpu", 2048, 4, 4096)
    job = Job(ArmSpec("native~scenario.s", "native"), engine, 16, 2, (ProbeJob("a", {"token_ids": [1, 2]}, 1),),
              scenario=ScenarioJob("s", (StepJob(("a",)), StepJob(("a", "b"), True))))  # fmt: skip
    assert Job.from_json(json.loads(json.dumps(job.to_json()))) == job
    waits = StepJob(("a",), wait_s=5.0)
    assert waits.to_json()["wait_s"] == 5.0 and "wait_s" not in StepJob(("a",)).to_json()  # old jobs unchanged
    assert StepJob.from_json(json.loads(json.dumps(waits.to_json()))) == waits
    plain = Job(ArmSpec("native", "native"), EngineConfig("m", None, "float32", 0, 0.1, 2048, 16, "cpu"), 16, 2, ())
    assert (
        "scenario" not in plain.to_json() and "max_num_seqs" not in plain.to_json()["engine"]
    )  # a plain job as before
    req = RequestResult("reuse", 16, (1, 2), (), "length", None, "x")
    result = ArmResult("native~scenario.s", probes=(ProbeResult("a", (1, 2), None, ()),),
                       scenario=ScenarioResult("s", (StepRequest(1, "a", req, 2),), 2, "vllm:num_preemptions"))  # fmt: skip
    assert ArmResult.from_json(json.loads(json.dumps(result.to_json()))) == result
    assert "scenario" not in ArmResult("native").to_json()


# ---- report, acceptance, exit code, summary ---------------------------------------------------------------

EXAMPLE = ROOT / "tests" / "data" / "report-scenarios-example.json"


def _report() -> dict:
    return json.loads(EXAMPLE.read_text(encoding="utf-8"))


def test_the_example_report_with_scenarios_matches_the_schema():
    validate_report(_report())
    report = _report()
    report["scenarios"][0]["steps"][-1]["wait_s"] = 5.0  # a step that waited
    validate_report(report)
    report["scenarios"][0]["steps"][-1]["wait_s"] = -1.0
    with pytest.raises(Exception, match="wait_s|-1"):
        validate_report(report)


def test_scenario_acceptance_is_checked_only_under_the_suite():
    sections = _report()["scenarios"]
    assert check_scenario_acceptance(sections, {}, None)["matched"] is None
    acc = check_scenario_acceptance(sections, {"native": {"a-b-a": PASS}}, "acceptance")
    assert acc["matched"] is False and acc["unchecked"][0]["arm"] == "ExampleConnector"
    full = {"native": {"a-b-a": PASS}, "ExampleConnector": {"a-b-a": PASS}}
    assert check_scenario_acceptance(sections, full, "acceptance")["matched"] is True
    wrong = check_scenario_acceptance(sections, {**full, "native": {"a-b-a": FAIL}}, "acceptance")
    assert wrong["matched"] is False and [c["ok"] for c in wrong["checked"]] == [True, False]
    kv = check_scenario_acceptance(sections, full, "acceptance", {"native": {"a-b-a": EXACT}})
    assert kv["matched"] is True and {c["check"] for c in kv["checked"]} == {"tokens", "kv"}


def _with(report: dict, arm: str, **fields) -> dict:
    out = copy.deepcopy(report)
    for entry in out["scenarios"][0]["arms"]:
        if entry["arm"] == arm:
            entry.update(fields)
    return out


def _accept(report: dict, table: dict, kv: dict | None = None) -> dict:
    report["acceptance"]["scenarios"] = check_scenario_acceptance(report["scenarios"], table, "acceptance", kv)
    return report


def test_exit_codes_of_scenarios():
    report = _report()
    full = {"native": {"a-b-a": PASS}, "ExampleConnector": {"a-b-a": PASS}}
    report["acceptance"]["matched"] = True  # the plain probes' part is not under test here
    report["acceptance"]["unchecked_arms"] = []
    assert exit_code(_accept(report, full)) == EXIT_OK
    assert exit_code(_accept(report, {"native": {"a-b-a": PASS}})) == EXIT_MISMATCH  # one left unchecked
    failed = _with(report, "native", verdict=FAIL)
    assert exit_code(_accept(failed, full)) == EXIT_MISMATCH
    assert exit_code(_accept(failed, {**full, "native": {"a-b-a": FAIL}})) == EXIT_OK  # a planted fault, expected
    assert exit_code(_accept(_with(report, "native", verdict="ERROR"), full)) == EXIT_RUNTIME
    corrupt = _with(report, "native", kv={"verdict": CORRUPT, "reasons": [], "blame": None})
    assert exit_code(_accept(corrupt, full)) == EXIT_MISMATCH
    assert exit_code(_accept(corrupt, full, {"native": {"a-b-a": CORRUPT}})) == EXIT_OK
    no_suite = copy.deepcopy(failed)
    no_suite["acceptance"]["scenarios"] = check_scenario_acceptance(no_suite["scenarios"], {}, None)
    no_suite["acceptance"]["matched"] = None
    for arm in no_suite["arms"]:
        arm["verdict"] = PASS
    assert exit_code(no_suite) == EXIT_MISMATCH
    assert exit_code(_with(no_suite, "native", verdict=PASS)) == EXIT_OK


def test_the_summary_block():
    report = _with(_report(), "native", verdict=FAIL)
    lines = scenario_block(as_report(report))
    assert lines[1] == "Scenarios"
    assert lines[2] == "  a-b-a · ExampleConnector: PASS · KV EXACT · preemptions 0 · hits 0 0 0 1488"
    assert lines[3].startswith("  a-b-a · native: FAIL · KV EXACT · preemptions 0 · hits 0 0 0 992")
    assert format_summary(report).count("\nScenarios\n") == 1  # once, before the claim line


def test_a_report_without_scenarios_has_no_trace_of_them():
    report = _report()
    del report["scenarios"]
    del report["config"]["scenarios"]
    del report["acceptance"]["scenarios"]
    validate_report(report)
    assert scenario_block(as_report(report)) == []
    assert "Scenarios" not in format_summary(report)


def test_the_example_is_a_real_run(tmp_path: Path):
    """The example is a verifier's own output (tests/data; copied from a run of fixtures/scenarios-cpu.json,
    --scenarios a-b-a): its fixture hash is the shipped fixture's."""
    report = _report()
    assert report["fixture"]["name"] == "scenarios-cpu"
    assert [sc["name"] for sc in report["scenarios"]] == ["a-b-a"]


# ---- a run's jobs -----------------------------------------------------------------------------------------


def _plan(tiny_model: str, *extra: str):
    from repro.plan.options import CPU_ENGINE_FLAGS, parse_args
    from repro.plan.run_plan import build_plan

    argv = ["--model", tiny_model, *CPU_ENGINE_FLAGS, "--compare-native", "--fixture", str(CPU_FIXTURE),
            "--report", "/tmp/unused.json", *extra]  # fmt: skip
    return build_plan(parse_args(argv), argv)


def test_a_scenario_job_carries_its_steps_and_engine(tiny_model):
    from repro.plan.arms import plan_arms
    from repro.run.scenarios import job_for, runs_of

    rp = _plan(tiny_model)
    fixture = load_fixture(CPU_FIXTURE)
    probes = build_probes(fixture.probes, "acceptance")
    pre = next(sc for sc in fixture.scenarios if sc.name == "preemption")
    runs, skipped = runs_of(pre, plan_arms(rp.asked, fixture))
    assert [run.name for _, run in runs] == ["baseline~scenario.preemption", "native~scenario.preemption"]
    assert {name: mode for name, (mode, _) in skipped.items()} == {
        "ExampleConnector": "connector",
        "native-matched": "native",
    }
    assert "FileNotFoundError" in skipped["ExampleConnector"][1]
    assert [run.name for _, run in runs_of(fixture.scenarios[0], plan_arms(rp.asked, fixture))[0]][1] == (
        "ExampleConnector~scenario.a-b-a"
    )
    job = job_for(rp.engine, runs[1][1], pre, probes, fixture.sha256, None)
    assert (job.engine.kv_cache_tokens, job.engine.max_num_seqs, job.engine.max_num_batched_tokens) == (2048, 4, None)
    assert [p.name for p in job.probes] == ["fixture", "chat-511", "chat-512", "chat-513"]
    assert job.scenario.steps[0] == StepJob(("fixture", "chat-511", "chat-512", "chat-513"), True)
    aba = fixture.scenarios[0]
    aba_job = job_for(rp.engine, runs[0][1], aba, probes, fixture.sha256, None)
    assert aba_job.engine.max_num_seqs == 1  # no together step


def test_an_lmcache_arm_gets_a_derived_yaml_and_its_mp_server_settings(tmp_path):
    import yaml

    from repro.contract.job import ConnectorSpec
    from repro.lmcache.mp import ServerSettings
    from repro.plan.arms import LMCACHE_CONFIG_ENV, PlannedArm
    from repro.run.scenarios import mp_settings, prepare

    fixture = load_fixture(ROOT / "fixtures" / "scenarios-gpu-lmcache.json")
    eviction = next(sc for sc in fixture.scenarios if sc.name == "eviction")
    v1 = PlannedArm(ArmSpec("LMCacheConnectorV1~scenario.eviction", "connector", ConnectorSpec("LMCacheConnectorV1")))
    arm, record = prepare(v1, eviction, tmp_path, [], tmp_path, str(ROOT / "fixtures" / "lmcache-local-cpu.yaml"))
    written = yaml.safe_load(Path(arm.env[LMCACHE_CONFIG_ENV]).read_text())
    assert written["max_local_cpu_size"] == 0.003 and written["chunk_size"] == 256  # the base's other keys kept
    assert record["overrides"] == {"max_local_cpu_size": 0.003}
    native = PlannedArm(ArmSpec("native~scenario.eviction", "native"))
    assert prepare(native, eviction, tmp_path, [], tmp_path, None) == (native, None)
    server = ServerSettings(**mp_settings(eviction))
    assert server.l1_size_gb == 0.003 and server.l1_use_lazy is False
    command = server.command("python", 1, 2)
    assert command[command.index("--l1-size-gb") + 1] == "0.003" and "--no-l1-use-lazy" in command
    assert "--no-l1-use-lazy" not in ServerSettings().command("python", 1, 2)  # the plain arms' lazy 4 GB L1, as before
    assert mp_settings(fixture.scenarios[0]) == {}


def test_a_step_can_wait_idle_before_it_is_submitted(tmp_path):
    """eviction-partial's last step waits 5 s (LMCache's MP server evicts in a loop once a second): the
    fixture, the job the child gets, the report's step record and how a reader sees it all carry it."""
    from repro.readmodel.scenarios import Step
    from repro.run.scenarios import scenario_job, section

    fixture = load_fixture(ROOT / "fixtures" / "scenarios-gpu-lmcache.json")
    partial = next(sc for sc in fixture.scenarios if sc.name == "eviction-partial")
    assert [(s.submit, s.expect, s.wait_s) for s in partial.steps] == [
        (("fixture",), "miss", 0.0), (("fixture",), "reuse", 0.0), (("chat-512",), "miss", 0.0),
        (("fixture",), "reuse", 5.0),
    ]  # fmt: skip
    assert partial.lmcache == {"max_local_cpu_size": 0.003}
    assert partial.mp_server == {"l1_size_gb": 0.003, "l1_use_lazy": False}  # an L1 of exactly 0.003 GB
    probes = build_probes(fixture.probes, "acceptance")
    engine = EngineConfig("m", None, "float16", 0, 0.45, 2048, 16, "cuda")
    job = scenario_job(Job(ArmSpec("native~scenario.eviction-partial", "native"), engine, 16, 2, ()), partial, probes)
    assert [s.wait_s for s in job.scenario.steps] == [0.0, 0.0, 0.0, 5.0]
    assert Job.from_json(json.loads(json.dumps(job.to_json()))).scenario.steps[3].wait_s == 5.0
    steps = section(partial, [], {}, None, "logs")["steps"]
    assert "wait_s" not in steps[2] and steps[3]["wait_s"] == 5.0  # only a step that waits says so
    record = steps[3]
    assert Step(record).text == "after 5 s idle: fixture · " + Step({**record, "wait_s": 0}).text.split(" · ")[1]
    assert Step({**record, "wait_s": 0}).text.startswith("fixture · ")


def test_the_child_sits_idle_before_a_waiting_step(monkeypatch):
    """run_scenario sleeps a step's wait_s after the step before it has finished and before it submits."""
    from types import SimpleNamespace

    from repro.engine import child
    from repro.engine.audit_records import AuditRecords

    events: list = []

    class FakeLLM:
        def generate(self, prompts, sp, use_tqdm=False):
            events.append(("generate", len(prompts)))
            comp = SimpleNamespace(token_ids=[7], logprobs=None, finish_reason="length", text="x")
            return [SimpleNamespace(outputs=[comp], num_cached_tokens=0, kv_transfer_params=None, request_id=str(i))
                    for i, _ in enumerate(prompts)]  # fmt: skip

    monkeypatch.setattr(child.time, "sleep", lambda s: events.append(("sleep", s)))
    monkeypatch.setattr(child, "preemption_count", lambda: (None, "unavailable: test"))
    engine = EngineConfig("m", None, "float32", 0, 0.1, 2048, 16, "cpu", 2048, 1)
    steps = (StepJob(("a",)), StepJob(("b",)), StepJob(("a",), wait_s=5.0))
    job = Job(ArmSpec("native~scenario.s", "native"), engine, 16, 2,
              (ProbeJob("a", {"token_ids": [1, 2]}, 1), ProbeJob("b", {"token_ids": [3, 4]}, 1)),
              scenario=ScenarioJob("s", steps))  # fmt: skip
    _, result = child.run_scenario(FakeLLM(), job, None, None, AuditRecords(None))
    assert events == [("generate", 1), ("generate", 1), ("sleep", 5.0), ("generate", 1)]
    assert [(r.step, r.probe) for r in result.requests] == [(0, "a"), (1, "b"), (2, "a")]


def test_a_scenario_may_turn_async_scheduling_off(tmp_path):
    """preemption-sync is preemption with vLLM's async scheduling off: the fixture, the child's job and the
    engine's kwargs carry it; absent, vLLM's platform default stands (no kwarg); a non-boolean is one line, exit 2."""
    from repro.engine.engine_args import engine_kwargs
    from repro.run.scenarios import scenario_job

    fixture = load_fixture(ROOT / "fixtures" / "scenarios-gpu-lmcache.json")
    by_name = {sc.name: sc for sc in fixture.scenarios}
    sync, plain = by_name["preemption-sync"], by_name["preemption"]
    assert sync.engine == {**plain.engine, "async_scheduling": False} and sync.steps == plain.steps
    probes = build_probes(fixture.probes, "acceptance")
    engine = EngineConfig("m", None, "float16", 0, 0.45, 2048, 16, "cuda")
    jobs = {
        sc.name: scenario_job(Job(ArmSpec(f"baseline~scenario.{sc.name}", "baseline"), engine, 16, 2, ()), sc, probes)
        for sc in (sync, plain)
    }
    assert jobs["preemption-sync"].engine.async_scheduling is False
    assert jobs["preemption"].engine.async_scheduling is None
    assert "async_scheduling" not in jobs["preemption"].to_json()["engine"]
    back = Job.from_json(json.loads(json.dumps(jobs["preemption-sync"].to_json())))
    assert back.engine.async_scheduling is False
    unsized = {"kv_cache_tokens": None}  # the kwargs without reading a model's config to size the cache
    assert engine_kwargs(replace(back, engine=replace(back.engine, **unsized)))["async_scheduling"] is False
    job = jobs["preemption"]
    assert "async_scheduling" not in engine_kwargs(replace(job, engine=replace(job.engine, **unsized)))
    data = json.loads((ROOT / "fixtures" / "scenarios-gpu-lmcache.json").read_text())
    next(s for s in data["scenarios"] if s["name"] == "preemption-sync")["engine"]["async_scheduling"] = "no"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(UsageError) as err:  # the CLI prints it as one line and exits 2 (the test above)
        load_fixture(bad)
    assert "\n" not in str(err.value) and "engine.async_scheduling: wrong type str" in str(err.value)


# ---- a connector beneath the GPU prefix cache in a scenario (repro.plan.offloading)


def test_beneath_the_gpu_cache_an_expected_reuse_counts_the_connectors_own_hits():
    base = (1, 2, 3)

    def req(cached, ext):
        return Request(base, cached, ext, counts_external=True)

    assert decide_scenario_request(base, req(32, 32), "reuse", True).verdict == PASS
    gpu_only = decide_scenario_request(base, req(32, 0), "reuse", True)
    assert gpu_only.verdict == INCONCLUSIVE and "connector not exercised" in gpu_only.reasons[0]
    missing = decide_scenario_request(base, req(32, None), "reuse", True)
    assert missing.verdict == INCONCLUSIVE and "the connector hit counter missing" in missing.reasons[0]
    # no expectation stated: a hit from either cache is correct, as for any arm
    assert decide_scenario_request(base, req(32, 0), None, True).verdict == PASS
    # a changed answer after a hit is a FAIL whoever served it
    assert decide_scenario_request(base, Request((1, 9, 3), 32, 0, True), None, True).verdict == FAIL


def test_a_scenario_whose_connector_beneath_the_gpu_cache_served_nothing_is_no_pass():
    ok = decide_scenario_request((1,), Request((1,), 16, 0, True), None, True)
    assert decide_scenario_arm([("step 2 p", ok)], False, 0, connector_served=True).verdict == PASS
    arm = decide_scenario_arm([("step 2 p", ok)], False, 0, connector_served=False)
    assert arm.verdict == INCONCLUSIVE and "served no request" in arm.reasons[-1]
    assert decide_scenario_arm([("step 2 p", ok)], False, 0).verdict == PASS  # not such an arm: as before


def test_no_reuse_under_chunked_prefill_says_the_prefill_shape_and_nothing_else_changes():
    """A load whose engine prefills over several steps (long_prefill_token_threshold) and reused nothing: the reason
    names the shape the plain probes did not run; the verdict is INCONCLUSIVE either way."""
    miss = decide_scenario_request(BASE, _req(cached=0), None, False)
    whole = decide_scenario_arm([("round 1 a", miss)], False, 0)
    chunked = decide_scenario_arm([("round 1 a", miss)], False, 0, None, 32)
    assert whole.verdict == chunked.verdict == INCONCLUSIVE
    assert whole.reasons[-1] == "no request reused cached tokens: the scenario compared no reuse"
    assert chunked.reasons[-1].startswith(whole.reasons[-1] + " (its engine prefilled each request over several steps")
    assert "at most 32 tokens a step" in chunked.reasons[-1]
    hit = decide_scenario_request(BASE, _req(cached=16), None, True)
    assert decide_scenario_arm([("round 1 a", hit)], False, 0, None, 32).reasons == ()  # only where nothing reused
