"""The reproducer without the kit (repro_min.py, issue 35 item 6; a fixed script and its repro_min.json since issue
55), run on the real vLLM CPU engine: its inputs made from the session's CPU self-test report (tests/e2e_runs.py) for
its planted fault (zero_blocks: FAIL on every probe in the kit) and its faithful control (PlantedFault-none: PASS),
each run as a maintainer would run it, outside the kit: `python repro_min.py MODEL_DIR` from another folder, with
only the planted connector's module importable (its inputs name it by module path, as they name any out-of-tree
connector). It FAILs and PASSes as the kit did; its run time is measured and left in
tests/artifacts/repro-min-times.json (the two scripts run at the same time, each on a core of two, beside whatever
else the session runs then: a figure of this run, not a benchmark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import ARTIFACTS, ROOT, have_vllm

from repro.publish.repro_min import MAX_LINES, SCRIPT, ReproMin, make_repro_min

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]


def _run(made: ReproMin, model: str, tmp_path, name: str) -> tuple[subprocess.CompletedProcess, float]:
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "repro_min.py"
    path.write_text(made.script, encoding="utf-8")
    (folder / "repro_min.json").write_text(made.inputs_json, encoding="utf-8")  # where the script reads its inputs
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "KVKIT_"))}
    env["PYTHONPATH"] = str(ROOT)  # the planted connector's module (repro.engine.connectors.planted_fault)
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(path), model],
        check=False,
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return proc, time.monotonic() - t0


@pytest.fixture(scope="module")
def runs(selftest_run, tiny_model, tmp_path_factory):
    assert selftest_run.data is not None, selftest_run.proc.stderr[-3000:]
    tmp = tmp_path_factory.mktemp("repro-min")
    scripts = {
        arm: make_repro_min(selftest_run.data, arm, "selftest.json") for arm in ("PlantedFault", "PlantedFault-none")
    }
    with ThreadPoolExecutor(max_workers=2) as pool:  # the two scripts at once, each its own process on a core
        ran = {arm: pool.submit(_run, script, tiny_model, tmp, arm) for arm, script in scripts.items()}
        out = {arm: (scripts[arm], *future.result()) for arm, future in ran.items()}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    times = {arm: round(seconds, 1) for arm, (_, _, seconds) in out.items()}
    (ARTIFACTS / "repro-min-times.json").write_text(json.dumps(times, indent=1), encoding="utf-8")
    return out


def test_the_script_is_short_and_names_no_path_of_this_machine(runs, tiny_model):
    for made, _, _ in runs.values():
        assert made.script == SCRIPT and SCRIPT.count("\n") <= MAX_LINES
        for text in (SCRIPT, made.inputs_json):
            assert str(ROOT) not in text and tiny_model not in text and "/tmp/" not in text
        assert "import repro" not in SCRIPT and "from repro" not in SCRIPT  # vLLM and the standard library only


def test_it_fails_where_the_kit_found_the_planted_fault(runs, selftest_run):
    _, proc, _ = runs["PlantedFault"]
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("FAIL")
    kit = {p["name"]: p for a in selftest_run.data["arms"] if a["name"] == "PlantedFault" for p in a["probes"]}
    for name, probe in kit.items():
        reuses = [line for line in proc.stdout.splitlines() if line.startswith(f"{name} reuse")]
        assert len(reuses) == len(probe["requests"]) - 1
        assert all("DIFFER @" in line and not line.split(": ")[1].startswith("0 cached") for line in reuses), reuses


def test_it_passes_where_the_kit_passed(runs):
    _, proc, _ = runs["PlantedFault-none"]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    requests = [line for line in lines if "cached tokens" in line]  # after what it runs (report, arm, connector)
    assert lines[-1] == "PASS" and requests and all("tokens match" in line for line in requests), lines
