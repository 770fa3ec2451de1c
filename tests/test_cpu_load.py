"""--cpu-load's neighbour (repro.run.cpu_load over repro.run.neighbour) with its real child (repro.engine.cpu_load: pure
Python, one spinning worker per core): start, running, record, stop on leaving; a worker's death under the arms
(cpu-load-died); not running in time, an exit before running and a child that cannot start (cpu-load-start);
kill -9 of the child and of the kit. Every test ends with no process of the load's group left, workers
included. And the flag: refused where --device auto runs the arms on a GPU (with --device cuda: tests/test_gpu_load.py),
and a whole run on the fake engine beside it (the load recorded, its log kept, counted as sharing). The loads run a second or two each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from kvkit_testutil import ROOT, run_cli
from test_cli_failures import _alive, _args, _env, assert_untouched, setup  # noqa: F401 (setup is a fixture)
from test_lifeline import _wait_gone

from repro.engine import cpu_load as child
from repro.errors import UsageError
from repro.plan.options import parse_args
from repro.run import cpu_load, lifeline, neighbour
from repro.run.neighbour import STATUS_SCHEMA_VERSION, LoadError
from repro.run.runner import child_env
from repro.run.sharing import CPU_LOAD

CPU_LOAD_START, CPU_LOAD_DIED = cpu_load.CPU_LOAD_START, cpu_load.CPU_LOAD_DIED
CORES = cpu_load.cores()
# A kit that holds a load on its lifeline and never lets go (the test kills it with SIGKILL).
DRIVER = """
import os, sys, time
from pathlib import Path
from repro.run import cpu_load
from repro.run.runner import child_env
tmp = Path(sys.argv[1])
env = child_env(dict(os.environ), hashseed="0", extra={})
with cpu_load.neighbour(sys.executable, ["0"], env, tmp / "cpu-load.log", ready_timeout_s=30) as load:
    (tmp / "ready").write_text(json.dumps([load.pid] + [w["pid"] for w in load.last_status["workers"]]))
    time.sleep(600)
