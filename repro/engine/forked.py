"""What a process forked by the kit's warm-import launcher (repro.engine.warm) knows of itself, and how it leaves.

FORKED is set in the forked child before its module runs (a spawned interpreter leaves it False): a served arm
forks its `vllm serve` only then (repro.engine.served.ForkedServer). fork_refusal says why a process must not fork
now; run_module runs a module as `python -m` would; exit_now is the interpreter's exit less the module teardown, for
the launcher's children and the servers forked from them."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import runpy
import sys
import threading
import types

FORKED = False


def _openblas_pools_down() -> None:
    """Stop every loaded OpenBLAS's thread pool (numpy's and OpenCV's start one at load). Each registers the
    same call as its own pthread_atfork handler, so this changes nothing a fork would not; the pool
    restarts, with the same thread count, on the child's first threaded BLAS call."""
    with open("/proc/self/maps") as maps:
        libs = {line.split()[-1] for line in maps if "openblas" in line.rsplit("/", 1)[-1].lower()}
    for path in sorted(libs):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(path).blas_thread_shutdown_()


def fork_refusal() -> str | None:
    """Why this process must not fork now, or None: the warm launcher before each child, a forked arm child before
    its server (repro.engine.served.ForkedServer)."""
    import torch

    if torch.cuda.is_initialized():
        return "CUDA was initialised in the launcher"
    _openblas_pools_down()
    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads are running"
    tasks = os.listdir("/proc/self/task")
    if len(tasks) != 1:
        return f"{len(tasks)} threads are running (/proc/self/task)"
    return None


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


def run_module(argv: list[str]) -> object:
    """Run argv (`PYTHON -m MODULE ARGS`) in this process as `python -m` runs it: sys.argv, a fresh __main__,
    runpy. Its SystemExit's code, or None where the module returned; any other exception propagates."""
    sys.argv = ["-m", *argv[3:]]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        runpy._run_module_as_main(argv[2])
    except SystemExit as exc:
        return exc.code
    return None
