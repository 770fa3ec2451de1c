"""The detection study's scenario columns: the pure cell logic (caught, missed, not exercised) on hand-made
requests, the plan's rows and columns, the page, and the command's flags. No engine: the study itself is
`make detection-scenarios` (its committed report is checked below)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from conftest import ROOT, have_vllm
from e2e_runs import shared_run
from kvkit_testutil import committed_or_skip

from repro.detection import scenarios as study
from repro.detection.commands import detection
from repro.detection.scenario_cells import (
    CAUGHT,
    INCONCLUSIVE,
    MISSED,
    NOT_EXERCISED,
    control_cell,
    fault_cell,
    held,
    loads_of,
    plain_records,
    scenario_records,
)
from repro.detection.scenario_page import render_page
from repro.errors import UsageError
from repro.judge.scenario_verdict import SCHEDULE_NUMERICS
from repro.judge.verdict import CORRUPT, EXACT, FAIL, FOREIGN, MISPLACED, PASS
from repro.judge.verdict import INCONCLUSIVE as V_INCONCLUSIVE


def pf(loaded: int, faulted: list[int], gate: dict | None = None, **extra) -> dict:
    """A request's kv_transfer_params as the planted connector reports them."""
    report = {"loaded_tokens": loaded, "fault": "zero_blocks", "faulted_blocks": faulted, **extra}
    if gate is not None:
        report["gate"] = gate
    return {"planted_fault": report}


# as the connector writes them: each gate's figures, and `apply` (every gate of the load agreed)
IN_FLIGHT_SHUT = {
    "apply": False,
    "in_flight": {"scheduled": 1, "unfinished": 1, "in_flight": 1, "min": 2, "open": False},
}
IN_FLIGHT_OPEN = {"apply": True, "in_flight": {"scheduled": 5, "unfinished": 5, "in_flight": 5, "min": 2, "open": True}}


def request(step, probe, role, verdict, first_diff=None, params=None, cls=None, kv=None) -> dict:
    """One request of a (scenario, arm) entry, shaped as repro.run.scenarios.judge_run writes it."""
    return {
        "step": step,
        "probe": probe,
        "role": role,
        "verdict": verdict,
        "first_diff": first_diff,
        "class": cls,
        "kv": None if kv is None else {"verdict": kv},
        "kv_transfer_params": params,
    }


def test_a_gate_that_never_opened_is_not_exercised_not_missed():
    # plain probes under the in_flight gate: every reuse hit, none changed a token, no load faulted
    entry = {"requests": [request(1, "alpha", "reuse", PASS, params=pf(384, [], IN_FLIGHT_SHUT), kv=EXACT)]}
    cell = fault_cell(scenario_records(entry), "miss")
    assert (cell["status"], cell["gate_opened"], cell["loads"], cell["faulted_requests"]) == (NOT_EXERCISED, 0, 1, 0)
    assert cell["held"] is True
    # the same requests under a hypothesis of a catch: a column that never planted the fault did not catch it
    assert fault_cell(scenario_records(entry), "catch")["held"] is False


def test_a_fault_planted_and_no_token_changed_is_missed():
    entry = {"requests": [request(1, "alpha", "reuse", PASS, params=pf(384, [0], IN_FLIGHT_OPEN), kv=CORRUPT)]}
    cell = fault_cell(scenario_records(entry), "catch")
    assert (cell["status"], cell["gate_opened"], cell["faulted_requests"]) == (MISSED, 1, 1)
    assert cell["caught_by_window"] == {"8": 0, "16": 0, "32": 0}
    assert cell["kv_corrupt"] == 1  # the audit still sees it
    assert cell["held"] is False


def test_a_faulted_request_that_fails_is_caught_per_window():
    reqs = [
        request(0, "alpha", "miss", PASS, params=pf(0, [])),
        request(1, "alpha", "reuse", FAIL, first_diff=12, params=pf(384, [0], IN_FLIGHT_OPEN), kv=CORRUPT),
        request(1, "bravo", "reuse", PASS, params=pf(416, [0], IN_FLIGHT_OPEN), kv=CORRUPT),
    ]
    cell = fault_cell(scenario_records({"requests": reqs}), "catch")
    assert cell["status"] == CAUGHT and cell["held"] is True
    assert (cell["faulted_requests"], cell["gate_opened"]) == (2, 2)
    assert cell["caught_by_window"] == {"8": 0, "16": 1, "32": 1}
    assert cell["kv_corrupt"] == 2 and cell["unplanted_fails"] == []


