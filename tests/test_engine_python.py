"""PYTHON= / --python: an existing environment runs the engines as it is; a bad one is one line and exit 2
before anything runs, and the report's provenance says which interpreter ran the engines."""

import os
import subprocess
import sys
from pathlib import Path

from kvkit_testutil import ROOT

from repro.plan.options import engine_python_problem
from repro.record.provenance import argv_python, collect_provenance, engine_environment

SELFTEST = "fixtures/selftest-cpu.json"


def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def _without_site(tmp_path: Path) -> str:
    """This interpreter without its site-packages: a working Python that has no vllm."""
    return _script(tmp_path, "python-bare", f'exec {sys.executable} -S "$@"')


def test_missing_and_not_executable(tmp_path):
    assert engine_python_problem(str(tmp_path / "nope"), needs_lmcache=False) == "no such file"
    plain = tmp_path / "plain"
    plain.write_text("x")
    assert engine_python_problem(str(plain), needs_lmcache=False) == "not an executable file"
    assert engine_python_problem(str(tmp_path), needs_lmcache=False) == "not an executable file"


def test_not_a_python(tmp_path):
    problem = engine_python_problem(_script(tmp_path, "liar", "echo oops >&2; exit 3"), needs_lmcache=False)
    assert problem.startswith("is not a working Python 3 (exit 3: oops")


def test_no_vllm(tmp_path):
    assert engine_python_problem(_without_site(tmp_path), needs_lmcache=False).startswith("has no vllm")


def test_cli_refuses_a_bad_python_in_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "repro.verify_kv_reuse", "--model", "Qwen/Qwen3-0.6B", "--fixture", SELFTEST,
         "--report", str(tmp_path / "r.json"), "--python", _without_site(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "has no vllm" in proc.stderr
    assert not (tmp_path / "r.json").exists()


def test_make_repro_with_a_bad_python_stops_before_anything(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "repro", "--profile", "cpu", "--python", str(tmp_path / "nope")],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert (proc.stdout + proc.stderr).strip() == f"PYTHON={tmp_path / 'nope'}: no such file"


def test_argv_python():
    assert argv_python(["--model", "m", "--python", "/x/python"]) == "/x/python"
    assert argv_python(["--python=/y/python"]) == "/y/python"
    assert argv_python(["--model", "m"]) == sys.executable


def test_provenance_says_which_interpreter_and_that_nothing_was_installed(tmp_path):
    theirs = _script(tmp_path, "python", f'exec {sys.executable} "$@"')  # an environment outside .venvs/
    env = engine_environment(theirs)
    assert env["python_path"] == theirs and env["kit_managed"] is False
    assert env["installed_by_kit"].startswith("nothing")
    assert env["python"] and set(env["packages"]) >= {"vllm", "lmcache", "torch"}
    prov = collect_provenance(
        argv=["--python", theirs], env=dict(os.environ), started="2026-01-01T00:00:00Z", fixture_path=SELFTEST,
        fixture_sha256="0", model="x/y", lmcache_config=None,
    )  # fmt: skip
    assert prov["engine_environment"]["python_path"] == theirs
    ours = engine_environment(str(ROOT / ".venvs" / "cpu" / "bin" / "python"))
    assert ours["kit_managed"] is True and not ours["installed_by_kit"].startswith("nothing")
