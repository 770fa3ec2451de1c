"""The conditions a verdict was measured under (issue 18) in every view: the text summary, the report
page and the index, the issue Markdown and the matrix. The sample is the render self-test with the
optional keys added here; a report without them renders as it always did (the gold files pin that)."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
from conftest import ROOT
from test_render import Page

from repro.matrix import status
from repro.matrix.page import render_matrix_page
from repro.publish.issue_md import format_issue_md
from repro.publish.site import render_index, render_report_page
from repro.publish.site_index import build_index_row
from repro.publish.summary import format_summary
from repro.readmodel import Arm, as_report

DATA = ROOT / "tests" / "data"
PROBES = ("fixture", "chat-511", "chat-512", "chat-513")
CONTENTION = "contention-dependent"


def _run(trial: int, diffs: dict[str, int], shared: bool = True) -> dict:
    """One trial of an arm as the report keeps it: the probes in diffs FAILed at that index."""
    probes = [
        {
            "name": name,
            "verdict": "FAIL" if name in diffs else "PASS",
            "first_diffs": [None] + [diffs.get(name)] * 3,
            "cached_tokens": [0, 256, 256, 256],
            "kv": None,
        }
        for name in PROBES
    ]
    verdict = "FAIL" if diffs else "PASS"
    return {"trial": trial, "verdict": verdict, "error": None, "wall_s": 61.2, "shared": shared, "probes": probes}


def _rate(probe: str, failed: int) -> dict:
    cls = "none" if not failed else "every trial" if failed == 5 else "intermittent"
    return {"probe": probe, "failed": failed, "kv_corrupt": 0, "of": 5, "class": cls}


def sample() -> dict:
    """The render self-test, run with --trials 5 beside a gpu-load: PlantedFault shared GPU 0 and failed
    (chat-511 in 3 of 5 trials), and was clean when re-run alone; ExampleConnector ran alone."""
    report = json.loads((DATA / "render-selftest.json").read_text(encoding="utf-8"))
    load = {"gpu": "0", "name": "NVIDIA H200", "n": 8192, "dtype": "float16", "iterations": 1234, "tflops": 610.0}
    gpu_load = {"gpus": ["0"], "devices": [load], "started_s": 3.1, "ended_s": 180.2, "state": "running"}
    report["conditions"] = {"trials": 5, "confirm": True, "lmcache_ops": "auto", "gpu_load": gpu_load}
    report["provenance"]["lmcache_ops"] = {
        "mode": "auto",
        "path": "compiled",
        "source": "wheel",
        "lmcache": "0.5.4",
        "torch": "2.13.0+cu130",
        "arch": "9.0",
        "build_dir": None,
        "manifest": None,
        "wheel_import_error": None,
        "detail": "the installed wheel's lmcache/cuda_ops.so",
    }
    arms = {a["name"]: a for a in report["arms"]}
    for arm in report["arms"]:
        arm["gpu"] = {"visible": "0", "name": "NVIDIA H200", "compute_capability": "9.0"}
    planted = arms["PlantedFault"]
    planted["sharing"] = {
        "resource": "GPU 0",
        "window_s": [3.0, 64.3],
        "shared": True,
        "others": [
            {"process": "LMCache MP server of PlantedFault", "kind": "lmcache-server", "overlap_s": 61.0, "own": True},
            {"process": "gpu-load", "kind": "gpu-load", "overlap_s": 55.0},
            {"process": "arm native", "kind": "arm", "overlap_s": 40.1},
            {"process": "arm baseline", "kind": "arm", "overlap_s": 38.0},
        ],
    }
    planted["copy_paths"] = [
        {"process": "engine", "path": "compiled", "source": "wheel", "detail": "lmcache.c_ops loaded"},
        {"process": "MP server", "path": "fallback", "source": None, "detail": "c_ops not importable"},
    ]
    always = {"fixture": 4, "chat-512": 0, "chat-513": 2}
    runs = [_run(t, always | ({"chat-511": 6 + (t == 3)} if t <= 3 else {})) for t in range(1, 6)]
    rates = [_rate("fixture", 5), _rate("chat-511", 3), _rate("chat-512", 5), _rate("chat-513", 5)]
    planted["trials"] = {"n": 5, "runs": runs, "rates": rates, "class": "intermittent"}
    planted["confirmation"] = {
        "status": "ran",
        "why": "shared GPU 0 with arm native (40.1 s), arm baseline (38.0 s)",
        "run": _run(None, {}, shared=False),
        "class": CONTENTION,
        "reason": "alone: PASS 4/4 (the FAIL @0 on chat-511 needed the shared GPU)",
    }
    example = arms["ExampleConnector"]
    example["sharing"] = {"resource": "GPU 0", "window_s": [3.0, 50.0], "shared": False, "others": []}
    example["confirmation"] = {"status": "not needed", "why": "no finding", "run": None, "class": None, "reason": None}
    return report


def _arm(report: dict, name: str) -> dict:
    return next(a for a in report["arms"] if a["name"] == name)


def _read(arm: dict) -> Arm:
    """The read model's record of an arm dict these tests build."""
    return Arm.from_json(arm, None)


