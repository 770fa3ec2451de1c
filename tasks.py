"""Invoke tasks: thin wrappers over `python -m repro ...` that first set up each profile's pinned
environment. Run through the Makefile (`make repro`, `make test`, ...)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from invoke import Exit, task

ROOT = Path(__file__).resolve().parent
VENVS = ROOT / ".venvs"
MODEL_DIR = ROOT / ".cache" / "models" / "kvkit-tiny-qwen3"
PROFILES = {
    "cpu": ["requirements/cpu.txt"],
    "gpu-lmcache-0.5.4": ["requirements/gpu-lmcache-0.5.4.txt"],
    "gpu-lmcache-0.5.5rc5": ["requirements/gpu-lmcache-0.5.5rc5.txt"],
}
# PyPI's torchvision, torchaudio and torchcodec break `import vllm` beside the CPU torch.
CPU_UNWANTED = ["torchvision", "torchaudio", "torchcodec"]
REFERENCE_MODEL = "Qwen/Qwen3-0.6B"
REFERENCE_REVISION = "c1899de289a04d12100db370d81485cdf75e47ca"


def has_cuda() -> bool:
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def resolve_profile(profile: str) -> str:
    if profile in ("", "auto"):
        return "gpu-lmcache-0.5.4" if has_cuda() else "cpu"
    if profile not in PROFILES:
        raise Exit(f"unknown PROFILE={profile}; choose one of: auto, {', '.join(PROFILES)}", code=2)
    if profile.startswith("gpu") and not has_cuda():
        raise Exit(f"PROFILE={profile} needs a CUDA GPU (nvidia-smi found none); on this machine use PROFILE=cpu", code=2)
    return profile


def _req_line(req: str) -> str:
    return f"{req} {hashlib.sha256((ROOT / req).read_bytes()).hexdigest()}"


def venv_python(profile: str, extra: list[str] | None = None) -> str:
    """The profile's environment; each requirement file is (re)installed when its hash changes."""
    venv = VENVS / profile
    py = venv / "bin" / "python"
    stamp = venv / ".kvkit-stamp"
    done = set(stamp.read_text().splitlines()) if py.exists() and stamp.is_file() else set()
    todo = [r for r in PROFILES[profile] + (extra or []) if _req_line(r) not in done]
    if not todo:
        return str(py)
    print(f"[kvkit] setting up .venvs/{profile} from {', '.join(todo)} ...", file=sys.stderr, flush=True)
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    for r in todo:
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", str(ROOT / r)],
                       check=True)
        if profile == "cpu":
            subprocess.run([str(py), "-m", "pip", "uninstall", "--quiet", "-y", *CPU_UNWANTED],
                           check=False, capture_output=True)
        done = {line for line in done if not line.startswith(r + " ")} | {_req_line(r)}
        stamp.write_text("".join(sorted(line + "\n" for line in done)))
    return str(py)


def run_py(c, py: str, args: str, warn: bool = False):
    return c.run(f"{py} {args}", pty=False, warn=warn, env={"PYTHONPATH": str(ROOT)})


def make_model(c, py: str) -> str:
    run_py(c, py, f"-m repro make-model {MODEL_DIR}")
    return str(MODEL_DIR)


def reference_args(profile: str, model: str, report: str) -> str:
    if profile == "cpu":
        return (f"--model {model} --dtype float32 --gpu-memory-utilization 0.1 --max-model-len 2048 "
                f"--block-size 16 --max-tokens 16 --seed 0 --device cpu --suite acceptance --compare-native "
                f"--fixture fixtures/selftest-cpu.json --report {report}")
    return (f"--model {model} --model-revision {REFERENCE_REVISION} --kv-connector LMCacheConnectorV1 "
            f"--lmcache-config fixtures/lmcache-local-cpu.yaml --dtype float16 --gpu-memory-utilization 0.45 "
            f"--max-model-len 2048 --block-size 16 --max-tokens 16 --seed 0 --device cuda --suite acceptance "
            f"--compare-native --fixture fixtures/efim-018-l4.json --report {report}")


@task(help={"profile": "cpu | gpu-lmcache-0.5.4 | gpu-lmcache-0.5.5rc5 | auto (default: CUDA → gpu-lmcache-0.5.4, else cpu)",
            "model": "model name or local directory (GPU profiles; default Qwen/Qwen3-0.6B)"})
def repro(c, profile="auto", model=""):
    """Run the reference verification for a profile and print its summary."""
    profile = resolve_profile(profile)
    py = venv_python(profile)
    if profile == "cpu":
        model = model or make_model(c, py)
    model = model or REFERENCE_MODEL
    report = f"reports/latest-{profile}.json"
    result = run_py(c, py, "-m repro.verify_kv_reuse " + reference_args(profile, model, report), warn=True)
    if result.exited != 0:
        raise Exit(code=result.exited)


@task(help={"k": "pytest -k expression", "fast": "skip the end-to-end engine tests"})
def test(c, k="", fast=False):
    """Run the test suite (unit, end-to-end on the CPU engine, browser, kit)."""
    py = venv_python("cpu", ["requirements/test.txt"])
    args = "-m pytest -q -ra" + (f" -k '{k}'" if k else "") + (" -m 'not e2e'" if fast else "")
    result = run_py(c, py, args, warn=True)
    if result.exited != 0:
        raise Exit(code=result.exited)


@task
def bench(c):
    """Run the CPU acceptance once and print wall time, summed engine starts and their ratio."""
    py = venv_python("cpu")
    model = make_model(c, py)
    run_py(c, py, f"-m repro bench --model {model}")


@task
def model(c):
    """Generate the tiny Qwen3-architecture model for CPU runs (deterministic bytes)."""
    make_model(c, venv_python("cpu"))


@task
def clean(c):
    """Remove environments, generated models, local reports and build outputs."""
    for p in (VENVS, ROOT / ".cache", ROOT / "dist"):
        shutil.rmtree(p, ignore_errors=True)
    for p in (ROOT / "reports").glob("latest-*"):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()
