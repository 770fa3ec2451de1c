"""The detection study: windows and summary over fake generations, jobs, page, commands, the committed matrix."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT

from repro.commands import run_command
from repro.contract.result import ArmResult
from repro.detection import catalogue, plan
from repro.detection.commands import detection, detection_site
from repro.detection.matrix import (
    Cell,
    compare_error,
    control_entry,
    false_positives_by_window,
    fault_entry,
    prefix_check,
    replay_tally,
    summarize,
    summarize_cell,
    window_verdicts,
)
from repro.detection.page import load_matrix, page_model, render_page
from repro.errors import UsageError
from repro.judge.verdict import FAIL, INCONCLUSIVE, PASS, Request
from repro.models.tiny import MODEL_SEED

COMMITTED = ROOT / plan.DEFAULT_REPORT
COMMITTED_PAGE = ROOT / plan.DEFAULT_SITE
# The kit archive packs no reports/ subdirectories; in a checkout the committed matrix must be there.
needs_committed = pytest.mark.skipif(
    not COMMITTED.exists() and not (ROOT / ".git").exists(),
    reason="reports/detection/ is not in this tree (the kit does not pack it)",
)
BASE = list(range(100, 132))  # a 32-token baseline generation
WINDOW_KEYS = [str(w) for w in plan.WINDOWS]
CELLS = [(k, p) for k in plan.FAULT_PARAMS for p in plan.positions_of(k)]  # every detection (fault, position) it runs


def _detection_rows(report: dict) -> list[dict]:
    """The matrix's detection rows: not the catalogue's rows of failures reported as success (tested in
    tests/test_detection_catalogue.py), which a matrix made before them does not have."""
    return [f for f in report["faults"] if "expectation" not in f]


def _diverge_at(i: int | None) -> tuple[int, ...]:
    return tuple(BASE) if i is None else tuple(BASE[:i] + [7] * (32 - i))


# ---- windows and cells ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "first_diff, expected",
    [
        (None, {8: PASS, 16: PASS, 32: PASS}),
        (0, {8: FAIL, 16: FAIL, 32: FAIL}),
        (7, {8: FAIL, 16: FAIL, 32: FAIL}),
        (8, {8: PASS, 16: FAIL, 32: FAIL}),  # index 8 is the 9th token: outside an 8-token window
        (15, {8: PASS, 16: FAIL, 32: FAIL}),
        (16, {8: PASS, 16: PASS, 32: FAIL}),
        (31, {8: PASS, 16: PASS, 32: FAIL}),
    ],
)
def test_detected_at_window_iff_first_diff_below_it(first_diff, expected):
    cold = Request(tuple(BASE), 0)
    assert window_verdicts(BASE, cold, [Request(_diverge_at(first_diff), 384)]) == expected


def test_unexercised_reuse_is_inconclusive_never_a_miss_or_detection():
    """A reuse whose counter is missing proves nothing; one that reports 0 cached tokens and matches the baseline
    exercised nothing. One that reports 0 and differs while its cold request matched is the verifier's no-hit FAIL
    (repro.judge.verdict.NO_HIT_DIFFERS), inside the window that shows the difference."""
    cold = Request(tuple(BASE), 0)
    assert set(window_verdicts(BASE, cold, [Request(_diverge_at(3), None)]).values()) == {INCONCLUSIVE}
    assert set(window_verdicts(BASE, cold, [Request(tuple(BASE), 0)]).values()) == {INCONCLUSIVE}
    assert window_verdicts(BASE, cold, [Request(_diverge_at(3), 0)]) == {8: FAIL, 16: FAIL, 32: FAIL}
    assert window_verdicts(BASE, cold, [Request(_diverge_at(20), 0)]) == {8: INCONCLUSIVE, 16: INCONCLUSIVE, 32: FAIL}


def test_cold_divergence_inside_the_window_makes_it_inconclusive():
    verdicts = window_verdicts(BASE, Request(_diverge_at(12), 0), [Request(_diverge_at(12), 384)])
    assert verdicts == {8: PASS, 16: INCONCLUSIVE, 32: INCONCLUSIVE}


def test_verdicts_are_not_monotonic_across_windows():
    """A reuse that diverges at 5 FAILs at 8 tokens; the cold request diverging at 12 makes 16 and 32 INCONCLUSIVE."""
    verdicts = window_verdicts(BASE, Request(_diverge_at(12), 0), [Request(_diverge_at(5), 384)])
    assert verdicts == {8: FAIL, 16: INCONCLUSIVE, 32: INCONCLUSIVE}


def test_cells():
    assert summarize_cell([FAIL, FAIL]) == Cell("detected", 2, 2)
    assert summarize_cell([FAIL, PASS]) == Cell("partial", 1, 2)
    assert summarize_cell([PASS, PASS]) == Cell("missed", 0, 2)
    assert summarize_cell([PASS, INCONCLUSIVE]) == Cell("inconclusive", 0, 2)
    assert summarize_cell([FAIL, "ERROR"]) == Cell("error", 1, 2)
    assert summarize_cell([]).status == "error"


# ---- the summary ------------------------------------------------------------------------------


def _fault(kind: str, statuses: list[str]) -> dict:
    n = {"detected": 2, "partial": 1, "missed": 0, "inconclusive": 0}
    return {
        "fault": kind,
        "position": "head",
        "error": None,
        "windows": {w: {"status": s, "detected": n[s], "probes": 2} for w, s in zip(WINDOW_KEYS, statuses)},
    }


def _control(fp: int | dict[str, int], exercised: int = 4) -> dict:
    counts = fp if isinstance(fp, dict) else {w: fp for w in WINDOW_KEYS}
    return {"arm": "native", "error": None, "reuses_exercised": exercised, "false_positives": counts}


def test_summary_needs_every_kind_detected_zero_false_positives_and_exercised_controls():
    ok = summarize([_fault("a", ["missed", "partial", "detected"]), _fault("b", ["detected"] * 3)], [_control(0)], True)
    assert ok["ok"] and ok["every_fault_detected"]
    assert ok["not_fully_detected_cells"] == ["a/head@8:missed", "a/head@16:partial"]
    assert ok["false_positives"] == 0 and ok["false_positives_by_window"] == {"8": 0, "16": 0, "32": 0}
    assert ok["control_reuses_exercised"] == 4 and ok["arm_errors"] == []
    partial = summarize([_fault("a", ["missed", "partial", "partial"])], [_control(0)], True)
    assert partial["ok"] and not partial["every_fault_reliably_detected"]  # one diverging probe fails the arm
    assert not summarize([_fault("a", ["missed", "missed", "inconclusive"])], [_control(0)], True)["ok"]
    assert not summarize([_fault("a", ["detected"] * 3)], [_control(1)], True)["ok"]
    assert not summarize([_fault("a", ["detected"] * 3)], [_control(0, exercised=0)], True)["ok"]
    assert not summarize([_fault("a", ["detected"] * 3)], [_control(0)], False)["ok"]
    assert not summarize([], [_control(0)], True)["ok"]  # no fault ran: nothing was shown to be detected


def test_a_false_positive_at_the_smallest_window_only_fails_the_study():
    """Bug e: false positives were counted at the largest window only; a FAIL at 8 tokens that is INCONCLUSIVE at
    16 and 32 (test_verdicts_are_not_monotonic_across_windows) went uncounted and the study said ok."""
    controls = [_control(0), dict(_control({"8": 1, "16": 0, "32": 0}), arm="ExampleConnector")]
    s = summarize([_fault("a", ["detected"] * 3)], controls, True)
    assert not s["ok"]
    assert s["false_positives"] == 1
    assert s["false_positives_by_window"] == {"8": 1, "16": 0, "32": 0}


def _request(tokens: tuple[int, ...], cached: int, role: str = "reuse") -> dict:
    """One request as an engine result holds it (repro.contract.result.RequestResult's JSON form)."""
    return {
        "role": role,
        "token_ids": list(tokens),
        "cached_tokens": cached,
        "logprobs": [[[t, -0.5], [0, -3.0]] for t in tokens],
    }


def test_a_control_arm_failing_at_8_tokens_only_is_counted_and_fails_the_study():
    """The same, end to end from engine results: the reuse diverges at 5, the cold request at 12."""
    prompt = list(range(40))
    baseline = {"probes": [{"name": "p", "prompt_token_ids": prompt, "requests": [_request(tuple(BASE), 0, "cold")]}]}
    requests = [_request(_diverge_at(12), 0, "cold"), _request(_diverge_at(5), 32)]
    result = {"probes": [{"name": "p", "prompt_token_ids": prompt, "requests": requests}]}
    entry = control_entry("native", MODEL_SEED, result, None, baseline)
    assert entry["false_positives"] == {"8": 1, "16": 0, "32": 0}
    assert entry["inconclusive"] == {"8": 0, "16": 1, "32": 1}
    assert entry["reuses_compared"] == entry["reuses_exercised"] == 1
    assert not summarize([_fault("a", ["detected"] * 3)], [entry], True)["ok"]
    assert false_positives_by_window([entry]) == {"8": 1, "16": 0, "32": 0}


def test_false_positives_by_window_sums_every_control_in_window_order():
    controls = [_control({"32": 1, "8": 2, "16": 0}), _control({"16": 3, "8": 0, "32": 0})]
    assert list(false_positives_by_window(controls).items()) == [("8", 2), ("16", 3), ("32", 1)]


def test_compare_error_reads_the_results_json_form():
    """The matrix keeps results as JSON; the verifier's comparability check reads typed results (it raised
    AttributeError on a dict once repro.contract typed them)."""
    base = ArmResult(arm="baseline", effective_config={"dtype": "float32"}).to_json()
    same = ArmResult(arm="native", effective_config={"dtype": "float32"}).to_json()
    other = ArmResult(arm="native", effective_config={"dtype": "float16"}).to_json()
    assert compare_error(base, same, None) is None
    error = compare_error(base, other, None)
    assert error["kind"] == "not-comparable" and "dtype differs" in error["detail"]
    assert compare_error(None, same, None)["kind"] == "no-baseline"


def _run(tokens: list[list[int]]) -> dict:
    return {
        "probes": [
            {
                "name": "p",
                "requests": [{"token_ids": t, "logprobs": [[[x, -0.5], [0, -3.0]] for x in t]} for t in tokens],
            }
        ]
    }


def test_prefix_check():
    full = _run([list(range(32)), list(range(5)) + [9] * 27])
    good = prefix_check(_run([list(range(8)), list(range(5)) + [9] * 3]), full, 8)
    assert good["ok"] and good["requests_compared"] == 2 and good["mismatched"] == []
    bad = prefix_check(_run([list(range(8)), list(range(8))]), full, 8)
    assert not bad["ok"] and bad["mismatched"] == ["p#1"]
    assert not prefix_check(None, full, 8)["ok"]


# ---- the jobs ---------------------------------------------------------------------------------


def test_fault_job_runs_the_decoy_first_then_every_prompt_cold_and_reused(tmp_path):
    job = plan.fault_job(tmp_path, "stale", "tail", "/m")
    assert job.arm.name == "stale-tail" and job.arm.mode == "connector"
    assert job.max_tokens == plan.MAX_TOKENS == 32 and job.logprobs == plan.LOGPROBS
    assert job.engine.model == "/m" and job.engine.block_size == 16 and job.engine.dtype == "float32"
    assert [(p.name, p.requests) for p in job.probes] == [("decoy", 1)] + [(n, 2) for n, _ in plan.PROMPTS]
    assert job.probes[1].prompt == {"chat": plan.prompt_spec("alpha", 389)}
    extra = job.arm.connector.extra_config
    assert extra["fault"] == "stale" and extra["first_block"] == -1 and extra["num_blocks"] == 1
    assert extra["audit_path"] == str(tmp_path / "stale-tail.audit.jsonl")
    assert job.kv_audit_dir == str(tmp_path / "kv" / "stale-tail")
    short = plan.fault_job(tmp_path, "zero_blocks", "head", "/m", plan.PREFIX_CHECK_WINDOW)
    assert short.arm.name == "zero_blocks-head-8tok" and short.max_tokens == 8
    assert short.kv_audit_dir is None  # only its tokens are read


def test_control_and_baseline_jobs(tmp_path):
    base = plan.baseline_job(tmp_path, 1, "/m1")
    assert base.arm.to_json() == {"name": "baseline-seed1", "mode": "baseline", "connector": None}
    assert {p.requests for p in base.probes} == {1}
    assert base.kv_audit_dir == str(tmp_path / "kv" / "baseline-seed1")  # the reference KV
    controls = plan.control_jobs(tmp_path, 1, "/m1")
    assert [job.kv_audit_dir for _, job in controls] == [str(tmp_path / "kv" / job.arm.name) for _, job in controls]
    assert [(name, job.arm.name, job.arm.mode) for name, job in controls] == [
        ("ExampleConnector", "ExampleConnector-seed1", "connector"),
        ("native", "native-seed1", "native"),
        ("PlantedFault-none", "PlantedFault-none-seed1", "connector"),
    ]
    assert all(p.requests == 1 + plan.CONTROL_REUSES for _, job in controls for p in job.probes)
    assert controls[2][1].arm.connector.extra_config["fault"] == "none"


def test_the_fault_model_is_the_kits_model():
    assert plan.CONTROL_MODEL_SEEDS[0] == MODEL_SEED


# ---- the page and the commands ----------------------------------------------------------------


def _fake_report(controls: list[dict] | None = None) -> dict:
    cell = {"status": "detected", "detected": 1, "probes": 1, "first_diffs": [3]}
    control = dict(_control(0), model_seed=1234, reuses_compared=4, inconclusive={w: 0 for w in WINDOW_KEYS})
    return {
        "kind": plan.KIND,
        "schema_version": plan.SCHEMA_VERSION,
        "tool_version": "0.1.0",
        "method": "m <script>",
        "config": {"windows": list(plan.WINDOWS)},
        "faults": [
            {
                "fault": "zero_blocks",
                "position": "head",
                "params": {"num_blocks": 1, "fault": "zero_blocks"},
                "error": None,
                "windows": {w: cell for w in WINDOW_KEYS},
                "probes": [{"kv_audit": {"faulted_max_abs_diff": [[0, 3.5]]}, "margin": {"baseline_margin": 1.25}}],
            }
        ],
        "controls": controls or [control],
        "prefix_check": {"window": 8, "ok": True, "requests_compared": 3},
        "summary": summarize([_fault("zero_blocks", ["detected"] * 3)], [_control(0)], True),
        "provenance": {"started_utc": "2026-11-29T00:00:00Z", "kit": {"commit": "abcdef0123456789"}},
    }


def test_page_is_escaped_deterministic_and_self_contained():
    report = _fake_report()
    html = render_page(report)
    assert html == render_page(json.loads(json.dumps(report)))
    assert "<script>" not in html and "m &lt;script&gt;" in html
    assert "http://" not in html and "https://" not in html and "<link" not in html
    assert "1/1 @3" in html and "1.250" in html and "1/1 blocks, min max|Δ| 3.5" in html
    assert "abcdef012345 " in html and "abcdef0123456" not in html
    assert "<title>kvkit detection matrix</title>" in html and "Content-Security-Policy" in html  # the site's base
    assert '<td class="mono">num_blocks=1</td>' in html  # the fault kind is its own column, not a parameter


def test_page_recomputes_the_summary_and_shows_false_positives_per_window():
    """The stored summary says 0 false positives; the per-window counts say one at 8 tokens. The page believes the
    counts."""
    control = dict(
        _control({"8": 1, "16": 0, "32": 0}),
        model_seed=1,
        reuses_compared=4,
        inconclusive={"8": 0, "16": 1, "32": 1},
    )
    report = _fake_report([control])
    assert report["summary"]["false_positives"] == 0
    m = page_model(report)
    assert m.false_positives == 1 and m.false_positives_by_window == (("8", 1), ("16", 0), ("32", 0))
    html = render_page(report)
    assert 'false positives, all windows: <span class="bad">1</span>' in html
    assert "(8 tokens: 1, 16 tokens: 0, 32 tokens: 0)" in html
    assert '<td class="missed">1</td><td class="detected">0</td><td class="detected">0</td>' in html
    assert "not read from the summary stored in the report" in html


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "is not a kvkit-detection-matrix report"),
        (json.dumps({"kind": "kvkit-report", "schema_version": 1}), "is not a kvkit-detection-matrix report"),
        (json.dumps({"kind": plan.KIND, "schema_version": plan.SCHEMA_VERSION + 1}), "(upgrade the kit)"),
        (json.dumps({"kind": plan.KIND, "schema_version": 0}), "this kit reads 1, 2"),
        (json.dumps({"kind": plan.KIND}), "schema_version None"),
        (json.dumps({"kind": plan.KIND, "schema_version": "1"}), "schema_version '1'"),
    ],
)
def test_load_matrix_refuses_what_it_cannot_read_in_one_line(tmp_path, text, message):
    path = tmp_path / "m.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UsageError) as err:
        load_matrix(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_detection_site_renders_the_page_and_exits_0(tmp_path, capsys):
    report, site = tmp_path / "m.json", tmp_path / "out" / "d.html"
    report.write_text(json.dumps(_fake_report()), encoding="utf-8")
    assert run_command(detection_site, ["--report", str(report), "--site", str(site)]) == 0
    assert site.read_text(encoding="utf-8") == render_page(_fake_report())
    assert "false_positives=0 (per window 8:0,16:0,32:0)" in capsys.readouterr().out


def test_detection_site_exits_1_when_a_control_has_a_false_positive(tmp_path, capsys):
    control = dict(
        _control({"8": 1, "16": 0, "32": 0}), model_seed=1, reuses_compared=4, inconclusive={w: 0 for w in WINDOW_KEYS}
    )
    report, site = tmp_path / "m.json", tmp_path / "d.html"
    report.write_text(json.dumps(_fake_report([control])), encoding="utf-8")
    assert run_command(detection_site, ["--report", str(report), "--site", str(site)]) == 1
    assert "false_positives=1 (per window 8:1,16:0,32:0)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "func, argv, message",
    [
        (detection, ["--faults", "zero_blocks,bogus"], "unknown fault kind(s) bogus; choose from zero_blocks"),
        (detection, ["--seeds", "1,x"], "model seeds must be integers"),
        (detection, ["--bogus"], "unrecognized arguments: --bogus"),
        (detection_site, ["extra"], "unrecognized arguments: extra"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(func, argv, message, capsys):
    assert run_command(func, argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("error: ")


def test_detection_site_on_a_broken_report_is_one_line_and_exit_2(tmp_path, capsys):
    report, site = tmp_path / "m.json", tmp_path / "d.html"
    report.write_text("{", encoding="utf-8")
    assert run_command(detection_site, ["--report", str(report), "--site", str(site)]) == 2
    err = capsys.readouterr().err
    assert "is not valid JSON" in err and err.count("\n") == 1 and not site.exists()


# ---- replays --------------------------------------------------------------------------------------

DECOY_ANSWER = tuple(range(200, 232))


def test_other_prompt_runs_at_its_one_position_over_the_whole_prefix(tmp_path):
    assert plan.positions_of("other_prompt") == {"prefix": None} and plan.positions_of("stale") == plan.POSITIONS
    job = plan.fault_job(tmp_path, "other_prompt", "prefix", "/m")
    extra = job.arm.connector.extra_config
    assert job.arm.name == "other_prompt-prefix" and extra["fault"] == "other_prompt" and "first_block" not in extra


def test_the_baseline_runs_the_decoy_so_a_reuse_served_its_kv_can_name_it(tmp_path):
    base = plan.baseline_job(tmp_path, 1, "/m1")
    assert [(p.name, p.requests) for p in base.probes] == [(plan.DECOY[0], 1)] + [(n, 1) for n, _ in plan.PROMPTS]


def _probe(name: str, outputs: list[tuple[int, ...]]) -> dict:
    reqs = [_request(ids, 0 if i == 0 else 32, "cold" if i == 0 else "reuse") for i, ids in enumerate(outputs)]
    return {"name": name, "prompt_token_ids": list(range(len(name), 40)), "requests": reqs}


def test_a_fault_rows_reuses_are_judged_for_replays_of_every_prompts_answer():
    """alpha's reuse answers as the decoy did from its first token (the decoy is in the baseline); bravo's
    diverges into nothing it could replay; the decoy itself is never a row."""
    baseline = {
        "probes": [_probe("decoy", [DECOY_ANSWER]), _probe("alpha", [tuple(BASE)]), _probe("bravo", [tuple(BASE)])]
    }
    result = {
        "probes": [
            _probe("decoy", [DECOY_ANSWER]),
            _probe("alpha", [tuple(BASE), DECOY_ANSWER[:9] + tuple(BASE[9:])]),
            _probe("bravo", [tuple(BASE), _diverge_at(4)]),
        ]
    }
    entry = fault_entry("other_prompt", "prefix", {}, result, None, baseline, [])
    rows = {p["name"]: p for p in entry["probes"]}
    assert set(rows) == {"alpha", "bravo"}
    assert rows["alpha"]["reuse_replays"] == [[{"probe": "decoy", "request": "baseline", "from": 0, "tokens": 9}]]
    assert rows["bravo"]["reuse_replays"] == [[]]  # it diverged, into nothing another prompt answered
    tally = replay_tally(entry["probes"])
    assert tally["divergent_reuses"] == 2 and tally["replaying_own_earlier"] == 0
    assert tally["replaying_another"] == [
        {
            "name": "alpha",
            "reuse": 1,
            "probe": "decoy",
            "request": "baseline",
            "from": 0,
            "tokens": 9,
            "served": None,
            "served_from": None,
        }
    ]  # no audit column on this row: whether decoy's KV was served is not known


def test_a_reuse_replays_only_prompts_its_engine_was_sent():
    """alpha's reuse answers as foxtrot did, but foxtrot is only in the baseline (it runs there for a row that sends
    it between a cold request and its reuse): no replay here. Where this arm sent foxtrot between (its
    effective_config.between_requests, by token IDs), the same answer is a replay of foxtrot's."""
    foxtrot = _probe("foxtrot", [DECOY_ANSWER])
    baseline = {"probes": [_probe("alpha", [tuple(BASE)]), foxtrot]}
    probes = [_probe("alpha", [tuple(BASE), DECOY_ANSWER[:9] + tuple(BASE[9:])])]
    alone = fault_entry("other_prompt", "prefix", {}, {"probes": probes}, None, baseline, [])
    assert alone["probes"][0]["reuse_replays"] == [[]]
    between = {"probe": "alpha", "reuse": 1, "prompt_token_ids": foxtrot["prompt_token_ids"]}
    sent = {"probes": probes, "effective_config": {"between_requests": [between]}}
    entry = fault_entry("other_prompt", "prefix", {}, sent, None, baseline, [])
    assert entry["probes"][0]["reuse_replays"] == [
        [{"probe": "foxtrot", "request": "baseline", "from": 0, "tokens": 9}]
    ]


def _replay_row(name: str, replays: list, served_from: list | None) -> dict:
    row = {"name": name, "reuse_replays": replays}
    return row if served_from is None else {**row, "kv": {"served_from": served_from}}


def test_each_replay_is_checked_against_the_prompt_whose_kv_the_audit_found():
    """The truth is the KV audit's (what the reuse's wrong blocks equal); replays never read it."""
    named = {"probe": "decoy", "request": "baseline", "from": 0, "tokens": 9}
    other = {"probe": "echo", "request": "baseline", "from": 3, "tokens": 6}
    own = {"probe": "charlie", "request": "cold", "from": 2, "tokens": 4}
    probes = [
        _replay_row("alpha", [[named]], [["decoy"]]),  # names the served prompt
        _replay_row("bravo", [[other]], [["alpha"]]),  # names another: the model's answers share phrases
        _replay_row("charlie", [[own]], [[]]),
        _replay_row("delta", [None], [[]]),  # matched the baseline
    ]
    tally = replay_tally(probes)
    assert tally["divergent_reuses"] == 3 and tally["replaying_own_earlier"] == 1
    assert [(r["name"], r["served"]) for r in tally["replaying_another"]] == [("alpha", True), ("bravo", False)]
    fault = {"fault": "other_prompt", "position": "prefix", "error": None, "windows": {}, "probes": probes}
    s = summarize([fault], [dict(_control(0), probes=[_replay_row("alpha", [None, None], None)])], True)["replays"]
    assert s == {
        "present": True,
        "divergent_reuses": 3,
        "replaying_another": 2,
        "naming_the_served_prompt": 1,
        "replaying_own_earlier": 1,
        "by_fault": {"other_prompt/prefix": [2, 3]},
        "control_replaying": 0,
    }
    assert replay_tally([{"name": "alpha"}]) is None  # a row made before replays were counted
    assert summarize([dict(fault, probes=[{"name": "alpha"}])], [], True)["replays"] == {"present": False}


def test_the_page_shows_the_replays_column_and_what_the_audit_found():
    report = _fake_report()
    report["faults"][0]["probes"] = [
        dict(
            report["faults"][0]["probes"][0],
            **_replay_row("alpha", [[{"probe": "echo", "request": "baseline", "from": 3, "tokens": 6}]], [["decoy"]]),
        ),
        dict(report["faults"][0]["probes"][0], **_replay_row("bravo", [None], [[]])),
    ]
    report["controls"][0]["probes"] = [_replay_row("alpha", [None, None], None)]
    m = page_model(report)
    assert m.replays_present and (m.replaying_another, m.divergent_reuses, m.naming_the_served_prompt) == (1, 1, 0)
    assert m.rows[0].replays.text == "1/1 reuses, 0 naming the served prompt"
    assert m.rows[0].replay_notes == (
        (
            "alpha reuse 1: replays echo's answer from @3, 6 tokens; the KV audit found decoy's blocks in it, "
            "not echo's: a match by chance"
        ),
    )
    html = render_page(report)
    assert "1 of the 1 reuses that diverged replay another prompt's answer (0 of them the prompt whose" in html


# ---- the committed matrix ---------------------------------------------------------------------


@needs_committed
def test_committed_matrix_detects_every_fault_with_no_false_positive():
    report = load_matrix(COMMITTED)
    kinds = {f["fault"] for f in _detection_rows(report)}
    assert kinds == set(plan.FAULT_PARAMS) and len(kinds) >= 6
    assert {(f["fault"], f["position"]) for f in _detection_rows(report)} == set(CELLS)
    for kind in kinds:
        cells = [c for f in report["faults"] if f["fault"] == kind for c in f["windows"].values()]
        assert any(c["detected"] > 0 for c in cells), kind  # the arm verdict is FAIL somewhere
    assert not [f for f in report["faults"] if f["error"]] and not [c for c in report["controls"] if c["error"]]
    for c in report["controls"]:
        assert set(c["false_positives"]) == set(WINDOW_KEYS) and set(c["false_positives"].values()) == {0}, c["arm"]
        assert c["reuses_exercised"] == c["reuses_compared"] > 0, c["arm"]
    pairs = {(c["model_seed"], p["name"]) for c in report["controls"] for p in c["probes"]}
    assert len(pairs) >= 5
    assert {c["arm"] for c in report["controls"]} >= {"ExampleConnector", "native", "PlantedFault-none"}
    assert report["prefix_check"]["ok"] and report["prefix_check"]["requests_compared"] > 0
    assert report["config"]["fault_model_seed"] == MODEL_SEED
    summary = summarize(report["faults"], report["controls"], report["prefix_check"]["ok"])
    assert summary["every_fault_detected"] and summary["false_positives_by_window"] == {w: 0 for w in WINDOW_KEYS}
    assert summary["control_reuses_exercised"] > 0 and summary["prefix_check_ok"] and not summary["arm_errors"]
    assert summary["kv_audit"]["ok"]
    # the study is ok only when every catalogue row held too: the committed run's three rows that did not hold
    # (docs/detection.md says why) keep it from ok, and the stored summary says so
    expectations = summary.get("expectations")
    if expectations is None:  # a matrix made before the catalogue's rows
        assert summary["ok"]
    else:
        missed = sorted(k for k, c in expectations["by_row"].items() if not c["held"])
        assert summary["ok"] == expectations["ok"] == (missed == [])
        assert missed == ["failed_store/tail", "late_load/whole", "late_load/whole-after-another"], missed
    assert report["summary"] == summary  # the stored summary is what the entries say


@needs_committed
def test_committed_matrix_kv_audit_blamed_exactly_the_planted_blocks_and_nothing_in_the_controls():
    report = load_matrix(COMMITTED)
    assert report["schema_version"] == plan.SCHEMA_VERSION and report["config"]["kv_audit"] is True
    kv = summarize(report["faults"], report["controls"], report["prefix_check"]["ok"])["kv_audit"]
    assert kv["present"] and kv["ok"] and kv["mismatches"] == []
    assert kv["blamed_exactly"] == kv["fault_probes"] == len(CELLS) * len(plan.PROMPTS)
    for f in _detection_rows(report):
        for p in f["probes"]:
            assert p["kv"]["outcome"] == "exact" and p["kv"]["planted_blocks"] == [p["faulted_blocks"]], f["fault"]
    # the point of the audit: some probes' tokens never changed, and their audit still blamed the planted block
    assert kv["tokens_unchanged_blamed_exactly"] == kv["tokens_unchanged"] > 0
    assert kv["false_blames"] == kv["control_unavailable"] == 0
    for c in report["controls"]:
        assert c["kv_blame"]["status"] == "ok" and c["kv_blame"]["verdicts"]["CORRUPT"] == 0, c["arm"]
        assert c["kv_blame"]["probes"] == len(plan.PROMPTS), c["arm"]


@needs_committed
def test_committed_matrix_faults_really_changed_the_kv():
    report = load_matrix(COMMITTED)
    for f in _detection_rows(report):
        for p in f["probes"]:
            audit = p["kv_audit"]
            assert audit["faulted_blocks"] == p["faulted_blocks"] and p["faulted_blocks"], (f["fault"], p["name"])
            assert all(d > 0 for _, d in audit["faulted_max_abs_diff"]), (f["fault"], p["name"])
            assert audit["clean_max_abs_diff"] == 0.0
    none = [c for c in report["controls"] if c["arm"] == "PlantedFault-none"]
    assert none and all(c["kv_audit"]["loads"] > 0 and c["kv_audit"]["max_abs_diff"] == 0.0 for c in none)


@needs_committed
def test_committed_matrix_was_run_with_todays_plan():
    config = load_matrix(COMMITTED)["config"]
    assert config["windows"] == list(plan.WINDOWS) and config["fault_params"] == plan.FAULT_PARAMS
    assert config["prompts"] == [list(p) for p in plan.PROMPTS] and config["decoy"] == list(plan.DECOY)
    assert config["positions"] == plan.POSITIONS and config["control_reuses"] == plan.CONTROL_REUSES
    assert config["fault_positions"] == plan.FAULT_POSITIONS
    # the catalogue's rows, with the expectations they were run against (a matrix made before them has none)
    assert config.get("fault_rows") in (None, json.loads(json.dumps([r.to_json() for r in catalogue.ROWS])))
    assert config["control_model_seeds"] == sorted(plan.CONTROL_MODEL_SEEDS)


@needs_committed
def test_committed_matrix_counts_replays_in_every_row_and_none_in_the_controls():
    report = load_matrix(COMMITTED)
    s = summarize(report["faults"], report["controls"], report["prefix_check"]["ok"])["replays"]
    assert s["present"] and set(s["by_fault"]) == {f"{k}/{p}" for k, p in CELLS}
    diverged = sum(d is not None for f in _detection_rows(report) for p in f["probes"] for d in p["reuse_first_diffs"])
    assert s["divergent_reuses"] == diverged > 0 and s["control_replaying"] == 0
    assert 0 <= s["naming_the_served_prompt"] <= s["replaying_another"] <= diverged
    for f in report["faults"]:
        for p in f["probes"]:
            assert len(p["reuse_replays"]) == len(p["reuse_first_diffs"])
            assert [r is None for r in p["reuse_replays"]] == [d is None for d in p["reuse_first_diffs"]]


@needs_committed
def test_committed_page_is_the_rendering_of_the_committed_matrix():
    assert COMMITTED_PAGE.read_text(encoding="utf-8") == render_page(load_matrix(COMMITTED))
