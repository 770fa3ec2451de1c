"""The published H200 reports under reports/ load, and show what the GPU issue promised."""

import json
from pathlib import Path

import pytest

from repro.record.report import load_report

REPORTS = Path(__file__).resolve().parent.parent / "reports"
# An unpacked kit (make kit) carries the reports under evidence/, not reports/, and has no .git.
pytestmark = pytest.mark.skipif(
    not (REPORTS / "h200-lmcache-tiny.json").exists() and not (REPORTS.parent / ".git").exists(),
    reason="the published reports are not in this tree (an unpacked kit)",
)


def _arms(name):
    return {a["name"]: a for a in load_report(REPORTS / name)["arms"]}


def test_h200_lmcache_fails_with_hits_and_first_diffs_native_passes():
    data = load_report(REPORTS / "h200-lmcache-tiny.json")
    arms = {a["name"]: a for a in data["arms"]}
    lmc, native = arms["LMCacheConnectorV1"], arms["native"]
    assert lmc["verdict"] == "FAIL" and native["verdict"] == "PASS"
    failed = [p for p in lmc["probes"] if p["verdict"] == "FAIL"]
    assert {p["name"] for p in failed} == {"chat-511", "chat-513"}
    for p in failed:
        assert p["requests"][0]["cached_tokens"] == 0
        assert all(r["cached_tokens"] > 0 and isinstance(r["first_diff"], int) for r in p["requests"][1:])
    assert [r["cached_tokens"] for p in native["probes"] for r in p["requests"]] == [
        0,
        1488,
        1488,
        1488,
        0,
        496,
        0,
        496,
        0,
        512,
    ]
    prov = data["provenance"]
    assert prov["hardware"]["gpus"] == ["NVIDIA H200"] and prov["hardware"]["driver"].startswith("580.")
    assert prov["hardware"]["cuda_driver_api"] == "13.0"
    assert prov["engine_versions"]["vllm"] == "0.26.0" and prov["engine_versions"]["lmcache"] == "0.5.4"
    assert lmc["lmcache"]["cuda_ops"].startswith("not loaded")
    assert lmc["lmcache"]["double_unpin_warnings"] == 20
    for arm in data["arms"]:
        assert (REPORTS / arm["log"]).is_file()


def test_h200_degraded_lmcache_start_is_an_error():
    arm = _arms("h200-lmcache-degraded.json")["LMCacheConnectorV1"]
    assert arm["verdict"] == "ERROR" and arm["error"]["kind"] == "lmcache-degraded"


@pytest.mark.parametrize("name", ["h200-lmcache-tiny.json", "h200-lmcache-degraded.json"])
def test_published_reports_match_the_schema(name):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPORTS.parent / "schemas" / "report.schema.json").read_text())
    jsonschema.validate(json.loads((REPORTS / name).read_text()), schema)
