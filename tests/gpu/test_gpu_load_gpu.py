"""--gpu-load's real neighbour (repro.engine.gpu_load) on every visible GPU for about 5 s: it runs, reports
iterations and TFLOP/s, stays within its memory cap, and stops at once on the kit's SIGTERM. Writes the
record to KVKIT_GPU_OUT/gpu-load-record.json when that is set."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import pytest
from kvkit_testutil import ROOT  # noqa: F401 (puts the kit on sys.path)

from repro.engine.gpu_load import MAX_BYTES
from repro.plan.devices import visible_gpus
from repro.run.gpu_load import load_log_path, neighbour
from repro.run.runner import child_env


def _skip_reason() -> str | None:
    """No conftest here: a second conftest.py would shadow tests/conftest.py for `import conftest`."""
    if (
        shutil.which("nvidia-smi") is None
        or subprocess.run(["nvidia-smi", "-L"], capture_output=True, check=False).returncode
    ):
        return "needs a CUDA GPU (nvidia-smi found none)"
    if find_spec("torch") is None:
        return "needs torch with CUDA"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))]
RUN_S = 5.0


def test_the_real_load_keeps_every_gpu_busy_and_stops_at_once(tmp_path):
    gpus = visible_gpus()
    assert gpus, "nvidia-smi lists a GPU but none is visible"
    env = child_env(dict(os.environ), hashseed="0", extra={})
    t0 = time.monotonic()
    with neighbour(sys.executable, gpus, env, load_log_path(tmp_path), t0=t0, ready_timeout_s=300) as load:
        time.sleep(RUN_S)
        load.check()
        running = load.read_status()
        stop_at = time.monotonic()
    stop_took = time.monotonic() - stop_at
    rec = load.record()
    out = os.environ.get("KVKIT_GPU_OUT")
    if out:
        Path(out, "gpu-load-record.json").write_text(json.dumps({**rec, "stop_took_s": round(stop_took, 3)}, indent=2))
    log = load.log_path.read_text()
    assert running["state"] == "running" and all(d["iterations"] > 0 for d in running["devices"]), log
    assert rec["state"] == "stopped" and rec["returncode"] == 0 and rec["ended"] == "stopped by the kit", log
    assert stop_took < 5, f"took {stop_took:.1f} s to stop"
    assert RUN_S <= rec["ended_s"] - rec["started_s"] < RUN_S + 5
    assert [d["gpu"] for d in rec["devices"]] == gpus
    for d in rec["devices"]:
        assert d["iterations"] > 0 and d["tflops"] > 0 and d["dtype"] == "float16" and d["n"] >= 1024, d
        assert 0 < d["reserved_bytes"] <= MAX_BYTES, d
    assert "kvkit gpu-load: running" in log and "kvkit gpu-load: stopped" in log