def _read(arm: dict) -> Arm:
    """The read model's record of an arm dict these tests build."""
    return Arm.from_json(arm, None)


def _page(report: dict) -> str:
    return render_report_page(report, stem="s", writeup=None, log_hrefs={})


# --- repro.readmodel: the facts every view shares ---


def test_read_model_texts():
    planted, example = _arm(sample(), "PlantedFault"), _arm(sample(), "ExampleConnector")
    assert _read(planted).conditions.copy_path_text == "engine compiled (wheel), MP server fallback"
    assert _read(planted).conditions.gpu_text == "NVIDIA H200 (GPU 0, compute capability 9.0)"
    assert _read(planted).conditions.sharing_text == "shared GPU 0 with 2 arms and the gpu-load (max overlap 55 s)"
    assert _read(example).conditions.sharing_text == "alone on GPU 0"
    assert "LMCache MP server of PlantedFault: 61 s (the arm's own)" in _read(planted).conditions.sharing_overlaps
    assert _read(planted).conditions.trial_rate_text.split("; ")[1] == "chat-511 FAIL 3/5 intermittent"
    assert _read(planted).conditions.confirmation_text == "re-run alone: PASS → contention-dependent"
    assert _read(example).conditions.confirmation_text == "re-run alone: not needed (no finding)"
    assert (
        _read(planted)
        .conditions.trial_diffs_text("chat-511")
        .startswith("#1 FAIL @6 (shared) · #2 FAIL @6 (shared) · #3 FAIL @7")
    )
    marks = _read(planted).marks(_read(planted).probes[1])
    assert [(m.text, m.qualifies) for m in marks] == [("intermittent 3/5", True), (CONTENTION, True)]
    assert _read(planted).verdict_text.startswith("FAIL (decisive: 6) · findings in 5/5 trials · contention-dependent")


def test_own_server_alone_the_cpu_and_a_deterministic_finding():
    arm = _arm(sample(), "PlantedFault")
    arm["sharing"] = {
        "resource": "CPU cores",
        "window_s": [0, 9],
        "shared": False,
        "others": arm["sharing"]["others"][:1],
    }
    arm["gpu"] = None
    arm["confirmation"]["class"] = "deterministic"
    del arm["trials"]
    assert _read(arm).conditions.sharing_text == "alone on CPU cores" and _read(arm).conditions.gpu_text == "CPU"
    assert [(m.text, m.qualifies) for m in _read(arm).marks(_read(arm).probes[0])] == [("deterministic", False)]
    assert not _read(arm).conditions.qualified


