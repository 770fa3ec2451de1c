"""Entry point: `python -m repro.verify_kv_reuse --model ... --fixture ... [--kv-connector ...]`."""

import signal
import sys


def _term_while_starting(signum, frame):
    """SIGTERM before repro.verify has installed its own handler (its imports take a while): one line,
    exit 130, as for an interrupt later; nothing has been written yet."""
    try:  # a stderr that cannot take the line (a file on a full disk) loses it, not the exit code
        print(f"error: interrupted ({signal.Signals(signum).name}) while starting; no report written", file=sys.stderr)
    except (OSError, ValueError):
        pass
    sys.exit(130)


signal.signal(signal.SIGTERM, _term_while_starting)

from repro.verify import main  # after the handler: the import is the slow part

if __name__ == "__main__":
    code = main()
    from repro.commands import ignore_stop_signals

    ignore_stop_signals()  # the run has ended: a late signal must not change how
    sys.exit(code)
