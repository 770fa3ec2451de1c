"""`python -m repro.engine JOB.json`: the engine child's entry point (see repro.engine.child)."""

import sys

from repro.engine.child import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
