"""`python -m repro.engine.warm SOCKET LOG [--owner PID]`: a warm-import launcher for CPU engine children
(KVKIT_WARM_IMPORT).

The runner (repro.run.warm) starts one launcher per interpreter, working directory and exact environment (but
for the variables a child reads only at run time), on a lifeline like any child. The launcher imports vLLM and
torch once (with repro.engine.child and the modules PRELOAD names, which an arm child imports as it builds its
engine), traces vLLM's one compiled sampler op under one torch thread (_trace_sampler_op), builds no engine and
starts no thread, then serves requests on a Unix SOCK_SEQPACKET socket: each
request is a JSON message {"argv": [python, "-m", module, ARGS...], "log": path, "run_time_env": {NAME: value, or
null for unset}} with the arm's lifeline read end attached (SCM_RIGHTS). For each it forks a child that:

- becomes the leader of a new session (setsid), so the runner's kill_group and the lifeline stop its group;
- sends its stdin to /dev/null and its stdout and stderr to the arm log (opened as the runner opens it:
  truncated), which starts with what the launcher printed while importing (the lines a spawned child
  prints at the same point), then FORKED_LINE;
- forks the lifeline watcher on the same pipe (repro.run.lifeline.watch), as `lifeline.py FD -- ARGV` does;
- sets the run-time variables the request names (removes those it gives as null), so that its environment is
  the one the runner asked for;
- reseeds Python's and numpy's global random generators from the OS (a spawned interpreter starts with
  fresh ones; forked children would otherwise share the launcher's state);
- runs the module as `python -m module ARGS` does (runpy._run_module_as_main, a fresh __main__), and
  exits as the interpreter does (non-daemon threads joined, atexit handlers, streams flushed, its exit status),
  less the teardown of every module the launcher imported (repro.engine.forked.exit_now): with vLLM's, that
  took about 1.8 s of each child's life after its work was done (the engine child leaves with os._exit anyway).
  A module that ends with any exception but SystemExit leaves the usual way (traceback, status 1, the full
  teardown).

The launcher answers `pid N` once the child is forked, then `exit STATUS` (the raw wait status) once it
reaped it, on the same connection. It refuses (`refuse WHY`, the runner then spawns the child as usual)
when a thread other than its own is running (threading.active_count, /proc/self/task, after stopping the
OpenBLAS thread pools as their own fork handlers would) or CUDA was initialised. The hash seed is the
launcher's, which is the child's: the launcher started under the child's exact environment, PYTHONHASHSEED
included.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import random
import selectors
import socket
import sys
import time

from repro.engine import forked
from repro.run import lifeline

_MAX_MSG = 1 << 16
FORKED_LINE = "kvkit warm launcher: this child was forked (vLLM imported once) by launcher pid"


# What a CPU arm child imports past `import vllm` while it builds its engine and generates (about 1,300 modules and
# 4 s of each forked child's life, measured with the tiny Qwen3 model): imported here once instead. A name this
# vLLM lacks is passed over; the child imports what it needs either way.
PRELOAD = (
    "vllm.entrypoints.llm",
    "vllm.v1.engine.llm_engine",
    "vllm.v1.engine.core",
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.core.kv_cache_manager",
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.v1.worker.cpu.model_runner",  # vLLM 0.34's CPU runner (the V1 runner above is gone there)
    "vllm.v1.attention.backends.cpu_attn",
    "vllm.v1.sample.sampler",
    "vllm.model_executor.models.qwen3",
    "vllm.distributed.device_communicators.shm_broadcast",
    "vllm.entrypoints.openai.chat_completion.protocol",
    "vllm.entrypoints.openai.responses.protocol",
    "vllm.tool_parsers",
    "vllm.plugins.lora_resolvers.filesystem_resolver",
    "vllm.entrypoints.openai.api_server",  # a served arm's server, forked from its child (repro.engine.served)
    "repro.engine.capabilities",
    "repro.engine.frontend",
    "repro.engine.kvaudit",
    "repro.engine.kvaudit_hooks",
    "repro.engine.worker_facts",
)


def _warm_up() -> None:
    import torch  # noqa: F401
    import vllm
    import vllm.engine.arg_utils  # noqa: F401

    import repro.engine.child  # noqa: F401

    for name in PRELOAD:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    _trace_sampler_op()


def _trace_sampler_op() -> None:
    """Trace, once here, the one function vLLM's sampler runs through torch.compile on the CPU: the rank of each
    token's logprob (vllm.v1.sample.ops.logprobs.batched_count_greater_than, called by Sampler.gather_logprobs
    whenever logprobs are asked for, which every arm does). Every process traces it on its first call: with
    dynamo's and inductor's first use, about 1.2 s of each forked arm's first generation (measured on two
    cores). Its traced code is kept on the function, which the forked children inherit; dynamo's guards still
    decide, call by call, whether that code serves (the thread count is among them: a child that runs with
    another count traces again, in about 0.1 s with the rest done here). The op counts comparisons, so its
    output is the same integers however it was compiled.

    Called as vLLM calls it (Sampler.gather_logprobs, in inference mode), with two vocabulary sizes, so that the
    code kept has the vocabulary as a symbol and serves every model's. Under one torch thread, so no
    OpenMP pool starts here, and with tqdm's monitor thread off: the launcher forks only with no thread but
    its own (forked.fork_refusal), which it checks before every fork as before. A failure here leaves every
    child to trace it itself, as a spawned one does."""
    import torch

    try:
        from vllm.v1.sample.sampler import Sampler
    except ImportError:
        return
    gather = getattr(Sampler, "gather_logprobs", None)
    if gather is None:
        return
    try:
        from tqdm import tqdm as tqdm_cls  # a dependency of vLLM's; inductor's compile may show a bar
    except ImportError:
        tqdm_cls = None
    interval = getattr(tqdm_cls, "monitor_interval", None)
    threads = torch.get_num_threads()
    try:
        if tqdm_cls is not None:
            tqdm_cls.monitor_interval = 0
        torch.set_num_threads(1)
        with torch.inference_mode():
            for vocab in (320, 321):
                logprobs = torch.zeros(1, vocab).log_softmax(-1)
                gather(logprobs, 1, torch.zeros(1, dtype=torch.int64))
    except Exception as exc:  # noqa: BLE001 - the children trace it themselves, as a spawned child does
        print(f"kvkit warm launcher: vLLM's sampler op not traced here ({exc!r})", file=sys.stderr)
    finally:
        torch.set_num_threads(threads)
        if tqdm_cls is not None:
            tqdm_cls.monitor_interval = interval


def _orphaned(sock_path: str, owner: int | None) -> bool:
    """A pooled launcher's end (repro.run.warm's pool): its owner process is gone, or its socket was removed."""
    if owner is None:
        return False
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return not os.path.exists(sock_path)


def serve(sock_path: str, log_path: str, owner: int | None = None) -> dict | None:
    """Serve until the launcher is stopped (or, given an owner pid, until that process is gone or the socket was
    removed: then None); in a forked child, return its request."""
    _warm_up()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        with open(log_path, "rb") as log:
            preamble = log.read()
    except OSError:
        preamble = b""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(sock_path + ".tmp")
    server.listen(16)
    os.rename(sock_path + ".tmp", sock_path)  # the runner connects once the socket is there
    print(f"kvkit warm launcher: ready on {sock_path}", file=sys.stderr, flush=True)
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ)
    by_pid: dict[int, socket.socket] = {}
    checked = time.monotonic()
    while True:
        _reap(by_pid)
        if time.monotonic() - checked > 1.0:
            checked = time.monotonic()
            if _orphaned(sock_path, owner):
                print("kvkit warm launcher: the pool's owner is gone or the socket removed; stopping", file=sys.stderr)
                server.close()
                return None
        for key, _ in sel.select(timeout=0.05):
            if key.fileobj is server:
                conn, _ = server.accept()
                msg, fds, _flags, _addr = socket.recv_fds(conn, _MAX_MSG, 1)
                request = json.loads(msg)
                if len(fds) != 1:
                    conn.send(b"refuse no lifeline descriptor came with the request")
                    conn.close()
                    continue
                why = forked.fork_refusal()
                if why is not None:
                    os.close(fds[0])
                    conn.send(f"refuse {why}".encode())
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    server.close()
                    conn.close()
                    for other in by_pid.values():
                        other.close()
                    return {**request, "lifeline_fd": fds[0], "preamble": preamble}
                os.close(fds[0])
                by_pid[pid] = conn
                sel.register(conn, selectors.EVENT_READ)
                conn.send(f"pid {pid}".encode())
            else:  # the runner closed its end (it got the exit, or it is gone): nothing to tell any more
                conn = key.fileobj
                with contextlib.suppress(OSError):
                    if conn.recv(_MAX_MSG):
                        continue
                sel.unregister(conn)
                conn.close()
                for pid, c in list(by_pid.items()):
                    if c is conn:
                        by_pid[pid] = None  # still reaped, its status goes nowhere


def _reap(by_pid: dict) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = by_pid.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(f"exit {status}".encode())


def become_child(request: dict) -> None:
    """In the forked child: the session, descriptors and lifeline watcher a spawned child has, then the module."""
    os.setsid()
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
    log = os.open(request["log"], flags, 0o666)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    os.write(2, request["preamble"])
    os.write(2, f"{FORKED_LINE} {os.getppid()}\n".encode())
    read_fd = request["lifeline_fd"]
    if os.fork() == 0:
        lifeline.watch(read_fd, os.getpgrp())
    os.close(read_fd)
    for name, value in (request.get("run_time_env") or {}).items():  # the runner's RUN_TIME_ENV: set, or removed
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    random.seed()
    child = sys.modules.get("repro.engine.child")
    if child is not None:  # its engine_start_s and import_s count from this process's start, here the fork
        child._T_PROCESS = time.monotonic()
    forked.FORKED = True
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    argv = request["argv"]
    if len(argv) < 3 or argv[1] != "-m":
        raise SystemExit(f"kvkit warm launcher: not a `python -m MODULE` command: {argv}")
    forked.exit_now(forked.run_module(argv))


if __name__ == "__main__":
    # SOCKET LOG [--owner PID]: a pooled launcher names the pool's owner process
    _owner = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--owner" else None
    _request = serve(sys.argv[1], sys.argv[2], _owner)
    if _request is not None:
        become_child(_request)
