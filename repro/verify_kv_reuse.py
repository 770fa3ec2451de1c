"""Entry point: `python -m repro.verify_kv_reuse --model ... --fixture ... [--kv-connector ...]`."""

import sys

from repro.verify import main

if __name__ == "__main__":
    sys.exit(main())
