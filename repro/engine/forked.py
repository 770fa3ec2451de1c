"""What a process forked by the kit's warm-import launcher (repro.engine.warm) knows of itself, and how it leaves.

FORKED is set in the forked child before its module runs (a spawned interpreter leaves it False): a served arm
forks its `vllm serve` only then (repro.engine.served.ForkedServer). exit_now is the interpreter's exit less the
module teardown, for the launcher's children and the servers forked from them."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading

FORKED = False


def exit_now(code: object) -> None:
    """Leave as the interpreter leaves after `sys.exit(code)` (or the module's end: None), in Py_FinalizeEx's
    order: the non-daemon threads joined, the atexit handlers run, the standard streams flushed; then os._exit
    with the status Python gives (None: 0, an int: itself, anything else printed to stderr: 1). What is skipped is
    the teardown of the modules and their objects, which the launcher's imports made long (a process forked from
    it: repro.engine.warm's children, repro.engine.served's ForkedServer)."""
    if code is not None and not isinstance(code, int):
        with contextlib.suppress(Exception):
            print(code, file=sys.stderr)
        code = 1
    threading._shutdown()  # what Py_FinalizeEx calls first
    atexit._run_exitfuncs()  # then this: an exception in a handler is printed and ignored, as there
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code or 0)
