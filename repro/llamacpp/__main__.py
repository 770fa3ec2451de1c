"""`python -m repro.llamacpp JOB.json`: llama.cpp's engine child (see repro.llamacpp.child)."""

import sys

from repro.llamacpp.child import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
