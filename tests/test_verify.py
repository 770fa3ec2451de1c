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
from repro.record import publish


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
    real_write = publish.write_bytes_atomic

    def write_then_ctrl_c(path, data):
        real_write(path, data)
        os.kill(os.getpid(), signal.SIGINT)  # held by deferred_signals until the publish block ends

    monkeypatch.setattr(publish, "write_bytes_atomic", write_then_ctrl_c)
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

    monkeypatch.setattr(publish, "publish_logs", ctrl_c)
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
    from repro.contract.job import ArmSpec, EngineConfig, ProbeJob, build_job

    engine = EngineConfig(str(s["model"]), None, "auto", 0, 0.5, 256, 16, "cpu")
    probes = [ProbeJob("p", {"token_ids": [1, 2]}, 1)]
    mode = {"baseline": "baseline"}
    return {n: build_job(ArmSpec(n, mode.get(n, "native")), engine, probes, max_tokens=2, logprobs=2) for n in names}


def _run_arms(s: dict, planned, n_jobs: int, fake_run_arm, *flags: str, slots=None):
    from repro.plan.arms import arm_slots
    from repro.plan.options import parse_args
    from repro.plan.run_plan import build_plan
    from repro.run import launch
    from repro.run.progress import Progress

    argv = _args(s, "--kv-connector", "ExampleConnector", "--jobs", str(n_jobs), *flags)
    plan = build_plan(parse_args(argv), argv)
    jobs = _jobs(s, [p.name for p in planned])
    work = s["tmp"] / "work"
    work.mkdir(exist_ok=True)
    slots = slots if slots is not None else arm_slots(plan.engine, len(planned), n_jobs)
    real = launch.run_arm
    launch.run_arm = fake_run_arm
    try:
        with Progress([p.name for p in planned], "quiet") as progress:
            return launch.run_arms(
                planned, lambda i, dep=None: jobs[planned[i].name], slots, n_jobs, work, {}, plan.children, progress
            )
    finally:
        launch.run_arm = real


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_arms_at_once_never_share_a_slot_whatever_order_they_start_in(fake_env, monkeypatch, device):
    """Issue 21 (2): slots were fixed by arm index while the pool starts arms as threads free up: with
    2 jobs over 3 arms the third started (slot 2 % 2 = 0) while the first still ran in slot 0, two
    arms on one GPU at the full memory share without the fixed KV cache, or on one core while the
    other idled. An arm takes a free slot when it launches."""
    import time

    from repro.contract.job import ArmSpec
    from repro.plan import devices
    from repro.plan.arms import PlannedArm
    from repro.run.runner import ArmOutcome

    monkeypatch.setattr(devices, "visible_gpus", lambda: ["0", "1"])
    monkeypatch.setattr(devices.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: {0, 1})
    key = "CUDA_VISIBLE_DEVICES" if device == "cuda" else "VLLM_CPU_OMP_THREADS_BIND"
    planned = [PlannedArm(ArmSpec("baseline", "baseline")), PlannedArm(ArmSpec("A", "native")),
               PlannedArm(ArmSpec("B", "native"))]  # fmt: skip
    took = {"baseline": 1.0, "A": 0.1, "B": 0.4}  # B starts when A ends, while baseline still runs
    seen: dict = {}
    t0 = time.monotonic()

    def fake_run_arm(job, workdir, log_path, env, timeout_s, python, module, disk):
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

    from repro.contract.job import ArmSpec
    from repro.plan.arms import PlannedArm
    from repro.run.runner import ArmOutcome

    def fake_run_arm(job, workdir, log_path, env, timeout_s, python, module, disk):
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


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_disk_that_fills_as_native_matched_is_fed_is_one_line_and_exit_3(fake_env, monkeypatch, capsys):
    """The chaos run (seed 2101, a full disk at 2.5 s) saw exit 3 with no one-line message: the disk filled as
    native-matched was fed the probes its connector arm reused. The thread that writes them died with a
    traceback on stderr, and the child went on waiting for probes that never came (until its time limit, had
    nothing else failed). The write's error is the run's: one line, exit 3, the previous report kept."""
    import errno
    import time

    from repro.record import atomic

    real, full = atomic.write_bytes_atomic, threading.Event()

    def write(path, data):  # the disk fills at the probes file: that write and every later one fail
        if str(path).endswith("native-matched.probes.json"):
            full.set()
        if full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(atomic, "write_bytes_atomic", write)
    monkeypatch.setattr(publish, "write_bytes_atomic", write)  # the report's own write: the disk is full
    t0 = time.monotonic()
    args = _args(fake_env, "--kv-connector", "ExampleConnector", "--compare-native", "--jobs", "1", "--timeout", "30")
    code = verify.main(args)
    err = capsys.readouterr().err
    assert full.is_set() and code == EXIT_RUNTIME, err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: No space left on device: ") and last.endswith("; no report written"), err
    assert "native-matched.probes.json" in last
    assert time.monotonic() - t0 < 20, "the native-matched child waited out its time limit"
    assert_untouched(fake_env)


