"""The LMCache MP server's lifecycle (repro.lmcache.mp) with a stand-in server (tests/stand_in_mp_server.py):
start, ready, stop; a readiness timeout and an exit before ready (lmcache-server-start); a crash under
the arm (lmcache-server-died); Ctrl-C in the block; kill -9 of the kit. Every test ends with no process
of the server's group left: the server, its grandchild and its lifeline watcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from kvkit_testutil import ROOT
from test_lifeline import _wait_gone
from test_runner import _alive

from repro.contract.failure import Failure
from repro.lmcache.mp import (
    LMCACHE_SERVER_DIED,
    LMCACHE_SERVER_START,
    SERVER_MODULE,
    ServerError,
    ServerSettings,
    free_ports,
    mp_server,
    probe_ready,
    server_log_path,
    stop_all_servers,
)
from repro.run import lifeline
from repro.run.runner import child_env

STAND_IN = ServerSettings(module="tests.stand_in_mp_server")
# A kit that holds a server on its lifeline and never lets go (the test kills it with SIGKILL).
DRIVER = """
import json, os, sys, time
from pathlib import Path
from repro.lmcache.mp import ServerSettings, mp_server
from repro.run.runner import child_env
tmp, spec = Path(sys.argv[1]), sys.argv[2]
env = child_env(dict(os.environ), hashseed="0", extra={"KVKIT_STAND_IN": spec})
with mp_server(sys.executable, tmp / "arm.lmcache-server.log", env, ready_timeout_s=30,
               settings=ServerSettings(module="tests.stand_in_mp_server")) as server:
    (tmp / "ready").write_text(str(server.pid))
    time.sleep(600)
"""


def _env(**spec) -> dict[str, str]:
    return child_env(dict(os.environ), hashseed="0", extra={"KVKIT_STAND_IN": json.dumps(spec)})


def _server(tmp_path: Path, spec: dict, **kwargs):
    """mp_server over the stand-in, which starts a grandchild and writes its pids into tmp_path."""
    env = _env(grandchild=True, pid_dir=str(tmp_path), **spec)
    return mp_server(sys.executable, tmp_path / "arm.lmcache-server.log", env, settings=STAND_IN, **kwargs)


def _wait_for(path: Path, timeout_s: float = 20) -> int:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"never written: {path}"
        time.sleep(0.02)
    return int(path.read_text())


@contextmanager
def _no_leftovers(pid_dir: Path):
    """After the block: nothing of the server's group lives (a failed test kills what it left)."""
    try:
        yield
    finally:
        pids = [int(p.read_text()) for p in pid_dir.glob("*.pid")]
        left = {pid: _alive(pid) for pid in pids}
        for pid in pids:
            if lifeline.group_members(pid):
                os.killpg(pid, signal.SIGKILL)
    assert not any(left.values()), left


def test_the_command_is_lmcaches_http_server_with_every_required_flag():
    cmd = ServerSettings().command("/py", 5001, 5002)
    assert cmd[:3] == ["/py", "-m", SERVER_MODULE] == ["/py", "-m", "lmcache.v1.multiprocess.http_server"]
    flags = dict(zip(cmd[3::2], cmd[4::2]))
    assert flags == {
        "--host": "127.0.0.1",
        "--port": "5001",
        "--http-host": "127.0.0.1",
        "--http-port": "5002",
        "--chunk-size": "256",
        "--l1-size-gb": "4",
        "--eviction-policy": "LRU",
    }
    assert ServerSettings(extra_args=("--hash-algorithm", "blake3")).command("/py", 1, 2)[-2:] == [
        "--hash-algorithm",
        "blake3",
    ]
    with pytest.raises(ValueError):
        ServerSettings(chunk_size=0)
    a, b = free_ports("127.0.0.1", 2)
    assert a != b and not probe_ready("127.0.0.1", a, b, timeout_s=0.2)
    assert server_log_path(Path("/w"), "LMCacheMPConnector") == Path("/w/LMCacheMPConnector.lmcache-server.log")
    failure = ServerError(LMCACHE_SERVER_START, "why", "tail").failure()
    assert failure == Failure(LMCACHE_SERVER_START, "why", "tail")


