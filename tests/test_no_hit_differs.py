"""A reuse that reports no hit and answers differently, without an engine: its own class (the finding
no-hit-differs beside a FAIL, repro.judge.verdict), decided against the same-length control (a plain probe's cold
request, a scenario's cache-off run of the same steps), what the KV audit reads of its blocks (repro.judge.kvaudit,
repro.run.scenario_kv), and exit 1 with its name in the exit reason, the headline and the summary, even where a
fixture states the FAIL. An identical answer with a 0 counter stays INCONCLUSIVE (no reuse shown)."""

from __future__ import annotations

from repro.contract.result import ArmResult, ProbeResult, RequestResult, ScenarioResult, StepRequest
from repro.errors import EXIT_MISMATCH
from repro.judge import kvaudit
from repro.judge.evaluate import judge_arm
from repro.judge.scenario_verdict import SCHEDULE_NUMERICS, decide_scenario_request
from repro.judge.verdict import (
    CORRUPT,
    EXACT,
    FAIL,
    FOREIGN,
    INCONCLUSIVE,
    NO_HIT_DIFFERS,
    PASS,
    ProbeVerdict,
    Request,
    decide_probe,
    decide_shared_first_block,
)
from repro.publish.headline import headline
from repro.publish.summary import format_summary
from repro.record.acceptance import check_acceptance
from repro.record.exit_rule import exit_reason
from repro.run.scenario_kv import annotate_kv

BASE = tuple(range(100, 116))
OTHER = (100, 101, 102, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7)  # differs @3
PROMPT = tuple((i * 7) % 250 + 3 for i in range(300))


def test_a_no_hit_reuse_that_differs_while_its_cold_request_matched_is_a_finding():
    pv = decide_probe(BASE, Request(BASE, 0), [Request(OTHER, 0)], asked=16)
    assert (pv.verdict, pv.finding) == (FAIL, NO_HIT_DIFFERS)
    why = (
        "reuse 1: differs from baseline @3 with no reported hit (0 cached tokens), though the cold request (the same "
        "prompt prefilled whole in this engine, a verified miss) gave the baseline's tokens: not numerics"
    )
    assert pv.reasons == (why,)


def test_a_no_hit_reuse_with_the_baselines_answer_stays_inconclusive_no_reuse_shown():
    pv = decide_probe(BASE, Request(BASE, 0), [Request(BASE, 0)], asked=16)
    assert (pv.verdict, pv.finding, pv.reasons) == (
        INCONCLUSIVE,
        None,
        ("reuse 1: zero cached tokens, reuse not exercised",),
    )


def test_where_the_same_length_control_differs_too_the_difference_is_numerics_not_a_finding():
    """The cold request is the same prompt prefilled whole in the same engine: where it already differs from the
    baseline, this engine's numerics differ, and a no-hit reuse that differs tells nothing more."""
    pv = decide_probe(BASE, Request(OTHER, 0), [Request(OTHER, 0)], asked=16)
    assert pv.verdict == INCONCLUSIVE and pv.finding is None
    assert "cold miss differs from baseline @3: reuse cannot be blamed" in pv.reasons


def test_a_missing_counter_is_never_read_as_no_hit():
    for cached in (None, -1):
        pv = decide_probe(BASE, Request(BASE, 0), [Request(OTHER, cached)], asked=16)
        assert pv.verdict == INCONCLUSIVE and pv.finding is None and "hit counter missing" in pv.reasons[0]


def test_a_reported_hit_that_differs_stays_a_plain_fail_and_both_together_carry_the_finding():
    hit = decide_probe(BASE, Request(BASE, 0), [Request(OTHER, 288)], asked=16)
    assert (hit.verdict, hit.finding) == (FAIL, None)
    both = decide_probe(BASE, Request(BASE, 0), [Request(OTHER, 288), Request(OTHER, 0)], asked=16)
    assert (both.verdict, both.finding) == (FAIL, NO_HIT_DIFFERS) and len(both.reasons) == 2


def test_a_shared_first_block_keeps_a_finding_a_fail():
    found = ProbeVerdict(FAIL, ("x",), None, finding=NO_HIT_DIFFERS)
    assert decide_shared_first_block(found, "p").verdict == FAIL
    assert decide_shared_first_block(ProbeVerdict(FAIL, ("x",), None), "p").verdict == INCONCLUSIVE