def test_schedule_numerics_is_never_caught():
    # the control diverged at the same request: repro.judge.scenario_verdict classes it schedule-numerics (INCONCLUSIVE)
    reqs = [request(1, "alpha", "reuse", V_INCONCLUSIVE, 3, pf(384, [0], IN_FLIGHT_OPEN), SCHEDULE_NUMERICS)]
    cell = fault_cell(scenario_records({"requests": reqs}), "catch")
    assert cell["status"] == INCONCLUSIVE and cell["held"] is None
    assert cell["schedule_numerics"] == ["step 1 alpha"] and cell["faulted_requests"] == 0


def test_a_preemption_the_engine_never_made_is_inconclusive():
    reqs = [request(1, "alpha", "reuse", FAIL, 0, pf(384, [0]))]
    cell = fault_cell(scenario_records({"requests": reqs}), "catch", preemption_missing=True)
    assert cell["status"] == INCONCLUSIVE and cell["held"] is None


def test_resumed_loads_count_every_load_and_their_gates():
    params = pf(
        384,
        [0],
        IN_FLIGHT_SHUT,
        loads=[
            {"loaded_tokens": 384, "faulted_blocks": [], "resumed": False, "gate": IN_FLIGHT_SHUT},
            {"loaded_tokens": 384, "faulted_blocks": [0], "resumed": True, "gate": IN_FLIGHT_OPEN},
        ],
    )
    loads = loads_of(params)
    assert [(x["opened"], x["faulted"], x["resumed"]) for x in loads] == [(False, False, False), (True, True, True)]
    cell = fault_cell(scenario_records({"requests": [request(1, "alpha", "reuse", FAIL, 5, params)]}), "catch")
    assert (cell["gate_opened"], cell["loads"], cell["resumed_loads"], cell["status"]) == (1, 2, 1, CAUGHT)


def test_an_ungated_load_is_open_and_no_load_is_none():
    assert loads_of(pf(384, [0]))[0]["opened"] is True
    assert loads_of(pf(0, [])) == [] and loads_of(None) == []


def test_a_fail_with_no_fault_planted_is_named_not_caught():
    reqs = [request(1, "alpha", "reuse", FAIL, 2, pf(384, [], IN_FLIGHT_SHUT))]
    cell = fault_cell(scenario_records({"requests": reqs}), "miss")
    assert cell["status"] == NOT_EXERCISED and cell["unplanted_fails"] == ["step 1 alpha"]


def test_held_reads_the_hypothesis():
    assert held("likely catch", CAUGHT) and held("miss", MISSED) and held("miss", NOT_EXERCISED)
    assert held("catch", MISSED) is False and held("miss", CAUGHT) is False
    assert held("catch", "error") is None


def test_plain_records_read_the_matrix_entry_per_reuse():
    entry = {
        "probes": [
            {
                "name": "alpha",
                "verdicts": {"8": PASS, "16": FAIL, "32": FAIL},
                "reuse_first_diffs": [9],
                "reuse_cached_tokens": [384],
                "kv": {"verdict": CORRUPT},
            }
        ]
    }
    result = {"probes": [{"name": "alpha", "requests": [{}, {"kv_transfer_params": pf(384, [0])}]}]}
    recs = plain_records(entry, result)
    assert [(r["label"], r["fail_windows"], r["kv"]) for r in recs] == [("alpha reuse 1", [16, 32], CORRUPT)]
    assert fault_cell(recs, "catch")["caught_by_window"] == {"8": 0, "16": 1, "32": 1}


