"""The matrix on a real local Ray cluster: Ctrl-C leaves no Ray worker, verifier or report behind; and
(e2e) two cells on the CPU engine. Skipped where no interpreter has Ray (make matrix installs it into
.venvs/matrix, never into a profile)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from kvkit_testutil import ROOT


def _ray_python() -> str | None:
    if importlib.util.find_spec("ray") is not None:
        return sys.executable
    venv = ROOT / ".venvs" / "matrix" / "bin" / "python"
    return str(venv) if venv.exists() else None


RAY_PYTHON = _ray_python()
pytestmark = pytest.mark.skipif(RAY_PYTHON is None, reason="Ray is not installed (make matrix sets up .venvs/matrix)")


def _matrix(args: list[str], **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen([RAY_PYTHON, "-m", "repro", "matrix", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, **kw)  # fmt: skip


def _pids(pattern: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False).stdout
    return [int(p) for p in out.split()]


def test_ctrl_c_leaves_no_worker_verifier_or_report(tmp_path):
    marker = f"kvkit-fake-verifier-{uuid.uuid4().hex[:8]}"
    python = tmp_path / "python"  # the CPU environment, except that its verifier only sleeps (a long cell)
    python.write_text(
        "#!/bin/bash\n"
        f'case " $* " in *" -m repro.verify_kv_reuse "*) exec -a {marker} sleep 600;; esac\n'
        f'exec {ROOT / ".venvs" / "cpu" / "bin" / "python"} "$@"\n'
    )
    python.chmod(0o755)
    spec = tmp_path / "matrix-sleepy.yaml"
    cell = {
        "environment": str(python),
        "model": "x/y",
        "fixture": "fixtures/selftest-cpu.json",
        "flags": ["--device", "cpu"],
    }
    spec.write_text(json.dumps({"cells": [{"name": "a", **cell}, {"name": "b", **cell}]}))
    rays_before = set(_pids("raylet"))
    proc = _matrix([str(spec), "--reports", str(tmp_path / "out")])
    deadline = time.monotonic() + 240
    while len(_pids(marker)) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(1)
    assert len(_pids(marker)) == 2, proc.stdout.read() if proc.poll() is not None else "cells did not start"
    os.kill(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 130, out
    assert "matrix interrupted" in out
    deadline = time.monotonic() + 30
    while (_pids(marker) or set(_pids("raylet")) - rays_before) and time.monotonic() < deadline:
        time.sleep(1)
    assert _pids(marker) == [] and set(_pids("raylet")) - rays_before == set()
    assert not (tmp_path / "out" / "sleepy.json").exists()
    assert not list((tmp_path / "out").rglob("*.json"))


@pytest.mark.e2e
def test_two_cells_on_the_cpu_engine(tmp_path, tiny_model):
    proc = _matrix(["fixtures/matrix-cpu-ci.yaml", "--reports", str(tmp_path)])
    out, _ = proc.communicate(timeout=1500)
    assert proc.returncode == 0, out
    summary = json.loads((tmp_path / "cpu-ci.json").read_text())
    assert summary["kind"] == "kvkit-matrix" and summary["exit_code"] == 0
    assert [c["status"] for c in summary["cells"]] == ["done", "done"]
    for cell in summary["cells"]:
        report = json.loads((tmp_path / cell["report"]).read_text())
        assert report["provenance"]["engine_environment"]["kit_managed"] is True
        assert cell["arms"][1]["probes"]["fixture"] == {"verdict": "PASS", "kv": "EXACT", "divergence": None}
    page = (tmp_path / "cpu-ci.html").read_text()
    assert 'href="cpu-ci/site/example-seed0.html"' in page and (tmp_path / "cpu-ci/site/example-seed0.html").is_file()
    # --resume: both cells are done, nothing runs (no Ray started)
    again = _matrix(["fixtures/matrix-cpu-ci.yaml", "--reports", str(tmp_path), "--resume"])
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0 and "0 cell(s) to run, 2 kept" in out, out
    assert not any(c["ran"] for c in json.loads((tmp_path / "cpu-ci.json").read_text())["cells"])
