"""MultiConnector arms without an engine (issue 36, item 5): members planned and made fresh one by one, the member
that served each reuse read from the KV audit's record, and a verdict per member that never lets the arm's PASS
stand for a member that served nothing. The real engine's run is tests/test_e2e_multi_connector.py."""

from __future__ import annotations

from pathlib import Path

from repro.contract.job import ArmSpec, ConnectorSpec
from repro.engine.audit_records import served_member
from repro.judge.members import Served, decide_members, served_reuses
from repro.judge.verdict import FAIL, INCONCLUSIVE, PASS
from repro.plan import multi
from repro.plan.arms import PLANTED_FAULT_MODULE, TMPDIR_TOKEN, PlannedArm, fresh_state, plan_arms, scratch_dirs
from repro.plan.settings import ArmsAsked
from repro.readmodel.arms import Arm

EXAMPLE = {"kv_connector": "ExampleConnector", "kv_role": "kv_both"}
PLANTED = {"kv_connector": "PlantedFaultConnector", "kv_connector_module_path": PLANTED_FAULT_MODULE,
           "kv_connector_extra_config": {"fault": "none"}}  # fmt: skip


def _planned(members: list[dict]) -> PlannedArm:
    extra = {"connectors": members}
    arms = plan_arms(ArmsAsked("MultiConnector", None, extra), fixture=None)
    return arms[1]


def test_each_member_gets_a_role_and_a_fresh_store_of_its_own_every_run(tmp_path):
    user = tmp_path / "kv"
    example = {**EXAMPLE, "kv_connector_extra_config": {"shared_storage_path": str(user)}}
    arm = _planned([example, PLANTED])
    members = arm.spec.connector.extra_config["connectors"]
    assert members[1]["kv_role"] == "kv_both"  # the arm's role where the member names none
    assert members[1]["kv_connector_extra_config"]["store_dir"] == TMPDIR_TOKEN  # the planted store, filled in
    (tmp_path / "scratch").mkdir()
    scratch: list[str] = []
    run, _ = fresh_state(arm, scratch, tmp_path / "scratch", environ={})
    got = [m["kv_connector_extra_config"] for m in run.spec.connector.extra_config["connectors"]]
    assert Path(got[0]["shared_storage_path"]).parent == user and got[1]["store_dir"] in scratch
    assert got[1]["fault"] == "none"  # what is no store stays as given
    assert run.store["fresh"] is True
    assert run.store["rewritten"] == [
        f"connectors[0].shared_storage_path {user} -> {got[0]['shared_storage_path']}",
        f"connectors[1].store_dir {TMPDIR_TOKEN} -> {got[1]['store_dir']}",
    ]
    assert sorted(map(str, scratch_dirs(run.spec))) == sorted(scratch)  # what its child writes, member stores too
    again, _ = fresh_state(arm, [], tmp_path / "scratch", environ={})
    assert again.spec.connector.extra_config["connectors"][1]["kv_connector_extra_config"]["store_dir"] not in scratch


def test_an_example_member_without_a_store_gets_one_and_a_member_path_the_kit_does_not_know_persists(tmp_path):
    arm = _planned([EXAMPLE, {"kv_connector": "SomeConnector", "kv_connector_extra_config": {"root": "/data/kv"}}])
    assert arm.spec.connector.extra_config["connectors"][0]["kv_connector_extra_config"] == {
        "shared_storage_path": TMPDIR_TOKEN
    }  # left to vLLM it would write to /tmp/kv_cache, shared by every run
    (tmp_path / "s").mkdir()
    run, _ = fresh_state(arm, [], tmp_path / "s", environ={})
    assert run.store["fresh"] is False and "connectors[1].root /data/kv" in run.store["why"]


def test_a_multiconnector_with_an_offloading_member_sits_beneath_the_gpu_cache():
    arm = _planned([{"kv_connector": "OffloadingConnector"}, EXAMPLE])
    assert arm.spec.connector.gpu_prefix_cache is True and arm.spec.connector.gpu_cache_reset == "before-reuse"
    assert _planned([EXAMPLE, PLANTED]).spec.connector.gpu_prefix_cache is False


def test_members_problem_names_what_cannot_run():
    assert multi.members_problem({"connectors": [EXAMPLE, PLANTED]}) is None
    assert "unknown key 'kv_conector'" in multi.members_problem({"connectors": [{"kv_conector": "X"}]})
    assert "must be an object" in multi.members_problem({"connectors": [EXAMPLE, 3]})
    mp = multi.members_problem({"connectors": [{"kv_connector": "LMCacheMPConnector"}]})
    assert "run it as an arm of its own" in mp


