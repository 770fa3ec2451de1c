"""Provenance: where, when and with what a report was made. Probes never crash; a failing one
records "unavailable: <reason>". Environment values come from an allow-list, secrets redacted."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from repro.paths import KIT_ROOT
from repro.plan.interpreter import probe_python

_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASS", re.IGNORECASE)
ENV_ALLOW_PREFIXES = (
    "VLLM_",
    "LMCACHE_",
    "CUDA_",
    "NCCL_",
    "HF_",
    "TRANSFORMERS_",
    "PYTORCH_",
    "OMP_",
    "MKL_",
    "KVKIT_",
    "TORCHINDUCTOR_",
)
# The variables that pick the CPU kernels an engine runs: ATen's vector ISA (avx512, avx2, default: its
# portable loops) and oneDNN's ISA cap (its GEMMs). repro.run.runner.child_env hands the caller's environment to
# every engine process; these are recorded, and a report names its kernel variant from them (kernel_variant).
KERNEL_ENV_NAMES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
ENV_ALLOW_NAMES = (
    "PYTHONHASHSEED",
    "CUBLAS_WORKSPACE_CONFIG",
    "DO_NOT_TRACK",
    "NVIDIA_VISIBLE_DEVICES",
    "LD_PRELOAD",
    *KERNEL_ENV_NAMES,
)
REDACTED = "<redacted>"
# A dirty tree's patch (tree_patch): `git diff` against HEAD with every setting that shapes its bytes given, so the
# same changes give the same SHA-256 on any machine and under any git configuration (no external diff or textconv,
# no colour, no rename detection, full blob ids for binary files, Myers with three lines of context, a/ and b/
# prefixes); run it in the report's checkout and pipe it to sha256sum to compare.
PATCH_ARGS = (
    "-c", "core.quotepath=on", "-c", "diff.suppressBlankEmpty=false",
    "diff", "--binary", "--full-index", "--no-ext-diff", "--no-textconv", "--no-color", "--no-renames",
    "--diff-algorithm=myers", "--indent-heuristic", "-U3", "--src-prefix=a/", "--dst-prefix=b/", "HEAD",
)  # fmt: skip
PATCH_COMMAND = "git " + " ".join(PATCH_ARGS)
MAX_PATCH_NAMES = 100  # file names a patch lists; a tree with more says how many it left out
# The kernel variants `make repro KERNELS=<name>` sets for the engines, by name (docs/usage.md#kernel-variants,
# reports/kernels/ says what each changed on the machines measured). "default": nothing set, the machine's best.
KERNEL_VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "generic": {"ATEN_CPU_CAPABILITY": "default"},
}


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def allowed_env(env: dict[str, str]) -> dict[str, str]:
    out = {}
    for name, value in sorted(env.items()):
        if name.startswith(ENV_ALLOW_PREFIXES) or name in ENV_ALLOW_NAMES:
            out[name] = REDACTED if is_secret_name(name) else value
    return out


def kernel_variant(env: dict[str, str]) -> dict:
    """The CPU kernels a run asked its engines for: the kernel variables set (KERNEL_ENV_NAMES) and the name of
    the KERNEL_VARIANTS entry that sets exactly those ("custom" when none does). What the engine then ran is
    the libraries' choice: a capability the CPU lacks falls back to one it has."""
    chosen = {name: env[name] for name in KERNEL_ENV_NAMES if env.get(name)}
    name = next((n for n, variant in KERNEL_VARIANTS.items() if variant == chosen), "custom")
    return {"name": name, "env": chosen}


def redact_text(text: str, env: dict[str, str]) -> str:
    """Blank every value of a secret-looking variable wherever it appears in text."""
    for name, value in env.items():
        if is_secret_name(name) and value and len(value) >= 4:
            text = text.replace(value, REDACTED)
    return text


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=15, check=True)
        return out.stdout.strip()
    except FileNotFoundError:
        return f"unavailable: {cmd[0]} not found"
    except subprocess.CalledProcessError as exc:
        return f"unavailable: {cmd[0]} exited {exc.returncode}"
    except subprocess.TimeoutExpired:
        return f"unavailable: {cmd[0]} timed out"


