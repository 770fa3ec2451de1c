"""Provenance's GPU list: the GPUs the run could use, not every GPU of the host (a Ray cell or an arm
sees one of several through CUDA_VISIBLE_DEVICES); the kernel variables; the code that ran; and what a dirty
tree held beyond its commit (its patch's digest and the files by name)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess

import jsonschema
import pytest

from repro.paths import SCHEMAS_DIR
from repro.record import provenance
from repro.record.provenance import PATCH_ARGS, hardware_label, kit_commit, visible_gpus

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

ROWS = [
    ("0", "GPU-c5384e55-2e35", "NVIDIA H200"),
    ("1", "GPU-78ec9f4f-956c", "NVIDIA H200"),
    ("2", "GPU-0a1b", "NVIDIA L4"),
]


def test_cuda_visible_devices_picks_the_gpus_by_index_or_uuid_in_its_order():
    assert visible_gpus(ROWS, None) == ["NVIDIA H200", "NVIDIA H200", "NVIDIA L4"]
    assert visible_gpus(ROWS, "1") == ["NVIDIA H200"]
    assert visible_gpus(ROWS, "2,0") == ["NVIDIA L4", "NVIDIA H200"]
    assert visible_gpus(ROWS, "GPU-78ec9f4f") == ["NVIDIA H200"]  # a UUID prefix, as CUDA takes it
    assert visible_gpus(ROWS, "") == [] and visible_gpus(ROWS, "-1") == []
    assert visible_gpus(ROWS, "0,7,1") == ["NVIDIA H200"]  # CUDA stops at the first invalid entry
    assert hardware_label({"gpus": visible_gpus(ROWS, "1")}) == "NVIDIA H200"


def test_kernel_variables_are_recorded_and_name_the_variant():
    """The variables that pick the CPU kernels are kept with the environment, and a report names its variant:
    the KERNEL_VARIANTS entry that sets exactly those, "default" for none, "custom" for any other mix."""
    from repro.record.provenance import KERNEL_VARIANTS, allowed_env, kernel_variant

    env = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "X": "1"}
    assert allowed_env(env) == {k: v for k, v in env.items() if k != "X"}
    assert kernel_variant(env) == {"name": "avx2", "env": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}
    assert kernel_variant({"PATH": "/bin"}) == {"name": "default", "env": {}}
    assert kernel_variant({"ATEN_CPU_CAPABILITY": ""}) == {"name": "default", "env": {}}  # empty: not set
    assert kernel_variant({"DNNL_MAX_CPU_ISA": "SSE41"}) == {"name": "custom", "env": {"DNNL_MAX_CPU_ISA": "SSE41"}}
    for name, variant in KERNEL_VARIANTS.items():
        assert kernel_variant(variant)["name"] == name


def test_a_report_names_the_code_that_ran_whatever_git_says(tmp_path):
    from repro.record.provenance import source_sha256

    (tmp_path / "repro" / "a").mkdir(parents=True)
    (tmp_path / "repro" / "a" / "x.py").write_text("x = 1\n")
    (tmp_path / "repro" / "y.py").write_text("y = 2\n")
    first = source_sha256(tmp_path)
    assert len(first) == 64 and source_sha256(tmp_path) == first
    (tmp_path / "repro" / "notes.txt").write_text("not code")  # only the kit's Python counts
    assert source_sha256(tmp_path) == first
    (tmp_path / "repro" / "a" / "x.py").write_text("x = 3\n")
    assert source_sha256(tmp_path) != first


def _git(root, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=kvkit-test", "-c", "user.email=test@kvkit.invalid", *args],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _committed_tree(root):
    (root / "repro").mkdir(parents=True)
    (root / "repro" / "x.py").write_text("x = 1\n")
    (root / "weights.bin").write_bytes(bytes(range(256)))
    (root / ".gitignore").write_text("ignored/\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "kit")


@needs_git
def test_a_dirty_tree_records_its_patch_digest_and_names_never_contents(tmp_path):
    """A report made from a dirty tree says what differed: the SHA-256 of its diff against HEAD (binary-safe, the
    same whatever the user's diff settings) and the changed and untracked files by name; a clean tree records none."""
    root = tmp_path / "kit"
    _committed_tree(root)
    clean = kit_commit(root)
    assert clean["dirty"] is False and "patch" not in clean and clean["source"] == "git"
    (root / "repro" / "x.py").write_text("x = 2  # SECRET-LOOKING CONTENT\n")
    (root / "weights.bin").write_bytes(bytes(range(255, -1, -1)))  # a binary file's bytes changed
    (root / "notes.txt").write_text("untracked words\n")
    (root / "ignored").mkdir()
    (root / "ignored" / "big.log").write_text("ignored")
    kit = kit_commit(root)
    patch = kit["patch"]
    assert kit["dirty"] is True
    assert patch["files"] == ["repro/x.py", "weights.bin"] and patch["untracked"] == ["notes.txt"]
    assert patch["omitted"] == 0 and patch["command"].startswith("git ") and " diff --binary " in patch["command"]
    diff = subprocess.run(["git", *PATCH_ARGS], cwd=root, capture_output=True, check=True).stdout
    assert b"GIT binary patch" in diff and patch["sha256"] == hashlib.sha256(diff).hexdigest()
    assert "SECRET" not in json.dumps(kit) and "untracked words" not in json.dumps(kit)  # names, not contents
    # the user's diff settings do not move the digest
    for key, value in (("diff.noprefix", "true"), ("diff.algorithm", "histogram"), ("color.ui", "always")):
        _git(root, "config", key, value)
    assert kit_commit(root)["patch"]["sha256"] == patch["sha256"]
    (root / "weights.bin").write_bytes(bytes(range(256))[::2])  # other changes, another digest
    assert kit_commit(root)["patch"]["sha256"] != patch["sha256"]


@needs_git
def test_a_patch_lists_at_most_so_many_names_and_counts_the_rest(tmp_path, monkeypatch):
    root = tmp_path / "kit"
    _committed_tree(root)
    (root / "repro" / "x.py").write_text("x = 2\n")
    for i in range(5):
        (root / f"u{i}.txt").write_text("u")
    monkeypatch.setattr(provenance, "MAX_PATCH_NAMES", 3)
    patch = provenance.tree_patch(root)
    assert patch["files"] == ["repro/x.py"] and patch["untracked"] == ["u0.txt", "u1.txt"] and patch["omitted"] == 3


def test_a_failing_patch_probe_is_unavailable_not_a_crash(tmp_path, monkeypatch):
    (tmp_path / "plain").mkdir()
    assert provenance.tree_patch(tmp_path / "plain").startswith("unavailable: git ")  # no repository there
    monkeypatch.setenv("PATH", str(tmp_path / "plain"))  # no git at all
    assert provenance.tree_patch(tmp_path / "plain") == "unavailable: git not found"


def test_the_report_schema_takes_a_patch_or_its_unavailable_reason():
    schema = json.loads((SCHEMAS_DIR / "report.schema.json").read_text())
    kit = jsonschema.Draft202012Validator(schema["properties"]["provenance"]["properties"]["kit"])
    base = {"commit": "0" * 40, "dirty": True, "source": "git"}
    good = {"sha256": "a" * 64, "command": "git diff", "files": ["a.py"], "untracked": [], "omitted": 0}
    assert kit.is_valid(base) and kit.is_valid({**base, "patch": good})
    assert kit.is_valid({**base, "patch": "unavailable: git diff exited 128"})
    assert not kit.is_valid({**base, "patch": {**good, "sha256": "not a digest"}})
    assert not kit.is_valid({**base, "patch": "a bare string"})
