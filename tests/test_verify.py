"""The verification run's own promises about what is on disk after an interrupt or a failed write,
in-process with the stand-in engine (tests/fake_engine.py proves failure handling only)."""

from __future__ import annotations

import json
import math
import os
import signal
import threading

import pytest
from test_cli_failures import OLD_LOG, OLD_REPORT, _args, _env, assert_untouched, setup  # noqa: F401 - setup is a fixture

from repro import verify
from repro.errors import EXIT_OK, EXIT_RUNTIME


@pytest.fixture
def fake_env(setup, monkeypatch):  # noqa: F811 - the imported fixture
    for name, value in _env(setup).items():
        monkeypatch.setenv(name, value)
    return setup


@pytest.mark.parametrize("other_thread", [False, True])
def test_an_interrupt_right_after_the_report_is_published_says_so_and_keeps_its_exit_code(
    fake_env, monkeypatch, capsys, other_thread
):
    """Bug c: Ctrl-C delivered as the publish block ends used to print 'no report written, the
    previous one is untouched' and exit 130, both false. With another thread alive the kernel may
    hand the signal to that thread: the hold must work all the same."""
    if other_thread:
        stop = threading.Event()
        threading.Thread(target=stop.wait, daemon=True).start()
    real_write = verify.write_bytes_atomic

    def write_then_ctrl_c(path, data):
        real_write(path, data)
        os.kill(os.getpid(), signal.SIGINT)  # held by deferred_signals until the publish block ends

    monkeypatch.setattr(verify, "write_bytes_atomic", write_then_ctrl_c)
    code = verify.main(_args(fake_env, "--kv-connector", "ExampleConnector"))
    err = capsys.readouterr().err
    report = json.loads(fake_env["report"].read_text())
    assert report["complete"] is True and [a["verdict"] for a in report["arms"]] == ["PASS", "PASS"]
    assert code == EXIT_OK  # the report's own exit code: the run had completed
    assert "after the run completed" in err and "no report written" not in err and "untouched" not in err
    assert sorted(p.name for p in fake_env["logs"].iterdir()) == ["ExampleConnector.log", "baseline.log"]
    if other_thread:
        stop.set()


def test_an_interrupt_before_publishing_leaves_the_old_report_and_exits_130(fake_env, monkeypatch, capsys):
    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(verify, "publish_logs", ctrl_c)
    assert verify.main(_args(fake_env, "--kv-connector", "ExampleConnector")) == 130
    assert "no report written, the previous one is untouched" in capsys.readouterr().err
    assert_untouched(fake_env)


def test_a_report_that_cannot_be_serialized_changes_nothing_on_disk(fake_env, monkeypatch, capsys):
    """Bug d: the new arm logs used to be swapped in before the report was serialized, so a NaN
    left new logs beside the old report."""
    real_assemble = verify.assemble

    def with_nan(*args, **kwargs):
        report = real_assemble(*args, **kwargs)
        report["arms"][1]["timing"]["wall_s"] = math.nan
        return report

    monkeypatch.setattr(verify, "assemble", with_nan)
    assert verify.main(_args(fake_env, "--kv-connector", "ExampleConnector")) == EXIT_RUNTIME
    assert "no report written" in capsys.readouterr().err
    assert fake_env["report"].read_bytes() == OLD_REPORT
    assert (fake_env["logs"] / "baseline.log").read_bytes() == OLD_LOG
    assert_untouched(fake_env)


def test_a_report_that_breaks_its_schema_is_never_written(fake_env, monkeypatch, capsys):
    real_assemble = verify.assemble

    def off_schema(*args, **kwargs):
        report = real_assemble(*args, **kwargs)
        report["arms"][1]["verdict"] = "MAYBE"
        return report

    monkeypatch.setattr(verify, "assemble", off_schema)
    assert verify.main(_args(fake_env, "--kv-connector", "ExampleConnector")) == EXIT_RUNTIME
    assert "does not match schemas/report.schema.json at arms/1/verdict" in capsys.readouterr().err
    assert_untouched(fake_env)


# ---- run_arms: slots taken at launch, names that cannot deadlock (issue 21) ------------------------


def _jobs(s: dict, names: list[str]):
    from repro.contract import ArmSpec, EngineConfig, ProbeJob, build_job

    engine = EngineConfig(str(s["model"]), None, "auto", 0, 0.5, 256, 16, "cpu")
    probes = [ProbeJob("p", {"token_ids": [1, 2]}, 1)]
    mode = {"baseline": "baseline"}
    return {n: build_job(ArmSpec(n, mode.get(n, "native")), engine, probes, max_tokens=2, logprobs=2) for n in names}