def source_sha256(root: Path = KIT_ROOT) -> str:
    """SHA-256 of the kit's own code as it ran: every repro/**/*.py, by path and bytes, in path order. A commit with
    `dirty` true does not say what ran (a GPU host's copy of a working tree can carry an older .git than its
    files, as the H200 copies of 2026-12-03 did); this does, whatever git says."""
    digest = hashlib.sha256()
    try:
        for path in sorted((root / "repro").rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    except OSError as exc:
        return f"unavailable: {exc.strerror or exc}"
    return digest.hexdigest()


def _git_out(args: list[str], root: Path) -> bytes | str:
    """git's stdout as bytes (binary-safe), or "unavailable: <reason>"."""
    command = next(a for a in args if not a.startswith("-") and "=" not in a)  # past `-c name=value`
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, timeout=60, check=True).stdout
    except FileNotFoundError:
        return "unavailable: git not found"
    except subprocess.CalledProcessError as exc:
        return f"unavailable: git {command} exited {exc.returncode}"
    except subprocess.TimeoutExpired:
        return "unavailable: git timed out"
    except OSError as exc:
        return f"unavailable: {exc.strerror or exc}"


def _names(out: bytes) -> list[str]:
    return sorted(n.decode("utf-8", errors="replace") for n in out.split(b"\0") if n)


def tree_patch(root: Path = KIT_ROOT) -> dict | str:
    """What a dirty tree held beyond its commit, so a report made from it can be made again: the SHA-256 of
    PATCH_COMMAND's output (the tracked changes against HEAD, binary-safe, whatever the user's diff settings), the
    changed tracked files and the untracked ones (names only, never their contents; at most MAX_PATCH_NAMES of the
    two, `omitted` counting the rest); "unavailable: <reason>" when git cannot say."""
    diff = _git_out(list(PATCH_ARGS), root)
    changed = _git_out(["diff", "--name-only", "-z", "--no-renames", "HEAD"], root)
    untracked = _git_out(["ls-files", "--others", "--exclude-standard", "-z"], root)
    for out in (diff, changed, untracked):
        if isinstance(out, str):
            return out
    files, others = _names(changed), _names(untracked)
    kept = files[:MAX_PATCH_NAMES]
    extra = others[: MAX_PATCH_NAMES - len(kept)]
    return {
        "sha256": hashlib.sha256(diff).hexdigest(),
        "command": PATCH_COMMAND,
        "files": kept,
        "untracked": extra,
        "omitted": len(files) + len(others) - len(kept) - len(extra),
    }


def kit_commit(root: Path = KIT_ROOT) -> dict:
    """The kit's commit, whether its tracked files differ from it (dirty) and, where they do, the patch
    (tree_patch); a packed kit's COMMIT file when there is no git."""
    code = source_sha256(root)
    commit = _run(["git", "rev-parse", "HEAD"], root)
    if commit.startswith("unavailable"):
        stamp = root / "COMMIT"  # a packed kit carries the commit it was built from
        if stamp.is_file():
            return {"commit": stamp.read_text().strip(), "dirty": False, "source": "COMMIT file", "source_sha256": code}
        return {"commit": commit, "dirty": None, "source": "none", "source_sha256": code}
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], root)
    dirty = None if status.startswith("unavailable") else bool(status)
    kit = {"commit": commit, "dirty": dirty, "source": "git", "source_sha256": code}
    return kit | ({"patch": tree_patch(root)} if dirty else {})


