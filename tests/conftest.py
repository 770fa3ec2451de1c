"""Shared test helpers: the kit root on sys.path, the tiny model, and the CPU run helper."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ARTIFACTS = ROOT / "tests" / "artifacts"


def run_cli(args: list[str], timeout: float = 1500, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=str(ROOT))
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "repro.verify_kv_reuse", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=full_env)


@pytest.fixture(scope="session")
def tiny_model() -> str:
    from repro.tinymodel import make_tiny_model

    path = ROOT / ".cache" / "models" / "kvkit-tiny-qwen3"
    make_tiny_model(path)
    return str(path)


def have_vllm() -> bool:
    from importlib.util import find_spec

    return find_spec("vllm") is not None
