"""The detection study's rows of failures reported as success (repro/detection/catalogue.py, expected.py): their jobs,
controls and expectations, how a row is held to its expectation, and how the summary and page keep them apart from
the detection rows. No engine: the entries are built from fake generations."""

from __future__ import annotations

import pytest

from repro.detection import catalogue, plan
from repro.detection.blame import probe_blame
from repro.detection.expected import check_row, summarize_expectations
from repro.detection.matrix import fault_entry, summarize
from repro.detection.page import page_model, render_page
from repro.judge.verdict import (
    CORRUPT,
    ERROR,
    EXACT,
    FAIL,
    FOREIGN,
    KV_VERDICTS,
    MISPLACED,
    NO_HIT_DIFFERS,
    PASS,
    VERDICTS,
)

BASE = list(range(100, 132))
WINDOW_KEYS = [str(w) for w in plan.WINDOWS]


def test_every_row_is_a_planted_fault_with_a_stated_expectation():
    from repro.engine.connectors.planted_failures import FAILURE_FAULTS  # no vLLM at import: the names only

    assert set(catalogue.FAULTS) == set(FAILURE_FAULTS)
    assert len({(r.fault, r.position) for r in catalogue.ROWS}) == len(catalogue.ROWS)
    for r in catalogue.ROWS:
        exp = r.expectation
        assert exp is not None and exp.why and set(exp.verdict) <= set(VERDICTS), r
        assert exp.kv is None or set(exp.kv) <= set(KV_VERDICTS), r
        assert exp.blame in ("exact", "reported", "unavailable", None), r
    assert set(catalogue.FAULTS).isdisjoint(plan.FAULT_PARAMS)  # the detection rows' plan is untouched
    assert plan.study_faults() == (*plan.FAULT_PARAMS, *catalogue.FAULTS)


def test_each_row_runs_with_its_own_settings_and_pool(tmp_path):
    fresh = plan.fault_job(tmp_path, "dropped_load", "fresh", "/m")
    recycled = plan.fault_job(tmp_path, "dropped_load", "recycled", "/m")
    assert fresh.engine.kv_cache_tokens is None and fresh.engine.gpu_memory_utilization == 0.1
    assert recycled.engine.kv_cache_tokens == catalogue.RECYCLED_POOL_TOKENS == recycled.engine.max_model_len
    assert recycled.arm.name == "dropped_load-recycled" and recycled.kv_audit_dir == str(
        tmp_path / "kv" / recycled.arm.name
    )
    fail = plan.fault_job(tmp_path, "load_error", "policy-fail", "/m").arm.connector.extra_config
    recompute = plan.fault_job(tmp_path, "load_error", "policy-recompute", "/m").arm.connector.extra_config
    assert (fail["load_failure_policy"], recompute["load_failure_policy"]) == ("fail", "recompute")
    assert fail["first_block"] == -4 and fail["num_blocks"] == 4
    store = plan.fault_job(tmp_path, "failed_store", "tail", "/m").arm.connector.extra_config
    assert store["fault"] == "failed_store" and store["first_block"] == -16 and "stored_layers" not in store
    assert plan.positions_of("load_error") == {"policy-fail": None, "policy-recompute": None}
    assert [p.name for p in fresh.probes] == ["decoy", *(n for n, _ in plan.PROMPTS)]


def test_the_after_another_rows_send_another_prompt_between_each_cold_request_and_its_reuse(tmp_path):
    """failed_store/tail-after-another and late_load/whole-after-another keep the settings of the rows whose premise
    the engine refuted and send a prompt between: one per probe (none ever a reuse itself), each longer than every
    probe (it takes every block the cold request freed), never one of the study's prompts; the baseline runs them
    only where such a row runs, so the KV audit can name what a reuse read."""
    from repro.contract.job import Job

    tail = plan.fault_job(tmp_path, "failed_store", "tail", "/m")
    after = plan.fault_job(tmp_path, "failed_store", "tail-after-another", "/m")
    assert after.arm.connector.extra_config | {"store_dir": 0, "audit_path": 0} == (
        tail.arm.connector.extra_config | {"store_dir": 0, "audit_path": 0})  # fmt: skip
    assert all(p.between is None for p in tail.probes)
    late = plan.fault_job(tmp_path, "late_load", "whole-after-another", "/m")
    assert late.arm.connector.extra_config["fault"] == "late_load"
    study = {n for n, _ in plan.PROMPTS} | {plan.DECOY[0]}
    for job in (after, late):
        decoy, *probes = job.probes
        assert decoy.between is None  # stored, never reused: nothing to send between
        sent = [p.between["chat"] for p in probes]
        assert [p.between for p in probes] == [plan.between_prompt(p.name) for p in probes]
        assert len({plan.BETWEEN[p.name][0] for p in probes}) == len(probes)
        assert {plan.BETWEEN[p.name][0] for p in probes}.isdisjoint(study)
        assert all(plan.BETWEEN[p.name][1] > max(n for _, n in plan.PROMPTS) for p in probes) and len(sent) == 5
        assert Job.from_json(job.to_json()) == job  # the contract carries it to the child
    names = [p.name for p in plan.baseline_job(tmp_path, 1234, "/m", between=True).probes]
    assert names == ["decoy", *(n for n, _ in plan.PROMPTS), *(plan.BETWEEN[n][0] for n, _ in plan.PROMPTS)]
    assert [p.name for p in plan.baseline_job(tmp_path, 1234, "/m").probes] == ["decoy", *(n for n, _ in plan.PROMPTS)]
    assert plan.needs_between(("late_load",)) and plan.needs_between(("failed_store",))
    assert not plan.needs_between(("dropped_load", "load_error", "unreported_load", "zero_blocks"))
    rows = {(r.fault, r.position): r for r in catalogue.ROWS}
    assert [k for k, r in rows.items() if r.between] == [
        ("failed_store", "tail-after-another"), ("late_load", "whole-after-another")]  # fmt: skip


