"""`python -m repro COMMAND`: the kit's commands, from the registry in repro.commands."""

import sys

from repro.commands import ignore_stop_signals, main

if __name__ == "__main__":
    code = main(sys.argv[1:])
    ignore_stop_signals()  # the command has ended: a late signal must not change how
    sys.exit(code)
