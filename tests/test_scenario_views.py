"""Scenario results everywhere: the read model's scenario records (repro.readmodel.scenarios), the text
summary's Scenarios block, the report page's Scenarios section, the issue Markdown's scenario findings and
the matrix rows' scenario verdicts; and a report without scenarios shows none of it."""

from __future__ import annotations

import copy
import json
import re

import pytest
from conftest import ARTIFACTS, ROOT
from kvkit_testutil import committed_or_skip
from test_browser import CHROMIUM, FIT_JS, browser, render_reports  # noqa: F401 - browser is a fixture
from test_issue_md import html_tables
from test_render import XSS, Page

from repro.matrix import status
from repro.matrix.page import render_matrix_page
from repro.publish.issue_md import format_issue_md, render_body
from repro.publish.scenario_md import format_scenarios
from repro.publish.site import render_report_page, render_site
from repro.publish.summary import format_summary
from repro.publish.summary import format_summary as report_summary  # what repro.verify prints
from repro.readmodel import as_report, read_report
from repro.record.report import load_report, validate_report

DATA = ROOT / "tests" / "data"
INPUT = DATA / "scenarios-test-input.json"  # hand-made in the producer's shape (.notes spec), schema-true
# The producer's real example: the verifier's report of fixtures/scenarios-cpu.json, --scenarios a-b-a (the same
# file, byte for byte, as the producer's branch commits at this path).
REAL = DATA / "report-scenarios-example.json"
SOURCE = "vllm:num_preemptions (vLLM's Prometheus counter, as LLM.get_metrics() reads it)"
CORRUPT_511 = "CORRUPT: blocks 0–15, 20 (tokens 0–335), K+V, layers 0–3"
CORRUPT_512 = "CORRUPT: blocks 0–15 (tokens 0–255), K+V, layers 0–3"


def scenario_report() -> dict:
    return json.loads(INPUT.read_text(encoding="utf-8"))


EXIT_OK_TEXT = "exit 0: acceptance matched: every verdict as the fixture states"


def without_scenarios(report: dict) -> dict:
    """The same run without its scenarios: what a run without --scenarios writes."""
    plain = copy.deepcopy(report)
    del plain["scenarios"], plain["config"]["scenarios"], plain["acceptance"]["scenarios"]
    del plain["diagnostics"]["scenarios_wall_s"]
    plain["errors"] = [e for e in plain["errors"] if "(scenario " not in e["arm"]]
    return plain


def cell_rows(html: str, table: str) -> list[list[str]]:
    return Page(html).rows[table]


# --- the read model ---------------------------------------------------------------------------------


def test_the_test_input_is_a_report_the_kit_loads_and_its_schema_accepts():
    data = load_report(INPUT)
    validate_report(data)
    assert [s["name"] for s in data["scenarios"]] == ["a-b-a", "in-flight", "preemption"]


def test_a_scenario_reads_as_steps_settings_control_and_arms():
    report = read_report(INPUT)
    assert report.requested_scenarios == ("a-b-a", "in-flight", "preemption")
    aba, inflight, preemption = report.scenarios
    assert [s.text for s in aba.steps] == ["chat-511 · must miss", "chat-512 · hit or miss", "chat-511 · must reuse"]
    assert inflight.steps[0].text == "chat-511, chat-512, chat-513 in flight together · must miss"
    assert aba.settings_text == "engine kv_cache_tokens 1200, max_num_seqs 1"
    assert preemption.settings_text == (
        "engine kv_cache_tokens 800, max_num_seqs 3, preemption true · LMCache max_local_cpu_size 0.002"
        " · MP server cpu_pool_gb 0.002"
    )
    assert aba.control_text.endswith("every request gave the plain baseline's tokens")
    assert inflight.control_text.endswith(
        "step 0 chat-513 differs from the plain baseline @5; step 1 chat-513 differs from the plain baseline @5"
        " (the schedule alone changes the numerics there)"
    )
    planted = aba.arm("PlantedFault")
    assert planted.title == "PlantedFault (PlantedFaultConnector)"  # the report's arm title, not just its name
    assert planted.verdict_text == "FAIL" and planted.is_finding
    assert [r.place for r in planted.failing] == ["step 2 chat-511"]
    bad = planted.failing[0]
    assert (bad.hit_cell, bad.role, bad.expect_text) == ("496", "reuse", "must reuse")
    assert bad.diff_cell == "@2 (decisive, gap 8.376 nats)"
    assert bad.kv_cell == "CORRUPT: blocks 0–15, 20 (tokens 0–335), K+V, layers 0–3"
    assert (
        bad.control_cell == "differs" and bad.control_text == "the cache-off control gave the plain baseline's tokens"
    )
    assert bad.replay_texts == ("replays chat-512's answer from @4, 5 tokens",)  # a Request's replays, as probes'
    native = inflight.arm("native")
    assert native.verdict_text == "PASS (schedule-numerics)" and not native.is_finding
    shared = [r for r in native.requests if r.probe == "chat-513"]
    assert [r.control_cell for r in shared] == ["same (control @5)"] * 2
    assert shared[0].control_text == "as the cache-off control, which differs @5 too (the schedule's numerics)"
    assert report.scenario_findings == ((aba, planted), (inflight, inflight.arm("PlantedFault")))


