"""The chaos run's own logic: the faults drawn from a seed, orphan detection (a process that outlived its run
is found, through the run's tree and through the subreaper), partial-report detection, and the naming of
outcomes. Each check is fed what it must catch, so a check that stops catching it fails here."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kvkit_testutil import ROOT

from repro.chaos import checks, procs
from repro.chaos.checks import ABSENT, NEW, PARTIAL, PREVIOUS, ReportState, Run, name_outcome, report_state
from repro.chaos.faults import CATEGORIES, KIT, SIGNALS, draw_faults
from repro.chaos.procs import Proc, outlived

DATA = ROOT / "tests" / "data"
# A parent that starts a sleeper in a new session (a daemon's double fork) and exits: the sleeper is then an
# orphan. It prints the sleeper's pid first; it waits `linger` seconds before it exits.
ORPHANING = (
    "import subprocess, sys, time\n"
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True,\n"
    "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "print(p.pid, flush=True)\n"
    "time.sleep(float(sys.argv[1]))\n"
)


def test_the_same_seed_draws_the_same_faults_and_every_round_covers_every_kind():
    faults = draw_faults(50, 7)
    assert faults == draw_faults(50, 7) and faults != draw_faults(50, 8)
    assert [f.index for f in faults] == list(range(1, 51))
    for start in range(0, 49 - len(CATEGORIES), len(CATEGORIES)):
        assert {f.category for f in faults[start : start + len(CATEGORIES)]} == set(CATEGORIES)
    assert all(0 <= f.fraction < 1 and 0 <= f.pick < 1 for f in faults)
    assert {f.variant for f in faults if f.category == KIT} <= set(SIGNALS)
    assert {f.category for f in draw_faults(6, 1, (KIT,))} == {KIT}


def _proc(pid: int, ppid: int, start: int = 100, state: str = "S") -> Proc:
    return Proc(pid, ppid, pid, state, start, ("python",))


def test_outlived_finds_a_seen_process_still_alive_but_not_a_reused_pid_or_a_zombie():
    seen = {p.key: p for p in (_proc(10, 1), _proc(11, 10), _proc(12, 10), _proc(13, 10))}
    table = {
        10: _proc(10, 1, state="Z"),  # finished: a zombie is no leftover
        11: _proc(11, 1),  # re-parented to init, still running: an orphan
        12: _proc(12, 1, start=999),  # the pid was reused by another process since
        99: _proc(99, 1),  # never part of the run
    }
    assert [p.pid for p in outlived(seen, table, reaper=None)] == [11]


def test_outlived_finds_every_live_descendant_of_the_subreaper():
    table = {50: _proc(50, 1), 60: _proc(60, 50), 61: _proc(61, 60, state="Z"), 62: _proc(62, 60), 70: _proc(70, 1)}
    assert [p.pid for p in outlived({}, table, reaper=50)] == [60, 62]


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_the_watch_finds_an_orphan_that_left_the_run_s_tree():
    """The run's root starts a sleeper in its own session and exits: the sleeper re-parents away (no
    subreaper here), and the watch still knows it was the run's."""
    proc = subprocess.Popen([sys.executable, "-c", ORPHANING, "0.5"], stdout=subprocess.PIPE, text=True)
    sleeper = int(proc.stdout.readline())
    try:
        with procs.Watch(proc.pid, interval_s=0.05) as watch:
            proc.wait(timeout=30)
        left, _ = procs.settle(watch, reaper=None, within_s=0.5)
        assert [p.pid for p in left] == [sleeper]
        assert "time.sleep(60)" in left[0].text()
        procs.kill_leftovers(left)
        left, _ = procs.settle(watch, reaper=None, within_s=5)
        assert left == []
    finally:
        _kill(sleeper)


