"""LMCacheMPConnector on a real GPU: the LMCache MP server the kit starts for the arm never outlives
the run, whether the kit is killed with SIGKILL mid-arm (its lifeline stops the server's process
group and the engines', repro.run.lifeline) or interrupted with Ctrl-C (it stops them itself and exits
130 with no report, repro.verify._interrupted). The CPU versions, with stand-ins for vLLM and the
server, are tests/test_lifeline_e2e.py, tests/test_cli_failures.py and tests/test_lmcache_mp_arm.py.

Each test runs the kit once with two arms, baseline and LMCacheMPConnector, and strikes when the MP
arm's engine core is up: by then the server has answered its health check (the kit starts the arm's
engine only after that, repro.lmcache.mp.mp_server). KVKIT_GPU_MODEL, if set, is the float16 tiny
model to use (else it is built under .cache/models)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import NamedTuple

import pytest
from kvkit_testutil import ROOT

from repro.errors import EXIT_INTERRUPTED
from repro.lmcache.mp import CONNECTOR, SERVER_MODULE, server_log_path
from repro.plan.options import DEFAULT_ENGINE_MODULE
from repro.run import lifeline


def _skip_reason() -> str | None:
    """No conftest here: a second conftest.py would shadow tests/conftest.py for `import conftest`."""
    if (
        shutil.which("nvidia-smi") is None
        or subprocess.run(["nvidia-smi", "-L"], capture_output=True, check=False).returncode
    ):
        return "needs a CUDA GPU (nvidia-smi found none)"
    if find_spec("lmcache") is None or find_spec("vllm") is None:
        return "needs vllm and lmcache installed (PROFILE=gpu-lmcache-0.5.4)"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))]

COMMON = [
    "--dtype",
    "float16",
    "--gpu-memory-utilization",
    "0.45",
    "--max-model-len",
    "2048",
    "--block-size",
    "16",
    "--max-tokens",
    "16",
    "--seed",
    "0",
    "--device",
    "cuda",
]

# The first engine start on a fresh GPU machine takes about 160 s; the MP arm's server and engine
# start while the baseline's engine does (--jobs 2), so its engine core is up within about as long.
START_WAIT_S = 360.0
INTERRUPT_EXIT_S = 120.0  # the kit stops each group with SIGTERM, then SIGKILL after 10 s (runner.GRACE_S)
CLEANUP_S = 60.0  # after the kit is gone, the time its processes get to go (the lifeline needs ~3 s)
_POLL_S = 0.2


@dataclass(frozen=True)
class Marks:
    """How the kit's processes are told apart by their argv (the CPU stand-ins use other names)."""

    server_module: str = SERVER_MODULE  # the server's `python -m` module: finds it among the kit's children
    server_mark: str = "lmcache.v1.multiprocess"  # no process with this in its command line may be left
    engine_module: str = DEFAULT_ENGINE_MODULE  # the arms' children: `python -m repro.engine WORK/ARM.job.json`
    core_mark: str = "EngineCor"  # vLLM's engine core process (its title, VLLM::EngineCore; comm is cut at 15)


GPU = Marks()


@pytest.fixture(scope="module")
def tiny_model_fp16() -> str:
    given = os.environ.get("KVKIT_GPU_MODEL")
    if given:
        return str(Path(given).resolve())
    from repro.models.tiny import FP16_MODEL_SEED, make_tiny_model

    path = ROOT / ".cache" / "models" / f"kvkit-tiny-qwen3-seed{FP16_MODEL_SEED}"
    make_tiny_model(path, seed=FP16_MODEL_SEED)
    return str(path)


def mp_argv(model: str, report: Path) -> list[str]:
    """Two arms, baseline and LMCacheMPConnector (plan_arms: the command line's connector, no native
    arms without --compare-native), on the fixture's one probe. --jobs 2 (the CUDA default, made
    explicit): the MP arm starts its server as soon as the baseline's child has passed the preflight,
    so its engine comes up while the baseline's does, not after it."""
    return ["--model", model, "--kv-connector", CONNECTOR, "--lmcache-config", "fixtures/lmcache-local-cpu.yaml",
            *COMMON, "--fixture", "fixtures/selftest-gpu-lmcache.json", "--jobs", "2", "--quiet",
            "--report", str(report)]  # fmt: skip


# --- /proc ---------------------------------------------------------------------------------------


class Proc(NamedTuple):
    pid: int
    ppid: int
    pgid: int
    state: str
    start: int  # start time in clock ticks after boot: with the pid, one process (pids are reused)
    argv: tuple[str, ...]
    comm: str

    @property
    def cmdline(self) -> str:
        return " ".join(self.argv)

    @property
    def live(self) -> bool:
        return self.state not in ("Z", "X")  # a zombie has released everything; only its parent can reap it

    def show(self) -> str:
        return f"{self.pid} [pgid {self.pgid}, {self.state}] {self.comm}: {self.cmdline[:200]}"