def test_an_error_arm_and_missing_figures_read_as_absent_never_as_zero():
    crashed = read_report(INPUT).scenarios[2].arm("PlantedFault")
    assert crashed.error_text == "crash: the engine child exited 1 before writing its result"
    assert crashed.log_tail == "RuntimeError: out of KV cache blocks" and crashed.requests == ()
    assert crashed.preemptions_text == "preemptions not recorded (unavailable: the child wrote no result)"
    data = scenario_report()
    req = data["scenarios"][0]["arms"][0]["requests"][2]
    for key in ("cached_tokens", "control_matches", "kv", "expect", "first_diff", "token_ids"):
        req[key] = None
    read = as_report(data).scenarios[0].arm("PlantedFault").requests[2]
    assert (read.hit_cell, read.control_cell, read.kv_cell, read.expect_text, read.diff_cell) == (
        "?",
        "—",
        "—",
        "hit or miss",
        "",
    )
    assert read.control_text == "control not recorded"


def test_the_nth_request_of_a_probe_in_a_step_meets_the_controls_nth():
    data = scenario_report()
    scenario = data["scenarios"][1]
    scenario["steps"][0]["submit"] = ["chat-511", "chat-511"]
    ctrl = [dict(r, step=0, probe="chat-511") for r in scenario["control"]["requests"][:2]]
    ctrl[0].update(matches_plain=True, first_diff=None)
    ctrl[1].update(matches_plain=False, first_diff=9)
    scenario["control"]["requests"] = ctrl
    arm = scenario["arms"][1]
    arm["requests"] = [dict(r, step=0, probe="chat-511") for r in arm["requests"][:2]]
    read = as_report(data).scenarios[1].arm("native")
    assert [r.control_cell for r in read.requests] == ["same", "same (control @9)"]


def test_a_report_without_scenarios_reads_none():
    report = read_report(DATA / "render-selftest.json")
    assert report.scenarios == () and report.requested_scenarios == () and report.scenario_findings == ()


# --- the text summary -------------------------------------------------------------------------------


def test_the_summary_has_a_line_per_scenario_arm_then_one_per_failing_request():
    text = format_summary(scenario_report())
    block = text[text.index("\n\nScenarios\n") + 2 :].splitlines()
    assert block == [
        "Scenarios",
        "  a-b-a · PlantedFault: FAIL · KV CORRUPT · preemptions 0 · hits 0 16 496",
        (
            "      step 2 chat-511 (reuse, 496 cached, must reuse): FAIL @2 (decisive, gap 8.376 nats) · KV CORRUPT: "
            "blocks 0–15, 20 (tokens 0–335), K+V, layers 0–3 · the cache-off control gave the plain baseline's tokens"
            " — 496 cached tokens, differs from baseline @2"
        ),
        "  a-b-a · native: PASS · KV EXACT · preemptions 0 · hits 0 16 496",
        (
            "  in-flight · control (baseline, cache off) differs from the plain baseline: step 0 chat-513 @5, step 1 "
            "chat-513 @5"
        ),
        "  in-flight · PlantedFault: FAIL · KV CORRUPT · preemptions 0 · hits 0 0 0 496 496 512",
        (
            "      step 1 chat-512 (reuse, 496 cached, must reuse): FAIL @2 (decisive, gap 9.219 nats) · KV CORRUPT: "
            "blocks 0–15 (tokens 0–255), K+V, layers 0–3 · the cache-off control gave the plain baseline's tokens"
            " — 496 cached tokens, differs from baseline @2 (the control gave the plain baseline's tokens)"
        ),
        "  in-flight · native: PASS · schedule-numerics · KV EXACT · preemptions 0 · hits 0 0 0 496 496 512",
        "  preemption · PlantedFault: ERROR",
        "      crash: the engine child exited 1 before writing its result",  # its reason says the same: once
        "  preemption · native: INCONCLUSIVE · KV EXACT · preemptions 0 · hits 0 0 0 496 496 496",
        "      the scenario needs preemption, but vLLM's preemption counter stayed 0",
        (
            "  acceptance.matched = false (failed: PlantedFault preemption tokens expected FAIL, got ERROR; native "
            "preemption tokens expected PASS, got INCONCLUSIVE)"
        ),
        "",
        "claim_eligible=false; no performance claim",
    ]


