"""Shared fixtures: the tiny model. Helpers live in kvkit_testutil (re-exported here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kvkit_testutil import ARTIFACTS, ROOT, have_vllm, run_cli  # noqa: F401


@pytest.fixture(scope="session")
def tiny_model() -> str:
    from repro.tinymodel import make_tiny_model

    path = ROOT / ".cache" / "models" / "kvkit-tiny-qwen3"
    make_tiny_model(path)
    return str(path)
