"""The whole command under failure: child errors in the report, interrupts, secrets, refusals to
compare, and bad input (one line, exit 2, nothing overwritten). The engine child is
tests/fake_engine.py through the hidden --engine-module flag: it proves failure handling only."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kvkit_testutil import ROOT, run_cli

from repro.run import lifeline
from repro.run.lifeline import group_members

FAKE = ["--engine-module", "tests.fake_engine"]
OLD_REPORT = b'{"kind": "kvkit-report", "old": true}\n'
OLD_LOG = b"old log\n"


def _fixture(tmp: Path, probes: list | None = None, **top) -> Path:
    probes = (
        probes
        if probes is not None
        else [
            {"name": "p1", "prompt": {"token_ids": list(range(1, 40))}},
            {"name": "p2", "prompt": {"token_ids": list(range(2, 60))}},
        ]
    )
    data = {"kind": "kvkit-fixture", "schema_version": 1, "name": "t", "tokenizer": {"name": "fake"}, "probes": probes}
    data.update(top)
    path = tmp / "fixture.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def setup(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    report = tmp_path / "out" / "report.json"
    report.parent.mkdir()
    report.write_bytes(OLD_REPORT)
    logs = report.parent / "report.logs"
    logs.mkdir()
    (logs / "baseline.log").write_bytes(OLD_LOG)
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    return {
        "tmp": tmp_path,
        "model": model,
        "report": report,
        "logs": logs,
        "fixture": _fixture(tmp_path),
        "TMPDIR": scratch,
    }


def _args(s: dict, *extra: str, fixture: Path | None = None, report: Path | None = None) -> list[str]:
    """The verifier's arguments; --force: each test's run replaces the setup's earlier report, or keeps it on failure
    (without --force it is refused before anything runs: tests/test_no_overwrite.py)."""
    return [
        "--model",
        str(s["model"]),
        "--max-model-len",
        "256",
        "--max-tokens",
        "4",
        "--timeout",
        "60",
        "--fixture",
        str(fixture or s["fixture"]),
        "--report",
        str(report or s["report"]),
        "--force",
        *FAKE,
        *extra,
    ]


def _env(s: dict, **fake) -> dict:
    return {"KVKIT_FAKE": json.dumps(fake), "TMPDIR": str(s["TMPDIR"])}


def assert_untouched(s: dict) -> None:
    assert s["report"].read_bytes() == OLD_REPORT
    assert sorted(p.name for p in s["logs"].iterdir()) == ["baseline.log"]
    assert (s["logs"] / "baseline.log").read_bytes() == OLD_LOG
    assert [p.name for p in s["report"].parent.iterdir() if p.name.startswith(".")] == [], "work dir left behind"
    assert list(s["TMPDIR"].iterdir()) == [], "scratch dir left behind"


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_completed_run_with_fake_engine_writes_a_report(setup):
    proc = run_cli(_args(setup, "--kv-connector", "ExampleConnector", "--compare-native"), env=_env(setup), timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(setup["report"].read_text())
    # baseline, ExampleConnector, native and native-matched (native reusing what the connector reused)
    assert [a["verdict"] for a in data["arms"]] == ["PASS", "PASS", "PASS", "PASS"] and data["complete"] is True
    assert sorted(p.name for p in setup["logs"].iterdir()) == [
        "ExampleConnector.log",
        "baseline.log",
        "native-matched.log",
        "native.log",
    ]


@pytest.mark.parametrize(
    "mode, kind",
    [
        ("sigkill", "crash"),
        ("hang", "timeout"),
        ("oom", "out-of-memory"),
        ("garbage", "unparsable-output"),
        ("missing", "missing-output"),
        ("exit7", "nonzero-exit"),
        ("raise", "raised"),
    ],
)
def test_child_failure_is_a_named_error_in_the_report_and_exit_3(setup, mode, kind):
    pid_dir = setup["tmp"] / "pids"
    pid_dir.mkdir()
    proc = run_cli(
        _args(setup, "--kv-connector", "ExampleConnector", "--timeout", "3"),
        env=_env(setup, modes={"ExampleConnector": mode}, pid_dir=str(pid_dir)),
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    data = json.loads(setup["report"].read_text())
    arm = data["arms"][1]
    assert arm["verdict"] == "ERROR" and arm["error"]["kind"] == kind
    assert f"mode={mode}" in arm["error"]["log_tail"]
    assert data["errors"] == [{"arm": "ExampleConnector", "kind": kind, "detail": arm["error"]["detail"]}]
    assert f"ERROR ExampleConnector: {kind}" in proc.stdout
    for pid_file in pid_dir.iterdir():
        assert not _alive(int(pid_file.read_text())), pid_file.name


# None: the arms one after another (the second one hangs); 2: both at once, both hanging.
JOBS = [None, 2]


def _kit_mid_arm(setup: dict, jobs: int | None) -> tuple[subprocess.Popen, list[Path]]:
    """The kit, started, once every hanging arm's child and grandchild are up (their pid files)."""
    pid_dir = setup["tmp"] / "pids"
    pid_dir.mkdir()
    modes = {"ExampleConnector": "hang"} if jobs is None else {"*": "hang"}
    hanging = ["ExampleConnector"] if jobs is None else ["baseline", "ExampleConnector"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), **_env(setup, modes=modes, pid_dir=str(pid_dir)))
    argv = _args(setup, "--kv-connector", "ExampleConnector", *([] if jobs is None else ["--jobs", str(jobs)]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "repro.verify_kv_reuse", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not all((pid_dir / f"{arm}.grandchild.pid").exists() for arm in hanging):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.1)  # the last pid file is written before it is closed
    return proc, sorted(pid_dir.iterdir())


def _assert_all_gone(pid_files: list[Path], within_s: float) -> None:
    """Every process the pid files name is gone, and so is every group an arm's child led."""
    deadline = time.monotonic() + within_s
    pids = [int(p.read_text()) for p in pid_files]
    groups = [int(p.read_text()) for p in pid_files if p.name.endswith(".child.pid")]
    while any(_alive(pid) for pid in pids) or any(group_members(g) for g in groups):
        assert time.monotonic() < deadline, {p.name: _alive(int(p.read_text())) for p in pid_files}
        time.sleep(0.05)


@pytest.mark.parametrize("jobs", JOBS)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_mid_arm_kills_children_and_leaves_the_old_report(setup, sig, jobs):
    proc, pid_files = _kit_mid_arm(setup, jobs)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert_untouched(setup)
    _assert_all_gone(pid_files, within_s=0)  # the kit reaped every group before it exited


@pytest.mark.parametrize("jobs", JOBS)
def test_kill_9_of_the_kit_stops_its_children_and_leaves_the_old_report(setup, jobs):
    """Nothing runs in a SIGKILLed kit: each child's lifeline watcher stops its group (repro.run.lifeline)."""
    proc, pid_files = _kit_mid_arm(setup, jobs)
    proc.kill()
    proc.communicate(timeout=60)
    try:
        _assert_all_gone(pid_files, within_s=lifeline.GRACE_S + 10)
    except AssertionError:  # leave no stray process behind a failed test
        for p in pid_files:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(p.read_text()), signal.SIGKILL)
        raise
    assert setup["report"].read_bytes() == OLD_REPORT
    assert sorted(p.name for p in setup["logs"].iterdir()) == ["baseline.log"]
    assert (setup["logs"] / "baseline.log").read_bytes() == OLD_LOG


