"""Runner side of the warm-import launcher (repro.engine.warm): CPU engine children forked from a process that
has imported vLLM once, instead of each spawning a fresh interpreter that spends seconds importing it.

Off unless KVKIT_WARM_IMPORT=1 is in the kit's environment (the test suite sets it: tests/conftest.py).
Only `PYTHON -m repro.engine JOB` children of a CPU engine use it (repro.run.runner.run_arm says which);
every other child, and any child the launcher refuses, is spawned as before. One launcher per interpreter
path, working directory and exact environment (a child whose environment differs in any byte gets its own
launcher, or is spawned once MAX_LAUNCHERS are running). A launcher runs on a lifeline like any child, so
it dies with the kit; the kit stops the ones it started at exit.

WarmChild stands in for subprocess.Popen: pid (the group's id too), poll, wait, returncode, the exit status
the launcher reaped. If the launcher is gone before the child's status came, the child's group is killed
and its returncode is -SIGKILL, with a line in its log saying so.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from repro.run.lifeline import group_members

SWITCH = "KVKIT_WARM_IMPORT"
MODULE = "repro.engine.warm"
MAX_LAUNCHERS = 4
READY_S = 300.0  # a launcher's import on a loaded machine
_MAX_MSG = 1 << 16


def enabled() -> bool:
    return os.environ.get(SWITCH) == "1"


class WarmChild:
    """A forked child's Popen-like handle; its status comes from the launcher over conn."""

    def __init__(self, pid: int, conn: socket.socket, args: list[str], log_path: Path):
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._conn = conn
        self._log_path = log_path
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        return self._receive(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._receive(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return code

    def _receive(self, timeout: float | None) -> int | None:
        if self.returncode is not None:
            return self.returncode
        try:  # not under the lock: a kill_group from another thread polls meanwhile
            ready, _, _ = select.select([self._conn], [], [], timeout)
        except (ValueError, OSError):  # another thread read the status and closed the socket
            return self.returncode
        if not ready:
            return None
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            try:
                msg = self._conn.recv(_MAX_MSG, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
            except OSError:
                msg = b""
            if msg.startswith(b"exit "):
                self.returncode = os.waitstatus_to_exitcode(int(msg.split()[1]))
            else:
                self.returncode = self._launcher_lost()
            self._conn.close()
            return self.returncode

    def _launcher_lost(self) -> int:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while group_members(self.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(OSError), open(self._log_path, "ab") as log:
            log.write(
                b"kvkit warm launcher: the launcher exited before this child's status came; its group was killed\n"
            )
        return -signal.SIGKILL


class _Launcher:
    def __init__(self, key: tuple, proc, lifeline: int, sock_path: Path, tmp: str):
        self.key, self.proc, self.lifeline, self.sock_path, self.tmp = key, proc, lifeline, sock_path, tmp

    def ready(self, deadline: float) -> bool:
        while time.monotonic() < deadline:
            if self.sock_path.exists():
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the launcher and its lifeline watcher; never an arm child
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5.0)
        with contextlib.suppress(OSError):
            os.close(self.lifeline)
        shutil.rmtree(self.tmp, ignore_errors=True)


_LAUNCHERS: dict[tuple, _Launcher | None] = {}  # None: this key's launcher failed to start; spawn its children
_LOCK = threading.Lock()
_SAID: set[str] = set()


def _key(argv: list[str], env: dict[str, str]) -> tuple:
    environ = tuple(sorted((k.encode(), v.encode()) for k, v in env.items()))
    return (os.path.abspath(argv[0]), os.path.realpath(argv[0]), os.getcwd(), environ)


def _say(line: str) -> None:
    if line not in _SAID:
        _SAID.add(line)
        print(f"[kvkit] warm launcher: {line}", file=sys.stderr, flush=True)


def _launcher(argv: list[str], env: dict[str, str], spawn) -> _Launcher | None:
    key = _key(argv, env)
    with _LOCK:
        if key in _LAUNCHERS:
            launcher = _LAUNCHERS[key]
        elif sum(1 for v in _LAUNCHERS.values() if v is not None) >= MAX_LAUNCHERS:
            return None
        else:
            tmp = tempfile.mkdtemp(prefix="kvkit-warm-")
            sock = Path(tmp) / "s"
            log = Path(tmp) / "launcher.log"
            proc, lifeline = spawn([argv[0], "-m", MODULE, str(sock), str(log)], log_path=log, env=env)
            launcher = _Launcher(key, proc, lifeline, sock, tmp)
            _LAUNCHERS[key] = launcher
    if launcher is None:
        return None
    if launcher.ready(time.monotonic() + READY_S):
        return launcher
    with _LOCK:
        if _LAUNCHERS.get(key) is launcher:
            _LAUNCHERS[key] = None
            log = Path(launcher.tmp) / "launcher.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            _say(f"a launcher did not start; its children are spawned. Its log's tail:\n{tail}")
            launcher.stop()
    return None


def prepare(argv: list[str], env: dict[str, str], spawn) -> None:
    """Start argv's launcher and wait until it is ready (or failed). The runner calls this before it takes the lock
    under which children start (repro.run.runner.starting), so that a launcher's import holds up neither the other
    arms' starts nor a stop."""
    _launcher(argv, env, spawn)


def start(argv: list[str], *, log_path: Path, env: dict[str, str], read_fd: int, spawn) -> WarmChild | None:
    """Fork argv from a warm launcher, its lifeline read_fd handed over; None: spawn it as usual. spawn starts
    a launcher as the runner starts any child (repro.run.runner.start_child)."""
    launcher = _launcher(argv, env, spawn)
    if launcher is None:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(str(launcher.sock_path))
        request = {"argv": argv, "log": str(log_path)}
        socket.send_fds(conn, [json.dumps(request).encode()], [read_fd])
        reply = conn.recv(_MAX_MSG)
    except OSError as exc:
        conn.close()
        _say(f"the launcher could not be reached ({exc}); spawning")
        return None
    if not reply.startswith(b"pid "):
        conn.close()
        _say(f"the launcher refused ({reply.decode(errors='replace')}); spawning")
        return None
    return WarmChild(int(reply.split()[1]), conn, argv, log_path)


@atexit.register
def stop_launchers() -> None:
    with _LOCK:
        launchers = [v for v in _LAUNCHERS.values() if v is not None]
        _LAUNCHERS.clear()
    for launcher in launchers:
        launcher.stop()