def test_the_subreaper_finds_an_orphan_the_watch_never_saw(tmp_path):
    """The root exits at once, before any poll could see the sleeper: only the subreaper finds it (in a
    child interpreter, so that this test process does not become anyone's subreaper)."""
    script = (
        "import json, subprocess, sys, time\n"
        "from repro.chaos import procs\n"
        "assert procs.become_subreaper()\n"
        "proc = subprocess.Popen([sys.executable, '-c', sys.argv[1], '0'], stdout=subprocess.PIPE, text=True)\n"
        "sleeper = int(proc.stdout.readline())\n"
        "proc.wait()\n"
        "watch = procs.Watch(proc.pid)\n"  # started after the root is gone: it sees nothing of the run
        "left, _ = procs.settle(watch, reaper=None, within_s=0)\n"
        "found, _ = procs.settle(watch, reaper=__import__('os').getpid(), within_s=0)\n"
        "procs.kill_leftovers(found)\n"
        "__import__('os').kill(sleeper, 9)\n"  # whatever the checks found: it is this test's own
        "print(json.dumps({'sleeper': sleeper, 'without': [p.pid for p in left], 'with': [p.pid for p in found]}))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, ORPHANING], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["without"] == [] and seen["with"] == [seen["sleeper"]]


@pytest.fixture
def report(tmp_path) -> Path:
    """A complete report (a committed one) in its folder, with every log it cites."""
    path = tmp_path / "render-selftest.json"
    shutil.copy(DATA / "render-selftest.json", path)
    for rel in checks.report_logs(json.loads(path.read_text())):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text(f"log of {rel}\n")
    return path


def _state(path: Path, before: checks.Snapshot) -> str:
    return report_state(path, before, checks.load_complete_report, checks.report_logs).state


def test_the_previous_report_byte_for_byte_is_previous_and_a_new_whole_one_is_new(report):
    before = checks.take_snapshot(report)
    assert _state(report, before) == PREVIOUS
    assert _state(report, checks.Snapshot(b"{}", before.logs)) == NEW
    assert _state(report.with_name("none.json"), checks.Snapshot(None, {})) == ABSENT


@pytest.mark.parametrize("cut", [1, 100, 5000, -2])
def test_a_truncated_report_is_partial(report, cut):
    before = checks.take_snapshot(report)
    report.write_bytes(before.report[:cut])
    assert _state(report, before) == PARTIAL


def test_a_report_that_is_not_complete_or_breaks_its_schema_is_partial(report):
    before = checks.Snapshot(b"{}", checks.take_snapshot(report).logs)
    data = json.loads(report.read_text())
    report.write_text(json.dumps({**data, "complete": False}))
    assert _state(report, before) == PARTIAL
    report.write_text(json.dumps({**data, "arms": [{**data["arms"][0], "verdict": 3}]}))
    assert _state(report, before) == PARTIAL


def test_leftovers_of_an_atomic_write_or_a_logs_swap_make_a_report_partial(report):
    before = checks.take_snapshot(report)
    tmp = report.with_name(f".{report.name}.x1y2.tmp")
    tmp.write_text("{")
    assert _state(report, before) == PARTIAL
    tmp.unlink()
    old = checks.logs_dir(report).with_name(checks.logs_dir(report).name + ".old")
    old.mkdir()
    assert _state(report, before) == PARTIAL
    old.rmdir()
    assert _state(report, before) == PREVIOUS


def test_the_previous_report_with_other_logs_is_partial_and_a_new_one_s_missing_logs_are_named(report):
    before = checks.take_snapshot(report)
    rel = checks.report_logs(json.loads(report.read_text()))[0]
    (report.parent / rel).write_text("a newer run's log\n")
    assert _state(report, before) == PARTIAL
    (report.parent / rel).unlink()
    new = report_state(report, checks.Snapshot(b"{}", {}), checks.load_complete_report, checks.report_logs)
    assert new.state == NEW and new.missing_logs == (rel,)


def test_a_vanished_report_is_partial(report):
    before = checks.take_snapshot(report)
    report.unlink()
    assert _state(report, before) == PARTIAL


def _run(rc, stderr="", stdout="", state=PREVIOUS, data=None, landed=True, target="") -> Run:
    return Run(rc, stdout, stderr, ReportState(state, "", data), landed, target)


def test_the_kit_s_failures_are_named_only_with_their_exit_code_and_one_line():
    said = "error: interrupted (SIGTERM): children killed; no report written, the previous one is untouched\n"
    assert name_outcome(KIT, "SIGTERM", _run(130, said), 1)[0] == "interrupted (exit 130)"
    assert name_outcome(KIT, "SIGTERM", _run(130, "Traceback (most recent call last):\n" + said), 1)[0] is None
    assert name_outcome(KIT, "SIGTERM", _run(-15), 1)[0] is None  # died without a word
    assert name_outcome(KIT, "SIGKILL", _run(-9), 1)[0].startswith("killed")
    internal = "Traceback (most recent call last):\nOSError: [Errno 28]\nerror: internal error in the kit\n"
    assert name_outcome("disk-full", "fill", _run(3, internal), 1)[0] is None
    full = "error: --report r.json: directory . is not writable (No space left on device)\n"
    assert name_outcome("disk-full", "fill", _run(2, full), 1)[0] == "exit 2: one line"
    assert name_outcome(KIT, "SIGINT", _run(1, state=NEW, landed=False), 1)[0].startswith("missed")
    assert name_outcome(KIT, "SIGINT", _run(1, state=PREVIOUS, landed=False), 1)[0] is None


def test_a_child_failure_is_named_by_the_report_and_the_summary_line():
    data = {"errors": [{"arm": "native", "kind": "crash", "detail": "killed by SIGTERM"}]}
    line = "ERROR native: crash: killed by SIGTERM\n"
    assert name_outcome("engine-child", "SIGTERM", _run(3, "", line, NEW, data, target="native"), 1)[0] == (
        "crash (native)"
    )
    assert name_outcome("engine-child", "SIGTERM", _run(3, "", "", NEW, data, target="native"), 1)[0] is None
    assert name_outcome("engine-child", "SIGTERM", _run(3, "", line, NEW, data, target="baseline"), 1)[0] is None
    assert name_outcome("result-file", "corrupt", _run(3, "", line, NEW, data, target="native"), 1)[0] is None


def test_a_matrix_cell_is_named_by_its_summary_and_the_driver_s_line():
    data = {"cells": [{"name": "a", "error": {"kind": "crash"}}, {"name": "b", "error": None}]}
    said = "[kvkit] matrix: cell a: ERROR crash: WorkerCrashedError: the cell's worker process died\n"
    assert name_outcome("ray-worker", "SIGKILL", _run(3, said, "", NEW, data, target="a"), 0)[0] == "crash (cell a)"
    assert name_outcome("ray-worker", "SIGKILL", _run(3, said, "", NEW, data, target="b"), 0)[0] is None
    # a worker that ignored the signal: the cell ran to its end, nothing failed, nothing to name
    ignored = Run(0, "", "", ReportState(NEW, "", {"cells": []}), True, "a", survived=True)
    assert name_outcome("ray-worker", "SIGINT", ignored, 0)[0] == "no effect: a survived SIGINT"
    died = Run(0, "", "", ReportState(NEW, "", {"cells": []}), True, "a", survived=False)
    assert name_outcome("ray-worker", "SIGINT", died, 0)[0] is None  # it died, and the matrix said nothing
    # its worker went with the cluster's shutdown, after it ended the cell's task: the cell is done
    finished = {"cells": [{"name": "a", "status": "done", "error": None}]}
    done = Run(0, "", "", ReportState(NEW, "", finished), True, "a", survived=False)
    assert name_outcome("ray-worker", "SIGINT", done, 0)[0] == "no effect: cell a finished"
    assert name_outcome("ray-worker", "SIGINT", done, 1)[0] is None  # not the matrix's usual exit code


def test_bad_input_is_one_line_and_exit_2():
    for args in (["--faults", "0"], ["--kinds", "kit,nothing"], ["--seed", "-1"], ["--faults", "x"]):
        proc = subprocess.run([sys.executable, "-m", "repro", "chaos", *args], capture_output=True, text=True,
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60, check=False)  # fmt: skip
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr


# A process started with SIGINT ignored (as `make chaos &` starts the chaos run) calls hear_sigint, then
# execs a Python that says what SIGINT does in it: what every kit run of the chaos run would meet.
HEARS = (
    "import signal, subprocess, sys\n"
    "from repro.chaos.commands import hear_sigint\n"
    "restored = hear_sigint()\n"
    "child = [sys.executable, '-c', 'import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)']\n"
    "print(restored, subprocess.run(child, capture_output=True, text=True).stdout.strip())\n"
)


@pytest.mark.parametrize("ignored", [True, False])
def test_a_chaos_run_started_with_sigint_ignored_gives_its_runs_sigint_back(ignored):
    """Seed 2101 started in the background (SIGINT ignored, inherited by every kit): all 7 SIGINT faults
    hit kits that could not hear them and were called unnamed. The runs hear SIGINT whatever the start."""

    def start():
        signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else signal.SIG_DFL)

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", HEARS], preexec_fn=start, env=env, capture_output=True, text=True,
                         timeout=60, check=True)  # fmt: skip
    assert out.stdout.split() == [str(ignored), "True"], out.stderr