def test_an_intermittent_kv_finding_qualifies_a_pass():
    arm = copy.deepcopy(_arm(sample(), "ExampleConnector"))
    arm["probes"][0]["kv"] = {"verdict": "CORRUPT"}
    runs = [_run(1, {}), _run(2, {})]
    runs[1]["probes"][0]["kv"] = "CORRUPT"
    rate = {"probe": "fixture", "failed": 0, "kv_corrupt": 1, "of": 2, "class": "intermittent"}
    arm["trials"] = {"n": 2, "runs": runs, "rates": [rate], "class": "intermittent"}
    assert _read(arm).marks_text(_read(arm).probes[0]) == "intermittent 1/2"
    assert _read(arm).verdict_text == "PASS · intermittent: findings in 1/2 trials" and _read(arm).conditions.qualified


def test_copy_paths_are_read_from_the_lmcache_signals_too():
    arm = _arm(sample(), "PlantedFault")
    arm["lmcache"] = {"copy_paths": arm.pop("copy_paths")}
    assert _read(arm).conditions.copy_path_text == "engine compiled (wheel), MP server fallback"


# --- the views ---


def test_summary_shows_each_condition():
    text = format_summary(sample())
    lines = text.splitlines()
    assert lines[3].startswith(  # after the headline sentence, the hardware line and the exit line
        "conditions: trials 5 · re-run alone on · lmcache-ops auto (path compiled, wheel, LMCache 0.5.4, torch 2.13.0+cu130"
    )
    assert "gpu-load on GPU 0: NVIDIA H200 float16 n 8192, 1234 iterations, 610 TFLOPS; 3.1–180.2 s" in lines[3]
    head = lines.index(next(line for line in lines if line.startswith("PlantedFault")))
    assert CONTENTION in lines[head]
    assert lines[head + 1] == "  copy path: engine compiled (wheel), MP server fallback"
    assert "shared GPU 0 with 2 arms and the gpu-load (max overlap 55 s)" in lines[head + 2]
    assert "chat-511 FAIL 3/5 intermittent" in lines[head + 3] and lines[head + 3].startswith("  trials: ")
    assert lines[head + 4].startswith("  re-run alone: PASS → contention-dependent — ran because shared GPU 0")
    assert "  NVIDIA H200 (GPU 0, compute capability 9.0) · alone on GPU 0" in lines


def test_summary_without_the_keys_is_unchanged():
    plain = json.loads((DATA / "render-selftest.json").read_text(encoding="utf-8"))
    text = format_summary(plain)
    for word in ("conditions:", "copy path", "re-run alone", "trials:", "GPU 0"):
        assert word not in text
    with_keys = format_summary(sample()).splitlines()[1:]  # the headline sentence says the conditions its own way
    added = [line for line in with_keys if line not in text.splitlines()]
    assert len(added) == 9 and all(line.startswith(("conditions:", "  ", "PlantedFault")) for line in added)


def test_report_page_conditions_section():
    html = _page(sample())
    page = Page(html)
    assert '<h2 id="conditions">Conditions</h2>' in html and html.index('id="conditions"') < html.index('id="details"')
    arms = {row[0]: row for row in page.rows["conditions-arms"][1:]}
    planted = arms["PlantedFault (PlantedFaultConnector)"]
    assert planted[1] == "NVIDIA H200 (GPU 0, compute capability 9.0)"
    assert planted[2].startswith("shared GPU 0 with 2 arms and the gpu-load (max overlap 55 s) (3–64.3 s into the run)")
    assert "arm native: 40.1 s" in planted[2] and "(the arm's own)" in planted[2]
    assert (
        planted[3].startswith("engine: compiled (wheel) lmcache.c_ops loaded") and "c_ops not importable" in planted[3]
    )
    assert (
        'engine: <strong>compiled</strong> (wheel) <span class="muted">lmcache.c_ops loaded</span><br>MP server: '
        in html
    )
    assert arms["ExampleConnector"][2].startswith("alone on GPU 0")
    run = dict(r for r in page.rows["kv"] if len(r) == 2)
    assert run["trials"] == "5" and run["gpu-load"].startswith("on GPU 0: NVIDIA H200") and run["re-run alone"] == "on"
    rates = [r for r in page.rows["conditions"] if r and r[0] == "chat-511"]
    assert rates == [["chat-511", "FAIL 3/5", "intermittent", rates[0][3]]]
    assert rates[0][3].startswith("#1 FAIL @6 (shared) · #2 FAIL @6 (shared) · #3 FAIL @7 (shared) · #4 PASS")
    assert "Re-run alone: PlantedFault (PlantedFaultConnector)</h3>" in html
    assert "re-run alone: PASS → contention-dependent" in html and "alone: PASS 4/4" in html


