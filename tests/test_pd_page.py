"""The P→D report on the site: `python -m repro site` renders a kvkit-pd-report one folder down (repro.disagg.page via
repro.publish.catalog) with its writeup, every request's transfer, the controls, and no machine path."""

from __future__ import annotations

from pathlib import Path

from pd_fakes import foreign_blocks_pair, transferring_pair

from repro.disagg import report as pd_report
from repro.disagg.cases import load_cases
from repro.disagg.pair import run_cases
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
    assert "controls 3 of 3 held" in index  # one trial: the consumed, the stale and the out-of-range reference