def _run_arms(s: dict, planned, n_jobs: int, fake_run_arm, *flags: str, slots=None):
    from repro.cli import parse_args
    from repro.plan import arm_slots
    from repro.progress import Progress

    opts = parse_args(_args(s, "--kv-connector", "ExampleConnector", "--jobs", str(n_jobs), *flags))
    jobs = _jobs(s, [p.name for p in planned])
    work = s["tmp"] / "work"
    work.mkdir(exist_ok=True)
    slots = slots if slots is not None else arm_slots(opts, len(planned), n_jobs)
    real = verify.run_arm
    verify.run_arm = fake_run_arm
    try:
        with Progress([p.name for p in planned], "quiet") as progress:
            return verify.run_arms(
                planned, lambda i, dep=None: jobs[planned[i].name], slots, n_jobs, work, {}, opts.args, progress
            )
    finally:
        verify.run_arm = real


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_arms_at_once_never_share_a_slot_whatever_order_they_start_in(fake_env, monkeypatch, device):
    """Issue 21 (2): slots were fixed by arm index while the pool starts arms as threads free up: with
    2 jobs over 3 arms the third started (slot 2 % 2 = 0) while the first still ran in slot 0, two
    arms on one GPU at the full memory share without the fixed KV cache, or on one core while the
    other idled. An arm takes a free slot when it launches."""
    import time

    from repro import plan
    from repro.contract import ArmSpec
    from repro.plan import PlannedArm
    from repro.runner import ArmOutcome

    monkeypatch.setattr(plan, "visible_gpus", lambda: ["0", "1"])
    monkeypatch.setattr(plan.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(plan.os, "sched_getaffinity", lambda pid: {0, 1})
    key = "CUDA_VISIBLE_DEVICES" if device == "cuda" else "VLLM_CPU_OMP_THREADS_BIND"
    planned = [PlannedArm(ArmSpec("baseline", "baseline")), PlannedArm(ArmSpec("A", "native")),
               PlannedArm(ArmSpec("B", "native"))]  # fmt: skip
    took = {"baseline": 1.0, "A": 0.1, "B": 0.4}  # B starts when A ends, while baseline still runs
    seen: dict = {}
    t0 = time.monotonic()

    def fake_run_arm(job, workdir, log_path, env, timeout_s, python, module):
        start = time.monotonic() - t0
        time.sleep(took[job.arm.name])
        seen[job.arm.name] = (start, time.monotonic() - t0, env.get(key), job.engine.gpu_memory_utilization)
        return ArmOutcome(job.arm.name, None, None, log_path, "", 0.0)

    _run_arms(fake_env, planned, 2, fake_run_arm, "--device", device)
    assert set(seen) == {"baseline", "A", "B"} and all(v[2] is not None for v in seen.values()), seen
    for x, (s1, e1, where1, _) in seen.items():
        for y, (s2, e2, where2, _) in seen.items():
            if x < y and s1 < e2 and s2 < e1:  # ran at the same time
                assert where1 != where2, (x, y, seen)


def test_an_arm_that_would_wait_on_itself_or_two_arms_of_one_name_are_refused_at_once(fake_env):
    """Issue 21 (1): native-matched copying an arm of its own name waited on itself for ever."""
    import time

    from repro.contract import ArmSpec
    from repro.plan import PlannedArm
    from repro.runner import ArmOutcome

    def fake_run_arm(job, workdir, log_path, env, timeout_s, python, module):
        deadline = time.monotonic() + 8  # a real child would wait for its probes for ever
        while job.probes_file and not os.path.exists(job.probes_file) and time.monotonic() < deadline:
            time.sleep(0.05)
        return ArmOutcome(job.arm.name, None, None, log_path, "", 0.0)

    base = PlannedArm(ArmSpec("baseline", "baseline"))
    for planned in (
        [base, PlannedArm(ArmSpec("native-matched", "native"), match_arm="native-matched")],
        [base, PlannedArm(ArmSpec("A", "native")), PlannedArm(ArmSpec("A", "native"))],
    ):
        t0 = time.monotonic()
        with pytest.raises(ValueError, match="kit bug"):
            _run_arms(fake_env, planned, 2, fake_run_arm)
        assert time.monotonic() - t0 < 5


def test_a_full_disk_is_one_line_and_exit_3_not_a_kit_bug(setup, monkeypatch, capsys):  # noqa: F811
    """ENOSPC while the run writes (found by the chaos run): the machine's fault, named in one line."""

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device", str(setup["report"]))

    monkeypatch.setattr(verify, "run", full)
    assert verify._verify(_args(setup)) == EXIT_RUNTIME
    err = capsys.readouterr().err.strip()
    assert err == f"error: No space left on device: {setup['report']}; no report written"
    assert_untouched(setup)