def test_verdict_table_marks_fail_cells_and_the_headline_warns():
    html = _page(sample())
    rows = {r[0]: r for r in Page(html).rows["cmp"] if len(r) > 3 and r[3].startswith("FAIL")}
    assert rows["chat-511"][3] == "FAIL intermittent 3/5 contention-dependent"
    assert rows["fixture"][3] == "FAIL 5/5 trials contention-dependent"
    assert (
        '<span class="cond">5/5 trials</span>' in html and '<span class="cond cond-q">intermittent 3/5</span>' in html
    )
    warning = html[html.index('id="conditions-warning"') : html.index('<h2 id="table"')]
    assert "PlantedFault (PlantedFaultConnector): FAIL" in warning and CONTENTION in warning
    header = next(r[0] for r in Page(html).rows["cmp"] if r[0].startswith("PlantedFault"))
    assert CONTENTION in header


def test_index_marks_the_qualified_verdict():
    html = render_index([build_index_row(sample(), stem="s", href="s.html")])
    assert '<span class="cond cond-q">findings in 5/5 trials · contention-dependent' in html and ".cond-q {" in html
    plain = json.loads((DATA / "render-selftest.json").read_text(encoding="utf-8"))
    assert "cond" not in render_index([build_index_row(plain, stem="s", href="s.html")])


def test_a_page_without_the_keys_has_no_trace_of_them():
    html = _page(json.loads((DATA / "render-selftest.json").read_text(encoding="utf-8")))
    assert "conditions" not in html and 'class="cond' not in html and ".cond" not in html


def test_issue_markdown_conditions_and_every_fail_claim_says_contention_dependent():
    body = format_issue_md(sample())
    section = body[body.index("#### Conditions") : body.index("#### What maintainers ask for")]
    assert "- **trials**: 5" in section and "- **gpu-load**: on GPU 0: NVIDIA H200" in section
    assert (
        "- **lmcache-ops**: auto (path compiled, wheel, LMCache 0.5.4, torch 2.13.0+cu130, sm 9.0; the installed wheel's lmcache/cuda_ops.so)"
        in section
    )
    assert "shared GPU 0 with 2 arms and the gpu-load (max overlap 55 s)" in section and "arm native: 40.1 s" in section
    assert "  - copy path, engine compiled (wheel): lmcache.c_ops loaded" in section
    assert "  - copy path, MP server fallback: c_ops not importable" in section
    assert "  - trials: fixture FAIL 5/5 every trial; chat-511 FAIL 3/5 intermittent" in section
    assert "  - re-run alone: PASS → contention-dependent (ran because shared GPU 0" in section
    header = next(line for line in body.splitlines() if line.startswith("| arm |"))
    assert header == "| arm | probe | tokens | cached | verdict | first diffs | trials | re-run alone |"
    row = next(line for line in body.splitlines() if line.startswith("| PlantedFault") and "chat-511" in line)
    assert "| FAIL (intermittent 3/5, contention-dependent) |" in row and row.endswith(
        "| FAIL 3/5 (intermittent) | PASS |"
    )
    assert body.index("**Read the verdicts with their conditions:**") < body.index("| arm |")
    claims = [line for line in body.splitlines() if "PlantedFault" in line and "FAIL" in line]
    assert claims and all(CONTENTION in line for line in claims)