def test_a_kit_fault_after_the_kit_s_last_word_is_a_miss_not_a_hit(tmp_path):
    """Fault 8 of seed 2101: a SIGTERM reached a kit that had written its report and said `report: ...`, as
    its interpreter exited. Such a fault can only miss: the run is over (it is judged as a miss, by a normal
    completion), and the signal is not sent."""
    from types import SimpleNamespace

    from repro.chaos import inject
    from repro.chaos.faults import Fault

    err = tmp_path / "001.err"
    fault = Fault(1, KIT, "SIGTERM", "selftest", 0.0, 0.0, 0.0)
    ctx = SimpleNamespace(walls={"selftest": 1.0})
    alive = SimpleNamespace(poll=lambda: None)
    sent: list = []
    for said, lands in (("[kvkit] 6 arms, 2 at a time\n", True), ("report: reports/run.json\n", False),
                        ("error: No space left on device; no report written\n", False)):  # fmt: skip
        err.write_text(said)
        out = inject.Outcome(fault, "selftest", stderr_path=err)
        hit = inject._at_moment(ctx, fault, out, lambda proc, s=said: sent.append(s) or True)
        assert hit(alive, None, 0.0) is lands
    assert sent == ["[kvkit] 6 arms, 2 at a time\n"]
    assert checks.said_last_word("[kvkit] x\nreport: r.json\n") and not checks.said_last_word("[kvkit] report: x\n")
