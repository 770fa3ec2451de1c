"""--gpu-load's neighbour (repro.run.gpu_load) with a stand-in child (tests/stand_in_gpu_load.py): start, running,
record, stop on leaving and on an exception; not running in time and an exit before running (gpu-load-start);
a death under the arms (gpu-load-died); kill -9 of the kit. Every test ends with no process of the load's
group left. And the flag's refusal on the CPU (and --cpu-load's on a GPU): one line, exit 2, nothing written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kvkit_testutil import ROOT, run_cli
from test_cli_failures import _args, _env, assert_untouched, setup  # noqa: F401 (setup is a fixture)
from test_lifeline import _wait_gone
from test_lmcache_mp import _no_leftovers, _wait_for

from repro.contract.failure import Failure
from repro.engine import gpu_load as child
from repro.errors import UsageError
from repro.plan.options import parse_args
from repro.run import gpu_load, lifeline
from repro.run.gpu_load import GPU_LOAD_DIED, GPU_LOAD_START, LoadError, neighbour, overlap_s
from repro.run.runner import child_env

STAND_IN = "tests.stand_in_gpu_load"
# A kit that holds a load on its lifeline and never lets go (the test kills it with SIGKILL).
DRIVER = """
import os, sys, time
from pathlib import Path
from repro.run.gpu_load import neighbour
from repro.run.runner import child_env
tmp, spec = Path(sys.argv[1]), sys.argv[2]
env = child_env(dict(os.environ), hashseed="0", extra={"KVKIT_STAND_IN_LOAD": spec})
with neighbour(sys.executable, ["0"], env, tmp / "gpu-load.log", "tests.stand_in_gpu_load", ready_timeout_s=30) as load:
    (tmp / "ready").write_text(str(load.pid))
    time.sleep(600)