""".replace("import os,", "import json, os,")


def _load(tmp_path: Path, cores: list[str] | None = None, **kwargs):
    env = child_env(dict(os.environ), hashseed="0", extra={})
    kwargs.setdefault("seconds_per_report", 0.2)
    return cpu_load.neighbour(sys.executable, cores or CORES, env, cpu_load.load_log_path(tmp_path), **kwargs)


def _pids(load) -> list[int]:
    """The leader and every worker it reported."""
    return [load.pid] + [w["pid"] for w in (load.last_status or {}).get("workers") or []]


@contextmanager
def _nothing_left(pids: list[int]):
    """After the block: none of these processes (the group's leader and its workers) lives, nor its group."""
    try:
        yield
    finally:
        left = {pid: _alive(pid) for pid in pids}
        for pid in pids[:1]:
            if lifeline.group_members(pid):
                os.killpg(pid, signal.SIGKILL)
    assert not any(left.values()), left


def test_the_status_format_is_the_childs_and_the_command_names_the_cores():
    assert (cpu_load.STATUS_KIND, STATUS_SCHEMA_VERSION) == (child.STATUS_KIND, child.STATUS_SCHEMA_VERSION)
    assert cpu_load.MODULE == child.__name__ == "repro.engine.cpu_load" and cpu_load.KIND.name == CPU_LOAD
    assert (cpu_load.KIND.flag, CPU_LOAD_START, CPU_LOAD_DIED) == ("--cpu-load", "cpu-load-start", "cpu-load-died")
    cmd = cpu_load.command("/py", cpu_load.MODULE, ["0", "3"], Path("/w/cpu-load.status.json"), 1.0)
    assert cmd == ["/py", "-m", "repro.engine.cpu_load", "--cores", "0,3", "--status", "/w/cpu-load.status.json",
                   "--seconds-per-report", "1"]  # fmt: skip
    args = child.parse_args(cmd[3:])
    assert args.cores == [0, 3] and args.seconds_per_report == 1.0
    assert cpu_load.load_log_path(Path("/w")) == Path("/w/cpu-load.log")
    assert CORES == [str(c) for c in sorted(os.sched_getaffinity(0))]  # the cores this process may use
    with pytest.raises(ValueError, match="no cores"):
        cpu_load.neighbour("/py", [], {}, Path("/w/x.log")).__enter__()


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--cores", "a,b", "--status", "s"], "--cores 'a,b': CPU numbers"),
        (["--cores", "0,0", "--status", "s"], "--cores must name distinct CPUs"),
        (["--cores", "", "--status", "s"], "--cores must name distinct CPUs"),
        (["--cores", "0", "--status", "s", "--seconds-per-report", "0"], "must be positive"),
        (["--cores", "0"], "the following arguments are required: --status"),
    ],
)
def test_the_childs_bad_input_is_one_line_and_exit_2(tmp_path, argv, says):
    proc = subprocess.run([sys.executable, "-m", child.__name__, *argv], cwd=tmp_path, capture_output=True, text=True, check=False,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("python -m repro.engine.cpu_load: error: ") and says in last, proc.stderr
    assert not (tmp_path / "s").exists()


def test_start_running_record_stop_leaves_no_process(tmp_path):
    """Running once every worker counted a round; one worker per core, pinned to it; all gone on leaving."""
    t0, pids = time.monotonic(), []
    with _nothing_left(pids), _load(tmp_path, t0=t0) as load:
        pids += _pids(load)
        assert load.alive() and load.started_s > 0 and load.interval() == (load.started_s, None)
        load.check()
        workers = load.last_status["workers"]
        assert [str(w["core"]) for w in workers] == CORES and all(w["iterations"] > 0 for w in workers)
        assert set(lifeline.group_members(load.pid)) >= set(pids)  # the workers are in its group
        time.sleep(0.6)
        arm = (load.now_s() - 0.5, load.now_s())
    assert not lifeline.group_members(load.pid) and load.proc.returncode == 0  # it stopped on SIGTERM
    assert load.overlap_s(*arm) == pytest.approx(0.5, abs=0.01)
    rec = load.record()
    assert rec["cores"] == CORES and rec["module"] == cpu_load.MODULE and rec["log"] == "cpu-load.log"
    assert 0 < rec["started_s"] < rec["ended_s"] < time.monotonic() - t0
    assert rec["state"] == "stopped" and rec["ended"] == "stopped by the kit" and rec["returncode"] == 0
    assert rec["left_running"] == [] and "failure" not in rec
    assert [str(w["core"]) for w in rec["workers"]] == CORES
    for w in rec["workers"]:
        assert set(w) == set(cpu_load.WORKER_KEYS) and w["pid"] in pids and w["iterations"] > 0
        assert w["affinity"] == [w["core"]] and w["nice"] == os.getpriority(os.PRIO_PROCESS, 0)
        assert w["cpu_s"] > 0.1 and w["wait_s"] >= 0  # it spun (on a core it may have shared)
    log = load.log_path.read_text()
    assert "kvkit cpu-load: running, " in log and "kvkit cpu-load: stopped core" in log


def test_a_worker_that_dies_under_the_arms_is_cpu_load_died(tmp_path):
    deaths, pids = [], []
    with _nothing_left(pids), _load(tmp_path, cores=CORES[:1], on_death=deaths.append) as load:
        pids += _pids(load)
        os.kill(pids[1], signal.SIGKILL)  # the worker, not the leader
        deadline = time.monotonic() + 60  # a bound on a hang, not a speed target: a loaded CI took more than 10 s
        while not deaths:  # the arms run
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(LoadError) as caught:
            load.check()
    assert deaths == [load]
    err = caught.value
    assert err.kind == CPU_LOAD_DIED and err.flag == "--cpu-load" and err.failure().kind == CPU_LOAD_DIED
    assert "the CPU-load neighbour exited while the arms ran (exit status 1)" in err.detail
    assert f"worker 0 on core {CORES[0]} (pid {pids[1]}) killed by signal 9" in err.detail
    rec = load.record()
    assert rec["state"] == "failed" and rec["failure"]["kind"] == CPU_LOAD_DIED and rec["ended"] == "exit status 1"


def test_workers_end_by_themselves_when_their_parent_is_killed(tmp_path):
    """kill -9 of the child's leader: its workers see their parent gone and exit within a round."""
    pids = []
    with _nothing_left(pids), _load(tmp_path) as load:
        pids += _pids(load)
        os.kill(load.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in pids[1:]):  # before the kit stops the group
            assert time.monotonic() < deadline, [p for p in pids if _alive(p)]
            time.sleep(0.02)
    assert load.record()["failure"]["detail"] == "exited while the arms ran (killed by SIGKILL)"


def test_not_running_in_time_is_cpu_load_start(tmp_path, monkeypatch):
    """A previous run's status file saying "running" does not pass for this one's; the child is stopped."""
    stale = child.status_document("running", "2020-01-01T00:00:00Z", [], kind=child.STATUS_KIND, key="workers")
    neighbour.status_path_for(cpu_load.load_log_path(tmp_path)).write_text(json.dumps(stale))
    started, seen, start = [], [], neighbour.start_child

    def start_child(*args, **kwargs):
        started.append(start(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(neighbour, "start_child", start_child)
    with pytest.raises(LoadError) as caught, _load(tmp_path, ready_timeout_s=0.0, on_death=seen.append):
        pytest.fail("the block must not run")
    err = caught.value
    assert err.kind == CPU_LOAD_START and err.flag == "--cpu-load" and not seen
    assert "the CPU-load neighbour was not running within 0 s (no status file, cpu-load.status.json)" in err.detail
    proc = started[0][0]
    assert proc.returncode is not None and not lifeline.group_members(proc.pid)


def test_bad_cores_exit_before_running_and_a_missing_python_cannot_start(tmp_path):
    with pytest.raises(LoadError) as caught, _load(tmp_path, cores=["x"], ready_timeout_s=60):
        pytest.fail("the block must not run")
    err = caught.value
    assert err.kind == CPU_LOAD_START and "exited before it was running (exit status 2)" in err.detail
    assert "--cores 'x': CPU numbers" in err.log_tail
    env = child_env(dict(os.environ), hashseed="0", extra={})
    with (
        pytest.raises(LoadError) as caught,
        cpu_load.neighbour(str(tmp_path / "no-python"), CORES, env, tmp_path / "cpu-load.log"),
    ):
        pytest.fail("the block must not run")
    assert caught.value.kind == CPU_LOAD_START and "could not be started" in caught.value.detail


def test_kill_9_of_the_kit_takes_the_load_and_its_workers_down(tmp_path):
    kit = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path)], cwd=ROOT,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)))  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists():
            assert time.monotonic() < deadline and kit.poll() is None
            time.sleep(0.05)
        pids = json.loads((tmp_path / "ready").read_text())
        with _nothing_left(pids):
            assert set(pids) <= set(lifeline.group_members(pids[0]))
            kit.kill()
            kit.wait()
            _wait_gone([pids[0]], lifeline.GRACE_S + 10)
    finally:
        if kit.poll() is None:
            kit.kill()
    assert "kvkit lifeline: the kit is gone" in (tmp_path / "cpu-load.log").read_text()