def test_an_mp_arm_whose_server_never_started_cites_a_log_that_exists(tmp_path, monkeypatch):
    """A server that could not even be started (no log of its own) and an arm that never ran: the entry
    cited <arm>.log, which nothing wrote (the chaos run's "dangling log"). The kit writes that log itself,
    one line saying why the arm never ran, and the entry cites it."""
    import contextlib
    import sys

    from repro.contract.job import ArmSpec, ConnectorSpec, EngineConfig, ProbeJob, build_job
    from repro.lmcache import mp as lmcache_mp
    from repro.plan.arms import PlannedArm
    from repro.plan.settings import ChildSettings
    from repro.run.entries import arm_entry
    from repro.run.launch import run_with_mp_server
    from repro.run.progress import Progress

    @contextlib.contextmanager
    def no_server(*args, **kwargs):
        raise lmcache_mp.ServerError("lmcache-server-start", "the LMCache MP server could not be started: no python")
        yield

    monkeypatch.setattr(lmcache_mp, "mp_server", no_server)
    spec = ArmSpec("mp", "connector", ConnectorSpec(lmcache_mp.CONNECTOR, None, {}))
    engine = EngineConfig("m", None, "auto", 0, 0.5, 256, 16, "cpu")
    job = build_job(spec, engine, [ProbeJob("p", {"token_ids": [1, 2]}, 1)], max_tokens=2, logprobs=2)
    children = ChildSettings(python=sys.executable, engine_module="repro.engine", timeout_s=60.0, max_disk_gb=10.0)

    def launch(job):
        raise AssertionError("the arm ran without a server")

    with Progress(["mp"], "quiet") as progress:
        outcome = run_with_mp_server(job, {}, tmp_path, children, progress, launch)
    entry = arm_entry(PlannedArm(spec), outcome, None, 16, "report.logs")
    assert entry["error"]["kind"] == "lmcache-server-start"
    cited = tmp_path / entry["log"].removeprefix("report.logs/")  # where publish_logs takes it from
    assert cited.is_file(), entry["log"]
    assert "mp never ran: lmcache-server-start: the LMCache MP server could not be started" in cited.read_text()


class _FullDiskStream:
    """A stderr on a full disk: every write fails (as under RLIMIT_FSIZE, or ENOSPC on a file)."""

    def write(self, text):
        raise OSError(28, "No space left on device")

    def flush(self):
        raise OSError(28, "No space left on device")


def test_a_full_disk_under_stderr_too_still_exits_3_never_1(setup, monkeypatch):  # noqa: F811
    """The line cannot be written when stderr itself is a file on the full disk: the failed write of the
    error line used to escape, and the kit exited 1 ("acceptance not matched"), a result it never had."""

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device", str(setup["report"]))

    monkeypatch.setattr(verify, "run", full)
    monkeypatch.setattr("sys.stderr", _FullDiskStream())
    assert verify.main(_args(setup)) == EXIT_RUNTIME
    assert_untouched(setup)


@pytest.mark.parametrize("stderr_to", ["pipe", "file"])
def test_a_kit_under_rlimit_fsize_0_exits_3_with_its_line_where_stderr_can_take_one(setup, stderr_to):  # noqa: F811
    """A full disk for every file the kit writes (RLIMIT_FSIZE 0, the chaos run's full disk where it
    cannot mount one): exit 3, its one line on a stderr that is not a file (a terminal, a pipe), and
    the previous report as it was. A stderr that is a file is on the full disk too: the line is lost
    with it, the exit code is not."""
    import resource
    import subprocess
    import sys

    from kvkit_testutil import ROOT

    env = dict(os.environ, PYTHONPATH=str(ROOT), **_env(setup))
    err_file = setup["tmp"] / "stderr.txt"
    with open(err_file, "wb") as fh:
        proc = subprocess.run(
            [sys.executable, "-m", "repro.verify_kv_reuse", *_args(setup, "--kv-connector", "ExampleConnector")],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if stderr_to == "pipe" else fh,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0)),
            timeout=120,
            check=False,
        )
    err = proc.stderr.decode() if stderr_to == "pipe" else err_file.read_text()
    assert proc.returncode == EXIT_RUNTIME, (proc.returncode, err)
    if stderr_to == "pipe":
        last = err.strip().splitlines()[-1]
        assert "Traceback" not in err and last.startswith("error: ") and last.endswith("no report written"), err
    else:
        assert err == ""  # nothing could be written there
    assert_untouched(setup)