def test_the_summary_reads_the_producers_real_example():
    """The verifier's own report of fixtures/scenarios-cpu.json's a-b-a: the lines its producer specified."""
    text = format_summary(read_report(REAL))
    assert (
        text.splitlines()[-6:]
        == [
            "",
            "Scenarios",
            "  a-b-a · ExampleConnector: PASS · KV EXACT · preemptions 0 · hits 0 0 0 1488",
            "  a-b-a · native: PASS · KV EXACT · preemptions 0 · hits 0 0 0 992",
            "  acceptance.matched = false (unchecked: ExampleConnector a-b-a PASS; native a-b-a PASS)",
            "",
            "claim_eligible=false; no performance claim",
        ][1:]
    )
    printed = report_summary(json.loads(REAL.read_text(encoding="utf-8")))  # what the verifier prints
    assert printed == text and printed.count("\nScenarios\n") == 1  # one block, however many places add one


def test_the_summary_without_scenarios_is_the_summary_before_them():
    report = scenario_report()
    head, _, tail = format_summary(report).partition("\n\nScenarios\n")
    scenario_error = (
        "ERROR PlantedFault (scenario preemption): crash: the engine child exited 1 before writing its result\n"
    )
    assert scenario_error in head  # a scenario child's failure is in the report's errors, shown as any error
    # the headline's exit code differs (the scenario's ERROR exits 3); everything else is the summary before them
    head = head.replace("exit 3: 1 ERROR: PlantedFault (scenario preemption): crash", EXIT_OK_TEXT)
    before = format_summary(without_scenarios(report))
    assert "scenario" not in before.splitlines()[0] and "scenario a-b-a: " in head  # the headline names the runs
    assert _below_headline(before) == _below_headline(head.replace(scenario_error, "") + "\n" + tail.splitlines()[-1])


def _below_headline(text: str) -> str:
    """The summary from its hardware line on (the line above the exit line), without the headline sentence."""
    lines = text.splitlines()
    return "\n".join(lines[next(i for i, x in enumerate(lines) if x.startswith("# ")) - 1 :])


def test_a_control_that_did_not_run_gets_its_own_summary_line():
    report = scenario_report()
    report["scenarios"][0]["control"] = {"arm": "baseline", "status": "error", "error": "timeout", "requests": []}
    assert "  a-b-a · control (baseline, cache off): ERROR timeout" in format_summary(report).splitlines()


# --- the report page ----------------------------------------------------------------------------------


def test_the_page_has_a_scenarios_section_between_the_table_and_the_details():
    html = render_report_page(scenario_report(), stem="scn")
    positions = [html.index(m) for m in ('id="table"', 'id="scenarios"', 'id="s0"', 'id="s2"', 'id="details"')]
    assert positions == sorted(positions)
    text = " ".join(Page(html).all_text().split())
    assert "step 0: chat-511, chat-512, chat-513 in flight together · must miss" in text
    assert "engine kv_cache_tokens 1200, max_num_seqs 1" in text
    assert 'class="control-loud">schedule control (baseline, cache off, the same steps): step 0 chat-513' in html
    assert '<p class="muted">schedule control (baseline, cache off, the same steps): every request' in html


def test_a_row_per_request_with_verdict_diff_hit_kv_expect_and_control():
    rows = cell_rows(render_report_page(scenario_report(), stem="scn"), "scn-s0")
    assert rows[0] == ["step", "probe", "expect", "cached", "verdict", "first diff", "KV", "control"]
    assert rows[1:] == [
        ["PlantedFault (PlantedFaultConnector): FAIL"],
        [
            f"KV CORRUPT: blocks 0–15, 20 (tokens 0–335), K+V, layers 0–3 · floor rel 2.4e-07 · preemptions 0 ({SOURCE}) · 12.4 s"
        ],
        ["step 2 chat-511: 496 cached tokens, differs from baseline @2"],
        ["0", "chat-511", "must miss", "0 miss", "PASS", "", "—", "same"],
        ["1", "chat-512", "hit or miss", "16 reuse, external", "PASS", "", "EXACT", "same"],
        [
            "2",
            "chat-511",
            "must reuse",
            "496 reuse, external",
            "FAIL",
            "@2 (decisive, gap 8.376 nats)",
            "CORRUPT: blocks 0–15, 20 (tokens 0–335), K+V, layers 0–3",
            "differs",
        ],
        ["native prefix caching: PASS"],
        [f"KV EXACT · floor rel 2.4e-07 · preemptions 0 ({SOURCE}) · 10.9 s"],
        ["0", "chat-511", "must miss", "0 miss", "PASS", "", "—", "same"],
        ["1", "chat-512", "hit or miss", "16 reuse, local", "PASS", "", "EXACT", "same"],
        ["2", "chat-511", "must reuse", "496 reuse, local", "PASS", "", "EXACT", "same"],
    ]


