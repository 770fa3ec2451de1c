"""A report run again elsewhere (repro.readmodel.rerun): its commands carry no path of the machine that made it, name
the model the kit makes with the report's seed, and a dirty tree's patch is shown with the commit. Engine-free."""

from __future__ import annotations

import json
import shlex
from pathlib import Path, PurePath

import pytest
from conftest import ROOT

from repro.models.tiny import FP16_MODEL_SEED, MODEL_SEED, digest_files, model_files
from repro.publish.issue_md import format_issue_md
from repro.readmodel import as_report
from repro.readmodel.rerun import MODEL_DIR, model_need, patch_text, rerun_lines, rerun_report_path

GPU_SEED6 = ROOT / "reports" / "conditions" / "h200-conditions-tiny-five-v028.json"
CPU_DEFAULT = ROOT / "reports" / "versions" / "cpu-vllm-0.28.0-selftest.json"
SMOLLM2 = ROOT / "reports" / "conditions" / "h200-conditions-smollm2-five-v028.json"
SAMPLE = ROOT / "tests" / "data" / "kit-sample-report.json"


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _machine_words(lines) -> list[str]:
    """Every word of the command lines that is an absolute path (or names /tmp anywhere)."""
    return [w for line in lines for w in shlex.split(line, comments=True) if PurePath(w).is_absolute() or "/tmp" in w]


def test_the_seed_of_a_generated_model_is_read_from_the_report_and_is_the_reports_model():
    """The folder's name says the seed (kvkit-tiny-qwen3-seed6; the bare name is the default seed), and the model
    that seed makes has exactly the files the report hashed (provenance.model.sha256)."""
    for path, seed in ((GPU_SEED6, FP16_MODEL_SEED), (CPU_DEFAULT, MODEL_SEED)):
        prov = _load(path)["provenance"]
        need = model_need(prov)
        assert need.seed == seed and need.made_by_kit
        assert need.argument == f".cache/models/{PurePath(prov['model']['name']).name}"
        assert need.make_text() == f"python -m repro make-model {need.argument} --seed {seed}"
        assert digest_files(model_files(seed)) == prov["model"]["sha256"]


def test_a_packaged_model_a_hub_model_and_anything_else():
    smollm2 = model_need(_load(SMOLLM2)["provenance"])
    assert (smollm2.argument, smollm2.make_text(), smollm2.seed) == (
        ".cache/models/smollm2-f16",
        "make model MODEL=smollm2",
        None,
    )
    hub = {"model": {"name": "Qwen/Qwen3-0.6B", "sha256": "unavailable: Qwen/Qwen3-0.6B is not a local directory"}}
    assert model_need(hub).argument == "Qwen/Qwen3-0.6B" and not model_need(hub).made_by_kit
    for model in ({"name": "/srv/models/mine", "sha256": "ab" * 32}, {"name": "kvkit-tiny-qwen3-seedX"}, None):
        assert model_need({"model": model}).argument == MODEL_DIR
    # a converted model named like the tiny one is the converted one
    assert model_need({"model": {"name": "/m/kvkit-tiny-qwen3", "source": {"name": "nope"}}}).argument == MODEL_DIR


def test_a_rerun_report_is_in_the_kits_reports_under_a_plain_name_only():
    assert rerun_report_path("/tmp/out028/tiny-five-v028.json") == "reports/tiny-five-v028.json"
    assert rerun_report_path("reports/versions/cpu-vllm-0.28.0-selftest.json") == (
        "reports/cpu-vllm-0.28.0-selftest.json"
    )
    for hostile in ("x.json\n```", "$(touch x).json", "-rf.json", "a b.json", "x.txt", "", None):
        assert rerun_report_path(hostile) == "reports/report.json", hostile


@pytest.mark.parametrize("path", [GPU_SEED6, CPU_DEFAULT, SMOLLM2, SAMPLE], ids=lambda p: p.stem)
def test_no_command_carries_a_machine_path(path):
    """The kit README's, the issue text's and the report page's commands: from the report's own data, no path of
    the machine that made it; the seed model's make command before the verifier's."""
    data = _load(path)
    report = as_report(data)
    lines = rerun_lines(report.argv, report.provenance, ".venvs/cpu/bin/python")
    assert not _machine_words(lines), lines
    page = report.reproduce_command.splitlines()
    assert not _machine_words(page) and page[-1].startswith("python -m repro.verify_kv_reuse ")
    args = shlex.split(page[-1])
    assert args.count("--model") == 1 and args[args.index("--report") + 1].startswith("reports/")
    need = model_need(report.provenance)
    if need.seed is not None:
        assert page[-2] == f"python -m repro make-model {need.argument} --seed {need.seed}"
        assert args[args.index("--model") + 1] == need.argument
    how = format_issue_md(data).split("#### How to reproduce\n\n", 1)[1].split("\n\n####", 1)[0]
    block = how.split("```sh\n", 1)[1].split("\n```", 1)[0].splitlines()
    assert block == list(rerun_lines(report.argv, report.provenance)) and not _machine_words(block)


def test_a_dirty_reports_patch_is_shown_where_its_commit_is():
    data = _load(SAMPLE)
    commit = "0123456789abcdef0123456789abcdef01234567"
    patch = {"sha256": "f" * 64, "files": ["repro/a.py"], "untracked": ["b.py"], "omitted": 2}
    data["provenance"]["kit"] = {"commit": commit, "dirty": True, "source": "git", "patch": patch}
    text = patch_text(data["provenance"])
    assert text == f"uncommitted changes: patch sha256 {'f' * 64} over repro/a.py; untracked: b.py; and 2 more file(s)"
    page = as_report(data).reproduce_command.splitlines()
    assert page[:2] == [f"git checkout {commit}", f"# {text}"]
    body = format_issue_md(data)
    assert f"kit commit `{commit[:12]}+dirty`; {text})" in body  # how to reproduce
    assert f"- kvkit 0.1.0, commit {commit} (dirty); {text}" in body  # the stack
    data["provenance"]["kit"]["patch"] = "unavailable: git diff exited 128"
    assert patch_text(data["provenance"]) == "uncommitted changes: patch unavailable: git diff exited 128"
    data["provenance"]["kit"] = {"commit": commit, "dirty": True}  # a report made before the patch was recorded
    assert patch_text(data["provenance"]) == "" and as_report(data).reproduce_command.startswith("git checkout")