def package_version(name: str) -> str:
    for dist in (name, f"{name}-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unavailable: not installed"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError as exc:
        return f"unavailable: {exc.strerror}"
    return platform.processor() or "unavailable: unknown"


def _memory_gib() -> float | str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError as exc:
        return f"unavailable: {exc.strerror}"
    return "unavailable: no MemTotal"


def visible_gpus(rows: list[tuple[str, str, str]], visible: str | None) -> list[str]:
    """The names of the GPUs this process may use: rows are nvidia-smi's (index, uuid, name) for the
    host's GPUs, visible is CUDA_VISIBLE_DEVICES (indices or UUIDs, in its order; unset: all)."""
    if visible is None:
        return [name for _, _, name in rows]
    out = []
    for item in (v.strip() for v in visible.split(",")):
        if not item or item == "-1":
            break  # CUDA stops at the first invalid entry
        match = [
            name for index, uuid, name in rows if item == index or (item.startswith("GPU-") and uuid.startswith(item))
        ]
        if not match:
            break
        out.append(match[0])
    return out


def gpu_info() -> dict:
    out = _run(["nvidia-smi", "--query-gpu=index,uuid,name,driver_version", "--format=csv,noheader"])
    if out.startswith("unavailable"):
        return {"gpus": [], "driver": out}
    rows, driver = [], "unavailable: none listed"
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4:
            rows.append((parts[0], parts[1], parts[2]))
            driver = parts[3]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    info = {"gpus": visible_gpus(rows, visible), "driver": driver}
    if visible is not None:  # a Ray cell or an arm on one GPU of several: the host's count beside it
        info.update(cuda_visible_devices=visible, host_gpus=len(rows))
    cuda = _run(["nvidia-smi"])
    m = re.search(r"CUDA Version:\s*([\d.]+)", cuda)
    return {**info, "cuda_driver_api": m.group(1) if m else "unavailable: not reported"}


def hardware() -> dict:
    gpu = gpu_info()
    return {
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gib": _memory_gib(),
        **gpu,
    }


def hardware_label(hw: dict) -> str:
    if hw.get("gpus"):
        names = hw["gpus"]
        label = names[0] if len(set(names)) == 1 else "+".join(names)
        return f"{len(names)}× {label}" if len(names) > 1 else label
    return f"CPU {hw.get('cpu', 'unknown')}"


def sha256_file(path: str | Path) -> str:
    try:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    except OSError as exc:
        return f"unavailable: {exc.strerror or exc}"


def model_digest(model: str) -> str:
    """SHA-256 over a local model directory's files; a hub name is recorded as such."""
    path = Path(model)
    if not path.is_dir():
        return f"unavailable: {model} is not a local directory (hub model; pin --model-revision)"
    from repro.models.tiny import digest_dir

    try:
        return digest_dir(path)
    except OSError as exc:
        return f"unavailable: {exc.strerror or exc}"


def model_source(model: str) -> dict | str | None:
    """Where a converted model's weights came from (repro.models.convert's kvkit-model.json: the package and
    version, the GGUF's SHA-256, what it was dequantized from); None for a model the kit did not convert."""
    from repro.models.registry import SOURCE_FILE

    path = Path(model) / SOURCE_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"unavailable: {SOURCE_FILE} unreadable ({getattr(exc, 'strerror', None) or exc})"
    return data if isinstance(data, dict) else f"unavailable: {SOURCE_FILE} is not an object"


def model_record(model: str) -> dict:
    record = {"name": model, "sha256": model_digest(model)}
    source = model_source(model)
    if source is not None:  # additive: reports of other models carry no source
        record["source"] = source
    return record


def is_kit_managed(python: str) -> bool:
    """An interpreter of the kit's own environments (.venvs/<profile>), which the kit installs into."""
    try:
        Path(python).absolute().relative_to(KIT_ROOT / ".venvs")
        return True
    except ValueError:
        return False


def engine_environment(python: str) -> dict:
    """Which interpreter ran the engines, what it holds, and whether the kit installed anything into it."""
    info = probe_python(python)
    if "packages" in info:
        info["packages"] = {n: v or "unavailable: not installed" for n, v in info["packages"].items()}
    managed = is_kit_managed(python)
    return {
        "python_path": python,
        **info,
        "kit_managed": managed,
        "installed_by_kit": (
            "the kit's pinned requirements (requirements/), into its own environment"
            if managed
            else "nothing: an existing environment (PYTHON= / --python), used as it is"
        ),
    }


def argv_python(argv: list[str]) -> str:
    """The engine interpreter a verifier command line names (--python), else this one."""
    for i, arg in enumerate(argv):
        if arg == "--python" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--python="):
            return arg.split("=", 1)[1]
    return sys.executable


def study_provenance(argv: list[str], env: dict, started: str, packages: dict) -> dict:
    """A study's or a command's report provenance: the kit's commit, the command, its UTC times, hardware, the
    package versions given and the allowed environment."""
    return {
        "kit": kit_commit(),
        "argv": argv,
        "started_utc": started,
        "ended_utc": utc_now(),
        "hardware": hardware(),
        "packages": packages,
        "env": allowed_env(env),
    }


def collect_provenance(
    *,
    argv: list[str],
    env: dict[str, str],
    started: str,
    fixture_path: str,
    fixture_sha256: str,
    model: str,
    lmcache_config: str | None,
    python: str | None = None,
) -> dict:
    """The report's provenance; python: the engine interpreter (the plan's), else the one argv names."""
    return {
        "kit": kit_commit(),
        "argv": [redact_text(a, env) for a in argv],
        "started_utc": started,
        "hardware": hardware(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": {n: package_version(n) for n in ("torch", "vllm", "lmcache", "transformers")},
        "fixture": {"path": fixture_path, "sha256": fixture_sha256},
        "model": model_record(model),
        "lmcache_config": None
        if lmcache_config is None
        else {"path": lmcache_config, "sha256": sha256_file(lmcache_config)},
        "env": allowed_env(env),
        "kernels": kernel_variant(env),
        "engine_environment": engine_environment(python if python is not None else argv_python(argv)),
    }
