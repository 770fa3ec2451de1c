"""Nothing written is lost: no command replaces an earlier run's report, its logs, a writeup beside it or a P→D
audit folder's records unless asked (--force); without it the refusal is one line and exit 2, before any engine or
server starts. The kit's own callers that rerun into a path they own pass --force on purpose (make repro's
reports/latest-*, make detection, the matrix's cells)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kvkit_testutil import ROOT, committed_or_skip, run_cli
from test_pd import GPU_CASES
from test_pd import _command_with as pd_command_with

from repro.errors import UsageError
from repro.plan.options import selftest_cpu_argv

STEM = "h200-kvaudit-lmcache-0.5.4"
COMMITTED = [ROOT / "reports" / f"{STEM}{end}" for end in (".json", ".logs", ".md")]  # report, logs, writeup
NO_PYTHON = "/nonexistent/python"  # an engine start would fail on it: a refusal before it never reaches it
ALREADY = "a report is already there (and its logs): give another --report, or --force to replace it"


def _digests(folder: Path) -> dict[str, str]:
    """Every file under folder by relative path: its SHA-256."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _model(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    return model


def _committed_copy(tmp_path: Path, writeup: bool = True) -> Path:
    """The committed H200 report, its logs and (writeup=True) its writeup, copied under tmp_path/reports."""
    committed_or_skip(*COMMITTED)
    report, logs, md = COMMITTED
    reports = tmp_path / "reports"
    reports.mkdir()
    shutil.copy2(report, reports)
    shutil.copytree(logs, reports / logs.name)
    if writeup:
        shutil.copy2(md, reports)
    return reports / report.name


def _selftest(tmp_path: Path, report: Path, *extra: str) -> tuple[subprocess.CompletedProcess, float]:
    """The CPU self-test's command line (make repro's), through the verifier's real entry point."""
    argv = [*selftest_cpu_argv(str(_model(tmp_path)), str(report)), "--python", NO_PYTHON, *extra]
    t0 = time.monotonic()
    proc = run_cli(argv, timeout=120)
    return proc, time.monotonic() - t0


def _one_line(proc: subprocess.CompletedProcess) -> str:
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# ---- the verifier -------------------------------------------------------------------------------------------------


def test_the_newcomers_run_into_the_committed_h200_report_is_refused_and_changes_nothing(tmp_path):
    """The self-test's flags with --report at a copy of the committed H200 report, its logs and its writeup: one
    line, exit 2, in seconds; every file as it was, nothing added (no work folder), no engine asked for."""
    report = _committed_copy(tmp_path)
    before = _digests(report.parent)
    proc, wall = _selftest(tmp_path, report)
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc)
    assert line.startswith(f"error: --report {report}: the writeup {report.parent / (STEM + '.md')} beside it")
    assert NO_PYTHON not in line  # refused before the engine interpreter was asked anything
    assert wall < 30
    assert _digests(report.parent) == before


def test_a_report_and_its_logs_are_refused_and_force_passes_the_check(tmp_path):
    report = _committed_copy(tmp_path, writeup=False)
    before = _digests(report.parent)
    proc, _ = _selftest(tmp_path, report)
    assert proc.returncode == 2 and _one_line(proc) == f"error: --report {report}: {ALREADY}"
    forced, _ = _selftest(tmp_path, report, "--force")
    # past the report's check: the next one asks the engine interpreter, which is not there
    assert forced.returncode == 2 and _one_line(forced).startswith(f"error: --python {NO_PYTHON}: ")
    assert _digests(report.parent) == before


def test_an_earlier_runs_logs_alone_are_refused_an_empty_folder_is_not(tmp_path):
    report = tmp_path / "r.json"
    logs = tmp_path / "r.logs"
    logs.mkdir()
    proc, _ = _selftest(tmp_path, report)
    assert proc.returncode == 2 and _one_line(proc).startswith(f"error: --python {NO_PYTHON}: ")  # empty: lost nothing
    (logs / "baseline.log").write_text("an earlier run's log\n")
    proc, _ = _selftest(tmp_path, report)
    assert proc.returncode == 2
    assert _one_line(proc) == (
        f"error: --report {report}: an earlier run's logs {logs} are already there: give another --report, or --force "
        "to replace it"
    )


