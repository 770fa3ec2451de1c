"""An LMCacheMPConnector arm through the whole verifier, without a GPU: the fake engine stands in for
vLLM and tests/stand_in_mp_server.py for LMCache's MP server (both only prove the lifecycle: the
server started for the arm, pointed at, stopped; its failures named ERRORs; nothing left behind)."""

from __future__ import annotations

import json
import time

from kvkit_testutil import ROOT, run_cli
from test_cli_failures import _alive, _args, _env
from test_cli_failures import setup as setup  # noqa: PLC0414 - the fixture, re-exported for these tests

STAND_IN = ["--lmcache-server-module", "tests.stand_in_mp_server"]


def _run(s: dict, stand_in: dict, **fake):
    pid_dir = s["tmp"] / "pids"
    pid_dir.mkdir(exist_ok=True)
    env = {**_env(s, **fake), "KVKIT_STAND_IN": json.dumps({"pid_dir": str(pid_dir), "grandchild": True, **stand_in})}
    env["PYTHONPATH"] = str(ROOT)
    proc = run_cli(_args(s, "--kv-connector", "LMCacheMPConnector", *STAND_IN), env=env, timeout=120)
    return proc, pid_dir


def _no_server_left(pid_dir) -> None:
    deadline = time.monotonic() + 10
    pids = [int(p.read_text()) for p in pid_dir.glob("*.pid")]
    assert pids, "the stand-in wrote no pid: it never started"
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids), "an LMCache server process outlived the run"


def test_the_arm_runs_against_a_server_the_kit_starts_and_stops(setup):
    proc, pid_dir = _run(setup, {})
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(setup["report"].read_text())
    arm = next(a for a in data["arms"] if a["name"] == "LMCacheMPConnector")
    assert arm["verdict"] == "PASS" and arm["error"] is None
    log = (setup["logs"] / "LMCacheMPConnector.lmcache-server.log").read_text()
    assert "--port" in log or log  # the server's own log, kept beside the arm logs
    # its retrieves are in that log, not in the arm's: no in-process "no retrieve was logged" notes,
    # one pointer to the server's log as the report publishes it
    notes = " ".join(arm["findings"])
    assert "no LMCache retrieve was logged" not in notes
    pointer = f"{setup['logs'].name}/LMCacheMPConnector.lmcache-server.log"
    assert pointer in notes and (setup["report"].parent / pointer).is_file()
    _no_server_left(pid_dir)


def test_a_server_that_does_not_start_is_a_named_error(setup):
    proc, pid_dir = _run(setup, {"exit_before_ready": 4})
    assert proc.returncode == 3, proc.stderr[-2000:]
    data = json.loads(setup["report"].read_text())
    arm = next(a for a in data["arms"] if a["name"] == "LMCacheMPConnector")
    assert arm["verdict"] == "ERROR" and arm["error"]["kind"] == "lmcache-server-start"
    assert next(a for a in data["arms"] if a["name"] == "baseline")["verdict"] == "PASS"  # the others go on
    # the arm never ran, so it has no log of its own: it cites the server's, which says why (the chaos run's
    # fault 20, kill -9 of the server before it was ready, found it citing <arm>.log, never written)
    assert arm["log"] == f"{setup['logs'].name}/LMCacheMPConnector.lmcache-server.log"
    assert "stand-in MP server" in (setup["report"].parent / arm["log"]).read_text()
    for a in data["arms"]:
        assert (setup["report"].parent / a["log"]).is_file(), a["log"]
    _no_server_left(pid_dir)


def test_a_server_that_dies_during_the_arm_makes_it_an_error(setup):
    # the arm runs for 3 s (fake engine mode slow, then a normal result); the server crashes after 0.5 s
    proc, pid_dir = _run(setup, {"crash_after_s": 0.5}, modes={"LMCacheMPConnector": "slow"}, sleep_s=3)
    assert proc.returncode == 3, proc.stderr[-2000:]
    data = json.loads(setup["report"].read_text())
    arm = next(a for a in data["arms"] if a["name"] == "LMCacheMPConnector")
    assert arm["verdict"] == "ERROR" and arm["error"]["kind"] == "lmcache-server-died"
    assert arm["probes"] == []  # a result made against a dead server is no evidence
    _no_server_left(pid_dir)


def test_each_trial_gets_a_fresh_server_and_every_run_is_in_the_report(setup):
    """--trials 3: three MP servers, one per run, each started and stopped; the report keeps each run."""
    pid_dir = setup["tmp"] / "pids"
    pid_dir.mkdir(exist_ok=True)
    env = {**_env(setup), "KVKIT_STAND_IN": json.dumps({"pid_dir": str(pid_dir)}), "PYTHONPATH": str(ROOT)}
    args = _args(setup, "--kv-connector", "LMCacheMPConnector", *STAND_IN, "--trials", "3", "--jobs", "1")
    proc = run_cli(args, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(setup["report"].read_text())
    arm = next(a for a in data["arms"] if a["name"] == "LMCacheMPConnector")
    assert arm["trials"]["n"] == 3 and [r["trial"] for r in arm["trials"]["runs"]] == [1, 2, 3]
    assert data["conditions"]["trials"] == 3
    for name in ("LMCacheMPConnector", "LMCacheMPConnector~trial2", "LMCacheMPConnector~trial3"):
        # a fresh server for every trial, its log published beside its arm log
        assert (setup["logs"] / f"{name}.lmcache-server.log").is_file()
    # one at a time: the MP arm shared its device only with its own servers
    assert arm["sharing"]["shared"] is False and arm["confirmation"]["status"] == "not needed"
    assert [p["process"] for p in arm["copy_paths"]] == ["engine", "MP server"]
    _no_server_left(pid_dir)