def test_start_ready_stop_leaves_no_process(tmp_path):
    """Ready only once the health check says so: its ports listen 0.5 s before that."""
    t0 = time.monotonic()
    with _no_leftovers(tmp_path), _server(tmp_path, {"delay_s": 0.5}) as server:
        assert server.alive() and server.ready_s >= 0.5
        server.check()
        assert server.extra_config() == {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": server.port}
        assert probe_ready("127.0.0.1", server.port, server.http_port)
        grandchild = _wait_for(tmp_path / "grandchild.pid")
        assert _wait_for(tmp_path / "server.pid") == server.pid
        assert set(lifeline.group_members(server.pid)) >= {server.pid, grandchild}  # and its watcher
    assert not lifeline.group_members(server.pid) and server.proc.returncode == -signal.SIGTERM
    assert time.monotonic() - t0 < 10
    assert "stand-in MP server: ready" in server.log_path.read_text()
    assert "--chunk-size" in server.log_path.read_text()  # among the flags the stand-in ignores
    assert server.record()["log"] == "arm.lmcache-server.log"
    assert server.record()["command"][:2] == ["-m", "tests.stand_in_mp_server"]


def test_not_ready_in_time_is_lmcache_server_start_with_the_log_tail(tmp_path):
    """It listens but answers 503; and it ignores SIGTERM, so the stop ends in SIGKILL."""
    t0 = time.monotonic()
    spec = {"never_ready": True, "ignore_term": True}
    with (
        _no_leftovers(tmp_path),
        pytest.raises(ServerError) as caught,
        _server(tmp_path, spec, ready_timeout_s=1.5, stop_grace_s=0.5),
    ):
        pytest.fail("the block must not run")
    took = time.monotonic() - t0
    err = caught.value
    assert err.kind == LMCACHE_SERVER_START and "not ready within 1.5 s" in err.detail and "/healthcheck" in err.detail
    assert "stand-in MP server: pid" in err.log_tail
    assert 1.5 <= took < 8


def test_an_exit_before_ready_fails_at_once_not_at_the_timeout(tmp_path):
    t0 = time.monotonic()
    with (
        _no_leftovers(tmp_path),
        pytest.raises(ServerError) as caught,
        _server(tmp_path, {"exit_before_ready": 3}, ready_timeout_s=60),
    ):
        pytest.fail("the block must not run")
    assert caught.value.kind == LMCACHE_SERVER_START
    assert "exited before it was ready (exit status 3)" in caught.value.detail
    assert "giving up before it was ready" in caught.value.log_tail
    assert time.monotonic() - t0 < 10  # its grandchild, left in the group, is killed at once


def test_a_crash_under_the_arm_is_lmcache_server_died(tmp_path):
    deaths = []
    with _no_leftovers(tmp_path), _server(tmp_path, {"crash_after_s": 0.5}, on_death=deaths.append) as server:
        deadline = time.monotonic() + 10
        while server.alive() or not deaths:  # the arm runs
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert _alive(_wait_for(tmp_path / "grandchild.pid"))  # the group outlives its leader
        with pytest.raises(ServerError) as caught:
            server.check()
    assert deaths == [server]
    err = caught.value
    assert err.kind == LMCACHE_SERVER_DIED and "exited while the arm ran (exit status 1)" in err.detail
    assert "stand-in MP server: crashing" in err.log_tail
    assert err.failure().kind == LMCACHE_SERVER_DIED


def test_ctrl_c_in_the_block_stops_the_group_and_propagates(tmp_path):
    """A real SIGINT to the kit while the arm runs; the server ignores SIGTERM, so SIGKILL ends it."""
    t0 = time.monotonic()
    with (
        _no_leftovers(tmp_path),
        pytest.raises(KeyboardInterrupt),
        _server(tmp_path, {"ignore_term": True}, stop_grace_s=0.5) as server,
    ):
        _wait_for(tmp_path / "grandchild.pid")
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        pytest.fail("no KeyboardInterrupt")
    assert server.proc.returncode == -signal.SIGKILL
    assert time.monotonic() - t0 < 8


def test_stop_all_servers_ends_a_readiness_wait_in_another_thread(tmp_path):
    """The verifier's interrupt reaches the main thread only; a worker waiting for its server fails at once."""
    raised: list[BaseException] = []

    def arm() -> None:
        try:
            with _server(tmp_path, {"never_ready": True}, ready_timeout_s=60):
                pass
        except ServerError as exc:
            raised.append(exc)

    with _no_leftovers(tmp_path):
        thread = threading.Thread(target=arm)
        thread.start()
        _wait_for(tmp_path / "grandchild.pid")
        t0 = time.monotonic()
        stop_all_servers(grace_s=1)
        thread.join(timeout=20)
        assert not thread.is_alive() and time.monotonic() - t0 < 5
    assert raised and "exited before it was ready (stopped by the kit)" in raised[0].detail


@pytest.mark.parametrize("ignore_term", [False, True])
def test_kill_9_of_the_kit_takes_the_server_group_down(tmp_path, ignore_term):
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
    assert "kvkit lifeline: the kit is gone" in (tmp_path / "arm.lmcache-server.log").read_text()


def test_no_server_starts_once_the_run_is_stopping(tmp_path):
    """Issue 21 (3): a server registered only after it started, so one starting during the verifier's
    stop sweep was missed; the stop is checked under the lock where a server registers."""
    from repro.run import runner

    try:
        stop_all_servers()
        with pytest.raises(runner.Interrupted), _server(tmp_path, {}):
            pytest.fail("a server started after the stop")
    finally:
        runner.allow_children()
    assert not (tmp_path / "server.pid").exists() and not (tmp_path / "grandchild.pid").exists()


def test_a_server_the_kit_did_not_start_is_never_taken_for_its_own(tmp_path, monkeypatch):
    """Issue 21 (7): the kit picks free ports and releases them; another process (another cell's
    server) may bind one first. The readiness probe used to accept whoever answered healthy there;
    it now checks that the listening sockets belong to the group the kit started."""
    from repro.lmcache import mp as lmcache_mp

    ports = free_ports("127.0.0.1", 2)
    other = subprocess.Popen(
        [sys.executable, "-m", "tests.stand_in_mp_server", "--port", str(ports[0]), "--http-port", str(ports[1])],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not probe_ready("127.0.0.1", *ports):
            assert other.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        monkeypatch.setattr(lmcache_mp, "free_ports", lambda host, n: list(ports))
        with (
            _no_leftovers(tmp_path),
            pytest.raises(ServerError) as caught,
            _server(tmp_path, {}, ready_timeout_s=15),
        ):
            pytest.fail("the kit took another process's server for the one it started")
    finally:
        other.kill()
        other.wait()
    err = caught.value
    assert err.kind == LMCACHE_SERVER_START, err
    assert f"pid {other.pid}" in err.detail and "not the server the kit started" in err.detail, err.detail


# ---- the server's copy path (repro.lmcache.ops): its import probe and its log --------------------

WARNING_LINE = (
    "[2026-11-30 12:24:29,515] LMCache WARNING: lmcache.cuda_ops compiled extension not found; CudaDeviceOps stays "
    "on the torch baseline for all ops. (device_ops.py:34:lmcache.v1.platform.cuda.device_ops)\n"
)


def test_server_copy_path_from_its_log_and_its_probe(tmp_path):
    from test_lmcache_ops import UNDEFINED

    from repro.lmcache.mp import ops_source, server_copy_path

    failed = {"ops": {"lmcache_imports": True, "imports": False, "error": f"ImportError: {UNDEFINED}"}}
    assert server_copy_path(failed, WARNING_LINE) == {
        "path": "fallback",
        "source": None,
        "detail": f"lmcache.cuda_ops: ImportError: {UNDEFINED}",
    }
    logged = server_copy_path(None, WARNING_LINE)
    assert logged["path"] == "fallback" and logged["detail"].startswith(
        "LMCache logged: lmcache.cuda_ops compiled extension not found; CudaDeviceOps"
    )
    assert server_copy_path(failed, "")["path"] == "fallback"  # the probe alone: the server imports the same
    wheel = {"ops": {"lmcache_imports": True, "imports": True, "file": "/site/lmcache/cuda_ops.so"}}
    assert server_copy_path(wheel, "") == {"path": "compiled", "source": "wheel", "detail": "/site/lmcache/cuda_ops.so"}
    build = tmp_path / "0.5.4-torch2.11.0-sm9.0"
    (build / "lmcache-0.5.4" / "lmcache").mkdir(parents=True)
    (build / "kvkit-lmcache-ops.json").write_text("{}")
    assert ops_source(str(build / "lmcache-0.5.4" / "lmcache" / "cuda_ops.so")) == ("kit build", str(build))
    for probe in (None, {"problem": "python did not answer"}, {"ops": {"lmcache_imports": False, "error": "x"}}):
        said = server_copy_path(probe, "")
        assert said["path"] == "not recorded" and said["detail"]


def test_a_served_arm_records_the_servers_copy_path_from_its_env(tmp_path):
    """The probe runs in the server's interpreter and env while it starts: a fake lmcache whose ops raise."""
    from test_lmcache_ops import UNDEFINED, fake_site

    from repro.lmcache.ops import with_pythonpath

    env = with_pythonpath(_env(), fake_site(tmp_path / "site", ops="raises"))
    with mp_server(sys.executable, tmp_path / "arm.lmcache-server.log", env, settings=STAND_IN) as server:
        assert server.copy_path is None  # decided once the server is stopped and its log whole
    assert server.copy_path == {
        "path": "fallback",
        "source": None,
        "detail": f"lmcache.cuda_ops: ImportError: {UNDEFINED}",
    }
    assert server.record()["copy_path"] == server.copy_path
    with mp_server(sys.executable, tmp_path / "b.lmcache-server.log", _env(), settings=STAND_IN) as bare:
        pass
    assert bare.copy_path["path"] == "not recorded" and "cannot import lmcache" in bare.copy_path["detail"]


def test_a_server_that_fails_still_says_its_copy_path(tmp_path):
    with pytest.raises(ServerError) as failed, _server(tmp_path, {"exit_before_ready": 3}):
        pass
    assert failed.value.copy_path is not None and failed.value.copy_path["path"] == "not recorded"
