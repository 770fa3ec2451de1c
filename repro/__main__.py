"""`python -m repro COMMAND` and the `kvkit` console script (pyproject.toml): the kit's commands, from the registry
in repro.commands."""

import sys

from repro.commands import ignore_stop_signals, main  # main(argv): one command, called as a function


def console_main() -> int:
    """The process's own command line, run; its exit code, which the console script and `python -m` exit with."""
    argv = sys.argv[1:]
    if argv[:1] == ["verify"]:  # the verifier's own SIGTERM handler comes with repro.verify, a slow import:
        import repro.verify_kv_reuse  # noqa: F401 - its entry point's handler first (one line, exit 130), then it
    code = main(argv)
    ignore_stop_signals()  # the command has ended: a late signal must not change how
    return code


if __name__ == "__main__":
    sys.exit(console_main())
