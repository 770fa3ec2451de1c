"""Test helpers shared by tests/ and tests/gpu/ (imported by name: a conftest cannot be)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ARTIFACTS = ROOT / "tests" / "artifacts"


def run_cli(args: list[str], timeout: float = 1500, env: dict | None = None) -> subprocess.CompletedProcess:
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    full_env = dict(os.environ, PYTHONPATH=pythonpath)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "repro.verify_kv_reuse", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        check=False,
    )


def have_vllm() -> bool:
    from importlib.util import find_spec

    return find_spec("vllm") is not None