def test_control_cell_counts_false_positives_apart_from_schedule_numerics():
    reqs = [
        request(1, "alpha", "reuse", FAIL, 4, pf(384, []), kv=CORRUPT),
        request(1, "bravo", "reuse", V_INCONCLUSIVE, 4, pf(416, []), SCHEDULE_NUMERICS),
        request(1, "charlie", "miss", PASS),
    ]
    c = control_cell(scenario_records({"requests": reqs}))
    assert c["false_positives_by_window"] == {"8": 1, "16": 1, "32": 1}
    assert c["false_blames"] == ["step 1 alpha"] and c["schedule_numerics"] == ["step 1 bravo"]
    assert c["hits"] == 2


def test_the_plan_rows_columns_and_hypothesis():
    assert study.COLUMNS == ("plain", "a-b-a", "eviction", "preemption", "in-flight", "production-load")
    assert [name for name, _, _ in study.ROWS] == ["always", "in_flight", "after_eviction", "land_elsewhere"]
    assert set(study.HYPOTHESIS) == {name for name, _, _ in study.ROWS}
    assert all(set(h) == set(study.COLUMNS) for h in study.HYPOTHESIS.values())
    # the always row is today's zero_blocks head arm; the gates only add `when`
    assert study.row_params("always") == {"num_blocks": 1, "first_block": 0}
    # the load-only fault, gated as the load fixture gates it; only production load is expected to catch it
    assert (study.row_fault("land_elsewhere"), study.row_params("land_elsewhere")) == (
        "land_elsewhere",
        {"when": "in_flight", "in_flight_min": 16},
    )
    assert [c for c, h in study.HYPOTHESIS["land_elsewhere"].items() if h != "miss"] == ["production-load"]
    assert study.row_params("after_eviction")["local_capacity_blocks"] == study.LOCAL_CAPACITY_BLOCKS
    # N: at least the longest reused study prompt's full blocks, fewer than A + B (alpha, bravo)
    blocks = {name: length // 16 for name, length in study.plan.PROMPTS}
    assert max(blocks.values()) <= study.LOCAL_CAPACITY_BLOCKS < blocks["alpha"] + blocks["bravo"]
    # together-steps stay under the 2048-token batch budget (the connector stores only a first chunk)
    assert sum(length for _, length in study.plan.PROMPTS) < 2048


def test_the_scenario_jobs_are_the_verifiers_over_the_studys_engine(tmp_path):
    from repro.run import scenarios as machinery

    model = str(tmp_path)
    engine = study.plan.engine_config(model)
    sc = {s.name: s for s in study.SCENARIOS}["preemption"]
    runs, skipped = machinery.runs_of(sc, study.planned_arms(tmp_path, sc.name))
    assert skipped == {} and runs[0][1].name == "baseline~scenario.preemption"
    job = study.job_for(runs[1][1], sc, engine, None)
    assert (job.engine.kv_cache_tokens, job.engine.max_num_seqs, job.max_tokens) == (2048, 5, 32)
    plain = dict(study.plain_jobs(tmp_path, model))
    # the same prompt as the plain column's arm, token for token (so both compare with one baseline)
    assert plain["always"].probes[1].prompt == job.probes[0].prompt
    assert plain["always"].engine == replace(job.engine, kv_cache_tokens=None, max_num_seqs=None)


def _report() -> dict:
    def cell(row, column, status, hypothesis, k=0, n=0, m=0):
        return {
            "row": row,
            "column": column,
            "status": status,
            "hypothesis": hypothesis,
            "held": held(hypothesis, status),
            "faulted_requests": n,
            "caught_by_window": {"8": k, "16": k, "32": k},
            "gate_opened": m,
            "loads": m,
            "resumed_loads": 0,
            "kv_corrupt": n,
            "schedule_numerics": [],
            "unplanted_fails": [],
            "first_diffs": [],
            "error": None,
            "arm": None,
        }

    ctl = {"status": "ok", "requests": 5, "hits": 5, "false_positives_by_window": {"8": 0, "16": 0, "32": 0},
           "false_blames": [], "kv_audited": 5, "schedule_numerics": [], "error": None}  # fmt: skip
    return {
        "kind": study.KIND,
        "schema_version": study.SCHEMA_VERSION,
        "tool_version": "0",
        "method": "m",
        "config": {
            "windows": [8, 16, 32],
            "columns": [{"column": "plain", "description": "p"}, {"column": "in-flight", "description": "f"}],
            "rows": [{"row": "in_flight", "plants": "x", "params": {"when": "in_flight"}}],
            "controls": ["native"],
        },
        "cells": [
            cell("in_flight", "plain", NOT_EXERCISED, "miss"),
            cell("in_flight", "in-flight", MISSED, "catch", 0, 5, 5),
        ],
        "controls": [dict(ctl, arm="native", column="plain"), dict(ctl, arm="native", column="in-flight")],
        "schedule_controls": {"in-flight": {"status": "ok", "preemptions": 0, "differs_from_plain": []}},
        "diagnostics": {"wall_s": 1.0},
        "provenance": {"kit": {"commit": "abc", "dirty": False}, "started_utc": "t"},
    }


def test_the_page_keeps_not_exercised_apart_from_missed():
    html = render_page(_report())
    assert '<td class="absent"><b>not exercised</b><br><span class="mono">not exercised · gate opened 0</span>' in html
    assert '<td class="missed"><b>missed</b><br><span class="mono">caught 0/5 · gate opened 5</span>' in html
    assert "expected miss: held" in html and "expected catch: did not hold" in html
    assert 'held in\n<span class="bad">1 of 2</span>' in html


def test_misplaced_and_foreign_kv_are_counted_by_class_and_a_controls_false_blames():
    """A faulted request whose KV is MISPLACED is counted apart from CORRUPT; a no-fault arm's FOREIGN is a false
    blame that names its class; the page says both, and what a false blame now is."""
    reqs = [
        request(1, "alpha", "reuse", FAIL, first_diff=3, params=pf(384, [0], IN_FLIGHT_OPEN), kv=MISPLACED),
        request(1, "bravo", "reuse", PASS, params=pf(416, [0], IN_FLIGHT_OPEN), kv=CORRUPT),
    ]
    cell = fault_cell(scenario_records({"requests": reqs}), "catch")
    assert (cell["kv_corrupt"], cell["kv_misplaced"], cell["kv_foreign"]) == (1, 1, 0)
    ctl = control_cell(
        scenario_records({"requests": [request(1, "alpha", "reuse", PASS, None, pf(384, []), kv=FOREIGN)]})
    )
    assert ctl["false_blames"] == ["step 1 alpha (FOREIGN)"] and ctl["kv_foreign"] == 1
    report = _report()
    report["cells"][1].update(kv_misplaced=2, kv_corrupt=3)
    report["controls"][1].update(false_blames=["step 1 alpha (FOREIGN)"], kv_foreign=1)
    html = render_page(report)
    assert "KV CORRUPT 3/5 · KV MISPLACED 2/5" in html and "false blames 1" in html
    assert "every KV finding (CORRUPT, FOREIGN or MISPLACED) a false blame" in html
    assert "every KV CORRUPT a false blame" in render_page(_report())  # as before, without those classes


@pytest.mark.parametrize("extra", [["--model", "smollm2"], ["--seeds", "1"], ["--faults", "stale"]])
def test_scenarios_refuses_the_matrix_flags(extra):
    with pytest.raises(UsageError, match="--scenarios runs its own rows"):
        detection(["--scenarios", *extra])


COMMITTED = ROOT / study.DEFAULT_REPORT


@pytest.mark.skipif(not COMMITTED.exists(), reason="no committed detection-scenarios report in this tree")
def test_the_committed_report_renders_and_its_cells_follow_from_their_requests():
    report = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert report["provenance"]["kit"]["dirty"] is False
    for c in report["cells"]:
        missing = c["status"] == INCONCLUSIVE and not c["error"]
        again = fault_cell(c["requests"], c["hypothesis"], c["error"], missing, left_out=c.get("records_left_out"))
        assert (again["status"], again["caught_by_window"], again["gate_opened"]) == (
            c["status"],
            c["caught_by_window"],
            c["gate_opened"],
        ), (c["row"], c["column"])
    assert render_page(report) == (ROOT / study.DEFAULT_SITE).read_text(encoding="utf-8")


def _in_flight_column(model: str, tmp) -> tuple:
    """Three engines (about 100 s alone on two cores): the plain baseline, the in-flight scenario's schedule
    control and its in_flight row (the column only once the baseline ran)."""
    import os
    from pathlib import Path

    from repro.detection import plan
    from repro.detection.run import Runner
    from repro.models.tiny import MODEL_SEED
    from repro.run.runner import child_env

    model = str(Path(model).resolve())
    env = child_env(dict(os.environ), hashseed="0", extra={})
    s = study.Study(Runner(work=tmp, env=env, timeout_s=600), plan.engine_config(model))
    base = s.run(plan.baseline_job(tmp, MODEL_SEED, model))
    if base.failure is not None:
        return base, None, None
    sc = {x.name: x for x in study.SCENARIOS}["in-flight"]
    return (base, *study.run_column(s, sc, base.result, only=("in_flight",)))


# one engine at a time: made ahead by the tests' lane (tests/e2e_runs.py), in its thread as the kit runs arms
in_flight_column = shared_run("in_flight_column", _in_flight_column, lane=True)


@pytest.mark.e2e
@pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")
def test_the_in_flight_gate_is_caught_by_the_in_flight_scenario_on_the_real_engine(in_flight_column):
    """Three engines (about 100 s alone on two cores): the plain baseline, the in-flight scenario's schedule
    control and its in_flight row. Run under `flock /tmp/kvkit-e2e.lock`."""
    base, section, results = in_flight_column
    assert base.failure is None
    assert section["control"]["status"] == "ok" and list(results) == ["in_flight~scenario.in-flight"]
    (entry,) = section["arms"]
    cell = fault_cell(scenario_records(entry), "catch")
    assert cell["status"] == CAUGHT and cell["gate_opened"] >= 1 and entry["verdict"] == "FAIL"
    # every load the gate let through had another request in flight with it, as its figures say
    for r in entry["requests"]:
        gate = (r["kv_transfer_params"] or {}).get("planted_fault", {}).get("gate")
        if gate and gate.get("apply"):
            assert gate["in_flight"]["in_flight"] >= 2


def test_the_site_index_links_the_scenario_study(tmp_path):
    """`make site` renders the committed scenario table and lists it beside the detection studies."""
    from repro.publish.catalog import _detection_scenarios, _is_detection_scenarios
    from repro.readmodel.files import kind_of

    path = ROOT / "reports" / "detection" / "detection-scenarios.json"
    committed_or_skip(path)
    assert _is_detection_scenarios(kind_of(path))
    written = {}
    entry = _detection_scenarios(path, tmp_path, lambda p, b: written.setdefault(p.name, b))
    assert (entry.section, entry.title) == ("detection", "detection study × scenarios")
    assert "hypothesis held in 24/24 cells at 32 tokens" in entry.summary
    assert written["detection-scenarios.html"] == path.with_suffix(".html").read_bytes()


def test_a_land_elsewhere_victim_is_faulted_and_its_loader_is_not():
    """land_elsewhere loads every block faithfully: the faulted request is the one whose block another load overwrote
    (overwritten_by), not the loader (landed_in), though neither lists faulted blocks."""
    gate = {"apply": True, "in_flight": {"scheduled": 20, "unfinished": 64, "in_flight": 64, "min": 16, "open": True}}
    victim = pf(32, [], gate, fault="land_elsewhere", overwritten_by="7", overwritten_block=0)
    loader = pf(32, [], gate, fault="land_elsewhere", landed_in="3")
    reqs = [
        request(1, "load-p000-s00", "reuse", FAIL, 4, victim, kv=FOREIGN),
        request(1, "load-p001-s00", "reuse", PASS, None, loader, kv=EXACT),
    ]
    cell = fault_cell(scenario_records({"requests": reqs}), "catch")
    assert (cell["status"], cell["faulted_requests"], cell["gate_opened"], cell["kv_foreign"]) == (CAUGHT, 1, 2, 1)


def _load_section(rows: tuple[str, ...]) -> dict:
    """A production-load section as repro.run.scenarios.section writes one (two requests an arm)."""
    gate = {"apply": True, "in_flight": {"scheduled": 20, "unfinished": 64, "in_flight": 64, "min": 2, "open": True}}

    def reqs(faulted: bool) -> list[dict]:
        out = [request(0, "load-p000-s00", "miss", PASS, params=pf(0, []))]
        out.append(request(1, "load-p000-s00", "reuse", FAIL if faulted else PASS, 3 if faulted else None,
                           pf(32, [0] if faulted else [], gate), kv=CORRUPT if faulted else EXACT))  # fmt: skip
        for r in out:
            r.update(cached_tokens=32 * r["step"], control_cached_tokens=32, cancel=None, reasons=["r"], replays=None)
        return out

    arms = [
        {"arm": a, "mode": "connector", "verdict": FAIL, "reasons": [], "error": None, "kv": {"verdict": CORRUPT},
         "load": {"rounds": []}, "requests": reqs(a != "PlantedFault-none")}
        for a in (*rows, "PlantedFault-none", "native")
    ]  # fmt: skip
    control = {"status": "ok", "error": None, "preemptions": 0, "preemptions_source": "s", "wall_s": 1.0,
               "requests": [{"step": 0, "probe": "load-p000-s00", "matches_plain": True}]}  # fmt: skip
    return {"name": "production-load", "description": "d", "engine": {"kv_cache_tokens": 5120}, "steps": [],
            "load": {"prefixes": 16}, "control": control, "arms": arms}  # fmt: skip


def test_the_production_load_column_keeps_what_decides_its_cells():
    """Its cells keep the records that decide them and count the rest; decided again from what they keep (with the
    counts), they say the same; its section keeps each arm's rates and its requests that are not PASS."""
    from repro.detection.scenario_cells import split_records

    rows = tuple(name for name, _, _ in study.ROWS)
    sec = _load_section(rows)
    empty = {"error": None}
    cells, controls = study.cells_of(
        {r: (empty, None) for r in rows}, {c: (empty, None) for c in study.CONTROLS}, [sec]
    )
    load = [c for c in cells if c["column"] == "production-load"]
    assert len(load) == len(rows) and all(c["status"] == CAUGHT for c in load)
    for c in load:
        assert len(c["requests"]) == 1 and c["records_left_out"]["records"] == 1
        again = fault_cell(c["requests"], c["hypothesis"], left_out=c["records_left_out"])
        assert (again["status"], again["gate_opened"], again["loads"]) == (c["status"], c["gate_opened"], c["loads"])
    assert {c["arm"]: c["requests"] for c in controls if c["column"] == "production-load"} == {
        "PlantedFault-none": 2,
        "native": 2,
    }
    slim = study.load_column.slim(sec)
    assert slim["control"]["requests_total"] == 1 and "requests" not in slim["control"]
    kept = {a["arm"]: [r["step"] for r in a["requests"]] for a in slim["arms"]}
    assert kept["always"] == [1] and kept["PlantedFault-none"] == []
    assert split_records([]) == ([], {"records": 0, "loads": 0, "gate_opened": 0, "resumed_loads": 0})


def test_the_production_load_column_is_the_load_fixtures_scenario():
    """The column re-declares fixtures/scenarios-load-cpu-planted.json's production-load: the same load spec, engine
    settings, prompts and rounds (so the fixture's arithmetic holds for it)."""
    from repro.plan.fixtures import load_fixture

    fixture = load_fixture(ROOT / "fixtures" / "scenarios-load-cpu-planted.json")
    theirs = next(s for s in fixture.scenarios if s.name == "production-load")
    ours = study.load_column.SCENARIO
    assert (ours.load, ours.engine, ours.steps, ours.generated) == (theirs.load, theirs.engine, theirs.steps,
                                                                    theirs.generated)  # fmt: skip
    arm = next(a for a in fixture.arms if a.name == "PlantedFault-land-elsewhere")
    gate = {k: v for k, v in arm.extra_config.items() if k not in ("store_dir", "fault")}
    assert study.row_params("land_elsewhere") == gate
    # 20 requests of 256 tokens (224 + 32 generated) fit the 5120-token pool unshared: over the gate's 16
    assert ours.engine["kv_cache_tokens"] // (ours.load.prompt_tokens + study.plan.MAX_TOKENS) >= 16