def test_the_class_the_error_and_the_inconclusive_reason_are_shown():
    html = render_report_page(scenario_report(), stem="scn")
    inflight = cell_rows(html, "scn-s1")
    native = inflight.index(["native prefix caching: PASS schedule-numerics"])
    assert inflight[native + 2] == [
        "step 0 chat-513, step 1 chat-513: differs @5 as the cache-off control does: the schedule changed the numerics"
    ]
    assert ["1", "chat-513", "must reuse", "512 reuse, local", "PASS schedule-numerics", "@5 (near-tie, gap 0.021 nats)", "EXACT",
            "same (control @5)"] in inflight  # fmt: skip
    assert '<span class="cond cond-q">schedule-numerics</span>' in html
    preemption = cell_rows(html, "scn-s2")
    crashed = preemption.index(["PlantedFault (PlantedFaultConnector): ERROR"])
    assert preemption[crashed + 1 : crashed + 4] == [
        ["preemptions not recorded (unavailable: the child wrote no result) · 3.1 s"],
        ["ERROR crash: the engine child exited 1 before writing its resultRuntimeError: out of KV cache blocks"],
        ["the engine child exited 1 before writing its result"],
    ]
    assert "<pre>RuntimeError: out of KV cache blocks</pre>" in html
    assert ["the scenario needs preemption, but vLLM's preemption counter stayed 0"] in preemption


def _scrub_scenarios(html: str) -> str:
    """The page less its styles, its scenarios section, its headline (which names the scenario runs) and the exit code
    under it (a scenario ERROR is exit 3)."""
    html = re.sub(r"<style>.*?</style>", "", html, flags=re.DOTALL)
    html = re.sub(r"<title>.*?</title>|<h1 [^>]*>.*?</h1>|<p class=\"summary mono\">.*?</p>", "", html, flags=re.DOTALL)
    return re.sub(r'\n<h2 id="scenarios">.*?(?=\n<h2 id="details">)', "", html, flags=re.DOTALL)


def test_the_page_without_scenarios_is_the_page_before_them():
    report = scenario_report()
    plain = render_report_page(without_scenarios(report), stem="scn")
    assert 'id="scenarios"' not in plain and "schedule-numerics" not in plain
    html = render_report_page(report, stem="scn")
    assert _scrub_scenarios(html) == _scrub_scenarios(plain)
    # the headline names the scenario runs that are not a plain PASS, the ERROR among them; the plain page's none
    assert "scenario preemption: PlantedFault (PlantedFaultConnector) ERROR" in html.split("</h1>")[0]
    assert "scenario" not in plain.split("</h1>")[0].split('<h1 class="headline"')[1]


def test_scenarios_asked_for_but_absent_are_said():
    report = without_scenarios(scenario_report())
    report["config"]["scenarios"] = ["a-b-a", "eviction"]
    html = render_report_page(report, stem="scn")
    assert '<p id="scenarios-note">Asked for but not in this report: a-b-a, eviction.</p>' in html
    report["scenarios"] = scenario_report()["scenarios"][:1]
    html = render_report_page(report, stem="scn")
    assert "Asked for but not in this report: eviction." in html and 'id="s0"' in html


def test_scenario_text_from_the_report_is_escaped():
    report = scenario_report()
    scenario = report["scenarios"][0]
    scenario["name"], scenario["description"] = XSS[1], XSS[0]
    scenario["arms"][0]["reasons"] = [XSS[0]]
    scenario["arms"][0]["requests"][0]["probe"] = XSS[1]
    scenario["engine"] = {XSS[0]: XSS[1]}
    page = Page(render_report_page(report, stem="scn"))
    assert not {t for t, _ in page.tags} & {"script", "img"}
    assert not any(k.startswith("on") for _, attrs in page.tags for k in attrs)
    assert page.all_text().count(XSS[0]) >= 3 and page.all_text().count(XSS[1]) >= 3


def test_the_index_row_names_every_scenario_run_that_is_not_a_plain_pass(tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "scn.json").write_text(json.dumps(scenario_report()), encoding="utf-8")
    (reports / "plain.json").write_text(json.dumps(without_scenarios(scenario_report())), encoding="utf-8")
    render_site(reports, tmp_path / "site")
    found = cell_rows((tmp_path / "site" / "index.html").read_text(encoding="utf-8"), "reports")[1:]
    rows = {stem: next(r for r in found if r[0].endswith(stem)) for stem in ("scn", "plain")}  # the finding cell
    assert rows["scn"][1].endswith(  # the verdicts column: every scenario run that is not a plain PASS, ERROR too
        "scenarios: a-b-a · PlantedFault (PlantedFaultConnector) FAIL (KV CORRUPT) in-flight · PlantedFault "
        "(PlantedFaultConnector) FAIL (KV CORRUPT) in-flight · native prefix caching PASS (schedule-numerics) "
        "preemption · PlantedFault (PlantedFaultConnector) ERROR preemption · native prefix caching INCONCLUSIVE "
        "1 more PASS"
    )
    assert "scenario preemption: PlantedFault (PlantedFaultConnector) ERROR" in rows["scn"][0]  # in its headline
    assert "scenarios:" not in rows["plain"][1] and "scenario" not in rows["plain"][0]
    assert rows["scn"][1].startswith(rows["plain"][1])  # the arms' verdicts first, as without scenarios


