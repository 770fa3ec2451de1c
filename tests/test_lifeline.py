"""The lifeline (repro.run.lifeline): a child's whole process group dies when the kit dies, however it
dies (kill -9 too), whichever thread started the child; and never while the kit is alive. Uses
tests/fake_engine.py, whose child starts a grandchild in its group like vLLM's engine core."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from kvkit_testutil import ROOT
from test_runner import FAKE, _alive, _job

from repro.contract.failure import NONZERO_EXIT, TIMEOUT
from repro.record.atomic import write_json_atomic
from repro.run import lifeline, runner
from repro.run.runner import child_env, run_arm, start_child

FIRED = "kvkit lifeline: the kit is gone"
# A kit that starts every arm from a worker thread of its own, as the concurrent verifier does.
DRIVER = """
import json, os, sys, threading
from pathlib import Path
from test_runner import _job
from repro.run.runner import child_env, run_arm
work, spec = Path(sys.argv[1]), json.loads(sys.argv[2])
env = child_env(dict(os.environ), hashseed="0", extra={"KVKIT_FAKE": json.dumps(spec)})
threads = [
    threading.Thread(target=run_arm, args=(_job(arm),), kwargs=dict(
        workdir=work, log_path=work / f"{arm}.log", env=env, timeout_s=600, module="tests.fake_engine"))
    for arm in spec["modes"]
]
for t in threads: t.start()
for t in threads: t.join()
"""


def _fake_env(pid_dir: Path, modes: dict) -> dict:
    return child_env(
        dict(os.environ), hashseed="0", extra={"KVKIT_FAKE": json.dumps({"modes": modes, "pid_dir": str(pid_dir)})}
    )


def _wait_for(paths: list[Path], proc: subprocess.Popen | None = None, timeout_s: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        assert proc is None or proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"the fake children never wrote {paths}"
        time.sleep(0.05)
    time.sleep(0.1)  # the pid file is written before it is closed
    return [int(p.read_text()) for p in paths]


@contextmanager
def _reaped(pgids: list[int]):
    """Whatever a failed test leaves in these groups is killed (never a stray process)."""
    try:
        yield pgids
    except BaseException:
        for pgid in pgids:
            if lifeline.group_members(pgid):
                os.killpg(pgid, signal.SIGKILL)
        raise


def _job_file(tmp_path: Path) -> Path:
    path = tmp_path / "baseline.job.json"
    write_json_atomic(path, replace(_job(), output=str(tmp_path / "baseline.result.json")).to_json())
    return path


def _wait_gone(pgids: list[int], timeout_s: float) -> float:
    t0 = time.monotonic()
    while any(lifeline.group_members(g) for g in pgids):
        assert time.monotonic() - t0 < timeout_s, {g: lifeline.group_members(g) for g in pgids}
        time.sleep(0.05)
    return time.monotonic() - t0


def test_kill_9_of_the_kit_stops_every_group_it_started(tmp_path):
    """Two arms at once, each started from a worker thread; one of them ignores SIGTERM."""
    pids = tmp_path / "pids"
    pids.mkdir()
    modes = {"a1": "hang", "a2": "hang-ignore-term"}
    kit = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path), json.dumps({"modes": modes, "pid_dir": str(pids)})],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")])),
    )
    children = _wait_for([pids / f"{a}.child.pid" for a in modes], kit)
    grandchildren = _wait_for([pids / f"{a}.grandchild.pid" for a in modes], kit)
    with _reaped(children):
        for pgid in children:
            assert len(lifeline.group_members(pgid)) == 3  # the child, its watcher, its grandchild
        kit.kill()
        kit.wait()
        took = _wait_gone(children, lifeline.GRACE_S + 10)
    assert lifeline.GRACE_S - 1 < took < lifeline.GRACE_S + 10  # SIGTERM first; SIGKILL for the one that ignores it
    assert not any(_alive(p) for p in children + grandchildren)
    for arm in modes:
        assert FIRED in (tmp_path / f"{arm}.log").read_text()


def test_a_child_outlives_the_thread_that_started_it_and_dies_with_its_lifeline(tmp_path):
    """PR_SET_PDEATHSIG would kill this child when its starting thread ends; the lifeline does not."""
    started = {}

    def start() -> None:
        started["proc"], started["lifeline"] = start_child(
            [sys.executable, "-m", FAKE, str(_job_file(tmp_path))],
            log_path=tmp_path / "a.log",
            env=_fake_env(tmp_path, {"*": "hang"}),
        )

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    proc = started["proc"]
    with _reaped([proc.pid]):
        child, grandchild = _wait_for([tmp_path / "baseline.child.pid", tmp_path / "baseline.grandchild.pid"])
        assert child == proc.pid
        time.sleep(1.0)
        assert proc.poll() is None and _alive(grandchild)
        assert len(lifeline.group_members(proc.pid)) == 3
        os.close(started["lifeline"])  # what the kit's death does
        _wait_gone([proc.pid], 10)
        assert proc.wait(timeout=5) == -signal.SIGTERM
    assert FIRED in (tmp_path / "a.log").read_text()


def test_the_watcher_never_fires_while_the_kit_lives(tmp_path):
    """Arms at once from worker threads, one from the main thread, each ending its own way."""
    pids = tmp_path / "pids"
    pids.mkdir()
    env = _fake_env(pids, {"ok": "ok", "slow": "slow", "exit7": "exit7", "hang": "hang"})
    env["KVKIT_FAKE"] = json.dumps({**json.loads(env["KVKIT_FAKE"]), "sleep_s": 1.5})

    def one(arm: str, timeout_s: float = 60) -> runner.ArmOutcome:
        return run_arm(
            _job(arm), workdir=tmp_path, log_path=tmp_path / f"{arm}.log", env=env, timeout_s=timeout_s, module=FAKE
        )

    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {arm: pool.submit(one, arm) for arm in ("ok", "slow", "exit7")}
        hang = one("hang", timeout_s=2)
        outcomes = {arm: f.result() for arm, f in futures.items()}
    assert outcomes["ok"].failure is None and outcomes["slow"].failure is None
    assert outcomes["exit7"].failure.kind == NONZERO_EXIT and hang.failure.kind == TIMEOUT
    for arm in ("ok", "slow", "exit7", "hang"):
        assert FIRED not in (tmp_path / f"{arm}.log").read_text()
        child = int((pids / f"{arm}.child.pid").read_text())
        assert lifeline.group_members(child) == [], arm


def test_the_child_keeps_its_pid_and_exit_status(tmp_path):
    """The launcher execs the command in place: the kit's pid, signals and exit status are the child's."""
    out = tmp_path / "pid"
    proc, line = start_child(
        [sys.executable, "-c", f"import os; open({str(out)!r}, 'w').write(str(os.getpid())); raise SystemExit(4)"],
        log_path=tmp_path / "log",
        env=dict(os.environ),
    )
    try:
        assert proc.wait(timeout=30) == 4 and int(out.read_text()) == proc.pid
    finally:
        runner.kill_group(proc, grace_s=0)
        os.close(line)


def test_the_launcher_never_watches_a_group_it_does_not_lead_and_says_what_it_cannot_run(tmp_path):
    """Without a session of its own the watcher would stop the kit's own group: no watcher then."""
    read_fd, write_fd = os.pipe()
    try:
        for argv, session, rc, said in [
            ([sys.executable, "-c", "raise SystemExit(5)"], False, 5, "not a process-group leader"),
            ([str(tmp_path / "nothing-here")], True, 127, "cannot run"),
        ]:
            proc = subprocess.run(
                lifeline.launch_command(argv, read_fd),
                pass_fds=(read_fd,),
                start_new_session=session,
                check=False,
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert proc.returncode == rc and said in proc.stderr and FIRED not in proc.stderr, proc.stderr
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_a_missing_interpreter_raises_as_popen_did(tmp_path):
    with pytest.raises(FileNotFoundError) as exc:
        runner.run_child([str(tmp_path / "no-python")], log_path=tmp_path / "log", env=dict(os.environ), timeout_s=5)
    assert exc.value.filename == str(tmp_path / "no-python")
