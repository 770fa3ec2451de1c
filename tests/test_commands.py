"""The command registry: every `python -m repro COMMAND` maps bad usage, OSError and an interrupt
the same way (one line each; exit 2, 3 and 130)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from kvkit_testutil import ROOT

from repro.commands import COMMANDS, run_command
from repro.errors import EXIT_INTERRUPTED, EXIT_RUNTIME, EXIT_USAGE, UsageError


def _repro(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "repro", *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("name", [c.name for c in COMMANDS])
def test_every_command_loads_and_refuses_an_unknown_flag_in_one_line(name):
    command = next(c for c in COMMANDS if c.name == name)
    assert callable(command.load())
    proc = _repro(name, "--no-such-flag-kvkit")
    assert proc.returncode == EXIT_USAGE, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr  # never argparse's usage dump


def test_an_unknown_command_and_no_command_are_usage_errors():
    proc = _repro("frobnicate")
    assert proc.returncode == EXIT_USAGE and proc.stderr.strip().splitlines() == [
        "error: unknown command 'frobnicate' (python -m repro --help lists them)"
    ]
    assert _repro().returncode == EXIT_USAGE
    helped = _repro("--help")
    assert helped.returncode == 0 and all(c.name in helped.stdout for c in COMMANDS)


@pytest.mark.parametrize(
    "exc, code, line",
    [
        (UsageError("--x: bad"), EXIT_USAGE, "error: --x: bad"),
        (
            FileNotFoundError(2, "No such file or directory", "/nope"),
            EXIT_RUNTIME,
            "error: No such file or directory: /nope",
        ),
        (KeyboardInterrupt(), EXIT_INTERRUPTED, "error: interrupted"),
        (KeyError("kit bug"), EXIT_RUNTIME, "error: internal error in the kit (traceback above)"),
    ],
)
def test_run_command_maps_errors_to_one_line_and_an_exit_code(exc, code, line, capsys):
    def command(argv):
        raise exc

    assert run_command(command, []) == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == line and (len(lines) == 1 or isinstance(exc, KeyError))  # only a kit bug shows a traceback