def test_a_report_that_cannot_be_written_leaves_the_previous_logs_beside_the_previous_report(fake_env, monkeypatch):
    """The chaos run's full disk as RLIMIT_FSIZE (where it cannot mount one), late in the run: the new arm
    logs were swapped in, then the report's write failed, and the previous report stood beside logs that
    were not its own. The previous logs are put back."""

    def full(path, data):
        raise OSError(27, "File too large")

    monkeypatch.setattr(publish, "write_bytes_atomic", full)
    assert verify.main(_args(fake_env, "--kv-connector", "ExampleConnector")) == EXIT_RUNTIME
    assert_untouched(fake_env)


def test_a_second_signal_during_the_clean_up_never_leaves_a_work_folder_no_run_can_sweep(fake_env, monkeypatch):
    """Faults 38 and 49 of seed 2101 (SIGTERM and kill -9 of a matrix cell's Ray worker): a cell's work folder
    was left, and the cell's next run did not sweep it. A verifier whose Ray worker dies gets SIGTERM more than
    once (its task's own stop, then its parent's death); one that cut the removal of its work folder in half
    left it without its owner record, which no later run touches. The clean-up holds signals until done."""
    from repro.run import workdir

    real, cut = workdir.shutil.rmtree, []

    def rmtree_with_a_signal(path, *args, **kwargs):
        if workdir._WORK_MARK in str(path) and not cut:  # what rmtree removes first can be the owner record
            cut.append(path)
            (path / workdir.OWNER_FILE).unlink()
            os.kill(os.getpid(), signal.SIGINT)
        real(path, *args, **kwargs)

    monkeypatch.setattr(workdir.shutil, "rmtree", rmtree_with_a_signal)
    code = verify.main(_args(fake_env, "--kv-connector", "ExampleConnector"))
    assert cut and code == EXIT_OK  # the signal came after the report was written: its exit code
    leftovers = [p.name for p in fake_env["report"].parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_a_finding_made_while_sharing_is_re_run_alone_judged_and_audited_like_its_arm(fake_env, monkeypatch):
    """The confirmation path, without an engine: the stand-in's arms run two at a time (sharing the CPU's
    cores), the connector arm's own run is made to find a FAIL, and the run re-runs it alone, judges that run,
    passes it through the KV audit on its own and folds it into the arm's `confirmation`."""
    from repro.run import entries

    real_entry, audited = entries.arm_entry, []

    def shared_fail(arm, outcome, *args, **kwargs):  # the connector arm's own run found something
        entry = real_entry(arm, outcome, *args, **kwargs)
        if arm.name == "ExampleConnector":
            entry["verdict"], entry["probes"][0]["verdict"] = "FAIL", "FAIL"
        return entry

    real_audit = verify.audit_entries

    def audit(these, *args, **kwargs):
        audited.append([e["name"] for e in these])
        return real_audit(these, *args, **kwargs)

    monkeypatch.setattr(entries, "arm_entry", shared_fail)
    monkeypatch.setattr(verify, "audit_entries", audit)
    monkeypatch.setenv("KVKIT_FAKE", json.dumps({"modes": {"*": "slow"}, "sleep_s": 1}))  # the two arms overlap
    assert verify.main(_args(fake_env, "--kv-connector", "ExampleConnector", "--jobs", "2", "--quiet")) == 1
    report = json.loads(fake_env["report"].read_text())
    conf = report["arms"][1]["confirmation"]
    assert conf["status"] == "ran" and conf["why"].startswith("its run found it while it shared"), conf
    assert conf["run"]["verdict"] == "PASS" and conf["independent"] is True, conf
    assert audited == [["baseline", "ExampleConnector"], ["ExampleConnector~alone"]]
    assert "ExampleConnector~alone.log" in {p.name for p in fake_env["logs"].iterdir()}
