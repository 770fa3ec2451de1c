"""Shared fixtures: the tiny model, the end-to-end runs several files read (e2e_runs), the order (engine-free
tests first). Helpers live in kvkit_testutil (re-exported here)."""

from __future__ import annotations

import os
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
# The warm-import launcher (repro.run.warm): the kit's CPU engine children are forked from a process that imported
# vLLM once, as proven byte-identical by tests/test_warm_launcher.py (docs/layout.md). KVKIT_WARM_IMPORT=0 in the
# shell keeps every child spawned; the sequential self-test (e2e_runs) is always spawned, the reference it is held to.
os.environ.setdefault("KVKIT_WARM_IMPORT", "1")
# One pool of launchers for the whole session (repro.run.warm.POOL_ENV): every run the tests start forks its arm
# children from the same launchers, so each environment's vLLM import is paid once, not once per run. The pool's
# launchers stop when this process is gone or the folder is removed (at exit, below). xdist's workers inherit it.
if os.environ.get("KVKIT_WARM_IMPORT") == "1" and not os.environ.get("KVKIT_WARM_POOL"):
    import atexit
    import shutil
    import tempfile

    _pool = tempfile.mkdtemp(prefix="kvkit-warm-pool-")
    Path(_pool, "owner").write_text(str(os.getpid()))
    os.environ["KVKIT_WARM_POOL"] = _pool
    atexit.register(shutil.rmtree, _pool, True)
import e2e_runs
from e2e_runs import (  # noqa: F401
    e2e_lane,
    e2e_runs_ahead,
    machine_alone,
    planted_scenarios_run,
    selftest_run,
    selftest_sequential_run,
    served_selftest_run,
)
from kvkit_testutil import ARTIFACTS, ROOT, have_vllm, run_cli  # noqa: F401

_session: pytest.Session | None = None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--engine-free-fail-fast",
        action="store_true",
        help="stop at the first failing engine-free test (they run first), before any end-to-end test starts",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The engine-free tests first and the end-to-end ones (marker e2e: real engines, minutes each) last, so a
    broken unit shows in minutes; of those, the ones that need the machine alone first, before the lane of runs
    made ahead starts (e2e_runs); then those that keep about one core busy (marker one_core: a launcher's import, a
    run one arm at a time, a kill and its wait), beside the lane's runs on the other core: last, with the lane's runs
    made, they left one core of two idle (about 30 to 50 % of the machine idle through them, `vmstat`). A stable
    sort keeps each group in its usual order."""
    items.sort(
        key=lambda item: (
            item.get_closest_marker("e2e") is not None,
            "machine_alone" not in item.fixturenames,
            item.get_closest_marker("one_core") is None,
        )
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    global _session
    _session = session


def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo) -> None:
    """Ctrl-C: the lane of runs made ahead starts no other, and the engines it started in this process (in their
    own sessions, which the terminal's signal does not reach) are stopped, as the kit stops its own."""
    from repro.run import runner

    e2e_runs.stop_lanes()
    runner.stop_all_children()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """--engine-free-fail-fast (`make test`): an engine-free failure stops the run before the engines start."""
    session = _session
    if report.failed and "e2e" not in report.keywords and session and session.config.getoption("engine_free_fail_fast"):
        session.shouldfail = f"an engine-free test failed ({report.nodeid}): the end-to-end tests did not run"


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