def ps() -> list[Proc]:
    """Every process now (those that vanish while being read are left out)."""
    procs = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
            comm = Path(f"/proc/{entry}/comm").read_text().strip()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ... starttime
        argv = tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)
        procs.append(Proc(int(entry), int(fields[1]), int(fields[2]), fields[0], int(fields[19]), argv, comm))
    return procs


def descendants(root: int, procs: list[Proc]) -> list[Proc]:
    """root's children, their children, and so on (root itself not included)."""
    children: dict[int, list[Proc]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p)
    out, todo = [], [root]
    while todo:
        for p in children.get(todo.pop(), []):
            out.append(p)
            todo.append(p.pid)
    return out


def flag_value(argv: tuple[str, ...], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else None


# --- one run of the kit --------------------------------------------------------------------------


@dataclass
class KitRun:
    cli: subprocess.Popen
    report: Path
    stdout: Path
    stderr: Path
    marks: Marks
    seen: dict[tuple[int, int], Proc] = field(default_factory=dict)  # every descendant seen while the kit ran
    groups: dict[int, Proc] = field(default_factory=dict)  # the process groups the kit started, by leader
    server: Proc | None = None  # the MP server (the leader of its group: the lifeline execs it in place)
    engine: Proc | None = None  # the MP arm's engine child (the leader of its group)
    core: Proc | None = None  # vLLM's engine core under it

    def observe(self) -> list[Proc]:
        """The kit's descendants now; each child it started leads a process group of its own
        (runner.start_child: a new session), and its descendants are in that group."""
        kids = descendants(self.cli.pid, ps())
        for p in kids:
            self.seen[(p.pid, p.start)] = p
            if p.ppid == self.cli.pid and p.pgid == p.pid:
                self.groups[p.pid] = p  # the latest argv: after the lifeline's exec, the child's own
        return kids

    @property
    def workdir(self) -> Path | None:
        """The run's work dir: the engine child's job file is in it (runner.run_arm)."""
        return Path(self.engine.argv[-1]).parent if self.engine is not None else None

    def tails(self) -> str:
        parts = [f"kit stderr:\n{_tail(self.stderr)}"]
        if self.workdir is not None:
            parts.append(f"server log:\n{_tail(server_log_path(self.workdir, CONNECTOR))}")
            parts.append(f"MP arm log:\n{_tail(self.workdir / f'{CONNECTOR}.log')}")
        return "\n".join(parts)


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_bytes()[-n:].decode(errors="replace")
    except OSError as exc:
        return f"({exc.strerror or exc})"


def start_kit(argv: list[str], tmp_path: Path, marks: Marks = GPU, env: dict | None = None) -> KitRun:
    """The kit's CLI in a session of its own: only the test signals it, and a failed test can stop
    it without touching pytest. Its output goes to files (read on failure)."""
    report = Path(argv[argv.index("--report") + 1])
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    out, err = tmp_path / "kit.stdout", tmp_path / "kit.stderr"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        cli = subprocess.Popen(
            [sys.executable, "-m", "repro.verify_kv_reuse", *argv],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": pythonpath, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=fo,
            stderr=fe,
            start_new_session=True,
        )
    return KitRun(cli, report, out, err, marks)


def wait_mid_mp_arm(run: KitRun, timeout_s: float = START_WAIT_S) -> None:
    """Poll until the MP arm is mid-run: its server's group and its engine child's group both live,
    and vLLM's engine core started under the engine child. The engine child is the proof the server
    was ready (the kit starts it only after the health check answered and the connector's port
    accepted, lmcache_mp.wait_ready), and the engine core the proof the arm's engine is being built,
    its connector pointed at the server. Both are the kit's direct children, found by their argv."""
    m = run.marks
    job = f"{CONNECTOR}.job.json"
    deadline = time.monotonic() + timeout_s
    while True:
        rc = run.cli.poll()
        assert rc is None, f"the kit exited (status {rc}) before the MP arm's engine core was up\n{run.tails()}"
        assert time.monotonic() < deadline, f"the MP arm's engine core was not up within {timeout_s:g} s\n{run.tails()}"
        kids = run.observe()
        leaders = [p for p in kids if p.pid in run.groups and p.live]
        server = next((p for p in leaders if m.server_module in p.argv), None)
        engine = next((p for p in leaders if m.engine_module in p.argv and p.argv[-1].endswith(job)), None)
        if server is not None and engine is not None:
            core = next(
                (p for p in kids if p.pgid == engine.pid and p.live and m.core_mark in p.comm + p.cmdline), None
            )
            if core is not None:
                run.server, run.engine, run.core = server, engine, core
                return
        time.sleep(_POLL_S)


def leftovers(run: KitRun) -> dict[str, list[str]]:
    """What of the run is still alive (zombies count as gone): any process whose command line has the
    server's module in it and that is in the server's group or listens on its port (a server that left
    its group would still have its argv), any member of a group the kit started (the server's, the
    engines'), and any descendant of the kit seen while it ran."""
    live = [p for p in ps() if p.live]
    assert run.server is not None
    port = flag_value(run.server.argv, "--port")
    left = {
        "LMCache MP server processes": [
            p
            for p in live
            if run.marks.server_mark in p.cmdline and (p.pgid == run.server.pid or flag_value(p.argv, "--port") == port)
        ]
    }
    for leader in run.groups.values():
        left[f"process group {leader.pid} ({leader.cmdline[:120]})"] = [p for p in live if p.pgid == leader.pid]
    left["descendants of the kit"] = [p for p in live if (p.pid, p.start) in run.seen]
    return {what: [p.show() for p in procs] for what, procs in left.items() if procs}


def wait_all_gone(run: KitRun, timeout_s: float = CLEANUP_S) -> dict[str, list[str]]:
    deadline = time.monotonic() + timeout_s
    while (left := leftovers(run)) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    return left


def last_resort_cleanup(run: KitRun) -> None:
    """After the assertions, pass or fail: stop whatever the kit left, so a failing test leaves nothing
    behind (when the test passed there is nothing left and this does nothing)."""
    if run.cli.poll() is None:
        run.cli.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        run.cli.wait(timeout=10)
    for leader in run.groups:
        if lifeline.group_members(leader):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(leader, signal.SIGKILL)
    alive = {(p.pid, p.start) for p in ps() if p.live}
    for pid, start in run.seen:
        if (pid, start) in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


# --- the two cases (the CPU stand-ins can drive them too) ----------------------------------------


def check_kill_9(run: KitRun) -> None:
    """kill -9 of the kit mid-arm: nothing runs in it, so each child's lifeline watcher must stop its
    group (SIGTERM, SIGKILL after lifeline.GRACE_S), the server's included."""
    try:
        wait_mid_mp_arm(run)
        run.cli.kill()  # the CLI alone: its children are in sessions of their own
        run.cli.wait(timeout=30)
        left = wait_all_gone(run)
        assert not left, f"still alive {CLEANUP_S:g} s after kill -9 of the kit: {left}\n{run.tails()}"
        # the server's group and the MP engine's were stopped by their lifelines, not found gone by
        # luck: each watcher says so in its group's log before it signals (repro.run.lifeline.watch)
        for log, leader in (
            (server_log_path(run.workdir, CONNECTOR), run.server),
            (run.workdir / f"{CONNECTOR}.log", run.engine),
        ):
            said = f"kvkit lifeline: the kit is gone; stopping process group {leader.pid}"
            assert said in _tail(log, 1 << 20), f"{log} lacks {said!r}\n{run.tails()}"
        assert not run.report.exists(), "a SIGKILLed kit wrote a report"
        assert not run.report.with_name(f"{run.report.stem}.logs").exists(), "a SIGKILLed kit published logs"
    finally:
        last_resort_cleanup(run)


def check_sigint(run: KitRun) -> None:
    """Ctrl-C mid-arm: the kit stops every child's group and every server's (run_arms, stop_all_children
    and lmcache_mp.stop_all_servers), removes its work dir, writes no report and exits 130
    (repro.verify._interrupted returns repro.errors.EXIT_INTERRUPTED; repro/plan/options.py's exit codes)."""
    try:
        wait_mid_mp_arm(run)
        # to the kit alone, as a terminal's Ctrl-C reaches it: its children are in sessions of their own
        run.cli.send_signal(signal.SIGINT)
        try:
            rc = run.cli.wait(timeout=INTERRUPT_EXIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the kit did not exit within {INTERRUPT_EXIT_S:g} s of SIGINT\n{run.tails()}")
        err = _tail(run.stderr, 1 << 20)
        assert rc == EXIT_INTERRUPTED == 130, f"exit status {rc}\n{run.tails()}"
        assert "interrupted" in err and "Traceback" not in err, err
        left = wait_all_gone(run)
        assert not left, f"still alive {CLEANUP_S:g} s after the kit exited on SIGINT: {left}\n{run.tails()}"
        assert not run.report.exists(), "an interrupted run wrote a report"
        assert sorted(p.name for p in run.report.parent.iterdir()) == [], "report, logs or work dir left behind"
    finally:
        last_resort_cleanup(run)


def test_kill_9_of_the_kit_stops_the_mp_server_and_the_engines(tiny_model_fp16, tmp_path):
    report = tmp_path / "out" / "mp.json"
    report.parent.mkdir()
    check_kill_9(start_kit(mp_argv(tiny_model_fp16, report), tmp_path))


def test_ctrl_c_of_the_kit_stops_the_mp_server_and_exits_130(tiny_model_fp16, tmp_path):
    report = tmp_path / "out" / "mp.json"
    report.parent.mkdir()
    check_sigint(start_kit(mp_argv(tiny_model_fp16, report), tmp_path))
