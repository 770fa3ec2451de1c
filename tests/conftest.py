"""Shared fixtures: the tiny model. Helpers live in kvkit_testutil (re-exported here)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

# A test session started in the background by a non-interactive shell (`make test &`, nohup) inherits
# SIGINT ignored, and Python then installs no KeyboardInterrupt handler, in this process or in the
# kit processes the tests start: the interrupt tests would send a signal nobody hears. Restore
# Python's usual handler (children then get the default disposition back across exec).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
from kvkit_testutil import ARTIFACTS, ROOT, have_vllm, run_cli  # noqa: F401


@pytest.fixture(scope="session")
def tiny_model() -> str:
    from repro.models.tiny import make_tiny_model

    path = ROOT / ".cache" / "models" / "kvkit-tiny-qwen3"
    make_tiny_model(path)
    return str(path)


@pytest.fixture(autouse=True)
def _children_may_start():
    """A test that stopped a run in this process (repro.run.runner.stop_all_children, or the MP servers')
    leaves the next test free to start children."""
    yield
    from repro.run import runner

    runner.allow_children()
