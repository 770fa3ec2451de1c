"""tasks.py preconditions: a GPU profile on a machine without CUDA stops at once, in one line."""

import os
import subprocess
import sys

import pytest
from invoke import Exit
from kvkit_testutil import ROOT


def _inv(*args, path=None):
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_gpu_profile_without_cuda_stops_with_one_line(tmp_path):
    # a PATH with no nvidia-smi: what a CPU-only machine looks like to tasks.py
    proc = _inv("repro", "--profile", "gpu-lmcache-0.5.4", path=f"{tmp_path}:/usr/bin:/bin")
    assert proc.returncode == 2
    out = (proc.stdout + proc.stderr).strip()
    assert len(out.splitlines()) == 1
    assert "needs a CUDA GPU" in out and "PROFILE=cpu" in out
    assert not (ROOT / ".venvs" / "gpu-lmcache-0.5.4").exists()


def test_unknown_profile_is_refused():
    proc = _inv("repro", "--profile", "nonsense")
    assert proc.returncode == 2
    assert "unknown PROFILE=nonsense" in proc.stdout + proc.stderr


def test_an_unknown_kernel_variant_is_refused_before_any_setup():
    proc = _inv("repro", "--profile", "cpu", "--kernels", "avx9")
    assert proc.returncode == 2
    out = (proc.stdout + proc.stderr).strip()
    assert len(out.splitlines()) == 1 and "unknown KERNELS=avx9" in out and "avx2" in out


def test_kernel_variants_set_the_engines_environment_on_the_cpu_profile_only():
    """KERNELS=<name> (`make repro KERNELS=avx2`): the variant's variables, nothing for the default; a GPU profile
    is refused in one line (the variants pick the CPU engine's kernels)."""
    sys.path.insert(0, str(ROOT))
    import tasks
    from repro.record.provenance import KERNEL_VARIANTS

    assert tasks.kernel_env("", "cpu") == tasks.kernel_env("default", "cpu") == {}
    assert tasks.kernel_env("avx2", "cpu") == KERNEL_VARIANTS["avx2"] and KERNEL_VARIANTS["avx2"]
    with pytest.raises(Exit, match="PROFILE=cpu"):
        tasks.kernel_env("avx2", "gpu-lmcache-0.5.4")


def test_an_environment_made_beside_other_output_keeps_pips_words_in_its_log_and_fails_with_them(tmp_path, monkeypatch):
    """make test makes the newest CPU vLLM's environment beside its first session: pip writes to a log, not the
    terminal, and a failed install stops with an Exit that quotes the log's last lines (no stamp written)."""
    import tasks

    monkeypatch.setattr(tasks, "VENVS", tmp_path / "venvs")
    (tmp_path / "venvs").mkdir()
    log = tmp_path / "venvs" / "broken.setup.log"
    req = tmp_path / "broken.txt"  # offline: no index, and a distribution nobody publishes
    req.write_text("--no-index\nkvkit-no-such-distribution==0.0.0\n")
    with pytest.raises(Exit) as err:
        tasks.venv_python("broken", [str(req)], log)
    said = str(err.value.message)
    assert said.startswith("setting up .venvs/broken failed") and str(log) in said
    assert "kvkit-no-such-distribution" in log.read_text() and "kvkit-no-such-distribution" in said
    assert not (tmp_path / "venvs" / "broken" / ".kvkit-stamp").exists()


def _wheel(where, version: str, payload: bytes):
    """A wheel of one package, kvkit_link_probe, whose one module carries payload (a file over the link floor)."""
    import zipfile

    name = f"kvkit_link_probe-{version}"
    path = where / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("kvkit_link_probe/data.bin", payload)
        meta = f"Metadata-Version: 2.1\nName: kvkit_link_probe\nVersion: {version}\n"
        whl.writestr(f"{name}.dist-info/METADATA", meta)
        tags = "Wheel-Version: 1.0\nGenerator: kvkit-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        whl.writestr(f"{name}.dist-info/WHEEL", tags)
        whl.writestr(f"{name}.dist-info/RECORD", "")
    return path


def test_two_environments_share_identical_files_and_pip_writing_into_one_leaves_the_other(tmp_path):
    """The kit's environments share their identical large files (tasks.link_identical_files), and a later pip install
    into one of them, writing the same path with other bytes, must not reach the other's copy. Without util-linux's
    hardlink the install says so and nothing is linked."""
    import shutil

    import tasks

    big, other = os.urandom(300 * 1024), os.urandom(300 * 1024)
    small = b"x" * 1024
    venvs = tmp_path / "venvs"
    for env in ("a", "b"):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venvs / env)], check=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(venvs / env / "bin" / "python"), "install", "--quiet",
             "--no-index", "--disable-pip-version-check", str(_wheel(tmp_path, "1.0", big))], check=True,
        )  # fmt: skip
        (venvs / env / "small.txt").write_bytes(small)
    (venvs / "a" / "unique.bin").write_bytes(other)

    def data(env):
        (found,) = (venvs / env).glob("lib/python*/site-packages/kvkit_link_probe/data.bin")
        return found

    said = tasks.link_identical_files(venvs)
    if shutil.which("hardlink") is None:
        assert said == "hardlink (util-linux) not found: each environment keeps its own copies"
        assert data("a").stat().st_nlink == 1
        return
    assert said.startswith("identical files linked, 300 KiB saved"), said
    assert data("a").stat().st_ino == data("b").stat().st_ino and data("a").stat().st_nlink == 2
    assert (venvs / "a" / "small.txt").stat().st_ino != (venvs / "b" / "small.txt").stat().st_ino  # under 256 KiB
    assert (venvs / "a" / "unique.bin").stat().st_nlink == 1
    # pip over the installed copy (--ignore-installed: no uninstall first, its wheel installer writes the same path)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venvs / "a" / "bin" / "python"), "install", "--quiet",
         "--no-index", "--disable-pip-version-check", "--ignore-installed", str(_wheel(_mkdir(tmp_path / "v2"), "2.0", other))],
        check=True,
    )  # fmt: skip
    assert data("a").read_bytes() == other and data("b").read_bytes() == big
    assert data("b").stat().st_nlink == 1


def _mkdir(path):
    path.mkdir()
    return path


def test_a_kit_command_run_by_make_keeps_the_order_its_two_streams_were_written_in():
    """run_py gives the command one pipe for both streams: a summary flushed to stdout, then a line on stderr, reach
    make's output in that order and whole, however invoke's echo threads are scheduled."""
    from invoke import Config, Context

    import tasks

    context = Context(Config(overrides={"run": {"in_stream": False}}))  # pytest holds stdin
    summary = "x" * 5000  # longer than one read of invoke's echo
    code = f"import sys; print({summary!r}, flush=True); print('report: r.json', file=sys.stderr)"
    for _ in range(20):
        result = tasks.run_py(context, sys.executable, f"-c {code!r}", warn=True)
        assert result.stdout == f"{summary}\nreport: r.json\n" and result.stderr == ""