def test_the_member_that_served_comes_from_the_audit_record():
    record = {"seq": 3, "external_tokens": 1488, "connector_member": {"index": 1, "connector": "ExampleConnector"}}
    assert served_member(record, "/audit") == {"index": 1, "connector": "ExampleConnector", "tokens": 1488}
    assert served_member({"seq": 0, "external_tokens": 0, "connector_member": None}, "/a") == {
        "index": None, "connector": None, "tokens": 0}  # fmt: skip
    assert "KV audit is off" in served_member(None, None)["unavailable"]
    assert "no record" in served_member({"seq": None, "unavailable": "no record"}, "/a")["unavailable"]
    assert "did not see which" in served_member({"seq": 1, "external_tokens": 32}, "/a")["unavailable"]


def _reuse(member: int | None, tokens: int, first_diff: int | None = None, unavailable: str | None = None) -> dict:
    m = {"index": member, "connector": None, "tokens": tokens}
    return {"connector_member": {"index": None, "unavailable": unavailable} if unavailable else m,
            "first_diff": first_diff}  # fmt: skip


def _probes(*reuses: dict) -> list[dict]:
    return [{"name": "fixture", "requests": [_reuse(None, 0), *reuses]}]


def test_a_member_that_served_no_reuse_is_not_exercised_while_the_one_that_served_passes():
    served = served_reuses(_probes(_reuse(0, 1488), _reuse(0, 1488)))
    assert [s.label for s in served] == ["fixture reuse 1", "fixture reuse 2"]
    example, planted = decide_members(["ExampleConnector", "PlantedFaultConnector"], served, PASS)
    assert (example.verdict, example.hits, example.reuses) == (PASS, 2976, ("fixture reuse 1", "fixture reuse 2"))
    assert planted.verdict == INCONCLUSIVE and planted.hits == 0
    assert planted.reasons == ("member 1 PlantedFaultConnector never served a reuse: not exercised",)


def test_a_member_whose_reuse_differs_fails_and_is_named_and_the_other_member_keeps_its_own_verdict():
    served = served_reuses(_probes(_reuse(1, 1488, first_diff=9), _reuse(0, 1488)))
    good, bad = decide_members(["ExampleConnector", "PlantedFaultConnector"], served, FAIL)
    assert bad.verdict == FAIL and "member 1 PlantedFaultConnector served fixture reuse 1" in bad.reasons[0]
    assert good.verdict == PASS and good.reuses == ("fixture reuse 2",)


def test_no_member_passes_an_arm_that_cannot_clear_anything_nor_one_whose_service_is_unknown():
    (only,) = decide_members(["ExampleConnector"], [Served("fixture reuse 1", 0, 1488, False)], INCONCLUSIVE)
    assert only.verdict == INCONCLUSIVE and "the arm is INCONCLUSIVE" in only.reasons[0]
    unknown = served_reuses(_probes(_reuse(None, 0, unavailable="the KV audit is off")))
    (m,) = decide_members(["ExampleConnector"], unknown, PASS)
    assert m.verdict == INCONCLUSIVE and "is not known: the KV audit is off" in m.reasons[0]


def test_the_summary_says_per_member_hits_and_that_the_pass_is_not_the_idle_members():
    members = decide_members(["ExampleConnector", "PlantedFaultConnector"], [Served("fixture reuse 1", 0, 1488, False)],
                             PASS)  # fmt: skip
    conn = ConnectorSpec("MultiConnector", None, {"connectors": [EXAMPLE, PLANTED]})
    arm = {"name": "multi", "mode": "connector", "connector": conn.to_json(), "verdict": PASS, "error": None,
           "reasons": [r for m in members for r in m.reasons], "probes": [], "findings": [],
           "members": [m.to_json() for m in members]}  # fmt: skip
    read = Arm.from_json(arm, 16)
    text = "\n".join([f"{read.title}: {read.verdict_text}", *(m.line for m in read.members)])
    assert "multi (MultiConnector): PASS · not exercised: member 1 PlantedFaultConnector" in text
    assert "member 0 ExampleConnector: served 1 reuse, 1488 tokens · PASS" in text
    assert "member 1 PlantedFaultConnector: served 0 reuses, 0 tokens · INCONCLUSIVE — never served" in text
    assert ArmSpec("x", "connector", conn).connector.name == multi.MULTI