def test_a_scenario_miss_that_differs_is_judged_against_the_schedule_control():
    matched = decide_scenario_request(BASE, Request(OTHER, 0), None, True, asked=16)
    assert (matched.verdict, matched.finding, matched.cls) == (FAIL, NO_HIT_DIFFERS, None)
    assert (
        "the scenario's cache-off run gave the baseline's tokens here: not the schedule's numerics"
        in matched.reasons[0]
    )
    schedule = decide_scenario_request(BASE, Request(OTHER, 0), None, False, asked=16)  # the control differs too
    assert (schedule.verdict, schedule.finding, schedule.cls) == (INCONCLUSIVE, None, SCHEDULE_NUMERICS)
    unknown = decide_scenario_request(BASE, Request(OTHER, 0), None, None, asked=16)  # the control failed
    assert (unknown.verdict, unknown.finding) == (INCONCLUSIVE, None)
    same = decide_scenario_request(BASE, Request(BASE, 0), None, True, asked=16)
    assert (same.verdict, same.finding) == (PASS, None)


# ---- what the KV audit reads of its blocks


def _raw(kind: str, identical: bool, source_probe: str | None = None) -> dict:
    """A comparison's figures for one request of 2 blocks x 1 layer (repro.engine.kvcompare's shape)."""
    plane = {"identical": [[identical, identical]], "max_abs": [[0.0 if identical else 1.0] * 2],
             "rel": [[0.0 if identical else 0.9] * 2]}  # fmt: skip
    matches = []
    if source_probe is not None:
        matches = [{"layer": 0, "plane": p, "block": b, "source": f"probe {source_probe} block {b}",
                    "probe": source_probe, "src_block": b, "src_plane": p, "rel": 0.0}
                   for p in ("K", "V") for b in (0, 1)]  # fmt: skip
    return {"kind": kind, "num_blocks": 2, "layers": 1, "planes": {"K": plane, "V": plane}, "matches": matches,
            "error": None}  # fmt: skip


def _record(seq: int, reused: int, computed: int) -> dict:
    return {"seq": seq, "reused_blocks": reused, "computed_blocks": computed, "layers": [0], "block_size": 16,
            "local_tokens": 0, "external_tokens": 0}  # fmt: skip


def _req(role: str, cached: int, tokens, record: dict) -> RequestResult:
    return RequestResult(role, cached, tuple(tokens), (), "length", None, None, kv_audit_record=record)


def _arms() -> tuple[ArmResult, ArmResult]:
    config = {"model": "m", "revision": None, "dtype": "float32", "block_size": 16, "max_model_len": 2048,
              "seed": 0, "enforce_eager": True}  # fmt: skip
    base = ArmResult("baseline", (ProbeResult("p", PROMPT, None, (_req("cold", 0, BASE, _record(0, 0, 18)),)),),
                     effective_config=config, versions={}, fixture_sha256="x", kv_audit={"dir": "b"})  # fmt: skip
    reqs = (_req("cold", 0, BASE, _record(0, 0, 18)), _req("reuse", 0, OTHER, _record(1, 0, 18)))
    arm = ArmResult("Conn", (ProbeResult("p", PROMPT, None, reqs),), effective_config=config, versions={},
                    fixture_sha256="x", kv_audit={"dir": "c"})  # fmt: skip
    return base, arm


def test_the_audit_compares_a_no_hit_reuses_own_blocks_and_names_foreign_kv_in_them():
    base, arm = _arms()
    job = kvaudit.compare_job(base, {"Conn": arm})
    assert [(r["index"], r["kind"]) for r in job["arms"][0]["requests"]] == [(0, "computed"), (1, "computed")]
    entries, verdict = judge_arm(arm, base, "connector", 16, max_tokens=16)
    assert verdict.verdict == FAIL and entries[0]["finding"] == NO_HIT_DIFFERS
    raw = {"arms": {"Conn": {"p": {"0": _raw("computed", True), "1": _raw("computed", False, "q")}}}}
    kvaudit.annotate([{"name": "Conn", "mode": "connector", "probes": entries}], {"Conn": arm}, raw, None, 16)
    probe = entries[0]
    assert probe["kv"]["verdict"] == FOREIGN  # its blocks hold another prompt's KV: a load it did not count
    audit = probe["requests"][1]["kv_audit"]
    assert audit["status"] == "audited" and audit["origin"] is None and audit["reason"] == kvaudit.COMPUTED_NOTE
    raw_own = {"arms": {"Conn": {"p": {"0": _raw("computed", True), "1": _raw("computed", True)}}}}
    kvaudit.annotate([{"name": "Conn", "mode": "connector", "probes": entries}], {"Conn": arm}, raw_own, None, 16)
    assert entries[0]["kv"]["verdict"] == EXACT  # its own prefill's KV: the engine loaded nothing it did not count