"""


def _load(tmp_path: Path, spec: dict, gpus: tuple[str, ...] = ("0",), **kwargs):
    """neighbour() over the stand-in, which starts a grandchild and writes its pids into tmp_path."""
    extra = {"KVKIT_STAND_IN_LOAD": json.dumps({"grandchild": True, "pid_dir": str(tmp_path), **spec})}
    env = child_env(dict(os.environ), hashseed="0", extra=extra)
    return neighbour(sys.executable, list(gpus), env, gpu_load.load_log_path(tmp_path), STAND_IN, **kwargs)


def test_the_status_format_is_the_childs_and_the_command_names_ordinals():
    assert (gpu_load.STATUS_KIND, gpu_load.STATUS_SCHEMA_VERSION) == (child.STATUS_KIND, child.STATUS_SCHEMA_VERSION)
    assert gpu_load.MODULE == child.__name__ == "repro.engine.gpu_load"
    cmd = gpu_load.command("/py", gpu_load.MODULE, 2, Path("/w/gpu-load.status.json"), 1.0)
    assert cmd == ["/py", "-m", "repro.engine.gpu_load", "--devices", "0,1", "--status", "/w/gpu-load.status.json",
                   "--seconds-per-report", "1"]  # fmt: skip
    args = child.parse_args(cmd[3:])
    assert args.devices == [0, 1] and args.seconds_per_report == 1.0 and args.n is None
    assert gpu_load.status_path_for(Path("/w/gpu-load.log")) == Path("/w/gpu-load.status.json")
    failure = LoadError(GPU_LOAD_START, "why", "tail").failure()
    assert failure == Failure(GPU_LOAD_START, "why", "tail")
    with pytest.raises(ValueError):
        neighbour("/py", [], {}, Path("/w/x.log")).__enter__()


def test_the_child_sizes_its_matrices_to_the_device_and_caps_its_memory():
    gib = 2**30
    assert child.size_for(141 * gib) == 8192  # an H200: 5 x 128 MiB
    assert child.matrices_bytes(8192, child.STREAMS) <= child.MAX_BYTES
    assert child.size_for(8 * gib) == 4096  # a twentieth of 8 GiB (410 MiB) is under 640 MiB
    assert child.size_for(gib // 4) == child.MIN_N  # never below
    load = child.DeviceLoad(0, n=1000, timed_iterations=500, clock_start=10.0, clock_last=12.0)
    assert load.tflops == 0.5 and load.to_json()["dtype"] == "float16"
    assert child.DeviceLoad(0).tflops == 0.0


def test_overlap_is_the_part_of_an_arm_under_load():
    assert overlap_s((10.0, 20.0), (5.0, 15.0)) == 5.0
    assert overlap_s((10.0, 20.0), (12.0, 14.0)) == 2.0
    assert overlap_s((10.0, 20.0), (21.0, 30.0)) == 0.0
    assert overlap_s((10.0, None), (12.0, 30.0)) == 18.0  # still running
    assert overlap_s((None, None), (0.0, 5.0)) == 0.0  # never ran


def test_start_running_record_stop_leaves_no_process(tmp_path):
    """Running only once its status says so; it sees only its GPUs, as ordinals 0..n-1."""
    t0 = time.monotonic()
    with _no_leftovers(tmp_path), _load(tmp_path, {"delay_s": 0.5}, gpus=("3", "5"), t0=t0) as load:
        assert load.alive() and load.started_s >= 0.5 and load.interval() == (load.started_s, None)
        load.check()
        grandchild = _wait_for(tmp_path / "grandchild.pid")
        assert _wait_for(tmp_path / "load.pid") == load.pid
        assert set(lifeline.group_members(load.pid)) >= {load.pid, grandchild}  # and its watcher
        time.sleep(0.3)
        arm = (load.now_s() - 0.2, load.now_s())
    assert not lifeline.group_members(load.pid) and load.proc.returncode == 0  # it stopped on SIGTERM
    assert load.overlap_s(*arm) == pytest.approx(0.2, abs=0.01)
    rec = load.record()
    assert rec["gpus"] == ["3", "5"] and rec["module"] == STAND_IN
    assert 0.5 <= rec["started_s"] < rec["ended_s"] < time.monotonic() - t0
    assert [d["gpu"] for d in rec["devices"]] == ["3", "5"]
    assert all(d["iterations"] > 0 and d["tflops"] == 1.5 and d["name"] == "Stand-in GPU" for d in rec["devices"])
    assert rec["state"] == "stopped" and rec["ended"] == "stopped by the kit" and "failure" not in rec
    assert rec["log"] == "gpu-load.log"
    log = load.log_path.read_text()
    assert "visible 3,5" in log and "devices [0, 1]" in log and "stand-in gpu-load: stopped" in log


def test_an_exception_in_the_block_stops_the_group_and_propagates(tmp_path):
    """The load ignores SIGTERM here, so the stop ends in SIGKILL after the grace."""
    with (
        _no_leftovers(tmp_path),
        pytest.raises(RuntimeError, match="the arm broke"),
        _load(tmp_path, {"ignore_term": True}, stop_grace_s=0.5) as load,
    ):
        _wait_for(tmp_path / "grandchild.pid")
        raise RuntimeError("the arm broke")
    assert load.proc.returncode == -signal.SIGKILL and load.record()["ended"] == "stopped by the kit"


def test_not_running_in_time_is_gpu_load_start_with_the_log_tail(tmp_path):
    """A previous run's status file saying "running" does not pass for this one's."""
    stale = child.status_document("running", "2020-01-01T00:00:00Z", [])
    gpu_load.status_path_for(gpu_load.load_log_path(tmp_path)).write_text(json.dumps(stale))
    t0 = time.monotonic()
    with (
        _no_leftovers(tmp_path),
        pytest.raises(LoadError) as caught,
        _load(tmp_path, {"never_ready": True}, ready_timeout_s=1.5),
    ):
        pytest.fail("the block must not run")
    err = caught.value
    assert err.kind == GPU_LOAD_START and "not running within 1.5 s (status 'starting'" in err.detail
    assert "stand-in gpu-load: pid" in err.log_tail
    assert 1.5 <= time.monotonic() - t0 < 8


def test_an_exit_before_running_fails_at_once(tmp_path):
    t0 = time.monotonic()
    with (
        _no_leftovers(tmp_path),
        pytest.raises(LoadError) as caught,
        _load(tmp_path, {"exit_before_ready": 3}, ready_timeout_s=60),
    ):
        pytest.fail("the block must not run")
    assert caught.value.kind == GPU_LOAD_START
    assert "exited before it was running (exit status 3)" in caught.value.detail
    assert "giving up before it ran" in caught.value.log_tail
    assert time.monotonic() - t0 < 10


def test_a_death_under_the_arms_is_noticed_and_check_raises_gpu_load_died(tmp_path):
    deaths = []
    with _no_leftovers(tmp_path), _load(tmp_path, {"crash_after_s": 0.5}, on_death=deaths.append) as load:
        deadline = time.monotonic() + 10
        while not deaths:  # the arms run
            assert time.monotonic() < deadline
            time.sleep(0.05)
        died_at = load.now_s()
        with pytest.raises(LoadError) as caught:
            load.check()
        time.sleep(0.5)  # the arms go on: the interval ends at the death, not at the stop
    assert deaths == [load]
    err = caught.value
    assert err.kind == GPU_LOAD_DIED and "exited while the arms ran (exit status 1)" in err.detail
    assert "stand-in gpu-load: crashing" in err.log_tail and err.failure().kind == GPU_LOAD_DIED
    rec = load.record()
    assert rec["started_s"] < rec["ended_s"] <= died_at
    assert rec["failure"]["kind"] == GPU_LOAD_DIED and rec["ended"] == "exit status 1"
    assert rec["devices"][0]["iterations"] > 0  # its last status, from before the crash


@pytest.mark.parametrize("ignore_term", [False, True])
def test_kill_9_of_the_kit_takes_the_load_group_down(tmp_path, ignore_term):
    spec = json.dumps({"grandchild": True, "ignore_term": ignore_term, "pid_dir": str(tmp_path)})
    kit = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path), spec], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT))
    )
    try:
        with _no_leftovers(tmp_path):
            pgid = _wait_for(tmp_path / "ready")
            assert _wait_for(tmp_path / "grandchild.pid") in lifeline.group_members(pgid)
            kit.kill()
            kit.wait()
            took = _wait_gone([pgid], lifeline.GRACE_S + 10)
            if ignore_term:
                assert took > lifeline.GRACE_S - 1  # SIGTERM first, SIGKILL after the watcher's grace
    finally:
        if kit.poll() is None:
            kit.kill()
    assert "kvkit lifeline: the kit is gone" in (tmp_path / "gpu-load.log").read_text()


# ---- the flag: refused on the CPU, one line, exit 2, nothing written ---------------------------------


@pytest.mark.parametrize(
    "flag, device, says",
    [("--gpu-load", "cpu", "--gpu-load needs a CUDA GPU"), ("--cpu-load", "cuda", "--cpu-load is for the CPU engine")],
)
def test_a_load_for_the_other_device_is_one_line_exit_2_and_writes_nothing(setup, flag, device, says):  # noqa: F811
    proc = run_cli(_args(setup, "--kv-connector", "ExampleConnector", flag, "--device", device), env=_env(setup),
                   timeout=60)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert says in proc.stderr and f"not with --device {device}" in proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert_untouched(setup)


def test_gpu_load_with_device_auto_needs_a_visible_gpu(setup, monkeypatch):  # noqa: F811
    argv = _args(setup, "--kv-connector", "ExampleConnector", "--gpu-load")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(UsageError) as err:
        parse_args(argv)
    assert "--gpu-load needs a CUDA GPU" in str(err.value) and "no GPU is visible (--device auto)" in str(err.value)
    assert parse_args([*argv, "--device", "cuda"]).args.gpu_load is True
    assert parse_args(argv[:-1]).args.gpu_load is False
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert parse_args(argv).args.gpu_load is True
