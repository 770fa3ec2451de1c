"""The P→D report on the site: `python -m repro site` renders a kvkit-pd-report one folder down (repro.disagg.page via
repro.publish.catalog) with its writeup, every request's transfer, the controls, and no machine path."""

from __future__ import annotations

from pathlib import Path

from pd_fakes import foreign_blocks_pair, transferring_pair

from repro.disagg import report as pd_report
from repro.disagg.cases import load_cases
from repro.disagg.pair import run_cases
from repro.publish.catalog import render_catalog
from repro.publish.site import render_site

ROOT = Path(__file__).resolve().parents[1]
GPU_CASES = ROOT / "fixtures" / "pd" / "cases-gpu.json"


def _write(folder: Path, name: str, pair, writeup: str | None = None) -> dict:
    cases = load_cases(GPU_CASES)
    run = run_cases(pair(cases.block_size), cases)
    settings = {"trials": 1, "model": "/tmp/models/secret-folder/kvkit-tiny", "dtype": "float16"}
    prov = {"packages": {"vllm": "0.26.0", "nixl": "1.2.0"}, "hardware": {"gpus": ["NVIDIA H200"]},
            "started_utc": "2026-12-03T17:16:07Z", "kit": {"commit": "0123456789abcdef"}}  # fmt: skip
    report = pd_report.build_report(run, cases, settings, {"ports": {}}, prov)
    folder.mkdir(parents=True, exist_ok=True)
    pd_report.write_report(str(folder / f"{name}.json"), report)
    if writeup is not None:
        (folder / f"{name}.md").write_text(writeup, encoding="utf-8")
    return report


def test_the_site_renders_a_pd_report_with_its_transfers_controls_and_writeup(tmp_path):
    reports = tmp_path / "reports"
    _write(reports / "pd", "good", transferring_pair, "# What it found\n\n- every probe PASS\n")
    bad = _write(reports / "pd", "foreign", foreign_blocks_pair)
    written = render_site(reports, tmp_path / "site")
    pages = {p.relative_to(tmp_path / "site").as_posix() for p in written}
    assert {"pd/good.html", "pd/foreign.html", "index.html"} <= pages
    good = (tmp_path / "site" / "pd" / "good.html").read_text(encoding="utf-8")
    assert "P→D (NixlConnector) · kvkit-tiny" in good and "v-PASS" in good and "claim_eligible=false" in good
    assert "<li>every probe PASS</li>" in good  # the writeup beside the report
    assert ">1000<" in good and ">104<" in good and ">96<" in good  # external and local tokens per request
    assert "/tmp/models" not in good and "secret-folder" not in good  # the model is its folder's name only
    foreign = (tmp_path / "site" / "pd" / "foreign.html").read_text(encoding="utf-8")
    assert bad["verdict"] == "FAIL" and "v-FAIL" in foreign and "answers as" in foreign
    index = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert 'href="pd/good.html"' in index and 'href="pd/foreign.html"' in index
    assert (
        "negative controls held 3 of 3; exit 0" in index
    )  # one trial: the consumed, the stale and the out-of-range reference


def test_a_pd_report_is_a_row_of_the_index_table_with_its_stack_model_verdict_and_controls(tmp_path):
    reports = tmp_path / "reports"
    _write(reports / "pd", "good", transferring_pair)
    _write(reports / "pd", "foreign", foreign_blocks_pair)
    render_site(reports, tmp_path / "site")
    index = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    table = index.split('<table id="reports"', 1)[1].split("</table>", 1)[0]
    rows = table.split("<tr><td")[1:]
    good = next(r for r in rows if 'href="pd/good.html"' in r)
    # the terminal's sentence (repro.disagg.report.headline), through the one exit rule
    assert "P→D (NixlConnector, " in good and "kvkit-tiny): matched caching off token for token" in good
    assert "negative controls held 3 of 3; exit 0" in good
    assert "NixlConnector P→D&nbsp;" in good and "v-PASS" in good and 'vLLM <span class="mono">0.26.0' in good
    assert "NIXL 1.2.0" in good and "model kvkit-tiny" in good and "NVIDIA H200" in good
    # a control that held reads as a pass (its FAIL verdicts the ones a control must give), beside its verdicts
    assert "negative controls (" in good and "(verdicts " in good
    assert 'out-of-range-reference <span class="verdict v-PASS control" data-held="all">held 1 of 1</span>' in good
    assert "secret-folder" not in good
    foreign = next(r for r in rows if 'href="pd/foreign.html"' in r)
    assert "kvkit-tiny): answered differently" in foreign and "exit 1" in foreign
    more = index.split('id="more-reports"', 1)[1] if 'id="more-reports"' in index else ""
    assert "pd/good.html" not in more  # a row of the table, not a line under More reports


def test_the_committed_pd_reports_become_rows_as_they_ran(tmp_path):
    """reports/pd/*.json as the index shows them: the arm's verdict and every control case as it came out (the
    stale reference's 3 of 3 not held on both models, as the writeups say)."""
    reports = tmp_path / "reports"
    (reports / "pd").mkdir(parents=True)
    committed = sorted((ROOT / "reports" / "pd").glob("*.json"))
    assert [p.name for p in committed] == ["h200-pd-smollm2-v026.json", "h200-pd-tiny-v026.json"]
    for p in committed:
        (reports / "pd" / p.name).write_bytes(p.read_bytes())
    entries = [e for e in render_catalog(reports, tmp_path / "site", lambda path, data: None, lambda s, d: [])]
    rows = {e.row.stem: e.row for e in entries if e.row is not None}
    assert set(rows) == {"pd/h200-pd-smollm2-v026", "pd/h200-pd-tiny-v026"}
    for row in rows.values():
        # the probe requests PASS; a negative control not held is what the one exit rule counts (exit 1), said
        # beside the verdict and at the end of the headline, never a bare PASS
        assert [(v.arm, v.verdict, v.condition) for v in row.verdicts] == [
            ("NixlConnector P→D", "PASS", "exit 1: acceptance not matched")
        ]
        assert (row.vllm, row.hardware, row.acceptance) == ("0.26.0", "NVIDIA H200", "—")
        assert row.headline.endswith("negative controls held 3 of 6; exit 1: acceptance not matched")
        assert row.controls == (
            ("consumed-reference", "FAIL", "held 3 of 3"),
            ("stale-reference", "FAIL", "held 0 of 3"),
        )
        # the index shows the first as a pass (every trial held), the second not
        assert [(case, every) for case, _, every, _ in row.control_cells] == [
            ("consumed-reference", True),
            ("stale-reference", False),
        ]
    assert "model kvkit-tiny-qwen3-seed6" in rows["pd/h200-pd-tiny-v026"].stack_note