# ---- the flag ------------------------------------------------------------------------------------


def test_cpu_load_with_device_auto_needs_no_gpu_visible(setup, monkeypatch):  # noqa: F811
    argv = _args(setup, "--kv-connector", "ExampleConnector", "--cpu-load")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(UsageError) as err:
        parse_args(argv)
    assert "a GPU is visible (--device auto runs the arms there): add --device cpu" in str(err.value)
    assert parse_args([*argv, "--device", "cpu"]).args.cpu_load is True
    assert parse_args(argv[:-1]).args.cpu_load is False
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert parse_args(argv).args.cpu_load is True


def test_a_run_beside_the_cpu_load_records_it_and_counts_it_as_sharing(setup):  # noqa: F811
    """The fake engine, one arm at a time: only the load shares the cores with each arm."""
    argv = _args(setup, "--kv-connector", "ExampleConnector", "--cpu-load", "--device", "cpu", "--jobs", "1")
    proc = run_cli(argv, env=_env(setup), timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(setup["report"].read_text())
    load = data["conditions"]["cpu_load"]
    assert data["conditions"]["gpu_load"] is None and load["cores"] == CORES and load["left_running"] == []
    assert load["ended"] == "stopped by the kit" and all(w["iterations"] > 0 for w in load["workers"])
    for arm in data["arms"]:
        assert arm["sharing"]["shared"] is True and arm["sharing"]["resource"] == "CPU cores"
        assert [(o["process"], o["kind"]) for o in arm["sharing"]["others"]] == [("cpu-load", "cpu-load")]
    assert sorted(p.name for p in setup["logs"].iterdir()) == ["ExampleConnector.log", "baseline.log", "cpu-load.log"]
    assert f"cpu-load on cores {', '.join(CORES)}: {len(CORES)} worker" in proc.stdout
    assert not list(setup["report"].parent.glob("*.status.json")) and not list(setup["logs"].glob("*.status.json"))


def test_a_neighbour_that_cannot_start_ends_the_run_with_one_line_exit_3_and_no_report(setup):  # noqa: F811
    """The fake engine skips the --python check, so the neighbour is the first thing that needs it."""
    argv = _args(setup, "--kv-connector", "ExampleConnector", "--cpu-load", "--device", "cpu",
                 "--python", str(setup["tmp"] / "no-python"))  # fmt: skip
    proc = run_cli(argv, env=_env(setup), timeout=120)
    assert proc.returncode == 3, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --cpu-load: cpu-load-start: the CPU-load neighbour could not be started: "), last
    assert last.endswith("; no report written") and "Traceback" not in proc.stderr
    assert_untouched(setup)