def test_force_never_replaces_a_writeup(tmp_path):
    """--force replaces a report and its logs; a writeup beside them would describe a run it is not about."""
    report = _committed_copy(tmp_path)
    before = _digests(report.parent)
    proc, _ = _selftest(tmp_path, report, "--force")
    assert proc.returncode == 2
    assert "never a writeup" in _one_line(proc) and "move the writeup away first" in _one_line(proc)
    assert _digests(report.parent) == before


def _fake_run(tmp_path: Path, report: Path, *extra: str) -> subprocess.CompletedProcess:
    """A run with the stand-in engine (tests/fake_engine.py, an arm a fraction of a second); each engine child it
    starts writes its pid under tmp_path/pids."""
    fixture = tmp_path / "fixture.json"
    probes = [{"name": "p1", "prompt": {"token_ids": list(range(1, 40))}}]
    fixture.write_text(json.dumps({"kind": "kvkit-fixture", "schema_version": 1, "name": "t",
                                   "tokenizer": {"name": "fake"}, "probes": probes}))  # fmt: skip
    pids = tmp_path / "pids"
    pids.mkdir(exist_ok=True)
    argv = ["--model", str(_model(tmp_path)), "--max-model-len", "256", "--max-tokens", "4", "--timeout", "60",
            "--fixture", str(fixture), "--report", str(report), "--kv-connector", "ExampleConnector",
            "--engine-module", "tests.fake_engine", *extra]  # fmt: skip
    return run_cli(argv, timeout=120, env={"KVKIT_FAKE": json.dumps({"pid_dir": str(pids)})})