def test_a_probe_job_says_clearly_when_its_between_prompt_is_malformed():
    from repro.contract.failure import ContractError
    from repro.contract.job import ProbeJob

    good = {"name": "a", "prompt": {"token_ids": [1, 2]}, "requests": 2, "between": {"token_ids": [3, 4]}}
    assert ProbeJob.from_json(good).between == {"token_ids": [3, 4]}
    assert ProbeJob.from_json(good).to_json() == good
    for bad, said in (({"token_ids": [3], "chat": {}}, "exactly one"), ({}, "exactly one"), ([3, 4], "wrong type")):
        with pytest.raises(ContractError, match=said):
            ProbeJob.from_json(good | {"between": bad})


def test_late_load_brings_the_asynchronous_control(tmp_path):
    plain = [name for name, _ in plan.control_jobs(tmp_path, 1, "/m")]
    assert plain == ["ExampleConnector", "native", "PlantedFault-none"]
    with_late = dict(plan.control_jobs(tmp_path, 1, "/m", ("late_load",)))
    extra = with_late["PlantedFault-none-async"].arm.connector.extra_config
    assert extra["fault"] == "none" and extra["async_load"] is True


def _request(tokens: list[int], cached: int | None, report: dict | None, role: str = "reuse") -> dict:
    """One request as an engine result holds it (repro.contract.result.RequestResult's JSON form)."""
    return {
        "role": role,
        "token_ids": tokens,
        "cached_tokens": cached,
        "logprobs": [[[t, -0.1], [0, -4.0]] for t in tokens],
        "kv_transfer_params": None if report is None else {"planted_fault": report},
    }


def _entry(
    fault: str, position: str, reuse: list[int], cached: int, report: dict | None, kv: dict, audit: list | None = None
) -> dict:
    """A catalogue row over one probe (alpha), its cold request matching the baseline, its reuse as given."""
    base = {"probes": [{"name": "alpha", "prompt_token_ids": [1] * 40, "requests": [_request(BASE, 0, None, "cold")]}]}
    probe = {
        "name": "alpha",
        "prompt_token_ids": [1] * 40,
        "requests": [_request(BASE, 0, {"loaded_tokens": 0}, "cold"), _request(reuse, cached, report)],
    }
    entry = fault_entry(fault, position, {}, {"probes": [probe]}, None, base, audit or [])
    entry["expectation"] = catalogue.row(fault, position).to_json()["expectation"]
    planted = [(report or {}).get("faulted_blocks") if report is not None else None]
    entry["probes"][0]["kv"] = probe_blame(kv, planted, FAIL in entry["probes"][0]["verdicts"].values())
    return entry


def _kv(verdict: str, blamed: list[int] | None) -> dict:
    return {"verdict": verdict, "reasons": [], "blame": None, "blamed_blocks": [blamed]}


def _reported(blocks: list[int]) -> dict:
    """The audit of a reuse whose connector reported `blocks` to vLLM as not loaded: read, none blamed."""
    return {"verdict": EXACT, "reasons": [], "blame": None, "blamed_blocks": [[]], "reported_blocks": [blocks]}


DIFFERS = BASE[:3] + [7] * 29


