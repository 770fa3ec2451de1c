"""The entry point `python -m repro.verify_kv_reuse`: a SIGTERM in the kit's first second, before the verifier
(repro.verify, whose imports are the slow part) is imported and has installed its own handler."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from kvkit_testutil import ROOT
from test_cli_failures import _args, _env, assert_untouched
from test_cli_failures import setup as setup  # noqa: PLC0414 - the fixture, re-exported for this test

# Runs the entry point as `python -m` does, held at the import of repro.verify: an import hook writes a
# marker and sleeps there, so the test signals a process that has certainly installed the entry point's
# handler and certainly not yet imported the verifier (no race with a sleep of the test's own).
HELD_AT_IMPORT = """
import importlib.abc, pathlib, runpy, sys, time

marker = pathlib.Path(sys.argv.pop(1))


class HoldAtVerify(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "repro.verify":
            marker.write_text("about to import repro.verify")
            time.sleep(120)
        return None


sys.meta_path.insert(0, HoldAtVerify())
runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(
    "entry", [["repro.verify_kv_reuse"], ["repro", "verify"]], ids=["verify_kv_reuse", "repro-verify"]
)
def test_sigterm_before_the_verifier_is_imported_is_one_line_and_exit_130(setup, entry):
    """The chaos run's fault 43 (SIGTERM at 0.1 s) killed the kit silently, exit -15: the verifier's
    handler comes with repro.verify. Both entry points (`python -m repro.verify_kv_reuse` and
    `python -m repro verify`) install one first."""
    import os

    marker = setup["tmp"] / "held"
    env = dict(os.environ, PYTHONPATH=str(ROOT), **_env(setup))
    args = [*entry[1:], *_args(setup, "--kv-connector", "ExampleConnector")]
    proc = subprocess.Popen(
        [sys.executable, "-c", HELD_AT_IMPORT, str(marker), entry[0], *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, err)
    assert err == "error: interrupted (SIGTERM) while starting; no report written\n"
    assert out == ""
    assert_untouched(setup)


# Runs the entry point as `python -m` does, with a SIGTERM delivered just as it exits: after the run has
# ended, its report written and its last line said (the moment a late signal meets).
TERM_AT_EXIT = """
import os, runpy, signal, sys

real_exit = sys.exit


def exit_after_a_sigterm(code=None):
    os.kill(os.getpid(), signal.SIGTERM)
    real_exit(code)


sys.exit = exit_after_a_sigterm
runpy.run_module("repro.verify_kv_reuse", run_name="__main__", alter_sys=True)
"""


def test_a_sigterm_once_the_run_has_ended_leaves_its_exit_code(setup):
    """The chaos run's fault 8 (seed 2101): a SIGTERM as the kit exited, its report complete, killed it (exit
    -15: Python hands its handlers back to the default action while it shuts down). A signal after the end
    changes nothing: the report's exit code, its last line `report: ...`."""
    import json
    import os

    env = dict(os.environ, PYTHONPATH=str(ROOT), **_env(setup))
    proc = subprocess.run(
        [sys.executable, "-c", TERM_AT_EXIT, *_args(setup, "--kv-connector", "ExampleConnector")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.strip().splitlines()[-1] == f"report: {setup['report']}"
    assert json.loads(setup["report"].read_text())["complete"] is True