# --- the issue Markdown ----------------------------------------------------------------------------------


def _section(body: str, heading: str) -> str:
    start = body.index(heading)
    return body[start : body.index("\n#### ", start + 1)]


def test_the_issue_has_a_scenario_table_after_the_verdicts():
    body = format_issue_md(scenario_report())
    assert body.index("- acceptance.matched") < body.index("#### Scenarios") < body.index("#### KV audit")
    tables = html_tables(_section(body, "#### Scenarios"))
    assert tables == [
        [
            ["scenario", "arm", "verdict", "KV", "preemptions", "requests not PASS"],
            ["a-b-a", "PlantedFault (PlantedFaultConnector)", "FAIL", CORRUPT_511, "0", "step 2 chat-511 FAIL"],
            ["a-b-a", "native prefix caching", "PASS", "EXACT", "0", "—"],
            ["in-flight", "PlantedFault (PlantedFaultConnector)", "FAIL", CORRUPT_512, "0", "step 1 chat-512 FAIL"],
            ["in-flight", "native prefix caching", "PASS (schedule-numerics)", "EXACT", "0", "—"],
            ["preemption", "PlantedFault (PlantedFaultConnector)", "ERROR", "—", "not recorded",
             "crash: the engine child exited 1 before writing its result"],
            ["preemption", "native prefix caching", "INCONCLUSIVE", "EXACT", "0", "—"],
        ]
    ]  # fmt: skip


def test_a_scenario_fail_is_a_finding_with_what_ran_the_step_the_diff_the_kv_and_the_control():
    section = _section(format_issue_md(scenario_report()), "#### Scenarios")
    finding = section[section.index("**a-b-a · PlantedFault (PlantedFaultConnector): FAIL**") :]
    finding = finding[: finding.index("\n\n**in-flight")]
    assert finding.splitlines()[2:] == [
        (
            "- what ran: A cold, then B, whose blocks take A's, then A again, which must reload (engine "
            "kv_cache_tokens 1200, max_num_seqs 1)"
        ),
        "- steps: 0: chat-511 · must miss; 1: chat-512 · hit or miss; 2: chat-511 · must reuse",
        "- schedule control (baseline, cache off, the same steps): every request gave the plain baseline's tokens",
        f"- preemptions 0 ({SOURCE})",
        f"- KV {CORRUPT_511} · floor rel 2.4e-07",
        (
            "- **step 2 chat-511** (reuse, 496 cached tokens, must reuse): FAIL, first diff @2; baseline token 220 vs "
            "reuse token 104; baseline margin 8.376 nats, reuse margin 13.931 nats, baseline top-1/top-2 gap 8.376 "
            "· decisive"
        ),
        "  - 496 cached tokens, differs from baseline @2",
        "  - KV: CORRUPT: blocks 0–15, 20 (tokens 0–335), K+V, layers 0–3",
        "  - control: the cache-off control gave the plain baseline's tokens",
        "  - **replays chat-512's answer from @4, 5 tokens**",
        "  - baseline: `272 17 220 279 210 192 179 249 250 286 9 43 73 285 250 286`",
        "  - this request: `272 17 104 200 132 20 279 111 43 73 285 189 86 151 9 43`",
    ]
    assert "- **in-flight · native prefix caching**: PASS (schedule-numerics) — step 0 chat-513" in section
    assert (
        "- **preemption · PlantedFault (PlantedFaultConnector)**: ERROR — crash: the engine child exited 1" in section
    )
    assert "- **preemption · native prefix caching**: INCONCLUSIVE — the scenario needs preemption" in section
    assert "**a-b-a · native" not in section  # a PASS is in the table, not a finding


def test_a_divergence_the_control_shares_shows_the_controls_tokens_too():
    report = scenario_report()
    request = report["scenarios"][1]["arms"][1]["requests"][5]  # native, step 1 chat-513: as the control
    request["verdict"] = "FAIL"
    report["scenarios"][1]["arms"][1]["verdict"] = "FAIL"
    section = _section(format_issue_md(report), "#### Scenarios")
    finding = section[section.index("**in-flight · native prefix caching: FAIL (schedule-numerics)**") :]
    assert "  - control: as the cache-off control, which differs @5 too (the schedule's numerics)" in finding
    control = report["scenarios"][1]["control"]["requests"][5]["token_ids"]
    assert f"  - control: `{' '.join(map(str, control))}`" in finding