def test_the_report_page_lists_each_members_service_under_the_table():
    import json

    from conftest import ROOT

    from repro.publish.site import render_report_page

    report = json.loads((ROOT / "reports" / "h200-lmcache-tiny.json").read_text(encoding="utf-8"))
    members = decide_members(["ExampleConnector", "PlantedFaultConnector"], [Served("fixture reuse 1", 0, 1488, False)],
                             PASS)  # fmt: skip
    conn = ConnectorSpec("MultiConnector", None, {"connectors": [EXAMPLE, PLANTED]})
    arm = {"name": "multi", "mode": "connector", "connector": conn.to_json(), "verdict": PASS, "error": None,
           "reasons": [], "probes": [], "findings": [], "log": "x.logs/multi.log", "warnings": 0,
           "members": [m.to_json() for m in members]}  # fmt: skip
    html = render_report_page({**report, "arms": [*report["arms"], arm]}, stem="t")
    assert '<ul id="members">' in html and "multi (MultiConnector)" in html
    assert "member 1 PlantedFaultConnector: served 0 reuses, 0 tokens · INCONCLUSIVE" in html
    # a report without a MultiConnector arm renders as before: no members list
    assert 'id="members"' not in render_report_page(report, stem="t")


def _multi_report(members: list) -> dict:
    from repro.record.acceptance import check_acceptance

    conn = ConnectorSpec("MultiConnector", None, {"connectors": [EXAMPLE, PLANTED]})
    probe = {"name": "fixture", "verdict": PASS, "reasons": [], "skipped": None, "kv": None,
             "requests": [{"first_diff": None, "cached_tokens": 0}, {"first_diff": None, "cached_tokens": 1488}]}  # fmt: skip
    base = {"name": "baseline", "mode": "baseline", "verdict": PASS, "reasons": [], "error": None,
            "probes": [{**probe, "requests": probe["requests"][:1]}]}  # fmt: skip
    arm = {"name": "multi", "mode": "connector", "connector": conn.to_json(), "verdict": PASS, "error": None,
           "reasons": [r for m in members for r in m.reasons], "probes": [probe], "findings": [],
           "members": [m.to_json() for m in members]}  # fmt: skip
    return {"kind": "kvkit-report", "schema_version": 2, "complete": True, "errors": [], "arms": [base, arm],
            "acceptance": check_acceptance([], {}, None), "generations": 0, "provenance": {},
            "config": {"kv_audit": False}, "warnings": []}  # fmt: skip


def test_an_unexercised_member_is_exit_1_through_the_one_exit_rule_and_never_matched_in_the_headline():
    """Issue 55, D8: the member never served a reuse (INCONCLUSIVE, not exercised); no fixture states a member's
    verdict, so the exit is 1 with a reason naming it, never 0 'every verdict PASS'."""
    from repro.errors import EXIT_MISMATCH, EXIT_OK
    from repro.publish.headline import headline
    from repro.publish.summary import format_summary
    from repro.record.exit_rule import exit_reason

    idle = decide_members(["ExampleConnector", "PlantedFaultConnector"], [Served("fixture reuse 1", 0, 1488, False)],
                          PASS)  # fmt: skip
    report = _multi_report(idle)
    code, why = exit_reason(report)
    assert code == EXIT_MISMATCH, why
    assert "every verdict PASS" not in why and "multi member 1 PlantedFaultConnector" in why and INCONCLUSIVE in why
    text = headline(report)
    assert "matched" not in text and PASS not in text and "member 1 PlantedFaultConnector not exercised" in text
    line = next(x for x in format_summary(report).splitlines() if x.startswith("multi (MultiConnector): "))
    assert not line.removeprefix("multi (MultiConnector): ").startswith(PASS), line
    # both members served a reuse: exit 0, and the headline may say matched
    both = decide_members(["ExampleConnector", "PlantedFaultConnector"],
                          [Served("fixture reuse 1", 0, 1488, False), Served("fixture reuse 2", 1, 1488, False)],
                          PASS)  # fmt: skip
    report = _multi_report(both)
    assert exit_reason(report) == (EXIT_OK, "every verdict PASS (no acceptance suite)")
    assert "matched caching off token for token on 1 of 1 probes" in headline(report)