def test_the_next_run_removes_what_a_killed_kit_left_and_says_so_in_one_line(setup):
    """Issue 21 (8): after kill -9 the kit's work directory (gigabytes of KV tensors on a GPU box) and
    its connector stores stayed for ever. The next run finds work directories whose kit is no longer
    running (by the pid and start time each records) and removes them with their stores."""
    proc, pid_files = _kit_mid_arm(setup, 2)
    proc.kill()
    proc.communicate(timeout=60)
    _assert_all_gone(pid_files, within_s=lifeline.GRACE_S + 10)
    parent = setup["report"].parent
    left = [p.name for p in parent.iterdir() if p.name.startswith(".report.work-")]
    assert len(left) == 1 and list(setup["TMPDIR"].iterdir()), "the killed kit left nothing to clean"
    again = run_cli(_args(setup, "--kv-connector", "ExampleConnector"), env=_env(setup), timeout=120)
    assert again.returncode == 0, again.stderr
    assert [p.name for p in parent.iterdir() if p.name.startswith(".")] == []
    assert list(setup["TMPDIR"].iterdir()) == [], "its connector stores are still there"
    said = [line for line in again.stderr.splitlines() if left[0] in line]
    assert len(said) == 1 and "no longer running" in said[0], again.stderr


def test_secrets_are_redacted_in_report_and_kept_logs(setup):
    secret = "hf_abcdefghijklmnop0123"
    proc = run_cli(
        _args(setup, "--kv-connector", "ExampleConnector", "--kv-connector-extra-config", json.dumps({"note": secret})),
        env={
            "HF_TOKEN": secret,
            "KVKIT_DB_PASSWORD": secret + "x",
            **_env(setup, echo_env=["HF_TOKEN", "KVKIT_DB_PASSWORD"]),
        },
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    text = setup["report"].read_text()
    data = json.loads(text)
    assert data["provenance"]["env"]["HF_TOKEN"] == "<redacted>"
    assert data["provenance"]["env"]["KVKIT_DB_PASSWORD"] == "<redacted>"
    assert secret not in json.dumps(data["provenance"])
    logs = "".join(p.read_text() for p in setup["logs"].iterdir())
    assert "HF_TOKEN=<redacted>" in logs and "KVKIT_DB_PASSWORD=<redacted>" in logs and secret not in logs


@pytest.mark.parametrize(
    "key, value", [("dtype", "float16"), ("model", "other"), ("revision", "abc"), ("block_size", 32)]
)
def test_arms_that_differ_are_not_compared(setup, key, value):
    proc = run_cli(
        _args(setup, "--kv-connector", "ExampleConnector"),
        env=_env(setup, config={"ExampleConnector": {key: value}}),
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    arm = json.loads(setup["report"].read_text())["arms"][1]
    assert arm["verdict"] == "ERROR" and arm["probes"] == []
    assert any(r.startswith(f"refusing to compare: {key} differs") for r in arm["reasons"]), arm["reasons"]


def _edit_fixture(s: dict, drop: str | None = None, **change) -> list[str]:
    data = json.loads(s["fixture"].read_text())
    data.update(change)
    data.pop(drop, None)
    s["fixture"].write_text(json.dumps(data))
    return []


def _probes(s: dict, *probes: dict) -> list[str]:
    _fixture(s["tmp"], list(probes))
    return []


def _lmcache_yaml(s: dict, text: str | None) -> list[str]:
    path = s["tmp"] / "lmcache.yaml"
    if text is not None:
        path.write_text(text)
    return ["--kv-connector", "LMCacheConnectorV1", "--lmcache-config", str(path)]


def _tok(name: str, ids: list[int]) -> dict:
    return {"name": name, "prompt": {"token_ids": ids}}


def _arms(s: dict, *names: str) -> list[str]:
    """Fixture connector arms of these names, run with --compare-native (so native-matched runs too)."""
    conn = {"connector": "ExampleConnector", "extra_config": {"shared_storage_path": "@tmpdir"}}
    _edit_fixture(s, arms=[{"name": n, **conn} for n in names])
    return ["--compare-native"]


def _multi(s: dict, **extra) -> list[str]:
    """A fixture MultiConnector arm with this extra_config (issue 36, item 5), run with --compare-native."""
    _edit_fixture(s, arms=[{"name": "m", "connector": "MultiConnector", "extra_config": extra}])
    return ["--compare-native"]


_EXAMPLE_MEMBER = {"kv_connector": "ExampleConnector", "kv_role": "kv_both"}

# case: (set-up returning extra flags, what the one-line message must name)
BAD_INPUT = {
    "malformed fixture JSON": (lambda s: s["fixture"].write_text('{"kind": "kvkit-fixture",') and [], "not valid JSON"),
    "fixture missing probes": (lambda s: _edit_fixture(s, drop="probes"), "fixture: missing field 'probes'"),
    "fixture wrong type": (lambda s: _edit_fixture(s, name=5), "fixture.name: wrong type int"),
    "fixture newer version": (lambda s: _edit_fixture(s, schema_version=99), "upgrade the kit"),
    "token outside vocabulary": (lambda s: _probes(s, _tok("p", [1, 5000])), "token ID 5000 outside the vocabulary"),
    "prompt too long": (lambda s: _probes(s, _tok("p", list(range(1, 300)))), "over max_model_len - max_tokens = 252"),
    "duplicate probe names": (lambda s: _probes(s, _tok("p", [1, 2]), _tok("p", [3, 4])), "duplicate probe name 'p'"),
    "missing fixture": (lambda s: s["fixture"].unlink() or [], "cannot read"),
    "unreadable LMCache YAML": (lambda s: _lmcache_yaml(s, None), "--lmcache-config"),
    "invalid LMCache YAML": (lambda s: _lmcache_yaml(s, "chunk_size: [1,\n"), "invalid YAML"),
    "LMCache YAML bad chunk": (lambda s: _lmcache_yaml(s, "chunk_size: -4\n"), "chunk_size must be a positive"),
    "LMCache YAML not a mapping": (lambda s: _lmcache_yaml(s, "- a\n- b\n"), "must be a mapping"),
    "module path without connector": (lambda s: ["--kv-connector-module-path", "x.y"], "needs --kv-connector"),
    "lmcache config without LMCache": (
        lambda s: [
            "--kv-connector",
            "ExampleConnector",
            "--lmcache-config",
            str(ROOT / "fixtures" / "lmcache-local-cpu.yaml"),
        ],
        "needs an LMCache",
    ),
    "LMCacheConnectorV1 with module path": (
        lambda s: ["--kv-connector", "LMCacheConnectorV1", "--kv-connector-module-path", "x"],
        "is in-tree",
    ),
    "nothing to compare": (lambda s: [], "nothing to compare"),
    "extra config not JSON": (
        lambda s: ["--kv-connector", "ExampleConnector", "--kv-connector-extra-config", "{x"],
        "not valid JSON",
    ),
    "missing model path": (lambda s: ["--model", str(s["tmp"] / "no-model")], "no such local model directory"),
    "model dir without config": (lambda s: (s["model"] / "config.json").unlink() or [], "has no config.json"),
    "unknown flag": (lambda s: ["--frobnicate"], "unrecognized arguments"),
    "reuses out of range": (lambda s: ["--reuses", "0"], "--reuses must be"),
    "no trials": (lambda s: ["--trials", "0"], "--trials must be from 1 to"),
    "trials not an integer": (lambda s: ["--trials", "2.5"], "argument --trials: invalid int value"),
    "unknown copy path": (lambda s: ["--lmcache-ops", "fastest"], "argument --lmcache-ops: invalid choice"),
    "GPU load on the CPU": (lambda s: ["--gpu-load", "--device", "cpu"], "--gpu-load needs a CUDA GPU"),
    # issue 21 (1): an arm named like one of the kit's own arms or files (native-matched used to wait on
    # itself for ever), a name no file may carry, or two arms of one name
    "fixture arm named native-matched": (lambda s: _arms(s, "native-matched"), "'native-matched' is reserved"),
    "fixture arm named baseline": (lambda s: _arms(s, "baseline"), "'baseline' is reserved"),
    "fixture arm named gpu-load": (lambda s: _arms(s, "gpu-load"), "'gpu-load' is reserved"),
    "fixture arm named kv-compare": (lambda s: _arms(s, "kv-compare"), "'kv-compare' is reserved"),
    "fixture arm named like a server log": (lambda s: _arms(s, "A.lmcache-server"), "is reserved"),
    "fixture arm named like a trial": (lambda s: _arms(s, "A~trial2"), "must be 1-64 letters, digits"),
    "fixture arm name with a slash": (lambda s: _arms(s, "../A"), "must be 1-64 letters, digits"),
    "fixture arm name starting with a dot": (lambda s: _arms(s, ".A"), "must not start with '.'"),
    "duplicate fixture arm names": (lambda s: _arms(s, "A", "A"), "duplicate arm name 'A'"),
    "command-line connector named native": (
        lambda s: ["--kv-connector", "native", "--compare-native"],
        "--kv-connector: 'native' is reserved",
    ),
    # issue 36: vLLM's own offloading, as its flag makes it (CUDA only)
    "offloading size zero": (lambda s: ["--kv-offloading-size", "0", "--compare-native"], "must be a positive"),
    "offloading size negative": (lambda s: ["--kv-offloading-size", "-8", "--compare-native"], "must be a positive"),
    "offloading on the CPU": (
        lambda s: ["--kv-offloading-size", "8", "--device", "cpu", "--compare-native"],
        "OffloadingConnector runs only on CUDA or XPU GPUs",
    ),
    "offloading with an LMCache connector": (
        lambda s: ["--kv-offloading-size", "8", "--kv-connector", "LMCacheConnectorV1"],
        "drop --kv-connector LMCacheConnectorV1 (vLLM's --kv-offloading-backend lmcache",
    ),
    "fixture offloading arm on the CPU": (
        lambda s: (
            _edit_fixture(s, arms=[{"name": "off", "kv_offloading_size": 4, "kv_offloading_backend": "simple"}])
            + ["--device", "cpu", "--compare-native"]
        ),
        "SimpleCPUOffloadConnector runs only on CUDA or XPU GPUs",
    ),
    "fixture offloading arm size zero": (
        lambda s: _edit_fixture(s, arms=[{"name": "off", "kv_offloading_size": 0}]) + ["--compare-native"],
        "kv_offloading_size: must be a positive",
    ),
    "fixture offloading arm beside a connector": (
        lambda s: (
            _edit_fixture(s, arms=[{"name": "off", "kv_offloading_size": 4, "connector": "X"}]) + ["--compare-native"]
        ),
        "drop connector and extra_config",
    ),
    "fixture GPU cache reset unknown": (
        lambda s: (
            _edit_fixture(
                s,
                arms=[
                    {"name": "x", "connector": "ExampleConnector", "gpu_prefix_cache": True, "gpu_cache_reset": "now"}
                ],
            )
            + ["--compare-native"]
        ),
        "gpu_cache_reset: must be one of before-reuse, never",
    ),
    # issue 36 (5): MultiConnector arms whose members the kit cannot run
    "MultiConnector without connectors": (lambda s: _multi(s), "MultiConnector needs extra_config {'connectors'"),
    "MultiConnector with no members": (lambda s: _multi(s, connectors=[]), "must be a non-empty list of member"),
    "MultiConnector members not a list": (lambda s: _multi(s, connectors={"a": 1}), "must be a non-empty list"),
    "MultiConnector member not an object": (lambda s: _multi(s, connectors=["ExampleConnector"]), "must be an object"),
    "MultiConnector member unnamed": (
        lambda s: _multi(s, connectors=[{"kv_role": "kv_both"}]),
        "must name a connector",
    ),
    "MultiConnector inside MultiConnector": (
        lambda s: _multi(s, connectors=[_EXAMPLE_MEMBER, {"kv_connector": "MultiConnector"}]),
        "connectors[1] is itself a MultiConnector",
    ),
    "MultiConnector with an LMCache member": (
        lambda s: _multi(s, connectors=[_EXAMPLE_MEMBER, {"kv_connector": "LMCacheConnectorV1"}]),
        "connectors[1] is LMCacheConnectorV1: the kit makes LMCache's store fresh",
    ),
    "MultiConnector offloading member on the CPU": (
        lambda s: _multi(s, connectors=[{"kv_connector": "OffloadingConnector"}]) + ["--device", "cpu"],
        "arm m: OffloadingConnector runs only on CUDA or XPU GPUs",
    ),
    "command-line MultiConnector with no members": (
        lambda s: ["--kv-connector", "MultiConnector", "--kv-connector-extra-config", '{"connectors": []}'],
        "--kv-connector-extra-config: MultiConnector's connectors must be a non-empty list",
    ),
    "command-line connector named native-matched": (
        lambda s: ["--kv-connector", "native-matched", "--compare-native"],
        "--kv-connector: 'native-matched' is reserved",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_is_one_line_exit_2_and_overwrites_nothing(setup, case):
    make, message = BAD_INPUT[case]
    extra = make(setup)
    default_arm = (
        []
        if case in ("nothing to compare", "module path without connector")
        or "--kv-connector" in extra
        or "--compare-native" in extra
        else ["--kv-connector", "ExampleConnector"]
    )
    proc = run_cli(_args(setup, *default_arm) + extra, env=_env(setup), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""
    assert_untouched(setup)


@pytest.mark.parametrize(
    "where", ["parent is a file", "read-only file system", "report is a directory", "report is the fixture"]
)
def test_unwritable_report_path_is_a_usage_error(setup, where):
    target = {
        "parent is a file": setup["fixture"] / "r.json",
        "read-only file system": Path("/proc/kvkit/r.json"),
        "report is a directory": setup["logs"],
        "report is the fixture": setup["fixture"],
    }[where]
    before = setup["fixture"].read_bytes()
    proc = run_cli(_args(setup, "--kv-connector", "ExampleConnector", report=target), env=_env(setup), timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--report" in proc.stderr, proc.stderr
    assert setup["fixture"].read_bytes() == before
    assert_untouched(setup)


def test_a_kit_error_in_the_first_arms_thread_never_hangs_the_others(setup, monkeypatch):
    """run_arms: the first arm's thread raising (here: its interpreter cannot be started) must not
    leave the waiting arms waiting for a preflight; the error reaches the caller."""
    from repro.contract.job import ArmSpec, EngineConfig, Preflight, ProbeJob, build_job
    from repro.plan.arms import PlannedArm, arm_slots
    from repro.plan.options import parse_args
    from repro.plan.run_plan import build_plan
    from repro.run import launch
    from repro.run.progress import Progress

    argv = _args(setup, "--kv-connector", "ExampleConnector", "--jobs", "2")
    plan = build_plan(parse_args(argv), argv)
    arms = [PlannedArm(ArmSpec("baseline", "baseline")), PlannedArm(ArmSpec("native", "native"))]
    engine = EngineConfig(str(setup["model"]), None, "auto", 0, 0.1, 256, 16, "cpu")
    probes = [ProbeJob("p", {"token_ids": [1, 2]}, 1)]
    # the first arm makes a preflight: without the fix the second waits for it for ever
    job = build_job(
        ArmSpec("baseline", "baseline"), engine, probes, max_tokens=2, logprobs=2, preflight=Preflight((), "cpu")
    )

    def boom(*args, **kwargs):
        raise FileNotFoundError("no such interpreter")

    monkeypatch.setattr(launch, "run_arm", boom)
    work = setup["tmp"] / "work"
    work.mkdir()
    with Progress([a.name for a in arms], "quiet") as progress, pytest.raises(FileNotFoundError):
        launch.run_arms(
            arms, lambda i, dep=None: job, arm_slots(plan.engine, 2, 2), 2, work, {}, plan.children, progress
        )


@pytest.mark.parametrize("preflight_ok", [True, False])
def test_arms_start_during_the_preflight_and_wait_at_the_gate_for_its_word(setup, preflight_ok):
    """run_arms: the arms after the first start while the first child makes the preflight (they import
    vLLM meanwhile) with the gate file in their environment; the parent writes "go" or "stop" there
    once the first child's progress file says how the preflight went."""
    import threading
    import time

    from repro.contract.job import PREFLIGHT_GATE_ENV, ArmSpec, EngineConfig, Preflight, ProbeJob, build_job
    from repro.contract.job import progress_path as progress_of
    from repro.contract.result import ArmResult
    from repro.plan.arms import PlannedArm, arm_slots
    from repro.plan.options import parse_args
    from repro.plan.run_plan import build_plan
    from repro.record.atomic import write_json_atomic
    from repro.run import launch
    from repro.run.progress import Progress
    from repro.run.runner import ArmOutcome

    argv = _args(setup, "--kv-connector", "ExampleConnector", "--jobs", "2")
    plan = build_plan(parse_args(argv), argv)
    arms = [PlannedArm(ArmSpec("baseline", "baseline")), PlannedArm(ArmSpec("native", "native"))]
    engine = EngineConfig(str(setup["model"]), None, "auto", 0, 0.1, 256, 16, "cpu")
    probes = [ProbeJob("p", {"token_ids": [1, 2]}, 1)]
    first = build_job(
        ArmSpec("baseline", "baseline"), engine, probes, max_tokens=2, logprobs=2, preflight=Preflight((), "cpu")
    )
    other = build_job(ArmSpec("native", "native"), engine, probes, max_tokens=2, logprobs=2)
    work = setup["tmp"] / "work"
    work.mkdir()
    seen: dict = {}
    decided = threading.Event()

    def fake_run_arm(job, workdir, log_path, env, timeout_s, python, module, disk):
        name = job.arm.name
        if name == "baseline":  # the first child: the preflight takes a while, then its progress file says
            time.sleep(1.0)
            progress = progress_of(str(workdir / "baseline.result.json"))
            write_json_atomic(progress, {"stage": "importing", "preflight_ok": preflight_ok})
            decided.wait(10)
            problems = () if preflight_ok else ("unknown connector 'X'",)
            return ArmOutcome(name, ArmResult(arm=name, preflight_problems=problems), None, log_path, "", 1.0)
        seen["started_before_the_word"] = not decided.is_set() and not (workdir / "preflight.gate").exists()
        gate = env.get(PREFLIGHT_GATE_ENV)
        seen["gate"] = gate
        deadline = time.monotonic() + 10
        while gate and not Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        seen["word"] = Path(gate).read_text().strip() if gate else None
        decided.set()
        return ArmOutcome(name, ArmResult(arm=name), None, log_path, "", 1.0)

    real = launch.run_arm
    launch.run_arm = fake_run_arm
    try:
        with Progress([a.name for a in arms], "quiet") as progress:
            outcomes = launch.run_arms(
                arms, lambda i, dep=None: first if i == 0 else other, arm_slots(plan.engine, 2, 2), 2, work, {},
                plan.children, progress,
            )  # fmt: skip
    finally:
        launch.run_arm = real
    assert seen["started_before_the_word"] and seen["gate"] == str(work / "preflight.gate")
    assert seen["word"] == ("go" if preflight_ok else "stop")
    assert bool(outcomes[0].result.preflight_problems) is not preflight_ok


def test_a_fixture_arm_runs_its_own_lmcache_copy_path_and_the_report_says_so(setup):
    """One connector twice, once per copy path: the arm naming `lmcache_ops: fallback` runs with the
    kit's blocker on its PYTHONPATH (it blocks lmcache.cuda_ops), the other arm without it."""
    from repro.lmcache.ops import FALLBACK_DIR

    arms = [
        {"name": "ex-fallback", "connector": "ExampleConnector", "lmcache_ops": "fallback"},
        {"name": "ex-default", "connector": "ExampleConnector"},
    ]
    for arm in arms:
        arm["extra_config"] = {"shared_storage_path": "@tmpdir"}
    fixture = _fixture(setup["tmp"], arms=arms)
    proc = run_cli(_args(setup, fixture=fixture), env=_env(setup, echo_env=["PYTHONPATH"]), timeout=120)
    assert proc.returncode == 0, proc.stderr
    logs = {p.stem: p.read_text() for p in setup["logs"].iterdir()}
    paths = {arm: next(line for line in text.splitlines() if "PYTHONPATH=" in line) for arm, text in logs.items()}
    assert str(FALLBACK_DIR) in paths["ex-fallback"]
    assert str(FALLBACK_DIR) not in paths["ex-default"] and str(FALLBACK_DIR) not in paths["baseline"]
    own = json.loads(setup["report"].read_text())["provenance"]["lmcache_ops_arms"]
    assert list(own) == ["ex-fallback"] and own["ex-fallback"]["mode"] == "fallback"
    assert own["ex-fallback"]["path"] == "fallback"


def test_a_fixture_arm_with_an_unknown_copy_path_is_one_line_exit_2(setup):
    arms = [{"name": "ex", "connector": "ExampleConnector", "lmcache_ops": "fastest"}]
    proc = run_cli(_args(setup, fixture=_fixture(setup["tmp"], arms=arms)), env=_env(setup), timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "arms[0].lmcache_ops: must be one of auto, compiled, fallback" in proc.stderr
    assert_untouched(setup)


def test_an_arm_that_floods_the_disk_is_killed_named_and_the_others_complete(setup):
    """An H200 run's children grew its work directory at ~450 MB/s until the disk was full: no report, and
    twice a machine that stopped answering. Now the arm is killed past --max-child-disk-gb, ERROR disk-runaway
    with the figures, and the report is written with the other arms judged."""
    pid_dir = setup["tmp"] / "pids"
    pid_dir.mkdir()
    cap_mb = 20  # the fake floods at 20 MB a second
    proc = run_cli(
        _args(
            setup, "--kv-connector", "ExampleConnector", "--compare-native", "--max-child-disk-gb", str(cap_mb / 1000)
        ),
        env=_env(setup, modes={"native": "flood-kv"}, pid_dir=str(pid_dir)),
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    flooded_mb = int((pid_dir / "native.flooded").read_text())
    assert flooded_mb < 10 * cap_mb, "killed only after it wrote ten times the cap"
    data = json.loads(setup["report"].read_text())
    verdicts = {a["name"]: (a["verdict"], (a["error"] or {}).get("kind")) for a in data["arms"]}
    assert verdicts == {
        "baseline": ("PASS", None),
        "ExampleConnector": ("PASS", None),
        "native": ("ERROR", "disk-runaway"),
        "native-matched": ("PASS", None),
    }
    detail = next(a for a in data["arms"] if a["name"] == "native")["error"]["detail"]
    assert "over the cap of 20.0 MB per child (--max-child-disk-gb)" in detail
    assert re.search(r"largest: kv/native/\d{6}\.computed\.000\.pt \d", detail), detail
    assert "ERROR native: disk-runaway" in proc.stdout
    assert (setup["logs"] / "native.log").read_text().startswith("fake-engine: arm=native mode=flood-kv")
    for pid_file in pid_dir.glob("*.pid"):
        assert not _alive(int(pid_file.read_text())), pid_file.name
    assert [p.name for p in setup["report"].parent.iterdir() if p.name.startswith(".")] == [], "work dir left"
