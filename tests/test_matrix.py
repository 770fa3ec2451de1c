"""The matrix without Ray: the file loader (bad input: one line, exit 2), which cells --resume reruns,
ERROR cells (a crashed verifier, a lost node), the summary's exit code and the page."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from kvkit_testutil import ROOT

from repro.errors import UsageError
from repro.matrix import status
from repro.matrix.cell import CellJob, CellOutcome, run_cell
from repro.matrix.cluster import classify_task_error, resources
from repro.matrix.page import render_matrix_page
from repro.matrix.spec import load_matrix, parse_matrix

GOOD = {
    "name": "t",
    "defaults": {
        "environment": "cpu",
        "model": "m/x",
        "fixture": "fixtures/selftest-cpu.json",
        "flags": ["--device", "cpu"],
    },
    "cells": [{"name": "a", "seed": 0}, {"name": "b", "seed": 1, "connector": "ExampleConnector"}],
}


def _matrix(**changes):
    data = json.loads(json.dumps(GOOD))
    data.update(changes)
    return parse_matrix(data, "fixtures/matrix-t.yaml")


def test_loader_reads_cells_with_defaults():
    m = _matrix()
    assert m.name == "t" and [c.name for c in m.cells] == ["a", "b"]
    b = m.cells[1]
    assert b.python.endswith(".venvs/cpu/bin/python") and b.device == "cpu" and b.cpus == 1
    assert b.verifier_argv("r.json") == ["--model", "m/x", "--fixture", "fixtures/selftest-cpu.json", "--seed", "1",
                                         "--kv-connector", "ExampleConnector", "--device", "cpu",
                                         "--python", b.python, "--report", "r.json"]  # fmt: skip
    assert _matrix(cells=[{"name": "p", "environment": "/opt/env/bin/python"}]).cells[0].python == "/opt/env/bin/python"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cells": []}, "cells must be a non-empty list"),
        ({"cells": [{"name": "a"}, {"name": "a"}]}, "two cells are named 'a'"),
        ({"cells": [{"name": "a/b"}]}, "name 'a/b' must be"),
        ({"cells": [{"name": "a", "colour": 1}]}, "unknown key 'colour'"),
        ({"cells": [{"name": "a", "seed": -1}]}, "seed must be a non-negative integer"),
        ({"cells": [{"name": "a", "flags": ["--seed", "3"]}]}, "flags must not set --seed"),
        ({"cells": [{"name": "a", "flags": "--device cpu"}]}, "flags must be a list"),
        ({"cells": [{"name": "a", "environment": "Not A Profile"}]}, "must be a profile name"),
        ({"cells": [{"name": "a", "timeout": 0}]}, "timeout must be a positive number"),
        ({"defaults": {"name": "x"}}, "defaults: key 'name'"),
        ({"extra": 1}, "unknown key 'extra'"),
    ],
)
def test_loader_refuses_bad_input_in_one_line(changes, message):
    with pytest.raises(UsageError) as err:
        _matrix(**changes)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_bad_file_from_the_command_line_is_exit_2(tmp_path):
    bad = tmp_path / "matrix-bad.yaml"
    bad.write_text("cells: [unclosed\n")
    proc = subprocess.run([sys.executable, "-m", "repro", "matrix", str(bad)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: matrix {bad}: invalid YAML")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert load_matrix(ROOT / "fixtures" / "matrix-cpu-ci.yaml").name == "cpu-ci"


def test_a_cell_without_vllm_is_refused_before_anything_runs(tmp_path):
    bare = tmp_path / "python"
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    spec = tmp_path / "matrix-x.yaml"
    spec.write_text(json.dumps({**GOOD, "cells": [{"name": "a", "environment": str(bare)}]}))
    proc = subprocess.run([sys.executable, "-m", "repro", "matrix", str(spec), "--reports", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 2 and "cell a: environment" in proc.stderr and "has no vllm" in proc.stderr
    assert not (tmp_path / "out").exists()


def _report(cell, arg, rc_errors=False, verdict="PASS"):
    probe = {"name": "fixture", "verdict": verdict, "kv": {"verdict": "EXACT"},
             "requests": [{"first_diff": None, "margin": None},
                          {"first_diff": 3 if verdict == "FAIL" else None,
                           "margin": {"near_tie": True, "baseline_top_gap": 0.01} if verdict == "FAIL" else None}]}  # fmt: skip
    return {
        "complete": True,
        "errors": [{"arm": "x", "kind": "crash", "detail": "signal 9"}] if rc_errors else [],
        "arms": [
            {
                "name": "baseline",
                "mode": "baseline",
                "verdict": "PASS",
                "probes": [{"name": "fixture", "verdict": "PASS"}],
            },
            {"name": "ExampleConnector", "mode": "connector", "verdict": verdict, "probes": [probe]},
        ],
        "acceptance": {"matched": None},
        "hardware_label": "CPU test",
        "provenance": {"argv": cell.verifier_argv(arg), "engine_versions": {"vllm": "0.28.0", "torch": "2.13"}},
    }


def _outcome(rc=0, wrote=True, tail="report: r.json"):
    return CellOutcome("a", rc, wrote, tail, 12.5, "host", ())


def test_resume_reruns_missing_failed_and_foreign_cells():
    cell = _matrix().cells[0]
    good = _report(cell, "r.json")
    assert status.needs_run(cell, None, "r.json", None)  # missing
    assert not status.needs_run(cell, good, "r.json", None)  # done
    assert not status.needs_run(cell, good, "r.json", {"status": "done"})
    assert status.needs_run(cell, good, "r.json", {"status": "error"})  # the last matrix run failed it
    assert status.needs_run(cell, _report(cell, "r.json", rc_errors=True), "r.json", None)  # an engine ERROR
    assert status.needs_run(cell, good, "other.json", None)  # another cell's (or an older definition's) report


def test_error_cells_have_their_reason():
    cell = _matrix().cells[0]
    good = _report(cell, "r.json")
    assert status.cell_error(_outcome(), good, True) is None
    assert status.cell_error(_outcome(rc=1), good, True) is None  # a finding, not an error
    assert status.cell_error(_outcome(rc=-9), good, True) == (status.CRASH, "the verifier was killed by signal 9")
    assert status.cell_error(_outcome(rc=None), None, False)[0] == status.TIMEOUT
    assert status.cell_error(_outcome(rc=130), None, False)[0] == status.INTERRUPTED
    kind, detail = status.cell_error(
        _outcome(rc=2, tail="error: --model x: no such local model directory"), None, False
    )
    assert kind == status.USAGE and detail.endswith("no such local model directory")
    assert status.cell_error(_outcome(rc=0, wrote=False), good, True)[0] == status.NO_REPORT  # an older run's report
    assert status.cell_error(_outcome(rc=3), _report(cell, "r.json", rc_errors=True), True)[0] == "engine-error"


class NodeDiedError(Exception):  # the name Ray gives a lost node's error; the classifier goes by type names
    pass


def test_node_lost_and_crashed_tasks():
    lost = classify_task_error(NodeDiedError("node 10.0.0.2 died"))
    assert lost.kind == status.NODE_LOST and "node 10.0.0.2 died" in lost.detail
    assert classify_task_error(RuntimeError("boom")).kind == status.CRASH
    cell = _matrix().cells[0]
    assert status.cell_error(lost, None, False) == (lost.kind, lost.detail)
    record = status.cell_record(cell, report_rel="t/a.json", report=None, error=(lost.kind, lost.detail), ran=True,
                                outcome=lost, page_rel="a.html")  # fmt: skip
    assert record["status"] == status.ERROR and record["report"] is None and record["arms"] == []
    assert status.matrix_exit_code([record]) == 3


def test_resources_by_device():
    cpu, auto = _matrix().cells[0], _matrix(defaults={**GOOD["defaults"], "flags": []}).cells[0]
    assert resources(cpu, cluster_gpus=2) == {"num_cpus": 1}
    assert resources(auto, cluster_gpus=2) == {"num_gpus": 1, "num_cpus": 1}
    assert resources(auto, cluster_gpus=0) == {"num_cpus": 1}


def test_a_crashing_verifier_is_an_error_cell_and_leaves_no_report(tmp_path):
    crash = tmp_path / "python"
    crash.write_text("#!/bin/sh\nkill -9 $$\n")  # the launcher dies of SIGKILL: a crash
    crash.chmod(0o755)
    report = tmp_path / "a.json"
    job = CellJob("a", str(crash), ("--report", str(report)), str(report), str(ROOT), 60, "driver")
    outcome = run_cell(job)
    assert outcome.returncode == -9 and not outcome.wrote_report and not report.exists()
    assert status.cell_error(outcome, None, False)[0] == status.CRASH


def test_cells_at_once_on_one_host_run_on_cores_of_their_own(tmp_path, monkeypatch):
    """Issue 21 (6): cells running at once each bound their arms to cores 0..n-1. A CPU cell claims as
    many cores as its Ray CPUs (a lock file per core, on this host: gone with its holder, kill -9
    included) and runs its verifier on them; the verifier binds its arms within its affinity set."""
    import os
    import threading

    from repro.matrix import cell

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    monkeypatch.setattr(cell, "CORE_LOCKS", tmp_path / "cores")
    fake = tmp_path / "python"  # runs the launcher; as the verifier, prints its cores while both cells run
    fake.write_text(
        f'#!/bin/sh\nif [ "$1" = "-c" ]; then exec {sys.executable} "$@"; fi\n'
        f"exec {sys.executable} -c \"import os, time; print('cores', sorted(os.sched_getaffinity(0))); "
        'time.sleep(1.5)"\n'
    )
    fake.chmod(0o755)
    outcomes: dict = {}

    def run(name: str) -> None:
        report = tmp_path / f"{name}.json"
        job = CellJob(name, str(fake), (), str(report), str(ROOT), 60, "driver", cpus=1)
        outcomes[name] = run_cell(job)

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    cores = {n: [line for line in o.output_tail.splitlines() if line.startswith("cores")] for n, o in outcomes.items()}
    assert all(o.returncode == 0 for o in outcomes.values()), outcomes
    assert len(cores["a"]) == len(cores["b"]) == 1 and cores["a"] != cores["b"], cores
    assert all(len(eval(c[0].split(" ", 1)[1])) == 1 for c in cores.values()), cores


def _summary():
    m = _matrix()
    a, b = m.cells
    done = status.cell_record(a, report_rel="t/a.json", report=_report(a, "r", verdict="FAIL"), error=None, ran=True,
                              outcome=_outcome(rc=1), page_rel="a.html")  # fmt: skip
    lost = classify_task_error(NodeDiedError("gone"))
    err = status.cell_record(b, report_rel="t/b.json", report=None, error=(lost.kind, lost.detail), ran=True,
                             outcome=lost, page_rel="b.html")  # fmt: skip
    cells = [done, err]
    return {"name": "t", "cells": cells, "probes": status.probe_names(cells), "started_utc": "2026-01-02T00:00:00Z",
            "cluster": {"ray_version": "2.60.0"}, "exit_code": status.matrix_exit_code(cells)}  # fmt: skip


def test_summary_rows_and_page():
    summary = _summary()
    done = summary["cells"][0]
    assert summary["probes"] == ["fixture"] and summary["exit_code"] == 3
    probe = done["arms"][1]["probes"]["fixture"]
    assert probe["verdict"] == "FAIL" and probe["kv"] == "EXACT" and probe["divergence"] == "near-tie"
    assert done["versions"] == {"vllm": "0.28.0", "torch": "2.13"} and done["exit_code"] == 1
    html = render_matrix_page(summary, cells_dir="t/site")
    assert '<a href="t/site/a.html">a</a>' in html
    assert 'ExampleConnector <span class="verdict v-FAIL">FAIL</span> KV EXACT · near-tie' in html
    assert "node-lost: NodeDiedError" in html and "<td>0.28.0</td>" in html
    assert "<script" not in html and "http" not in html.replace("http-equiv", "")
    assert render_matrix_page(summary, cells_dir="t/site") == html  # a pure function of the summary


def test_a_row_names_its_model_fixture_and_the_flags_that_set_it_apart():
    from repro.matrix.page import _distinct_flags

    summary = _summary()
    a, b = summary["cells"]
    a["flags"], b["flags"] = ["--device", "cpu", "--batch-invariant"], ["--device", "cpu"]
    assert _distinct_flags(summary["cells"]) == {"a": ["--batch-invariant"], "b": []}
    html = render_matrix_page(summary, cells_dir="t/site")
    assert "model x · fixture selftest-cpu.json · seed 0 · --batch-invariant</span>" in html
    assert "seed 1</span>" in html  # b: nothing sets it apart but its seed


def test_the_matrix_page_shows_its_writeup_as_markdown_without_raw_html():
    html = render_matrix_page(
        _summary(), cells_dir="t/site", writeup_md="## What it shows\n\n**bold** <script>x</script>"
    )
    assert '<h2 id="writeup">Writeup</h2>' in html and "<strong>bold</strong>" in html
    assert "<script>" not in html
    assert 'id="writeup"' not in render_matrix_page(_summary(), cells_dir="t/site")


@pytest.mark.skipif(
    not (ROOT / "reports" / "matrix").exists() and not (ROOT / ".git").exists(),
    reason="the committed reports are not part of this copy (the kit)",
)
@pytest.mark.parametrize("name", ["h200-controls", "h200-lmcache-versions"])
def test_each_committed_matrix_page_is_the_rendering_of_its_summary_and_writeup(name):
    folder = ROOT / "reports" / "matrix"
    summary = json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))
    md = (folder / f"{name}.md").read_text(encoding="utf-8")
    page = (folder / f"{name}.html").read_text(encoding="utf-8")
    assert page == render_matrix_page(summary, cells_dir=f"{name}/site", writeup_md=md)
    for cell in summary["cells"]:  # every cell ran and its report and page are committed
        assert cell["status"] == "done" and (folder / cell["report"]).is_file()
        assert (folder / name / "site" / cell["page"]).is_file()