def test_a_reuse_with_the_baselines_answer_and_no_hit_is_not_compared():
    base, arm = _arms()
    same = ArmResult("Conn", (ProbeResult("p", PROMPT, None, (arm.probes[0].requests[0], _req("reuse", 0, BASE,
                     _record(1, 0, 18)))),), effective_config=arm.effective_config, versions={}, fixture_sha256="x",
                     kv_audit={"dir": "c"})  # fmt: skip
    assert [r["index"] for r in kvaudit.compare_job(base, {"Conn": same})["arms"][0]["requests"]] == [0]


def test_a_scenario_no_hit_miss_is_kept_out_of_the_floor_and_its_blocks_classed():
    base, _ = _arms()
    reqs = (StepRequest(0, "p", _req("cold", 0, BASE, _record(0, 0, 18))),
            StepRequest(1, "p", _req("cold", 0, OTHER, _record(1, 0, 18))))  # fmt: skip
    result = ArmResult("Conn~scenario.s", base.probes, effective_config=base.effective_config, versions={},
                       fixture_sha256="x", kv_audit={"dir": "c"}, scenario=ScenarioResult("s", reqs, 0, "x"))  # fmt: skip
    judged = [decide_scenario_request(BASE, Request(BASE, 0), None, True, asked=16),
              decide_scenario_request(BASE, Request(OTHER, 0), None, True, asked=16)]  # fmt: skip
    entry = {"requests": [{"step": k, "probe": "p", "role": v.role, "verdict": v.verdict, "finding": v.finding,
                           "kv": None} for k, v in enumerate(judged)]}  # fmt: skip
    raw = {"arms": {"Conn~scenario.s": {"p": {"0": _raw("computed", True), "1": _raw("computed", False)}}}}
    annotate_kv(entry, result, raw, None, 16)
    assert entry["requests"][0]["kv"] is None  # a miss that matched: the floor, never classed
    own = entry["requests"][1]["kv"]
    assert own["verdict"] == CORRUPT and own["reasons"][0] == kvaudit.COMPUTED_NOTE and own["origin"] is None
    assert entry["kv"]["floor"]["rel"] == 0.0  # measured on the matching miss alone: the unowned one is no floor
    assert entry["kv"]["verdict"] == CORRUPT


# ---- the exit rule and the views


def _report(stated: bool, kv: bool = False) -> dict:
    base, arm = _arms()
    entries = []
    for res, mode, b in ((base, "baseline", None), (arm, "connector", base)):
        probes, v = judge_arm(res, b, mode, 16, max_tokens=16)
        entries.append({"name": res.arm, "mode": mode, "connector": None, "verdict": v.verdict,
                        "reasons": list(v.reasons), "error": None, "log": "x.log", "probes": probes})  # fmt: skip
    acc = check_acceptance(entries, {"Conn": {"p": FAIL}} if stated else {}, "acceptance" if stated else None)
    return {"kind": "kvkit-report", "schema_version": 3, "complete": True, "errors": [], "arms": entries,
            "acceptance": acc, "generations": 3, "config": {"block_size": 16, "kv_audit": kv}, "warnings": [],
            "provenance": {"argv": [], "started_utc": "2026-12-05T00:00:00Z"}}  # fmt: skip


def test_it_exits_1_by_name_even_where_the_fixture_states_the_fail():
    for stated in (False, True):
        report = _report(stated)
        assert report["acceptance"]["matched"] is (True if stated else None)
        assert exit_reason(report) == (EXIT_MISMATCH, "differs with no reported hit: Conn p")
        text = headline(report)
        assert (
            "Conn" in text and "reported no cache hit yet answered differently (differs with no reported hit)" in text
        )
        summary = format_summary(report)
        (line,) = [x for x in summary.splitlines() if x.startswith("Conn") and ": FAIL" in x]
        assert (
            line.endswith("FAIL (decisive: 1) · differs with no reported hit on p")
            or "differs with no reported hit on p" in line
        )
        assert "PASS" not in line and "matched" not in line