def test_a_run_over_an_earlier_report_starts_no_engine_and_force_swaps_in_the_new_one(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    report, logs = out / "r.json", out / "r.logs"
    report.write_text('{"kind": "kvkit-report", "earlier": true}\n')
    logs.mkdir()
    (logs / "gone.log").write_text("an arm the new run does not have\n")
    before = _digests(out)
    proc = _fake_run(tmp_path, report)
    assert proc.returncode == 2 and _one_line(proc) == f"error: --report {report}: {ALREADY}"
    assert _digests(out) == before and list((tmp_path / "pids").iterdir()) == []  # no engine child started
    forced = _fake_run(tmp_path, report, "--force")
    assert forced.returncode == 0, forced.stderr
    new = json.loads(report.read_text())
    assert new["kind"] == "kvkit-report" and "earlier" not in new and new["complete"] is True
    assert sorted(p.name for p in logs.iterdir()) == ["ExampleConnector.log", "baseline.log"]  # swapped in whole


def test_repro_endpoint_refuses_before_asking_any_server(tmp_path):
    report = tmp_path / "endpoint.json"
    report.write_text("{}\n")
    args = ["--url", "http://127.0.0.1:9", "--baseline-url", "http://127.0.0.1:10", "--model", str(_model(tmp_path)),
            "--fixture", "fixtures/selftest-cpu.json", "--report", str(report)]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "repro", "endpoint", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 2 and _one_line(proc) == f"error: --report {report}: a report is already there: " + (
        "give another --report, or --force to replace it"
    )
    forced = subprocess.run([sys.executable, "-m", "repro", "endpoint", *args, "--force"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert forced.returncode == 2 and "unreachable" in _one_line(forced)  # past the check: the server is asked
    assert report.read_text() == "{}\n"


# ---- make repro, make detection -------------------------------------------------------------------------------


def _tasks(monkeypatch):
    sys.path.insert(0, str(ROOT))
    import tasks

    ran: list[str] = []

    class Ctx:
        def run(self, cmd, **kw):
            ran.append(cmd)
            return type("Result", (), {"exited": 0})()

    monkeypatch.setattr(tasks, "venv_python", lambda profile, extra=None: f"/envs/{profile}/bin/python")
    return tasks, Ctx(), ran


def test_make_repro_replaces_its_own_latest_report_on_purpose(monkeypatch):
    tasks, ctx, ran = _tasks(monkeypatch)
    monkeypatch.setattr(tasks, "resolve_profile", lambda p: "cpu")
    monkeypatch.setattr(tasks, "make_model", lambda c, py: "/models/tiny")
    tasks.repro.body(ctx, profile="cpu")
    (cmd,) = ran
    argv = cmd.removesuffix(" 2>&1").split()  # tasks.run_py: both streams on one pipe
    assert argv[argv.index("--report") + 1] == "reports/latest-cpu.json" and argv[-1] == "--force"
    # the issue text's reproduce command reads it as a flag without a value wherever it stands, and drops it: the
    # reporter's choice about their own files is no part of the run
    from repro.readmodel.rerun import reproduce_argv

    moved = [*argv[3:-1][:2], "--force", *argv[3:-1][2:]]  # given mid-line, before a flag that takes a value
    for given in (argv[3:], moved):
        out = reproduce_argv(given)
        assert (
            "--python" not in out
            and "--force" not in out
            and out[out.index("--report") + 1] == "reports/latest-cpu.json"
        )


# ---- repro pd ---------------------------------------------------------------------------------------------------


def _pd_refused(monkeypatch, tmp_path, *extra: str) -> str:
    """`repro pd` in this process: the UsageError's line; neither the engine probe nor a server was reached."""
    from repro.disagg import commands

    def never(*a, **k):
        raise AssertionError("reached past the checks")

    monkeypatch.setattr(commands, "NixlPair", never)
    monkeypatch.setattr(commands.pd_report, "probe_engine", never)
    argv = ["--cases", str(GPU_CASES), "--model", str(tmp_path), "--report", str(tmp_path / "pd.json"), *extra]
    with pytest.raises(UsageError) as got:
        commands.pd(argv)
    return str(got.value)


def test_pd_refuses_an_audit_folder_that_holds_an_earlier_runs_records(monkeypatch, tmp_path):
    kv = tmp_path / "kv"
    (kv / "consumer").mkdir(parents=True)
    (kv / "consumer" / "000003.json").write_text('{"seq": 3, "prompt_sha256": "earlier"}\n')
    before = _digests(kv)
    line = _pd_refused(monkeypatch, tmp_path, "--kv-audit", str(kv))
    assert line == (
        f"--kv-audit {kv}: an earlier run's records are there (the audit would read them as this run's): give another "
        "folder, or --force to replace them"
    )
    assert _digests(kv) == before


def test_pd_refuses_an_earlier_report_and_its_servers_logs(monkeypatch, tmp_path):
    (tmp_path / "pd.json").write_text("{}\n")
    assert _pd_refused(monkeypatch, tmp_path) == f"--report {tmp_path / 'pd.json'}: a report is already there: " + (
        "give another --report, or --force to replace it"
    )
    (tmp_path / "pd.json").unlink()
    (tmp_path / "pd.json.logs").mkdir()
    (tmp_path / "pd.json.logs" / "consumer.log").write_text("an earlier run's server log\n")
    assert "an earlier run's logs" in _pd_refused(monkeypatch, tmp_path)


def test_pd_force_removes_the_earlier_run_before_any_server_starts(monkeypatch, tmp_path):
    """--force: the earlier report, its servers' logs (a server appends to its log) and the audited servers'
    records are gone when the pair is made; what else the audit folder holds stays."""
    from pd_fakes import transferring_pair

    kv = tmp_path / "kv"
    for server in ("reference", "consumer"):
        (kv / server).mkdir(parents=True)
        (kv / server / "000003.json").write_text('{"seq": 3}\n')
    (kv / "notes.txt").write_text("mine\n")
    logs = tmp_path / "pd.json.logs"
    logs.mkdir()
    (logs / "consumer.log").write_text("an earlier run's server log\n")
    (tmp_path / "pd.json").write_text('{"earlier": true}\n')
    seen = {}

    class Watching:  # what was on disk when the pair was first asked anything (a real pair starts its servers then)
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            if not seen:
                seen.update(kv=sorted(p.relative_to(kv).as_posix() for p in kv.rglob("*")),
                            logs=sorted(os.listdir(logs)), report=(tmp_path / "pd.json").exists())  # fmt: skip
            return getattr(self.inner, name)

    pair = Watching(transferring_pair(16))
    code, report = pd_command_with(monkeypatch, tmp_path, pair, "--kv-audit", str(kv), "--force")
    assert seen == {"kv": ["notes.txt"], "logs": [], "report": False}
    assert code == 0 and "earlier" not in report


def test_pd_servers_are_named_as_the_logs_and_records_it_removes():
    from repro.disagg import audit, commands, servers

    pair = servers.NixlPair(servers.ServeSettings("py", "m", 16, 2048, 0.2, "float16"), Path("/logs"), {})
    assert [pair._server(n, None, False, 1, None).log.name for n in commands.SERVERS] == [
        f"{n}.log" for n in commands.SERVERS
    ]
    assert set(audit.AUDITED) <= set(commands.SERVERS)


# ---- repro matrix ---------------------------------------------------------------------------------------------


class _Stop(Exception):
    pass


def _matrix_run(monkeypatch, tmp_path, **flags):
    """run_matrix over tmp_path as reports: what it refused, or the jobs it would have run (Ray replaced)."""
    from test_matrix import _matrix

    from repro.matrix import cluster, commands

    def stop(*a, **k):
        raise _Stop

    jobs = []
    monkeypatch.setattr(commands, "check_environments", lambda matrix: None)
    monkeypatch.setattr(cluster, "import_ray", lambda: None)
    monkeypatch.setattr(cluster, "run_on_ray", lambda j, *a: jobs.extend(j) or stop())
    with pytest.raises((UsageError, _Stop)) as got:
        commands.run_matrix(_matrix(), tmp_path, one_at_a_time=False, **flags)
    return str(got.value) if got.type is UsageError else jobs


def test_a_matrix_over_an_earlier_run_is_refused_unless_resumed_or_forced(monkeypatch, tmp_path):
    (tmp_path / "t.json").write_text("{}\n")
    line = _matrix_run(monkeypatch, tmp_path, resume=False)
    assert line.startswith(f"matrix t: an earlier run is there ({tmp_path / 't.json'}): --resume reruns")
    (tmp_path / "t.json").unlink()
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "b.json").write_text("{}\n")  # an interrupted run: a cell's report, no summary
    assert "an earlier run is there" in _matrix_run(monkeypatch, tmp_path, resume=False)
    jobs = _matrix_run(monkeypatch, tmp_path, resume=False, force=True)
    # every cell runs again, and the matrix tells each cell's verifier so
    assert [cell.name for cell, _ in jobs] == ["a", "b"] and all(job.argv[-1] == "--force" for _, job in jobs)
    (tmp_path / "t.md").write_text("# what the earlier run showed\n")
    assert "the writeup" in _matrix_run(monkeypatch, tmp_path, resume=False, force=True)
    assert [cell.name for cell, _ in _matrix_run(monkeypatch, tmp_path, resume=True)] == ["a", "b"]


def test_a_cells_report_is_its_own_with_or_without_the_matrixs_force():
    from test_matrix import _matrix, _report

    from repro.matrix import status

    cell = _matrix().cells[0]
    forced = _report(cell, "r.json")
    forced["provenance"]["argv"] = [*forced["provenance"]["argv"], "--force"]
    assert status.report_matches(forced, cell, "r.json") and status.report_matches(
        _report(cell, "r.json"), cell, "r.json"
    )
    assert not status.needs_run(cell, forced, "r.json", None)


# ---- repro detection ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("study", [[], ["--scenarios"]])
def test_detection_refuses_an_earlier_study_report_before_any_model_or_engine(monkeypatch, tmp_path, study):
    from repro.detection import commands, scenarios

    def reached(*a, **k):
        raise _Stop

    monkeypatch.setattr(commands, "run_detection", reached)
    monkeypatch.setattr(scenarios, "run_scenario_study", reached)
    report = tmp_path / "study.json"
    report.write_text("{}\n")
    argv = [*study, "--report", str(report), "--site", str(tmp_path / "study.html")]
    with pytest.raises(UsageError, match="a report is already there: give another --report, or --force"):
        commands.detection(argv)
    with pytest.raises(_Stop):  # --force: past the check, the study starts
        commands.detection([*argv, "--force"])
    assert report.read_text() == "{}\n"


# ---- compact-report -----------------------------------------------------------------------------------------------


def test_compact_report_never_replaces_another_report_unless_forced(tmp_path, capsys):
    from test_compact import V2_EXAMPLE

    from repro.commands import main as repro_main

    other = tmp_path / "other.json"
    other.write_text('{"kind": "someone else\'s report"}')
    before = hashlib.sha256(other.read_bytes()).hexdigest()
    assert repro_main(["compact-report", str(V2_EXAMPLE), str(other)]) == 2
    assert "a report is already there" in capsys.readouterr().err
    assert hashlib.sha256(other.read_bytes()).hexdigest() == before
    assert repro_main(["compact-report", str(V2_EXAMPLE), str(other), "--force"]) == 0
    copy = tmp_path / "in-place.json"  # IN itself: compacted in place, as before
    copy.write_bytes(V2_EXAMPLE.read_bytes())
    assert repro_main(["compact-report", str(copy), str(copy)]) == 0
