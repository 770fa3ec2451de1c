"""GPU tests: run only where CUDA and LMCache are present (the GPU host), skipped elsewhere."""

import shutil
import subprocess
from importlib.util import find_spec

import pytest


def _cuda() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


def pytest_collection_modifyitems(config, items):
    reason = None
    if not _cuda():
        reason = "needs a CUDA GPU (nvidia-smi found none)"
    elif find_spec("lmcache") is None or find_spec("vllm") is None:
        reason = "needs vllm and lmcache installed (PROFILE=gpu-lmcache-0.5.4)"
    if reason:
        for item in items:
            if "tests/gpu/" in str(item.fspath):
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def tiny_model_fp16() -> str:
    """The float16 variant of the tiny model: only 8 tokens compete, so fp16 logit rounding
    produces fewer near-ties (see repro.tinymodel.FOCUS_TOKENS)."""
    from kvkit_testutil import ROOT
    from repro.tinymodel import make_tiny_model

    path = ROOT / ".cache" / "models" / "kvkit-tiny-qwen3-focus8"
    make_tiny_model(path, focus=8)
    return str(path)
