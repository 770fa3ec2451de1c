"""`python -m repro COMMAND`: the kit's commands, from the registry in repro.commands."""

import sys

from repro.commands import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