def test_the_issue_without_scenarios_is_the_issue_before_them():
    report = scenario_report()
    body = format_issue_md(report)
    section = _section(body, "#### Scenarios")
    error = "- ERROR PlantedFault (scenario preemption): crash: the engine child exited 1 before writing its result\n"
    plain = format_issue_md(without_scenarios(report))
    # the same but for the headline (the title), which names the scenario runs that are not a plain PASS
    assert "scenario preemption: PlantedFault (PlantedFaultConnector) ERROR" in body.split("\n", 1)[0]
    rest = body.replace(section + "\n", "").replace(error, "").replace("per probe, scenarios,", "per probe,")
    assert plain.split("\n", 1)[1] == rest.split("\n", 1)[1]  # and the evidence's summary names its sections
    assert "#### Scenarios" not in format_issue_md(json.loads((DATA / "render-selftest.json").read_text()))


def test_asked_for_scenarios_that_did_not_run_are_said_in_the_issue():
    report = without_scenarios(scenario_report())
    report["config"]["scenarios"] = ["eviction"]
    section = _section(format_issue_md(report), "#### Scenarios")
    assert section.rstrip().endswith("Asked for but not in this report: eviction.") and "| scenario |" not in section


def test_scenario_token_lists_shrink_with_the_rest_to_fit():
    report = as_report(scenario_report())
    assert "  - this request: `272 17 104 200` … (12 more" in format_scenarios(report, 4)
    bare = render_body(report, 0)  # no token list at all
    assert len(bare) < len(render_body(report, None))
    small = format_issue_md(report, limit=len(bare))
    assert small == bare
    section = _section(small, "#### Scenarios")
    assert "this request:" not in section and section.rstrip().endswith(
        "_Generated token lists left out to fit GitHub's size limit; they are in the report JSON._"
    )


# --- the matrix rows ----------------------------------------------------------------------------------


def _cell(name: str, report: dict | None) -> dict:
    return {"name": name, "environment": "cpu", "connector": None, "model": None, "fixture": None, "seed": 0,
            "flags": [], "status": "done" if report else "error", "page": f"{name}.html" if report else None,
            "versions": {"vllm": "0.26.0"}, "hardware": "CPU",
            "error": None if report else {"kind": "timeout", "detail": "no report in 600 s"},
            "arms": status.arm_rows(report) if report else []}  # fmt: skip


def _matrix(*cells: dict) -> dict:
    return {"name": "m", "cells": list(cells), "probes": status.probe_names(list(cells)),
            "started_utc": "2026-01-02T00:00:00Z", "cluster": {}}  # fmt: skip


def test_a_cells_arms_carry_their_scenario_verdicts():
    rows = {r["name"]: r for r in status.arm_rows(scenario_report())}
    assert rows["PlantedFault"]["scenarios"] == {
        "a-b-a": {"verdict": "FAIL", "kv": "CORRUPT", "requests": ["step 2 chat-511 FAIL"]},
        "in-flight": {"verdict": "FAIL", "kv": "CORRUPT", "requests": ["step 1 chat-512 FAIL"]},
        "preemption": {"verdict": "ERROR"},
    }
    assert rows["native"]["scenarios"] == {
        "a-b-a": {"verdict": "PASS", "kv": "EXACT"},
        "in-flight": {"verdict": "PASS", "kv": "EXACT", "class": "schedule-numerics"},
        "preemption": {"verdict": "INCONCLUSIVE", "kv": "EXACT"},
    }
    assert "scenarios" not in rows["baseline"]  # the baseline ran the control, not a scenario arm
    plain = {r["name"]: r for r in status.arm_rows(without_scenarios(scenario_report()))}
    assert all("scenarios" not in r for r in plain.values())
    assert {k: v for k, v in rows["native"].items() if k != "scenarios"} == plain["native"]


def test_the_matrix_page_shows_scenario_verdicts_beside_the_probes():
    summary = _matrix(_cell("scn", scenario_report()), _cell("plain", without_scenarios(scenario_report())),
                      _cell("lost", None))  # fmt: skip
    html = render_matrix_page(summary, cells_dir="m/site")
    rows = Page(html).rows["matrix"]
    assert rows[0][6:] == ["chat-511", "chat-512", "chat-513", "scenario a-b-a", "scenario in-flight",
                           "scenario preemption"]  # fmt: skip
    scn = next(r for r in rows if r[0].startswith("scn"))
    assert scn[9:] == [  # the parser joins the blocks (an arm's <div>, a request's <span>) without a space
        "PlantedFault FAIL KV CORRUPTstep 2 chat-511 FAILnative PASS KV EXACT",
        "PlantedFault FAIL KV CORRUPTstep 1 chat-512 FAILnative PASS KV EXACT · schedule-numerics",
        "PlantedFault ERRORnative INCONCLUSIVE KV EXACT",
    ]
    assert (
        '<div>PlantedFault <span class="verdict v-FAIL">FAIL</span> KV CORRUPT<span class="muted setup">step 2 chat-511 FAIL'
        "</span></div>" in html
    )
    plain = next(r for r in rows if r[0].startswith("plain"))
    assert plain[9:] == ["—", "—", "—"]  # a cell that ran no scenario says so in each column
    assert '<td class="note" colspan="11"><span class="verdict v-ERROR">ERROR</span> timeout: no report' in html
    assert "A column per scenario follows the probes" in html


