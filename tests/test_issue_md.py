"""Issue Markdown: a correct GitHub table, the sections a maintainer needs, and the size cap."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from html.parser import HTMLParser

import markdown
import pytest
from conftest import ROOT

from repro.errors import UsageError
from repro.publish.issue_md import GITHUB_BODY_LIMIT, format_issue_md, format_table
from repro.report import CLAIM_LINE

SAMPLE = ROOT / "tests" / "data" / "kit-sample-report.json"


def load_sample() -> dict:
    return json.loads(SAMPLE.read_text(encoding="utf-8"))


class TableParser(HTMLParser):
    """The cells of every <table>, row by row, as text."""

    def __init__(self):
        super().__init__()
        self.tables, self._cell = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append(self._cell.strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def html_tables(md_text: str) -> list[list[list[str]]]:
    parser = TableParser()
    parser.feed(markdown.markdown(md_text, extensions=["tables"]))
    return parser.tables


def test_markdown_renders_the_verdict_table():
    body = format_issue_md(load_sample())
    tables = html_tables(body)
    assert len(tables) == 1
    header, *rows = tables[0]
    assert header == ["arm", "probe", "tokens", "cached", "verdict", "first diffs"]
    assert len(rows) == 12  # three arms × four probes; the passing baseline is not a row
    assert all(len(r) == 6 for r in rows)
    planted = "PlantedFault (PlantedFaultConnector)"
    assert [planted, "fixture", "1502", "0→1488×3", "FAIL", "@9 (decisive ×3, gap 0.682 nats)"] in rows
    assert [planted, "chat-513", "513", "0→512", "FAIL", "@2 (decisive, gap 7.606 nats)"] in rows
    assert ["native prefix caching", "fixture", "1502", "0→1488×3", "PASS", ""] in rows
    assert ["ExampleConnector", "chat-513", "", "—", "SKIPPED", ""] in rows


def test_title_is_hardware_kit_commit_and_date():
    # The commit as every view shows it (display.commit_label): a probe's failure is spelled out, not "unknown commit".
    title = "### KV-cache reuse verification: CPU Intel(R) Xeon(R) Processor · kvkit {} · 2026-11-29\n"
    report = load_sample()
    assert format_issue_md(report).startswith(title.format("unavailable: git exited 128 (dirty: unknown)"))
    report["provenance"]["kit"] = {"commit": "0123456789abcdef0123456789abcdef01234567", "dirty": True}
    assert format_issue_md(report).startswith(title.format("0123456789ab+dirty"))


def test_sections_a_maintainer_needs():
    body = format_issue_md(load_sample())
    assert body.rstrip().endswith(f"`{CLAIM_LINE}`")
    assert "vllm 0.28.0" in body and "torch 2.13.0+cpu" in body  # stack versions
    assert "CPU Intel(R) Xeon(R) Processor" in body and "cpu_count 2" in body  # hardware
    assert "python -m repro.verify_kv_reuse --model .cache/models/tiny" in body  # reproduce command
    assert "first diff @9" in body and "baseline margin 0.682 nats" in body and "reuse margin 5.998" in body
    assert "`210 192 179 249 231 61 123 311 219 152 229 43 73 285 250 130`" in body  # baseline tokens
    assert "In connector.start_load_kv, but the attn_metadata is None" in body and "ExampleConnector ×8" in body
    assert "acceptance.matched = true" in body


def test_double_unpin_count_is_a_warning():
    report = load_sample()
    planted = next(a for a in report["arms"] if a["name"] == "PlantedFault")
    planted["lmcache"] = {"double_unpin": 7, "hits": 3, "nested": {"ignored": 1}}
    body = format_issue_md(report)
    assert "- PlantedFault (PlantedFaultConnector) · LMCache double_unpin: 7" in body
    assert body.index("double_unpin") < body.index("LMCache hits: 3")


def test_pipes_cannot_break_the_table():
    report = load_sample()
    report["arms"][1]["probes"][0]["name"] = "a|b"
    _header, *rows = html_tables(format_table(report))[0]
    assert rows[0][:2] == ["ExampleConnector", "a|b"] and len(rows[0]) == 6


def huge_report() -> dict:
    report = load_sample()
    planted = next(a for a in report["arms"] if a["name"] == "PlantedFault")
    long_ids = list(range(5000))
    for p in planted["probes"]:
        for r in p["requests"][1:]:
            r["token_ids"] = long_ids
    planted["probes"] = [copy.deepcopy(p) | {"name": f"{p['name']}-{i}"} for i in range(30) for p in planted["probes"]]
    return report


def test_token_lists_shrink_to_fit_with_a_note():
    body = format_issue_md(huge_report())
    assert len(body) <= GITHUB_BODY_LIMIT
    assert "truncated to fit" in body or "left out to fit" in body
    assert body.rstrip().endswith(f"`{CLAIM_LINE}`")
    assert html_tables(body)[0][0][0] == "arm"


def test_hard_cap_closes_code_and_keeps_the_claim_line():
    report = huge_report()
    report["provenance"]["argv"] = ["--x"] * 40000  # a reproduce command alone over the limit
    body = format_issue_md(report, limit=20_000)
    assert len(body) <= 20_000
    assert "truncated to fit GitHub's 65536-character limit" in body
    assert body.count("```") % 2 == 0
    assert body.rstrip().endswith(f"`{CLAIM_LINE}`")


def test_cli_writes_the_file(tmp_path):
    from repro.publish.issue_md import main

    out = tmp_path / "issue.md"
    assert main([str(SAMPLE), "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == format_issue_md(load_sample())
    with pytest.raises(UsageError, match="cannot read"):
        main([str(tmp_path / "missing.json")])


def run_repro(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, "-m", "repro", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(
    "args",
    [
        ("issue-md",),  # the report argument is missing
        ("issue-md", "tests/data/no-such-report.json"),
        ("site", "--bogus"),
        ("site", "--reports", "tests/data/no-such-dir"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(args, tmp_path):
    proc = run_repro(*args, *(["--out", str(tmp_path / "out")] if args[0] == "site" else []))
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert not (tmp_path / "out").exists()
