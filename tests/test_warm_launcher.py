"""End to end on the warm-import launcher (repro.run.warm, repro.engine.warm): a forked child's exit status, a
child killed by a signal, a child that runs past its timeout, its lifeline, and the self-test forked against
the self-test spawned. The launcher imports vLLM, so these are e2e."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import have_vllm
from test_e2e_cpu import _comparable

from repro.engine.warm import FORKED_LINE
from repro.run import runner, warm
from repro.run.lifeline import group_members

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

CHILD = """
import os, signal, sys, time
what = sys.argv[1]
print("child", os.getpid(), os.getpgrp(), os.getsid(0), os.environ.get("PYTHONHASHSEED"), hash("kvkit"), flush=True)
print("gate", os.environ.get("KVKIT_PREFLIGHT_GATE", "unset"), flush=True)
if what == "exit":
    sys.exit(3)
if what == "signal":
    os.kill(os.getpid(), signal.SIGKILL)
if what == "sleep":
    if os.fork() == 0:  # a grandchild in the group, as vLLM's engine core is
        time.sleep(600)
    time.sleep(600)
"""


@pytest.fixture
def warm_env(tmp_path, monkeypatch):
    monkeypatch.setenv(warm.SWITCH, "1")
    (tmp_path / "kvkit_warm_child.py").write_text(CHILD)
    env = runner.child_env(dict(os.environ), hashseed="0", extra={})
    # this process's own launchers, unless a test names a pool: in the children's environment, never in os.environ,
    # which the runs the tests' lane starts beside this test copy (a pool named there leaked into them)
    env.pop(warm.POOL_ENV, None)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    yield env
    warm.stop_launchers()


def _run(env: dict, tmp_path: Path, what: str, timeout_s: float = 120):
    log = tmp_path / f"{what}.log"
    argv = [sys.executable, "-m", "kvkit_warm_child", what]
    rc, timed_out, _oom, _wall = runner.run_child(argv, log_path=log, env=env, timeout_s=timeout_s, warm_ok=True)
    return rc, timed_out, log.read_text()


def _child_line(text: str) -> list[str]:
    return next(line for line in text.splitlines() if line.startswith("child ")).split()


@pytest.mark.one_core  # a launcher's import, then one child
def test_a_forked_child_s_exit_status_session_log_and_hash_seed(warm_env, tmp_path):
    rc, timed_out, text = _run(warm_env, tmp_path, "exit")
    assert (rc, timed_out) == (3, False), text
    assert FORKED_LINE in text
    _, pid, pgid, sid, seed, forked_hash = _child_line(text)
    assert pid == pgid == sid  # the leader of its own session, as a spawned child is
    assert seed == "0"
    # the hash of a str under PYTHONHASHSEED=0, which the launcher started under: what a spawned child computes
    assert int(forked_hash) == _spawned_hash(warm_env)


def _spawned_hash(env: dict) -> int:
    out = subprocess.run(
        [sys.executable, "-c", "print(hash('kvkit'))"], check=True, env=env, capture_output=True, text=True
    )
    return int(out.stdout)


@pytest.mark.one_core  # a launcher's import, then one child
def test_a_run_time_variable_goes_with_the_request_not_into_the_launchers_key(warm_env, tmp_path):
    """A --jobs 2 run's second arm carries the preflight gate's variable, the later arms of its slot not: one
    launcher forks them all, and each child sees the variable as its own environment had it (set, then unset)."""
    gated = {**warm_env, warm.PREFLIGHT_GATE_ENV: str(tmp_path / "gate")}
    seen = []
    for env, name in ((gated, "gated"), (warm_env, "plain")):
        # a launcher refuses a fork while a thread of its own still runs (a clean clone's CI saw "2 threads are
        # running" once, 2026-12-04) and the child is spawned, as the kit intends: ask again, up to three times
        for attempt in range(3):
            (tmp_path / f"{name}{attempt}").mkdir()
            rc, _, text = _run(env, tmp_path / f"{name}{attempt}", "exit")
            assert rc == 3, text
            assert f"gate {gated[warm.PREFLIGHT_GATE_ENV] if env is gated else 'unset'}" in text  # forked or not
            if FORKED_LINE in text:
                break
        launcher = next(line for line in text.splitlines() if line.startswith(FORKED_LINE)).split()[-1]
        gate = next(line for line in text.splitlines() if line.startswith("gate ")).split(" ", 1)[1]
        seen.append((launcher, gate))
    assert seen[0][0] == seen[1][0], seen  # the same launcher
    assert [gate for _, gate in seen] == [str(tmp_path / "gate"), "unset"]
    assert len([v for v in warm._LAUNCHERS.values() if v is not None]) == 1


ANOTHER_KIT = """
import json, sys
from pathlib import Path
from repro.run import runner
rc, _, _, _ = runner.run_child(json.loads(sys.argv[1]), log_path=Path(sys.argv[2]), env=json.loads(sys.argv[3]),
                               timeout_s=120, warm_ok=True)