def test_a_row_holds_when_every_probe_shows_the_verdict_kv_and_blame_it_expects():
    report = {"loaded_tokens": 384, "faulted_blocks": list(range(24))}
    held = _entry("dropped_load", "fresh", DIFFERS, 384, report, _kv(CORRUPT, list(range(24))))
    assert check_row(held) == {"held": True, "misses": []}
    under = _entry("dropped_load", "fresh", DIFFERS, 384, report, _kv(CORRUPT, [0, 1]))
    assert check_row(under)["misses"] == ["alpha: blame under, expected exact"]
    unchanged = _entry("dropped_load", "fresh", BASE, 384, report, _kv(CORRUPT, list(range(24))))
    assert check_row(unchanged)["misses"] == ["alpha: PASS at 32 tokens, expected FAIL"]


def test_the_recompute_row_expects_the_baselines_answer_and_the_fail_row_the_requests_error():
    report = {"loaded_tokens": 384, "faulted_blocks": [20, 21, 22, 23], "load_failure_policy": "recompute"}
    recompute = _entry("load_error", "policy-recompute", BASE, 384, report, _reported([20, 21, 22, 23]))
    assert recompute["probes"][0]["verdicts"]["32"] == PASS and check_row(recompute)["held"]
    assert recompute["probes"][0]["kv"]["outcome"] == "reported"
    # the kit before it read the report: the reported blocks blamed (a false finding) no longer holds
    blamed = _entry("load_error", "policy-recompute", BASE, 384, report, _kv(MISPLACED, [20, 21, 22, 23]))
    assert check_row(blamed)["misses"] == [
        "alpha: KV MISPLACED, expected EXACT",
        "alpha: blame exact, expected reported",
    ]
    # vLLM finishes the request with an error: no tokens, and no kv_transfer_params, so no planted blocks
    fail = _entry("load_error", "policy-fail", [], 384, None, _kv(CORRUPT, [20, 21, 22, 23]))
    assert fail["probes"][0]["verdicts"]["32"] == ERROR
    assert fail["probes"][0]["kv"]["outcome"] == "unavailable" and fail["probes"][0]["kv"]["planted_blocks"] == [None]
    assert check_row(fail) == {"held": True, "misses": []}
    passed = _entry("load_error", "policy-fail", BASE, 384, None, _kv(CORRUPT, [20]))
    assert check_row(passed)["misses"] == ["alpha: PASS at 32 tokens, expected ERROR"]  # never PASS


def test_the_unreported_row_expects_the_no_hit_finding_not_inconclusive():
    report = {"loaded_tokens": 0, "faulted_blocks": list(range(24)), "unreported_tokens": 384}
    row = _entry("unreported_load", "prefix", DIFFERS, 0, report, _kv(FOREIGN, list(range(24))))
    probe = row["probes"][0]
    assert probe["verdicts"]["32"] == FAIL and probe["finding"] == NO_HIT_DIFFERS
    assert any("no reported hit" in r for r in probe["reasons"])
    assert check_row(row) == {"held": True, "misses": []}
    same = _entry("unreported_load", "prefix", BASE, 0, report, _kv(FOREIGN, list(range(24))))
    assert check_row(same)["misses"] == ["alpha: INCONCLUSIVE at 32 tokens, expected FAIL"]
    # read before the connector's write (the kit before its audit read at the end of the step): EXACT, nothing blamed
    early = _entry("unreported_load", "prefix", DIFFERS, 0, report, _kv(EXACT, []))
    assert check_row(early)["misses"] == ["alpha: KV EXACT, expected FOREIGN", "alpha: blame under, expected exact"]


def test_catalogue_rows_leave_the_detection_figures_alone_and_decide_ok_through_their_expectations():
    report = {"loaded_tokens": 384, "faulted_blocks": [20, 21, 22, 23], "load_failure_policy": "recompute"}
    held = _entry("load_error", "policy-recompute", BASE, 384, report, _reported([20, 21, 22, 23]))
    missed = _entry("load_error", "policy-recompute", DIFFERS, 384, report, _reported([20, 21, 22, 23]))
    detection_row = {
        "fault": "zero_blocks",
        "position": "head",
        "error": None,
        "windows": {w: {"status": "detected", "detected": 1, "probes": 1} for w in WINDOW_KEYS},
    }
    control = {"arm": "native", "error": None, "reuses_exercised": 2, "false_positives": {w: 0 for w in WINDOW_KEYS}}
    s = summarize([detection_row, held], [control], True)
    assert s["fault_kinds_detected"] == {"zero_blocks": True} and s["ok"]
    assert s["expectations"] == summarize_expectations([held]) and s["expectations"]["held"] == 1
    bad = summarize([detection_row, missed], [control], True)
    assert not bad["ok"] and bad["every_fault_detected"]  # the detection rows still are
    assert bad["expectations"]["by_row"]["load_error/policy-recompute"]["misses"] == [
        "alpha: FAIL at 32 tokens, expected PASS"
    ]
    assert "expectations" not in summarize([detection_row], [control], True)  # an older matrix reads as it did


