"""repro_min.py from a committed report, without an engine (issue 35 item 6): the SmolLM2 H200 finding's script is at
most 80 lines of Python that names no path of the machine that made it, carries the prompts, the engine settings
and the LMCache YAML inline, and reproduces the arm with the finding; `repro issue-md --out` writes it beside the
issue text. Its run on the CPU engine is tests/test_repro_min_e2e.py."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest
from kvkit_testutil import ROOT

from repro.errors import UsageError
from repro.publish.repro_min import MAX_LINES, make_repro_min

SMOLLM2 = ROOT / "reports" / "conditions" / "h200-conditions-smollm2-five-v028.json"
pytestmark = pytest.mark.skipif(
    not SMOLLM2.is_file() and not (ROOT / ".git").exists(),
    reason="the committed reports are not part of this copy (the kit)",
)


def _consts(script: str) -> dict:
    """The script's module-level constants, read back as Python values."""
    tree = ast.parse(script)
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = ast.literal_eval(node.value)
    return out


def test_the_smollm2_findings_script_is_short_complete_and_names_no_machine_path():
    report = json.loads(SMOLLM2.read_text(encoding="utf-8"))
    script = make_repro_min(report, None, SMOLLM2.name)
    assert script.count("\n") <= MAX_LINES
    for path in ("/tmp/", "/opt/", "/work/", "/home/", str(ROOT)):
        assert path not in script
    consts = _consts(script)
    arm = next(a for a in report["arms"] if a["name"] == "LMCacheConnectorV1")
    assert consts["MODE"] == "connector" and consts["CONNECTOR"]["kv_connector"] == "LMCacheConnectorV1"
    assert consts["PROMPTS"] == {p["name"]: p["submitted_token_ids"] for p in arm["probes"]}  # every probe a finding
    assert consts["REUSES"] == {p["name"]: len(p["requests"]) - 1 for p in arm["probes"]}
    assert consts["LMCACHE_YAML"] == (ROOT / "fixtures" / "lmcache-local-cpu.yaml").read_text(encoding="utf-8")
    assert consts["ENGINE"]["dtype"] == "float16" and consts["MAX_TOKENS"] == 16
    assert "vLLM 0.28.0, LMCache 0.5.4, NVIDIA H200" in script and "smollm2" in script
    assert "import repro" not in script and "from repro" not in script


def test_an_arm_it_cannot_reproduce_without_the_kit_is_one_usage_error():
    report = json.loads(SMOLLM2.read_text(encoding="utf-8"))
    with pytest.raises(UsageError, match="needs the kit"):
        make_repro_min(report, "LMCacheMPConnector")
    with pytest.raises(UsageError, match="no reuse arm"):
        make_repro_min(report, "baseline")
    native = _consts(make_repro_min(report, "native"))
    assert native["MODE"] == "native" and native["CONNECTOR"] is None and native["LMCACHE_YAML"] == ""


def _issue_md(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "repro", "issue-md", str(SMOLLM2), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def test_issue_md_writes_the_script_beside_the_issue_text(tmp_path):
    proc = _issue_md("--out", str(tmp_path / "issue.md"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "issue.md").is_file() and (tmp_path / "repro_min.py").is_file()
    assert "repro_min.py" in proc.stderr
    proc = _issue_md("--repro-min", str(tmp_path / "x.py"), "--arm", "nope")
    assert proc.returncode == 2 and "--arm nope" in proc.stderr and not (tmp_path / "x.py").exists()
