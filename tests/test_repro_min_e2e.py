"""repro_min.py run as a maintainer runs it, outside the kit, on the real vLLM CPU engine. `repro issue-md` writes
it from the committed CPU self-test (reports/versions/cpu-vllm-0.28.0-selftest.json, on the kit's tiny model) for two
arms, each into a folder of its own outside the repository: the planted fault (zero_blocks: FAIL on every probe in
the kit; its connector travels beside the script as planted_fault_connector.py) and ExampleConnector (vLLM's own:
PASS). Each runs there as `python -I repro_min.py MODEL_DIR`: no kit on the path (PYTHONPATH unset, and -I keeps the
script's own folder and the current one off the first process's path too), so only what the script itself puts on
its runs' path is there (F4 of the newcomer note of 2026-12-05: the planted arm's script found no `repro` and exited
1). It FAILs and PASSes as the kit did. They run one after the other, each its own vLLM twice (caching off, then the
arm); their times are left in tests/artifacts/repro-min-times.json (a figure of this run, beside whatever else the
session runs then, not a benchmark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ARTIFACTS, ROOT, have_vllm
from kvkit_testutil import committed_or_skip

from repro.models.tiny import make_tiny_model
from repro.publish.repro_min import SCRIPT
from repro.publish.shipped_connector import SHIPPED_MODULE, planted_connector_source

# what the kit hands to others, run as they run it: make test-extended (CI runs it, and .ci/run the same script as a
# command of its own)
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.extended,
    pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed"),
]

SELFTEST = ROOT / "reports" / "versions" / "cpu-vllm-0.28.0-selftest.json"
PLANTED, CLEAN = "PlantedFault", "ExampleConnector"


def _write(folder: Path, arm: str) -> subprocess.CompletedProcess:
    """`python -m repro issue-md SELFTEST --arm ARM --out FOLDER/issue.md`, from the kit's root."""
    folder.mkdir()
    cmd = [sys.executable, "-m", "repro", "issue-md", str(SELFTEST), "--arm", arm, "--out", str(folder / "issue.md")]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def _run(folder: Path, model: str) -> tuple[subprocess.CompletedProcess, float]:
    """`python -I repro_min.py MODEL_DIR` from folder, with no kit on the path and no setting of the kit's run."""
    env = {
        k: v for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith(("VLLM_", "KVKIT_"))
    }  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-I", "repro_min.py", model],
        cwd=folder, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    return proc, time.monotonic() - t0


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess, float]]:
    committed_or_skip(SELFTEST)
    report = json.loads(SELFTEST.read_text(encoding="utf-8"))
    assert make_tiny_model(Path(tiny_model)) == report["provenance"]["model"]["sha256"]  # the model the kit ran
    tmp = tmp_path_factory.mktemp("repro-min")
    assert ROOT not in tmp.parents
    for arm in (PLANTED, CLEAN):
        written = _write(tmp / arm, arm)
        assert written.returncode == 0, written.stderr[-3000:]
    out = {arm: (tmp / arm, *_run(tmp / arm, tiny_model)) for arm in (PLANTED, CLEAN)}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    times = {arm: round(seconds, 1) for arm, (_, _, seconds) in out.items()}
    (ARTIFACTS / "repro-min-times.json").write_text(json.dumps(times, indent=1), encoding="utf-8")
    return out


def _said(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout[-2000:] + proc.stderr[-3000:]


def test_what_issue_md_wrote_is_the_fixed_script_and_the_kits_connector(runs, tiny_model):
    planted, _, _ = runs[PLANTED]
    clean, _, _ = runs[CLEAN]
    assert (planted / "repro_min.py").read_text(encoding="utf-8") == SCRIPT
    assert (planted / f"{SHIPPED_MODULE}.py").read_text(encoding="utf-8") == planted_connector_source()
    assert not (clean / f"{SHIPPED_MODULE}.py").exists()  # vLLM's own connector: nothing travels
    for folder in (planted, clean):
        inputs = (folder / "repro_min.json").read_text(encoding="utf-8")
        assert str(ROOT) not in inputs and tiny_model not in inputs and "/tmp/" not in inputs


def test_the_planted_fault_fails_as_the_kit_found_it(runs):
    _, proc, _ = runs[PLANTED]
    assert proc.returncode == 1, _said(proc)
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("FAIL") and f"from {SHIPPED_MODULE}.py beside this script" in proc.stdout
    kit = json.loads(SELFTEST.read_text(encoding="utf-8"))
    probes = next(a for a in kit["arms"] if a["name"] == PLANTED)["probes"]
    for probe in probes:
        reuses = [line for line in lines if line.startswith(f"{probe['name']} reuse")]
        assert len(reuses) == len(probe["requests"]) - 1, lines
        assert all("DIFFER @" in line and not line.split(": ")[1].startswith("0 cached") for line in reuses), reuses


def test_the_clean_arm_passes_as_the_kit_found_it(runs):
    _, proc, _ = runs[CLEAN]
    assert proc.returncode == 0, _said(proc)
    lines = proc.stdout.strip().splitlines()
    requests = [line for line in lines if "cached tokens" in line]  # after what it runs (report, arm)
    reuses = [line for line in requests if " reuse " in line]
    assert lines[-1] == "PASS" and requests and all("tokens match" in line for line in requests), lines
    assert reuses and all(not line.split(": ")[1].startswith("0 cached") for line in reuses), reuses