def test_a_fault_row_pairs_no_load_audit_when_a_failed_request_dropped_its_report():
    """The connector wrote a line for the failed reuse's load, which came back without its report: the line is paired
    with no request (it could be paired with the wrong one); where the counts agree, each load gets its line."""
    line = {"faulted_blocks": [20, 21, 22, 23], "faulted_max_abs_diff": [[20, 1.0]], "clean_max_abs_diff": 0.0}
    entry = _entry("load_error", "policy-fail", [], 384, None, _kv(CORRUPT, [1]), [line])
    assert entry["probes"][0]["kv_audit"] is None
    report = {"loaded_tokens": 384, "faulted_blocks": [20, 21, 22, 23], "load_failure_policy": "recompute"}
    paired = _entry("load_error", "policy-recompute", BASE, 384, report, _kv(CORRUPT, [20]), [line])
    assert paired["probes"][0]["kv_audit"] == line


def _page_report(entries: list[dict]) -> dict:
    control = {
        "arm": "native",
        "model_seed": 1234,
        "error": None,
        "probes": [],
        "reuses_compared": 2,
        "reuses_exercised": 2,
        "false_positives": {w: 0 for w in WINDOW_KEYS},
        "inconclusive": {w: 0 for w in WINDOW_KEYS},
    }
    return {
        "kind": plan.KIND,
        "schema_version": plan.SCHEMA_VERSION,
        "tool_version": "0.1.0",
        "method": "m",
        "config": {"windows": list(plan.WINDOWS), "fault_rows": [r.to_json() for r in catalogue.ROWS]},
        "faults": entries,
        "controls": [control],
        "prefix_check": {"window": 8, "ok": True, "requests_compared": 3},
        "provenance": {"started_utc": "2026-12-05T00:00:00Z", "kit": {"commit": "abcdef0123456789"}},
    }


@pytest.mark.parametrize("reuse, held", [(BASE, "held"), (DIFFERS, "did not hold")])
def test_the_page_shows_each_row_with_its_expectation_and_what_it_measured(reuse, held):
    report = {"loaded_tokens": 384, "faulted_blocks": [20, 21, 22, 23], "load_failure_policy": "recompute"}
    entry = _entry("load_error", "policy-recompute", reuse, 384, report, _reported([20, 21, 22, 23]))
    entry["kv_blame"] = {
        "cell": "detected",
        "probes": 1,
        "blamed_exactly": 1,
        "unavailable": [],
        "tokens_unchanged_blamed_exactly": [],
        "reason": None,
    }
    m = page_model(_page_report([entry]))
    assert m.rows == () and len(m.expected_rows) == 1  # not among the detection rows
    row = m.expected_rows[0]
    assert row.expected == "PASS; KV EXACT; blame reported" and row.held.text == held
    assert row.what.startswith("the same, with kv_load_failure_policy recompute")
    assert row.measured == (f"alpha: {PASS if reuse == BASE else FAIL}, KV EXACT, blame reported, cached tokens 384",)
    assert row.restated.startswith("Before its first run this row expected KV CORRUPT")
    html = render_page(_page_report([entry]))
    assert 'id="reported-success"' in html and "Expectations held:" in html
    assert "Restated after its first run:" in html


def test_the_page_says_which_prompt_each_reuse_came_after():
    report = {"loaded_tokens": 384, "faulted_blocks": [20, 21, 22, 23], "load_failure_policy": "recompute"}
    entry = _entry("load_error", "policy-recompute", BASE, 384, report, _reported([20, 21, 22, 23]))
    entry["between"] = {"alpha": "foxtrot"}
    (row,) = page_model(_page_report([entry])).expected_rows
    assert row.what.endswith("(sent between: alpha's reuse after foxtrot)")


def test_a_matrix_without_catalogue_rows_renders_no_such_section():
    report = _page_report([])
    report["config"].pop("fault_rows")
    assert 'id="reported-success"' not in render_page(report)


def test_the_page_names_the_faulted_blocks_a_load_left_right():
    from repro.detection.page import _unchanged_text

    assert _unchanged_text({"unchanged_blocks": [[13]]}) == " (faulted yet right: block 13, not owed a blame)"
    assert _unchanged_text({"unchanged_blocks": [[3, 9]]}).startswith(" (faulted yet right: blocks 3, 9")
    assert _unchanged_text({}) == _unchanged_text({"unchanged_blocks": [[]]}) == ""
