"""`python -m repro COMMAND`: the kit's commands, from the registry in repro.commands."""

import sys

if sys.argv[1:2] == ["verify"]:  # the verifier's own SIGTERM handler comes with repro.verify, a slow import:
    import repro.verify_kv_reuse  # noqa: F401 - its entry point's handler first (one line, exit 130), then it

from repro.commands import ignore_stop_signals, main

if __name__ == "__main__":
    code = main(sys.argv[1:])
    ignore_stop_signals()  # the command has ended: a late signal must not change how
    sys.exit(code)