def test_issue_markdown_without_the_keys_has_no_conditions():
    body = format_issue_md(json.loads((DATA / "render-selftest.json").read_text(encoding="utf-8")))
    assert "#### Conditions" not in body and "re-run alone" not in body and "Read the verdicts" not in body


def test_matrix_rows_carry_the_copy_path_and_the_class():
    rows = {r["name"]: r for r in status.arm_rows(sample())}
    planted = rows["PlantedFault"]
    assert planted["copy_path"] == "engine compiled (wheel), MP server fallback" and CONTENTION in planted["class"]
    assert planted["probes"]["chat-511"]["conditions"] == "intermittent 3/5, contention-dependent"
    assert "copy_path" not in rows["native"] and "conditions" not in rows["native"]["probes"]["fixture"]
    plain = json.loads((DATA / "render-selftest.json").read_text(encoding="utf-8"))
    assert all(set(r) == {"name", "mode", "verdict", "probes"} for r in status.arm_rows(plain))
    cell = {"name": "c", "environment": "h200", "connector": None, "model": None, "fixture": None, "seed": 0,
            "flags": [], "status": "done", "error": None, "page": "c.html", "versions": {}, "hardware": None,
            "arms": list(rows.values())}  # fmt: skip
    summary = {
        "name": "m",
        "cells": [cell],
        "probes": list(PROBES),
        "started_utc": "2026-01-02T00:00:00Z",
        "cluster": {},
    }
    html = render_matrix_page(summary, cells_dir="m/site")
    assert '<td class="note"><div>PlantedFault: engine compiled (wheel), MP server fallback</div></td>' in html
    assert f'<span class="muted setup">PlantedFault: {planted["class"]}</span>' in html
    assert "FAIL</span> · decisive · <em>intermittent 3/5, contention-dependent</em></div>" in html


def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / "report.schema.json").read_text()))


def test_the_schema_takes_the_keys_and_types_them():
    validator = _validator()
    report = sample()
    assert not list(validator.iter_errors(report))
    for where, key, bad in (
        ("PlantedFault", "confirmation", {"class": "flaky"}),
        ("PlantedFault", "trials", {"class": "sometimes"}),
        ("PlantedFault", "sharing", {"shared": "yes"}),
        ("PlantedFault", "gpu", {"name": 3}),
    ):
        broken = copy.deepcopy(report)
        _arm(broken, where)[key].update(bad)
        assert list(validator.iter_errors(broken)), (key, bad)
    broken = copy.deepcopy(report)
    _arm(broken, "PlantedFault")["copy_paths"][0]["path"] = "maybe"
    assert list(validator.iter_errors(broken))
    broken["conditions"]["lmcache_ops"] = "sometimes"
    assert list(validator.iter_errors(broken))


def test_a_gpu_load_that_died_and_loads_on_two_gpus():
    report = sample()
    load = report["conditions"]["gpu_load"]
    load["gpus"] = ["0", "1"]
    load["devices"].append(dict(load["devices"][0], gpu="1", iterations=None, tflops=None))
    load["failure"] = {"kind": "gpu-load-died", "detail": "exited while the arms ran (exit 1)"}
    assert not list(_validator().iter_errors(report))
    assert as_report(report).run_conditions.gpu_load_text == (
        "on GPU 0, 1: GPU 0: NVIDIA H200 float16 n 8192, 1234 iterations, 610 TFLOPS; "
        "GPU 1: NVIDIA H200 float16 n 8192, ? iterations; 3.1–180.2 s into the run; "
        "gpu-load-died: exited while the arms ran (exit 1)"
    )


@pytest.mark.parametrize("name", ["report-v1-example.json", "report-v2-example.json", "render-selftest.json"])
def test_every_kept_report_still_matches_the_schema(name):
    assert not list(_validator().iter_errors(json.loads((DATA / name).read_text(encoding="utf-8"))))
