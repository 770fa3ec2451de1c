"""repro_min.py from a committed report, without an engine (issue 35 item 6, issue 55): the SmolLM2 H200 finding's
reproducer is the fixed script (at most MAX_LINES lines, no report string and no path of any machine in it) and a JSON
sidecar carrying the prompts, the engine settings and the kit's LMCache YAML, for the arm with the finding; `repro
issue-md --out` writes both beside the issue text. Its run on the CPU engine is tests/test_repro_min_e2e.py; what it
refuses is tests/test_repro_min_safety.py."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest
from kvkit_testutil import ROOT

from repro.errors import UsageError
from repro.publish.repro_min import MAX_LINES, SCRIPT, make_repro_min

SMOLLM2 = ROOT / "reports" / "conditions" / "h200-conditions-smollm2-five-v028.json"
pytestmark = pytest.mark.skipif(
    not SMOLLM2.is_file() and not (ROOT / ".git").exists(),
    reason="the committed reports are not part of this copy (the kit)",
)


def test_the_smollm2_findings_script_is_short_complete_and_names_no_machine_path():
    report = json.loads(SMOLLM2.read_text(encoding="utf-8"))
    made = make_repro_min(report, None, SMOLLM2.name)
    assert made.script == SCRIPT and SCRIPT.count("\n") <= MAX_LINES
    ast.parse(SCRIPT)
    for path in ("/tmp/", "/opt/", "/work/", "/home/", str(ROOT)):
        assert path not in SCRIPT and path not in made.inputs_json
    inputs = json.loads(made.inputs_json)
    arm = next(a for a in report["arms"] if a["name"] == "LMCacheConnectorV1")
    assert inputs["arm"] == "LMCacheConnectorV1" and inputs["report"] == SMOLLM2.name
    assert inputs["mode"] == "connector" and inputs["connector"]["kv_connector"] == "LMCacheConnectorV1"
    prompts = {p["name"]: p for p in inputs["prompts"]}
    assert {n: p["token_ids"] for n, p in prompts.items()} == {
        p["name"]: p["submitted_token_ids"] for p in arm["probes"]
    }
    assert {n: p["reuses"] for n, p in prompts.items()} == {p["name"]: len(p["requests"]) - 1 for p in arm["probes"]}
    yaml = (ROOT / "fixtures" / "lmcache-local-cpu.yaml").read_text(encoding="utf-8")
    assert inputs["lmcache_yaml"] == {
        "path": "fixtures/lmcache-local-cpu.yaml", "sha256": report["provenance"]["lmcache_config"]["sha256"], "text": yaml
    }  # fmt: skip
    assert inputs["engine"]["dtype"] == "float16" and inputs["max_tokens"] == 16
    assert inputs["stack"] == "vLLM 0.28.0, LMCache 0.5.4, NVIDIA H200" and "smollm2" in inputs["model"]
    assert "import repro" not in SCRIPT and "from repro" not in SCRIPT


def test_an_arm_it_cannot_reproduce_without_the_kit_is_one_usage_error():
    report = json.loads(SMOLLM2.read_text(encoding="utf-8"))
    with pytest.raises(UsageError, match="needs the kit"):
        make_repro_min(report, "LMCacheMPConnector")
    with pytest.raises(UsageError, match="no reuse arm"):
        make_repro_min(report, "baseline")
    native = make_repro_min(report, "native").inputs
    assert native["mode"] == "native" and native["connector"] is None and native["lmcache_yaml"] is None


def _issue_md(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "repro", "issue-md", str(SMOLLM2), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def test_issue_md_writes_the_script_beside_the_issue_text(tmp_path):
    proc = _issue_md("--out", str(tmp_path / "issue.md"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "issue.md").is_file() and (tmp_path / "repro_min.py").read_text(encoding="utf-8") == SCRIPT
    inputs = json.loads((tmp_path / "repro_min.json").read_text(encoding="utf-8"))
    assert inputs["kind"] == "kvkit-repro-min-inputs" and inputs["arm"] == "LMCacheConnectorV1"
    assert "repro_min.py" in proc.stderr and "repro_min.json" in proc.stderr
    proc = _issue_md("--repro-min", str(tmp_path / "x.py"), "--arm", "nope")
    assert proc.returncode == 2 and "--arm nope" in proc.stderr and not (tmp_path / "x.py").exists()