def test_a_matrix_without_scenarios_renders_as_before():
    plain = _matrix(_cell("plain", without_scenarios(scenario_report())), _cell("lost", None))
    html = render_matrix_page(plain, cells_dir="m/site")
    assert "scenario" not in html and '<td class="note" colspan="8">' in html


# --- the producer's real report ---------------------------------------------------------------------------


def test_the_real_example_on_the_page_in_the_issue_and_in_a_matrix_row():
    data = json.loads(REAL.read_text(encoding="utf-8"))
    html = render_report_page(data, stem="real")
    rows = cell_rows(html, "scn-s0")
    assert rows[1:4] == [
        ["ExampleConnector: PASS"],
        [f"KV EXACT · floor rel 0 · preemptions 0 ({SOURCE}) · 60.3 s"],
        ["0", "fixture", "must miss", "0 miss", "PASS", "", "—", "same"],
    ]
    assert ["3", "fixture", "hit or miss", "1488 reuse, external", "PASS", "", "EXACT", "same"] in rows
    assert ["3", "fixture", "hit or miss", "992 reuse, local", "PASS", "", "EXACT", "same"] in rows
    assert "every request gave the plain baseline&#39;s tokens · preemptions 0 · 66.3 s</p>" in html
    assert (
        '<p id="scenarios-note">Scenarios&#39; acceptance.matched = false (unchecked: ExampleConnector a-b-a PASS; '
        "native a-b-a PASS).</p>" in html
    )
    section = _section(format_issue_md(data), "#### Scenarios")
    assert html_tables(section)[0][1:] == [
        ["a-b-a", "ExampleConnector", "PASS", "EXACT", "0", "—"],
        ["a-b-a", "native prefix caching", "PASS", "EXACT", "0", "—"],
    ]
    assert "**a-b-a ·" not in section  # no finding in a clean run
    marks = {r["name"]: r.get("scenarios") for r in status.arm_rows(data)}
    assert marks == {"baseline": None, "ExampleConnector": {"a-b-a": {"verdict": "PASS", "kv": "EXACT"}},
                     "native": {"a-b-a": {"verdict": "PASS", "kv": "EXACT"}}}  # fmt: skip


# --- in a real browser: every column shows at 1280 px, and a phone scrolls the table, not the page -------

