"""Runner side of the warm-import launcher (repro.engine.warm): CPU engine children forked from a process that
has imported vLLM once, instead of each spawning a fresh interpreter that spends seconds importing it.

Off unless KVKIT_WARM_IMPORT=1 is in the kit's environment (the test suite sets it: tests/conftest.py).
Only `PYTHON -m repro.engine JOB` children of a CPU engine use it (repro.run.runner.run_arm says which);
every other child, and any child the launcher refuses, is spawned as before. One launcher per interpreter
path, working directory and exact environment but for RUN_TIME_ENV (a child whose environment differs in any other
byte gets its own launcher, or is spawned once MAX_LAUNCHERS are running). A variable of RUN_TIME_ENV is one the
child reads only once it runs, never at import: it goes with each request, and the forked child sets it (or
removes it) before its module runs, so a child gets the environment it asked for, byte for byte. A launcher runs
on a lifeline like any child, so it dies with the kit; the kit stops the ones it started at exit.

With KVKIT_WARM_POOL naming a folder (the test suite sets it: tests/conftest.py), the launchers live there and
every kit process that names the folder shares them, so a key's import is paid once per test session, not once per
run: a pooled launcher is started outside any run's lifeline (a session of its own) and stops when the folder's
owner process is gone or its socket was removed. A key the pool cannot serve (full, or its launcher did not start)
gets a launcher of the run's own, as without a pool.

WarmChild stands in for subprocess.Popen: pid (the group's id too), poll, wait, returncode, the exit status
the launcher reaped. If the launcher is gone before the child's status came, the child's group is killed
and its returncode is -SIGKILL, with a line in its log saying so.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
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

from repro.contract.job import PREFLIGHT_GATE_ENV
from repro.plan.endpoint import ENDPOINT_URL_ENV
from repro.plan.options import FRONTEND_ENV, STREAM_ENV
from repro.run.lifeline import group_members

SWITCH = "KVKIT_WARM_IMPORT"
MODULE = "repro.engine.warm"
MAX_LAUNCHERS = 4
READY_S = 300.0  # a launcher's import on a loaded machine
# read by the child at run time only (repro.engine.child.wait_for_preflight), so not a launcher's key: a --jobs 2
# run's second arm, started during the first arm's preflight, shares the launcher of its slot's later arms. pytest's
# name of the test running now is read by nothing of the kit's, and differs between runs a pool serves. A CPU arm's
# slot (VLLM_CPU_OMP_THREADS_BIND: repro.plan.arms.arm_slots) is read once the child runs: the engine child pins its
# process to the slot's cores before vLLM or torch starts a thread (repro.engine.child.slot_cores), and vLLM reads
# it through vllm.envs (evaluated when read) as its executor and worker start, never at import. So a --jobs 2 run's
# slots, and a run one arm at a time (the variable unset), share one launcher per key, not one each (a session of
# the suite had filled its pool of 12 with slot twins, and later runs started launchers of their own).
# The front end (KVKIT_FRONTEND), a served arm's streaming (KVKIT_SERVER_STREAM) and an endpoint arm's server
# (KVKIT_ENDPOINT_URL, one per arm) are read as the child builds its engine (repro.engine.frontend.build_frontend,
# repro.engine.served), never at import: the launcher imports every front end's modules alike (PRELOAD), so the sync,
# async and served runs of a session share it, and so do both arms of a `repro endpoint` run.
RUN_TIME_ENV = (
    PREFLIGHT_GATE_ENV, "PYTEST_CURRENT_TEST", "VLLM_CPU_OMP_THREADS_BIND", FRONTEND_ENV, STREAM_ENV, ENDPOINT_URL_ENV
)  # fmt: skip
# A folder of launchers shared by every kit process that names it (the test suite's: tests/conftest.py), so a
# key's import is paid once per test session rather than once per run. Its file `owner` holds the pid of the
# process that made it: a pooled launcher stops when that process is gone or its socket was removed.
POOL_ENV = "KVKIT_WARM_POOL"
# launchers in a pool (each holds vLLM imported, about 0.5 GB); past it, a run starts its own. A soft cap: two kit
# processes starting launchers of different keys at the same moment may both pass it (one lock file per key)
POOL_MAX = 12
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


def _ready(sock_path: Path, proc, deadline: float) -> bool:
    """Whether the launcher proc serves sock_path before the deadline (False: it exited, or the time ran out)."""
    while time.monotonic() < deadline:
        if sock_path.exists():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.1)
    return False


class _Launcher:
    def __init__(self, key: tuple, proc, lifeline: int, sock_path: Path, tmp: str):
        self.key, self.proc, self.lifeline, self.sock_path, self.tmp = key, proc, lifeline, sock_path, tmp

    def ready(self, deadline: float) -> bool:
        return _ready(self.sock_path, self.proc, deadline)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the launcher and its lifeline watcher; never an arm child
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5.0)
        with contextlib.suppress(OSError):
            os.close(self.lifeline)
        shutil.rmtree(self.tmp, ignore_errors=True)


class _Pooled:
    """A launcher of the pool (POOL_ENV): this process did not start it, and never stops it."""

    def __init__(self, sock_path: Path):
        self.sock_path = sock_path


_LAUNCHERS: dict[tuple, _Launcher | None] = {}  # None: this key's launcher failed to start; spawn its children
_POOLED: dict[tuple, _Pooled | None] = {}  # None: the pool could not serve this key; a launcher of this run's
_LOCK = threading.Lock()
_SAID: set[str] = set()


def _launcher_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in RUN_TIME_ENV}


def _key(argv: list[str], env: dict[str, str]) -> tuple:
    environ = tuple(sorted((k.encode(), v.encode()) for k, v in _launcher_env(env).items()))
    return (os.path.abspath(argv[0]), os.path.realpath(argv[0]), os.getcwd(), environ)


def _say(line: str) -> None:
    if line not in _SAID:
        _SAID.add(line)
        print(f"[kvkit] warm launcher: {line}", file=sys.stderr, flush=True)


def _pooled(pool: Path, key: tuple, argv: list[str], env: dict[str, str]) -> _Pooled | None:
    """The pool's launcher for key, started here (under a lock file, so one process starts it) if it has none
    yet; None: the pool is full, or its launcher did not start (a run's own launcher then serves the key)."""
    with _LOCK:
        if key in _POOLED:
            return _POOLED[key]
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:20]
    home = pool / digest
    found: _Pooled | None = None
    try:
        with open(pool / f"{digest}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            sock = home / "s"
            if sock.exists():
                found = _Pooled(sock)
            elif home.is_dir() or sum(1 for d in pool.iterdir() if d.is_dir()) < POOL_MAX:
                home.mkdir(exist_ok=True)
                owner = (pool / "owner").read_text().strip()
                with open(home / "launcher.log", "wb") as log:
                    proc = subprocess.Popen(
                        [argv[0], "-m", MODULE, str(sock), str(home / "launcher.log"), "--owner", owner],
                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=_launcher_env(env),
                        start_new_session=True,
                    )  # fmt: skip
                if _ready(sock, proc, time.monotonic() + READY_S):
                    found = _Pooled(sock)
                else:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    _say(f"a pooled launcher did not start (its log: {home / 'launcher.log'}); this run starts its own")
    except OSError as exc:
        _say(f"the launcher pool {pool} could not be used ({exc}); this run starts its own launchers")
    with _LOCK:
        _POOLED.setdefault(key, found)
        return _POOLED[key]


def _launcher(argv: list[str], env: dict[str, str], spawn) -> _Launcher | _Pooled | None:
    key = _key(argv, env)
    # the child's environment names the pool (it is this process's own, copied, in every run): a test that gives one
    # child another pool changes nothing for the runs other threads of its process start meanwhile
    pool = env.get(POOL_ENV)
    if pool:
        pooled = _pooled(Path(pool), key, argv, env)
        if pooled is not None:
            return pooled
    with _LOCK:
        if key in _LAUNCHERS:
            launcher = _LAUNCHERS[key]
        elif sum(1 for v in _LAUNCHERS.values() if v is not None) >= MAX_LAUNCHERS:
            return None
        else:
            tmp = tempfile.mkdtemp(prefix="kvkit-warm-")
            sock = Path(tmp) / "s"
            log = Path(tmp) / "launcher.log"
            proc, lifeline = spawn([argv[0], "-m", MODULE, str(sock), str(log)], log_path=log, env=_launcher_env(env))
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


def serves(argv: list[str], env: dict[str, str]) -> bool:
    """Whether a ready launcher for argv's key is already this process's (one of its CPU engine children was forked
    from it). A child too short to be worth a launcher's import of its own (the KV comparison, about 1.7 CPU-s of
    importing torch in each) is forked only then, from the launcher its run's baseline came from."""
    key = _key(argv, env)
    with _LOCK:
        return _POOLED.get(key) is not None or _LAUNCHERS.get(key) is not None


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
        request = {"argv": argv, "log": str(log_path), "run_time_env": {k: env.get(k) for k in RUN_TIME_ENV}}
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
        _POOLED.clear()  # the pool's launchers are its owner's to stop
    for launcher in launchers:
        launcher.stop()