print(rc)
"""


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


@pytest.mark.one_core  # a launcher's import, then one child
def test_a_pooled_launcher_serves_every_kit_process_that_names_the_pool_and_stops_with_it(warm_env, tmp_path):
    """KVKIT_WARM_POOL (the test session's own): a child of this process and one of another kit process (a fresh
    interpreter, as each verifier run is) are forked by the same launcher, which this process started outside any
    run's lifeline; removing the pool's folder stops it."""
    pool = Path(tempfile.mkdtemp(prefix="kvkit-pool-test-"))  # short: a Unix socket's path has 107 bytes
    try:
        (pool / "owner").write_text(str(os.getpid()))
        env = {**warm_env, warm.POOL_ENV: str(pool)}
        rc, _, text = _run(env, tmp_path, "exit")
        assert rc == 3, text
        launchers = [line.split()[-1] for line in text.splitlines() if line.startswith(FORKED_LINE)]
        log = tmp_path / "other.log"
        argv = [sys.executable, "-m", "kvkit_warm_child", "exit"]
        other = subprocess.run([sys.executable, "-c", ANOTHER_KIT, json.dumps(argv), str(log), json.dumps(env)],
                               env=env, capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        assert other.stdout.strip() == "3", other.stderr[-3000:]
        launchers += [line.split()[-1] for line in log.read_text().splitlines() if line.startswith(FORKED_LINE)]
        assert len(launchers) == 2 and launchers[0] == launchers[1], launchers
        assert not warm._LAUNCHERS  # no launcher of this process's own
        homes = [d for d in pool.iterdir() if d.is_dir()]
        assert len(homes) == 1 and (homes[0] / "s").exists()
    finally:
        shutil.rmtree(pool, ignore_errors=True)
    deadline = time.monotonic() + 30
    while not _gone(int(launchers[0])):
        assert time.monotonic() < deadline, "the pooled launcher outlived its pool"
        time.sleep(0.2)


@pytest.mark.one_core  # a launcher's import, then one child
def test_a_forked_child_killed_by_a_signal(warm_env, tmp_path):
    rc, timed_out, text = _run(warm_env, tmp_path, "signal")
    assert (rc, timed_out) == (-9, False), text
    assert FORKED_LINE in text


@pytest.mark.one_core  # a launcher's import, then one child
def test_a_forked_child_past_its_timeout_is_stopped_with_its_group(warm_env, tmp_path):
    # the launcher first, on a run of its own: its vLLM import is no part of the 15 s a child is given (a clean
    # clone's CI under a load average of 11 spent them all importing, and no child was forked to time out)
    (tmp_path / "first").mkdir()
    assert _run(warm_env, tmp_path / "first", "exit")[0] == 3
    rc, timed_out, text = _run(warm_env, tmp_path, "sleep", timeout_s=15)
    assert timed_out, text
    assert rc is not None and rc < 0, text
    pgid = int(_child_line(text)[2])
    assert not group_members(pgid)


def test_forked_arm_children_give_the_report_of_spawned_ones(selftest_run, selftest_sequential_run):
    """The shared self-test's arm children were forked by the launcher (the suite sets KVKIT_WARM_IMPORT=1), the
    sequential one's spawned (tests/e2e_runs.py sets it to 0 there): every verdict, token ID, logprob, hit
    counter and KV audit figure the same (test_e2e_cpu compares the two; this says which was which)."""
    if os.environ.get(warm.SWITCH) != "1":
        pytest.skip(f"{warm.SWITCH} is not 1 in this session: the shared self-test was spawned")
    forked, spawned = selftest_run.report, selftest_sequential_run.report
    for report, want in ((forked, True), (spawned, False)):
        logs = [report.parent / a["log"] for a in json.loads(report.read_text())["arms"] if a.get("log")]
        assert logs, report
        assert all((FORKED_LINE in p.read_text()) is want for p in logs), (report, want)
    assert _comparable(json.loads(forked.read_text())) == _comparable(json.loads(spawned.read_text()))
