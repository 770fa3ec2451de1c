"""The migration of a version 2 report to version 3 (python -m repro compact-report, repro.record.compact): lossless,
strict about what it reads, and invisible on every page: a committed report compacted renders byte for byte as
the report itself."""

from __future__ import annotations

import json

import pytest
from kvkit_testutil import ROOT, committed_or_skip

from repro.commands import main as repro_main
from repro.errors import EXIT_OK, EXIT_USAGE, UsageError
from repro.judge.kv_grid import dense_planes
from repro.publish.issue_md import format_issue_md
from repro.publish.site import render_report_page
from repro.publish.summary import format_summary
from repro.record.atomic import dumps_json
from repro.record.compact import compact_report
from repro.record.report import REPORT_SCHEMA_VERSION, load_report

DATA = ROOT / "tests" / "data"
V2_EXAMPLE = DATA / "report-v2-example.json"
# The report the kit could barely carry (issue 35, item 7): SmolLM2 on the H200, 30 layers, LMCacheConnectorV1's
# corrupt reuses beside three arms of exact ones.
# a committed version 2 report with a KV finding in every probe (the SmolLM2 ones are committed compacted: over 1 MiB
# in version 2)
V1_FINDING = ROOT / "reports" / "h200-kvaudit-lmcache-0.5.4.json"


def _planes(report: dict) -> list:
    return [(r.get("kv_audit") or {}).get("planes") for a in report["arms"] for p in a["probes"] for r in p["requests"]]


def test_the_command_writes_version_3_that_reads_back_as_the_original(tmp_path, capsys):
    out = tmp_path / "compact.json"
    assert repro_main(["compact-report", str(V2_EXAMPLE), str(out)]) == EXIT_OK
    assert f"schema_version {REPORT_SCHEMA_VERSION}" in capsys.readouterr().err
    old, new = load_report(V2_EXAMPLE), load_report(out)
    assert (new["schema_version"], new["migrated_from"]) == (3, 2)
    assert out.stat().st_size < V2_EXAMPLE.stat().st_size
    assert [dense_planes(p) if p else p for p in _planes(new)] == _planes(old)
    strip = {"schema_version", "migrated_from"}
    for report in (old, new):  # every other field as it was
        for a in report["arms"]:
            for p in a["probes"]:
                for r in p["requests"]:
                    (r.get("kv_audit") or {}).pop("planes", None)
    assert {k: v for k, v in old.items() if k not in strip} == {k: v for k, v in new.items() if k not in strip}
    assert out.read_text().endswith("}\n") and not list(tmp_path.glob(".*.tmp"))  # the one writer: no temp left


@pytest.mark.parametrize("name, why", [("report-v1-example.json", "version 1 has no KV grid"), (None, "already")])
def test_a_version_1_or_3_report_is_refused_in_one_line(tmp_path, capsys, name, why):
    src = DATA / name if name else tmp_path / "v3.json"
    if name is None:
        src.write_text(dumps_json(compact_report(load_report(V2_EXAMPLE))))
    out = tmp_path / "out.json"
    assert repro_main(["compact-report", str(src), str(out)]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and why in err[0] and not out.exists()


def test_a_malformed_version_2_grid_is_not_compacted():
    bad = json.loads(V2_EXAMPLE.read_text())
    audit = next(p for p in _planes(bad) if p)
    audit["K"]["rel"] = audit["K"]["rel"][:1]
    with pytest.raises(UsageError, match="KV audit is malformed, so it is not compacted"):
        compact_report(bad)


@pytest.mark.parametrize("path", [V2_EXAMPLE, V1_FINDING], ids=lambda p: p.name)
def test_a_compacted_report_renders_byte_for_byte_as_the_original(path):
    committed_or_skip(path)
    original = load_report(path)
    compacted = compact_report(original)
    assert len(dumps_json(compacted)) < len(dumps_json(original))
    assert render_report_page(compacted, stem="r") == render_report_page(original, stem="r")
    assert format_issue_md(compacted) == format_issue_md(original)
    assert format_summary(compacted) == format_summary(original)
