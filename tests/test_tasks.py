"""tasks.py preconditions: a GPU profile on a machine without CUDA stops at once, in one line."""

import os
import subprocess
import sys

from kvkit_testutil import ROOT


def _inv(*args, path=None):
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_gpu_profile_without_cuda_stops_with_one_line(tmp_path):
    # a PATH with no nvidia-smi: what a CPU-only machine looks like to tasks.py
    proc = _inv("repro", "--profile", "gpu-lmcache-0.5.4", path=f"{tmp_path}:/usr/bin:/bin")
    assert proc.returncode == 2
    out = (proc.stdout + proc.stderr).strip()
    assert len(out.splitlines()) == 1
    assert "needs a CUDA GPU" in out and "PROFILE=cpu" in out
    assert not (ROOT / ".venvs" / "gpu-lmcache-0.5.4").exists()


def test_unknown_profile_is_refused():
    proc = _inv("repro", "--profile", "nonsense")
    assert proc.returncode == 2
    assert "unknown PROFILE=nonsense" in proc.stdout + proc.stderr
