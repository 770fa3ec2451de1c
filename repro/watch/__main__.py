"""`python -m repro.watch versions|run` (repro.watch.commands), with the kit's shared error handling."""

import sys

from repro.commands import ignore_stop_signals, run_command
from repro.errors import EXIT_USAGE

SUBCOMMANDS = ("versions", "run")  # functions of repro.watch.commands

if __name__ == "__main__":
    if not sys.argv[1:] or sys.argv[1] not in SUBCOMMANDS:
        print("error: usage: python -m repro.watch versions|run ARGS (make watch runs both)", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    from repro.watch import commands

    code = run_command(getattr(commands, sys.argv[1]), sys.argv[2:])
    ignore_stop_signals()
    sys.exit(code)
