"""Provenance's GPU list: the GPUs the run could use, not every GPU of the host (a Ray cell or an arm
sees one of several through CUDA_VISIBLE_DEVICES)."""

from __future__ import annotations

from repro.record.provenance import hardware_label, visible_gpus

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