SCENARIO_JS = """(() => ({
  tables: [...document.querySelectorAll('table.scn')].map(t => {
    const box = t.closest('.scroll');
    return {id: t.id, width: Math.round(t.getBoundingClientRect().width), box: box.clientWidth};
  }),
  rows: [...document.querySelectorAll('#scn-s1 tr')].map(tr => [...tr.children].map(c => c.innerText.trim())),
  loud: getComputedStyle(document.querySelector('#s1 .control-loud')).backgroundColor,
  badge: getComputedStyle(document.querySelector('#scn-s1 .cond-q')).backgroundColor,
  scrollWidth: document.documentElement.scrollWidth, clientWidth: document.documentElement.clientWidth,
}))()"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (CI installs Debian's package)")
@pytest.mark.parametrize("width, mobile", [(1280, False), (390, True)])
def test_the_scenarios_section_in_chromium(browser, tmp_path_factory, width, mobile):  # noqa: F811 - the fixture
    site = render_reports(tmp_path_factory, "scn", {"scn": scenario_report()})
    url = (site / "scn.html").as_uri()
    assert browser.load(url, width, 844, mobile=mobile) == [url]  # nothing else is fetched
    got = browser.evaluate(SCENARIO_JS)
    browser.call("Runtime.evaluate", {"expression": "document.getElementById('scenarios').scrollIntoView()"})
    browser.screenshot(ARTIFACTS / f"site-scenarios-{width}.png", full_page=False)
    assert [t["id"] for t in got["tables"]] == ["scn-s0", "scn-s1", "scn-s2"]
    if width == 1280:
        assert [t for t in got["tables"] if t["width"] > t["box"] + 1] == []  # every column shows
    assert got["scrollWidth"] <= got["clientWidth"] + 1  # the page itself never scrolls sideways
    assert ["1", "chat-512", "must reuse", "496 reuse, external", "FAIL", "@2 (decisive, gap 9.219 nats)",
            "CORRUPT: blocks 0–15 (tokens 0–255), K+V, layers 0–3", "differs"] in got["rows"]  # fmt: skip
    assert got["loud"] not in ("rgba(0, 0, 0, 0)", "") and got["badge"] not in ("rgba(0, 0, 0, 0)", "")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (CI installs Debian's package)")
def test_the_matrix_page_with_scenario_columns_in_chromium(browser, tmp_path):  # noqa: F811 - the fixture
    summary = _matrix(_cell("scn", scenario_report()), _cell("plain", without_scenarios(scenario_report())),
                      _cell("lost", None))  # fmt: skip
    page = tmp_path / "m.html"
    page.write_text(render_matrix_page(summary, cells_dir="m/site"), encoding="utf-8")
    assert browser.load(page.as_uri(), 1280) == [page.as_uri()]
    got = browser.evaluate(FIT_JS)
    browser.screenshot(ARTIFACTS / "matrix-scenarios-1280.png")
    assert [t for t in got["tables"] if t["width"] > t["box"] + 1] == []  # every column shows at 1280 px
    assert got["scrollWidth"] <= got["clientWidth"]
    assert "scenario in-flight" in got["text"] and "schedule-numerics" in got["text"]


def test_a_reuse_that_differs_from_a_clean_control_is_never_shown_as_the_controls():
    """The report's per-request `control_matches` is the producer's: whether the cache-off control gave the
    plain baseline's tokens there (repro.judge.scenario_verdict reads it so). On the H200's in-flight run LMCacheConnectorV1's
    reuses differ from the baseline @0 while the control matched it: the views must say the control was clean,
    not 'as the cache-off control' (which they said when they took the field for 'same tokens as the control')."""
    path = ROOT / "reports" / "conditions" / "h200-conditions-tiny-scenarios-v028.json"
    committed_or_skip(path)
    report = read_report(path)
    inflight = next(s for s in report.scenarios if s.name == "in-flight")
    failed = [r for r in inflight.arm("LMCacheConnectorV1").requests if r.first_diff is not None]
    assert len(failed) == 4 and all(r.data["control_matches"] is True for r in failed)
    assert {r.control_cell for r in failed} == {"differs"}
    assert {r.control_text for r in failed} == {"the cache-off control gave the plain baseline's tokens"}
    clean = [r for r in inflight.arm("LMCacheMPConnector").requests]
    assert {r.control_cell for r in clean} == {"same"} and {r.control_text for r in clean} == {
        "as the cache-off control"
    }


def test_a_load_that_vllms_hit_counter_leaves_out_is_said_beside_the_verdict():
    """vLLM 0.28.0 records a request's cached tokens at its first schedule only (scheduler.py: 'Track first
    scheduled prefill, not post-preemption repeat prefills'). On the H200 (preemption-sync), LMCacheConnectorV1
    reloaded 256 tokens of chat-511 when it resumed after a preemption in the cold step: vLLM's counter said 0
    cached, LMCache's own count 256. The line, the issue and the page say so; the last prompt token that vLLM
    never counts (512 against 511) is no disagreement, and nothing is said without LMCache's count."""
    report = scenario_report()
    planted = report["scenarios"][1]["arms"][0]["requests"]  # in-flight, PlantedFault
    cold = planted[0]  # step 0 chat-511, 0 cached
    cold.update(verdict="FAIL", first_diff=5, preemptions=1, kv_transfer_params={"num_lmcache_cached_tokens": 256})
    cold["reasons"] = ["differs from baseline @5 in a call where the engine preempted requests"]
    planted[5]["kv_transfer_params"] = {"num_lmcache_cached_tokens": 513}  # 512 cached: the last token only
    planted[4]["kv_transfer_params"] = {"num_lmcache_cached_tokens": 512}  # 496 cached, no preemption
    validate_report(report)
    requests = as_report(report).scenarios[1].arms[0].requests
    said = (
        "LMCache reported 256 hit tokens where vLLM counted 0 cached: a load vLLM's counter leaves out (vLLM "
        "records a request's cached tokens at its first schedule, not when it resumes after a preemption)"
    )
    assert requests[0].connector_hit_tokens == 256 and requests[0].counter_note == said
    assert requests[0].line.endswith(" · " + said)
    assert requests[4].counter_note == "LMCache reported 512 hit tokens where vLLM counted 496 cached"
    assert requests[5].counter_note == "" and requests[1].counter_note == ""  # 513 vs 512; no count at all
    assert requests[1].connector_hit_tokens is None
    assert said in format_summary(report)
    assert f"  - {said}" in _section(format_issue_md(report), "#### Scenarios")
    rows = cell_rows(render_report_page(report, stem="r"), "scn-s1")  # in-flight: the note in the hit cell
    assert rows[5][:5] == ["0", "chat-511", "must miss", f"0 miss{said}", "FAIL"]
    assert rows[6][:4] == ["0", "chat-512", "must miss", "0 miss"]
