"""LMCacheConnectorV1 on a real GPU: the reference failure reproduces, native passes, and a
degraded LMCache start is never a PASS. Writes its reports under KVKIT_GPU_OUT (default: tmp)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from importlib.util import find_spec
from pathlib import Path

import pytest
from kvkit_testutil import ROOT, run_cli


def _skip_reason() -> str | None:
    """No conftest here: a second conftest.py would shadow tests/conftest.py for `import conftest`."""
    if (
        shutil.which("nvidia-smi") is None
        or subprocess.run(["nvidia-smi", "-L"], capture_output=True, check=False).returncode
    ):
        return "needs a CUDA GPU (nvidia-smi found none)"
    if find_spec("lmcache") is None or find_spec("vllm") is None:
        return "needs vllm and lmcache installed (PROFILE=gpu-lmcache-0.5.4)"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))]

COMMON = [
    "--dtype",
    "float16",
    "--gpu-memory-utilization",
    "0.45",
    "--max-model-len",
    "2048",
    "--block-size",
    "16",
    "--max-tokens",
    "16",
    "--seed",
    "0",
    "--device",
    "cuda",
]


@pytest.fixture(scope="module")
def tiny_model_fp16() -> str:
    from repro.models.tiny import FP16_MODEL_SEED, make_tiny_model

    path = ROOT / ".cache" / "models" / f"kvkit-tiny-qwen3-seed{FP16_MODEL_SEED}"
    make_tiny_model(path, seed=FP16_MODEL_SEED)
    return str(path)


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory) -> Path:
    d = os.environ.get("KVKIT_GPU_OUT")
    return Path(d) if d else tmp_path_factory.mktemp("gpu")


@pytest.fixture(scope="module")
def acceptance(tiny_model_fp16, out_dir):
    report = out_dir / "h200-lmcache-tiny.json"
    proc = run_cli(
        [
            "--model",
            tiny_model_fp16,
            "--kv-connector",
            "LMCacheConnectorV1",
            "--lmcache-config",
            "fixtures/lmcache-local-cpu.yaml",
            *COMMON,
            "--suite",
            "acceptance",
            "--compare-native",
            "--fixture",
            "fixtures/selftest-gpu-lmcache.json",
            "--report",
            str(report),
        ]
    )
    print(proc.stdout)
    print(proc.stderr[-4000:])
    return proc, json.loads(report.read_text())


def test_lmcache_fails_with_hits_and_native_passes(acceptance):
    _proc, data = acceptance
    arms = {a["name"]: a for a in data["arms"]}
    lmc, native = arms["LMCacheConnectorV1"], arms["native"]
    assert lmc["verdict"] == "FAIL", lmc["reasons"]
    assert native["verdict"] == "PASS", native["reasons"]
    failed = [p for p in lmc["probes"] if p["verdict"] == "FAIL"]
    assert failed
    for probe in failed:
        cold, *reuses = probe["requests"]
        assert cold["cached_tokens"] == 0
        assert all(r["cached_tokens"] > 0 for r in reuses)
        assert any(isinstance(r["first_diff"], int) for r in reuses)
    assert lmc["lmcache"]["degraded_mode"] is False
    assert lmc["lmcache"]["retrieves"] > 0
    prov = data["provenance"]
    assert prov["hardware"]["gpus"] and prov["hardware"]["driver"]
    assert prov["engine_versions"]["cuda_available"] is True


def test_degraded_lmcache_start_is_never_pass(tiny_model_fp16, out_dir):
    report = out_dir / "h200-lmcache-degraded.json"
    proc = run_cli(
        [
            "--model",
            tiny_model_fp16,
            "--kv-connector",
            "LMCacheConnectorV1",
            "--lmcache-config",
            "tests/gpu/lmcache-rejected.yaml",
            *COMMON,
            "--reuses",
            "1",
            "--timeout",
            "240",
            "--fixture",
            "fixtures/selftest-gpu-lmcache.json",
            "--report",
            str(report),
        ]
    )
    data = json.loads(report.read_text())
    arm = next(a for a in data["arms"] if a["name"] == "LMCacheConnectorV1")
    assert arm["verdict"] in ("ERROR", "INCONCLUSIVE"), arm["verdict"]
    assert arm["lmcache"]["degraded_mode"] is True
    assert proc.returncode != 0
