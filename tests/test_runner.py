"""The parent side under child failures: every way a child goes wrong is a distinct named kind,
with the log tail, and nothing the child started is left running. Uses tests/fake_engine.py: a
stand-in child that fails on purpose (it proves failure handling, never verification)."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from repro.contract.failure import (
    CRASH,
    MISSING_OUTPUT,
    NONZERO_EXIT,
    OOM,
    RAISED,
    RESULT_VERSION,
    TIMEOUT,
    UNPARSABLE_OUTPUT,
)
from repro.contract.job import ArmSpec, EngineConfig, Job, ProbeJob, build_job
from repro.judge import logscan
from repro.run import runner
from repro.run.diskwatch import DiskLimits
from repro.run.exits import classify_exit
from repro.run.runner import child_env, run_arm

FAKE = "tests.fake_engine"


def _job(arm: str = "baseline", mode: str = "baseline") -> Job:
    engine = EngineConfig(
        model="fake",
        revision=None,
        dtype="float32",
        seed=0,
        gpu_memory_utilization=0.1,
        max_model_len=256,
        block_size=16,
        device="cpu",
    )
    probes = [ProbeJob("p", {"token_ids": list(range(1, 40))}, 2)]
    return build_job(ArmSpec(arm, mode), engine, probes, max_tokens=4, logprobs=2)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def run_fake(
    tmp_path: Path, mode: str, timeout_s: float = 60.0, job: Job | None = None, disk: DiskLimits | None = None, **spec
) -> runner.ArmOutcome:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir(exist_ok=True)
    fake = {"modes": {"*": mode}, "pid_dir": str(pid_dir), **spec}
    env = child_env(dict(os.environ), hashseed="0", extra={"KVKIT_FAKE": json.dumps(fake)})
    return run_arm(
        job or _job(),
        workdir=tmp_path,
        log_path=tmp_path / "baseline.log",
        env=env,
        timeout_s=timeout_s,
        python=sys.executable,
        module=FAKE,
        disk=disk,
    )


def assert_no_leftovers(tmp_path: Path) -> None:
    for name in ("baseline.child.pid", "baseline.grandchild.pid"):
        path = tmp_path / "pids" / name
        assert path.is_file(), f"the fake child did not get to write {name}"
        pid = int(path.read_text())
        assert not _alive(pid), f"{name} {pid} is still running"
    leader = int((tmp_path / "pids" / "baseline.child.pid").read_text())
    assert runner.group_members(leader) == [], "its group (the lifeline's watcher too) is still running"


@pytest.mark.parametrize(
    "mode, kind, detail",
    [
        ("sigkill", CRASH, "SIGKILL"),
        ("segfault", CRASH, "SIGSEGV"),
        ("oom", OOM, "memoryerror"),
        ("exit7", NONZERO_EXIT, "exit status 7"),
        ("missing", MISSING_OUTPUT, "without writing"),
        ("garbage", UNPARSABLE_OUTPUT, "not valid JSON"),
        ("wrong-kind", UNPARSABLE_OUTPUT, "not a kvkit-arm-result"),
        ("raise", RAISED, "ValueError: fake engine raised"),
        ("raise-no-record", NONZERO_EXIT, "exit status 3"),
    ],
)
def test_each_child_failure_is_a_named_kind_with_the_log_tail(tmp_path, mode, kind, detail):
    out = run_fake(tmp_path, mode)
    assert (out.result is not None) == (kind == RAISED)  # only a raised child leaves its (error) result
    assert out.failure is not None and out.failure.kind == kind
    assert detail.lower() in out.failure.detail.lower()
    assert f"fake-engine: arm=baseline mode={mode}" in out.failure.log_tail
    assert_no_leftovers(tmp_path)


def test_success_reaps_grandchildren_too(tmp_path):
    out = run_fake(tmp_path, "ok")
    assert out.failure is None and out.result.probes[0].name == "p"
    assert_no_leftovers(tmp_path)


def test_hang_past_timeout_kills_the_whole_group(tmp_path):
    t0 = time.monotonic()
    out = run_fake(tmp_path, "hang", timeout_s=2)
    assert out.failure.kind == TIMEOUT and "time limit" in out.failure.detail
    assert "mode=hang" in out.failure.log_tail
    assert time.monotonic() - t0 < 15
    assert_no_leftovers(tmp_path)


def test_a_timeout_says_what_the_log_ended_on(tmp_path):
    """An engine that stopped making progress logs one iteration's lines until it is killed (on the H200, 46.8 MB
    in 300 s); its timeout says so from its own lines: their count, and how few distinct lines the last 2,000
    are once time stamps and request ids are masked. A silent hang ends on the lines it logged last."""
    (tmp_path / "spin").mkdir()
    (tmp_path / "hang").mkdir()
    spun = run_fake(tmp_path / "spin", "spin", timeout_s=2)
    assert spun.failure.kind == TIMEOUT
    head, _, said = spun.failure.detail.partition("; its log: ")
    assert head == "the arm ran past its time limit and was killed with its process group"
    assert (
        "; its last 2,000 lines are 3 distinct lines (times and request ids masked); the 3 most frequent make up "
        in said
    )
    assert "2,000 of them, the first 66" in said  # 667 or 668: where the window starts in the three
    assert said.endswith('times: "[' + said.split('times: "[', 1)[1])  # one quoted line, masked as below
    assert re.search(r'"\[\d{4}-\d{2}-\d{2} T\] LMCache INFO: Reqid: X, Total tokens \d+, hit tokens: \d+"$', said)
    hung = run_fake(tmp_path / "hang", "hang", timeout_s=2)
    assert hung.failure.kind == TIMEOUT and "; its log: " in hung.failure.detail
    assert "distinct lines" in hung.failure.detail and "fake-engine: arm=baseline mode=hang" in hung.failure.detail


def test_stall_text_masks_times_and_request_ids_only():
    vllm = "(EngineCore pid=7) INFO 12-02 02:38:30 [core.py:1] step {i}"
    lmc = "[2026-12-02 02:38:30,{i:03d}] LMCache INFO: [req_id={i}-ab] Retrieved 256, cost 0.{i} ms"
    text = "\n".join(line.format(i=i) for i in range(5) for line in (vllm, lmc)) + "\n\n"
    said = logscan.stall_text(text, window=4)
    assert said.startswith(f"its log: {len(text.encode())} bytes, 10 lines; its last 4 lines are 4 distinct lines")
    same = "\n".join(f"INFO 12-02 02:38:{i:02d} [core.py:1] Reqid: {i}-x, hit 1280" for i in range(30))
    assert logscan.stall_text(same).endswith(
        "30 lines are 1 distinct lines (times and request ids masked); the 1 most frequent make up 30 of them, "
        'the first 30 times: "INFO 12-02 T [core.py:1] Reqid: X, hit 1280"'
    )
    assert logscan.stall_text("") == "" and logscan.stall_text("\n \n") == ""


def test_a_child_that_ignores_sigterm_gets_sigkill(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "GRACE_S", 0.5)
    out = run_fake(tmp_path, "hang-ignore-term", timeout_s=2)
    assert out.failure.kind == TIMEOUT
    assert_no_leftovers(tmp_path)


def test_secret_env_values_are_redacted_from_the_kept_log(tmp_path):
    secret = "hf_s3cr3t-value-123"
    os.environ["KVKIT_TEST_API_KEY"] = secret
    try:
        out = run_fake(tmp_path, "exit7", echo_env=["KVKIT_TEST_API_KEY"])
    finally:
        del os.environ["KVKIT_TEST_API_KEY"]
    log = (tmp_path / "baseline.log").read_text()
    assert "KVKIT_TEST_API_KEY=<redacted>" in log and secret not in log
    assert secret not in out.failure.log_tail and "<redacted>" in out.failure.log_tail


@pytest.mark.parametrize(
    "rc, log, timed_out, oom, kind",
    [
        (None, "", True, False, TIMEOUT),
        (0, "", False, False, None),
        (-9, "", False, False, CRASH),
        (-9, "", False, True, OOM),
        (-9, "torch.OutOfMemoryError: CUDA out of memory", False, False, OOM),
        (-11, "", False, False, CRASH),
        (1, "RuntimeError: CUDA out of memory. Tried to allocate", False, False, OOM),
        (137, "", False, True, OOM),  # SIGKILL, as a shell reports it
        (137, "", False, False, NONZERO_EXIT),
        # issue 21 (4): the cgroup's count rose, but this child was not what the killer took
        (7, "", False, True, NONZERO_EXIT),
        (3, "", False, True, RAISED),
        (-11, "", False, True, CRASH),
        (3, "", False, False, RAISED),
        (2, "the process was killed by someone", False, False, NONZERO_EXIT),
    ],
)
def test_classify_exit(rc, log, timed_out, oom, kind):
    got = classify_exit(rc, log, timed_out, oom)
    assert (got[0] if got else None) == kind


def test_oom_kill_counter_reads_cgroup_v2_memory_events(tmp_path, monkeypatch):
    events = tmp_path / "memory.events"
    monkeypatch.setattr(runner, "_CGROUP_EVENTS", events)
    assert runner.oom_kill_count() is None  # no file: unknown, never 0
    events.write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 3\noom_group_kill 0\n")
    assert runner.oom_kill_count() == 3  # oom_kill, not oom or oom_group_kill
    events.write_text("low 0\nhigh 0\nmax 4\noom 2\n")
    assert runner.oom_kill_count() is None  # no oom_kill line: unknown
    events.write_text("oom_kill three\n")
    assert runner.oom_kill_count() is None  # garbage: unknown, not a crash


def test_a_result_of_another_schema_version_is_a_named_failure(tmp_path):
    out = run_fake(tmp_path, "ok", result_schema_version=99)
    assert out.result is None and out.failure.kind == RESULT_VERSION
    assert "schema_version 99" in out.failure.detail
    assert_no_leftovers(tmp_path)


@pytest.mark.parametrize("rc, kind", [(7, NONZERO_EXIT), (3, RAISED), (-11, CRASH), (1, NONZERO_EXIT)])
def test_an_oom_kill_in_the_window_never_replaces_a_named_error(rc, kind):
    """Issue 21 (4): with arms at once the cgroup's oom_kill count covers every arm (and their MP
    servers): a rise while this arm ran does not say this arm was the one killed. Out of memory is
    claimed for the killed process (SIGKILL, what the kernel's killer sends) or on the arm's own log;
    any other failure keeps its own kind and detail, and says that something was OOM-killed meanwhile."""
    got = classify_exit(rc, "", False, oom_killed=True)
    assert got[0] == kind, got
    assert "out-of-memory killer" in got[1] and "not necessarily this arm" in got[1]


def test_an_arm_that_raised_while_something_else_was_oom_killed_keeps_its_error(tmp_path, monkeypatch):
    counts = iter([4, 5])  # before and after the arm: another arm's process was killed meanwhile
    monkeypatch.setattr(runner, "oom_kill_count", lambda: next(counts))
    out = run_fake(tmp_path, "raise")
    assert out.failure.kind == RAISED, out.failure
    assert out.failure.detail.startswith("ValueError: fake engine raised")
    assert "out-of-memory killer" in out.failure.detail
    assert_no_leftovers(tmp_path)


# ---- stopping: no child starts once the run is stopping (issue 21 (3)) -----------------------------


def test_no_child_starts_once_the_run_is_stopping(tmp_path):
    """A thread that passed its own stop check used to start its child after the sweep that stops
    children, and the interrupted run then waited that whole arm out."""
    try:
        runner.stop_all_children()  # the sweep; nothing was running
        t0 = time.monotonic()
        with pytest.raises(runner.Interrupted):
            run_fake(tmp_path, "hang", timeout_s=6)
        assert time.monotonic() - t0 < 3
        assert not (tmp_path / "pids" / "baseline.child.pid").exists()
    finally:
        runner.allow_children()


def test_a_child_starting_while_the_run_stops_is_stopped_with_the_others(tmp_path, monkeypatch):
    """The stop and a child's start are ordered under one lock: the sweep sees the child, or the child
    never starts."""
    import threading

    entered, go = threading.Event(), threading.Event()
    real_start = runner.start_child

    def slow_start(*args, **kwargs):  # past every stop check, in the middle of starting its child
        entered.set()
        go.wait(10)
        return real_start(*args, **kwargs)

    monkeypatch.setattr(runner, "start_child", slow_start)
    outcome: dict = {}

    def arm() -> None:
        try:
            outcome["out"] = run_fake(tmp_path, "hang", timeout_s=30)
        except runner.Interrupted as exc:
            outcome["out"] = exc

    try:
        thread = threading.Thread(target=arm)
        thread.start()
        assert entered.wait(10)
        t0 = time.monotonic()
        stopper = threading.Thread(target=runner.stop_all_children)
        stopper.start()
        time.sleep(0.3)
        go.set()
        stopper.join(30)
        thread.join(30)
        assert not thread.is_alive() and time.monotonic() - t0 < 15, "the arm ran on after the stop"
    finally:
        runner.allow_children()
    child = tmp_path / "pids" / "baseline.child.pid"
    if child.exists():  # it started before the sweep took the lock: the sweep stopped its group
        assert runner.group_members(int(child.read_text())) == []


def test_kernel_variables_reach_the_engines_with_inductor_caches_off():
    """ATEN_CPU_CAPABILITY and oneDNN's ISA cap pass through to every engine as the caller set them; with one set,
    inductor's FX graph and AOT caches are off (torch 2.13 keys them without the vector ISA). Without one,
    the environment stays as it was."""
    env = child_env({"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}, hashseed="0", extra={})
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert env["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "0" and env["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "0"
    plain = child_env({"PATH": "/bin"}, hashseed="0", extra={})
    assert not any(name.startswith(("ATEN_", "ONEDNN_", "TORCHINDUCTOR_")) for name in plain)
